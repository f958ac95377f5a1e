"""Redis fault drills: real consumers and producers while their Redis is killed, frozen,
disconnected or full.

Each test starts its own redis-server (it gets killed, paused or filled, so never the
session one), runs its test site, its consumers (``python -m consumer``) and producers
(``python -m producer``) as child processes, and kills every child in teardown. What is
asserted, for each fault:

- the processes survive it: no crash, no crash loop (a bounded number of Redis warnings
  in their JSON logs), consumers exit 0 with ``--exit-when-empty`` at the end;
- the queue loses nothing: every task ends done or dead, ``done + dead == enqueued``,
  ``done`` counts each task once;
- what Redis acknowledged stays acknowledged (AOF with ``appendfsync always``).

A few tests pin down, at the queue or in one in-process consumer, what the drills found
only now and then (a full Redis refusing a heartbeat, two consumer races after an
outage): there the timing can be forced.

Only 127.0.0.1 is contacted. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from procs import JsonLog
from redis.exceptions import OutOfMemoryError, RedisError
from redis_binaries import pause, resume
from sites import start_site_process, test_site
from support.clock import expire
from support.routes import serve

from common.http.fetcher import Fetcher
from common.keys import CrawlKeys
from common.observability.metrics import Metrics
from common.policy import CrawlPolicy, ensure_policy
from common.queue import Code, Lease, LeasingQueue, NewTask, Stats
from common.redis.server import RedisServer
from common.traps.book import TrapBook
from common.urls.canonical import canonicalize, fingerprint, task_id
from consumer.config import build_parser, settings_from_args
from consumer.lifecycle import Consumer
from consumer.sinks import make_sink
from consumer.wiring import run as run_consumer

ROOT = Path(__file__).resolve().parents[1]
#: Every consumer of these drills: local sites only, no robots.txt, no side server, no
#: host limits (a test that wants them passes its own --per-host-* flags after these).
#: --empty-grace 2s: a consumer that finds its crawl already empty stays up 2 s, so it does
#: not exit within milliseconds of its start (that exit waits up to 5 s for its helpers: see
#: test_consumer_exits_when_its_crawl_is_already_empty_at_start).
CONSUMER_FLAGS = ("--allow-private", "--ignore-robots", "--http-port", "-1",
                  "--empty-grace", "2", "--retry-base", "0.1",
                  "--per-host-concurrency", "0", "--per-host-delay", "0")
#: Log events a consumer writes when a Redis call fails (each one is followed by a backoff).
REDIS_WARNINGS = ("redis_error", "flush_retry", "redis_unreachable")

pytestmark = pytest.mark.timeout(90)


# -- children ----------------------------------------------------------------------------------


@dataclass
class Child(JsonLog):
    """One consumer or producer process; its stderr (JSON logs) goes to `log_path`."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    out_path: Path | None = None  # a producer's stdout (its --json summary)

    def count(self, *names: str) -> int:
        return sum(1 for e in self.events() if e.get("event") in names)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def summary(self) -> dict[str, Any]:
        """A producer's ``--json`` summary."""
        assert self.out_path is not None
        text = self.out_path.read_text()
        assert text.strip(), f"{self.name} printed no summary; log:\n{self.log_text()[-2000:]}"
        doc: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
        return doc

class Fleet:
    """Starts the consumers and producers of one test; `close()` kills what still runs."""

    def __init__(self, crawl: str, tmp_path: Path) -> None:
        self.crawl = crawl
        self.tmp_path = tmp_path
        self.output = tmp_path / "out"
        self.children: list[Child] = []
        #: The crawl's policy, given to it before its first producer runs (a producer
        #: gives a crawl without one the defaults, 1 s a host; consumers' flags never
        #: change it): no host limits, no robots.txt and quick retries, as CONSUMER_FLAGS
        #: say.
        self.policy = CrawlPolicy(per_host_delay=0, per_host_concurrency=0, ignore_robots=True,
                                  retry_base=0.1)

    async def _ensure_policy(self, redis_url: str, crawl: str) -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await asyncio.wait_for(ensure_policy(client, crawl, self.policy, by="test"), 5)
        finally:
            await client.aclose()

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
        env["CRAWLQ_LOG_FORMAT"] = "json"
        env["PYTHONPATH"] = os.pathsep.join(  # tests/: --handler consumer_handlers:...
            p for p in (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)
        return env

    async def _spawn(self, name: str, argv: list[str], *, capture_stdout: bool,
                     stdin_pipe: bool = False) -> Child:
        log_path = self.tmp_path / f"{name}.log"
        out_path = self.tmp_path / f"{name}.out" if capture_stdout else None
        with contextlib.ExitStack() as files:
            log = files.enter_context(log_path.open("wb"))
            out = files.enter_context(out_path.open("wb")) if out_path else log
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=self.tmp_path, env=self._env(),
                stdin=asyncio.subprocess.PIPE if stdin_pipe else asyncio.subprocess.DEVNULL,
                stdout=out, stderr=log)
        child = Child(name, proc, log_path, out_path)
        self.children.append(child)
        return child

    async def consumer(self, name: str, redis_url: str, *args: str) -> Child:
        return await self._spawn(name, [
            sys.executable, "-m", "consumer", "--redis-url", redis_url, "--crawl", self.crawl,
            "--worker-id", f"w-{name}-{os.getpid()}", "--output", str(self.output),
            *CONSUMER_FLAGS, *args], capture_stdout=False)

    async def producer(self, name: str, redis_url: str, *args: str, crawl: str = "",
                       stdin_pipe: bool = False) -> Child:
        await self._ensure_policy(redis_url, crawl or self.crawl)
        return await self._spawn(name, [
            sys.executable, "-m", "producer", "--redis-url", redis_url,
            "--crawl", crawl or self.crawl, "--json", "--progress", "off", *args],
            capture_stdout=True, stdin_pipe=stdin_pipe)

    async def close(self) -> None:
        for child in self.children:
            if child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.proc.wait(), 10)


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    """The redis-servers a test started (`start_redis`); stopped (even if paused) after it."""
    started: list[RedisServer] = []
    try:
        yield started
    finally:
        for server in started:
            with contextlib.suppress(Exception):
                server.stop()  # SIGCONT first, so a paused server stops too


