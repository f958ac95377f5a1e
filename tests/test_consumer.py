"""The consumer end to end, in-process: real redis-server, real aiohttp sites on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import signal
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import consumer_handlers
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, consumer_args, enqueue, records
from support.frontier import host_record, put_record
from support.routes import Handler, hanging, page, serve

from common.errors import ConfigError
from common.exitcodes import EXIT_REDIS
from common.frontier.hosts import Frontier
from common.keys import CrawlKeys
from common.observability.metrics import Metrics
from common.queue import Lease, LeaseBatch, LeasingQueue, NewTask
from common.redis.server import RedisServer
from common.runtime import tune_gc
from common.tasks.task import Task
from common.urls.canonical import fingerprint
from consumer import lifecycle
from consumer.config import build_parser, settings_from_args
from consumer.held import LeaseBook
from consumer.robots import RobotsCache
from consumer.wiring import run


async def test_crawl_2000_pages_each_success_in_the_sink_once(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(2000)]
        queue = await enqueue(redis_client, crawl_name, urls)
        assert await consume(redis_url, crawl_name, tmp_path) == 0
    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.waiting, stats.dead) == (0, 0, 0, 0)
    assert stats.done == 2000
    got = records(tmp_path)
    assert sorted(r["url"] for r in got) == sorted(urls)
    assert all(r["status"] == 200 and r["outcome"] == "ok" for r in got)


async def test_500_then_200_is_retried_and_done(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    calls = 0

    async def flaky(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=500) if calls == 1 else web.Response(text="fine")

    async with serve({"/flaky": flaky}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/flaky")])
        assert await consume(redis_url, crawl_name, tmp_path) == 0
    stats = await queue.stats()
    assert stats.done == 1 and stats.counters["retried"] == 1 and stats.dead == 0
    [rec] = records(tmp_path)
    assert rec["status"] == 200 and rec["attempt"] == 2


@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_429_retry_after_is_honoured_and_cools_the_host(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        form: str) -> None:
    limited = 0

    async def busy(request: web.Request) -> web.Response:
        nonlocal limited
        limited += 1
        if limited == 1:
            value = "2" if form == "seconds" else formatdate(time.time() + 2, usegmt=True)
            return web.Response(status=429, headers={"Retry-After": value})
        return web.Response(text="ok")

    async with serve({"/busy": busy, "/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/busy")])
        # Politeness on, so the 429 cools the whole host down.
        assert await consume(redis_url, crawl_name, tmp_path, "--per-host-concurrency", "4",
                             "--max-retry-after", "10s") == 0
        first, second = site.hits["/busy"]
    assert second - first >= 1.0  # HTTP-date has one-second resolution
    assert (await queue.stats()).done == 1


async def test_a_309_digit_retry_after_fails_http_5xx_and_blocks_the_host(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    # float(int("9" * 309)) overflows: once, the task died internal_error with no block.
    async def down(request: web.Request) -> web.Response:
        return web.Response(status=503, headers={"Retry-After": "9" * 309})

    async with serve({"/down": down}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/down")], max_attempts=1)
        assert await consume(redis_url, crawl_name, tmp_path, "--max-retry-after", "60s") == 0
        host = site.base.removeprefix("http://")
    [dead] = await queue.dead_list()
    assert (dead.reason, dead.attempts) == ("http_5xx", 1)
    assert (await queue.stats()).dead_reasons == {"http_5xx": 1}
    # Blocked for the whole fleet, for the policy's max_retry_after (the header's cap), as
    # `crawlq hosts --sort blocked_until` shows it.
    page = await Frontier(queue).hosts(sort="blocked_until")
    [row] = page.rows
    assert row.host == host and row.blocked_until_ms is not None
    assert page.now_ms + 50_000 < row.blocked_until_ms <= page.now_ms + 60_000


async def test_hanging_server_times_out_and_dies_after_max_attempts(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="too late")

    async with serve({"/hang": hang}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/hang")], max_attempts=2)
        started = time.monotonic()
        assert await consume(redis_url, crawl_name, tmp_path, "--timeout", "0.5s") == 0
        assert time.monotonic() - started < 10
        assert len(site.hits["/hang"]) == 2
    [dead] = await queue.dead_list()
    assert dead.reason == "timeout" and dead.attempts == 2


@pytest.mark.parametrize("how", ["expired", "reclaimed"])
async def test_lost_lease_cancels_its_fetch_and_frees_the_worker(
        how: str, redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    hung = asyncio.Event()
    async with serve({"/hang": hanging(hung, "answered", once=True), "/p/{i}": page}) as site:
        url = site.url("/hang")
        queue = await enqueue(redis_client, crawl_name, [url])
        consumer = asyncio.create_task(consume(
            redis_url, crawl_name, tmp_path, "--concurrency", "1", "--lease", "3s",
            "--timeout", "30s"))
        await asyncio.wait_for(hung.wait(), 10)
        started = time.monotonic()
        await enqueue(redis_client, crawl_name, [site.url(f"/p/{i}") for i in range(3)])
        # The lease runs out in Redis (as after a long pause). Either the next heartbeat
        # finds it lost, or (reclaimed first) the consumer leases the task again: both must
        # cancel the old fetch and free the consumer's only worker.
        tid = fingerprint(url).hex()
        await redis_client.zadd(queue.partitions[0].leases, {tid: 1})
        if how == "reclaimed":  # by this call or by the consumer's reaper, once
            await queue.reclaim()
            assert (await queue.stats()).counters.get("reclaimed") == 1
        assert await asyncio.wait_for(consumer, 20) == 0
        assert time.monotonic() - started < 10, "the worker stayed on the lost fetch"
    assert len(site.hits["/hang"]) == 2  # reclaimed, then leased and fetched again
    assert sorted(r["url"] for r in records(tmp_path)) == sorted(
        [url, *(site.url(f"/p/{i}") for i in range(3))])
    assert (await queue.stats()).done == 4


async def test_bad_redirects_end_dead_with_their_reason(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    def redirect(to: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            raise web.HTTPFound(to)
        return handler

    routes: dict[str, Handler] = {
        "/meta": redirect("http://169.254.169.254/latest/meta-data"),
        "/file": redirect("file:///etc/passwd"),
        "/ten": redirect("http://10.0.0.1/"),
    }
    async with serve(routes) as site:
        urls = [site.url(p) for p in ("/meta", "/file", "/ten")]
        queue = await enqueue(redis_client, crawl_name, urls)
        # The guard stays on: only the test site's own address is let through.
        args = [a for a in consumer_args(redis_url, crawl_name, tmp_path)
                if a != "--allow-private"]
        settings = settings_from_args(build_parser().parse_args(
            [*args, "--allow-network", "127.0.0.1/32"]))
        assert await asyncio.wait_for(run(settings), 30) == 0
    reasons = {d.url: d.reason for d in await queue.dead_list()}
    assert reasons == {urls[0]: "ssrf_blocked", urls[1]: "bad_redirect",
                       urls[2]: "ssrf_blocked"}


async def test_redirect_loop_ends_dead(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async def loop_a(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop-b")

    async def loop_b(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop-a")

    async with serve({"/loop-a": loop_a, "/loop-b": loop_b}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/loop-a")])
        assert await consume(redis_url, crawl_name, tmp_path) == 0
    [dead] = await queue.dead_list()
    assert dead.reason == "redirect_loop" and dead.attempts == 1


async def test_robots_disallow_is_honoured(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page, "/private/{i}": page},
                     robots="User-agent: *\nDisallow: /private/\n") as site:
        urls = [site.url("/p/1"), site.url("/private/1"), site.url("/private/2")]
        queue = await enqueue(redis_client, crawl_name, urls)
        args = [a for a in consumer_args(redis_url, crawl_name, tmp_path)
                if a != "--ignore-robots"]
        settings = settings_from_args(build_parser().parse_args(args))
        assert await asyncio.wait_for(run(settings), 30) == 0
        assert "/private/1" not in site.hits and "/private/2" not in site.hits
        assert len(site.hits["/robots.txt"]) == 1
    stats = await queue.stats()
    assert stats.counters["outcome:robots_disallowed"] == 2
    assert stats.counters["outcome:ok"] == 1
    outcomes = {r["url"]: r["outcome"] for r in records(tmp_path)}
    assert outcomes[urls[1]] == "robots_disallowed"


async def test_a_page_budget_lets_exactly_that_many_pages_reach_the_host(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    # robots.txt on (a 404 here: allow all): its fetch takes a lease's turn and releases
    # it, which must not spend a page; four fetch slots and no host limit, so leases race.
    async with serve({"/p/{i}": page}) as site:
        host = site.base.removeprefix("http://")
        urls = [site.url(f"/p/{i}") for i in range(10)]
        queue = await enqueue(redis_client, crawl_name, urls)
        front = Frontier(queue)
        await front.set_host(host, budget=3)
        args = [a for a in consumer_args(redis_url, crawl_name, tmp_path, "--concurrency", "4")
                if a != "--ignore-robots"]
        settings = settings_from_args(build_parser().parse_args(args))
        assert await asyncio.wait_for(run(settings), 30) == 0  # parked tasks: empty
        pages = sorted(p for p in site.hits if p.startswith("/p/"))
        assert len(site.hits["/robots.txt"]) == 1
        assert sum(len(site.hits[p]) for p in pages) == 3
        stats = await queue.stats()
        assert (stats.done, stats.pending, stats.parked) == (3, 7, 7)
        row = await front.host(host)
        assert row is not None and (row.used, row.reserved, row.queued) == (3, 0, 7)

        # Raising the budget brings the parked URLs back: each fetched once.
        await front.set_host(host, budget=10)
        assert await asyncio.wait_for(run(settings), 30) == 0
        assert sorted(r["url"] for r in records(tmp_path)) == sorted(urls)
        assert all(len(site.hits[f"/p/{i}"]) == 1 for i in range(10))
    stats = await queue.stats()
    assert (stats.done, stats.pending, stats.parked) == (10, 0, 0)


async def test_sigterm_releases_leases_parked_for_robots_txt(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    robots_asked = asyncio.Event()
    n = 8
    async with serve({"/p/{i}": page,
                      "/robots.txt": hanging(robots_asked, "User-agent: *\nAllow: /\n")}
                     ) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url(f"/p/{i}") for i in range(n)])
        args = consumer_args(redis_url, crawl_name, tmp_path, "--concurrency", "4",
                             "--lease", "60s", "--grace", "1s")
        args = [a for a in args if a not in ("--exit-when-empty", "--ignore-robots")]
        consumer = asyncio.create_task(run(settings_from_args(build_parser().parse_args(args))))
        deadline = time.monotonic() + 10
        while not robots_asked.is_set():
            assert time.monotonic() < deadline and not consumer.done()
            await asyncio.sleep(0.02)
        stopped = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(consumer, 10) == 0
        assert time.monotonic() - stopped < 3, "parked leases held the drain up"
    stats = await queue.stats()
    assert stats.leased == 0  # every lease released (or finished), none left to expire
    assert stats.pending + stats.waiting + stats.done == n
    assert stats.counters.get("released", 0) >= 1


@pytest.mark.integration
async def test_a_consumer_stopping_while_redis_is_gone_gives_up_its_last_flush(
        crawl_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer told to stop while its Redis is unreachable retries its last flush for
    FLUSH_GIVE_UP_S (1 s here), then stops with EXIT_REDIS, saying so, instead of
    retrying for ever: its results are in the sink, its leases expire in Redis."""
    monkeypatch.setattr(lifecycle, "FLUSH_GIVE_UP_S", 1.0)
    n = 40

    async def slow_page(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # fetches under way as Redis goes: results to flush
        return await page(request)
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url)
        async with serve({"/p/{i}": slow_page}) as site:
            await enqueue(client, crawl_name, [site.url(f"/p/{i}") for i in range(n)])
            args = [a for a in consumer_args(server.url, crawl_name, tmp_path, "--concurrency",
                                             "2", "--lease", "60s", "--grace", "1s")
                    if a != "--exit-when-empty"]
            consumer = asyncio.create_task(run(settings_from_args(build_parser().parse_args(args))))
            deadline = time.monotonic() + 10
            while sum(len(v) for v in site.hits.values()) < 3:
                assert time.monotonic() < deadline and not consumer.done()
                await asyncio.sleep(0.02)
            server.kill()
            await asyncio.sleep(0.8)  # the fetches under way end: their flush meets it
            os.kill(os.getpid(), signal.SIGTERM)
            assert await asyncio.wait_for(consumer, 15) == EXIT_REDIS  # 30 s: FLUSH_GIVE_UP_S
        await client.aclose()
    written = {r["url"] for r in records(tmp_path)}
    assert written and written <= {site.url(f"/p/{i}") for i in range(n)}


