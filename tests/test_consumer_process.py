"""Process-level fault tests: real ``python -m consumer`` subprocesses against a real Redis.

Each test runs its test site as a child process too (``tests.sites``), so neither the
consumers nor the site share an event loop with the test. Consumers are killed,
SIGTERMed, SIGSTOPped and SIGCONTed as an orchestrator or a crash would; the assertions
read Redis (states, counters, the worker registry), the JSONL sink files, the consumers'
logs and their side HTTP server. Only 127.0.0.1 is ever contacted.

Every child is killed in teardown (`spawn` fixture, `start_site_process`), and every wait
has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from procs import JsonLog
from sites import start_site_process, test_site
from support.leases import owned_by
from support.ports import closed_port

from common.exitcodes import EXIT_REDIS
from common.keys import CrawlKeys
from common.names import WORKER_ID_RULE
from common.policy import create_policy
from common.queue import CrawlQueue, CrawlSettings, NewTask
from common.urls.canonical import canonicalize, fingerprint, task_id

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4

pytestmark = pytest.mark.timeout(240)
#: How long a consumer may take to start (its http_listening, consumer_started): a bound
#: that only catches a hang. Under two cores' load, with PYTHONDONTWRITEBYTECODE (no .pyc:
#: every import compiled), start-up took over 20 s. What a test times is measured from
#: the start-up on, never across it.
STARTUP_S = 120


# -- helpers -------------------------------------------------------------------------------


async def until(pred: Callable[[], Awaitable[bool] | bool], within: float, what: str,
                interval: float = 0.05) -> None:
    """Poll `pred` until it is true; fail the test after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got = pred()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class ConsumerProc(JsonLog):
    """One ``python -m consumer`` child; stdout and stderr go to `log_path`."""

    name: str
    worker_id: str
    proc: asyncio.subprocess.Process
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait_event(self, name: str, within: float = STARTUP_S) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def seen() -> bool:
            if self.proc.returncode is not None:
                pytest.fail(f"consumer {self.name} exited ({self.proc.returncode}) before "
                            f"logging {name}:\n{self.log_text()[-3000:]}")
            event = self.event(name)
            if event is not None:
                found.update(event)
            return event is not None

        await until(seen, within, f"{self.name} to log {name}")
        return found

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

class Spawner:
    """Starts consumers for one test; `close()` kills whatever is still running."""

    def __init__(self, redis_url: str, crawl: str, tmp_path: Path) -> None:
        self.redis_url = redis_url
        self.crawl = crawl
        self.tmp_path = tmp_path
        self.output = tmp_path / "out"
        self.children: list[ConsumerProc] = []

    async def start(self, name: str, *args: str, env: dict[str, str] | None = None,
                    worker_id: str = "") -> ConsumerProc:
        worker_id = worker_id or f"w-{name}-{os.getpid()}"
        log_path = self.tmp_path / f"{name}.log"
        child_env = {k: v for k, v in os.environ.items()
                     if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
        child_env["CRAWLQ_LOG_FORMAT"] = "json"
        child_env.update(env or {})
        argv = [sys.executable, "-m", "consumer", "--redis-url", self.redis_url,
                "--crawl", self.crawl, "--worker-id", worker_id, "--allow-private",
                "--output", str(self.output), "--http-port", "-1", "--empty-grace", "0",
                "--retry-base", "0.1", "--per-host-concurrency", "0",
                "--per-host-delay", "0", *args]
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=self.tmp_path, env=child_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file, stderr=asyncio.subprocess.STDOUT)
        child = ConsumerProc(name, worker_id, proc, log_path)
        self.children.append(child)
        return child

    async def close(self) -> None:
        for child in self.children:
            await child.kill()


@pytest.fixture
async def spawn(redis_url: str, crawl_name: str, tmp_path: Path) -> AsyncIterator[Spawner]:
    spawner = Spawner(redis_url, crawl_name, tmp_path)
    try:
        yield spawner
    finally:
        await spawner.close()


async def enqueue(client: aioredis.Redis, crawl: str, urls: list[str]
                  ) -> tuple[CrawlQueue, dict[str, str]]:
    """Create the crawl and enqueue `urls`; returns the queue and id -> url."""
    queue = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=PARTITIONS))
    tasks = []
    for raw in urls:
        url = canonicalize(raw)
        assert isinstance(url, str), url
        tasks.append(NewTask(url, fingerprint(url)))
    for i in range(0, len(tasks), 200):
        await queue.enqueue(tasks[i:i + 200])
    return queue, {task_id(t.fp): t.url for t in tasks}