@pytest.fixture
async def fleet(servers: list[RedisServer], crawl_name: str, tmp_path: Path
                ) -> AsyncIterator[Fleet]:
    # Depends on `servers` so the children are killed before their Redis is stopped.
    spawned = Fleet(crawl_name, tmp_path)
    try:
        yield spawned
    finally:
        await spawned.close()


def start_redis(servers: list[RedisServer], **kwargs: Any) -> RedisServer:
    server = RedisServer(**kwargs)
    servers.append(server)
    return server.start()


# -- helpers -----------------------------------------------------------------------------------


async def until(pred: Callable[[], Awaitable[bool]], within: float, what: str,
                interval: float = 0.05) -> None:
    deadline = time.monotonic() + within
    while not await pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def queue_of(server: RedisServer, crawl: str) -> AsyncIterator[LeasingQueue]:
    """The crawl's queue on a fresh client of `server` (closed on exit)."""
    client = aioredis.Redis.from_url(server.url)
    try:
        yield await LeasingQueue.existing(client, crawl)
    finally:
        await client.aclose()


def url_file(path: Path, urls: list[str]) -> tuple[str, dict[str, str]]:
    """Write `urls` one per line; returns the file name and task id -> canonical URL."""
    path.write_text("".join(u + "\n" for u in urls))
    ids = {}
    for raw in urls:
        url = canonicalize(raw)
        assert isinstance(url, str), url
        ids[task_id(fingerprint(url))] = url
    return str(path), ids


async def assert_nothing_lost(queue: LeasingQueue, ids: dict[str, str]) -> Stats:
    """Every task done or dead, each counted once; returns the final stats."""
    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.waiting) == (0, 0, 0), stats
    assert stats.counters["enqueued"] == len(ids)
    assert stats.done + stats.dead == len(ids), stats
    states = Counter([await queue.state_of(tid) for tid in ids])
    assert set(states) <= {"done", "dead"}, states
    # Counted once: a second ack of a task would push the counter past its done states.
    assert stats.done == states["done"] and stats.dead == states["dead"], (stats, states)
    return stats


def assert_no_crash(*consumers: Child, max_warnings: int) -> None:
    """Each consumer logged no crash and a bounded number of Redis warnings (no hot loop)."""
    for c in consumers:
        log = c.log_text()
        assert "Traceback" not in log, f"{c.name} crashed somewhere:\n{log[-3000:]}"
        assert c.count("task_crashed") == 0
        warnings = c.count(*REDIS_WARNINGS)
        assert warnings <= max_warnings, (
            f"{c.name} logged {warnings} Redis warnings: a retry loop without backoff?")
        stopped = c.event("consumer_stopped")
        assert stopped is not None and stopped["reason"] == "crawl empty", stopped


async def crawl_completes(queue: LeasingQueue, within: float) -> bool:
    """Whether nothing is pending, leased or waiting within `within` seconds."""
    deadline = time.monotonic() + within
    while (await queue.stats()).active:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def finish(queue: LeasingQueue, consumers: list[Child], within: float) -> None:
    """Wait for the crawl to complete, then for each consumer to exit 0 by itself."""
    assert await crawl_completes(queue, within), f"the crawl did not complete: " \
        f"{await queue.stats()}"
    for c in consumers:  # --exit-when-empty: it exits within --empty-grace + 1 s
        assert await c.wait(10) == 0, c.log_text()[-3000:]


async def feed(producer: Child, batch: int) -> None:
    """Write batches of URLs to a producer's stdin, one every 50 ms, until it exits."""
    assert producer.proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for i in itertools.count():
            lines = "".join(f"http://127.0.0.1:9/late/{i}/{j}\n" for j in range(batch))
            producer.proc.stdin.write(lines.encode())
            await producer.proc.stdin.drain()
            await asyncio.sleep(0.05)


def assert_spaced(times: list[float], delay_s: float) -> None:
    """Requests `delay_s` apart, as the site saw them arrive.

    Slots are granted `delay_s` apart on the Redis clock; an arrival can be some 30 ms
    late (the consumer's loop was busy), which shortens one gap but not the span of the
    next: k gaps together must span k * `delay_s`, less that jitter. A stampede (many
    requests at once) fails both checks.
    """
    gaps = [round(t2 - t1, 4) for t1, t2 in itertools.pairwise(times)]
    assert min(gaps) >= delay_s - 0.04, f"requests {min(gaps)}s apart: {gaps}"
    for k in range(2, 6):
        spans = [times[i + k] - times[i] for i in range(len(times) - k)]
        assert min(spans) >= k * delay_s - 0.03, f"{k + 1} requests within {min(spans):.3f}s"