async def test_robots_lookup_refused_by_the_ssrf_guard_ends_the_task_dead(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page}, robots="User-agent: *\nAllow: /\n") as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1")])
        # Guard on and robots.txt honoured: the robots.txt lookup itself is refused
        # (127.0.0.1), which is not cached, so the lease must end, not wait again.
        args = [a for a in consumer_args(redis_url, crawl_name, tmp_path)
                if a not in ("--ignore-robots", "--allow-private")]
        settings = settings_from_args(build_parser().parse_args(args))
        assert await asyncio.wait_for(run(settings), 30) == 0
        assert not site.hits
    [dead] = await queue.dead_list()
    assert dead.reason == "ssrf_blocked"


async def test_a_crash_in_the_robots_lookup_fails_the_task_not_the_consumer(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: RobotsCache, url: str, **_: object) -> None:
        raise RuntimeError("robots parser bug")

    monkeypatch.setattr(RobotsCache, "lookup", broken)
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1")], max_attempts=1)
        args = [a for a in consumer_args(redis_url, crawl_name, tmp_path)
                if a != "--ignore-robots"]
        settings = settings_from_args(build_parser().parse_args(args))
        assert await asyncio.wait_for(run(settings), 30) == 0
    [dead] = await queue.dead_list()
    assert dead.reason == "internal_error" and "robots parser bug" in dead.message


