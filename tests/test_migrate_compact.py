"""Converting a live crawl from layout 3 to layout 4: compact queued entries
(common/lua/compact_queues.lua, common.queue.migrate), against a real redis-server.

Layouts 3 and 4 differ only in the entries of the host queues (full: ``<32 hex id><url>
[ <json>]``; compact: common.tasks.task.compact_entry). A crawl of layout 3 is made here by
running this version's queue, then writing every queued entry back full and marking the
crawl's settings ``"format": 3``, as layout 3's scripts would have left it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.clock import redis_ms, window_passed
from support.history import histories

from common import codec
from common.codec import text as _text
from common.hostmodel.hostkey import host_key
from common.keys import CrawlKeys, PartitionKeys, layout3_history_key
from common.policy import set_policy
from common.queue import (
    FORMAT,
    Code,
    CrawlNeedsMigration,
    CrawlQueue,
    CrawlSettings,
    Failure,
    Lease,
    LeasingQueue,
    NewTask,
    RetryPolicy,
    migrate_crawl,
)
from common.redis.scripts import register
from common.revisits.previous import Observed
from common.revisits.record import HistoryRecord
from common.tasks.task import compact_entry, expand_entry
from common.urls.canonical import canonicalize, fingerprint

LEASE_MS = 60_000
#: big.test holds more than a chunk of the conversion (set small by the tests).
BIG = 9


def nt(url: str, priority: int = 0, max_attempts: int = 3) -> NewTask:
    canonical = canonicalize(url)
    assert isinstance(canonical, str), canonical
    return NewTask(canonical, fingerprint(canonical), priority=priority,
                   max_attempts=max_attempts)


@dataclass
class Layout3:
    """A crawl of layout 3 mid-run: what is pending (queued entries, full), leased (held
    by w1), waiting (a retry) and dead."""

    q: LeasingQueue
    held: list[Lease] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)  # urls
    waiting: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    #: (hq or hp key) -> its full entries (LIST: in order; ZSET: (entry, score))
    queues: dict[str, list[Any]] = field(default_factory=dict)


async def queued_keys(q: LeasingQueue) -> list[tuple[PartitionKeys, str]]:
    out = []
    for pk in q.partitions:
        out += [(pk, _text(h)) for h in await q.client.zrange(pk.queued, 0, -1)]
    return out


async def layout3_crawl(client: aioredis.Redis, name: str) -> Layout3:
    q = await LeasingQueue.open(client, name, CrawlSettings(partitions=2),
                                retry=RetryPolicy(base_ms=10, cap_ms=20))
    urls = [nt("http://lease.test/1"), nt("https://lease.test/2"),
            nt("http://retry.test/1"), nt("http://dead.test/1", max_attempts=1)]
    await q.enqueue(urls)
    held = await q.lease("w1", 10, LEASE_MS)
    assert len(held) == len(urls)
    by_url = {x.task.url: x for x in held}
    fails = [Failure(by_url["http://retry.test/1"], "http_5xx", "HTTP 503"),
             Failure(by_url["http://dead.test/1"], "http_4xx", "HTTP 404")]
    assert [c for c, _ in await q.fail("w1", fails)] == [Code.RETRY, Code.DEAD]
    crawl = Layout3(q, [by_url["http://lease.test/1"], by_url["https://lease.test/2"]],
                    waiting={"http://retry.test/1"}, dead={"http://dead.test/1"})
    pending = [nt(f"https://big.test/p{i}?q={i}") for i in range(BIG)]
    pending += [nt(f"http://big.test/prio{i}", priority=1 + i % 3) for i in range(BIG)]
    pending += [nt("http://a.test/1"), nt("https://a.test/2", priority=5),
                nt("http://b.test:8080/x"), nt("https://c.test/")]
    pending.append(NewTask("https://A.test/3", fingerprint("https://A.test/3")))  # whole
    assert (await q.enqueue(pending)).enqueued == len(pending)
    crawl.pending = {t.url for t in pending}
    # Back to layout 3: every queued entry full, and the crawl marked so.
    for pk, host in await queued_keys(q):
        hq, hp = pk.host_queue(host), pk.host_prio(host)
        entries = [expand_entry(e, host) for e in await client.lrange(hq, 0, -1)]
        prio = [(expand_entry(e, host), s)
                for e, s in await client.zrange(hp, 0, -1, withscores=True)]
        await client.delete(hq, hp)
        if entries:
            await client.rpush(hq, *entries)
        if prio:
            await client.zadd(hp, dict(prio))
        crawl.queues[hq], crawl.queues[hp] = entries, sorted(prio)
    meta = CrawlKeys.build(name).meta
    stored = codec.loads(await client.hget(meta, "settings"))
    stored["format"] = 3
    await client.hset(meta, "settings", codec.dumps(stored))
    return crawl


async def assert_compact(client: aioredis.Redis, crawl: Layout3, *, ordered: bool) -> None:
    """Every queue holds its layout-3 entries compact (the LIST in its order if
    `ordered`, else the same entries), and nothing else."""
    for pk, host in await queued_keys(crawl.q):
        hq, hp = pk.host_queue(host), pk.host_prio(host)
        want = [compact_entry(e.decode(), host) for e in crawl.queues[hq]]
        got = await client.lrange(hq, 0, -1)
        assert (got if ordered else Counter(got)) == (want if ordered else Counter(want)), host
        assert sorted(await client.zrange(hp, 0, -1, withscores=True)) == sorted(
            (compact_entry(e.decode(), host), s) for e, s in crawl.queues[hp]), host
        for e in [*got, *await client.zrange(hp, 0, -1)]:
            assert e[16:17] not in b"0123456789abcdef"  # compact


async def drive_to_the_end(crawl: Layout3, within: float = 30.0) -> None:
    """The held leases acked by their holder, then everything leased and acked once."""
    q = crawl.q = await LeasingQueue.existing(crawl.q.client, crawl.q.crawl,
                                              retry=RetryPolicy(base_ms=10, cap_ms=20))
    assert await q.ack("w1", [(x, "ok") for x in crawl.held]) == [Code.OK] * len(crawl.held)
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + within
    while True:
        await q.promote()
        leases = await q.lease("w2", 10, LEASE_MS)
        if leases:
            for x in leases:
                assert x.task.id == x.id and host_key(x.task.url) == x.host
            assert await q.ack("w2", [(x, "ok") for x in leases]) == [Code.OK] * len(leases)
            seen.update(x.task.url for x in leases)
            continue
        s = await q.stats()
        if s.pending == s.leased == s.waiting == 0:
            break
        assert time.monotonic() < deadline, f"not drained within {within:g}s: {s}"
        await asyncio.sleep(0.02)
    assert seen == Counter(crawl.pending | crawl.waiting)  # each once, none lost
    s = await q.stats()
    assert (s.dead, s.done) == (len(crawl.dead), len(crawl.pending | crawl.waiting) + 2)


async def test_a_layout_3_crawl_is_refused_until_converted_then_runs_to_the_end(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr("common.queue.migrate.CHUNK", 2)  # big.test: 5 calls a queue
    monkeypatch.setattr("common.queue.migrate.HOSTS_AT_ONCE", 2)
    crawl = await layout3_crawl(redis_client, crawl_name)
    for opening in (CrawlQueue.existing(redis_client, crawl_name),
                    CrawlQueue.open(redis_client, crawl_name)):
        with pytest.raises(CrawlNeedsMigration, match="holds layout 3: start a consumer"):
            await opening
    assert await migrate_crawl(redis_client, crawl_name) == 2
    stored = codec.loads(await redis_client.hget(CrawlKeys.build(crawl_name).meta, "settings"))
    assert stored["format"] == FORMAT == 4
    await assert_compact(redis_client, crawl, ordered=True)
    assert await migrate_crawl(redis_client, crawl_name) == 0
    await drive_to_the_end(crawl)


def dies_after(script_name: str, n: int) -> Any:
    """A stand-in for migrate's `register`: script `script_name` raises ConnectionError
    (the converting process died) from its (n + 1)th call on; the others are as ever."""
    calls = 0

    def cut(client: Any, name: str) -> Any:
        script = register(client, name)
        if name != script_name:
            return script

        async def call(keys: Any = None, args: Any = None, client: Any = None) -> Any:
            nonlocal calls
            calls += 1
            if calls > n:
                raise ConnectionError("the converting process died")
            return await script(keys=keys, args=args, client=client)
        call.resendable = False  # type: ignore[attr-defined]
        return call

    return cut


async def test_a_conversion_cut_short_is_redone(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr("common.queue.migrate.CHUNK", 2)
    monkeypatch.setattr("common.queue.migrate.HOSTS_AT_ONCE", 1)  # a call a round trip
    crawl = await layout3_crawl(redis_client, crawl_name)
    monkeypatch.setattr("common.queue.migrate.register", dies_after("compact_queues", 3))
    with pytest.raises(ConnectionError):
        await migrate_crawl(redis_client, crawl_name)
    with pytest.raises(CrawlNeedsMigration):  # still layout 3: the mark comes last
        await CrawlQueue.existing(redis_client, crawl_name)
    forms: Counter[bool] = Counter()
    for pk, host in await queued_keys(crawl.q):
        for e in [*await redis_client.lrange(pk.host_queue(host), 0, -1),
                  *await redis_client.zrange(pk.host_prio(host), 0, -1)]:
            forms[e[16:17] in b"0123456789abcdef"] += 1
    assert forms[True] and forms[False], forms  # some entries compact, some full
    monkeypatch.undo()
    assert await migrate_crawl(redis_client, crawl_name) == 2
    await assert_compact(redis_client, crawl, ordered=False)  # a LIST may be rotated
    await drive_to_the_end(crawl)


def text_record(r: HistoryRecord, tid: str) -> bytes:
    """`r` as layout 3's scripts wrote it: "<host> <prio> <interval_s> <fetched_s>
    <digest|-> [~n,x,t[,e] ]<#etag> <#lm> <etag><lm><full entry>"."""
    entry = expand_entry(bytes.fromhex(tid) + r.tail, r.host) if r.tail else b""
    sums = f"~{r.n:g},{r.x:g},{r.t:g}{'' if r.e is None else f',{r.e:g}'} " if r.n else ""
    etag, lm = r.etag.encode(), r.last_modified.encode()
    return (f"{r.host} {r.priority} {r.interval_s} {r.fetched_s} {r.digest or '-'} {sums}"
            f"{len(etag)} {len(lm)} ").encode() + etag + lm + entry