def page_times(times: dict[str, list[float]]) -> list[float]:
    return sorted(t for path, ts in times.items() if path.startswith("/p/") for t in ts)


# -- 1. kill -9 mid-crawl, restart on the same AOF ---------------------------------------------


async def test_redis_kill_9_mid_crawl_and_aof_restart_loses_nothing(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path) -> None:
    n = 400
    server = start_redis(servers, aof=True)
    async with start_site_process(delay_ms=20) as site:
        path, ids = url_file(tmp_path / "urls.txt", [site.url(f"/p/{i}") for i in range(n)])
        producer = await fleet.producer("producer", server.url, "--partitions", "2",
                                        "--enqueue-batch", "50", path)
        assert await producer.wait(30) == 0, producer.log_text()[-2000:]
        acknowledged = producer.summary()["enqueued"]
        assert acknowledged == n

        # A second producer (another crawl) is mid-run, fed batch by batch on stdin: it
        # is started before the consumers, whose crawl could otherwise end while a
        # loaded machine starts this one.
        late = await fleet.producer("late", server.url, "--enqueue-batch", "20", "-",
                                    crawl=f"{fleet.crawl}-late", stdin_pipe=True)
        feeder = asyncio.create_task(feed(late, 20))
        late_keys = CrawlKeys.build(f"{fleet.crawl}-late")
        # The outage is shorter than the lease here (the next drill outlasts it).
        common = ("--concurrency", "3", "--lease", "5s", "--exit-when-empty")
        async with queue_of(server, fleet.crawl) as queue:
            async def late_enqueueing() -> bool:
                if await queue.client.hget(late_keys.meta, "settings") is None:
                    return False
                late_queue = await LeasingQueue.existing(queue.client, f"{fleet.crawl}-late")
                return (await late_queue.stats()).pending >= 40

            await until(late_enqueueing, 60, "the second producer to enqueue")
            a = await fleet.consumer("a", server.url, *common)
            b = await fleet.consumer("b", server.url, *common)

            async def a_quarter_done() -> bool:
                return (await queue.stats()).done >= n // 4

            await until(a_quarter_done, 60, "a quarter of the crawl to be done")
            before = await queue.stats()

        server.kill()  # SIGKILL: no shutdown, no final fsync beyond appendfsync always
        await asyncio.sleep(2)
        assert a.running and b.running, "a consumer died with Redis"
        assert before.done < n, "the crawl ended before Redis was killed"
        # The producer does not wait out an outage: it stops with exit code 3.
        assert await late.wait(10) == 3, late.log_text()[-2000:]
        feeder.cancel()
        assert "cannot reach Redis" in late.log_text(), late.log_text()[-2000:]
        late_reported = late.summary()["enqueued"]
        server.restart()  # same port, same data dir: the AOF is replayed

        async with queue_of(server, fleet.crawl) as queue:
            after = await queue.stats()
            # What Redis acknowledged before the crash is still there.
            assert after.counters["enqueued"] == acknowledged
            assert after.done >= before.done
            assert after.counters.get("leased", 0) >= before.counters["leased"]

            # The second producer's reported batches are all there, plus at most the two
            # it had in flight when Redis died (each one all or nothing).
            late_queue = await LeasingQueue.existing(queue.client, f"{fleet.crawl}-late")
            late_enqueued = (await late_queue.stats()).counters["enqueued"]
            assert late_enqueued - late_reported in (0, 20, 40), (late_enqueued, late_reported)

            await finish(queue, [a, b], within=60)
            final = await assert_nothing_lost(queue, ids)
            assert final.done == n, final.dead_reasons  # 200s only: nothing may die here

            # Every URL is known to the restarted Redis: a re-run enqueues nothing.
            again = await fleet.producer("again", server.url, path)
            assert await again.wait(30) == 0, again.log_text()[-2000:]
            summary = again.summary()
            assert (summary["enqueued"], summary["duplicates"]) == (0, n)

    assert_no_crash(a, b, max_warnings=30)  # about 10 for a 2 s outage
    assert a.count(*REDIS_WARNINGS) + b.count(*REDIS_WARNINGS) > 0, "the outage went unseen"
    assert a.count("consumer_started") == b.count("consumer_started") == 1


# -- 2. Redis down for longer than the lease, then back ----------------------------------------