#: Pages fetched 0.2 s apart by two consumers.
SPACED_PAGES = 12


async def test_per_host_delay_holds_across_two_consumers(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page}) as site:
        queue = await LeasingQueue.open(redis_client, crawl_name)
        # Each consumer holds at most two tasks, the host's limit: one that started first
        # could hold both slots for the whole crawl, so the pages come once both consumers
        # are up (registered, waiting for work; a grace long enough for that).
        polite = ("--per-host-delay", "0.2s", "--per-host-concurrency", "2",
                  "--concurrency", "1", "--lease-batch", "1", "--empty-grace", "5")
        runs = [asyncio.create_task(consume(redis_url, crawl_name, tmp_path / w, *polite,
                                            "--worker-id", w)) for w in ("a", "b")]
        workers = CrawlKeys.build(crawl_name).workers
        deadline = time.monotonic() + 30
        while await redis_client.zcard(workers) < 2:
            assert time.monotonic() < deadline, "the consumers did not start"
            await asyncio.sleep(0.05)
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in
                             (site.url(f"/p/{i}") for i in range(SPACED_PAGES))])
        results = await asyncio.gather(*runs)
        assert results == [0, 0]
        starts = sorted(t for path, ts in site.hits.items() if path.startswith("/p/")
                        for t in ts)
    assert len(starts) == SPACED_PAGES
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Grants are 0.2 s apart on Redis's clock; the server, on the consumers' event loop,
    # sees them with that loop's lag as jitter (0.128 s seen once with the suite on three
    # workers on two cores), so single gaps get slack and the whole span none.
    assert min(gaps) >= 0.1, gaps
    assert starts[-1] - starts[0] >= (SPACED_PAGES - 1) * 0.2 * 0.97
    assert (await queue.stats()).done == SPACED_PAGES
    # Both consumers took part, and deferrals were not counted as attempts.
    got = records(tmp_path / "a") + records(tmp_path / "b")
    assert {r["worker"] for r in got} == {"a", "b"}
    assert all(r["attempt"] == 1 for r in got)