def sink_records(output: Path) -> list[dict[str, Any]]:
    """Every JSONL record under `output`; only a file's torn last line is skipped."""
    records = []
    for path in sorted(output.glob("*.jsonl")):
        lines = path.read_bytes().split(b"\n")
        for n, line in enumerate(lines):
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                assert n == len(lines) - 1, f"corrupt line {n} in {path.name}"
    return records


async def http_get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(
            url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status, await resp.text()


async def dump_keys(client: aioredis.Redis, pattern: str) -> bytes:
    """Every value under the keys matching `pattern`, read by type, as one blob."""
    parts: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=1000):
        kind = (await client.type(key)).decode()
        parts.append(key)
        if kind == "string":
            parts.append(await client.get(key) or b"")
        elif kind == "hash":
            for k, v in (await client.hgetall(key)).items():
                parts += [k, v]
        elif kind == "list":
            parts += await client.lrange(key, 0, -1)
        elif kind == "set":
            parts += list(await client.smembers(key))
        elif kind == "zset":
            parts += [m for m, _ in await client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            for entry_id, fields in await client.xrange(key):
                parts.append(entry_id)
                for k, v in fields.items():
                    parts += [k, v]
    return b"\n".join(parts)


# -- 1. kill -9 mid-crawl ----------------------------------------------------------------------


async def test_kill_9_mid_crawl_loses_nothing(spawn: Spawner, redis_client: aioredis.Redis,
                                              crawl_name: str) -> None:
    n = 600
    async with start_site_process(delay_ms=30, robots="User-agent: *\nAllow: /\n") as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(n)])
        common = ("--concurrency", "4", "--lease", "2s", "--exit-when-empty")
        a = await spawn.start("a", *common)
        b = await spawn.start("b", *common)
        await a.wait_event("consumer_started")
        await b.wait_event("consumer_started")

        async def a_third_done() -> bool:
            return (await queue.stats()).done >= n // 3

        await until(a_third_done, 30, "a third of the crawl to be done")
        a.proc.kill()  # SIGKILL: no drain, no release, no deregistration
        assert await a.wait(10) == -signal.SIGKILL
        held = await owned_by(queue, a.worker_id)  # expire in <= 2 s: read them now
        assert held, "the killed consumer held no lease: the kill came too late"
        # Unfinished tasks are capped at 2 x --concurrency, all held leases (finished
        # ones waiting for their flush too) at 4 x.
        assert len(held) <= 16

        assert await b.wait(60) == 0, b.log_text()[-3000:]
        stopped = b.event("consumer_stopped")
        assert stopped is not None and stopped["reason"] == "crawl empty"

    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.waiting) == (0, 0, 0)
    assert stats.counters["enqueued"] == n
    assert stats.done + stats.dead == n
    assert stats.counters.get("reclaimed", 0) >= len(held)
    states = {tid: await queue.state_of(tid) for tid in ids}
    assert set(states.values()) <= {"done", "dead"}, Counter(states.values())

    records = sink_records(spawn.output)
    per_url = Counter(r["url"] for r in records)
    done_urls = {ids[tid] for tid, state in states.items() if state == "done"}
    assert done_urls - set(per_url) == set(), "a done task is missing from every sink"
    ok = [r for r in records if r["outcome"] == "ok"]
    assert all(r["status"] == 200 for r in ok)
    assert {r["worker"] for r in records} <= {a.worker_id, b.worker_id}
    dupes = {url for url, count in per_url.items() if count > 1}
    held_urls = {ids[tid] for tid in held}
    assert dupes <= held_urls, "only the killed consumer's tasks may be written twice"
    assert sum(per_url[u] - 1 for u in dupes) <= len(held)


# -- 2. SIGTERM releases leases at once ---------------------------------------------------------


