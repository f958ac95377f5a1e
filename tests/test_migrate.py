"""Converting a live crawl from layout 2 to layout 3 (common/lua/migrate.lua,
common.queue.migrate), and on to layout 4 (tests/test_migrate_compact.py), against a real
redis-server.

A crawl of layout 2 is written here key by key, as the scripts of that layout (commit
828d685) left it: per-host counters in h:queued, h:inflight, h:last and h:done, settings
and push-back state in hostconf, a lease in owners + tasks + attempts. The tests convert
it, check every record the conversion wrote and every key it kept, then drive the
converted crawl with this version's queue until every task is done or dead.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import re
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.consume import consumer_args
from support.frontier import host_record, host_records

from common import codec
from common.codec import text as _text
from common.hostmodel.hostrec import HostRecord
from common.keys import (
    CRAWLS,
    HASHTABLE_FIELD,
    LAYOUT2_NAMES,
    CrawlKeys,
    PartitionKeys,
    layout2_keys,
)
from common.policy import create_policy
from common.queue import (
    FORMAT,
    Code,
    Crawl,
    CrawlFormatError,
    CrawlNeedsMigration,
    CrawlQueue,
    CrawlSettings,
    Failure,
    Lease,
    LeasingQueue,
    RetryPolicy,
    migrate_crawl,
)
from common.queue.migrate import MigrationBusyError, migration_keys
from common.redis.scripts import register
from common.tasks.task import compact_entry, decode_entry, encode_entry
from common.urls.canonical import fingerprint, task_id
from consumer.config import build_parser, settings_from_args
from consumer.wiring import run as consumer_run
from producer.cli import main_async as producer_main

LEASE_MS = 60_000


@pytest.fixture
def console_cli() -> Iterator[types.ModuleType]:
    """console.cli. While console/fsck/ is being ported to layout 3 (it imports the
    layout-2 host model, gone), it is stood in for, for this test only, by a module whose
    fsck refuses to run: the tests here need the commands that open the crawl, and fsck's
    own checks are stubbed where the repair path is tested."""
    try:
        importlib.import_module("console.fsck")
    except ImportError:
        pass
    else:
        yield importlib.import_module("console.cli")
        return
    stub = types.ModuleType("console.fsck")

    async def fsck(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("console.fsck is not ported to layout 3 yet")

    stub.fsck = fsck  # type: ignore[attr-defined]
    stub.report_text = str  # type: ignore[attr-defined]
    saved = {name: sys.modules.pop(name, None)
             for name in ("console.fsck", "console.cli", "console.cli.checks")}
    sys.modules["console.fsck"] = stub
    try:
        yield importlib.import_module("console.cli")
    finally:
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module


# ----------------------------------------------------------------------- a crawl of layout 2


@dataclass
class Layout2:
    """A crawl of layout 2, written as that layout's scripts would have left it."""

    client: aioredis.Redis
    crawl: Crawl
    now: int
    ids: dict[str, str] = field(default_factory=dict)  # url -> id
    leases: dict[str, Lease] = field(default_factory=dict)  # url -> the lease a worker holds
    workers: dict[str, str] = field(default_factory=dict)  # url -> its lease's worker

    @classmethod
    async def create(cls, client: aioredis.Redis, name: str, partitions: int = 2) -> Layout2:
        settings = CrawlSettings(partitions=partitions, spread=False)
        stored = codec.loads(settings.to_json())
        stored["format"] = 2
        del stored["spread"]  # layout 2 came before crawls spread their slots
        await client.hset(CrawlKeys.build(name).meta, mapping={
            "settings": codec.dumps(stored), "created_ms": 1})
        await client.sadd(CRAWLS, name)
        sec, usec = await client.time()
        crawl = Crawl.on(client, name, settings)
        for pk in crawl.partitions:
            await client.set(pk.seq, 20)  # the fencing tokens handed out so far
        return cls(client, crawl, int(sec) * 1000 + int(usec) // 1000)

    def pk(self, host: str) -> PartitionKeys:
        return self.crawl.partitions[self.crawl.partition_of(host)]

    def old(self, host: str) -> dict[str, str]:
        """The layout-2 keys of a host's partition, by name."""
        pk = self.pk(host)
        return dict(zip(LAYOUT2_NAMES, layout2_keys(pk.crawl, pk.partition), strict=True))

    async def _entered(self, host: str, url: str, priority: int = 0) -> tuple[str, str]:
        """What enqueue.lua wrote of a task: its seen mark, the counter, the host seen."""
        tid = task_id(fingerprint(url))
        self.ids[url] = tid
        pk = self.pk(host)
        bucket, seen = self.crawl.seen_mark(pk, tid)
        await self.client.hset(bucket, seen, self.now // 1000)
        await self.client.hincrby(pk.stats, "enqueued", 1)
        await self.client.zincrby(pk.queued, 0, host)
        return tid, encode_entry(tid, url, priority=priority)

    async def pending(self, host: str, url: str, priority: int = 0) -> None:
        _, entry = await self._entered(host, url, priority)
        pk = self.pk(host)
        if priority:
            await self.client.zadd(pk.host_prio(host), {entry: -priority})
            await self.client.zadd(pk.prio_hosts, {host: -priority}, lt=True)
        else:
            await self.client.rpush(pk.host_queue(host), entry)
        await self.client.zincrby(pk.queued, 1, host)
        await self.client.incr(pk.pending)

    async def leased(self, host: str, url: str, owner: str, attempt: int | None,
                     *, priority: int = 0, deadline_ms: int | None = None) -> None:
        """A lease as the old lease.lua wrote it (`attempt` None: no attempts field)."""
        deadline = self.now + LEASE_MS if deadline_ms is None else deadline_ms
        tid, entry = await self._entered(host, url, priority)
        pk, old = self.pk(host), self.old(host)
        await self.client.hsetnx(old["owners"], HASHTABLE_FIELD, "1")
        await self.client.hsetnx(pk.attempts, HASHTABLE_FIELD, "1")
        await self.client.hset(pk.tasks, tid, f"{host} {priority} {entry}")
        await self.client.hset(old["owners"], tid, owner)
        if attempt is not None:
            await self.client.hset(pk.attempts, tid, attempt)
        await self.client.zadd(pk.leases, {tid: deadline})
        await self.client.hincrby(pk.stats, "leased", 1)
        if not owner.startswith("f"):  # a response in gave its host's slot back
            await self.client.zincrby(old["h:inflight"], 1, host)
        token, worker = owner.lstrip("fb").split(":", 1)
        self.workers[url] = worker
        self.leases[url] = Lease(decode_entry(entry, attempt=attempt or 1),
                                 self.crawl.partition_of(host), token, deadline, host)

    async def waiting(self, host: str, url: str, attempt: int, due_ms: int) -> None:
        """A retry as the old fail.lua left it."""
        tid, entry = await self._entered(host, url)
        pk = self.pk(host)
        await self.client.hset(pk.tasks, tid, f"{host} 0 {entry}")
        await self.client.hset(pk.attempts, tid, attempt)
        await self.client.zadd(pk.delayed, {tid: due_ms})
        await self.client.hset(pk.errors, tid, "http_5xx HTTP 503")
        await self.client.zincrby(pk.errors_by_host, 1, host)

    async def dead(self, host: str, url: str, attempt: int, reason: str) -> None:
        tid, entry = await self._entered(host, url)
        pk = self.pk(host)
        await self.client.hset(pk.tasks, tid, f"{host} 0 {entry}")
        await self.client.hset(pk.attempts, tid, attempt)
        await self.client.zadd(pk.dead, {tid: self.now - 500})
        await self.client.hset(pk.errors, tid, f"{reason} HTTP 404")
        await self.client.hincrby(pk.dead_reasons, reason, 1)
        await self.client.hincrby(pk.stats, "dead", 1)
        await self.client.zincrby(pk.errors_by_host, attempt, host)

    async def done(self, host: str, n: int) -> None:
        pk = self.pk(host)
        await self.client.zincrby(self.old(host)["h:done"], n, host)
        await self.client.hincrby(pk.stats, "done", n)
        await self.client.hincrby(pk.stats, "enqueued", n)

    async def hostconf(self, host: str, value: str) -> None:
        await self.client.hset(self.old(host)["hostconf"], host, value)

    async def last(self, host: str, ms: int) -> None:
        await self.client.zadd(self.old(host)["h:last"], {host: ms})

    async def due(self, host: str, at: int) -> None:
        await self.client.zadd(self.pk(host).due, {host: at})


async def live_crawl(client: aioredis.Redis, name: str) -> tuple[Layout2, dict[str, HostRecord]]:
    """A crawl of layout 2 mid-run, and the host records its conversion must write."""
    old = await Layout2.create(client, name)
    now = old.now
    # a.test: no settings; three pending, one leased (its second attempt), one waiting.
    for i in (1, 2, 3):
        await old.pending("a.test", f"http://a.test/{i}")
    await old.leased("a.test", "http://a.test/4", "3:w1", 2)
    await old.waiting("a.test", "http://a.test/5", 1, now - 1000)
    await old.done("a.test", 2)
    await old.last("a.test", now - 2000)
    await old.due("a.test", now - 2000)
    # b.test: a page budget (7 fields): 5 pages, 2 used, 2 held by its two leases, one of
    # which has its response in (f: its slot given back, so h:inflight counts one).
    await old.hostconf("b.test", "1000,2,5,2,0,,2")
    await old.pending("b.test", "http://b.test/1", priority=4)
    await old.leased("b.test", "http://b.test/2", "fb7:w2", None, priority=2)
    await old.leased("b.test", "http://b.test/3", "b8:w2", 1)
    await old.done("b.test", 2)
    await old.last("b.test", now - 5000)
    await old.due("b.test", now - 4000)
    # c.test: pushed back (14 fields): blocked until a second ago, a robots.txt delay,
    # level 2, a pace of 3 s fading over a minute, its response time.
    await old.hostconf("c.test", f"0,,,0,{now - 1000},2000,0,2,3000,{now - 61000},7,60000,3,150")
    await old.pending("c.test", "http://c.test/1")
    await old.done("c.test", 7)
    await old.last("c.test", now - 10000)
    await old.due("c.test", now - 1000)
    # d.test: a value written before `reserved` existed (6 fields); never leased.
    await old.hostconf("d.test", "500,1,,0,0,250")
    await old.pending("d.test", "http://d.test/1")
    await old.due("d.test", 500)
    # e.test: one dead task; f.test: a setting only (`reserved` '': unset, so 0).
    await old.dead("e.test", "http://e.test/1", 3, "http_4xx")
    await old.hostconf("f.test", "2000,,,0,0,,")
    expected = {
        "a.test": HostRecord(queued=3, inflight=1, last=now - 2000, done=2),
        "b.test": HostRecord(queued=1, inflight=1, last=now - 5000, done=2, delay=1000,
                             conc=2, budget=5, used=2, reserved=2),
        "c.test": HostRecord(queued=1, last=now - 10000, done=7, delay=0, blocked=now - 1000,
                             robots=2000, level=2, pace=3000, pb_at=now - 61000, pb_done=7,
                             fade=60000, pushbacks=3, lat=150),
        "d.test": HostRecord(queued=1, delay=500, conc=1, robots=250),
        "e.test": HostRecord(),
        "f.test": HostRecord(delay=2000),
    }
    return old, expected


async def settings_of(client: aioredis.Redis, name: str) -> dict[str, Any]:
    """A crawl's stored settings, as JSON."""
    raw = await client.hget(CrawlKeys.build(name).meta, "settings")
    assert raw is not None
    return codec.loads(raw)  # type: ignore[no-any-return]


async def contents(client: aioredis.Redis, name: str) -> dict[bytes, Any]:
    """Every key of a crawl (its own and its partitions') with what it holds."""
    out: dict[bytes, Any] = {}
    own = re.compile(rb"^crawlq:\{" + re.escape(name.encode()) + rb"(:\d+)?\}:")
    keys = [k async for k in client.scan_iter(match=f"crawlq:{{{name}*", count=10_000)
            if own.match(k)]
    for key in keys:
        kind = _text(await client.type(key))
        if kind == "string":
            out[key] = await client.get(key)
        elif kind == "hash":
            out[key] = await client.hgetall(key)
        elif kind == "zset":
            out[key] = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            out[key] = await client.lrange(key, 0, -1)
        else:
            out[key] = (kind, await client.dump(key))
    return out


def records_of(old: Layout2, hosts: dict[str, Any]) -> dict[int, dict[Any, Any]]:
    """`hosts` (host -> anything) split by partition."""
    split: dict[int, dict[Any, Any]] = {p: {} for p in range(len(old.crawl.partitions))}
    for host, value in hosts.items():
        split[old.crawl.partition_of(host)][host] = value
    return split


async def drive(q: LeasingQueue, within: float = 30.0) -> list[Lease]:
    """Promote, lease and ack until nothing is pending, leased or waiting; the leases."""
    got: list[Lease] = []
    deadline = time.monotonic() + within
    while True:
        await q.promote()
        leases = await q.lease("w9", 10, LEASE_MS)
        if leases:
            assert await q.ack("w9", [(lease, "ok") for lease in leases]) == [Code.OK] * len(
                leases)
            got += leases
            continue
        s = await q.stats()
        if s.pending == s.leased == s.waiting == 0:
            return got
        assert time.monotonic() < deadline, f"not drained within {within:g}s: {s}"
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------------------ the tests


async def test_a_live_crawl_converts_record_by_record_and_runs_to_the_end(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    old, expected = await live_crawl(redis_client, crawl_name)
    before = await contents(redis_client, crawl_name)
    ids = old.ids

    assert await migrate_crawl(redis_client, crawl_name) == 2

    meta = CrawlKeys.build(crawl_name).meta
    assert await settings_of(redis_client, crawl_name) == {
        k: v for k, v in codec.loads(CrawlSettings(partitions=2).to_json()).items()
        if k != "spread"} | {"format": FORMAT}  # its tags as they were
    assert FORMAT == 4
    want = records_of(old, expected)
    # The lease records: owner (marks kept), attempt (1 when attempts held none), body.
    leased = records_of(old, {})
    for url, owner, attempt, priority in (("http://a.test/4", "3:w1", 2, 0),
                                          ("http://b.test/2", "fb7:w2", 1, 2),
                                          ("http://b.test/3", "b8:w2", 1, 0)):
        host = url.split("/")[2]
        value = f"{owner} {attempt} {host} {priority} " + encode_entry(ids[url], url,
                                                                     priority=priority)
        leased[old.crawl.partition_of(host)][ids[url].encode()] = value.encode()
    # A waiting and a dead task keep their bodies and attempts.
    kept = records_of(old, {})
    for url, attempt in (("http://a.test/5", 1), ("http://e.test/1", 3)):
        host = url.split("/")[2]
        kept[old.crawl.partition_of(host)][ids[url].encode()] = attempt
    for p, pk in enumerate(old.crawl.partitions):
        assert await host_records(redis_client, pk) == want[p], f"partition {p}"
        records = await redis_client.hgetall(pk.leased)
        # A partition with leases keeps `leased` a hashtable (common/keys.py).
        assert (records.pop(HASHTABLE_FIELD.encode(), None) is not None) == bool(leased[p])
        assert records == leased[p]
        bodies = before.get(pk.tasks.encode(), {})
        assert await redis_client.hgetall(pk.tasks) == {
            tid: bodies[tid] for tid in kept[p]}
        # Layout 3 keeps no hashtable field in `attempts`: lease reads it only when it exists.
        assert await redis_client.hgetall(pk.attempts) == {
            tid: str(n).encode() for tid, n in kept[p].items()}
        for key in layout2_keys(crawl_name, p):
            assert not await redis_client.exists(key), key
    # Nothing else changed: h:queued, due, deadlines, seen marks, counters ...; the queues
    # hold the same entries, compact (layout 4).
    after = await contents(redis_client, crawl_name)
    changed = {meta.encode()}
    for pk in old.crawl.partitions:
        changed |= {pk.hosts.encode(), pk.leased.encode(), pk.tasks.encode(),
                    pk.attempts.encode(), *(k.encode() for k in
                                            layout2_keys(crawl_name, pk.partition))}
    for host in ("a.test", "b.test", "c.test", "d.test"):
        hq, hp = old.pk(host).host_queue(host).encode(), old.pk(host).host_prio(host).encode()
        changed |= {hq, hp}
        assert after.get(hq) == (
            [compact_entry(e.decode(), host) for e in before[hq]] if hq in before else None)
        assert after.get(hp) == ([(compact_entry(e.decode(), host), score)
                                  for e, score in before[hp]] if hp in before else None)
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed}

    # The converted crawl, driven by this version: the migrated leases are held by their
    # workers under their old tokens.
    q = await LeasingQueue.existing(redis_client, crawl_name,
                                    retry=RetryPolicy(base_ms=10, cap_ms=20))
    held = old.leases
    assert await q.renew("w1", [held["http://a.test/4"]], LEASE_MS) == []
    assert await q.renew("w2", [held["http://b.test/2"], held["http://b.test/3"]],
                         LEASE_MS) == []
    assert await q.ack("w1", [(held["http://b.test/2"], "ok")]) == [Code.STALE]
    [(code, _)] = await q.fail("w1", [Failure(held["http://a.test/4"], "http_5xx", "HTTP 503")])
    assert code is Code.RETRY
    assert await q.ack("w2", [(held["http://b.test/2"], "ok")]) == [Code.OK]
    b = await host_record(redis_client, old.pk("b.test"), "b.test")
    assert (b.inflight, b.reserved, b.used, b.done) == (1, 1, 3, 3)  # its slot was back
    assert await q.ack("w2", [(held["http://b.test/3"], "ok")]) == [Code.OK]
    b = await host_record(redis_client, old.pk("b.test"), "b.test")
    assert (b.inflight, b.reserved, b.used, b.done) == (0, 0, 4, 4)

    leases = await drive(q)
    assert {lease.task.url: lease.task.attempt for lease in leases} == {
        "http://a.test/1": 1, "http://a.test/2": 1, "http://a.test/3": 1, "http://a.test/4": 3,
        "http://a.test/5": 2, "http://b.test/1": 1, "http://c.test/1": 1, "http://d.test/1": 1}
    s = await q.stats()
    assert (s.pending, s.leased, s.waiting, s.dead) == (0, 0, 0, 1)
    assert s.counters["done"] == 11 + 10
    assert s.counters["enqueued"] == s.pending + s.leased + s.waiting + s.dead + s.done
    for url, tid in ids.items():
        state = await q.state_of(tid, url)
        assert state == ("dead" if url == "http://e.test/1" else "done"), url
        if state == "done":  # acked: its seen mark is the end time, negative
            bucket, seen = q.on.seen_mark(old.pk(url.split("/")[2]), tid)
            assert int(await redis_client.hget(bucket, seen) or 0) < 0, url
    b = await host_record(redis_client, old.pk("b.test"), "b.test")
    assert (b.used, b.reserved, b.budget_spent) == (5, 0, True)
    for pk in old.crawl.partitions:
        assert set(await redis_client.hkeys(pk.leased)) <= {HASHTABLE_FIELD.encode()}
        for key in layout2_keys(crawl_name, pk.partition):
            assert not await redis_client.exists(key), key


async def test_migrating_twice_changes_nothing(redis_client: aioredis.Redis,
                                               crawl_name: str) -> None:
    old, _ = await live_crawl(redis_client, crawl_name)
    assert await migrate_crawl(redis_client, crawl_name) == 2
    converted = await contents(redis_client, crawl_name)
    assert await migrate_crawl(redis_client, crawl_name) == 0
    # The script itself, on converted partitions: every host kept, nothing written.
    script = register(redis_client, "migrate")
    kept = 0
    for pk in old.crawl.partitions:
        hosts_done, hosts_kept, *leases = await script(keys=migration_keys(pk), args=[])
        assert (hosts_done, leases) == (0, [0, 0, 0])
        kept += hosts_kept
    queued = {h for pk in old.crawl.partitions
              for h in await redis_client.zrange(pk.queued, 0, -1)}
    assert kept == len(queued) == 5  # every host seen but f.test (a setting only)
    assert await contents(redis_client, crawl_name) == converted
    assert not await redis_client.exists(CrawlKeys.build(crawl_name).migrate_lock)


async def test_a_host_or_lease_written_by_layout_3_is_kept(redis_client: aioredis.Redis,
                                                         crawl_name: str) -> None:
    """A record that exists already wins over the old keys (layout 3 wrote it); an owner
    without a body can't become a lease record and is left as it was."""
    old = await Layout2.create(redis_client, crawl_name, partitions=1)
    pk = old.pk("a.test")
    await old.pending("a.test", "http://a.test/1")
    await old.leased("a.test", "http://a.test/2", "4:w1", 1)
    await old.hostconf("a.test", "100,,,0,0,,0")
    newer = HostRecord(queued=1, inflight=1, done=9).encode()
    await redis_client.hset(pk.hosts, "a.test", newer)
    await redis_client.hset(old.old("a.test")["owners"], "f" * 32, "5:w1")  # no body
    script = register(redis_client, "migrate")
    assert await script(keys=migration_keys(pk), args=[]) == [0, 1, 1, 0, 1]
    assert await redis_client.hget(pk.hosts, "a.test") == newer
    assert set(await redis_client.hkeys(pk.leased)) == {old.ids["http://a.test/2"].encode(),
                                                          HASHTABLE_FIELD.encode()}
    assert not await redis_client.exists(old.old("a.test")["owners"])


async def test_a_migrated_lease_that_expires_is_reclaimed_with_its_attempts(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A consumer of the old crawlq stopped while it held a lease: once converted, the
    reaper takes it back as it would have, its attempts and budget page with it."""
    old = await Layout2.create(redis_client, crawl_name, partitions=1)
    pk = old.pk("a.test")
    await old.hostconf("a.test", ",,3,1,0,,1")
    await old.leased("a.test", "http://a.test/1", "b4:w1", 2, deadline_ms=old.now - 1)
    await old.last("a.test", old.now - 100)
    assert await migrate_crawl(redis_client, crawl_name) == 1
    assert await host_record(redis_client, pk, "a.test") == HostRecord(
        inflight=1, last=old.now - 100, budget=3, used=1, reserved=1)
    q = await LeasingQueue.existing(redis_client, crawl_name)
    assert await q.reclaim() == (1, 0)
    tid = old.ids["http://a.test/1"]
    assert await q.state_of(tid, "http://a.test/1") == "pending"
    assert await redis_client.hget(pk.attempts, tid) == b"2"
    assert await host_record(redis_client, pk, "a.test") == HostRecord(
        queued=1, last=old.now - 100, budget=3, used=1)
    [again] = await q.lease("w2", 5, LEASE_MS)
    assert (again.id, again.task.attempt) == (tid, 3)
    assert await q.ack("w2", [(again, "ok")]) == [Code.OK]
    s = await q.stats()
    assert (s.pending, s.leased, s.done) == (0, 0, 1) and s.counters["enqueued"] == 1


async def test_the_producer_and_the_console_refuse_a_crawl_of_layout_2(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        capsys: pytest.CaptureFixture[str], console_cli: types.ModuleType) -> None:
    await live_crawl(redis_client, crawl_name)
    before = await contents(redis_client, crawl_name)
    advice = (f"crawl {crawl_name!r} holds layout 2: start a consumer of this version or run "
              f"`crawlq fsck --repair --crawl {crawl_name}` to convert it")
    for opening in (CrawlQueue.existing(redis_client, crawl_name),
                    CrawlQueue.open(redis_client, crawl_name),
                    CrawlQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))):
        with pytest.raises(CrawlNeedsMigration) as caught:
            await opening
        assert str(caught.value).startswith(advice)
        assert isinstance(caught.value, CrawlFormatError)
    out = io.StringIO()
    code = await producer_main(["--redis-url", redis_url, "--crawl", crawl_name, "--cluster",
                                "no", "--progress", "off", "--url", "http://a.test/new"],
                               out=out)
    assert code == 2
    assert advice in capsys.readouterr().err
    for command in (["stats"], ["fsck"], ["dead", "ls"]):
        code = await console_cli.main_async([*command, "--crawl", crawl_name, "--redis-url",
                                             redis_url, "--cluster", "no"])
        assert code == 2, command
        err = capsys.readouterr().err
        assert advice in err and "crawlq crawls lists them" not in err, command
    assert await contents(redis_client, crawl_name) == before  # nothing converted


async def test_a_consumer_opening_the_crawl_converts_it(redis_client: aioredis.Redis,
                                                        crawl_name: str) -> None:
    old, expected = await live_crawl(redis_client, crawl_name)
    q = await LeasingQueue.existing(redis_client, crawl_name)
    assert q.settings == CrawlSettings(partitions=2)
    for pk in old.crawl.partitions:
        assert {_text(h) for h in await redis_client.hkeys(pk.hosts)} == {
            h for h in expected if old.pk(h) == pk}
        assert not await redis_client.exists(*layout2_keys(crawl_name, pk.partition))
    assert (await LeasingQueue.open(redis_client, crawl_name)).settings == q.settings


async def test_a_consumer_process_converts_the_crawl_before_it_reads_its_policy(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """The real start: the consumer's policy write reads the crawl's partitions, so the
    conversion comes first. A crawl whose tasks are all done or dead: it exits at once."""
    await create_policy(redis_client, crawl_name, {"per_host_delay": 0}, by="test")
    old = await Layout2.create(redis_client, crawl_name)
    await old.dead("e.test", "http://e.test/1", 3, "http_4xx")
    await old.done("e.test", 4)
    await old.hostconf("e.test", "0,3,,0,0,,0")
    settings = settings_from_args(build_parser().parse_args(
        consumer_args(redis_url, crawl_name, tmp_path)))
    assert await asyncio.wait_for(consumer_run(settings), 60) == 0
    assert (await settings_of(redis_client, crawl_name))["format"] == FORMAT
    assert await host_record(redis_client, old.pk("e.test"), "e.test") == HostRecord(
        done=4, delay=0, conc=3)


async def test_fsck_repair_converts_the_crawl_first(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        monkeypatch: pytest.MonkeyPatch, console_cli: types.ModuleType) -> None:
    old, expected = await live_crawl(redis_client, crawl_name)
    seen: list[str] = []

    class Checked(Exception):
        pass

    async def fsck(queue: CrawlQueue, *, fix: bool = False) -> Any:
        """fsck's own checks (console/fsck/'s job): what they were given."""
        seen.append(f"{queue.crawl} {queue.settings.partitions} {fix}")
        raise Checked

    monkeypatch.setattr(importlib.import_module("console.cli.checks"), "fsck", fsck)
    with pytest.raises(Checked):
        await console_cli.main_async(["fsck", "--repair", "--crawl", crawl_name, "--redis-url",
                           redis_url, "--cluster", "no"])
    assert seen == [f"{crawl_name} 2 True"]
    for pk in old.crawl.partitions:
        assert await redis_client.hlen(pk.hosts) == sum(old.pk(h) == pk for h in expected)


async def test_concurrent_conversions_convert_each_partition_once(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Four processes at once: one converts, the others wait for its lock and find the
    crawl converted (each partition's script runs once: slowed down here, so the others
    are sure to come while it runs)."""
    old, expected = await live_crawl(redis_client, crawl_name)
    runs: list[int] = []

    def slow(client: Any, name: str) -> Any:
        script = register(client, name)
        if name != "migrate":
            return script

        async def call(keys: Any = None, args: Any = None) -> Any:
            runs.append(1)
            await asyncio.sleep(0.1)
            return await script(keys=keys, args=args)
        return call

    monkeypatch.setattr("common.queue.migrate.register", slow)
    monkeypatch.setattr("common.queue.migrate.POLL_S", 0.01)
    caplog.set_level(logging.INFO, logger="crawlq.migrate")
    done = await asyncio.gather(*(migrate_crawl(redis_client, crawl_name) for _ in range(4)))
    assert sorted(done) == [0, 0, 0, 2]
    assert len(runs) == 2
    assert [r.getMessage() for r in caplog.records].count("crawl_migrated") == 2  # 2->3->4
    assert not await redis_client.exists(CrawlKeys.build(crawl_name).migrate_lock)
    for pk in old.crawl.partitions:
        assert await redis_client.hlen(pk.hosts) == sum(old.pk(h) == pk for h in expected)


async def test_a_conversion_held_elsewhere_too_long_is_given_up(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    await live_crawl(redis_client, crawl_name)
    await redis_client.set(CrawlKeys.build(crawl_name).migrate_lock, "another process", px=60_000)
    before = await contents(redis_client, crawl_name)
    monkeypatch.setattr("common.queue.migrate.POLL_S", 0.01)
    with pytest.raises(MigrationBusyError, match=r"being converted .* by another process"):
        await migrate_crawl(redis_client, crawl_name, wait_s=0.2)
    assert await contents(redis_client, crawl_name) == before
    assert await redis_client.get(CrawlKeys.build(crawl_name).migrate_lock) == b"another process"


async def test_a_crawl_older_than_layout_2_is_still_refused(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    raw = CrawlSettings().to_json().replace(f'"format":{FORMAT}', '"format":1')
    assert raw != CrawlSettings().to_json()
    await redis_client.hset(CrawlKeys.build(crawl_name).meta, "settings", raw)
    with pytest.raises(CrawlFormatError, match="re-create it"):
        await migrate_crawl(redis_client, crawl_name)
    assert await migrate_crawl(redis_client, crawl_name + "-none") == 0