@pytest.mark.parametrize("outage", ["pause", "kill"])
async def test_redis_down_past_the_lease_reclaims_without_stampeding_a_host(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path, outage: str) -> None:
    """Every lease expires during the outage; afterwards the reclaimed tasks go back
    through the fleet-wide host limits (one request at a time, 0.1 s apart)."""
    n, lease_s, delay_s = 30, 1.5, 0.1
    server = start_redis(servers, aof=True)
    # Pages much slower than the delay: the host's one slot is nearly always leased (the
    # frontier leases a task only when its host may be asked), so the outage finds one.
    async with start_site_process(delay_ms=400) as site:
        path, ids = url_file(tmp_path / "urls.txt", [site.url(f"/p/{i}") for i in range(n)])
        fleet.policy = CrawlPolicy(per_host_delay=delay_s, per_host_concurrency=1,
                                   ignore_robots=True, retry_base=0.1)
        producer = await fleet.producer("producer", server.url, "--partitions", "2", path)
        assert await producer.wait(30) == 0, producer.log_text()[-2000:]

        # Each consumer may hold every task (64 active, batches of 8): the mass reclaim
        # after the outage can hand all of them to one consumer at once.
        common = ("--concurrency", "32", "--lease-batch", "8", "--lease", f"{lease_s}s",
                  "--exit-when-empty", "--per-host-concurrency", "1",
                  "--per-host-delay", f"{delay_s}s")
        a = await fleet.consumer("a", server.url, *common)
        b = await fleet.consumer("b", server.url, *common)
        async with queue_of(server, fleet.crawl) as queue:
            async def going_and_held() -> bool:
                stats = await queue.stats()
                return stats.done >= 4 and stats.leased > 0

            await until(going_and_held, 30, "the crawl to get going, a lease held")

        if outage == "pause":
            pause(server)  # SIGSTOP: connections stay open, nothing answers
            await asyncio.sleep(2 * lease_s)
            resume(server)
        else:
            server.kill()
            await asyncio.sleep(2 * lease_s)
            server.restart()
        recovered = time.monotonic()
        assert a.running and b.running, "a consumer died with Redis"
        async with queue_of(server, fleet.crawl) as queue:
            complete = await crawl_completes(queue, within=20)
            seen = await site.stats()
            # Politeness first: it must hold after recovery whether or not the crawl ends.
            after = [t for t in page_times(seen.times) if t >= recovered]
            assert len(after) >= 10, f"only {len(after)} requests after the outage"
            assert_spaced(after, delay_s)
            assert complete, f"the crawl did not complete: {await queue.stats()}"
            await finish(queue, [a, b], within=5)
            stats = await assert_nothing_lost(queue, ids)
            assert stats.done == n, stats.dead_reasons
            assert stats.counters.get("reclaimed", 0) >= 1, "no lease expired in the outage"
    assert_no_crash(a, b, max_warnings=60)