async def test_sigterm_releases_leases_for_the_next_consumer(
        spawn: Spawner, redis_client: aioredis.Redis, crawl_name: str) -> None:
    n = 8
    async with start_site_process(delay_ms=5000) as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(n)])
        a = await spawn.start("a", "--concurrency", "4", "--lease", "60s", "--grace", "1s",
                              "--ignore-robots")
        await a.wait_event("consumer_started")

        async def holding_and_fetching() -> bool:
            return ((await queue.stats()).leased == n
                    and (await site.stats()).total() >= 4)

        await until(holding_and_fetching, 20, "a to lease every task and fetch 4")
        assert await owned_by(queue, a.worker_id) == set(ids)

        sigterm = time.monotonic()
        a.signal(signal.SIGTERM)
        assert await a.wait(10) == 0, a.log_text()[-3000:]
        assert time.monotonic() - sigterm < 5, "drain took longer than --grace allows"
        stats = await queue.stats()
        assert (stats.leased, stats.pending) == (0, n)
        assert stats.counters.get("released") == n
        assert {await queue.state_of(tid) for tid in ids} == {"pending"}
        keys = CrawlKeys.build(crawl_name)
        assert await redis_client.zscore(keys.workers, a.worker_id) is None
        assert not await redis_client.exists(keys.worker(a.worker_id))
        stopped = a.event("consumer_stopped")
        assert stopped is not None and stopped["reason"] == "signal"
        assert a.event("drain_grace_over") is not None  # 4 fetches outlived --grace

        b = await spawn.start("b", "--concurrency", "8", "--lease", "60s", "--exit-when-empty",
                              "--ignore-robots")
        assert await b.wait(STARTUP_S) == 0, b.log_text()[-3000:]
    stats = await queue.stats()
    assert stats.done == n and stats.active == 0
    # Without the release, b would have waited for a's 60 s leases to expire and be
    # reclaimed (counted, not timed: b's start-up under load is not what is measured).
    assert stats.counters.get("reclaimed", 0) == 0
    assert sorted(r["url"] for r in sink_records(spawn.output)
                  if r["worker"] == b.worker_id) == sorted(ids.values())


async def test_second_sigterm_releases_in_flight_leases_and_exits_at_once(
        spawn: Spawner, redis_client: aioredis.Redis, crawl_name: str) -> None:
    n = 8
    async with start_site_process(delay_ms=10_000) as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(n)])
        a = await spawn.start("a", "--concurrency", "4", "--lease", "60s", "--grace", "30s",
                              "--ignore-robots")
        await a.wait_event("consumer_started")

        async def fetching() -> bool:
            return ((await queue.stats()).leased == n
                    and (await site.stats()).total() >= 4)

        await until(fetching, 20, "a to lease every task and fetch 4")
        a.signal(signal.SIGTERM)
        await a.wait_event("consumer_draining")

        async def waiting_ones_released() -> bool:
            return (await queue.stats()).pending == n - 4

        await until(waiting_ones_released, 5, "the 4 unstarted tasks to be released")
        second = time.monotonic()
        a.signal(signal.SIGTERM)  # don't wait out the 30 s grace
        assert await a.wait(10) == 0, a.log_text()[-3000:]
        assert time.monotonic() - second < 3
    stats = await queue.stats()
    assert (stats.leased, stats.pending) == (0, n), "in-flight leases were not released"
    assert {await queue.state_of(tid) for tid in ids} == {"pending"}


# -- 3. SIGSTOP past the lease, then SIGCONT -------------------------------------------------------