async def test_links_handler_crawls_to_the_depth_limit(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async def tree(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if node.strip("ab") != "r":  # a real site, not a catch-all: a soft-404 probe 404s
            raise web.HTTPNotFound()
        links = "".join(f'<a href="/t/{node}{c}">{c}</a>' for c in "ab")
        links += '<a href="http://elsewhere.example/x">off-site</a><a href="mailto:x@y">m</a>'
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")

    async with serve({"/t/{node}": tree}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/t/r")])
        assert await consume(redis_url, crawl_name, tmp_path, "--handler",
                             "consumer.handlers:links", "--max-depth", "2") == 0
        fetched = set(site.hits)
    # depth 0: r; 1: ra, rb; 2: raa, rab, rba, rbb — and nothing off-site or deeper.
    assert fetched == {f"/t/{n}" for n in ("r", "ra", "rb", "raa", "rab", "rba", "rbb")}
    stats = await queue.stats()
    probes = stats.counters.get("outcome:probe", 0)  # the crawl's soft-404 probes
    assert stats.done - probes == 7 and stats.counters["enqueued"] - probes == 7
    depths = {r["url"].rsplit("/", 1)[1]: r["depth"] for r in records(tmp_path)}
    assert depths["raa"] == 2 and depths["r"] == 0


async def test_allow_domains_keeps_links_to_an_international_domain_in_either_spelling(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """--allow-domains bücher.example (Unicode): a handler's links to bücher.example, to
    its punycode spelling and to a subdomain are enqueued; other.example and
    evilxn--bcher-kva.example are not."""
    kept = ["xn--bcher-kva.example", "sub.xn--bcher-kva.example"]
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/seed")])
        # The children's hosts don't exist: blocked, the consumer leaves them queued.
        front = Frontier(queue)
        for host in [*kept, "other.example", "evilxn--bcher-kva.example"]:
            await front.block_host(host, 600)
        consumer = asyncio.create_task(consume(
            redis_url, crawl_name, tmp_path, "--handler", "consumer_handlers:idn_links",
            "--allow-domains", "bücher.example", "--max-depth", "1"))
        deadline = time.monotonic() + 20
        while (await queue.stats()).done < 1:  # children are enqueued before the ack
            assert not consumer.done() and time.monotonic() < deadline, \
                await queue.dead_list()
            await asyncio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # it would wait for the blocked hosts
        assert await asyncio.wait_for(consumer, 10) == 0
    stats = await queue.stats()
    assert stats.counters["enqueued"] == 1 + 3, stats.counters
    assert stats.pending == 3
    page_ = await front.hosts(sort="queued")
    assert {r.host: r.queued for r in page_.rows if r.queued} == {kept[0]: 2, kept[1]: 1}
    for host in kept:
        await front.block_host(host, 0)
    leased = await queue.lease("t", 10, 60_000)
    assert sorted((x.task.url, x.task.depth) for x in leased) == [
        ("http://sub.xn--bcher-kva.example/", 1),
        ("http://xn--bcher-kva.example/a", 1),
        ("http://xn--bcher-kva.example/b", 1)]


async def test_checkpointed_task_resumes_after_its_consumer_dies(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    consumer_handlers.SEEN.clear()
    consumer_handlers.HANG_AFTER_PAGE_2.set()
    consumer_handlers.HUNG_AFTER_PAGE_2.clear()
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1")])
        handler = ("--handler", "consumer_handlers:paginate", "--lease", "1s")
        first = asyncio.create_task(consume(redis_url, crawl_name, tmp_path / "a", *handler))
        await asyncio.wait_for(consumer_handlers.HUNG_AFTER_PAGE_2.wait(), 10)
        # A crash: the task is abandoned without release, its lease left to expire. The
        # next consumer waits for it (a leased task is not "empty") and reclaims it.
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        consumer_handlers.HANG_AFTER_PAGE_2.clear()
        assert await consume(redis_url, crawl_name, tmp_path / "b", *handler) == 0
    assert [cp for _, cp in consumer_handlers.SEEN] == [None, {"page": 2}]
    [rec] = records(tmp_path / "b")
    assert rec["items"] == [{"page": 3}, {"page": 4}]
    assert (await queue.stats()).done == 1


async def test_a_cancel_that_a_library_call_dropped_still_stops_the_consumer(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's asyncio.wait_for, which redis-py's socket writes use, drops a cancel
    that lands as the write completes. The task still counts it: the consumer stops."""
    inside, original = asyncio.Event(), LeasingQueue.lease_turns

    async def dropping(self: LeasingQueue, *args: Any, **kwargs: Any) -> LeaseBatch:
        if inside.is_set():
            return await original(self, *args, **kwargs)
        inside.set()
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for does
            await asyncio.sleep(3600)
        return LeaseBatch(leases=[])

    monkeypatch.setattr(LeasingQueue, "lease_turns", dropping)
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1")])
        task = asyncio.create_task(run(settings_from_args(build_parser().parse_args(
            consumer_args(redis_url, crawl_name, tmp_path)))))
        await asyncio.wait_for(inside.wait(), 10)
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        assert task.cancelled()
        assert site.paths == [] and (await queue.stats()).pending == 1


async def test_handler_error_fails_the_task_not_the_consumer(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1"), site.url("/p/2")],
                              max_attempts=1)
        assert await consume(redis_url, crawl_name, tmp_path, "--handler",
                             "consumer_handlers:broken") == 0
    dead = await queue.dead_list()
    assert {d.reason for d in dead} == {"handler_error"} and len(dead) == 2
    assert "handler bug" in dead[0].message


async def test_malformed_task_is_dead_lettered_and_the_crawl_goes_on(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/p/{i}": page}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/1")])
        pk = queue.partitions[0]
        host = site.base.split("//", 1)[1]
        bad = b"ab" * 16 + b"http://x.test/ \xff{not json"
        await redis_client.rpush(pk.host_queue(host), bad)
        await redis_client.incr(pk.pending)
        queued = (await host_record(redis_client, pk, host)).queued + 1
        await put_record(redis_client, pk, host, queued=queued)
        await redis_client.zadd(pk.queued, {host: queued})
        assert await consume(redis_url, crawl_name, tmp_path) == 0
    [dead] = await queue.dead_list()
    assert dead.reason == "malformed" and dead.raw == bad
    s = await queue.stats()
    assert (s.done, s.pending, s.counters.get("repaired_hosts", 0)) == (1, 0, 0)


async def test_reserved_characters_reach_the_server_as_quoted(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with serve({"/q/{rest}": page}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/q/a%3Bb")])
        assert await consume(redis_url, crawl_name, tmp_path) == 0
        assert site.paths == ["/q/a%3Bb"]


def test_gc_threshold_flag_env_and_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLQ_GC_THRESHOLD", "12345")
    assert settings_from_args(build_parser().parse_args([])).gc_threshold == 12345
    assert settings_from_args(build_parser().parse_args(["--gc-threshold", "0"])
                              ).gc_threshold == 0
    with pytest.raises(ConfigError, match="gc-threshold"):
        settings_from_args(build_parser().parse_args(["--gc-threshold", "-1"]))
    before = gc.get_threshold()
    try:
        tune_gc(0)  # Python's defaults, untouched
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
        tune_gc(12345)
        assert gc.get_threshold() == (12345, *before[1:])
        assert gc.get_freeze_count() > 1000  # the modules loaded so far
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_lease_book_counts_the_host_slots_its_leases_take() -> None:
    """What lease.lua's fair share is told a worker holds of a host: every held lease
    until its response is in (its slot went back) or it ends, once each."""
    book = LeaseBook(30.0, Metrics())
    a1, a2, b1 = (Lease(Task(id=f"{i:032x}", url=f"http://{h}/"), 0, "1", 0, h)
                  for i, h in enumerate(("a.test", "a.test", "b.test")))
    for lease in (a1, a2, b1):
        book.hold(lease, time.monotonic())
    assert (book.slots("a.test"), book.slots("b.test")) == (2, 1)
    book.response_in(a1)
    book.response_in(a1)  # named twice: one slot
    assert book.slots("a.test") == 1
    book.drop(a1)  # its slot went back already
    assert book.slots("a.test") == 1
    book.drop(a2)
    book.drop(b1)
    book.response_in(b1)  # not held any more: nothing to give back
    assert (book.slots("a.test"), book.slots("b.test")) == (0, 0)
    again = Lease(Task(id=a2.id, url=a2.task.url), 0, "2", 0, "a.test")
    book.hold(again, time.monotonic())
    book.hold(Lease(Task(id=a2.id, url=a2.task.url), 0, "3", 0, "a.test"), time.monotonic())
    assert book.slots("a.test") == 1  # a lease replaced by a newer one of its task