@dataclass
class History3:
    """A crawl of layout 3 whose done URLs' history is text records in one HASH."""

    urls: list[str]
    ids: dict[str, str]  # url -> id
    want: dict[str, HistoryRecord]  # what each record must convert to
    last_modified: str


async def layout3_history(redis_client: aioredis.Redis, crawl_name: str) -> History3:
    """Seven URLs done with their validators, their records written back as layout 3's
    scripts wrote them: urls[0]'s a recrawl window's (interval 0, no entry,
    unscheduled), urls[1]'s with the estimator's sums; and two no script could read."""
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await set_policy(redis_client, crawl_name, {
        "revisit": "learned", "recrawl_after": 1, "per_host_delay": 0.0,
        "per_host_concurrency": 0}, by="test", create=True)
    q.configure(revisits=True)
    urls = [f"https://h{i}.test/p/{i}?q={i}" for i in range(6)] + ["http://h6.test/x"]
    await q.enqueue([nt(u, priority=i % 2) for i, u in enumerate(urls)])
    leases = await q.lease("w", 10, LEASE_MS)
    assert len(leases) == len(urls)
    lm = "Wed, 21 Oct 2015 07:28:00 GMT"
    for lease in leases:
        lease.observed = Observed(f'"{lease.task.url}"', lm, "0123456789abcdef", -1)
    await q.ack("w", [(x, "ok") for x in leases])
    ids = {x.task.url: x.id for x in leases}
    want: dict[str, HistoryRecord] = {}
    for pk in q.partitions:
        for tid_, written in (await histories(q, pk)).items():
            assert written is not None
            record = want[tid_] = written
            if tid_ == ids[urls[0]]:  # the host is kept only with an entry
                record = replace(written, interval_s=0, tail=b"")
                want[tid_] = replace(record, host="")
                await redis_client.zrem(pk.rv_due, tid_)
            if tid_ == ids[urls[1]]:
                record = want[tid_] = replace(written, n=1.9, x=0.9, t=171.5, e=12.25)
            await redis_client.hset(layout3_history_key(pk), tid_, text_record(record, tid_))
        pattern = pk.prefix.replace("{", "\\{").replace("}", "\\}") + "rv:hist:*"
        await redis_client.delete(*[k async for k in redis_client.scan_iter(match=pattern)])
        await redis_client.hdel(pk.conf, "rv_urls")
    old0 = layout3_history_key(q.partitions[0])
    await redis_client.hset(old0, mapping={"f" * 32: "garbage", "not-an-id": "h 0 1 2 - 0 0 "})
    meta = CrawlKeys.build(crawl_name).meta
    stored = codec.loads(await redis_client.hget(meta, "settings"))
    stored["format"] = 3
    await redis_client.hset(meta, "settings", codec.dumps(stored))

    return History3(urls, ids, want, lm)


