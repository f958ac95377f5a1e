"""The link intake: discovered URLs to tasks, the per-consumer seen cache, and a crawl
that finds its own work without waiting on timers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import NullSink, consume, enqueue
from support.live import snapshot
from support.routes import serve

import consumer.flush
import consumer.leaser
from common.http.fetcher import Fetcher
from common.observability.metrics import Metrics
from common.policy import CrawlPolicy, parse_assignments
from common.queue import LeasingQueue
from common.tasks.task import Task
from common.traps.rules import REFUSALS
from consumer.backoff import Backoff
from consumer.config import build_parser, settings_from_args
from consumer.intake import LinkIntake, SeenCache
from consumer.lifecycle import Consumer
from consumer.live import Live
from producer.run import TaskTemplate, produce
from producer.sources import Chunk
from producer.summary import Summary


def parent(url: str = "http://a.test/", depth: int = 0) -> Task:
    return Task(id="0" * 32, url=url, depth=depth)


def scope(**values: object) -> Live:
    """A live policy snapshot with these values (max_depth 5 unless given)."""
    return Live(snapshot(**{"max_depth": 5, **values}))


def intake(size: int = 100, live: Live | None = None, **values: object) -> LinkIntake:
    return LinkIntake(Metrics(), live or scope(**values), cache_size=size)


def fates(i: LinkIntake) -> dict[str, float]:
    i.publish()
    return {s.labels["fate"]: s.value for m in i.metrics.links_total.collect()
            for s in m.samples if s.name.endswith("_total")}


def test_seen_cache_is_bounded_and_forgets_the_oldest_generation() -> None:
    cache = SeenCache(10)
    cache.add_all(f"u{i}" for i in range(100))
    assert len(cache) <= 10
    assert "u99" in cache
    assert "u0" not in cache


def test_seen_cache_forgets_within_its_age() -> None:
    now = [0.0]
    cache = SeenCache(1000, max_age_s=10, clock=lambda: now[0])
    cache.add_all(["a"])
    now[0] = 11
    cache.add_all(["b"])  # "a" moves to the old generation
    assert "a" in cache
    now[0] = 22
    cache.add_all(["c"])
    assert "a" not in cache
    assert "b" in cache


def test_repeated_links_skip_canonicalization_once_sent() -> None:
    i = intake()
    links = ["http://a.test/x", "HTTP://A.test/y", "http://a.test/x"]
    tasks, mark = i.children([(parent(), links)])
    assert [t.url for t in tasks] == ["http://a.test/x", "http://a.test/y"]
    assert [t.depth for t in tasks] == [1, 1]
    i.sent(mark)
    again, _ = i.children([(parent(), [*links, "http://a.test/y"])])
    assert again == []
    assert fates(i) == {"cached": 5, "sent": 2, "invalid": 0, "out_of_scope": 0,
                        "too_deep": 0, "capped": 0, **dict.fromkeys(REFUSALS, 0),
                        "near_duplicate": 0, "soft_404": 0}


def test_links_not_sent_are_not_cached() -> None:
    i = intake()
    tasks, _ = i.children([(parent(), ["http://a.test/x"])])
    assert len(tasks) == 1
    # sent() never called (the enqueue did not return): the URL goes to Redis again
    tasks, _ = i.children([(parent(), ["http://a.test/x"])])
    assert len(tasks) == 1


def test_the_scope_is_the_parent_host_unless_domains_are_given() -> None:
    i = intake()
    out, mark = i.children([(parent("http://a.test/"), ["http://b.test/p"])])
    assert out == []
    i.sent(mark)
    out, _ = i.children([(parent("http://b.test/"), ["http://b.test/p"])])
    assert [t.url for t in out] == ["http://b.test/p"]  # in scope from b.test's pages

    scoped = intake(allow_domains=("a.test",))
    out, mark = scoped.children([(parent("http://a.test/"),
                                  ["http://b.test/p", "http://sub.a.test:8080/q",
                                   "mailto:x@a.test", "http://a.test/%zz"])])
    assert [t.url for t in out] == ["http://sub.a.test:8080/q", "http://a.test/%25zz"]
    assert fates(scoped)["out_of_scope"] == 1
    assert fates(scoped)["invalid"] == 1


def test_depth_limit() -> None:
    i = intake(max_depth=2)
    out, _ = i.children([(parent(depth=2), ["http://a.test/deeper"])])
    assert out == []
    assert fates(i)["too_deep"] == 1  # dropped, and counted
    out, _ = i.children([(parent(depth=1), ["http://a.test/deeper"])])
    assert [t.depth for t in out] == [2]


def test_no_depth_limit_by_default_and_none_is_no_limit() -> None:
    assert CrawlPolicy().max_depth == -1 and CrawlPolicy().texts()["max_depth"] == "none"
    assert parse_assignments(["max_depth=None"]) == {"max_depth": -1}
    i = intake(max_depth=-1)
    out, _ = i.children([(parent(depth=500), ["http://a.test/deeper"])])
    assert [t.depth for t in out] == [501]
    assert fates(i)["too_deep"] == 0
    i = intake(max_depth=0)  # 0: the seeds only
    assert i.children([(parent(depth=0), ["http://a.test/x"])])[0] == []


def test_a_new_scope_applies_to_the_next_batch() -> None:
    """The crawl policy's max_depth and allow_domains change while a consumer runs."""
    live = scope(max_depth=0)
    i = intake(live=live)
    assert i.children([(parent(), ["http://a.test/x"])])[0] == []
    live.now = snapshot(max_depth=1)
    assert [t.url for t in i.children([(parent(), ["http://a.test/x"])])[0]] == [
        "http://a.test/x"]
    live.now = snapshot(max_depth=1, allow_domains=("b.test",))
    out, _ = i.children([(parent(), ["http://a.test/x", "http://sub.b.test/y"])])
    assert [t.url for t in out] == ["http://sub.b.test/y"]
    live.now = snapshot(max_depth=0, allow_domains=("b.test",))
    assert i.children([(parent(), ["http://b.test/z"])])[0] == []


