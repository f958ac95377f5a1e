"""Reading a crawl's state: counts (stats), whether it is empty, one task's state."""

from __future__ import annotations

import redis.asyncio as aioredis

from common.codec import text as _text
from common.hostmodel.hostkey import host_key
from common.hostmodel.hostrec import HostRecord
from common.keys import PartitionKeys
from common.queue.crawl import Crawl, DedupMode
from common.queue.model import Stats
from common.queue.revisits import revisit_stats
from common.tasks.task import queued_id

#: Replies per partition of the stats pipeline.
_READS = 13


async def stats(crawl: Crawl) -> Stats:
    """Every state's count and every counter, summed over the partitions, and the revisit
    schedule's numbers when it is in use."""
    seconds, micros = await crawl.client.time()
    now_ms = seconds * 1000 + micros // 1000
    async with crawl.client.pipeline(transaction=False) as pipe:
        for pk in crawl.partitions:
            pipe.get(pk.pending)
            pipe.zcard(pk.leases)
            pipe.zcard(pk.delayed)
            pipe.zcard(pk.dead)
            pipe.zcard(pk.due)
            pipe.hgetall(pk.stats)
            pipe.hgetall(pk.dead_reasons)
            pipe.zrange(pk.budget, 0, -1)
            pipe.hget(pk.conf, "rv")
            pipe.hget(pk.conf, "rv_urls")  # history records: kept by ack and purge
            pipe.zcard(pk.rv_due)
            pipe.zcount(pk.rv_due, "-inf", now_ms)
            pipe.get(pk.render_pending)
        replies = await pipe.execute()
    s = Stats()
    budgeted: list[tuple[PartitionKeys, list[str]]] = []
    revisits_on, histories, scheduled, due_now = False, 0, 0, 0
    for i in range(0, len(replies), _READS):
        (pending, leased, waiting, dead, due, counters, reasons, hosts, rv, hist, sched,
         rv_due, render) = replies[i:i + _READS]
        if hosts:
            budgeted.append((crawl.partitions[i // _READS], [_text(h) for h in hosts]))
        s.pending += int(pending or 0)
        s.render_pending += int(render or 0)
        s.leased += leased
        s.waiting += waiting
        s.dead += dead
        s.hosts_due += due
        for k, v in counters.items():
            s.counters[_text(k)] = s.counters.get(_text(k), 0) + int(v)
        for k, v in reasons.items():
            s.dead_reasons[_text(k)] = s.dead_reasons.get(_text(k), 0) + int(v)
        revisits_on = revisits_on or int(rv or 0) > 0
        histories += int(hist or 0)
        scheduled += sched
        due_now += rv_due
    if budgeted:
        s.parked = await _parked(crawl, budgeted)
    if revisits_on or histories or scheduled:
        s.revisits = revisit_stats(s.counters, scheduled, due_now)
    return s


async def _parked(crawl: Crawl, budgeted: list[tuple[PartitionKeys, list[str]]]) -> int:
    """The pending tasks of the hosts (those with a budget, per partition) whose
    budget is spent by pages used and held (lib/hosts.lua's budget_left)."""
    async with crawl.client.pipeline(transaction=False) as pipe:
        for pk, hosts in budgeted:
            pipe.hmget(pk.hosts, hosts)
        replies = await pipe.execute()
    parked = 0
    for values in replies:
        for value in values:
            record = HostRecord.decode(value)
            if record.budget_spent:
                parked += record.queued
    return parked


async def is_empty(crawl: Crawl) -> bool:
    """Whether nothing is pending (but tasks parked by a spent budget), leased or
    waiting, and no revisit is due (with revisits on), in the whole crawl, read atomically
    (one script over every partition on one Redis; per partition on a cluster, where a
    task never moves between partitions and children are enqueued before their
    parent's ack, so a crawl read empty partition by partition twice in a row is
    empty)."""
    def keys(pk: PartitionKeys) -> list[str]:
        return [pk.pending, pk.leases, pk.delayed, pk.due, pk.conf, pk.rv_due,
                pk.render_pending]

    if not isinstance(crawl.client, aioredis.RedisCluster):
        every = [k for pk in crawl.partitions for k in keys(pk)]
        return int(await crawl.scripts.is_empty(keys=every, args=[])) == 1
    for _ in range(2):
        for pk in crawl.partitions:
            if int(await crawl.scripts.is_empty(keys=keys(pk), args=[])) == 0:
                return False
    return True


async def state_of(crawl: Crawl, tid: str, url: str | None = None) -> str:
    """The state of one task: pending, leased, waiting, dead, done or unknown.

    Looks for a pending entry in its host's queue (every host's without `url`):
    O(pending), for tests and tools, never on a hot path.
    """
    hosts: list[tuple[PartitionKeys, str]] = []
    parts = crawl.partitions
    if url is not None:
        parts = [parts[crawl.partition_of(host_key(url))]]
        hosts = [(parts[0], host_key(url))]
    for pk in parts:
        async with crawl.client.pipeline(transaction=False) as pipe:
            pipe.hexists(pk.leased, tid)
            pipe.zscore(pk.delayed, tid)
            pipe.zscore(pk.dead, tid)
            pipe.zrangebyscore(pk.queued, 1, "+inf")
            leased, waiting, dead, queued = await pipe.execute()
        if leased:
            return "leased"
        for name, value in (("waiting", waiting), ("dead", dead)):
            if value is not None:
                return name
        if url is None:
            hosts += [(pk, _text(h)) for h in queued]
    for pk, host in hosts:
        async with crawl.client.pipeline(transaction=False) as pipe:
            pipe.lrange(pk.host_queue(host), 0, -1)
            pipe.zrange(pk.host_prio(host), 0, -1)
            entries, prio = await pipe.execute()
        if any(queued_id(e) == tid for e in (*entries, *prio)):
            return "pending"
    fp = bytes.fromhex(tid)
    for pk in parts:
        if await _seen(crawl, pk, fp):
            return "done"
    return "unknown"


async def _seen(crawl: Crawl, pk: PartitionKeys, fp: bytes) -> bool:
    if crawl.settings.dedup is DedupMode.BLOOM:
        return True  # a bloom crawl can't tell a done URL from one never enqueued
    return bool(await crawl.client.hexists(*crawl.seen_mark(pk, fp.hex())))
