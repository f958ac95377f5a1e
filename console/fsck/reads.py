"""What a check reads of one partition (`Partition`, by `read_partition`): a page at a time
(SCAN, ZSCAN, HSCAN with COUNT; LRANGE and ZRANGE pages), so a read never blocks Redis."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from common.codec import text as _text
from common.hostmodel.hostrec import HostRecord, HostRecordError
from common.keys import HASHTABLE_FIELD, LEGACY_HASHTABLE_FIELD, PartitionKeys
from common.queue import CrawlQueue
from common.revisits.record import HistoryRecord, decode_record
from common.tasks.task import queued_id
from console.fsck.groups import held_slots, read_groups
from console.fsck.render import RenderLane, read_render

#: The most values one read asks Redis for (SCAN COUNT, a page of LRANGE or ZRANGE) and
#: the most hosts or ids one repair call takes.
PAGE = 1000


#: A lease record "<owner> <attempt> <host> <priority> <entry>" (lib/leases.lua).
_LEASE = re.compile(rb"(\S+) \d+ (\S+) \d+ ")


#: The marks of a lease record's owner: its response is in (its host's slot given back,
#: so inflight no longer counts it), and it holds a page of its host's budget.
FETCHED, BUDGETED = b"f", b"b"


async def _zscan(client: Any, key: str) -> dict[str, float]:
    return {_text(m): s async for m, s in client.zscan_iter(key, count=PAGE)}


async def _hscan(client: Any, key: str) -> dict[str, bytes]:
    return {_text(k): v async for k, v in client.hscan_iter(key, count=PAGE)}


async def _entries(client: Any, hq: str, hp: str) -> AsyncIterator[str]:
    """The ids of a host's pending entries, a page at a time."""
    for key, read in ((hq, client.lrange), (hp, client.zrange)):
        start = 0
        while True:
            page = await read(key, start, start + PAGE - 1)
            for entry in page:
                yield queued_id(entry)
            if len(page) < PAGE:
                break
            start += PAGE


@dataclass(frozen=True, slots=True)
class Lease:
    """What fsck reads of a lease record."""

    host: str
    fetched: bool  # its response is in: its host's slot was given back
    budgeted: bool  # it holds a page of its host's budget


def parse_lease(value: bytes) -> Lease | None:
    m = _LEASE.match(value)
    if not m:
        return None
    owner = m.group(1)
    fetched = owner.startswith(FETCHED)
    return Lease(_text(m.group(2)), fetched,
                  owner[int(fetched):].startswith(BUDGETED))


@dataclass(frozen=True, slots=True)
class Conf:
    """The crawl's politeness defaults a partition's ``conf`` holds (lib/hosts.lua's
    crawl_conf)."""

    conc: int  # 0: no limit
    delay: int  # ms
    adapt: int  # adaptive_delay, thousandths (0: off)
    max_delay: int  # ms


@dataclass(slots=True)
class Partition:
    """What a check reads of one partition."""

    pk: PartitionKeys
    records: dict[str, HostRecord] = field(default_factory=dict)
    unreadable: dict[str, int] = field(default_factory=dict)  # host -> its record's bytes
    index: dict[str, float] = field(default_factory=dict)  # h:queued
    due: dict[str, float] = field(default_factory=dict)
    prio: dict[str, float] = field(default_factory=dict)
    held: dict[str, tuple[int, int, float | None]] = field(default_factory=dict)
    conf: Conf = field(default_factory=lambda: Conf(0, 0, 0, 0))
    leased: dict[str, Lease] = field(default_factory=dict)
    bad_leases: set[str] = field(default_factory=set)  # lease records that don't parse
    leases: dict[str, float] = field(default_factory=dict)  # deadlines
    bodies: dict[str, bytes] = field(default_factory=dict)
    delayed: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    pending_ids: Counter[str] = field(default_factory=Counter)
    pending: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    dead_reasons: int = 0
    rv_due: set[str] = field(default_factory=set)
    rv_hosts: dict[str, str] = field(default_factory=dict)  # history record id -> host
    rv_unscheduled: set[str] = field(default_factory=set)  # recrawl windows' records
    group_records: dict[str, bytes] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)  # host -> its group
    group_held: Counter[str] = field(default_factory=Counter)  # host -> group slots held
    grouping: bool = False  # the crawl's politeness_key is not host (conf gkey)
    render: RenderLane = field(default_factory=RenderLane)

    def leased_ids(self) -> set[str]:
        return {*self.leased, *self.bad_leases}