@pytest.mark.parametrize("in_flight", [
    pytest.param(8, id="all_in_flight"),
    pytest.param(4, id="half_waiting"),
])
async def test_sigstop_past_lease_results_dropped_not_double_counted(
        spawn: Spawner, redis_client: aioredis.Redis, crawl_name: str, in_flight: int) -> None:
    """a holds 8 leases, fetching `in_flight` of them, when it is frozen past its lease."""
    n = 8
    async with start_site_process(delay_ms=1500) as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(n)])
        a = await spawn.start("a", "--concurrency", str(in_flight), "--lease", "2s",
                              "--ignore-robots", "--http-port", "0")
        port = (await a.wait_event("http_listening"))["port"]
        await a.wait_event("consumer_started")

        async def holding_and_fetching() -> bool:
            return ((await site.stats()).total() >= in_flight
                    and await owned_by(queue, a.worker_id) == set(ids))

        await until(holding_and_fetching, 20, f"a to hold every task and fetch {in_flight}")
        a.signal(signal.SIGSTOP)  # the server answers while a is frozen
        stopped_at = time.monotonic()

        b = await spawn.start("b", "--concurrency", "8", "--lease", "2s", "--ignore-robots",
                              "--exit-when-empty")
        assert await b.wait(30) == 0, b.log_text()[-3000:]
        assert time.monotonic() - stopped_at > 3  # past a's lease: reclaimed, not stolen
        stats = await queue.stats()
        assert stats.done == n and stats.active == 0
        assert stats.counters.get("reclaimed", 0) >= n

        a.signal(signal.SIGCONT)

        async def a_dropped_all() -> bool:
            _, text = await http_get(f"http://127.0.0.1:{port}/metrics")
            lost = [line for line in text.splitlines()
                    if line.startswith("crawlq_leases_lost_total ")]
            return bool(lost) and float(lost[0].split()[1]) >= n

        await until(a_dropped_all, 15, "a to drop the results of its lost leases")
        _, metrics = await http_get(f"http://127.0.0.1:{port}/metrics")
        assert 'crawlq_tasks_total{outcome="ok"} 0.0' in metrics
        a.signal(signal.SIGTERM)
        assert await a.wait(10) == 0, a.log_text()[-3000:]
        seen = await site.stats()

    stats = await queue.stats()
    assert stats.done == n, "a stale result was counted"
    records = sink_records(spawn.output)
    per_url = Counter(r["url"] for r in records)
    assert set(per_url) == set(ids.values())
    assert max(per_url.values()) == 1, "a stale result reached the sink"
    assert {r["worker"] for r in records} == {b.worker_id}
    # b fetched each page once; a only what it had started before it was frozen: a task
    # whose lease a can tell has expired (its local deadline passed) is not fetched again.
    assert seen.total() == n + in_flight, seen.hits


# -- 4. a planted proxy password never shows ------------------------------------------------------


@pytest.mark.parametrize("robots", [False, True], ids=["ignore_robots", "with_robots"])
async def test_proxy_password_never_logged(spawn: Spawner, redis_client: aioredis.Redis,
                                           crawl_name: str, robots: bool) -> None:
    secret = "s3cr3tP4ss"
    proxy = f"http://user:{secret}@127.0.0.1:{closed_port()}"
    # The pool quarantines the dead proxy after its first failure, and each task's next
    # attempt waits for the quarantine's end: a short one, so all three die in time.
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0.0, "per_host_concurrency": 0, "retry_cap": 0.2,
        "retry_base": 0.1, "max_retry_after": 0.2, "ignore_robots": not robots,
        "proxy_max_failures": 1, "proxy_quarantine": 0.05}, by="test")
    async with test_site() as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(3)])
        a = await spawn.start(
            "a", "--proxy", proxy, "--log-level", "DEBUG", "--exit-when-empty",
            "--lease", "2s", "--retry-cap", "0.2s", "--max-retry-after", "0.2s",
            "--connect-timeout", "2s", *(() if robots else ("--ignore-robots",)))
        assert await a.wait(40) == 0, a.log_text()[-3000:]
        assert sum(site.hits.values()) == 0, "a request bypassed the proxy"

    log = a.log_text()
    assert secret not in log
    lines = log.splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines), \
        "CRAWLQ_LOG_FORMAT=json must give one JSON object per line"
    assert any(json.loads(line)["level"] == "DEBUG" for line in lines)

    stats = await queue.stats()
    assert stats.dead == len(ids) and stats.active == 0
    dead = await queue.dead_list(limit=100)
    assert {d.id for d in dead} == set(ids)
    expected = "robots_unavailable" if robots else "connect_error"
    assert {d.reason for d in dead} == {expected}
    for d in dead:
        assert d.message and secret not in d.message
        assert d.raw is None or secret.encode() not in d.raw
    assert secret.encode() not in await dump_keys(redis_client, f"*{crawl_name}*")
    for path in spawn.tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


# -- 5. /healthz, /readyz, /metrics -------------------------------------------------------------