def test_new_domains_forget_links_out_of_the_old_ones() -> None:
    """A link out of the allowed domains is cached as handled; once the domains take it
    in, it must be sent, not skipped as seen."""
    live = scope(allow_domains=("a.test",))
    i = intake(live=live)
    out, mark = i.children([(parent(), ["http://a.test/in", "http://b.test/out"])])
    assert [t.url for t in out] == ["http://a.test/in"]
    i.sent(mark)
    assert "http://b.test/out" in i.cache
    live.now = snapshot(max_depth=5, allow_domains=("a.test",))  # the same domains
    i.children([])  # taken in by the next batch: the cache stays
    assert "http://b.test/out" in i.cache
    live.now = snapshot(max_depth=5, allow_domains=("a.test", "b.test"))
    out, _ = i.children([(parent(), ["http://a.test/in", "http://b.test/out"])])
    assert [t.url for t in out] == ["http://a.test/in", "http://b.test/out"]


def test_new_tasks_get_the_crawls_attempts_and_follow_its_window() -> None:
    """A link's task gets the crawl policy's max_attempts, not its parent's; a new one
    applies to the next batch. A new recrawl window sets the cache's generation age to a
    quarter of it and forgets what the cache held (sent longer ago than it may allow)."""
    live = scope(max_attempts=4)
    i = intake(live=live)
    seed = Task(id="0" * 32, url="http://a.test/", max_attempts=9)
    out, mark = i.children([(seed, ["http://a.test/x"])])
    assert [t.max_attempts for t in out] == [4]
    i.sent(mark)
    live.now = snapshot(max_depth=5, max_attempts=1)  # the same window
    i.children([])  # taken in by the next batch: the cache stays
    assert "http://a.test/x" in i.cache
    assert [t.max_attempts for t in i.children([(seed, ["http://a.test/y"])])[0]] == [1]
    live.now = snapshot(max_depth=5, max_attempts=1, recrawl_after=3600)
    i.children([])  # taken in by the next batch
    assert "http://a.test/x" not in i.cache and i.cache.max_age_s == 900
    assert [t.url for t in i.children([(seed, ["http://a.test/x"])])[0]] == [
        "http://a.test/x"]


