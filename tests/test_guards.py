"""Guards for rules the suite did not hold (issue 25, "Guards with holes").

Each rule here was broken on purpose and every other test stayed green. Each test below
fails when its rule is broken (its mutant is in ``tests/mutants/``, 18 on, named in the
drill's table, ``tests/mutation_drill.py``) and reads as the rule it guards:

- a host with a delay gives one task per lease call, whatever its concurrency;
- a host's slot comes back when the response is in, before the task's ack;
- a handler's links past ``--max-links`` are dropped and counted ``capped``;
- a timeout or a refused connection spends no page of a host's budget;
- a lease reply naming a newer policy version makes the consumer read it again, with no
  pub/sub message and no heartbeat;
- fsck does not count a lease whose response is in as in flight;
- a host's own concurrency overrides the crawl's, higher or lower;
- a fetch slot survives a drop after a library swallowed an earlier cancel.

Real redis-server, real aiohttp sites on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import NullSink, consume
from support.frontier import host_record, polite_queue, put_record, tasks
from support.ports import closed_port
from support.routes import page, serve

import common.policy.store as policy_store
from common.frontier.hosts import Frontier
from common.http.fetcher import Fetcher
from common.http.results import FetchResult
from common.observability.metrics import Metrics
from common.policy import create_policy, set_policy
from common.queue import Lease, LeasingQueue
from console.fsck import check, fsck
from consumer.config import ConsumerSettings, build_parser, settings_from_args
from consumer.handlers import HandlerContext, HandlerResult
from consumer.lifecycle import Consumer
from consumer.live import Live, LivePolicy
from consumer.sinks import Record


def settings_for(redis_url: str, crawl: str, *extra: str) -> ConsumerSettings:
    """An in-process consumer's settings: the crawl's policy (as the test set it) decides
    politeness; no flag of the consumer's does."""
    return settings_from_args(build_parser().parse_args(
        ["--redis-url", redis_url, "--crawl", crawl, "--allow-private", "--ignore-robots",
         "--http-port", "-1", "--exit-when-empty", "--empty-grace", "0", *extra]))


async def until(what: str, done: Callable[[], bool], within: float) -> None:
    """Wait until `done()` is true, at most `within` seconds (then fail, saying `what`)."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"{what} (waited {within:g}s)"
        await asyncio.sleep(0.01)


# -- the frontier ------------------------------------------------------------------------


async def test_a_host_with_a_delay_gives_one_task_a_call_whatever_its_concurrency(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A host's delay spaces its requests: a lease call takes one task of it, even when
    its concurrency (the crawl's, or its own) would allow four. Its next turn is a delay
    away (a long one here, so no clock is raced)."""
    q = await polite_queue(redis_client, crawl_name, delay_s=30, concurrency=4)
    await Frontier(q).set_host("own.test", delay_s=30, concurrency=4)
    await q.enqueue(tasks([f"http://{h}.test/{i}" for h in ("crawl", "own") for i in range(6)]))
    first = await q.lease_turns("w", 10, 60_000)
    assert sorted(x.host for x in first.leases) == ["crawl.test", "own.test"]
    assert {(x.delay_ms, x.concurrency) for x in first.leases} == {(30_000, 4)}
    pk = q.partitions[0]
    for x in first.leases:
        assert await redis_client.zscore(pk.due, x.host) == x.granted_ms + 30_000
    assert await q.lease("w", 10, 60_000) == []
    assert (await q.stats()).pending == 10