async def _queue_hosts(client: Any, pk: PartitionKeys) -> set[str]:
    """Hosts with a queue key in this partition (SCAN, COUNT PAGE)."""
    base = pk.pattern()[:-1]
    found: set[str] = set()
    for kind in ("hq:", "hp:"):
        async for key in client.scan_iter(match=base + kind + "*", count=PAGE):
            found.add(_text(key)[len(pk.prefix) + len(kind):])
    return found


async def read_partition(queue: CrawlQueue, pk: PartitionKeys) -> Partition:
    client = queue.client
    part = Partition(pk)
    for host, value in (await _hscan(client, pk.hosts)).items():
        try:
            part.records[host] = HostRecord.decode(value)
        except HostRecordError:
            part.unreadable[host] = len(value)
    part.index = await _zscan(client, pk.queued)
    part.due = await _zscan(client, pk.due)
    part.prio = await _zscan(client, pk.prio_hosts)
    leased = await _hscan(client, pk.leased)
    leased.pop(HASHTABLE_FIELD, None)
    leased.pop(LEGACY_HASHTABLE_FIELD, None)
    part.group_held = held_slots(leased)
    part.group_records, part.group_of = await read_groups(client, pk)
    part.grouping = bool(await client.hget(pk.conf, "gkey"))
    for tid, value in leased.items():
        if (lease := parse_lease(value)) is None:
            part.bad_leases.add(tid)
        else:
            part.leased[tid] = lease
    part.leases = await _zscan(client, pk.leases)
    hosts = sorted({*part.records, *part.unreadable, *part.index, *part.due, *part.prio,
                    *(x.host for x in part.leased.values()),
                    *await _queue_hosts(client, pk)})
    part.conf = Conf(*(int(v or 0) for v in await client.hmget(
        pk.conf, ["concurrency", "delay", "adapt", "max_delay"])))
    for i in range(0, len(hosts), PAGE):
        batch = hosts[i:i + PAGE]
        async with client.pipeline(transaction=False) as pipe:
            for host in batch:
                pipe.llen(pk.host_queue(host))
                pipe.zrange(pk.host_prio(host), 0, 0, withscores=True)
                pipe.zcard(pk.host_prio(host))
            replies = await pipe.execute()
        for j, host in enumerate(batch):
            n, top, m = replies[3 * j:3 * j + 3]
            part.held[host] = (int(n), int(m), top[0][1] if top else None)
    part.bodies = await _hscan(client, pk.tasks)
    part.delayed = set(await _zscan(client, pk.delayed))
    part.dead = set(await _zscan(client, pk.dead))
    for host, (n, m, _) in part.held.items():
        if n or m:
            async for tid in _entries(client, pk.host_queue(host), pk.host_prio(host)):
                part.pending_ids[tid] += 1
    part.render = await read_render(client, pk)
    part.pending_ids.update(part.render.ids)
    part.pending = int(await client.get(pk.pending) or 0)
    part.stats = {_text(k): int(v) for k, v in (await client.hgetall(pk.stats)).items()}
    part.dead_reasons = sum(int(v) for v in (await client.hgetall(pk.dead_reasons)).values())
    part.rv_due = set(await _zscan(client, pk.rv_due))
    async for tid, record in _histories(queue, pk):
        part.rv_hosts[tid] = record.host
        if record.interval_s == 0:  # a recrawl window's record: never scheduled
            part.rv_unscheduled.add(tid)
    return part


async def _histories(queue: CrawlQueue, pk: PartitionKeys
                     ) -> AsyncIterator[tuple[str, HistoryRecord]]:
    """Every well-formed history record of a partition, by id: its ``rv:hist:<bucket>``
    HASHes found by SCAN (as its host queues are), each read by HSCAN."""
    client = queue.client
    pattern = pk.prefix.replace("{", "\\{").replace("}", "\\}") + "rv:hist:*"
    async for key in client.scan_iter(match=pattern, count=PAGE):
        async for name, value in client.hscan_iter(key, count=PAGE):
            record = decode_record(value)
            if record is not None and len(name) == 16:
                yield name.hex(), record
