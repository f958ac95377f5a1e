"""Every queue transition and its edge cases, against a real redis-server.

Each test works on its own crawl (``crawl_name``) of the session's server, and checks
what Redis holds (host queues, states, scores, counters), not only what the API returned.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ResponseError
from support.clock import expire, redis_ms, window_passed
from support.frontier import host_record, host_records, put_record
from support.leases import LeaseRecord, lease_record, lease_records

import common.queue.lease_client
from common.errors import ConfigError, CrawlConflictError, MalformedTaskError
from common.frontier.hosts import Frontier
from common.hostmodel.hostkey import host_key
from common.keys import HASHTABLE_FIELD, CrawlKeys
from common.queue import (
    MALFORMED,
    UNKNOWN_WAIT_S,
    Code,
    CrawlSettings,
    DedupMode,
    Failure,
    Lease,
    LeasingQueue,
    NewTask,
    RetryPolicy,
)
from common.tasks.task import (
    MAX_TASK_BYTES,
    Task,
    compact_entry,
    decode_entry,
    encode_entry,
    expand_entry,
    queued_id,
)
from common.urls.canonical import canonicalize, fingerprint, task_id

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


def many(n: int, prefix: str = "p", hosts: int = 1) -> list[NewTask]:
    """n tasks; on example.test, or spread round-robin over `hosts` hosts."""
    if hosts == 1:
        return [nt(f"http://example.test/{prefix}/{i}") for i in range(n)]
    return [nt(f"http://h{i % hosts}.{prefix}.test/{i}") for i in range(n)]


async def open_queue(client: aioredis.Redis, crawl: str, settings: CrawlSettings | None = None,
                     **kw: Any) -> LeasingQueue:
    return await LeasingQueue.open(client, crawl, settings or CrawlSettings(), **kw)


async def lease_one(q: LeasingQueue, worker: str = "w1", lease_ms: int = 30_000) -> Lease:
    leases = await q.lease(worker, 1, lease_ms)
    assert len(leases) == 1, leases
    return leases[0]


async def promoted_when_due(q: LeasingQueue, within: float = 10.0) -> int:
    """promote() until it moves something (a retry comes due on Redis' clock, which a
    wall-clock sleep only approximates); how many it moved."""
    deadline = time.monotonic() + within
    while not (moved := (await q.promote())[0]):
        assert time.monotonic() < deadline, f"no retry came due within {within:g}s"
        await asyncio.sleep(0.005)
    return moved


async def all_ops(q: LeasingQueue, worker: str, lease: Lease) -> dict[str, Code]:
    """Try every holder-only transition with one lease; each must be refused alike."""
    codes: dict[str, Code] = {}
    lost = await q.renew(worker, [lease], 10_000)
    codes["renew"] = lost[0][1] if lost else Code.OK
    codes["checkpoint"] = await q.checkpoint(worker, lease, {"page": 9})
    codes["release"] = (await q.release(worker, [lease]))[0]
    codes["fail"] = (await q.fail(worker, [Failure(lease, "x", "y")]))[0][0]
    codes["ack"] = (await q.ack(worker, [(lease, "ok")]))[0]
    return codes


def _ids(entries: Sequence[bytes]) -> list[str]:
    return [queued_id(e) for e in entries]


async def host_queue(client: aioredis.Redis, q: LeasingQueue, host: str) -> list[str]:
    """The ids pending in a host's FIFO (priority 0), head first."""
    pk = q.partitions[q.partition_of(host)]
    return _ids(await client.lrange(pk.host_queue(host), 0, -1))


async def host_prio(client: aioredis.Redis, q: LeasingQueue, host: str) -> dict[str, int]:
    """The ids pending in a host's priority ZSET, with their priorities."""
    pk = q.partitions[q.partition_of(host)]
    return {queued_id(e): int(-s) for e, s in
            await client.zrange(pk.host_prio(host), 0, -1, withscores=True)}


async def assert_frontier(client: aioredis.Redis, q: LeasingQueue) -> None:
    """Per partition: `pending` == entries in host queues == the records' queued counts ==
    h:queued; each record's inflight == its leases; `due` == the hosts with work and a free
    slot (no limits)."""
    for pk in q.partitions:
        records = await host_records(client, pk)
        queued = {h: r.queued for h, r in records.items()}
        index = {h.decode(): int(s) for h, s in
                 await client.zrange(pk.queued, 0, -1, withscores=True)}
        assert {h: n for h, n in index.items() if n} == {h: n for h, n in queued.items() if n}
        entries = {h: await client.llen(pk.host_queue(h)) + await client.zcard(pk.host_prio(h))
                   for h in queued}
        assert {h: n for h, n in entries.items() if n} == {h: n for h, n in queued.items() if n}
        assert int(await client.get(pk.pending) or 0) == sum(entries.values())
        leased = [m.decode() for m in await client.zrange(pk.leases, 0, -1)]
        per_host: dict[str, int] = {}
        for value in await client.hmget(pk.leased, leased) if leased else []:
            owner, _, host = value.split(b" ", 3)[:3]
            if not owner.startswith(b"f"):
                per_host[host.decode()] = per_host.get(host.decode(), 0) + 1
        inflight = {h: r.inflight for h, r in records.items() if r.inflight}
        assert inflight == per_host
        due = {h.decode() for h in await client.zrange(pk.due, 0, -1)}
        conc = int(await client.hget(pk.conf, "concurrency") or 0)
        assert due == {h for h, r in records.items()
                       if r.queued and (not conc or r.inflight < conc)
                       and r.delay is None and r.conc is None and r.budget is None
                       and not r.blocked}


async def _plant(client: aioredis.Redis, q: LeasingQueue, host: str, entries: list[bytes]
                 ) -> None:
    """Put raw entries at the tail of a host's queue, counted pending like enqueue does."""
    pk = q.partitions[q.partition_of(host)]
    await client.rpush(pk.host_queue(host), *entries)
    record = await host_record(client, pk, host)
    await put_record(client, pk, host, queued=record.queued + len(entries))
    await client.zadd(pk.queued, {host: record.queued + len(entries)})
    await client.incrby(pk.pending, len(entries))


def assert_conserved(stats: Any, dropped: int = 0) -> None:
    """Every enqueued task is in one state, done, purged, or (`dropped`) a second copy of
    a live URL that lease dropped."""
    c = stats.counters
    assert c.get("enqueued", 0) == (stats.pending + stats.leased + stats.waiting + stats.dead
                                    + c.get("done", 0) + c.get("purged", 0) + dropped), stats


# ------------------------------------------------------------------------- entries

ID = "0123456789abcdef" * 2


