"""Guarantees that the other tests did not pin down, each a test that fails when it is
broken (issue 13; `tests/mutation_drill.py` breaks each one on purpose and checks that
these fail). Real redis-server, real local sites."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.clock import redis_ms
from support.consume import consume, consumer_args, enqueue, records
from support.live import snapshot
from support.routes import serve

from common.http.fetcher import Fetcher
from common.keys import PartitionKeys
from common.observability.metrics import Metrics
from common.queue import Code, Crawl, Lease, LeasingQueue, NewTask, housekeeping
from common.urls.canonical import fingerprint
from consumer.completion import Completion, CompletionKind
from consumer.config import build_parser, settings_from_args
from consumer.flush import Flusher
from consumer.held import LeaseBook
from consumer.intake import LinkIntake
from consumer.lifecycle import Consumer
from consumer.live import Live
from consumer.sinks import Record

LEASE_S = 30.0


async def until_redis_time(client: aioredis.Redis, ms: float) -> None:
    """Return once Redis' clock reads `ms` or later."""
    while True:
        left = ms - await redis_ms(client)
        if left <= 0:
            return
        await asyncio.sleep(left / 1000 + 0.01)


async def queue_with(client: aioredis.Redis, crawl: str, n: int) -> LeasingQueue:
    queue = await LeasingQueue.open(client, crawl)
    urls = [f"http://g.test/{i}" for i in range(n)]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    return queue


class GatedSink:
    """A sink whose writes wait until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.records: list[Record] = []

    async def open(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        self.entered.set()
        await self.gate.wait()
        self.records.extend(records)

    async def close(self) -> None:
        pass


def flusher(queue: LeasingQueue, sink: GatedSink) -> tuple[Flusher, LeaseBook]:
    metrics = Metrics()
    book = LeaseBook(LEASE_S, metrics)
    intake = LinkIntake(metrics, Live(snapshot(max_depth=0)), cache_size=0)
    return Flusher(queue, sink, metrics, book, worker="w", batch=8, intake=intake,
                   on_freed=lambda turn: None), book


def record(lease: Lease) -> Record:
    task = lease.task
    return Record(task_id=task.id, url=task.url, final_url=task.url, status=200, outcome="ok",
                  headers={}, raw_headers=(), body=b"", bytes=0, elapsed=0.0,
                  attempt=task.attempt, fetched_at=time.time(), worker="w")


async def test_a_task_is_not_done_while_its_result_is_not_in_the_sink(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await queue_with(redis_client, crawl_name, 1)
    [lease] = await queue.lease("w", 1, int(LEASE_S * 1000))
    sink = GatedSink()
    flush, book = flusher(queue, sink)
    book.hold(lease, time.monotonic())
    flush.add(Completion(lease, CompletionKind.ACK, record=record(lease)))
    flushing = asyncio.create_task(flush.flush())
    await asyncio.wait_for(sink.entered.wait(), 10)
    # The sink has not confirmed the write: a crash now must leave the task leased (so it
    # comes back), not done with its result nowhere.
    assert await queue.state_of(lease.id) == "leased"
    assert (await queue.stats()).done == 0
    sink.gate.set()
    await asyncio.wait_for(flushing, 10)
    assert [r.task_id for r in sink.records] == [lease.id]
    assert await queue.state_of(lease.id) == "done"


async def test_results_of_lost_or_expired_leases_are_not_written(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await queue_with(redis_client, crawl_name, 2)
    lost, expired = await queue.lease("w", 2, int(LEASE_S * 1000))
    sink = GatedSink()
    sink.gate.set()
    flush, book = flusher(queue, sink)
    book.hold(lost, time.monotonic())
    book.drop(lost, lost=True)  # what a heartbeat does with a lease Redis says is gone
    book.hold(expired, time.monotonic() - 2 * LEASE_S)  # e.g. the process was stopped
    for lease in (lost, expired):
        flush.add(Completion(lease, CompletionKind.ACK, record=record(lease)))
    await asyncio.wait_for(flush.flush(), 10)
    # Someone else may own these tasks by now: their results would be duplicates.
    assert sink.records == []
    assert len(book) == 0
    assert [await queue.state_of(lease.id) for lease in (lost, expired)] == ["leased"] * 2


@pytest.mark.parametrize("skew_s", [-3600, 3600])
async def test_a_lease_deadline_is_redis_time_whatever_the_worker_clock(
        skew_s: int, monkeypatch: pytest.MonkeyPatch, redis_client: aioredis.Redis,
        crawl_name: str) -> None:
    queue = await queue_with(redis_client, crawl_name, 1)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew_s)  # this worker's clock is off
    before = await redis_ms(redis_client)
    [lease] = await queue.lease("w", 1, 60_000)
    after = await redis_ms(redis_client)
    deadline = await redis_client.zscore(queue.partitions[0].leases, lease.id)
    assert deadline is not None and before + 60_000 <= deadline <= after + 60_000
    assert lease.deadline_ms == deadline
    assert await queue.reclaim() == (0, 0)
    assert await queue.ack("w", [(lease, "ok")]) == [Code.OK]


async def test_reclaim_checks_each_deadline_on_redis_time_itself(
        monkeypatch: pytest.MonkeyPatch, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The candidates reclaim reads first may be out of date by the time its script runs
    (a heartbeat renewed them in between): the script must check the deadline again."""
    queue = await queue_with(redis_client, crawl_name, 1)
    [lease] = await queue.lease("w", 1, 60_000)

    async def every_lease(crawl: Crawl, pk: PartitionKeys, zset: str, limit: int
                          ) -> tuple[list[str], list[str]]:
        ids = [m.decode() for m in await redis_client.zrange(zset, 0, limit - 1)]
        values = await redis_client.hmget(pk.leased, ids) if ids else []
        # A lease record is "<owner> <attempt> <host> ...".
        return ids, [v.split(b" ", 3)[2].decode() for v in values]

    monkeypatch.setattr(housekeeping, "due_ids", every_lease)
    assert await queue.reclaim() == (0, 0)
    assert await queue.state_of(lease.id) == "leased"
    assert await queue.ack("w", [(lease, "ok")]) == [Code.OK]


