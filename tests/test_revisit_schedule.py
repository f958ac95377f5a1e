"""The revisit schedule (issue 26), frontier side, against a real redis-server: a done URL
comes back by itself with its own validators, its interval learns, politeness holds, and
a crawl with revisits off works as it did.

Due times are moved into the past in ``rv:due`` (what the passing of an interval does),
so no test waits for one.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.clock import redis_ms, window_passed
from support.consume import consume, records
from support.history import encode_record, history_count, raw_record, record_of, write_record
from support.routes import serve

from common.fleet.workers import WorkerRegistry
from common.frontier.hosts import Frontier
from common.observability.metrics import Metrics
from common.policy import PolicyError, set_policy
from common.queue import CrawlSettings, DedupMode, Failure, Lease, LeasingQueue, NewTask
from common.queue.revisits import late_quantile, observed_arg
from common.revisits.previous import Observed, Revisit
from common.urls.canonical import canonicalize, fingerprint, task_id
from consumer.held import LeaseBook
from consumer.housekeeping import Housekeeping


def nt(url: str, **kw: Any) -> NewTask:
    canonical = canonicalize(url)
    assert isinstance(canonical, str)
    return NewTask(canonical, fingerprint(canonical), **kw)


def tid(url: str) -> str:
    canonical = canonicalize(url)
    assert isinstance(canonical, str)
    return task_id(fingerprint(canonical))


async def revisit_queue(client: aioredis.Redis, crawl: str, **policy: Any) -> LeasingQueue:
    """A crawl with revisits on (adaptive unless said), no politeness delay."""
    q = await LeasingQueue.open(client, crawl, CrawlSettings())
    values = {"revisit": "adaptive", "recrawl_after": 100, "min_interval": 10,
              "max_interval": 1000, "per_host_delay": 0.0, "per_host_concurrency": 0,
              **policy}
    await set_policy(client, crawl, values, by="test", create=True)
    q.configure(revisits=True)
    return q


async def make_due(q: LeasingQueue, *urls: str) -> None:
    """What the passing of their intervals does: their next visits are now."""
    pk = q.partitions[0]
    past = await redis_ms(q.client) - 5
    await q.client.zadd(pk.rv_due, {tid(u): past for u in urls})


async def visit(q: LeasingQueue, outcome: str, observed: Observed | None,
                n: int = 1) -> list[Lease]:
    leases = await q.lease("w", n, 60_000)
    assert len(leases) == n, leases
    for lease in leases:
        lease.observed = observed
    await q.ack("w", [(lease, outcome) for lease in leases])
    return leases


async def lease_revisit(q: LeasingQueue, etag: str, last_modified: str, digest: str,
                        interval_s: int) -> Lease:
    """Lease the one task due, a revisit carrying these validators and interval."""
    [lease] = await q.lease("w", 1, 60_000)
    assert lease.task.revisit is not None
    assert (lease.task.revisit.etag, lease.task.revisit.last_modified,
            lease.task.revisit.digest, lease.task.revisit.interval_s) == (
        etag, last_modified, digest, interval_s)
    return lease


async def interval_of(q: LeasingQueue, url: str) -> int:
    record = await record_of(q, tid(url))
    assert record is not None
    return record.interval_s


async def test_the_schedule_brings_a_done_url_back_with_no_producer_run_and_no_link(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    url = "http://a.test/page"
    await q.enqueue([nt(url)])
    await visit(q, "ok", Observed('"e1"', "Wed, 21 Oct 2015 07:28:00 GMT", "ab" * 8, -1))
    assert await q.state_of(tid(url), url) == "done"
    pk = q.partitions[0]
    due = await redis_client.zscore(pk.rv_due, tid(url))
    assert due is not None and due >= await redis_ms(redis_client) + 99_000
    assert (await q.promote())[0] == 0  # not due yet: nothing moves
    await make_due(q, url)
    assert (await q.promote())[0] == 1
    assert await q.state_of(tid(url), url) == "pending"
    assert await redis_client.zscore(pk.rv_due, tid(url)) is None
    [lease] = await q.lease("w", 1, 60_000)
    assert lease.task.url == canonicalize(url)
    fetched_s = int((await redis_client.time())[0])
    assert lease.task.revisit is not None
    assert abs(lease.task.revisit.fetched_s - fetched_s) <= 2
    assert lease.task.revisit == Revisit('"e1"', "Wed, 21 Oct 2015 07:28:00 GMT", "ab" * 8,
                                         lease.task.revisit.fetched_s, 100)
    stats = (await q.stats()).revisits
    assert stats is not None
    assert (stats.scheduled, stats.due, stats.revisits) == (0, 0, 1)
    assert stats.late_p50_s == 1.0  # promoted within a second of its due time


async def test_a_revisit_carries_its_own_urls_validators_never_anothers(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    urls = [f"http://a.test/{i}" for i in range(3)] + ["http://b.test/x"]
    await q.enqueue([nt(u) for u in urls])
    leases = await q.lease("w", 4, 60_000)
    for lease in leases:
        name = lease.task.url.rsplit("/", 1)[1]
        lease.observed = Observed(f'"etag-{name}"', f"lm-{name}", name.encode().hex()[:16],
                                  -1)
    await q.ack("w", [(lease, "ok") for lease in leases])
    await make_due(q, *urls)
    assert (await q.promote())[0] == 4
    for _ in range(2):  # the first visits, then revisits acked 304 together in one call
        back = await q.lease("w", 4, 60_000)
        assert sorted(lease.task.url for lease in back) == sorted(urls)
        for lease in back:
            name = lease.task.url.rsplit("/", 1)[1]
            assert lease.task.revisit is not None
            assert (lease.task.revisit.etag, lease.task.revisit.last_modified,
                    lease.task.revisit.digest) == (f'"etag-{name}"', f"lm-{name}",
                                                   name.encode().hex()[:16])
            lease.observed = Observed("", "", "", -1)  # a 304 keeps what is stored
        await q.ack("w", [(lease, "not_modified") for lease in back])
        await make_due(q, *urls)
        assert (await q.promote())[0] == 4


async def test_a_revisit_of_an_id_of_whitespace_bytes_keeps_its_meta_and_validators(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    # A revisit goes back compact, its id as 16 raw bytes: bytes that are whitespace
    # must not be taken for the space before the entry's JSON.
    q = await revisit_queue(redis_client, crawl_name)
    fps = [bytes(range(0x20, 0x30)), bytes([0x09, 0x0A, 0x0D, 0x20] * 4)]
    urls = ["http://a.test/one", "http://a.test/two"]
    await q.enqueue([NewTask(u, fp, meta={"n": i})
                     for i, (u, fp) in enumerate(zip(urls, fps, strict=True))])
    leases = await q.lease("w", 2, 60_000)
    for lease in leases:
        n = lease.task.meta["n"]
        lease.observed = Observed(f'"e{n}"', "", "", -1)
    await q.ack("w", [(lease, "ok") for lease in leases])
    past = await redis_ms(redis_client) - 5
    await redis_client.zadd(q.partitions[0].rv_due, {task_id(fp): past for fp in fps})
    assert (await q.promote())[0] == 2
    back = sorted(await q.lease("w", 2, 60_000), key=lambda lease: lease.task.meta["n"])
    assert [(lease.task.id, lease.task.url, lease.task.meta) for lease in back] == [
        (task_id(fp), u, {"n": i}) for i, (u, fp) in enumerate(zip(urls, fps, strict=True))]
    assert [lease.task.revisit and lease.task.revisit.etag for lease in back] == ['"e0"',
                                                                                '"e1"']


async def test_adaptive_intervals_grow_shrink_and_clamp(redis_client: aioredis.Redis,
                                                        crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name, recrawl_after=100, min_interval=60,
                            max_interval=150, interval_grow=0.4, interval_shrink=0.5)
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    seen = []
    for outcome in ("ok", "not_modified", "changed", "changed", "changed", "unchanged",
                    "unchanged", "unchanged"):
        if seen:
            await make_due(q, url)
            assert (await q.promote())[0] == 1
        await visit(q, outcome, Observed("", "", "cd" * 8, -1))
        seen.append(await interval_of(q, url))
    # first 100; x1.4 = 140; x0.5 = 70; 35 -> clamped 60; 60; x1.4 84; 118; 165 -> 150
    assert seen == [100, 140, 70, 60, 60, 84, 118, 150]


async def test_max_age_raises_an_adaptive_interval_and_fixed_ignores_learning(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://a.test/1")])
    await visit(q, "ok", Observed("", "", "", 500))
    assert await interval_of(q, "http://a.test/1") == 500
    fixed = await revisit_queue(redis_client, crawl_name + "f", revisit="fixed")
    await fixed.enqueue([nt("http://a.test/2")])
    await visit(fixed, "ok", Observed("", "", "", 500))
    await make_due(fixed, "http://a.test/2")
    await fixed.promote()
    await visit(fixed, "unchanged", None)
    assert await interval_of(fixed, "http://a.test/2") == 100
    # min_interval and max_interval bound what adaptive learns, not a fixed interval.
    short = await revisit_queue(redis_client, crawl_name + "s", revisit="fixed",
                                recrawl_after=5, min_interval=10)
    await short.enqueue([nt("http://a.test/3")])
    await visit(short, "ok", Observed("", "", "", -1))
    assert await interval_of(short, "http://a.test/3") == 5
    # With no recrawl_after, the interval is min_interval.
    zero = await revisit_queue(redis_client, crawl_name + "z", revisit="fixed",
                               recrawl_after=0, min_interval=10)
    await zero.enqueue([nt("http://a.test/4")])
    await visit(zero, "ok", Observed("", "", "", -1))
    assert await interval_of(zero, "http://a.test/4") == 10


async def test_max_age_never_raises_an_adaptive_interval_past_max_interval(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """max_interval 1000 s: a first visit declaring max-age 5000 s gets 1000 s, and so
    does the 304 after it (grown x1.4, raised by max-age, still clamped)."""
    q = await revisit_queue(redis_client, crawl_name, max_interval=1000)
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    before = await redis_ms(redis_client)
    await visit(q, "ok", Observed("", "", "", 5000))
    assert await interval_of(q, url) == 1000
    due = await redis_client.zscore(q.partitions[0].rv_due, tid(url))
    assert due is not None and before + 1_000_000 <= due <= before + 1_010_000
    await make_due(q, url)
    assert (await q.promote())[0] == 1
    await visit(q, "not_modified", Observed("", "", "", 5000))
    assert await interval_of(q, url) == 1000


async def test_a_304_keeps_the_stored_validators_it_did_not_carry(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    await visit(q, "ok", Observed('"v1"', "lm1", "ef" * 8, -1))
    await make_due(q, url)
    await q.promote()
    await visit(q, "not_modified", Observed("", "", "", -1))
    await make_due(q, url)
    await q.promote()
    [lease] = await q.lease("w", 1, 60_000)
    assert lease.task.revisit is not None
    assert (lease.task.revisit.etag, lease.task.revisit.digest) == ('"v1"', "ef" * 8)


async def test_a_seen_url_enqueued_again_with_revisits_on_is_a_duplicate(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name, recrawl_after=1, min_interval=1)
    q.configure(recrawl_after_s=1)  # a producer run with the crawl's window
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    await visit(q, "ok", None)
    await window_passed(redis_client, 2)
    result = await q.enqueue([nt(url)])
    assert (result.enqueued, result.duplicates) == (0, 1)
    # A URL done before revisits were on (no history) comes back by the window once.
    q.configure(revisits=False)
    await q.enqueue([nt("http://a.test/old")])
    await visit(q, "ok", None)
    assert await raw_record(q, tid("http://a.test/old")) is None
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt("http://a.test/old")])).recrawled == 1


async def test_a_recrawl_windows_history_is_kept_unscheduled_and_joins_the_schedule_later(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """With revisits off and a window, an ack keeps the URL's validators, host and entry
    (a record of interval 0: what the producer brings it back with, common.queue.known)
    and schedules nothing; the window brings it back with them;
    once revisits are on, such a record is no duplicate (the schedule does not hold it):
    the window brings it back once more and that visit's ack schedules it."""
    q = await revisit_queue(redis_client, crawl_name, revisit="off", recrawl_after=1)
    q.configure(recrawl_after_s=1)
    pk, url = q.partitions[0], "http://a.test/p"
    await q.enqueue([nt(url)])
    await visit(q, "ok", Observed('"v1"', "lm1", "ef" * 8, -1))
    record = await record_of(q, tid(url))
    assert record is not None and record.interval_s == 0
    assert (record.host, record.tail) == ("a.test", b":/p")
    assert (record.etag, record.last_modified, record.digest) == ('"v1"', "lm1", "ef" * 8)
    assert await redis_client.zcard(pk.rv_due) == 0
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt(url)])).recrawled == 1
    lease = await lease_revisit(q, '"v1"', "lm1", "ef" * 8, 0)
    lease.observed = Observed("", "", "", -1)
    await q.ack("w", [(lease, "not_modified")])  # a 304 keeps what it did not carry
    record = await record_of(q, tid(url))
    assert record is not None and record.digest == "ef" * 8
    await set_policy(redis_client, crawl_name, {"revisit": "fixed"}, by="test")
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt(url)])).recrawled == 1
    await visit(q, "not_modified", Observed("", "", "", -1))
    assert await interval_of(q, url) == 1
    assert await redis_client.zscore(pk.rv_due, tid(url)) is not None
    record = await record_of(q, tid(url))
    assert record is not None and record.tail.startswith(b":/p")  # its entry, kept now