def test_entry_round_trip_keeps_only_fields_off_their_defaults() -> None:
    assert encode_entry(ID, "http://e.test/a") == ID + "http://e.test/a"
    plain = decode_entry((ID + "http://e.test/a").encode(), attempt=2, last_error="e m",
                         checkpoint={"k": 1})
    assert plain == Task(ID, "http://e.test/a", 2, last_error="e m", checkpoint={"k": 1})
    full = encode_entry(ID, "https://e.test/b?q=1", max_attempts=7, priority=4,
                        meta={"src": "sitemap", "ü": [1]}, depth=3)
    assert full.startswith(ID + "https://e.test/b?q=1 {")
    task = decode_entry(full)
    assert (task.id, task.url, task.max_attempts, task.priority, task.meta, task.depth,
            task.attempt) == (ID, "https://e.test/b?q=1", 7, 4, {"src": "sitemap", "ü": [1]},
                              3, 0)
    assert decode_entry(full.encode()) == task
    # Defaults given explicitly are not stored.
    assert encode_entry(ID, "http://e.test/", max_attempts=3, priority=0, meta={},
                        depth=0) == ID + "http://e.test/"


@pytest.mark.parametrize(("entry", "error"), [
    (ID[:31] + "http://e.test/", "32-hex-digit id"),
    (ID.upper() + "http://e.test/", "32-hex-digit id"),
    ("g" + ID[1:] + "http://e.test/", "32-hex-digit id"),
    ("", "32-hex-digit id"),
    (ID, "http"),
    (ID + "ftp://e.test/", "http"),
    (ID + "e.test/page", "http"),
    (ID + " http://e.test/", "http"),
    (ID + "http://e.test/ {nope", "not JSON"),
    (ID + "http://e.test/ [1, 2]", "JSON object"),
    (ID + 'http://e.test/ {"m": []}', "meta"),
    (ID + 'http://e.test/ {"a": 0}', "max_attempts"),
    (ID + 'http://e.test/ {"a": true}', "max_attempts"),
    (ID + 'http://e.test/ {"a": "3"}', "max_attempts"),
    (ID + 'http://e.test/ {"a": 2.5}', "max_attempts"),
    (ID + 'http://e.test/ {"p": -1}', "priority"),
    (ID + 'http://e.test/ {"p": false}', "priority"),
    (ID + 'http://e.test/ {"d": -2}', "depth"),
    (ID + 'http://e.test/ {"d": null}', "depth"),
])
def test_decode_entry_rejects_every_malformed_entry(entry: str, error: str) -> None:
    with pytest.raises(MalformedTaskError, match=error):
        decode_entry(entry)
    with pytest.raises(MalformedTaskError, match=error):
        decode_entry(entry.encode())


def test_decode_entry_rejects_bytes_not_utf8_and_entries_too_long() -> None:
    with pytest.raises(MalformedTaskError, match="UTF-8"):
        decode_entry(ID.encode() + b"http://e.test/\xff")
    long = ID + "http://e.test/" + "a" * MAX_TASK_BYTES
    with pytest.raises(MalformedTaskError, match="bytes, over"):
        decode_entry(long)
    fits = ID + "http://e.test/" + "a" * (MAX_TASK_BYTES - len(ID) - len("http://e.test/"))
    assert decode_entry(fits).url.endswith("a")


# ------------------------------------------------------------------------- enqueue + lease


async def test_enqueue_lease_ack_round_trip(redis_client: aioredis.Redis, crawl_name: str
                                            ) -> None:
    q = await open_queue(redis_client, crawl_name)
    task = nt("HTTP://Example.TEST:80/a/./b#frag", meta={"k": "v"}, depth=2)
    res = await q.enqueue([task])
    assert (res.enqueued, res.duplicates, res.recrawled) == (1, 0, 0)
    i = task_id(task.fp)
    assert await q.state_of(i) == await q.state_of(i, task.url) == "pending"
    pk = q.partitions[0]
    # A pending task is one entry in its host's queue and nothing else: compact, its id's
    # 16 bytes and ":" for http://<its host>.
    assert await redis_client.lrange(pk.host_queue("example.test"), 0, -1) == [
        bytes.fromhex(i) + b':/a/b {"m":{"k":"v"},"d":2}']
    assert await redis_client.hlen(pk.tasks) == 0
    assert await redis_client.zscore(pk.queued, "example.test") == 1
    assert await redis_client.zscore(pk.due, "example.test") is not None
    await assert_frontier(redis_client, q)

    lease = await lease_one(q, "w1", 5_000)
    t = lease.task
    assert (t.id, lease.id, lease.host, lease.partition) == (i, i, "example.test", 0)
    assert (t.url, t.attempt, t.max_attempts, t.meta, t.depth, t.priority) == (
        "http://example.test/a/b", 1, 3, {"k": "v"}, 2, 0)
    assert t.last_error is None and t.checkpoint is None
    now = await redis_ms(redis_client)
    assert now < lease.deadline_ms <= now + 5_000
    assert int(await redis_client.zscore(pk.leases, t.id)) == lease.deadline_ms
    # A leased task is its lease record and its deadline, nothing else.
    assert await lease_record(redis_client, pk, t.id) == LeaseRecord(
        f"{lease.token}:w1", False, False, 1, "example.test", 0,
        encode_entry(i, t.url, meta={"k": "v"}, depth=2).encode())
    assert not await redis_client.hexists(pk.tasks, t.id)
    assert not await redis_client.hexists(pk.attempts, t.id)
    assert (await host_record(redis_client, pk, "example.test")).inflight == 1
    assert await redis_client.llen(pk.host_queue("example.test")) == 0
    assert await q.state_of(t.id) == "leased"
    await assert_frontier(redis_client, q)

    assert await q.ack("w1", [(lease, "ok")]) == [Code.OK]
    assert await q.state_of(t.id) == "done"
    for key in (pk.tasks, pk.attempts, pk.leased, pk.errors, pk.checkpoints):
        assert not await redis_client.hexists(key, t.id)
    assert await redis_client.zcard(pk.leases) == 0
    record = await host_record(redis_client, pk, "example.test")
    assert (record.done, record.inflight) == (1, 0)
    # A second ack of a finished task is refused, and counted.
    assert await q.ack("w1", [(lease, "ok")]) == [Code.UNKNOWN]
    s = await q.stats()
    assert s.counters["done"] == 1 and s.counters["outcome:ok"] == 1
    assert s.counters["stale"] == 1 and s.counters["leased"] == 1
    assert await q.lease("w1", 5, 1_000) == []
    assert_conserved(s)
    await assert_frontier(redis_client, q)