async def test_a_hosts_own_concurrency_overrides_the_crawls_higher_and_lower(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The crawl allows 2 requests in flight per host; up.test allows 5 and down.test 1
    of its own. One lease call takes exactly that many of each; cleared, a host is back
    at the crawl's 2."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=2)
    front = Frontier(q)
    await front.set_host("up.test", concurrency=5)
    await front.set_host("down.test", concurrency=1)
    await q.enqueue(tasks([f"http://{h}.test/{i}" for h in ("up", "down", "plain")
                           for i in range(8)]))
    leased = await q.lease("w", 100, 60_000)
    per_host = {h: [x.concurrency for x in leased if x.host == h]
                for h in ("up.test", "down.test", "plain.test")}
    assert per_host == {"up.test": [5] * 5, "down.test": [1], "plain.test": [2] * 2}
    assert await q.lease("w", 100, 60_000) == []  # every host is full
    await front.set_host("up.test", clear=("concurrency",))
    await front.set_host("down.test", clear=("concurrency",))
    await q.ack("w", [(x, "ok") for x in leased])
    again = await q.lease("w", 100, 60_000)
    assert sorted(x.host for x in again) == ["down.test"] * 2 + ["plain.test"] * 2 + [
        "up.test"] * 2


# -- the consumer ------------------------------------------------------------------------


class GatedSink(NullSink):
    """A sink whose writes wait until the test opens the gate: a task's ack waits too."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.records: list[Record] = []

    async def write(self, records: list[Record]) -> None:
        await self.gate.wait()
        self.records.extend(records)


async def test_a_hosts_slot_comes_back_when_the_response_is_in_not_at_the_ack(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    """Concurrency 1, no delay: the host's next request starts while the previous task is
    still leased, its result waiting for the sink (which holds every write until the
    next request has come). Slots that came back only at the ack would wait forever."""
    second_asked = asyncio.Event()

    async def second(request: web.Request) -> web.Response:
        second_asked.set()
        return web.Response(text="two")

    async with serve({"/1": page, "/2": second}) as site:
        q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=1)
        await q.enqueue(tasks([site.url("/1"), site.url("/2")]))
        settings = settings_for(redis_url, crawl_name, "--lease", "60s")
        sink = GatedSink()
        async with Fetcher(settings.fetch) as fetcher:
            consumer = Consumer(settings, q, fetcher, sink, Metrics())
            running = asyncio.create_task(consumer.run())
            try:
                await until("the host's next request waited for the previous task's ack",
                            second_asked.is_set, 5)
                assert site.hits["/1"] and not sink.records
                assert (await q.stats()).done == 0  # /1 is not acked: its write waits
            finally:
                sink.gate.set()
                code = await asyncio.wait_for(running, 20)
    assert code == 0
    assert sorted(r.url for r in sink.records) == [site.url("/1"), site.url("/2")]
    assert (await q.stats()).done == 2


async def many_links(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """The seed links to ten leaves, whatever ctx.max_links says; a leaf to nothing."""
    if ctx.task.depth:
        return HandlerResult()
    return HandlerResult(urls=[urljoin(ctx.task.url, f"/leaf/{i}") for i in range(10)])


def link_fates(metrics: Metrics) -> dict[str, float]:
    return {s.labels["fate"]: s.value for m in metrics.links_total.collect()
            for s in m.samples if s.name.endswith("_total")}


async def test_links_past_max_links_are_dropped_and_counted_capped(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    """A handler returns ten links with --max-links 3: the first three are enqueued (and
    crawled), the other seven counted ``capped``, never enqueued."""
    async with serve({"/seed": page, "/leaf/{i}": page}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name)
        await create_policy(redis_client, crawl_name, {"per_host_delay": 0,
                                                       "per_host_concurrency": 0}, by="test")
        await q.enqueue(tasks([site.url("/seed")]))
        settings = settings_for(redis_url, crawl_name, "--max-links", "3")
        metrics = Metrics()
        async with Fetcher(settings.fetch) as fetcher:
            consumer = Consumer(settings, q, fetcher, NullSink(), metrics, handler=many_links)
            assert await asyncio.wait_for(consumer.run(), 30) == 0
        leaves = sorted(p for p in site.hits if p.startswith("/leaf/"))
    assert leaves == ["/leaf/0", "/leaf/1", "/leaf/2"]
    stats = await q.stats()
    probes = stats.counters.get("outcome:probe", 0)  # the crawl's soft-404 probes
    assert (stats.counters["enqueued"] - probes, stats.done - probes, stats.pending) \
        == (1 + 3, 4, 0)
    fates = link_fates(metrics)
    assert (fates["capped"], fates["sent"]) == (7, 3), fates


async def test_a_timeout_or_a_refused_connection_spends_no_page_of_the_budget(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """A page counts when the host answered. The site's budget is one page: its first
    task times out (no answer, no page), so its second is fetched and is the one page. A
    host whose port refuses connections keeps its one page unspent."""
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="too late")

    async with serve({"/hang": hang, "/p/{i}": page}) as site:
        host = site.base.removeprefix("http://")
        refused = f"127.0.0.1:{closed_port()}"
        q = await LeasingQueue.open(redis_client, crawl_name)
        front = Frontier(q)
        await front.set_host(host, budget=1)
        await front.set_host(refused, budget=1)
        await q.enqueue(tasks([site.url("/hang"), f"http://{refused}/x"], max_attempts=1))
        await q.enqueue(tasks([site.url("/p/1")]))  # after /hang in its host's queue
        assert await consume(redis_url, crawl_name, tmp_path, "--timeout", "2s",
                             "--concurrency", "4") == 0
        assert len(site.hits["/hang"]) == 1 and len(site.hits["/p/1"]) == 1
    assert {d.url: d.reason for d in await q.dead_list()} == {
        site.url("/hang"): "timeout", f"http://{refused}/x": "connect_error"}
    stats = await q.stats()
    assert (stats.done, stats.pending, stats.parked) == (1, 0, 0)
    pk = q.partitions[0]
    records = [await host_record(redis_client, pk, h) for h in (host, refused)]
    assert [(r.budget, r.used, r.reserved) for r in records] == [(1, 1, 0), (1, 0, 0)]


async def test_a_lease_reply_naming_a_newer_policy_is_followed_with_no_message(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy's change message is lost (never published) and the heartbeat, which
    reads the policy too, is 100 s away (--lease 300s): only the lease replies, which
    name the version their partition holds, tell the consumer. Its requests carry the
    new user agent within about a second (3 s allowed on a loaded machine)."""
    async def lost(client: object, crawl: str) -> None:
        pass

    monkeypatch.setattr(policy_store, "announce", lost)
    agents: list[tuple[float, str]] = []

    async def record(request: web.Request) -> web.Response:
        agents.append((time.monotonic(), request.headers.get("User-Agent", "")))
        return web.Response(text="<html></html>", content_type="text/html")

    async with serve({"/p/{i}": record}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name)
        await create_policy(redis_client, crawl_name, {
            "per_host_delay": 0.1, "per_host_concurrency": 1, "user_agent": "guardbot/1.0"},
            by="test")
        await q.enqueue(tasks([site.url(f"/p/{i}") for i in range(300)]))
        settings = settings_for(redis_url, crawl_name, "--lease", "300s")
        live = Live(LivePolicy.of_flags(settings))
        async with Fetcher(settings.fetch, user_agent=live.user_agent) as fetcher:
            consumer = Consumer(settings, q, fetcher, NullSink(), Metrics(), live=live)
            running = asyncio.create_task(consumer.run())
            try:
                await until("the crawl never started", lambda: len(agents) >= 2, 15)
                assert {a for _, a in agents} == {"guardbot/1.0"}
                stored = await set_policy(redis_client, crawl_name,
                                          {"user_agent": "guardbot/2.0"}, by="test")
                changed = time.monotonic()
                await until("no request carried the new user agent",
                            lambda: any(a == "guardbot/2.0" for _, a in agents), 3.0)
                assert consumer.policy.now.version == stored.version
                assert not running.done()
            finally:
                consumer.request_stop()
                consumer.request_stop()
                await asyncio.wait_for(running, 20)
    first_new = min(t for t, a in agents if a == "guardbot/2.0")
    assert first_new - changed < 3.0
    assert all(a == "guardbot/2.0" for t, a in agents if t > first_new)


# -- fsck --------------------------------------------------------------------------------


async def test_fsck_does_not_count_a_lease_whose_response_is_in_as_in_flight(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Two leases of a host with concurrency 2; one's response is in (named in a lease
    call: its lease record's owner marked fetched, its slot back, the host due again).
    That crawl is clean. With its record's inflight lost, fsck finds it counts 0 of the 1
    lease in flight and the repair recounts 1."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=2)
    pk = q.partitions[0]
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(4)]))
    fetched, other = await q.lease("w", 10, 60_000)
    assert await redis_client.zscore(pk.due, "a.test") is None  # full
    assert (await q.lease_turns("w", 0, 60_000, responses_in=[fetched])).leases == []
    record = await redis_client.hget(pk.leased, fetched.id)
    assert isinstance(record, bytes) and record.startswith(b"f")
    assert (await host_record(redis_client, pk, "a.test")).inflight == 1
    assert await redis_client.zscore(pk.due, "a.test") is not None  # a free slot

    report = await check(q)
    assert [p.message for p in report.problems] == []
    assert (report.checked["leased"], report.checked["pending"]) == (2, 2)

    await put_record(redis_client, pk, "a.test", inflight=0)
    report = await fsck(q, fix=True)
    assert [(p.kind, p.message) for p in report.problems] == [
        ("inflight", "partition 0 host a.test: its record counts 0 in flight, it holds 1 "
                     "leases whose response is not in")]
    assert report.remaining == [] and report.clean
    assert (await host_record(redis_client, pk, "a.test")).inflight == 1
    # The repaired count is right: one more lease fills the host, none after.
    [third] = await q.lease("w", 10, 60_000)
    assert await q.lease("w", 10, 60_000) == []
    await q.ack("w", [(x, "ok") for x in (fetched, other, third)])
    assert (await check(q)).problems == []