async def test_health_ready_metrics_and_readyz_503_while_draining(
        spawn: Spawner, redis_client: aioredis.Redis, crawl_name: str) -> None:
    async with start_site_process() as site:
        fast = [site.url(f"/p/{i}") for i in range(4)]
        slow = [site.url(f"/p/{i}?delay=8000") for i in (100, 101)]
        queue, _ = await enqueue(redis_client, crawl_name, fast + slow)
        a = await spawn.start("a", "--concurrency", "8", "--lease", "10s", "--grace", "4s",
                              "--ignore-robots", "--http-port", "0")
        event = await a.wait_event("http_listening")
        base = f"http://127.0.0.1:{event['port']}"
        assert event["host"] == "127.0.0.1"

        # /healthz answers from the start; /readyz once Redis and the crawl are reached.
        assert (await http_get(base + "/healthz"))[0] == 200

        async def ready() -> bool:
            return (await http_get(base + "/readyz"))[0] == 200

        await until(ready, 5, "/readyz to turn 200")

        async def fast_done_slow_in_flight() -> bool:
            _, text = await http_get(base + "/metrics")
            return ('crawlq_tasks_total{outcome="ok"} 4.0' in text
                    and "crawlq_in_flight 2.0" in text)

        await until(fast_done_slow_in_flight, 20, "4 fast pages done, 2 slow in flight")
        status, metrics = await http_get(base + "/metrics")
        assert status == 200
        for name in ("crawlq_tasks_total", "crawlq_fetch_duration_seconds_bucket",
                     "crawlq_responses_total", "crawlq_in_flight"):
            assert name in metrics
        assert "crawlq_redis_evicting 0.0" in metrics  # the test server: noeviction
        assert "127.0.0.1" not in metrics, "a URL or host leaked into a label"

        a.signal(signal.SIGTERM)

        async def not_ready() -> bool:
            assert a.proc.returncode is None, "exited before /readyz could be seen failing"
            status, _ = await http_get(base + "/readyz")
            return status == 503

        await until(not_ready, 3, "/readyz to turn 503 while draining")
        assert (await http_get(base + "/healthz"))[0] == 200  # alive while draining
        assert await a.wait(10) == 0, a.log_text()[-3000:]

    stats = await queue.stats()
    assert stats.done == 4
    assert (stats.leased, stats.pending) == (0, 2)  # the slow two were released


# -- 6. the worker registry ----------------------------------------------------------------------


async def test_worker_listed_soon_after_start(spawn: Spawner, redis_client: aioredis.Redis,
                                              crawl_name: str) -> None:
    async with start_site_process(delay_ms=3000) as site:
        await enqueue(redis_client, crawl_name, [site.url("/p/1")])
        a = await spawn.start("a", "--lease", "60s", "--ignore-robots")
        await a.wait_event("consumer_started")
        keys = CrawlKeys.build(crawl_name)

        async def listed() -> bool:
            return await redis_client.zscore(keys.workers, a.worker_id) is not None

        await until(listed, 3, "the new worker in the workers registry")
        assert (await redis_client.hget(keys.worker(a.worker_id), "pid")) == str(a.pid).encode()



# -- worker ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("worker_id", ["a b", "tab\there", "é-1", "x" * 129],
                         ids=["space", "tab", "non-ascii", "too-long"])
async def test_a_worker_id_the_lease_record_cant_hold_exits_2_before_leasing(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, worker_id: str,
        how: str) -> None:
    """A worker id with a space (or beyond printable ASCII) would lease tasks it could
    never ack: the consumer refuses it at start, one line saying the rule, exit 2."""
    queue, _ = await enqueue(redis_client, crawl_name, ["http://127.0.0.1:9/x"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    argv = [sys.executable, "-m", "consumer", "--redis-url", redis_url, "--crawl", crawl_name,
            "--http-port", "-1", "--exit-when-empty"]
    if how == "flag":
        argv += ["--worker-id", worker_id]
    else:
        env["CRAWLQ_WORKER_ID"] = worker_id
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), STARTUP_S)
    assert proc.returncode == 2, (out, err)
    [line] = err.decode().splitlines()
    assert f"invalid worker id {worker_id!r}" in line and WORKER_ID_RULE in line
    assert ("--worker-id" if how == "flag" else "CRAWLQ_WORKER_ID") in line
    stats = await queue.stats()
    assert (stats.pending, stats.leased) == (1, 0)


