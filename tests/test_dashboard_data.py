"""The common/ reads behind the dashboard: workers on the Redis clock, dead-letter pages."""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis
from support.clock import redis_ms

from common.errors import BadRequestError
from common.fleet.workers import WorkerRegistry, read_workers
from common.queue import CrawlSettings, Failure, LeasingQueue, NewTask
from common.urls.canonical import fingerprint
from console.cli import main_async
from console.views import deadletters as dl
from console.views.crawls import summaries
from console.views.deadletters import dead_page


@pytest.mark.parametrize("skew_s", [-3600, 3600])
async def test_a_skewed_writer_clock_does_not_change_the_age(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, *, skew_s: int,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    await LeasingQueue.open(redis_client, crawl_name)
    registry = WorkerRegistry(redis_client, crawl_name, "w-skewed", ttl_s=30)
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + skew_s)  # the consumer's clock is off
        await registry.beat(in_flight=1, done=10, failed=0, state="running")
    [w] = (await read_workers(redis_client, crawl_name)).workers
    assert 0 <= w.age_ms < 5000 and not w.stale
    assert abs(w.heartbeat_ms - await redis_ms(redis_client)) < 5000
    assert await main_async(["workers", "--crawl", crawl_name, "--json",
                             "--redis-url", redis_url, "--cluster", "no"]) == 0
    [doc] = json.loads(capsys.readouterr().out)
    assert doc["heartbeat_age_s"] < 5 and doc["stale"] is False


async def test_late_heartbeat_is_stale_and_rate_is_per_second(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    registry = WorkerRegistry(redis_client, crawl_name, "w-1", ttl_s=30)
    await registry.beat(in_flight=0, done=0, failed=0, state="running")
    key = registry.keys.worker("w-1")
    # As if the last beat was 2 s ago (Redis time), then one with 100 more pages.
    await redis_client.hset(key, "heartbeat_ms", await redis_ms(redis_client) - 2000)
    await registry.beat(in_flight=0, done=100, failed=0, state="running")
    [w] = (await read_workers(redis_client, crawl_name)).workers
    assert 40 <= w.pages_per_s <= 51 and not w.stale
    await redis_client.hset(key, "heartbeat_ms", await redis_ms(redis_client) - 60_000)
    [w] = (await read_workers(redis_client, crawl_name)).workers
    assert w.stale and w.age_ms >= 60_000
    await registry.leave()
    assert (await read_workers(redis_client, crawl_name)).workers == []


async def _crawl_with_dead(client: aioredis.Redis, name: str, partitions: int,
                           reasons: list[str]) -> LeasingQueue:
    queue = await LeasingQueue.open(client, name, CrawlSettings(partitions=partitions))
    urls = [f"https://dead.example/{i}" for i in range(len(reasons))]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    leases = []
    while len(leases) < len(urls):
        leases += await queue.lease("w", len(urls) - len(leases), 60_000)
    await queue.fail("w", [Failure(lease, reason, f"why {i}", permanent=True)
                           for i, (lease, reason) in enumerate(zip(leases, reasons,
                                                                   strict=True))])
    return queue


async def test_dead_pages_one_partition_any_depth(redis_client: aioredis.Redis,
                                                  crawl_name: str) -> None:
    queue = await _crawl_with_dead(redis_client, crawl_name, 1, ["a", "b"] * 30)
    seen: list[str] = []
    for page in range(7):
        got = await dead_page(queue, offset=page * 10, size=10)
        assert got.total == 60 and got.complete
        seen += [d.id for d in got.items]
    assert len(seen) == len(set(seen)) == 60
    deep = await dead_page(queue, offset=10**9, size=10)  # past the end: empty, not an error
    assert deep.items == []
    only_b = await dead_page(queue, reason="b", size=100)
    assert {d.reason for d in only_b.items} == {"b"} and only_b.total == 30
    assert len(only_b.items) == 30
    with pytest.raises(BadRequestError):
        await dead_page(queue, offset=-1)
    with pytest.raises(BadRequestError):
        await dead_page(queue, size=10**6)


async def test_reason_filter_says_when_it_did_not_look_at_everything(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    queue = await _crawl_with_dead(redis_client, crawl_name, 2, ["x"] * 12)
    monkeypatch.setattr(dl, "REASON_WINDOW", 5)
    got = await dead_page(queue, reason="x", size=50)
    assert (len(got.items), got.total, got.searched, got.complete) == (5, 12, 5, False)


async def test_summaries_of_many_crawls_fit_a_bounded_pool(redis_client: aioredis.Redis,
                                                           crawl_name: str) -> None:
    # redis-py's default async pool refuses a 101st connection: a list of 150 crawls
    # must not open one per crawl at once.
    names = [f"{crawl_name}-{i}" for i in range(150)]
    for name in names:
        await LeasingQueue.open(redis_client, name)
    found, total = await summaries(redis_client, limit=10**6)
    got = {c.crawl for c in found if not isinstance(c, str)}
    assert set(names) <= got and total >= 150
