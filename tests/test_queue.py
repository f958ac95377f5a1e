"""Every queue transition and its edge cases, against a real redis-server.

Each test works on its own crawl (``crawl_name``) of the session's server, and checks
what Redis holds (states, scores, counters), not only what the API returned.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common import codec
from common.errors import ConfigError, CrawlConflictError, MalformedTaskError
from common.keys import HASHTABLE_FIELD, PartitionKeys
from common.queue import (
    MALFORMED,
    Code,
    CrawlQueue,
    CrawlSettings,
    DedupMode,
    Failure,
    Lease,
    NewTask,
    RetryPolicy,
)
from common.task import decode_task
from common.urls import canonicalize, fingerprint, task_id

# ------------------------------------------------------------------------- helpers


def nt(url: str, priority: int = 0, max_attempts: int = 3, **kw: Any) -> NewTask:
    """A NewTask through the real producer path: canonicalize, then fingerprint."""
    canonical = canonicalize(url)
    assert isinstance(canonical, str), canonical
    return NewTask(canonical, fingerprint(canonical), priority=priority,
                   max_attempts=max_attempts, **kw)


def tid(url: str) -> str:
    canonical = canonicalize(url)
    assert isinstance(canonical, str)
    return task_id(fingerprint(canonical))


def many(n: int, prefix: str = "p") -> list[NewTask]:
    return [nt(f"http://example.test/{prefix}/{i}") for i in range(n)]


async def open_queue(client: aioredis.Redis, crawl: str, settings: CrawlSettings | None = None,
                     **kw: Any) -> CrawlQueue:
    return await CrawlQueue.open(client, crawl, settings or CrawlSettings(), **kw)


async def redis_ms(client: aioredis.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def lease_one(q: CrawlQueue, worker: str = "w1", lease_ms: int = 30_000) -> Lease:
    leases = await q.lease(worker, 1, lease_ms)
    assert len(leases) == 1, leases
    return leases[0]


async def expire(q: CrawlQueue, *leases: Lease) -> None:
    """Sleep until every lease's deadline (Redis clock) has passed."""
    while True:
        now = await redis_ms(q.client)
        wait = max(lease.deadline_ms for lease in leases) - now
        if wait < 0:
            return
        await asyncio.sleep(wait / 1000 + 0.01)


async def all_ops(q: CrawlQueue, worker: str, lease: Lease) -> dict[str, Code]:
    """Try every holder-only transition with one lease; each must be refused alike."""
    codes: dict[str, Code] = {}
    lost = await q.renew(worker, [lease], 10_000)
    codes["renew"] = lost[0][1] if lost else Code.OK
    codes["checkpoint"] = await q.checkpoint(worker, lease, {"page": 9})
    codes["defer"] = (await q.defer(worker, [(lease, 0)]))[0]
    codes["release"] = (await q.release(worker, [lease]))[0]
    codes["fail"] = (await q.fail(worker, [Failure(lease, "x", "y")]))[0][0]
    codes["ack"] = (await q.ack(worker, [(lease, "ok")]))[0]
    return codes