# -- the fetch slots -----------------------------------------------------------------------

async def test_a_fetch_slot_survives_a_drop_after_a_library_swallowed_a_cancel(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    """One fetch slot. Its first lease is dropped (lost at a heartbeat) while a library
    call in its fetch swallows the cancel (as Python 3.11's wait_for can, inside redis-py
    or aiohttp); then its second lease is dropped as usual. The slot must go on to the
    third: a slot that took the leftover cancel count for a stop would die, and the
    consumer would hold leases that nothing fetches (seen once under CLIENT KILL)."""
    asked: dict[str, asyncio.Event] = {p: asyncio.Event() for p in ("/a", "/b", "/c")}

    async def hang(request: web.Request) -> web.Response:
        asked[request.path].set()
        await asyncio.sleep(30)
        return web.Response(text="late")

    async def ok(request: web.Request) -> web.Response:
        asked[request.path].set()
        return web.Response(text="ok")

    async with serve({"/a": ok, "/b": hang, "/c": ok}) as site:
        q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=0)
        await q.enqueue(tasks([site.url("/a"), site.url("/b"), site.url("/c")]))
        settings = settings_for(redis_url, crawl_name, "--lease", "60s", "--concurrency", "1")
        async with Fetcher(settings.fetch) as fetcher:
            real_fetch = fetcher.fetch
            swallowed = asyncio.Event()

            async def swallowing(url: str, **kwargs: Any) -> FetchResult:
                if url.endswith("/a"):
                    try:  # a library call that loses the cancel meant for it
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        swallowed.set()
                return await real_fetch(url, **kwargs)

            fetcher.fetch = swallowing  # type: ignore[method-assign]
            consumer = Consumer(settings, q, fetcher, NullSink(), Metrics())
            running = asyncio.create_task(consumer.run())
            try:
                def lease_of(path: str) -> Lease | None:
                    return next((lease for lease in consumer.slots.busy.values()
                                 if lease.task.url.endswith(path)), None)

                for path, event in (("/a", swallowed), ("/b", asked["/b"])):
                    await until(f"a fetch of {path} started", lambda p=path: bool(lease_of(p)),
                                10)
                    if path == "/b":
                        await until("/b asked", event.is_set, 10)
                    lease = lease_of(path)
                    assert lease is not None
                    consumer.lost(lease)  # the heartbeat found it lost
                    if path == "/a":
                        await until("the cancel swallowed", event.is_set, 10)
                await until("the slot fetched /c after the second drop", asked["/c"].is_set, 5)
            finally:
                consumer.request_stop()
                await asyncio.wait_for(running, 30)