async def test_a_worker_id_the_lease_record_cant_hold_is_refused_before_leasing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Its record "<token>:a b <attempt> ..." could not be read back: the lease would be
    granted, then every ack, renew and fail counted stale until the deadline."""
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://a.test/")])
    for bad in ("a b", "a\tb", "é", "", "x" * 129):
        with pytest.raises(ConfigError, match="invalid worker id"):
            await q.lease(bad, 1, 5_000)
    assert (await q.stats()).leased == 0
    lease = await lease_one(q, "pod/w:1{x}", 5_000)
    assert await q.ack("pod/w:1{x}", [(lease, "ok")]) == [Code.OK]


async def test_enqueue_rejects_bad_new_tasks(redis_client: aioredis.Redis, crawl_name: str
                                            ) -> None:
    q = await open_queue(redis_client, crawl_name)
    for bad in (nt("http://a.test/", priority=-1), nt("http://a.test/", max_attempts=0),
                nt("http://a.test/", depth=-1)):
        with pytest.raises(ConfigError):
            await q.enqueue([bad])
    with pytest.raises(MalformedTaskError, match="host"):
        await q.enqueue([NewTask("http:///nohost", fingerprint("x"))])
    assert (await q.enqueue([])).enqueued == 0
    assert (await q.stats()).counters == {}


async def test_two_workers_never_hold_one_task(redis_client: aioredis.Redis, crawl_name: str
                                               ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=4))
    tasks = many(1200, "two", hosts=24)
    for i in range(0, len(tasks), 400):
        await q.enqueue(tasks[i:i + 400])
    rng = random.Random(7)

    async def worker(name: str) -> tuple[str, list[Lease]]:
        # Each worker has its own LeasingQueue (its own partition cursor), as in a fleet.
        wq = LeasingQueue(redis_client, crawl_name, q.settings)
        got: list[Lease] = []
        while True:
            batch = await wq.lease(name, rng.randint(1, 13), 60_000)
            if not batch:
                if (await q.stats()).pending == 0:
                    return name, got
                # Work left in a partition this worker found empty a moment ago: it
                # would skip it for up to a second (tested below); ask again now.
                wq.leases._idle_until = [0.0] * len(wq.partitions)
            got += batch

    results = await asyncio.gather(*(worker(f"w{i}") for i in range(24)))
    ids = [lease.id for _, got in results for lease in got]
    assert len(ids) == len(set(ids)) == 1200
    assert set(ids) == {task_id(t.fp) for t in tasks}
    tokens = [(lease.partition, lease.token) for _, got in results for lease in got]
    assert len(set(tokens)) == 1200
    assert all(x.partition == q.partition_of(x.host) == q.partition_of(host_key(x.task.url))
               for _, got in results for x in got)
    s = await q.stats()
    assert (s.pending, s.leased, s.counters["leased"]) == (0, 1200, 1200)
    await assert_frontier(redis_client, q)
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
    await assert_frontier(redis_client, q)


async def test_lease_from_more_hosts_than_lua_can_unpack(redis_client: aioredis.Redis,
                                                         crawl_name: str) -> None:
    """A lease of thousands of tasks from as many hosts: the candidate hosts are more
    than one unpack() holds (~8000)."""
    q = await open_queue(redis_client, crawl_name)
    tasks = [nt(f"http://h{i}.wide.test/") for i in range(9_000)]
    for i in range(0, len(tasks), 1_000):
        await q.enqueue(tasks[i:i + 1_000])
    leases = await q.lease("big", 4_500, 60_000)
    assert len(leases) == 4_500 == len({x.host for x in leases})
    s = await q.stats()
    assert (s.pending, s.leased, s.hosts_due) == (4_500, 4_500, 4_500)
    await assert_frontier(redis_client, q)


async def test_ack_batch_mixes_successes_repeats_and_refusals(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """One ack call answers each item as a lone ack would; a repeated item counts once."""
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt(f"http://ackbatch.test/{i}") for i in range(4)])
    a, b, c = await q.lease("w", 3, 30_000)
    short = await lease_one(q, "w", 100)
    await expire(q, short)
    forged = Lease(c.task, c.partition, str(int(c.token) + 1000), c.deadline_ms, c.host)
    codes = await q.ack("w", [(a, "ok"), (b, "http_4xx"), (a, "ok"), (short, "ok"),
                              (forged, "ok"), (c, "ok")])
    assert codes == [Code.OK, Code.OK, Code.UNKNOWN, Code.EXPIRED, Code.STALE, Code.OK]
    assert [await q.state_of(x.id) for x in (a, b, c, short)] == [
        "done", "done", "done", "leased"]
    pk = q.partitions[0]
    assert set(await lease_records(redis_client, pk)) == {short.id}
    assert await redis_client.hlen(pk.tasks) == 0
    record = await host_record(redis_client, pk, "ackbatch.test")
    assert (record.inflight, record.done) == (1, 3)
    s = await q.stats()
    assert (s.counters["done"], s.counters["stale"]) == (3, 3)
    assert (s.counters["outcome:ok"], s.counters["outcome:http_4xx"]) == (2, 1)
    assert_conserved(s)
    await assert_frontier(redis_client, q)


async def test_in_flight_hashes_are_hashtables_from_the_first_lease(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """`leased` of a few hundred fields must not be a listpack (a scan per access)."""
    q = await open_queue(redis_client, crawl_name)
    # A short host and URLs, and a hash-max-listpack-value (64 by default) that a
    # server may be given: lease records shorter than it, so their length alone does
    # not make the hash a hashtable (a fencing token alone has 16 digits).
    (_, before), = (await redis_client.config_get("hash-max-ziplist-value")).items()
    await redis_client.config_set("hash-max-ziplist-value", 100)
    try:
        await q.enqueue([nt(f"http://e.t/{i}") for i in range(300)])
        pk = q.partitions[0]
        leases = await q.lease("w", 1, 30_000)
        record = await redis_client.hget(pk.leased, leases[0].id)
        assert record is not None and len(record) < 100
        assert await redis_client.object("encoding", pk.leased) == b"hashtable"
    finally:
        await redis_client.config_set("hash-max-ziplist-value", before)
    assert await redis_client.hget(pk.leased, HASHTABLE_FIELD) == b"1"
    leases += await q.lease("w", 299, 30_000)
    assert await q.ack("w", [(x, "ok") for x in leases]) == [Code.OK] * 300
    # The field stays: no re-conversion on the next lease.
    assert await redis_client.hkeys(pk.leased) == [HASHTABLE_FIELD.encode()]
    # The dedup hashes stay compact listpacks: their memory per URL depends on it.
    seen = await redis_client.keys(pk.seen(0)[:-1] + "*")
    assert await redis_client.object("encoding", seen[0]) in (b"listpack", b"ziplist")
    assert_conserved(await q.stats())


async def test_priority_then_fifo(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    spec = [("a", 0), ("b", 0), ("c", 5), ("d", 9), ("e", 5), ("f", 0), ("g", 1), ("h", 0)]
    await q.enqueue([nt(f"http://prio.test/{name}", priority=p) for name, p in spec])
    assert await host_prio(redis_client, q, "prio.test") == {
        tid(f"http://prio.test/{name}"): p for name, p in spec if p}
    assert await host_queue(redis_client, q, "prio.test") == [
        tid(f"http://prio.test/{name}") for name, p in spec if not p]
    pk = q.partitions[0]
    assert await redis_client.zscore(pk.prio_hosts, "prio.test") == -9
    order = [(await lease_one(q)).task for _ in spec]
    assert [t.priority for t in order] == [9, 5, 5, 1, 0, 0, 0, 0]
    assert [t.url.rsplit("/", 1)[1] for t in order[4:]] == ["a", "b", "f", "h"]
    assert await redis_client.zscore(pk.prio_hosts, "prio.test") is None
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


async def test_a_url_queued_twice_while_pending_is_leased_once(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A second entry of a pending URL is dropped by lease, counted `duplicates`, whether
    it comes up in the same call as the first or after the first was leased."""
    q = await open_queue(redis_client, crawl_name)
    a, b = nt("http://twice.test/a"), nt("http://twice.test/b")
    await q.enqueue([a, b])
    await _plant(redis_client, q, "twice.test", [
        encode_entry(task_id(t.fp), t.url).encode() for t in (a, b)])
    assert await host_queue(redis_client, q, "twice.test") == [
        task_id(a.fp), task_id(b.fp), task_id(a.fp), task_id(b.fp)]
    got = await q.lease("w", 3, 60_000)  # a, b, and a again: dropped
    assert [x.id for x in got] == [task_id(a.fp), task_id(b.fp)]
    assert await host_queue(redis_client, q, "twice.test") == [task_id(b.fp)]
    assert await q.lease("w", 3, 60_000) == []  # b again, while b is leased: dropped
    s = await q.stats()
    assert (s.pending, s.leased, s.counters["leased"], s.counters["duplicates"]) == (
        0, 2, 2, 2)
    pk = q.partitions[0]
    record = await host_record(redis_client, pk, "twice.test")
    assert (record.inflight, record.queued) == (2, 0)
    assert await redis_client.zscore(pk.queued, "twice.test") == 0
    await assert_frontier(redis_client, q)
    assert await q.ack("w", [(x, "ok") for x in got]) == [Code.OK, Code.OK]
    assert_conserved(await q.stats())
    await assert_frontier(redis_client, q)


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
    held = await lease_record(redis_client, pk, new.id)
    assert held is not None and (held.owner, held.attempt) == (f"{new.token}:B", 2)
    s = await q.stats()
    assert s.counters["stale"] == 3 * 4  # four refusals counted `stale` per all_ops ...
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
    # Reclaimed work goes to the head of its host's line, ahead of the never-leased task.
    assert (await host_queue(redis_client, q, "example.test"))[0] == first.id
    await assert_frontier(redis_client, q)
    again = await lease_one(q, "B")
    assert again.id == first.id and again.task.attempt == 2
    s = await q.stats()
    assert s.counters["reclaimed"] == 1 and "stalled" not in s.counters