def test_marks_judged_under_old_domains_are_not_cached() -> None:
    """The domains changed while a batch was being enqueued: its out-of-scope marks
    are stale, so none of the batch is remembered."""
    live = scope(allow_domains=("a.test",))
    i = intake(live=live)
    _, mark = i.children([(parent(), ["http://b.test/out"])])
    assert mark == ["http://b.test/out"]
    live.now = snapshot(max_depth=5, allow_domains=("b.test",))
    i.sent(mark)
    assert "http://b.test/out" not in i.cache
    out, _ = i.children([(parent(), ["http://b.test/out"])])
    assert [t.url for t in out] == ["http://b.test/out"]


async def test_a_url_the_cache_evicted_still_dedups_in_redis(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name)
    i = intake(size=2)
    first, mark = i.children([(parent(), ["http://a.test/0"])])
    assert (await queue.enqueue(first)).enqueued == 1
    i.sent(mark)
    for n in range(1, 10):  # push "/0" out of the two-entry cache
        more, mark = i.children([(parent(), [f"http://a.test/{n}"])])
        await queue.enqueue(more)
        i.sent(mark)
    assert "http://a.test/0" not in i.cache
    again, _ = i.children([(parent(), ["http://a.test/0"])])
    assert [t.url for t in again] == ["http://a.test/0"]  # not hidden: Redis decides
    result = await queue.enqueue(again)
    assert (result.enqueued, result.duplicates) == (0, 1)


async def test_a_chain_of_pages_is_crawled_without_waiting_on_timers(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each page links to the next, one host, one request at a time: every fetch waits
    on the previous one's flush (its ack frees the host, its link is the next task). With
    the flush timer and the leaser's idle poll made 5 s long, the 12 pages still come in
    well under the limit only if a finished fetch flushes at once and the leaser wakes
    on it (timer-bound, it takes over a minute)."""
    monkeypatch.setattr(consumer.flush, "FLUSH_INTERVAL_S", 5.0)

    class Slow(Backoff):
        def next_delay(self) -> float:
            self.failures += 1
            return 5.0

    monkeypatch.setattr(consumer.leaser, "Backoff", Slow)
    pages = 12

    async def chain(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        link = f'<a href="/c/{n + 1}">next</a>' if n + 1 < pages else ""
        return web.Response(text=f"<html><body>{link}</body></html>",
                            content_type="text/html")

    async with serve({"/c/{n}": chain}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/c/0")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer.handlers:links", "--max-depth", "100",
                      "--per-host-concurrency", "1", limit_s=20)
    assert len(site.paths) == pages


async def test_an_idle_consumer_leases_at_once_when_work_is_enqueued(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer with nothing to lease backs off; a producer's enqueue wakes it through
    the crawl's wake channel. With the back-off made 30 s long, the page is fetched well
    within the limit only if the wake-up reaches it."""

    class Slow(Backoff):
        def next_delay(self) -> float:
            self.failures += 1
            return 30.0

    monkeypatch.setattr(consumer.leaser, "Backoff", Slow)
    queue = await LeasingQueue.open(redis_client, crawl_name)
    settings = settings_from_args(build_parser().parse_args(
        ["--redis-url", redis_url, "--crawl", crawl_name, "--allow-private",
         "--ignore-robots", "--http-port", "-1", "--per-host-delay", "0"]))
    fetched = asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        fetched.set()
        return web.Response(text="<html></html>", content_type="text/html")

    async with serve({"/p": page}) as site, Fetcher(settings.fetch) as fetcher:
        worker = Consumer(settings, queue, fetcher, NullSink(), Metrics())
        running = asyncio.create_task(worker.run())
        try:
            for _ in range(1000):  # until it found nothing and backs off for 30 s
                if worker.leaser.idle:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # it is subscribed by now
            url = site.url("/p")
            await produce([_one(url)], queue=queue, summary=Summary(crawl=crawl_name),
                          template=TaskTemplate())
            await asyncio.wait_for(fetched.wait(), 10)
        finally:
            worker.request_stop()
            worker.request_stop()
            await asyncio.wait_for(running, 10)


async def _one(url: str) -> AsyncGenerator[Chunk, None]:
    yield Chunk("test", 1, [url])