async def structures(client: aioredis.Redis, pk: PartitionKeys) -> dict[str, list[str]]:
    """The ids each state structure of one partition holds."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.lrange(pk.ready, 0, -1)
        pipe.zrange(pk.prio, 0, -1)
        pipe.zrange(pk.leases, 0, -1)
        pipe.zrange(pk.delayed, 0, -1)
        pipe.zrange(pk.dead, 0, -1)
        replies = await pipe.execute()
    names = ("ready", "prio", "leases", "delayed", "dead")
    return {n: [m.decode() for m in r] for n, r in zip(names, replies, strict=True)}


def assert_conserved(stats: Any) -> None:
    c = stats.counters
    assert c.get("enqueued", 0) == (stats.pending + stats.leased + stats.waiting + stats.dead
                                    + c.get("done", 0) + c.get("purged", 0)), stats


# ------------------------------------------------------------------------- enqueue + lease


async def test_enqueue_lease_ack_round_trip(redis_client: aioredis.Redis, crawl_name: str
                                            ) -> None:
    q = await open_queue(redis_client, crawl_name)
    task = nt("HTTP://Example.TEST:80/a/./b#frag", meta={"k": "v"}, depth=2)
    res = await q.enqueue([task], now=1234.5)
    assert (res.enqueued, res.duplicates, res.recrawled) == (1, 0, 0)
    assert await q.state_of(task_id(task.fp)) == "pending"

    lease = await lease_one(q, "w1", 5_000)
    t = lease.task
    assert t.id == task_id(task.fp)
    assert (t.url, t.attempt, t.max_attempts, t.meta, t.depth, t.enqueued_at) == (
        "http://example.test/a/b", 1, 3, {"k": "v"}, 2, 1234.5)
    assert t.last_error is None and t.checkpoint is None
    now = await redis_ms(redis_client)
    assert now < lease.deadline_ms <= now + 5_000
    pk = q.partitions[0]
    assert int(await redis_client.zscore(pk.leases, t.id)) == lease.deadline_ms
    assert await redis_client.hget(pk.owners, t.id) == f"{lease.token}:w1".encode()
    assert await q.state_of(t.id) == "leased"

    assert await q.ack("w1", [(lease, "ok")]) == [Code.OK]
    assert await q.state_of(t.id) == "done"
    for key in (pk.tasks, pk.attempts, pk.owners, pk.prios, pk.errors, pk.checkpoints):
        assert not await redis_client.hexists(key, t.id)
    assert await redis_client.zcard(pk.leases) == 0
    # A second ack of a finished task is refused, and counted.
    assert await q.ack("w1", [(lease, "ok")]) == [Code.UNKNOWN]
    s = await q.stats()
    assert s.counters["done"] == 1 and s.counters["outcome:ok"] == 1
    assert s.counters["stale"] == 1 and s.counters["leased"] == 1
    assert await q.lease("w1", 5, 1_000) == []
    assert_conserved(s)


async def test_enqueue_rejects_bad_new_tasks(redis_client: aioredis.Redis, crawl_name: str
                                            ) -> None:
    q = await open_queue(redis_client, crawl_name)
    for bad in (nt("http://a.test/", priority=-1), nt("http://a.test/", max_attempts=0),
                nt("http://a.test/", depth=-1)):
        with pytest.raises(ConfigError):
            await q.enqueue([bad])
    assert (await q.enqueue([])).enqueued == 0
    assert (await q.stats()).counters == {}


async def test_two_workers_never_hold_one_task(redis_client: aioredis.Redis, crawl_name: str
                                               ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=4))
    tasks = many(1200)
    for i in range(0, len(tasks), 400):
        await q.enqueue(tasks[i:i + 400])
    rng = random.Random(7)

    async def worker(name: str) -> tuple[str, list[Lease]]:
        # Each worker has its own CrawlQueue (its own partition cursor), as in a fleet.
        wq = CrawlQueue(redis_client, crawl_name, q.settings)
        got: list[Lease] = []
        while True:
            batch = await wq.lease(name, rng.randint(1, 13), 60_000)
            if not batch:
                return name, got
            got += batch

    results = await asyncio.gather(*(worker(f"w{i}") for i in range(24)))
    ids = [lease.id for _, got in results for lease in got]
    assert len(ids) == len(set(ids)) == 1200
    assert set(ids) == {task_id(t.fp) for t in tasks}
    tokens = [(lease.partition, lease.token) for _, got in results for lease in got]
    assert len(set(tokens)) == 1200
    s = await q.stats()
    assert (s.pending, s.leased, s.counters["leased"]) == (0, 1200, 1200)
    # Every worker's leases are its own: acking with another worker's name is refused.
    (wa, [a, *_]), (_, [b, *_]) = [r for r in results if r[1]][:2]
    assert await q.ack(wa + "x", [(a, "ok")]) == [Code.STALE]
    assert await q.ack(wa, [(a, "ok"), (b, "ok")]) == [Code.OK, Code.STALE]


async def test_lease_more_than_lua_can_unpack(redis_client: aioredis.Redis, crawl_name: str
                                              ) -> None:
    """Regression: a lease of > ~4000 tasks overflowed unpack() after popping them (lost)."""
    q = await open_queue(redis_client, crawl_name)
    tasks = many(5_000)
    for i in range(0, 5_000, 1_000):
        await q.enqueue(tasks[i:i + 1_000])
    leases = await q.lease("big", 4_500, 60_000)
    assert len(leases) == 4_500 == len({x.id for x in leases})
    s = await q.stats()
    assert (s.pending, s.leased) == (500, 4_500)
    assert await q.ack("big", [(x, "ok") for x in leases]) == [Code.OK] * 4_500
    assert_conserved(await q.stats())


async def test_ack_batch_mixes_successes_repeats_and_refusals(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """One ack call answers each item as a lone ack would; a repeated item counts once."""
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt(f"http://ackbatch.test/{i}") for i in range(4)])
    a, b, c = await q.lease("w", 3, 30_000)
    short = await lease_one(q, "w", 100)
    await expire(q, short)
    forged = Lease(c.task, c.partition, str(int(c.token) + 1000), c.deadline_ms)
    codes = await q.ack("w", [(a, "ok"), (b, "http_4xx"), (a, "ok"), (short, "ok"),
                              (forged, "ok"), (c, "ok")])
    assert codes == [Code.OK, Code.OK, Code.UNKNOWN, Code.EXPIRED, Code.STALE, Code.OK]
    assert [await q.state_of(x.id) for x in (a, b, c, short)] == [
        "done", "done", "done", "leased"]
    pk = q.partitions[0]
    assert await redis_client.hkeys(pk.tasks) == [short.id.encode()]
    assert set(await redis_client.hkeys(pk.owners)) == {HASHTABLE_FIELD.encode(),
                                                        short.id.encode()}
    s = await q.stats()
    assert (s.counters["done"], s.counters["stale"]) == (3, 3)
    assert (s.counters["outcome:ok"], s.counters["outcome:http_4xx"]) == (2, 1)
    assert_conserved(s)


async def test_in_flight_hashes_are_hashtables_from_the_first_lease(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """owners/attempts of a few hundred fields must not be listpacks (a scan per access)."""
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt(f"http://enc.test/{i}") for i in range(300)])
    pk = q.partitions[0]
    leases = await q.lease("w", 1, 30_000)
    for key in (pk.owners, pk.attempts):
        assert await redis_client.object("encoding", key) == b"hashtable"
        assert await redis_client.hget(key, HASHTABLE_FIELD) == b"1"
    leases += await q.lease("w", 299, 30_000)
    assert await q.ack("w", [(x, "ok") for x in leases]) == [Code.OK] * 300
    for key in (pk.owners, pk.attempts):  # the field stays: no re-conversion on the next lease
        assert await redis_client.hkeys(key) == [HASHTABLE_FIELD.encode()]
    # The dedup hashes stay compact listpacks: their memory per URL depends on it.
    seen = await redis_client.keys(pk.seen(0)[:-1] + "*")
    assert await redis_client.object("encoding", seen[0]) in (b"listpack", b"ziplist")
    assert_conserved(await q.stats())


async def test_priority_then_fifo(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    spec = [("a", 0), ("b", 0), ("c", 5), ("d", 9), ("e", 5), ("f", 0), ("g", 1), ("h", 0)]
    await q.enqueue([nt(f"http://prio.test/{name}", priority=p) for name, p in spec])
    order = [(await lease_one(q)).task for _ in spec]
    assert [t.priority for t in order] == [9, 5, 5, 1, 0, 0, 0, 0]
    assert [t.url.rsplit("/", 1)[1] for t in order[4:]] == ["a", "b", "f", "h"]
    assert await q.lease("w1", 1, 1_000) == []


async def test_priority_order_within_one_lease(redis_client: aioredis.Redis, crawl_name: str
                                               ) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt(f"http://prio.test/{i}", priority=i % 4) for i in range(12)])
    leases = await q.lease("w", 12, 10_000)
    prios = [x.task.priority for x in leases]
    assert prios == sorted(prios, reverse=True) and len(prios) == 12
    assert [x.task.url for x in leases if x.task.priority == 0] == [
        f"http://prio.test/{i}" for i in (0, 4, 8)]


# ------------------------------------------------------------------------- stale / expired


async def test_stale_token_is_refused_everywhere(redis_client: aioredis.Redis, crawl_name: str
                                                 ) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://stale.test/1")])
    old = await lease_one(q, "A", 200)
    await expire(q, old)
    assert await q.reclaim() == (1, 0)
    # Reclaimed but not re-leased: nobody holds it.
    assert set((await all_ops(q, "A", old)).values()) == {Code.UNKNOWN}
    new = await lease_one(q, "B", 30_000)
    assert new.id == old.id and new.token != old.token and new.task.attempt == 2
    codes = await all_ops(q, "A", old)
    assert codes == dict.fromkeys(codes, Code.STALE), codes
    # The same worker name with its old token is just as stale (the token fences it).
    same = await all_ops(q, "B", old)
    assert same == dict.fromkeys(same, Code.STALE), same
    # The refused calls changed nothing: B still holds the task, unchanged.
    pk = q.partitions[0]
    assert int(await redis_client.zscore(pk.leases, new.id)) == new.deadline_ms
    assert not await redis_client.hexists(pk.checkpoints, new.id)
    assert await redis_client.hget(pk.attempts, new.id) == b"2"
    s = await q.stats()
    assert s.counters["stale"] == 3 * 5  # five refusals counted `stale` per all_ops ...
    assert s.counters["lost"] == 3  # ... and renew's, counted `lost`
    assert await q.ack("B", [(new, "ok")]) == [Code.OK]
    assert await q.state_of(new.id) == "done"


async def test_expired_lease_is_refused_before_reclaim(redis_client: aioredis.Redis,
                                                       crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://expired.test/1")])
    lease = await lease_one(q, "A", 200)
    await expire(q, lease)
    codes = await all_ops(q, "A", lease)
    assert codes == dict.fromkeys(codes, Code.EXPIRED), codes
    # Nothing moved: the expired lease is still there for reclaim to take.
    assert await q.state_of(lease.id) == "leased"
    assert await q.reclaim() == (1, 0)
    assert await q.state_of(lease.id) == "pending"


async def test_reclaim_only_after_expiry(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue(many(3, "r"))
    first = await lease_one(q, "A", 600)
    long = await lease_one(q, "A", 60_000)
    assert await q.reclaim() == (0, 0)
    assert await q.state_of(first.id) == "leased"
    await expire(q, first)
    assert await q.reclaim() == (1, 0)
    assert await q.reclaim() == (0, 0)
    assert await q.state_of(long.id) == "leased"
    # Reclaimed work goes to the head of the line, ahead of the never-leased task.
    pk = q.partitions[0]
    assert (await redis_client.lindex(pk.ready, 0)).decode() == first.id
    again = await lease_one(q, "B")
    assert again.id == first.id and again.task.attempt == 2
    s = await q.stats()
    assert s.counters["reclaimed"] == 1 and "stalled" not in s.counters


async def test_reclaim_pages_through_many(redis_client: aioredis.Redis, crawl_name: str
                                          ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    await q.enqueue(many(50, "pg"))
    leases = await q.lease("A", 50, 200)
    assert len(leases) == 50
    await expire(q, *leases)
    assert await q.reclaim(limit=7) == (50, 0)
    s = await q.stats()
    assert (s.pending, s.leased) == (50, 0)


async def test_stall_limit_dead_letters_on_third_reclaim(redis_client: aioredis.Redis,
                                                         crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name,
                         policy=RetryPolicy(max_stalls=2))
    await q.enqueue([nt("http://poison.test/1", max_attempts=10)])
    for round_ in (1, 2, 3):
        lease = await lease_one(q, "A", 150)
        assert lease.task.attempt == round_
        await expire(q, lease)
        reclaimed, died = await q.reclaim()
        assert (reclaimed, died) == ((1, 0) if round_ < 3 else (0, 1))
    assert await q.state_of(lease.id) == "dead"
    [dead] = await q.dead_list()
    assert (dead.id, dead.reason, dead.attempts) == (lease.id, "stalled", 3)
    assert "3 times" in dead.message
    s = await q.stats()
    assert s.dead_reasons == {"stalled": 1}
    assert (s.counters["stalled"], s.counters["dead"], s.counters["reclaimed"]) == (1, 1, 2)
    assert_conserved(s)


async def test_renew_extends_and_reports_lost(redis_client: aioredis.Redis, crawl_name: str
                                              ) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue(many(4, "renew"))
    keep = await lease_one(q, "A", 30_000)
    done = await lease_one(q, "A", 30_000)
    short = await lease_one(q, "A", 100)
    stolen = await lease_one(q, "A", 100)
    pk = q.partitions[0]
    before = await redis_client.zscore(pk.leases, keep.id)
    assert before == keep.deadline_ms
    assert await q.ack("A", [(done, "ok")]) == [Code.OK]
    await expire(q, short, stolen)
    assert await q.reclaim() == (2, 0)
    # Reclaimed to the head: `stolen` (the later deadline or larger id) comes back too.
    back = await q.lease("B", 2, 60_000)
    assert {x.id for x in back} == {short.id, stolen.id}
    assert await q.release("B", [x for x in back if x.id == short.id]) == [Code.OK]

    lost = await q.renew("A", [keep, done, short, stolen], 60_000)
    assert {(x.id, c) for x, c in lost} == {
        (done.id, Code.UNKNOWN), (short.id, Code.UNKNOWN), (stolen.id, Code.STALE)}
    after = await redis_client.zscore(pk.leases, keep.id)
    assert after >= before + 25_000
    assert keep.deadline_ms == int(after)
    s = await q.stats()
    assert (s.counters["renewed"], s.counters["lost"]) == (1, 3)
    # An expired (not yet reclaimed) lease is reported EXPIRED and not extended.
    lapsed = await lease_one(q, "C", 100)
    await expire(q, lapsed)
    [(x, code)] = await q.renew("C", [lapsed], 5_000)
    assert (x.id, code) == (lapsed.id, Code.EXPIRED)
    assert await redis_client.zscore(pk.leases, lapsed.id) == lapsed.deadline_ms
    assert await q.renew("C", [], 5_000) == []


# ------------------------------------------------------------------------- fail / backoff


async def test_backoff_delays_exact_with_full_jitter(redis_client: aioredis.Redis,
                                                     crawl_name: str) -> None:
    policy = RetryPolicy(base_ms=20, cap_ms=100)
    q = await open_queue(redis_client, crawl_name, policy=policy, jitter=lambda: 1.0)
    await q.enqueue([nt("http://backoff.test/1", max_attempts=6)])
    pk = q.partitions[0]
    expected = [20, 40, 80, 100, 100]  # base * 2^(attempt-1), capped at cap_ms
    for attempt, want in enumerate(expected, start=1):
        lease = await lease_one(q)
        assert lease.task.attempt == attempt
        before = await redis_ms(redis_client)
        [(code, delay)] = await q.fail("w1", [Failure(lease, "http_503", f"try {attempt}")])
        after = await redis_ms(redis_client)
        assert (code, delay) == (Code.RETRY, want)
        # Due exactly `want` ms after the script's Redis TIME, which lies in [before, after].
        due = await redis_client.zscore(pk.delayed, lease.id)
        assert before + want <= due <= after + want, (attempt, due - before)
        assert await q.state_of(lease.id) == "waiting"
        await asyncio.sleep(want / 1000 + 0.01)
        assert (await q.promote())[0] == 1
    lease = await lease_one(q)
    assert lease.task.attempt == 6 and lease.task.last_error == "http_503 try 5"
    assert await q.fail("w1", [Failure(lease, "http_503", "last")]) == [(Code.DEAD, -1)]
    [dead] = await q.dead_list()
    assert (dead.reason, dead.message, dead.attempts) == ("http_503", "last", 6)
    s = await q.stats()
    assert (s.counters["failed"], s.counters["retried"], s.counters["dead"]) == (6, 5, 1)


async def test_backoff_jitter_scales_the_delay(redis_client: aioredis.Redis, crawl_name: str
                                               ) -> None:
    policy = RetryPolicy(base_ms=1_000, cap_ms=600_000)
    zero = await open_queue(redis_client, crawl_name, policy=policy, jitter=lambda: 0.0)
    half = CrawlQueue(redis_client, crawl_name, zero.settings, policy=policy,
                      jitter=lambda: 0.5)
    await zero.enqueue([nt("http://jitter.test/1", max_attempts=5)])
    lease = await lease_one(zero)
    assert await zero.fail("w1", [Failure(lease, "e", "m")]) == [(Code.RETRY, 0)]
    assert (await zero.promote())[0] == 1  # due at once
    lease = await lease_one(half)
    assert lease.task.attempt == 2
    before = await redis_ms(redis_client)
    assert await half.fail("w1", [Failure(lease, "e", "m")]) == [(Code.RETRY, 1_000)]
    due = await redis_client.zscore(half.partitions[0].delayed, lease.id)
    assert before + 1_000 <= due <= await redis_ms(redis_client) + 1_000
    moved, next_due = await half.promote()
    assert moved == 0 and due - await redis_ms(redis_client) <= next_due <= 1_000


async def test_retry_after_is_honoured_and_capped(redis_client: aioredis.Redis, crawl_name: str
                                                  ) -> None:
    policy = RetryPolicy(base_ms=20, cap_ms=100, max_retry_after_ms=3_000)
    q = await open_queue(redis_client, crawl_name, policy=policy, jitter=lambda: 1.0)
    await q.enqueue(many(3, "ra"))
    pk = q.partitions[0]
    leases = await q.lease("w1", 3, 10_000)
    before = await redis_ms(redis_client)
    results = await q.fail("w1", [
        Failure(leases[0], "http_429", "slow down", retry_after=3_600.0),  # over the cap
        Failure(leases[1], "http_429", "slow down", retry_after=1.5),      # over the backoff
        Failure(leases[2], "http_503", "now", retry_after=0.0),
    ])
    after = await redis_ms(redis_client)
    assert results == [(Code.RETRY, 3_000), (Code.RETRY, 1_500), (Code.RETRY, 0)]
    for lease, want in zip(leases, (3_000, 1_500, 0), strict=True):
        due = await redis_client.zscore(pk.delayed, lease.id)
        assert before + want <= due <= after + want, (want, due - before)
    assert (await q.promote())[0] == 1


async def test_max_attempts_then_dead(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, jitter=lambda: 0.0)
    await q.enqueue([nt("http://max.test/1", max_attempts=2)])
    lease = await lease_one(q)
    assert await q.fail("w1", [Failure(lease, "timeout", "t1")]) == [(Code.RETRY, 0)]
    await q.promote()
    lease = await lease_one(q)
    assert lease.task.attempt == 2
    assert await q.fail("w1", [Failure(lease, "timeout", "t2")]) == [(Code.DEAD, -1)]
    assert await q.state_of(lease.id) == "dead"
    assert (await q.stats()).dead_reasons == {"timeout": 1}


async def test_permanent_failure_is_dead_at_once(redis_client: aioredis.Redis, crawl_name: str
                                                 ) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://perm.test/1", max_attempts=9)])
    lease = await lease_one(q)
    [(code, delay)] = await q.fail("w1", [Failure(lease, "robots disallowed", "no",
                                                  retry_after=5.0, permanent=True)])
    assert (code, delay) == (Code.DEAD, -1)
    [dead] = await q.dead_list()
    # The reason is squeezed to one word; attempts stay as counted.
    assert (dead.reason, dead.message, dead.attempts) == ("robotsdisallowed", "no", 1)
    assert (dead.url, dead.partition) == ("http://perm.test/1", 0)
    assert codec.loads(dead.raw or b"")["url"] == "http://perm.test/1"


# ------------------------------------------------------------------------- release / defer


async def test_release_goes_to_the_head_without_an_attempt(redis_client: aioredis.Redis,
                                                           crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([*many(3, "rel"), nt("http://rel.test/prio", priority=3)])
    top = await lease_one(q)
    assert top.task.priority == 3
    a = await lease_one(q)
    assert a.task.url.endswith("/rel/0")
    assert await q.release("w1", [a, top]) == [Code.OK, Code.OK]
    # The priority task goes back to `prio`, the other to the head of `ready`.
    pk = q.partitions[0]
    assert (await redis_client.lindex(pk.ready, 0)).decode() == a.id
    assert await redis_client.zscore(pk.prio, top.id) == -3
    again = await q.lease("w2", 2, 10_000)
    assert [x.id for x in again] == [top.id, a.id]
    assert [x.task.attempt for x in again] == [1, 1]
    s = await q.stats()
    assert (s.counters["released"], s.counters["leased"]) == (2, 4)
    assert await q.release("w1", [a]) == [Code.STALE]


async def test_defer_waits_without_an_attempt(redis_client: aioredis.Redis, crawl_name: str
                                              ) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://defer.test/1"), nt("http://defer.test/2")])
    lease = await lease_one(q)
    before = await redis_ms(redis_client)
    assert await q.defer("w1", [(lease, 400)]) == [Code.OK]
    after = await redis_ms(redis_client)
    assert await q.state_of(lease.id) == "waiting"
    pk = q.partitions[0]
    assert before + 400 <= await redis_client.zscore(pk.delayed, lease.id) <= after + 400
    moved, next_due = await q.promote()
    assert moved == 0 and 0 < next_due <= 400
    other = await lease_one(q)  # the deferred task is not leasable meanwhile
    assert other.id != lease.id and await q.lease("w1", 1, 1_000) == []
    await asyncio.sleep(next_due / 1000 + 0.02)
    assert await q.promote() == (1, -1)
    again = await lease_one(q)
    assert again.id == lease.id and again.task.attempt == 1
    s = await q.stats()
    assert (s.counters["deferred"], s.counters["promoted"]) == (1, 1)
    assert "failed" not in s.counters
    with pytest.raises(ResponseError, match="delay_ms"):
        await q.scripts.defer(keys=[pk.leases, pk.owners, pk.attempts, pk.delayed, pk.stats],
                              args=["w1", again.id, again.token, -5])
    assert await q.state_of(again.id) == "leased"


async def test_promote_moves_only_due_tasks_in_limit_pages(redis_client: aioredis.Redis,
                                                           crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue(many(12, "prom"))
    leases = await q.lease("w1", 12, 10_000)
    await q.defer("w1", [(x, 0) for x in leases[:10]] + [(x, 60_000) for x in leases[10:]])
    moved, next_due = await q.promote(limit=3)
    assert moved == 10 and 59_000 < next_due <= 60_000
    s = await q.stats()
    assert (s.pending, s.waiting) == (10, 2)
    assert (await q.promote())[0] == 0


# ------------------------------------------------------------------------- checkpoints


async def test_checkpoint_survives_a_reclaim_and_is_dropped_on_ack(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://cp.test/1")])
    lease = await lease_one(q, "A", 200)
    assert await q.checkpoint("A", lease, {"page": 3, "cursor": "x"}) == Code.OK
    assert lease.task.checkpoint == {"page": 3, "cursor": "x"}
    await expire(q, lease)
    await q.reclaim()
    again = await lease_one(q, "B")
    assert again.task.checkpoint == {"page": 3, "cursor": "x"}
    assert await q.checkpoint("A", lease, {"page": 99}) == Code.STALE
    assert await q.ack("B", [(again, "ok")]) == [Code.OK]
    assert not await redis_client.hexists(q.partitions[0].checkpoints, again.id)
    assert (await q.stats()).counters["checkpoints"] == 1


# ------------------------------------------------------------------------- dedup


async def test_exact_dedup_within_and_across_batches(redis_client: aioredis.Redis,
                                                     crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    a, b = nt("http://dedup.test/a"), nt("http://dedup.test/b")
    res = await q.enqueue([a, a, b, nt("HTTP://DEDUP.test:80/a#x")])
    assert (res.enqueued, res.duplicates) == (2, 2)
    res = await q.enqueue([nt("http://dedup.test/b", priority=7), nt("http://dedup.test/c")])
    assert (res.enqueued, res.duplicates) == (1, 1)
    # A done URL stays seen (no recrawl window).
    for lease in await q.lease("w", 3, 10_000):
        await q.ack("w", [(lease, "ok")])
    res = await q.enqueue([a, b])
    assert (res.enqueued, res.duplicates) == (0, 2)
    s = await q.stats()
    assert (s.counters["enqueued"], s.counters["duplicates"], s.done) == (3, 5, 3)


async def test_exact_dedup_across_partitions(redis_client: aioredis.Redis, crawl_name: str
                                             ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=4))
    first = many(200, "parts")
    res = await q.enqueue(first)
    assert (res.enqueued, res.duplicates) == (200, 0)
    sizes = [await redis_client.hlen(pk.tasks) for pk in q.partitions]
    assert sum(sizes) == 200 and min(sizes) > 20, sizes
    for t in first:  # each task lives in the partition its fingerprint names
        pk = q.partitions[q.partition_of_id(task_id(t.fp))]
        assert await redis_client.hexists(pk.tasks, task_id(t.fp))
    mixed = first + many(50, "parts-new") + first[:10]
    random.Random(3).shuffle(mixed)
    res = await q.enqueue(mixed)
    assert (res.enqueued, res.duplicates) == (50, 210)
    s = await q.stats()
    assert (s.pending, s.counters["enqueued"], s.counters["duplicates"]) == (250, 250, 210)


@pytest.mark.parametrize("bits", [4, 16, 24])
async def test_exact_dedup_any_seen_bits(redis_client: aioredis.Redis, crawl_name: str,
                                         bits: int) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(seen_bits=bits))
    tasks = many(300, "bits")
    assert (await q.enqueue(tasks)).enqueued == 300
    assert (await q.enqueue(tasks)).duplicates == 300
    prefix = q.partitions[0].seen(0)[:-1]
    glob = "".join(f"\\{c}" if c in "[]{}*?\\" else c for c in prefix) + "*"
    buckets = [k async for k in redis_client.scan_iter(match=glob, count=1000)]
    assert 1 <= len(buckets) <= min(300, 2 ** bits)


async def test_bloom_dedup_grows_layers_without_false_negatives(redis_client: aioredis.Redis,
                                                                crawl_name: str) -> None:
    settings = CrawlSettings(dedup=DedupMode.BLOOM, bloom_capacity=500, bloom_error=1e-2,
                             bloom_layers=8)
    q = await open_queue(redis_client, crawl_name, settings)
    pk = q.partitions[0]
    inserted = many(5_000, "bloom")
    warnings: list[int] = []
    for i in range(0, len(inserted), 500):
        res = await q.enqueue(inserted[i:i + 500])
        warnings += res.bloom_warnings
    assert int(await redis_client.hget(pk.bloom, "layers")) == 4  # 500+1000+2000 < 5000
    assert warnings == [0, 1, 2]  # each full layer warned once, at 80%
    # No false negatives, ever: every URL enqueued before is a duplicate now.
    res = await q.enqueue(inserted)
    assert (res.enqueued, res.duplicates) == (0, 5_000)
    # False positives: fresh URLs wrongly seen as duplicates, under the target rate.
    # Layer L is built for error/2^(L+1), so the compound rate tends to `error` from
    # below as layers fill; the bound allows 3 standard deviations of a 20k sample.
    fresh = many(20_000, "fresh")
    dups = 0
    for i in range(0, len(fresh), 1_000):
        dups += (await q.enqueue(fresh[i:i + 1_000])).duplicates
    assert 0 < dups / len(fresh) < 1e-2 + 3 * math.sqrt(1e-2 / len(fresh)), dups
    assert int(await redis_client.hget(pk.bloom, "layers")) == 6
    for layer in range(5):  # each full layer is about half ones: sized for its capacity
        capacity = 500 * 2 ** layer
        assert int(await redis_client.hget(pk.bloom, f"count:{layer}")) == capacity
        bits = 8 * await redis_client.strlen(pk.bloom_layer(layer))
        m = math.ceil(-capacity * math.log(1e-2 / 2 ** (layer + 1)) / math.log(2) ** 2)
        assert m <= bits < m + 8
        assert 0.48 < await redis_client.bitcount(pk.bloom_layer(layer)) / m < 0.55
    s = await q.stats()
    assert s.counters["enqueued"] == s.pending == await redis_client.hlen(pk.tasks)
    assert s.counters["enqueued"] + s.counters["duplicates"] == 5_000 + 5_000 + 20_000


async def test_bloom_full_refuses_the_batch_before_any_write(redis_client: aioredis.Redis,
                                                             crawl_name: str) -> None:
    settings = CrawlSettings(dedup=DedupMode.BLOOM, bloom_capacity=10, bloom_layers=1)
    q = await open_queue(redis_client, crawl_name, settings)
    assert (await q.enqueue(many(8, "full"))).enqueued == 8
    with pytest.raises(ResponseError, match="bloom filter full"):
        await q.enqueue(many(5, "more"))
    s = await q.stats()
    assert (s.pending, s.counters["enqueued"]) == (8, 8)
    with pytest.raises(ConfigError):
        await CrawlQueue(redis_client, crawl_name, settings, recrawl_after_s=5).enqueue(
            many(1, "x"))


async def test_recrawl_after_window(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, recrawl_after_s=1)
    names = ("done", "dead", "waiting", "leased", "pending")
    tasks = {n: nt(f"http://recrawl.test/{n}") for n in names}
    await q.enqueue(list(tasks.values()))
    ls = {x.task.url.rsplit("/", 1)[1]: x for x in await q.lease("w", 4, 60_000)}
    assert set(ls) == {"done", "dead", "waiting", "leased"}
    assert await q.ack("w", [(ls["done"], "ok")]) == [Code.OK]
    assert await q.fail("w", [Failure(ls["dead"], "gone", "", permanent=True),
                              Failure(ls["waiting"], "e", "m", retry_after=60.0)]
                        ) == [(Code.DEAD, -1), (Code.RETRY, 60_000)]
    assert (await q.enqueue([tasks["done"]])).duplicates == 1  # inside the window
    await asyncio.sleep(1.1)
    res = await q.enqueue(list(tasks.values()))
    # Only the done URL is enqueued again; the live ones (pending, leased, waiting,
    # dead: their bodies are still in `tasks`) are not.
    assert (res.enqueued, res.recrawled, res.duplicates) == (1, 1, 4)
    states = {n: await q.state_of(task_id(t.fp)) for n, t in tasks.items()}
    assert states == {"done": "pending", "dead": "dead", "waiting": "waiting",
                      "leased": "leased", "pending": "pending"}
    again = {x.id: x for x in await q.lease("w2", 10, 60_000)}
    assert again[task_id(tasks["done"].fp)].task.attempt == 1
    s = await q.stats()
    assert (s.counters["enqueued"], s.counters["recrawled"], s.done) == (6, 1, 1)
    assert_conserved(s)


async def test_recrawl_after_purge(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, recrawl_after_s=1)
    t = nt("http://recrawl.test/purged")
    await q.enqueue([t])
    lease = await lease_one(q)
    await q.fail("w1", [Failure(lease, "gone", "", permanent=True)])
    assert await q.dead_purge([lease.id]) == 1
    assert (await q.enqueue([t])).duplicates == 1
    await asyncio.sleep(1.1)
    assert (await q.enqueue([t])).recrawled == 1
    assert_conserved(await q.stats())


# ------------------------------------------------------------------------- dead letters


async def _make_dead(q: CrawlQueue, reasons: Sequence[str]) -> list[Lease]:
    await q.enqueue([nt(f"http://dead.test/{i}") for i in range(len(reasons))])
    leases = await q.lease("w", len(reasons), 60_000)
    by_url = sorted(leases, key=lambda x: x.task.url)
    codes = await q.fail("w", [Failure(x, r, f"msg {i}", permanent=True)
                               for i, (x, r) in enumerate(zip(by_url, reasons, strict=True))])
    assert [c for c, _ in codes] == [Code.DEAD] * len(reasons)
    return by_url


async def test_dead_list_requeue_and_purge(redis_client: aioredis.Redis, crawl_name: str
                                           ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    dead = await _make_dead(q, ["http_404", "http_404", "http_410", "dns", "dns"])
    listed = await q.dead_list()
    assert sorted(d.id for d in listed) == sorted(x.id for x in dead)
    d404 = await q.dead_list(reason="http_404")
    assert sorted(d.url or "" for d in d404) == ["http://dead.test/0", "http://dead.test/1"]
    assert {d.message for d in d404} == {"msg 0", "msg 1"}
    assert all(d.attempts == 1 and d.raw for d in d404)
    assert len(await q.dead_list(limit=2)) == 2
    s = await q.stats()
    assert s.dead_reasons == {"http_404": 2, "http_410": 1, "dns": 2}

    # Requeue by reason: the tasks lease again with attempt 1, their last error kept.
    assert await q.dead_requeue(await q.dead_ids("dns")) == 2
    assert await q.dead_requeue(await q.dead_ids("dns")) == 0
    again = await q.lease("w2", 10, 60_000)
    assert sorted(x.task.url for x in again) == ["http://dead.test/3", "http://dead.test/4"]
    assert {x.task.attempt for x in again} == {1}
    assert {x.task.last_error for x in again} == {"dns msg 3", "dns msg 4"}
    # Requeue bypassed dedup: the URL is still seen.
    assert (await q.enqueue([nt("http://dead.test/3")])).duplicates == 1
    assert (await q.stats()).dead_reasons == {"http_404": 2, "http_410": 1}

    # Requeue by id, and a non-dead id is refused.
    assert await q.dead_requeue([dead[2].id, again[0].id]) == 1
    # Purge: gone for good, still seen.
    ids404 = await q.dead_ids("http_404")
    assert await q.dead_purge([*ids404, again[1].id]) == 2
    for i in ids404:
        assert await q.state_of(i) == "done"
        pk = q.partitions[q.partition_of_id(i)]
        for key in (pk.tasks, pk.errors, pk.attempts):
            assert not await redis_client.hexists(key, i)
    assert (await q.enqueue([nt("http://dead.test/0")])).duplicates == 1
    s = await q.stats()
    assert s.dead == 0 and s.dead_reasons == {}
    assert (s.counters["requeued"], s.counters["purged"]) == (3, 2)
    assert_conserved(s)


@pytest.mark.parametrize(("fields", "error"), [
    ({"depth": -1}, "depth"),
    ({"max_attempts": True}, "boolean"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"url": "ftp://x/"}, "http"),
    ({"meta": []}, "meta"),
    ({"id": 7}, "id"),
])
def test_decode_task_checks_every_field_of_a_full_body(fields: dict[str, Any],
                                                        error: str) -> None:
    body = {"id": "a" * 32, "url": "http://d.test/", "max_attempts": 3, "priority": 0,
            "enqueued_at": 1.5, "meta": {}, "depth": 0}
    assert decode_task(codec.dumps(body)).url == "http://d.test/"
    with pytest.raises(MalformedTaskError, match=error):
        decode_task(codec.dumps({**body, **fields}))


def test_decode_task_fills_defaults_and_widens_ints() -> None:
    task = decode_task(b'{"id": "x", "url": "https://d.test/", "enqueued_at": 2}', attempt=4)
    assert (task.max_attempts, task.priority, task.depth, task.meta) == (3, 0, 0, {})
    assert task.enqueued_at == 2.0 and isinstance(task.enqueued_at, float)
    assert task.attempt == 4


async def test_malformed_bodies_end_dead_with_raw_bytes(redis_client: aioredis.Redis,
                                                        crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    pk = q.partitions[0]
    good = nt("http://mal.test/good")
    await q.enqueue([good])
    garbage = b"\xff{not json"
    bad_id = tid("http://mal.test/bad-id")
    bodies = {
        tid("http://mal.test/garbage"): garbage,
        tid("http://mal.test/schema"): b'{"id": "x", "url": 5, "max_attempts": "many"}',
        tid("http://mal.test/list"): b"[1, 2, 3]",
        bad_id: codec.dumps({"id": tid("http://mal.test/other"),
                             "url": "http://mal.test/bad-id"}).encode(),
        tid("http://mal.test/badurl"): codec.dumps({"id": tid("http://mal.test/badurl"),
                                                    "url": "ftp://x"}).encode(),
    }
    for i, body in bodies.items():
        await redis_client.hset(pk.tasks, i, body)
        await redis_client.rpush(pk.ready, i)
    leases = await q.lease("w", 10, 60_000)
    assert [x.id for x in leases] == [task_id(good.fp)]
    dead = {d.id: d for d in await q.dead_list(reason=MALFORMED)}
    assert set(dead) == set(bodies)
    for i, body in bodies.items():
        assert dead[i].raw == body  # the exact bytes, kept for a human to look at
        assert dead[i].reason == MALFORMED and dead[i].message
        assert await q.state_of(i) == "dead"
    assert "id" in dead[bad_id].message
    s = await q.stats()
    assert s.dead_reasons == {MALFORMED: len(bodies)}
    assert (s.dead, s.leased, s.pending) == (len(bodies), 1, 0)
    # Requeued, they come back dead again (never a crash); purged, they are gone.
    assert await q.dead_requeue(list(bodies)) == len(bodies)
    assert await q.lease("w", 10, 60_000) == []
    assert (await q.stats()).dead_reasons == {MALFORMED: len(bodies)}
    assert await q.dead_purge(list(bodies)) == len(bodies)
    assert not any([await redis_client.hexists(pk.tasks, i) for i in bodies])


async def test_malformed_checkpoint_is_dead_not_a_crash(redis_client: aioredis.Redis,
                                                        crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://mal.test/cp")])
    pk = q.partitions[0]
    i = tid("http://mal.test/cp")
    await redis_client.hset(pk.checkpoints, i, b"{broken")
    assert await q.lease("w", 1, 60_000) == []
    [d] = await q.dead_list()
    assert (d.id, d.reason, d.url) == (i, MALFORMED, "http://mal.test/cp")


# ------------------------------------------------------------------------- stats / open


async def test_stats_counters_add_up(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=3),
                         jitter=lambda: 1.0)
    await q.enqueue(many(20, "stats") + many(5, "stats"))
    ls = await q.lease("w", 9, 60_000)
    await q.ack("w", [(ls[0], "ok"), (ls[1], "ok"), (ls[2], "http_404")])
    await q.fail("w", [Failure(ls[3], "e", "m"), Failure(ls[4], "e", "m", permanent=True),
                       Failure(ls[5], "e", "m", permanent=True)])
    await q.defer("w", [(ls[6], 60_000)])
    await q.release("w", [ls[7]])
    assert await q.dead_purge([ls[5].id]) == 1
    s = await q.stats()
    c = s.counters
    assert (s.pending, s.leased, s.waiting, s.dead, s.done) == (12, 1, 2, 1, 3)
    assert c["enqueued"] == 20 and c["duplicates"] == 5 and c["purged"] == 1
    assert (c["leased"], c["failed"], c["retried"], c["dead"]) == (9, 3, 1, 2)
    assert (c["outcome:ok"], c["outcome:http_404"]) == (2, 1)
    assert (c["deferred"], c["released"]) == (1, 1)
    assert s.active == 15 and s.dead_reasons == {"e": 1}
    assert_conserved(s)


async def test_open_conflicting_settings(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await CrawlQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    assert len(q.partitions) == 2
    with pytest.raises(CrawlConflictError, match="partitions=2"):
        await CrawlQueue.open(redis_client, crawl_name, CrawlSettings(partitions=4))
    with pytest.raises(CrawlConflictError):
        await CrawlQueue.open(redis_client, crawl_name,
                              CrawlSettings(partitions=2, dedup=DedupMode.BLOOM))
    stored = await CrawlQueue.open(redis_client, crawl_name)
    assert stored.settings == CrawlSettings(partitions=2)
    assert (await CrawlQueue.existing(redis_client, crawl_name)).settings.partitions == 2
    with pytest.raises(ConfigError):
        await CrawlQueue.existing(redis_client, crawl_name + "-missing")
    for bad in ({"partitions": 0}, {"seen_bits": 3}, {"bloom_error": 1.0}, {"bloom_layers": 0}):
        with pytest.raises(ConfigError):
            CrawlSettings(**bad)


async def test_an_item_passed_twice_gets_a_code_per_occurrence(redis_client: aioredis.Redis,
                                                               crawl_name: str) -> None:
    """Regression: results were mapped by object identity, so [x, x] got x's last code."""
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    await q.enqueue(many(4, "twice"))
    a, b, c, d = await q.lease("w", 4, 60_000)
    assert await q.release("w", [a, b, a]) == [Code.OK, Code.OK, Code.UNKNOWN]
    item = (c, "ok")
    assert await q.ack("w", [item, item]) == [Code.OK, Code.UNKNOWN]
    f = Failure(d, "e", "m", permanent=True)
    assert await q.fail("w", [f, f]) == [(Code.DEAD, -1), (Code.UNKNOWN, -1)]
    s = await q.stats()
    assert (s.counters["released"], s.counters["done"], s.counters["stale"]) == (2, 1, 3)


async def test_lease_skips_a_partition_found_empty_only_briefly(redis_client: aioredis.Redis,
                                                                crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    start = time.monotonic()
    assert await q.lease("w", 5, 60_000) == []  # both partitions found empty
    await q.enqueue(many(6, "skip"))
    # Within the back-off window the empty partitions are not asked again ...
    second = await q.lease("w", 5, 60_000)
    if time.monotonic() - start < 0.05:  # (a loaded machine may be past the window)
        assert second == []
    # ... but nothing waits long: the window starts at 50 ms (doubling up to 1 s).
    await asyncio.sleep(0.15)
    got = await q.lease("w", 10, 60_000)
    assert len(got) + len(second) == 6
    s = await q.stats()
    assert (s.pending, s.leased) == (0, 6)