async def test_a_worker_id_with_punctuation_crawls_to_done(
        spawn: Spawner, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Every printable ASCII character but the space is allowed: such an id leases,
    acks, registers and names its result file (made safe) like any other."""
    odd = "pod/w:1{x}@h*?"
    async with start_site_process() as site:
        queue, ids = await enqueue(redis_client, crawl_name,
                                   [site.url(f"/p/{i}") for i in range(3)])
        a = await spawn.start("a", "--exit-when-empty", "--ignore-robots", worker_id=odd)
        assert await a.wait(30) == 0, a.log_text()[-3000:]
    stats = await queue.stats()
    assert (stats.done, stats.active) == (3, 0)
    assert stats.counters.get("stale", 0) == 0
    records = sink_records(spawn.output)
    assert sorted(r["url"] for r in records) == sorted(ids.values())
    assert {r["worker"] for r in records} == {odd}
    assert [p.name for p in spawn.output.iterdir()] == [
        f"{crawl_name}-pod_w_1_x_h-00000.jsonl"]
    # Its start-up read the server's settings: the test server does not evict.
    settings = a.event("redis_settings")
    assert settings is not None and settings["maxmemory_policy"] == "noeviction"
    assert a.event("redis_evicts") is None
    assert a.event("redis_eviction_unknown") is None


# -- a Redis that evicts keys ---------------------------------------------------------------


async def test_a_consumer_refuses_a_redis_that_evicts_keys_unless_allowed(
        evicting_redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """allkeys-lru deletes tasks when Redis is full: exit 2 with an ERROR saying what to
    set, before leasing anything; --allow-evicting-redis runs with a WARNING."""
    client = aioredis.Redis.from_url(evicting_redis_url)
    spawner = Spawner(evicting_redis_url, crawl_name, tmp_path)
    try:
        async with start_site_process() as site:
            queue, _ = await enqueue(client, crawl_name, [site.url(f"/p/{i}") for i in range(3)])
            a = await spawner.start("a", "--exit-when-empty", "--ignore-robots")
            assert await a.wait(30) == 2, a.log_text()[-3000:]
            refused = a.event("redis_evicts")
            assert refused is not None and refused["level"] == "ERROR"
            assert refused["maxmemory_policy"] == "allkeys-lru"
            assert "set maxmemory-policy noeviction" in refused["advice"]
            assert "--allow-evicting-redis" in refused["advice"]
            stats = await queue.stats()
            assert (stats.pending, stats.leased, stats.counters.get("leased", 0)) == (3, 0, 0)

            b = await spawner.start("b", "--ignore-robots", "--allow-evicting-redis",
                                    "--http-port", "0")
            port = (await b.wait_event("http_listening"))["port"]

            async def all_done() -> bool:
                return (await queue.stats()).done == 3

            await until(all_done, 30, "b to crawl the 3 pages")
            warned = b.event("redis_evicts")
            assert warned is not None and warned["level"] == "WARNING"
            status, metrics = await http_get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and "crawlq_redis_evicting 1.0" in metrics
            b.signal(signal.SIGTERM)
            assert await b.wait(30) == 0, b.log_text()[-3000:]
    finally:
        await spawner.close()
        await client.aclose()


# -- 7. Redis that never answers ------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("cluster", ["auto", "no"])
async def test_a_batch_consumer_gives_up_on_a_redis_that_never_answers(
        crawl_name: str, tmp_path: Path, cluster: str) -> None:
    """Pointed at a closed port with --exit-when-empty --redis-wait 2s, a consumer exits
    with the Redis exit code in seconds and says why in one line, the password hidden.
    ``--cluster no`` connects lazily: its first command is what finds Redis silent."""
    url = f"redis://crawler:s3cr3t@127.0.0.1:{closed_port()}/0"
    spawner = Spawner(url, crawl_name, tmp_path)
    try:
        a = await spawner.start("a", "--exit-when-empty", "--redis-wait", "2s",
                                "--cluster", cluster)
        # How long it waited is its log's waited_s: the process's start-up is not timed.
        assert await a.wait(STARTUP_S) == EXIT_REDIS, a.log_text()[-3000:]
    finally:
        await spawner.close()
    [gave_up] = [e for e in a.events() if e.get("event") == "redis_unreachable_giving_up"]
    assert gave_up["level"] == "ERROR" and gave_up["exit_code"] == EXIT_REDIS
    assert gave_up["redis_url"] == url.replace("crawler:s3cr3t", "***")
    assert 2 <= gave_up["waited_s"] < 6
    assert "--redis-wait" in gave_up["advice"] and "s3cr3t" not in a.log_text()
    assert a.event("no_such_crawl") is None  # Redis never said so