async def converted_history(redis_client: aioredis.Redis, q: LeasingQueue
                            ) -> tuple[dict[str, HistoryRecord | None], int]:
    """The records in the buckets, and what the partitions' rv_urls count, once no old
    rv:hist is left."""
    got: dict[str, HistoryRecord | None] = {}
    urls_kept = 0
    for pk in q.partitions:
        assert await redis_client.exists(layout3_history_key(pk)) == 0
        got.update(await histories(q, pk))
        urls_kept += int(await redis_client.hget(pk.conf, "rv_urls") or 0)
    return got, urls_kept


async def test_a_layout_3_crawls_history_converts_and_its_visits_ask_with_it(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Layout 3's text records in one rv:hist HASH become binary ones in their buckets
    (compact_history.lua, a chunk of ids a call): the same facts, the malformed ones
    dropped; then the schedule brings its URLs back and a recrawl window's record makes
    its recrawl conditional, each with the URL's own validators. Run again: nothing."""
    monkeypatch.setattr("common.queue.migrate.CHUNK", 2)
    h = await layout3_history(redis_client, crawl_name)
    urls, ids, want, lm = h.urls, h.ids, h.want, h.last_modified
    assert await migrate_crawl(redis_client, crawl_name) == 2
    assert await migrate_crawl(redis_client, crawl_name) == 0  # again: nothing to do
    q = await LeasingQueue.existing(redis_client, crawl_name)
    assert await converted_history(redis_client, q) == (want, len(want))
    q.configure(revisits=True, recrawl_after_s=1)
    past = await redis_ms(redis_client) - 5
    for pk in q.partitions:
        await redis_client.zadd(pk.rv_due, {ids[u]: past for u in urls[1:]
                                            if q.partition_of(host_key(u)) == pk.partition})
    await window_passed(redis_client, 2)
    assert (await q.enqueue([nt(urls[0])])).recrawled == 1  # its window's, with `v`
    await q.promote()
    again = await q.lease("w", 10, LEASE_MS)
    assert sorted(x.task.url for x in again) == sorted(urls)
    for x in again:
        v = x.task.revisit
        assert v is not None and (v.etag, v.last_modified, v.digest) == (
            f'"{x.task.url}"', lm, "0123456789abcdef"), x.task.url
        assert v.interval_s == want[x.id].interval_s


async def test_a_history_conversion_cut_short_is_redone(
        redis_client: aioredis.Redis, crawl_name: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """The process converting dies after two compact_history calls of 2 ids: the crawl
    is still layout 3 (the mark comes last), some records converted, some not; the next
    run converts the rest, each record once."""
    monkeypatch.setattr("common.queue.migrate.CHUNK", 2)
    h = await layout3_history(redis_client, crawl_name)
    monkeypatch.setattr("common.queue.migrate.register", dies_after("compact_history", 2))
    with pytest.raises(ConnectionError):
        await migrate_crawl(redis_client, crawl_name)
    with pytest.raises(CrawlNeedsMigration):
        await CrawlQueue.existing(redis_client, crawl_name)
    q = LeasingQueue(redis_client, crawl_name, CrawlSettings(partitions=2))
    halfway = {tid for pk in q.partitions for tid in await histories(q, pk)}
    assert 0 < len(halfway) < len(h.want)
    monkeypatch.undo()
    assert await migrate_crawl(redis_client, crawl_name) == 2
    q = await LeasingQueue.existing(redis_client, crawl_name)
    assert await converted_history(redis_client, q) == (h.want, len(h.want))