async def test_reclaim_pages_through_many(redis_client: aioredis.Redis, crawl_name: str
                                          ) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    await q.enqueue(many(50, "pg", hosts=8))
    leases = await q.lease("A", 50, 200)
    assert len(leases) == 50 and len({x.partition for x in leases}) == 2
    await expire(q, *leases)
    assert await q.reclaim(limit=7) == (50, 0)
    s = await q.stats()
    assert (s.pending, s.leased, s.hosts_due) == (50, 0, 8)
    await assert_frontier(redis_client, q)


async def test_stall_limit_dead_letters_on_third_reclaim(redis_client: aioredis.Redis,
                                                         crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name,
                         retry=RetryPolicy(max_stalls=2))
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
    await assert_frontier(redis_client, q)


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
    q = await open_queue(redis_client, crawl_name, retry=policy, jitter=lambda: 1.0)
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
        await asyncio.sleep(want / 1000)
        assert await promoted_when_due(q) == 1
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
    zero = await open_queue(redis_client, crawl_name, retry=policy, jitter=lambda: 0.0)
    half = LeasingQueue(redis_client, crawl_name, zero.settings, retry=policy,
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
    q = await open_queue(redis_client, crawl_name, retry=policy, jitter=lambda: 1.0)
    await q.enqueue(many(3, "ra"))
    pk = q.partitions[0]
    leases = await q.lease("w1", 3, 10_000)
    before = await redis_ms(redis_client)
    results = await q.fail("w1", [
        Failure(leases[0], "http_429", "slow down", retry_after=3_600.0),  # over the cap
        Failure(leases[1], "http_429", "slow down", retry_after=1.5),      # over the backoff
        Failure(leases[2], "http_503", "now", retry_after=0.0),  # under it: the backoff
    ])
    after = await redis_ms(redis_client)
    assert results == [(Code.RETRY, 3_000), (Code.RETRY, 1_500), (Code.RETRY, 20)]
    for lease, want in zip(leases, (3_000, 1_500, 20), strict=True):
        due = await redis_client.zscore(pk.delayed, lease.id)
        assert before + want <= due <= after + want, (want, due - before)
    moved, next_due = await q.promote()
    while not moved:  # the 20 ms one, when its time comes
        await asyncio.sleep(max(next_due, 1) / 1000)
        moved, next_due = await q.promote()
    assert moved == 1 and await q.state_of(leases[2].id) == "pending"


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
    assert dead.raw == encode_entry(dead.id, "http://perm.test/1", max_attempts=9).encode()
    pk = q.partitions[0]
    assert await redis_client.zscore(pk.errors_by_host, "perm.test") == 1
    assert (await host_record(redis_client, pk, "perm.test")).inflight == 0
    await assert_frontier(redis_client, q)


# ------------------------------------------------------------------------- release / requeue


async def test_release_goes_to_the_head_without_an_attempt(redis_client: aioredis.Redis,
                                                           crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([*many(3, "rel"), nt("http://example.test/rel/prio", priority=3)])
    top = await lease_one(q)
    assert top.task.priority == 3
    a = await lease_one(q)
    assert a.task.url.endswith("/rel/0")
    assert await q.release("w1", [a, top]) == [Code.OK, Code.OK]
    # The priority task goes back to its host's `hp`, the other to the head of its `hq`.
    assert (await host_queue(redis_client, q, "example.test"))[0] == a.id
    assert await host_prio(redis_client, q, "example.test") == {top.id: 3}
    pk = q.partitions[0]
    assert await redis_client.zscore(pk.prio_hosts, "example.test") == -3
    await assert_frontier(redis_client, q)
    again = await q.lease("w2", 2, 10_000)
    assert [x.id for x in again] == [top.id, a.id]
    assert [x.task.attempt for x in again] == [1, 1]
    s = await q.stats()
    assert (s.counters["released"], s.counters["leased"]) == (2, 4)
    assert await q.release("w1", [a]) == [Code.STALE]


async def test_release_heads_requeue_and_promote_tail_the_host_queue(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, jitter=lambda: 0.0)
    await q.enqueue(many(6, "order"))
    ids = [task_id(t.fp) for t in many(6, "order")]
    released, requeued, promoted = await q.lease("w", 3, 60_000)
    assert [released.id, requeued.id, promoted.id] == ids[:3]
    assert await q.fail("w", [Failure(requeued, "gone", "", permanent=True),
                              Failure(promoted, "e", "m")]) == [(Code.DEAD, -1),
                                                                (Code.RETRY, 0)]
    assert await q.release("w", [released]) == [Code.OK]
    assert await host_queue(redis_client, q, "example.test") == [ids[0], *ids[3:]]
    assert await q.dead_requeue([requeued.id]) == 1
    assert await host_queue(redis_client, q, "example.test") == [ids[0], *ids[3:], ids[1]]
    assert await q.promote() == (1, -1)
    assert await host_queue(redis_client, q, "example.test") == [
        ids[0], *ids[3:], ids[1], ids[2]]
    await assert_frontier(redis_client, q)
    got = await q.lease("w", 10, 60_000)
    assert [x.id for x in got] == [ids[0], *ids[3:], ids[1], ids[2]]
    assert [x.task.attempt for x in got] == [1, 1, 1, 1, 1, 2]
    assert [x.task.last_error for x in got][-2:] == ["gone ", "e m"]


async def test_promote_moves_only_due_tasks_in_limit_pages(redis_client: aioredis.Redis,
                                                           crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2),
                         jitter=lambda: 0.0)
    await q.enqueue(many(12, "prom", hosts=4))
    leases = await q.lease("w1", 12, 10_000)
    assert len(leases) == 12
    await q.fail("w1", [Failure(x, "e", "m") for x in leases[:10]]
                 + [Failure(x, "e", "m", retry_after=60.0) for x in leases[10:]])
    moved, next_due = await q.promote(limit=3)
    assert moved == 10 and 59_000 < next_due <= 60_000
    s = await q.stats()
    assert (s.pending, s.waiting, s.counters["promoted"]) == (10, 2, 10)
    assert (await q.promote())[0] == 0
    await assert_frontier(redis_client, q)


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
    first = many(200, "parts", hosts=40)
    res = await q.enqueue(first)
    assert (res.enqueued, res.duplicates) == (200, 0)
    sizes = [int(await redis_client.get(pk.pending)) for pk in q.partitions]
    assert sum(sizes) == 200 and min(sizes) > 20, sizes
    for t in first:  # each task lives in its host's queue, in the partition of its host
        host = host_key(t.url)
        assert task_id(t.fp) in await host_queue(redis_client, q, host)
        pk = q.partitions[q.partition_of(host)]
        assert await redis_client.zscore(pk.queued, host) == 5
    mixed = first + many(50, "parts-new", hosts=10) + first[:10]
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
    # Layer L is built for error * 7/8 * (1/8)^L, so the compound rate stays under
    # `error`; the bound allows 3 standard deviations of a 20k sample.
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
        m = bloom_layer_bits(capacity, 1e-2 * 7 / 8 * (1 / 8) ** layer)
        assert m <= bits < m + 8
        assert 0.48 < await redis_client.bitcount(pk.bloom_layer(layer)) / m < 0.55
    s = await q.stats()
    assert s.counters["enqueued"] == s.pending == await redis_client.llen(
        pk.host_queue("example.test"))
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
        await LeasingQueue(redis_client, crawl_name, settings, recrawl_after_s=5).enqueue(
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
    await window_passed(redis_client, 1)
    res = await q.enqueue(list(tasks.values()))
    # Only the done URL is enqueued again; the live ones (pending in its host's queue,
    # leased, waiting, dead) are not.
    assert (res.enqueued, res.recrawled, res.duplicates) == (1, 1, 4)
    states = {n: await q.state_of(task_id(t.fp)) for n, t in tasks.items()}
    assert states == {"done": "pending", "dead": "dead", "waiting": "waiting",
                      "leased": "leased", "pending": "pending"}
    assert await host_queue(redis_client, q, "recrawl.test") == [
        task_id(tasks["pending"].fp), task_id(tasks["done"].fp)]
    again = {x.id: x for x in await q.lease("w2", 10, 60_000)}
    assert set(again) == {task_id(tasks["done"].fp), task_id(tasks["pending"].fp)}
    assert again[task_id(tasks["done"].fp)].task.attempt == 1
    s = await q.stats()
    assert (s.counters["enqueued"], s.counters["recrawled"], s.done) == (6, 1, 1)
    assert s.counters["duplicates"] == 1 + 4
    assert_conserved(s)
    await assert_frontier(redis_client, q)


async def test_a_pending_url_enqueued_again_with_other_fields_is_a_duplicate(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, recrawl_after_s=1)
    await q.enqueue([nt("http://recrawl.test/p")])
    await window_passed(redis_client, 1)
    res = await q.enqueue([nt("http://recrawl.test/p", priority=5)])
    assert (res.enqueued, res.recrawled, res.duplicates) == (0, 0, 1)
    assert (await q.stats()).pending == 1


async def test_recrawl_after_purge(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, recrawl_after_s=1)
    t = nt("http://recrawl.test/purged")
    await q.enqueue([t])
    lease = await lease_one(q)
    await q.fail("w1", [Failure(lease, "gone", "", permanent=True)])
    assert await q.dead_purge([lease.id]) == 1
    assert (await q.enqueue([t])).duplicates == 1
    await window_passed(redis_client, 1)
    assert (await q.enqueue([t])).recrawled == 1
    assert_conserved(await q.stats())


# ------------------------------------------------------------------------- dead letters


async def _make_dead(q: LeasingQueue, reasons: Sequence[str]) -> list[Lease]:
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
    assert all(d.attempts == 1 and d.raw == encode_entry(d.id, d.url or "").encode()
               for d in d404)
    assert len(await q.dead_list(limit=2)) == 2
    s = await q.stats()
    assert s.dead_reasons == {"http_404": 2, "http_410": 1, "dns": 2}

    # Requeue by reason: the tasks lease again with attempt 1, their last error kept.
    assert await q.dead_requeue(await q.dead_ids("dns")) == 2
    assert await q.dead_requeue(await q.dead_ids("dns")) == 0
    await assert_frontier(redis_client, q)
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
    pk = q.partitions[q.partition_of("dead.test")]
    for i in ids404:
        assert await q.state_of(i) == "done"
        for key in (pk.tasks, pk.errors, pk.attempts):
            assert not await redis_client.hexists(key, i)
    assert (await q.enqueue([nt("http://dead.test/0")])).duplicates == 1
    s = await q.stats()
    assert s.dead == 0 and s.dead_reasons == {}
    assert (s.counters["requeued"], s.counters["purged"]) == (3, 2)
    assert_conserved(s)
    await assert_frontier(redis_client, q)


def bloom_layer_bits(capacity: int, p: float) -> int:
    """The fewest bits a layer of `capacity` URLs needs for rate `p` with an integer
    number of hashes (enqueue_bloom.lua's layer_params)."""
    low = max(1, math.floor(-math.log(p) / math.log(2)))
    return min(math.ceil(-k * capacity / math.log(1 - p ** (1 / k))) for k in (low, low + 1))


MAL_ID = [tid(f"http://mal.test/{i}").encode() for i in range(8)]
MALFORMED_ENTRIES = [
    MAL_ID[0] + b"\xff{not utf-8",
    MAL_ID[1] + b"ftp://mal.test/",
    MAL_ID[2] + b"http://mal.test/2 {not json",
    MAL_ID[3] + b"http://mal.test/3 [1, 2, 3]",
    MAL_ID[4] + b'http://mal.test/4 {"m": []}',
    MAL_ID[5] + b'http://mal.test/5 {"a": 0, "p": 2}',
    b"short garbage",
    b"Z" * 32 + b"http://mal.test/no-hex-id",
]


def dead_id(entry: bytes) -> str:
    """The id a malformed entry is dead-lettered under: its own if hex, else from its bytes."""
    head = entry[:32]
    if re.fullmatch(rb"[0-9a-f]{32}", head):
        return head.decode()
    return hashlib.sha1(entry).hexdigest()[:32]


async def test_malformed_entries_end_dead_with_raw_bytes(redis_client: aioredis.Redis,
                                                         crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    good = nt("http://mal.test/good")
    await q.enqueue([good])
    await _plant(redis_client, q, "mal.test", MALFORMED_ENTRIES)
    bodies = {dead_id(e): e for e in MALFORMED_ENTRIES}
    leases = await q.lease("w", 20, 60_000)
    assert [x.id for x in leases] == [task_id(good.fp)]
    dead = {d.id: d for d in await q.dead_list(reason=MALFORMED)}
    assert set(dead) == set(bodies)
    for i, body in bodies.items():
        assert dead[i].raw == body  # the exact bytes, kept for a human to look at
        assert dead[i].reason == MALFORMED and dead[i].message
        assert await q.state_of(i) == "dead"
    assert "UTF-8" in dead[MAL_ID[0].decode()].message
    assert "id" in dead[dead_id(MALFORMED_ENTRIES[-1])].message
    s = await q.stats()
    assert s.dead_reasons == {MALFORMED: len(bodies)}
    assert (s.dead, s.leased, s.pending) == (len(bodies), 1, 0)
    await assert_frontier(redis_client, q)
    # Requeued, they come back dead again (never a crash); purged, they are gone.
    # (Not the one that is not UTF-8: see the next test.)
    utf8 = [i for i in bodies if i != MAL_ID[0].decode()]
    assert await q.dead_requeue(utf8) == len(utf8)
    assert await host_queue(redis_client, q, "mal.test") == [
        queued_id(e) for e in MALFORMED_ENTRIES if dead_id(e) in utf8]
    assert await q.lease("w", 20, 60_000) == []
    assert (await q.stats()).dead_reasons == {MALFORMED: len(bodies)}
    assert await q.dead_purge(utf8) == len(utf8)
    pk = q.partitions[0]
    assert await redis_client.hkeys(pk.tasks) == [MAL_ID[0]]  # still dead
    assert set(await lease_records(redis_client, pk)) == {task_id(good.fp)}  # still leased
    await assert_frontier(redis_client, q)


async def test_a_dead_entry_that_is_not_utf8_can_be_requeued_and_purged(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://mal.test/good")])
    await _plant(redis_client, q, "mal.test", [MALFORMED_ENTRIES[0]])
    assert len(await q.lease("w", 5, 60_000)) == 1
    i = MAL_ID[0].decode()
    [dead] = await q.dead_list()
    assert (dead.id, dead.reason, dead.raw) == (i, MALFORMED, MALFORMED_ENTRIES[0])
    try:
        assert await q.dead_requeue([i]) == 1
        assert await q.lease("w", 5, 60_000) == []  # dead again
    finally:
        assert await q.dead_purge([i]) == 1
    assert (await q.stats()).dead == 0


#: One task of every entry form: https and http of its host (tails "/" and ":/"), a URL
#: whose authority is not its host key (stored whole), a POST with a body, label, data and
#: meta at a priority (the ZSET), and ids whose bytes hold a space and bytes >= 0x80.
ROUND_TRIP = [
    NewTask("https://rt.test/a?q=1&r=%20", b" \x80\xff" + bytes(range(13))),
    NewTask("http://rt.test/b", bytes(range(0x20, 0x30))),
    NewTask("https://RT.test/c", bytes(range(0xf0, 0x100))),
    NewTask("http://rt.test/d", b"  " + bytes(range(0x80, 0x8e)), priority=2,
            method="POST", body=b'{"x": "\xc3\xa9"}', label="api", data={"k": [1]},
            meta={"m": 1}, depth=3),
    NewTask("https://rt.test:8443/e", bytes(range(0x40, 0x50)), priority=1),
    # an http URL with a query: put back compact (":/<path>?<query>"), it keeps it
    NewTask("http://rt.test/list?page=2&sort=new", bytes(range(0x60, 0x70))),
]


def test_a_compact_entry_expands_to_its_full_entry() -> None:
    for t in ROUND_TRIP:
        host = host_key(t.url)
        full = encode_entry(t.fp.hex(), t.url, priority=t.priority, method=t.method,
                            body=t.body, label=t.label, data=t.data, meta=t.meta,
                            depth=t.depth)
        compact = compact_entry(full, host)
        assert compact.startswith(t.fp) and len(compact) <= len(full.encode()) - 16
        assert compact[16:17] not in b"0123456789abcdef"
        assert expand_entry(compact, host) == full.encode()
        assert expand_entry(full.encode(), host) == full.encode()  # a full one as it is
        assert queued_id(compact) == queued_id(full.encode()) == t.fp.hex()
    assert compact_entry(ID + "http://e.test/x", "e.test") == bytes.fromhex(ID) + b":/x"
    assert compact_entry(ID + "https://e.test/", "e.test") == bytes.fromhex(ID) + b"/"
    assert compact_entry(ID + "https://e.test.org/", "e.test") == \
        bytes.fromhex(ID) + b"https://e.test.org/"
    for bad in (ID + "ftp://e.test/", "Z" * 32 + "http://e.test/"):
        assert compact_entry(bad, "e.test") == bad.encode()  # left for the lease to judge
    for bad in (bytes(16), bytes(16) + b":x", bytes(16) + b"x/"):
        with pytest.raises(MalformedTaskError):
            expand_entry(bad, "e.test")


async def test_every_entry_form_round_trips_through_the_queues(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Enqueued compact by Python, leased (expanded by lease.lua), released (compacted
    by lib/queues.lua: the same bytes Python sends), leased again and acked."""
    q = await open_queue(redis_client, crawl_name)
    assert (await q.enqueue(ROUND_TRIP)).enqueued == len(ROUND_TRIP)
    want = {t.fp.hex(): t for t in ROUND_TRIP}
    queued: dict[str, bytes] = {}
    for t in ROUND_TRIP:
        pk, host = q.partitions[q.partition_of(host_key(t.url))], host_key(t.url)
        for e in [*await redis_client.lrange(pk.host_queue(host), 0, -1),
                  *await redis_client.zrange(pk.host_prio(host), 0, -1)]:
            queued[queued_id(e)] = e
    for turn in ("released", "acked"):
        leases = await q.lease("w", 10, 60_000)
        assert {x.id for x in leases} == set(want)
        for x in leases:
            t = want[x.id]
            assert (x.task.url, x.task.method, x.task.body, x.task.label, x.task.data,
                    x.task.meta, x.task.depth, x.task.priority, x.host) == (
                t.url, t.method, t.body, t.label, t.data, t.meta, t.depth, t.priority,
                host_key(t.url))
        if turn == "acked":
            assert await q.ack("w", [(x, "ok") for x in leases]) == [Code.OK] * len(leases)
            break
        assert await q.release("w", leases) == [Code.OK] * len(leases)
        again: dict[str, bytes] = {}
        for x in leases:
            pk = q.partitions[x.partition]
            for e in [*await redis_client.lrange(pk.host_queue(x.host), 0, -1),
                      *await redis_client.zrange(pk.host_prio(x.host), 0, -1)]:
                again[queued_id(e)] = e
        assert again == queued
    s = await q.stats()
    assert (s.pending, s.leased, s.dead, s.done) == (0, 0, 0, len(ROUND_TRIP))
    await assert_frontier(redis_client, q)


async def test_a_malformed_compact_entry_is_dead_as_malformed(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Too short, or a tail that is not "/", ":/" or "http": dead, its bytes kept."""
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://mal.test/good")])
    bad = [b" \xff" * 8, b" \xff" * 8 + b":x/", b" \xff" * 8 + b"x/y", b" \xff" * 8 + b"htp:/"]
    await _plant(redis_client, q, "mal.test", bad)
    assert [x.task.url for x in await q.lease("w", 10, 60_000)] == ["http://mal.test/good"]
    dead = {d.id: d for d in await q.dead_list(reason=MALFORMED)}
    assert {d.raw for d in dead.values()} == set(bad)
    assert set(dead) == {hashlib.sha1(e).hexdigest()[:32] for e in bad}
    assert all("id" in d.message for d in dead.values())
    s = await q.stats()
    assert (s.dead, s.pending, s.dead_reasons) == (len(bad), 0, {MALFORMED: len(bad)})
    await assert_frontier(redis_client, q)


async def test_an_entry_whose_id_is_not_utf8_is_dead_lettered(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    await q.enqueue([nt("http://mal.test/good")])
    entry = b"\xff" * 32 + b"http://mal.test/x"
    await _plant(redis_client, q, "mal.test", [entry])
    assert [x.task.url for x in await q.lease("w", 5, 60_000)] == ["http://mal.test/good"]
    s = await q.stats()
    assert (s.dead, s.pending, s.dead_reasons) == (1, 0, {MALFORMED: 1})
    pk = q.partitions[0]
    # Dead-lettered under an id made from its bytes (hex, like every id), bytes kept.
    [dead] = await q.dead_list()
    assert dead.id == hashlib.sha1(entry).hexdigest()[:32] and dead.raw == entry
    assert await redis_client.zrange(pk.dead, 0, -1) == [dead.id.encode()]
    await assert_frontier(redis_client, q)


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
    await assert_frontier(redis_client, q)


# ------------------------------------------------------------------------- stats / open


async def test_stats_counters_add_up(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=3),
                         jitter=lambda: 1.0)
    await q.enqueue(many(20, "stats", hosts=6) + many(5, "stats", hosts=6))
    ls = await q.lease("w", 9, 60_000)
    assert len(ls) == 9
    await q.ack("w", [(ls[0], "ok"), (ls[1], "ok"), (ls[2], "http_404")])
    await q.fail("w", [Failure(ls[3], "e", "m"), Failure(ls[4], "e", "m", permanent=True),
                       Failure(ls[5], "e", "m", permanent=True)])
    await q.release("w", [ls[7]])
    assert await q.dead_purge([ls[5].id]) == 1
    s = await q.stats()
    c = s.counters
    assert (s.pending, s.leased, s.waiting, s.dead, s.done) == (12, 2, 1, 1, 3)
    assert c["enqueued"] == 20 and c["duplicates"] == 5 and c["purged"] == 1
    assert (c["leased"], c["failed"], c["retried"], c["dead"]) == (9, 3, 1, 2)
    assert (c["outcome:ok"], c["outcome:http_404"]) == (2, 1)
    assert c["released"] == 1
    assert s.active == 15 and s.dead_reasons == {"e": 1}
    assert_conserved(s)
    await assert_frontier(redis_client, q)


async def test_open_conflicting_settings(redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    assert len(q.partitions) == 2
    with pytest.raises(CrawlConflictError, match="partitions=2"):
        await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=4))
    with pytest.raises(CrawlConflictError):
        await LeasingQueue.open(redis_client, crawl_name,
                              CrawlSettings(partitions=2, dedup=DedupMode.BLOOM))
    stored = await LeasingQueue.open(redis_client, crawl_name)
    assert stored.settings == CrawlSettings(partitions=2)
    assert (await LeasingQueue.existing(redis_client, crawl_name)).settings.partitions == 2
    with pytest.raises(ConfigError):
        await LeasingQueue.existing(redis_client, crawl_name + "-missing")
    for bad in ({"partitions": 0}, {"seen_bits": 3}, {"bloom_error": 1.0}, {"bloom_layers": 0}):
        with pytest.raises(ConfigError):
            CrawlSettings(**bad)


async def test_an_item_passed_twice_gets_a_code_per_occurrence(redis_client: aioredis.Redis,
                                                               crawl_name: str) -> None:
    """Regression: results were mapped by object identity, so [x, x] got x's last code."""
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    await q.enqueue(many(4, "twice", hosts=4))
    a, b, c, d = await q.lease("w", 4, 60_000)
    assert len({x.partition for x in (a, b, c, d)}) == 2  # the callers' order is rebuilt
    assert await q.release("w", [a, b, a]) == [Code.OK, Code.OK, Code.UNKNOWN]
    item = (c, "ok")
    assert await q.ack("w", [item, item]) == [Code.OK, Code.UNKNOWN]
    f = Failure(d, "e", "m", permanent=True)
    assert await q.fail("w", [f, f]) == [(Code.DEAD, -1), (Code.UNKNOWN, -1)]
    s = await q.stats()
    assert (s.counters["released"], s.counters["done"], s.counters["stale"]) == (2, 1, 3)




class FakeClock:
    """Stands in for the `time` module of common.queue: a monotonic clock set by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


def _host_in(q: LeasingQueue, partition: int, name: str) -> str:
    return next(h for h in (f"{name}{i}.skip.test" for i in range(100))
                if q.partition_of(h) == partition)


async def test_a_partition_that_had_nothing_is_skipped_until_its_wait_or_a_freed_slot(
        redis_client: aioredis.Redis, crawl_name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(common.queue.lease_client, "time", clock)
    q = await open_queue(redis_client, crawl_name, CrawlSettings(partitions=2))
    a, b, c, d = (_host_in(q, p, n) for p, n in ((0, "a"), (1, "b"), (0, "c"), (0, "d")))
    # Nothing anywhere: no turn is known (the caller backs off), and both partitions are
    # skipped for UNKNOWN_WAIT_S (another consumer's ack may free a slot at any time).
    start = clock.now
    empty = await q.lease_turns("w", 5, 60_000)
    assert (empty.leases, empty.wait_s) == ([], None)
    await q.enqueue([nt(f"http://{a}/1"), nt(f"http://{b}/1")])
    clock.now = start + UNKNOWN_WAIT_S - 0.001
    skipped = await q.lease_turns("w", 5, 60_000)
    assert skipped.leases == [] and skipped.wait_s == pytest.approx(0.001)
    clock.now = start + UNKNOWN_WAIT_S
    first = await q.lease("w", 5, 60_000)
    assert sorted(x.host for x in first) == sorted([a, b])

    # A host's turn to come: its partition is skipped until then (at most 0.8 s; partition
    # 1, with no host due, for UNKNOWN_WAIT_S), and work ready meanwhile waits for it.
    await Frontier(q).set_host(a, delay_s=0.8)
    await q.enqueue([nt(f"http://{a}/2")])
    start = clock.now
    turn = await q.lease_turns("w", 5, 60_000)
    assert turn.leases == [] and turn.wait_s is not None and 0 < turn.wait_s <= 0.8
    await q.enqueue([nt(f"http://{c}/1")])  # no delay: ready at once, but not asked for
    clock.now = start + UNKNOWN_WAIT_S
    assert await q.lease("w", 5, 60_000) == []  # partition 0 still waits for a's turn
    clock.now = start + 0.8
    got = await q.lease("w", 5, 60_000)
    assert f"http://{c}/1" in {x.task.url for x in got}
    held = first + got
    await Frontier(q).set_host(a, delay_s=60)  # a is never ready again in this test

    # A lease ending in a skipped partition (ack, fail, release) asks it again at once;
    # one ending in another partition does not.
    assert await q.lease("w", 5, 60_000) == []  # both skipped now
    await q.enqueue([nt(f"http://{d}/first")])
    [other] = [x for x in held if x.partition == 1]
    held.remove(other)
    assert await q.ack("w", [(other, "ok")]) == [Code.OK]
    assert await q.lease("w", 5, 60_000) == []
    for end in ("ack", "fail", "release"):
        assert await q.lease("w", 5, 60_000) == []  # skipped
        await q.enqueue([nt(f"http://{d}/{end}")])
        mine = next(x for x in held if x.partition == 0)
        held.remove(mine)
        if end == "ack":
            assert await q.ack("w", [(mine, "ok")]) == [Code.OK]
        elif end == "fail":
            assert await q.fail("w", [Failure(mine, "e", "m", permanent=True)]) == [
                (Code.DEAD, -1)]
        else:
            assert await q.release("w", [mine]) == [Code.OK]
        again = await q.lease("w", 5, 60_000)
        assert f"http://{d}/{end}" in {x.task.url for x in again}
        held += again


async def test_a_new_crawl_spreads_its_partitions_over_the_slots_an_older_one_keeps_its_keys(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A crawl created now places partition p's hash tag in the p-th of P equal slot ranges
    (keys.partition_tag); one created before (its settings without "spread") keeps the
    tags its keys have, and opening it with the same partitions is no conflict."""
    # 8, not 4: the slots of "<name>:0" .. ":3" (CRC16 of strings a digit apart) fell in
    # order by themselves for a quarter of the names this test gets.
    new = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=8))
    assert [key_slot(pk.due.split("{")[1].split("}")[0].encode()) * 8 // 16384
            for pk in new.on.partitions] == list(range(8))
    older = crawl_name + "-older"
    settings = json.loads(CrawlSettings(partitions=4).to_json())
    del settings["spread"]
    await redis_client.hset(CrawlKeys.build(older).meta, "settings", json.dumps(settings))
    old = await LeasingQueue.open(redis_client, older, CrawlSettings(partitions=4))
    assert [pk.prefix for pk in old.on.partitions] == [
        f"crawlq:{{{older}:{p}}}:" for p in range(4)]