async def test_a_late_turn_in_an_outage_hands_its_task_back(
        servers: list[RedisServer], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A polite request that goes out late takes a turn of its own first (late_turn.lua;
    test_frontier's test_a_request_late_on_the_wire_takes_a_turn_of_its_own): here the
    first page answers in 1.5 s on the host's one connection, so the second goes out
    late, and Redis dies just before the first page's answer. Nothing is sent: the task
    is handed back (no attempt counted, no internal_error, no traceback), and once Redis
    is back every page is done, a delay apart."""
    server = start_redis(servers, aof=True)
    delay, outage_s = 1.0, 3.0
    restarts: list[asyncio.Task[None]] = []

    async def page(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if n == 0:
            await asyncio.sleep(1.5)
            server.kill()  # the second page, waiting for this connection, goes out late

            async def back() -> None:
                await asyncio.sleep(outage_s)
                await asyncio.to_thread(server.start)
            restarts.append(asyncio.create_task(back()))
        return web.Response(text=f"<html><body>page {n}</body></html>",
                            content_type="text/html")

    async with serve({"/p/{n}": page}) as site:
        client = aioredis.Redis.from_url(server.url)
        queue = await LeasingQueue.open(client, "late")
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in
                             (site.url(f"/p/{n}") for n in range(3))])
        await client.aclose()
        settings = settings_from_args(build_parser().parse_args([
            "--redis-url", server.url, "--crawl", "late", "--allow-private",
            "--ignore-robots", "--http-port", "-1", "--exit-when-empty", "--empty-grace",
            "0", "--lease", "30s", "--output", str(tmp_path / "out"), "--per-host-delay",
            f"{delay}", "--per-host-concurrency", "2", "--concurrency", "8"]))
        settings = dataclasses.replace(
            settings, fetch=dataclasses.replace(settings.fetch, limit_per_host=1))
        caplog.set_level(logging.INFO)
        assert await asyncio.wait_for(run_consumer(settings), 60) == 0
        await asyncio.gather(*restarts)
        times = sorted(t for ts in site.hits.values() for t in ts)
    assert restarts, "the first page never answered"
    events = [r.message for r in caplog.records]
    assert "handed_back" in events, events  # the late turn met the outage
    assert "task_crashed" not in events, caplog.text[-3000:]
    assert not [r for r in caplog.records if r.exc_info], caplog.text[-3000:]
    async with queue_of(server, "late") as queue:
        stats = await queue.stats()
    assert stats.done == 3 and stats.dead == 0, (stats, stats.dead_reasons)
    records = [json.loads(line) for f in (tmp_path / "out").glob("*.jsonl")
               for line in f.read_text().splitlines()]
    assert sorted(r["attempt"] for r in records) == [1, 1, 1], records
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) == 3 and min(gaps) >= delay - 0.05, gaps


# -- 3. CLIENT KILL in a loop ------------------------------------------------------------------


async def test_client_kill_loop_no_double_ack_and_nothing_lost(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path) -> None:
    n, killing_s = 480, 10.0  # 6 fetches of 150 ms at a time: about 12 s of crawl
    server = start_redis(servers)
    async with start_site_process(delay_ms=150) as site:
        path, ids = url_file(tmp_path / "urls.txt", [site.url(f"/p/{i}") for i in range(n)])
        producer = await fleet.producer("producer", server.url, "--partitions", "4", path)
        assert await producer.wait(30) == 0, producer.log_text()[-2000:]

        common = ("--concurrency", "3", "--lease", "2s", "--exit-when-empty")
        a = await fleet.consumer("a", server.url, *common)
        b = await fleet.consumer("b", server.url, *common)
        killer = aioredis.Redis.from_url(server.url, single_connection_client=True)
        killed = rounds = 0
        try:
            async with queue_of(server, fleet.crawl) as queue:
                async def started() -> bool:
                    return (await queue.stats()).done >= 10

                await until(started, 30, "the crawl to get going")
            # From here on no other connection of this test is open: each CLIENT KILL
            # hits the consumers' connections only (and SKIPME spares the killer's).
            end = time.monotonic() + killing_s
            while time.monotonic() < end and (a.running or b.running):
                killed += int(await killer.execute_command(
                    "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
                rounds += 1
                await asyncio.sleep(0.1)
            still_crawling = a.running and b.running
        finally:
            await killer.aclose()
        assert still_crawling, "the crawl ended before the killing did: make it longer"
        assert rounds >= 50 and killed >= rounds, (rounds, killed)

    async with queue_of(server, fleet.crawl) as queue:
        await finish(queue, [a, b], within=60)
        stats = await assert_nothing_lost(queue, ids)
        assert stats.done <= stats.counters["enqueued"]
        assert stats.counters.get("outcome:ok", 0) == stats.done
        done_urls = {ids[tid] for tid in ids if await queue.state_of(tid) == "done"}
    sunk = {r["url"] for f in sorted(fleet.output.glob("*.jsonl"))
            for r in map(json.loads, f.read_text().splitlines())}
    assert done_urls <= sunk, "a task was acked without its result in any sink"
    # Killed connections mostly heal inside redis-py's retry; what surfaces is backed off.
    assert_no_crash(a, b, max_warnings=100)


# -- 3b. CLIENT KILL in a loop during a crawl of a trap site -------------------------------

WORDS = [f"w{i}" for i in range(3000)]
#: A site's template: the same 50 words on every page (the text of its own outweighs it:
#: no page but a soft 404 is another's near duplicate).
NAV = " ".join(random.Random(0).choices(WORDS, k=50))
REAL, VARIANTS_A_PAGE, VARIANT_LIMIT = 60, 3, 5


def trap_html(text: str, links: list[str]) -> web.Response:
    hrefs = "".join(f'<a href="{h}">more</a> ' for h in links)
    return web.Response(text=f"<html><body><nav>{NAV}</nav><main>{text}</main>{hrefs}"
                             "</body></html>", content_type="text/html")


def article(seed: int) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=300))


def trap_routes() -> dict[str, Any]:
    """An index of REAL pages; each links, once in the whole site, to a path repeating a
    segment (trap_repeats), VARIANTS_A_PAGE queries of one path (past VARIANT_LIMIT in
    all: trap_variants) and a soft 404 (the same text at any path)."""
    async def index(request: web.Request) -> web.Response:
        return trap_html(article(1_000_000), [f"/real/{n}" for n in range(REAL)])

    async def real(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        await asyncio.sleep(0.4)  # >= 4 s of crawl: 20 kill rounds meet it even under load
        return trap_html(article(n), [f"/t/{n}/x/x/x/", f"/lost/{n}",
                                      *(f"/v?q={n}-{k}" for k in range(VARIANTS_A_PAGE))])

    async def variant(request: web.Request) -> web.Response:
        return trap_html(article(10_000 + hash(request.query_string) % 10_000), [])

    async def lost(request: web.Request) -> web.Response:
        return trap_html("Sorry, this page was not found. " + article(2_000_000),
                         [request.path + "/more"])

    return {"/": index, "/real/{n}": real, "/v": variant, "/lost/{tail:.*}": lost}


async def test_client_kill_loop_keeps_trap_tallies_exact(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path) -> None:
    """Trap calls whose reply a killed connection lost are sent again (by the client, or
    by the flusher's step) under their operation id: each refused link and each page
    judged a near duplicate is tallied once. Every link here is on one page only, so the
    tallies are known: one trap_repeats a page, every query past the limit trap_variants,
    and soft_404 as many as the pages done with that outcome (each says it was not
    found: its directory is probed, and the probe's answer is theirs)."""
    server = start_redis(servers)
    fleet.policy = CrawlPolicy(per_host_delay=0, per_host_concurrency=0, ignore_robots=True,
                               retry_base=0.1, max_depth=5, trap_path_variants=VARIANT_LIMIT)
    async with serve(trap_routes()) as site:
        path, _ = url_file(tmp_path / "urls.txt", [site.url("/")])
        producer = await fleet.producer("producer", server.url, path)
        assert await producer.wait(30) == 0, producer.log_text()[-2000:]
        common = ("--concurrency", "3", "--lease", "10s", "--exit-when-empty",
                  "--handler", "consumer_handlers:links_and_items")
        a = await fleet.consumer("a", server.url, *common)
        b = await fleet.consumer("b", server.url, *common)
        killer = aioredis.Redis.from_url(server.url, single_connection_client=True)
        killed = rounds = 0
        try:
            async with queue_of(server, fleet.crawl) as queue:
                async def started() -> bool:
                    return (await queue.stats()).done >= 3

                await until(started, 30, "the crawl to get going")
            end = time.monotonic() + 8
            while time.monotonic() < end and a.running and b.running:
                killed += int(await killer.execute_command(
                    "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
                rounds += 1
                await asyncio.sleep(0.1)
        finally:
            await killer.aclose()
        assert rounds >= 20 and killed >= rounds, (rounds, killed)
        async with queue_of(server, fleet.crawl) as queue:
            await finish(queue, [a, b], within=90)
            stats = await queue.stats()
            [row] = await TrapBook(queue).hosts()
    assert stats.dead == 0, stats.dead_reasons
    judged = stats.counters.get("outcome:soft_404", 0)
    assert judged >= REAL - 4, stats.counters  # all soft 404s but the first few
    probes = stats.counters.get("outcome:probe", 0)
    assert stats.counters.get("outcome:ok", 0) == stats.done - judged - probes
    assert row.reasons == {"trap_repeats": REAL,
                           "trap_variants": REAL * VARIANTS_A_PAGE - VARIANT_LIMIT,
                           "soft_404": judged}, (row, stats.counters)
    assert row.total == sum(row.reasons.values())
    assert {f"/real/{n}" for n in range(REAL)} <= set(site.hits)
    assert_no_crash(a, b, max_warnings=100)


# -- 4. Redis at maxmemory with noeviction -----------------------------------------------------


OOM_ARGS = ("--maxmemory", "2mb", "--maxmemory-policy", "noeviction")


async def seen_marks(client: aioredis.Redis, queue: LeasingQueue) -> int:
    """How many URLs the exact-dedup buckets of every partition remember."""
    total = 0
    for pk in queue.partitions:
        pattern = pk.seen(0).rsplit(":", 1)[0].replace("{", "\\{").replace("}", "\\}") + ":*"
        async for key in client.scan_iter(match=pattern, count=1000):
            total += await client.hlen(key)
    return total


BATCH = 100
#: The producer's queue: a file of many URLs with fat task bodies, so a 2 MB Redis fills up
#: after a few batches.
PAD = "pad=" + "x" * 300


async def fill_with_producer(fleet: Fleet, server: RedisServer, tmp_path: Path) -> Child:
    """Run a producer until Redis refuses its writes; returns the exited producer."""
    path, _ = url_file(tmp_path / "urls.txt",
                       [f"http://127.0.0.1:9/p/{i}" for i in range(20_000)])
    producer = await fleet.producer("producer", server.url, "--enqueue-batch", str(BATCH),
                                    "--meta", PAD, path)
    await producer.wait(60)
    return producer


async def test_producer_exits_3_naming_out_of_memory_at_maxmemory(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path) -> None:
    """Redis < 7 wraps an OOM refusal inside a script ('Error running script ...: -OOM
    command not allowed ...'); it must still read as out of memory, not crash."""
    server = start_redis(servers, extra_args=OOM_ARGS)
    producer = await fill_with_producer(fleet, server, tmp_path)
    stderr = producer.log_text()
    assert producer.proc.returncode == 3, stderr[-3000:]
    assert "out of memory" in stderr and "maxmemory" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr
    summary = producer.summary()
    assert "out of memory" in summary["error"]
    async with queue_of(server, fleet.crawl) as queue:
        # Every batch it reported is in, and nothing else.
        assert (await queue.stats()).counters["enqueued"] == summary["enqueued"] > 0


async def test_maxmemory_refuses_whole_batches_and_consumers_still_drain(
        fleet: Fleet, servers: list[RedisServer], tmp_path: Path) -> None:
    server = start_redis(servers, extra_args=OOM_ARGS)
    async with start_site_process() as site:
        urls = [site.url(f"/p/{i}") for i in range(20_000)]
        path, _ = url_file(tmp_path / "urls.txt", urls)
        producer = await fleet.producer("producer", server.url, "--enqueue-batch", str(BATCH),
                                        "--meta", PAD, path)
        assert await producer.wait(60) == 3, producer.log_text()[-3000:]

        client = aioredis.Redis.from_url(server.url)
        try:
            # Keep Redis full for the whole drain, whatever the acks free: a limit below
            # what an empty Redis uses. Every write that needs memory is refused.
            await client.config_set("maxmemory", 500_000)
            with pytest.raises(OutOfMemoryError):
                await client.set("drill:probe", "x")
            queue = await LeasingQueue.existing(client, fleet.crawl)
            pk = queue.partitions[0]
            stats = await queue.stats()
            enqueued = stats.counters["enqueued"]
            # Batches are all or nothing: no body, id or seen mark of a refused batch.
            assert 0 < enqueued < len(urls) and enqueued % BATCH == 0, enqueued
            assert int(await client.get(pk.pending) or 0) == stats.pending == enqueued
            entries = sum([await client.llen(pk.host_queue(h.decode()))
                           for h in await client.zrange(pk.queued, 0, -1)])
            assert entries == enqueued, "a task entry of a refused batch"
            assert await seen_marks(client, queue) == enqueued, "a seen mark of a lost batch"

            # A short lease: heartbeats and the reaper run during the drain too.
            common = ("--concurrency", "16", "--lease", "3s", "--exit-when-empty")
            a = await fleet.consumer("a", server.url, *common)
            b = await fleet.consumer("b", server.url, *common)
            assert await a.wait(60) == 0, a.log_text()[-3000:]
            assert await b.wait(30) == 0, b.log_text()[-3000:]
            stats = await queue.stats()
            assert (stats.pending, stats.leased, stats.waiting, stats.dead) == (0, 0, 0, 0)
            assert stats.done == enqueued
            assert await client.hlen(pk.tasks) == 0
            with pytest.raises(OutOfMemoryError):  # it was full all along
                await client.set("drill:probe", "x")
        finally:
            await client.aclose()
    sunk = [r for f in sorted(fleet.output.glob("*.jsonl"))
            for r in map(json.loads, f.read_text().splitlines())]
    assert len({r["task_id"] for r in sunk}) == enqueued
    assert_no_crash(a, b, max_warnings=100)


async def full_redis(servers: list[RedisServer], crawl: str
                     ) -> tuple[aioredis.Redis, LeasingQueue, list[Lease], list[Lease]]:
    """A queue with 4 live and 2 expired leases, on a Redis then over its maxmemory (set
    below what it uses, so no freed buffer brings it back under the limit)."""
    server = start_redis(servers, extra_args=("--maxmemory-policy", "noeviction"))
    client = aioredis.Redis.from_url(server.url)
    queue = await LeasingQueue.open(client, crawl)
    urls = [f"http://127.0.0.1:9/full/{i}" for i in range(10)]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    live = await queue.lease("w", 4, 600_000)
    expired = await queue.lease("w", 2, 1)
    await expire(queue, *expired)  # on Redis' clock, before Redis is full
    used = int((await client.info("memory"))["used_memory"])
    await client.config_set("maxmemory", used - 200_000)
    with pytest.raises(OutOfMemoryError):
        await client.set("other-app:probe", "x")
    return client, queue, live, expired


# Redis refuses a memory-growing command (ZADD, HSET, HINCRBY, SET) at maxmemory when it
# is a script's first write; the transitions that free or only move memory must still run.


async def test_heartbeats_renew_leases_at_maxmemory(servers: list[RedisServer],
                                                    crawl_name: str) -> None:
    """Else every lease expires while Redis is full and a long fetch can never finish."""
    client, queue, live, _ = await full_redis(servers, crawl_name)
    try:
        assert await queue.renew("w", live, 600_000) == []
    finally:
        await client.aclose()


async def test_the_reaper_reclaims_at_maxmemory(servers: list[RedisServer],
                                                crawl_name: str) -> None:
    """Its SET NX guard can't be written then; a dead consumer's tasks must come back."""
    client, queue, _, expired = await full_redis(servers, crawl_name)
    try:
        assert await queue.reap(1000) == (len(expired), 0, 0)
    finally:
        await client.aclose()


async def test_an_expired_ack_is_answered_at_maxmemory(servers: list[RedisServer],
                                                       crawl_name: str) -> None:
    """An ack whose only write would be the stats counter: refused, it would be retried
    by the consumer's flusher until memory is freed elsewhere."""
    client, queue, live, expired = await full_redis(servers, crawl_name)
    try:
        assert await queue.ack("w", [(x, "ok") for x in expired]) == [Code.EXPIRED] * 2
        assert await queue.ack("w", [(x, "ok") for x in live]) == [Code.OK] * 4
    finally:
        await client.aclose()


# -- 5. a consumer whose leases all expired during an outage leases again ----------------------


@contextlib.asynccontextmanager
async def consumer_in_process(server: RedisServer, queue: LeasingQueue, tmp_path: Path,
                              worker_id: str) -> AsyncIterator[Consumer]:
    """A consumer (concurrency 4, 60 s leases) running in this process, so a test can
    drive its heartbeat; on exit it is stopped hard (released, pages not waited for). It
    has its own LeasingQueue, so a test can patch the consumer's without touching `queue`."""
    args = ["--redis-url", server.url, "--crawl", queue.crawl, *CONSUMER_FLAGS,
            "--output", str(tmp_path / "out"), "--concurrency", "4", "--lease", "60s",
            "--worker-id", worker_id]
    settings = settings_from_args(build_parser().parse_args(args))
    async with Fetcher(settings.fetch) as fetcher:
        sink = make_sink("jsonl", output_dir=settings.output, worker=settings.worker_id,
                         crawl=queue.crawl)
        await sink.open()
        consumer = Consumer(settings, LeasingQueue(queue.client, queue.crawl, queue.settings),
                            fetcher, sink, Metrics())
        running = asyncio.create_task(consumer.run())
        try:
            yield consumer
        finally:
            consumer.request_stop()
            consumer.request_stop()  # hard stop: release, don't wait for the pages
            await asyncio.wait_for(running, 10)


async def test_consumer_leases_again_after_an_outage_took_every_lease(
        servers: list[RedisServer], crawl_name: str, tmp_path: Path) -> None:
    """A consumer at its lease cap (8 tasks: 4 fetching slow pages, 4 waiting for a fetch
    slot) loses every lease at one heartbeat, as after an outage longer than the lease.
    It must go back to work once the tasks are reclaimed.

    In-process, so the heartbeat can be driven by hand. (A finished task must wake the
    leaser: when only the first of the cancelled tasks did, the leaser found no room yet
    and waited for good; as processes, about half the runs of the Redis-pause drill.)
    """
    server = start_redis(servers)
    client = aioredis.Redis.from_url(server.url)
    try:
        async with test_site(delay_ms=20_000) as site:
            queue = await LeasingQueue.open(client, crawl_name)
            urls = [site.url(f"/p/{i}") for i in range(12)]
            await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
            async with consumer_in_process(server, queue, tmp_path, "w-stall") as consumer:
                async def at_the_cap() -> bool:
                    return len(consumer.held) == 8 and site.stats_.total() == 4

                await until(at_the_cap, 10, "8 leases held and 4 fetches in flight")
                # What an outage past the lease leaves behind: every deadline has passed.
                leases = queue.partitions[0].leases
                await client.zadd(leases, dict.fromkeys(consumer.held, 1))
                await consumer.renew()  # the next heartbeat: all 8 lost, their work cancelled
                assert not consumer.held
                assert (await queue.reclaim())[0] == 8

                async def working_again() -> bool:
                    return bool(consumer.held)

                await until(working_again, 3, "the consumer to lease again")
    finally:
        await client.aclose()


# -- 6. a late heartbeat reply must not cancel the work of a newer lease ----------------------


async def test_a_late_renew_reply_does_not_cancel_the_work_of_a_newer_lease(
        servers: list[RedisServer], crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply order of an outage, made deterministic: a renew is held back (as behind a
    frozen Redis) while its task is reclaimed and leased again by the same consumer. Its
    late "lost" must not cancel the newer lease's work: that lease would stay held and
    renewed, its task never done (about one run in seven of the Redis-pause drill)."""
    server = start_redis(servers)
    client = aioredis.Redis.from_url(server.url)
    try:
        async with test_site(delay_ms=1500) as site:
            queue = await LeasingQueue.open(client, crawl_name)
            url = site.url("/p/1")
            tid = task_id(fingerprint(url))
            await queue.enqueue([NewTask(url, fingerprint(url))])
            async with consumer_in_process(server, queue, tmp_path, "w-renew") as consumer:
                async def fetching() -> bool:
                    return tid in consumer.held and site.stats_.total() == 1

                await until(fetching, 10, "the first lease and its fetch")
                first = consumer.held[tid]

                gate = asyncio.Event()
                renew = consumer.queue.renew

                async def held_back(*a: Any, **kw: Any) -> Any:
                    await gate.wait()  # the renew waits behind the outage
                    return await renew(*a, **kw)

                monkeypatch.setattr(consumer.queue, "renew", held_back)
                heartbeat = asyncio.create_task(consumer.renew())  # snapshot: the first lease
                await asyncio.sleep(0)
                # Meanwhile the lease expires, is reclaimed and is leased again by it.
                await client.zadd(queue.partitions[0].leases, {tid: 1})
                assert (await queue.reclaim())[0] == 1

                async def leased_again() -> bool:
                    return consumer.held.get(tid) not in (None, first)

                await until(leased_again, 5, "the consumer to lease the task again")
                gate.set()
                await heartbeat  # reports the first lease lost

                async def done() -> bool:
                    return await queue.state_of(tid) == "done"

                await until(done, 4, "the second lease's fetch to finish the task")
    finally:
        await client.aclose()


# -- 7. a consumer that finds its crawl already done exits -------------------------------------


async def test_consumer_exits_when_its_crawl_is_already_empty_at_start(
        servers: list[RedisServer], crawl_name: str, tmp_path: Path) -> None:
    """It returns within milliseconds and cancels its heartbeat and reaper while they are
    in their first Redis call, where redis-py can lose the cancellation; the loops must
    end anyway (they check a closing flag; shutdown waits for them a bounded time).
    In-process, where that lost cancellation shows every time."""
    server = start_redis(servers)
    client = aioredis.Redis.from_url(server.url)
    runs: list[asyncio.Task[int]] = []
    try:
        queue = await LeasingQueue.open(client, crawl_name)
        url = "http://127.0.0.1:9/done"
        await queue.enqueue([NewTask(url, fingerprint(url))])
        [lease] = await queue.lease("w", 1, 60_000)
        await queue.ack("w", [(lease, "ok")])
        for i in range(3):
            args = ["--redis-url", server.url, "--crawl", crawl_name, *CONSUMER_FLAGS,
                    "--empty-grace", "0", "--exit-when-empty", "--worker-id", f"w-empty-{i}",
                    "--output", str(tmp_path / "out")]
            runs.append(asyncio.create_task(run_consumer(
                settings_from_args(build_parser().parse_args(args)))))
        _, pending = await asyncio.wait(runs, timeout=10)  # the shutdown wait is 5 s
        assert not pending, f"{len(pending)} of {len(runs)} consumers did not exit"
        assert [r.result() for r in runs] == [0] * len(runs)
    finally:
        for r in runs:
            r.cancel()
        await asyncio.wait(runs, timeout=10) if runs else None
        await client.aclose()