@pytest.mark.parametrize("data", [{}, {"k": "v"}], ids=["bare", "with-data"])
async def test_a_record_without_entry_gets_the_entry_of_its_recrawl_without_its_visit(
        redis_client: aioredis.Redis, crawl_name: str, data: dict[str, str]) -> None:
    """A recrawl window's record an older crawlq wrote keeps no host nor entry: the ack
    of its recrawl (brought back by a seed with `v`, its previous visit, last in the
    entry's JSON) gives it the entry without that `v`."""
    q = await revisit_queue(redis_client, crawl_name, revisit="off", recrawl_after=1)
    q.configure(recrawl_after_s=1)
    url = "http://a.test/p"
    await q.enqueue([nt(url, data=data)])
    await visit(q, "ok", Observed('"v1"', "", "ef" * 8, -1))
    record = await record_of(q, tid(url))
    assert record is not None
    await write_record(q, tid(url), encode_record(replace(record, host="", tail=b"")))
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt(url, data=data)])).recrawled == 1
    lease = await lease_revisit(q, '"v1"', "", "ef" * 8, 0)
    lease.observed = Observed("", "", "", -1)
    await q.ack("w", [(lease, "not_modified")])
    record = await record_of(q, tid(url))
    assert record is not None and record.host == "a.test"
    assert record.tail == (b':/p {"u":{"k":"v"}}' if data else b":/p")


