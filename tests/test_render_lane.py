"""The frontier's render lane (lib/render.lua): a consumer without a browser never leases
a render task; one with a browser leases them (lease_render.lua) under the same host
record, so one politeness holds across both kinds; render tasks stay pending work
(is_empty, stats) and fsck checks and repairs their lane."""

from __future__ import annotations

import asyncio
import itertools

import redis.asyncio as aioredis

from common.frontier.hosts import Frontier
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.urls.canonical import fingerprint
from console.fsck import fsck


def tasks(*urls: str, render: bool = False, priority: int = 0) -> list[NewTask]:
    return [NewTask(u, fingerprint(u), render=render, priority=priority) for u in urls]


async def lease_all(q: LeasingQueue, worker: str = "w", n: int = 50) -> list[str]:
    """Every plain task a consumer without a browser gets, calls until none comes."""
    got: list[str] = []
    for _ in range(6):
        q.woken()
        leases = await q.lease(worker, n, 60_000)
        got += [lease.task.url for lease in leases]
        await q.ack(worker, [(lease, "ok") for lease in leases])
    return got


async def renders_all(q: LeasingQueue, worker: str = "r", n: int = 50) -> list[str]:
    got: list[str] = []
    for _ in range(6):
        q.woken()
        batch = await q.lease_renders(worker, n, 60_000)
        got += [lease.task.url for lease in batch.leases]
        await q.ack(worker, [(lease, "ok") for lease in batch.leases])
    return got


async def test_a_consumer_without_a_browser_never_leases_a_render_task(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await Frontier(q).set_defaults(delay_s=0, concurrency=0)
    plain = [f"http://h{i % 3}.test/p{i}" for i in range(12)]
    render = [f"http://h{i % 3}.test/r{i}" for i in range(12)]
    mixed = [u for pair in zip(render, plain, strict=True) for u in pair]
    await q.enqueue([t for u in mixed for t in tasks(u, render=u in render)])
    await q.enqueue(tasks("http://h0.test/rp", render=True, priority=5))  # priority too
    assert sorted(await lease_all(q)) == sorted(plain)
    stats = await q.stats()
    assert (stats.pending, stats.render_pending) == (13, 13)
    assert not await q.is_empty()  # render work is work
    assert sorted(await renders_all(q)) == sorted([*render, "http://h0.test/rp"])
    assert await q.is_empty()
    assert (await fsck(q)).problems == []


async def test_a_render_lease_holds_its_hosts_slot_and_turn_for_both_kinds(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    await Frontier(q).set_defaults(delay_s=0, concurrency=1)
    await q.enqueue(tasks("http://a.test/r1", "http://a.test/r2", render=True))
    await q.enqueue(tasks("http://a.test/p1", "http://a.test/p2"))
    [p1] = await q.lease("w", 10, 60_000)  # moves the render entries as it goes
    assert (await q.lease_renders("r", 5, 60_000)).leases == []  # the one slot is p1's
    await q.ack("w", [(p1, "ok")])
    await asyncio.sleep(0.25)  # another consumer's ack: the render lane looks again soon
    q.woken()
    [r1] = (await q.lease_renders("r", 5, 60_000)).leases
    assert r1.task.render and r1.concurrency == 1
    q.woken()
    assert await q.lease("w", 10, 60_000) == []  # now r1 holds it
    await q.ack("r", [(r1, "ok")])
    q.woken()
    assert len(await q.lease("w", 10, 60_000)) == 1

    # A delay: a render lease is the host's turn, and the plain lease waits a delay.
    other = crawl_name + "-d"
    d = await LeasingQueue.open(redis_client, other, CrawlSettings())
    await Frontier(d).set_defaults(delay_s=0.4, concurrency=0)
    await d.enqueue(tasks("http://b.test/p1", "http://b.test/p2"))
    await d.enqueue(tasks("http://b.test/r1", "http://b.test/r2", render=True))
    await d.lease("w", 10, 60_000)  # b.test's first turn: p1 (or the render entries moved)
    loop = asyncio.get_running_loop()
    turns = []
    deadline = loop.time() + 5
    while len(turns) < 3 and loop.time() < deadline:
        d.woken()
        for lease in [*(await d.lease("w", 10, 60_000)),
                      *(await d.lease_renders("r", 10, 60_000)).leases]:
            turns.append((lease.granted_ms, lease.task.render))
        await asyncio.sleep(0.02)
    assert sorted(r for _, r in turns) == [False, True, True]
    times = sorted(t for t, _ in turns)
    assert all(b - a >= 400 for a, b in itertools.pairwise(times)), times


async def test_fsck_checks_the_render_lane_and_repairs_it(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    await q.enqueue(tasks("http://a.test/r1", "http://b.test/r2", render=True))
    assert await q.lease("w", 10, 60_000) == []
    q.woken()
    assert await q.lease("w", 10, 60_000) == []
    pk = q.partitions[0]
    assert int(await redis_client.get(pk.render_pending)) == 2
    assert (await fsck(q)).problems == []
    await redis_client.set(pk.render_pending, 7)
    await redis_client.zrem(pk.render_due, "a.test")
    report = await fsck(q, fix=True)
    assert sorted(p.kind for p in report.problems) == ["render_due", "render_pending"]
    assert report.remaining == []
    assert sorted(await renders_all(q)) == ["http://a.test/r1", "http://b.test/r2"]