async def test_a_fetch_longer_than_several_leases_keeps_its_lease(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """--lease 1s and a fetch of over 3 s: the heartbeat keeps the lease the whole time."""
    asked, answer = asyncio.Event(), asyncio.Event()
    hits = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        asked.set()
        await answer.wait()
        return web.Response(text="slow")

    async with serve({"/slow": slow}) as site:
        url = site.url("/slow")
        queue = await enqueue(redis_client, crawl_name, [url])
        consumer = asyncio.create_task(consume(redis_url, crawl_name, tmp_path, "--lease", "1s",
                                               "--timeout", "30s", "--concurrency", "1"))
        await asyncio.wait_for(asked.wait(), 10)
        first = await redis_client.zscore(queue.partitions[0].leases, fingerprint(url).hex())
        assert first is not None
        await until_redis_time(redis_client, first + 2000)  # 3 lease lengths in all
        answer.set()
        assert await asyncio.wait_for(consumer, 20) == 0
    assert hits == 1, "the task was fetched again: its lease was lost mid-fetch"
    stats = await queue.stats()
    assert stats.done == 1
    # (Redis' `lost` counter is not checked: a heartbeat that races the ack counts the
    # just-acked lease there.)
    assert stats.counters.get("reclaimed", 0) == 0
    assert [r["url"] for r in records(tmp_path)] == [url]


async def test_a_worker_survives_a_drop_meant_for_its_previous_lease(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """A heartbeat's drop can reach a worker after it moved on to its next lease: that
    lease starts again and the worker goes on (it used to end, and with every worker
    ended a consumer held its leases and fetched nothing)."""
    asked, answer = asyncio.Event(), asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        asked.set()
        await answer.wait()
        return web.Response(text="ok")

    async with serve({"/p/{i}": hang}) as site:
        urls = [site.url("/p/1"), site.url("/p/2")]
        queue = await enqueue(redis_client, crawl_name, urls)
        settings = settings_from_args(build_parser().parse_args(
            consumer_args(redis_url, crawl_name, tmp_path, "--concurrency", "1")))
        sink = GatedSink()
        sink.gate.set()
        async with Fetcher(settings.fetch) as fetcher:
            consumer = Consumer(settings, queue, fetcher, sink, Metrics())  # type: ignore[arg-type]
            running = asyncio.create_task(consumer.run())
            await asyncio.wait_for(asked.wait(), 10)
            [(slot, lease)] = consumer.slots.busy.items()
            consumer.slots.dropping[slot] = copy.copy(lease)  # an earlier lease, as it were
            slot.cancel()
            answer.set()
            assert await asyncio.wait_for(running, 20) == 0
    assert (await queue.stats()).done == 2
    assert sorted(r.url for r in sink.records) == sorted(urls)


async def test_a_lease_acked_while_its_renewal_was_on_the_way_is_not_lost(
        redis_client: aioredis.Redis, crawl_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The heartbeat renews every held lease; one whose ack reached Redis while its reply
    is still on its way to the flusher is gone from Redis but not lost: the flusher
    settles it (and would say if it was lost). Only a lease nobody is settling counts
    (leases_lost), its work is dropped."""
    queue = await queue_with(redis_client, crawl_name, 2)
    settings = settings_from_args(build_parser().parse_args([]))
    consumer = Consumer(settings, queue, Fetcher(settings.fetch), GatedSink(), Metrics())
    try:
        acking, gone = await queue.lease(consumer.worker_id, 2, 60_000)
        for lease in (acking, gone):
            consumer.book.hold(lease, time.monotonic())
        # acking's ack is in Redis, its reply not back yet; gone was reclaimed elsewhere.
        assert await queue.ack(consumer.worker_id, [(acking, "ok"), (gone, "ok")]) == [
            Code.OK, Code.OK]
        consumer.flusher._in_flush.add(acking.id)
        with caplog.at_level("WARNING", logger="consumer"):
            await consumer.housekeeping.renew()
        assert consumer.book.holds(acking) and not consumer.book.holds(gone)
        assert [r.getMessage() for r in caplog.records if "leases_lost" in r.getMessage()] \
            == ["leases_lost"] and caplog.records[-1].__dict__.get("n") == 1
    finally:
        await consumer.fetcher.close()