async def test_revisits_keep_their_hosts_politeness(redis_client: aioredis.Redis,
                                                    crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    urls = ["http://a.test/1", "http://a.test/2"]
    await q.enqueue([nt(u) for u in urls])
    await visit(q, "ok", None, n=2)
    await Frontier(q).set_host("a.test", concurrency=1)
    await Frontier(q).block_host("a.test", 60)
    await make_due(q, *urls)
    assert (await q.promote())[0] == 2
    assert await q.lease("w", 2, 60_000) == []  # blocked: a revisit waits like any task
    await Frontier(q).block_host("a.test", 0)
    assert len(await q.lease("w", 2, 60_000)) == 1  # one slot


async def test_revisits_keep_their_hosts_delay_and_page_budget(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    slow = [f"http://slow.test/{i}" for i in range(3)]
    spent = [f"http://spent.test/{i}" for i in range(2)]
    await Frontier(q).set_host("spent.test", budget=2)
    await q.enqueue([nt(u) for u in slow + spent])
    await visit(q, "ok", None, n=5)  # the budget's two pages are spent by the first visits
    await Frontier(q).set_host("slow.test", delay_s=30)
    await make_due(q, *slow, *spent)
    assert (await q.promote())[0] == 5
    # slow.test's last request was its first visits: its turn is 30 s after; spent.test's
    # budget is spent: its revisits wait, parked.
    assert await q.lease("w", 5, 60_000) == []
    await Frontier(q).set_host("slow.test", delay_s=0.2)
    await asyncio.sleep(0.25)
    first = await q.lease("w", 5, 60_000)
    assert [lease.host for lease in first] == ["slow.test"]  # one a turn
    assert await q.lease("w", 5, 60_000) == []


async def test_with_revisits_off_ack_sends_what_it_sent_and_schedules_nothing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    sent: list[list[Any]] = []
    real = q.scripts.ack

    async def recording(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        sent.append(list(args))
        return await real(keys=keys, args=args, client=client)

    q.scripts.ack = recording  # type: ignore[assignment]
    await q.enqueue([nt("http://a.test/1")])
    await visit(q, "ok", Observed('"e"', "", "", -1))
    assert sent[0][1] == 1 and len(sent[0]) == 2 + 7  # marks, 7 values an item, as before
    pk = q.partitions[0]
    assert await history_count(q) == 0 and await redis_client.exists(pk.rv_due) == 0
    await q.promote()
    assert await q.state_of(tid("http://a.test/1"), "http://a.test/1") == "done"


async def test_a_schedule_waits_while_revisits_are_off(redis_client: aioredis.Redis,
                                                       crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://a.test/1")])
    await visit(q, "ok", None)
    await set_policy(redis_client, crawl_name, {"revisit": "off"}, by="test")
    await make_due(q, "http://a.test/1")
    assert (await q.promote())[0] == 0
    await set_policy(redis_client, crawl_name, {"revisit": "fixed"}, by="test")
    assert (await q.promote())[0] == 1


async def test_revisit_policy_is_checked(redis_client: aioredis.Redis,
                                         crawl_name: str) -> None:
    await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(dedup=DedupMode.BLOOM))
    with pytest.raises(PolicyError, match=r"revisit: crawl .* uses bloom dedup"):
        await set_policy(redis_client, crawl_name, {"revisit": "adaptive"}, by="t",
                         create=True)
    for values, message in (({"revisit": "sometimes"}, "revisit"),
                            ({"interval_shrink": 1.0}, "interval_shrink"),
                            ({"min_interval": 100, "max_interval": 10}, "max_interval")):
        with pytest.raises(PolicyError, match=message):
            await set_policy(redis_client, crawl_name + "x", values, by="t", create=True)


def test_observed_values_are_length_prefixed_and_long_validators_dropped() -> None:
    assert observed_arg(None) == "-1 - 0 0 "
    assert observed_arg(Observed('"a b"', "Tue, 1", "ab" * 8, 60)) == \
        f'60 {"ab" * 8} 5 6 "a b"Tue, 1'
    assert observed_arg(Observed("x" * 257, "é", "", -1)) == "-1 - 0 2 é"


def test_lateness_quantiles_read_the_buckets() -> None:
    assert late_quantile({}, 0.5) is None
    counters = {"rv_late:1": 98, "rv_late:600": 1, "rv_late:inf": 1}
    assert (late_quantile(counters, 0.5), late_quantile(counters, 0.99)) == (1.0, 600.0)


async def test_only_a_due_revisit_keeps_a_crawl_from_being_empty(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    await visit(q, "ok", None)
    assert await q.is_empty()  # its next visit is in 100 s: nothing for this pass
    await make_due(q, url)
    assert not await q.is_empty()  # due: the reaper brings it back
    await set_policy(redis_client, crawl_name, {"revisit": "off"}, by="test")
    assert await q.is_empty()  # the schedule waits while revisits are off
    await set_policy(redis_client, crawl_name, {"revisit": "adaptive"}, by="test")
    assert not await q.is_empty()
    assert (await q.promote())[0] == 1
    assert not await q.is_empty()  # pending now
    await visit(q, "not_modified", None)
    assert await q.is_empty()


async def test_a_batch_consumer_waits_for_a_due_revisit_not_for_a_later_one(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async def page(request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == '"e1"':
            return web.Response(status=304, headers={"ETag": '"e1"'})
        return web.Response(text="<html></html>", content_type="text/html",
                            headers={"ETag": '"e1"'})

    q = await revisit_queue(redis_client, crawl_name, recrawl_after=3600)
    async with serve({"/p": page}) as site:
        url = site.url("/p")
        await q.enqueue([nt(url)])
        assert await consume(redis_url, crawl_name, tmp_path / "1", limit_s=30) == 0
        assert [r["outcome"] for r in records(tmp_path / "1")] == ["ok"]
        assert await redis_client.zcard(q.partitions[0].rv_due) == 1  # exited, scheduled
        await make_due(q, url)
        assert await consume(redis_url, crawl_name, tmp_path / "2", limit_s=30) == 0
    assert [r["outcome"] for r in records(tmp_path / "2")] == ["not_modified"]
    assert await q.is_empty()


async def test_a_purged_url_leaves_the_schedule(redis_client: aioredis.Redis,
                                                crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name)
    urls = ["http://a.test/1", "http://a.test/2"]
    await q.enqueue([nt(u) for u in urls])
    await visit(q, "ok", None, n=2)
    await make_due(q, *urls)
    assert (await q.promote())[0] == 2
    leases = await q.lease("w", 2, 60_000)
    await q.fail("w", [Failure(lease, "gone", "no such page", permanent=True)
                       for lease in leases])
    pk = q.partitions[0]
    # One dead revisit whose schedule entry is still there (a crash, an older crawlq).
    await redis_client.zadd(pk.rv_due, {tid(urls[1]): await redis_ms(redis_client) + 10**6})
    assert await q.dead_purge([tid(u) for u in urls]) == 2
    assert await history_count(q) == 0 and await redis_client.exists(pk.rv_due) == 0
    assert await redis_client.hget(pk.conf, "rv_urls") == b"0"
    assert await q.is_empty()
    # Like any purged URL, a producer run's recrawl window may bring it back: no history
    # keeps it a duplicate.
    q.configure(recrawl_after_s=1)
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt(urls[0])])).recrawled == 1


async def reaper_round(q: LeasingQueue, metrics: Metrics, worker: str) -> None:
    """One round of a consumer's reaper loop (reclaim, promote, its figures)."""
    rounds = iter([False, True])
    keeper = Housekeeping(q, LeaseBook(1.0, metrics), metrics,
                          WorkerRegistry(q.client, q.crawl, worker, ttl_s=30), worker=worker,
                          lease_s=1.0, status=dict, on_lost=lambda lease: None)
    await keeper.reaper(lambda: next(rounds))


async def test_every_consumer_serves_the_crawls_revisit_figures(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    plain = await LeasingQueue.open(redis_client, crawl_name + "p", CrawlSettings())
    quiet = Metrics()
    await reaper_round(plain, quiet, "w0")
    assert "crawlq_revisits" not in quiet.render()[0].decode()  # revisits off, no history

    q = await revisit_queue(redis_client, crawl_name)
    urls = ["http://a.test/1", "http://b.test/2"]
    await q.enqueue([nt(u) for u in urls])
    await visit(q, "ok", None, n=2)
    pk = q.partitions[0]
    await redis_client.zadd(pk.rv_due, {tid(urls[0]): await redis_ms(redis_client) - 7_200_000})
    reaper, other = Metrics(), Metrics()
    await reaper_round(q, reaper, "w1")  # holds the reap guard: brings one back, 2 h late
    await redis_client.set(pk.reap_lock, b"w1", px=60_000)
    await reaper_round(q, other, "w2")  # the guard is taken: figures only
    for metrics in (reaper, other):
        text = metrics.render()[0].decode()
        assert "crawlq_revisits_scheduled 1.0" in text
        assert "crawlq_revisits_due 0.0" in text
        assert "crawlq_revisits_total 1.0" in text
        assert 'crawlq_revisits_late_seconds{quantile="0.99"} 21600.0' in text


async def learned_round(q: LeasingQueue, urls: list[str], outcome_of: dict[str, str]) -> None:
    """Every URL of `urls` visited once, with the outcome `outcome_of` gives it."""
    leases = await q.lease("w", len(urls), 60_000)
    assert len(leases) == len(urls)
    for lease in leases:
        lease.observed = Observed("", "", "cd" * 8, -1)
    await q.ack("w", [(lease, outcome_of.get(lease.task.url, "ok")) for lease in leases])
    await make_due(q, *urls)
    assert (await q.promote())[0] == len(urls)


async def test_learned_intervals_follow_the_estimated_change_rate_within_the_bounds(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """revisit=learned: a URL found unchanged visit after visit is revisited less and less
    often, up to max_interval; one found changed at every visit more and more often, down
    to min_interval; the others (changed every third visit) stay near recrawl_after, and
    the partition's schedule asks for what a fixed one at recrawl_after would."""
    q = await revisit_queue(redis_client, crawl_name, revisit="learned", recrawl_after=100,
                            min_interval=70, max_interval=300)
    static, hot = "http://a.test/static", "http://a.test/hot"
    others = [f"http://a.test/o{i}" for i in range(8)]
    urls = [static, hot, *others]
    await q.enqueue([nt(u) for u in urls])
    seen: dict[str, list[int]] = {static: [], hot: []}
    for k in range(16):
        outcomes = {canonicalize(u): "changed" if k % 3 == 1 else "unchanged" for u in others}
        outcomes |= {canonicalize(static): "not_modified", canonicalize(hot): "changed"}
        if k == 0:
            outcomes = {}  # first visits
        await learned_round(q, urls, outcomes)
        for u, intervals in seen.items():
            intervals.append(await interval_of(q, u))
    assert seen[static][0] == seen[hot][0] == 100  # first visits: recrawl_after
    assert seen[static] == sorted(seen[static]), seen[static]
    assert seen[static][4] > 150 and seen[static][-1] == 300, seen[static]
    assert seen[hot][1] < 100 and seen[hot][-1] == 70, seen[hot]
    assert all(70 <= i <= 100 for i in seen[hot]), seen[hot]
    middle = [await interval_of(q, u) for u in others]
    assert all(70 < i < 200 for i in middle), middle
    demand = float(await redis_client.hget(q.partitions[0].conf, "rv_demand") or 0)
    assert 0.8 * len(urls) / 100 <= demand <= 1.2 * len(urls) / 100


async def test_a_history_record_written_before_the_estimator_still_decodes(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A live crawl's records have no estimator token: they are brought back with their
    validators, and their next ack starts the estimator from nothing."""
    q = await revisit_queue(redis_client, crawl_name, revisit="learned", recrawl_after=100,
                            min_interval=10, max_interval=10_000)
    url = "http://a.test/old"
    await q.enqueue([nt(url)])
    await visit(q, "ok", Observed('"e1"', "lm1", "ab" * 8, -1))
    record = await record_of(q, tid(url))
    assert record is not None and record.n == 0  # a first visit observes no change
    # as issue 26's scripts wrote it: no sums, an interval
    await write_record(q, tid(url), encode_record(replace(record, interval_s=400)))
    await make_due(q, url)
    assert (await q.promote())[0] == 1
    lease = await lease_revisit(q, '"e1"', "lm1", "ab" * 8, 400)
    lease.observed = Observed("", "", "", -1)
    await q.ack("w", [(lease, "not_modified")])
    record = await record_of(q, tid(url))
    # one visit covering 400 s found no change: 400 s known unchanged, too
    assert record is not None and (record.n, record.x, record.t, record.e) == (1, 0, 400, 400)
    assert await interval_of(q, url) > 100


async def test_learned_dates_changes_by_last_modified(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """revisit=learned: three URLs found changed at every visit. One whose Last-Modified
    says it changed seconds before each visit changes too fast for any affordable visit
    to keep it fresh: it goes to max_interval. One whose Last-Modified says it changed
    just after the previous visit changes about once a visit: it keeps an interval near
    recrawl_after. One without Last-Modified can only be known to change at least about
    once a visit (the 304/digest estimator): it is visited more often than that. A change
    its Last-Modified dates a day before the previous visit leaves the rate to that
    estimator."""
    q = await revisit_queue(redis_client, crawl_name, revisit="learned", recrawl_after=100,
                            min_interval=10, max_interval=5000)
    fast, slow, blind, stale = (f"http://a.test/{n}" for n in ("fast", "slow", "blind",
                                                                "stale"))
    urls = [fast, slow, blind, stale]
    await q.enqueue([nt(u) for u in urls])
    stale_lm = formatdate(await redis_ms(redis_client) / 1000 - 86400, usegmt=True)
    for k in range(6):
        now_s = await redis_ms(redis_client) / 1000
        last_modified = {canonicalize(fast): formatdate(now_s - 2, usegmt=True),
                         canonicalize(slow): formatdate(now_s - 90, usegmt=True),
                         canonicalize(blind): "", canonicalize(stale): stale_lm}
        leases = await q.lease("w", len(urls), 60_000)
        assert len(leases) == len(urls)
        for lease in leases:
            lease.observed = Observed("", last_modified[lease.task.url], f"{k:016x}", -1)
        await q.ack("w", [(lease, "changed" if k else "ok") for lease in leases])
        await make_due(q, *urls)
        assert (await q.promote())[0] == len(urls)
    intervals = {u: await interval_of(q, u) for u in urls}
    assert intervals[fast] == 5000, intervals
    assert 70 <= intervals[slow] <= 200, intervals
    assert intervals[slow] > intervals[blind] == intervals[stale], intervals
    for group, sums in (((fast, slow), 3), ((blind, stale), 2)):  # ~n,x,t,e / ~n,x,t: no e
        for url in group:
            record = await record_of(q, tid(url))
            assert record is not None and record.n > 0, record
            assert (record.e is not None) == (sums == 3), record


@pytest.mark.parametrize(("etag", "last_modified", "digest"), [
    ('"5f2b-1a3c9e7d"', "Wed, 21 Oct 2015 07:28:00 GMT", "0123456789abcdef"),
    ('W/"x"', "Wednesday, 21-Oct-15 07:28:00 GMT", "not-hex-and-long-" * 3),  # kept as text
    ("", "Sun, 06 Nov 1994 08:49:37 GMT", ""),
    ("é" * 128, "Thu, 01 Jan 1970 00:00:00 GMT", "ABCDEF0123456789"),  # 256 bytes: kept
])
async def test_a_history_record_is_compact_and_gives_back_what_it_was_told(
        redis_client: aioredis.Redis, crawl_name: str, etag: str, last_modified: str,
        digest: str) -> None:
    """The binary record (lib/revisits.lua record_encode) reads back as written, by the
    scripts (the revisit's `v`) and by Python (common.revisits.record) alike: an
    IMF-fixdate as 4 bytes of seconds, 16 hex digits as 8 bytes, anything else as text;
    the entry without the scheme and host its record names."""
    q = await revisit_queue(redis_client, crawl_name, revisit="fixed")
    url = "https://a.test/path/page.html?q=1"
    await q.enqueue([nt(url, priority=300)])
    await visit(q, "ok", Observed(etag, last_modified, digest, -1))
    raw = await raw_record(q, tid(url))
    record = await record_of(q, tid(url))
    assert raw is not None and record is not None
    assert (record.host, record.priority, record.interval_s) == ("a.test", 300, 100)
    assert (record.etag, record.last_modified, record.digest) == (etag, last_modified, digest)
    assert record.tail == b'/path/page.html?q=1 {"p":300}'  # the entry's own fields
    text_lm = "1994" not in last_modified and "2015" not in last_modified and (
        "1970" not in last_modified)
    assert bool(raw[0] & 8) is not text_lm  # Last-Modified as seconds
    assert bool(raw[0] & 4) is (digest == "0123456789abcdef")
    fixed = 1 + 2 + 1 + 4 + 1 + len(record.host) + len(record.tail)
    lm_size = len(last_modified) + 1 if text_lm else 4
    digest_size = 8 if raw[0] & 4 else 1 + len(digest)
    assert len(raw) == fixed + lm_size + digest_size + len(etag.encode()) + (
        2 if len(etag.encode()) > 127 else 1)
    await make_due(q, url)
    assert (await q.promote())[0] == 1
    lease = await lease_revisit(q, etag, last_modified, digest, 100)
    assert lease.task.url == url and lease.task.priority == 300


async def test_a_validator_too_long_is_not_kept_and_a_malformed_record_is_none(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await revisit_queue(redis_client, crawl_name, revisit="fixed")
    url = "http://a.test/p"
    await q.enqueue([nt(url)])
    await visit(q, "ok", Observed("e" * 257, "x" * 300, "0123456789abcdef", -1))
    record = await record_of(q, tid(url))
    assert record is not None and (record.etag, record.last_modified) == ("", "")
    for bad in (b"\x10" + (await raw_record(q, tid(url)) or b"")[1:], b"\x00\x01", b"x"):
        await write_record(q, tid(url), bad)
        assert await record_of(q, tid(url)) is None
        await make_due(q, url)
        assert (await q.promote())[0] == 0  # as with no record: never brought back
