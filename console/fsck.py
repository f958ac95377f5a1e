"""``crawlq fsck``: check a crawl's invariants partition by partition, and repair what can be.

What is checked, per partition (``common/keys.py`` has the schema):

- every task is in exactly one state: a task id is in at most one of the host queues
  (``hq:<host>``/``hp:<host>``, once), ``leased`` (its lease record), ``delayed`` and
  ``dead``;
- each host's record (``hosts``, ``common.hostmodel.hostrec``) can be read and counts
  what is there: queued == the entries its queues hold, inflight == its lease records
  without the fetched mark, reserved == those with the budget mark; the ``h:queued``
  index == the records' queued counts, ``pending`` == the entries of all host queues;
- ``due`` holds exactly the hosts the due rule (lib/hosts.lua's turn_of) makes due:
  pending entries, a free slot and budget left, on the counts as they should be, each at
  its turn (unless a taught pace, which fades with time, sets it); and ``prio_hosts`` the
  hosts with priority entries, at their highest priority;
- every lease record has a deadline in ``leases`` and every deadline a lease record;
  every body in ``tasks`` is a waiting or dead task's, and every waiting or dead task has
  one;
- the stats: ``enqueued`` + ``revisits`` (a revisit is done once more without an enqueue)
  == pending + leased + waiting + dead + done + purged + lost_pending, and the
  ``dead_reasons`` add up to ``dead``;
- the revisit schedule: every id in ``rv:due`` has a history and no other state, every
  history is scheduled or being revisited (``console.fsck_revisits``);
- the politeness groups: each group's record counts in flight the lease records holding
  a slot of it (``console.fsck_groups``); a grouped host's place in ``due`` (which also
  follows its group's turn, or leaves it while the group is full) is not judged;
- the render lane: ``r:due`` holds exactly the hosts with render entries, ``r:pending``
  counts them, and ``pending`` counts them too (``console.fsck_render``).

Reads are bounded per call (SCAN, ZSCAN, HSCAN with COUNT; LRANGE and ZRANGE pages), so
a check never blocks Redis; it is not a snapshot, so on a running crawl a task that moved
between two reads can show as a problem: check a quiet crawl, or check twice.

``repair`` fixes what it can through scripts, each call atomic and each host or id
checked again inside it, so it is safe on a running crawl: ``fsck_repair.lua`` sets the
hosts found wrong right through the host ledger (a record of the wrong size rebuilt,
queued recounted from the queues, inflight and reserved from the lease records, then
prio_hosts, ``due`` by the due rule, the h:queued index, pending); ``fsck_orphans.lua``
gives a lease record with no deadline one that has passed (the reaper's reclaim takes it
back), drops a deadline with no lease record, and drops a stale body from ``tasks`` or
puts a task that has only its body there back in its host's queue;
``fsck_revisits.lua`` sets the schedule of the ids found wrong right; ``fsck_groups.lua``
recounts the slots of the groups found wrong. What it can't fix
(an id in two states, a lease record it can't read, a waiting or dead task with no body,
counters that don't add up) is reported, for an operator to decide.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from common.codec import text as _text
from common.hostmodel.hostrec import FORMAT as RECORD
from common.hostmodel.hostrec import HostRecord, HostRecordError
from common.keys import HASHTABLE_FIELD, LEGACY_HASHTABLE_FIELD, PartitionKeys
from common.queue import CrawlQueue
from common.redis.scripts import register
from common.revisits.record import HistoryRecord, decode_record
from common.tasks.task import queued_id
from console.fsck_groups import KINDS as GROUP_KINDS
from console.fsck_groups import group_findings, held_slots, read_groups, repair_groups
from console.fsck_render import KINDS as RENDER_KINDS
from console.fsck_render import RenderLane, read_render, render_findings, repair_render
from console.fsck_revisits import KINDS as SCHEDULE_KINDS
from console.fsck_revisits import describe, repair_schedule, schedule_findings

#: The most values one read asks Redis for (SCAN COUNT, a page of LRANGE or ZRANGE) and
#: the most hosts or ids one repair call takes.
PAGE = 1000
UNLIMITED = 10**9
#: A lease record "<owner> <attempt> <host> <priority> <entry>" (lib/leases.lua).
_LEASE = re.compile(rb"(\S+) \d+ (\S+) \d+ ")
#: The marks of a lease record's owner: its response is in (its host's slot given back,
#: so inflight no longer counts it), and it holds a page of its host's budget.
FETCHED, BUDGETED = b"f", b"b"
#: Problems fsck_repair.lua fixes, host by host.
HOST_KINDS = frozenset({"host_record", "host_queued", "queued_index", "inflight",
                        "reserved", "due_missing", "due_extra", "due_turn", "prio_hosts",
                        "pending"})
#: Problems fsck_orphans.lua fixes, id by id.
ORPHAN_KINDS = frozenset({"lease_no_deadline", "deadline_no_lease", "orphan_body"})
#: Problems the repair fixes (the others are reported only).
REPAIRABLE = HOST_KINDS | ORPHAN_KINDS | SCHEDULE_KINDS | GROUP_KINDS | RENDER_KINDS


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant. ``kind`` is a stable code (REPAIRABLE lists the ones
    ``repair`` fixes); ``message`` says what, where and the counts. A politeness group's
    problem names the group in ``host``."""

    kind: str
    partition: int
    message: str
    host: str | None = None
    id: str | None = None

    @property
    def repairable(self) -> bool:
        return self.kind in REPAIRABLE

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "repairable": self.repairable}


def _n(n: int, noun: str, plural: str = "") -> str:
    return f"{n} " + (noun if n == 1 else plural or noun + "s")


def _hosts(n: int) -> str:
    return _n(n, "host")


@dataclass(slots=True)
class Repair:
    """What one partition's repair changed (sums of the repair scripts' replies)."""

    partition: int
    recounted: int = 0  # hosts whose queued count changed
    lost: int = 0  # entries counted queued that no queue held
    leases_fixed: int = 0  # hosts whose inflight or reserved count changed
    index_fixed: int = 0  # hosts whose h:queued entry was set to their record's count
    rebuilt: int = 0  # host records of the wrong size rebuilt
    pending_before: int = 0
    pending_after: int = 0
    due_added: int = 0
    due_removed: int = 0
    deadlines_added: int = 0  # lease records given a deadline that has passed
    deadlines_removed: int = 0  # deadlines with no lease record
    bodies_dropped: int = 0  # stale copies in tasks of pending or leased tasks
    bodies_queued: int = 0  # tasks with only a body, put back in their hosts' queues
    unscheduled: int = 0  # ids taken out of rv:due
    scheduled: int = 0  # histories put in rv:due
    groups_fixed: int = 0  # politeness groups whose slot count was recounted
    render_fixed: int = 0  # hosts put in or taken out of r:due

    def changed(self) -> bool:
        return any(v for k, v in asdict(self).items()
                   if k not in ("partition", "pending_before", "pending_after")) \
            or self.pending_before != self.pending_after

    def text(self) -> str:
        parts = []
        if self.rebuilt:
            parts.append(f"the records of {_hosts(self.rebuilt)} rebuilt (unreadable)")
        if self.recounted:
            parts.append(f"queued of {_hosts(self.recounted)} recounted from the queues "
                         f"({self.lost} entries were missing)")
        if self.pending_before != self.pending_after:
            parts.append(f"pending {self.pending_before} -> {self.pending_after}")
        if self.leases_fixed:
            parts.append(f"inflight and reserved of {_hosts(self.leases_fixed)} recounted "
                         "from the lease records")
        if self.index_fixed:
            parts.append(f"h:queued of {_hosts(self.index_fixed)} set to their records'")
        if self.due_added or self.due_removed:
            parts.append(f"due: {self.due_added} added, {self.due_removed} removed")
        if self.deadlines_added:
            parts.append(f"{_n(self.deadlines_added, 'lease record')} given a passed "
                         "deadline (reclaim takes them back)")
        if self.deadlines_removed:
            parts.append(f"{_n(self.deadlines_removed, 'deadline')} with no lease record "
                         "removed")
        if self.bodies_dropped:
            parts.append(f"{_n(self.bodies_dropped, 'stale body', 'stale bodies')} "
                         "dropped from tasks")
        if self.bodies_queued:
            parts.append(f"{_n(self.bodies_queued, 'task')} in no state queued again")
        if self.unscheduled or self.scheduled:
            parts.append(f"rv:due: {self.scheduled} scheduled, {self.unscheduled} removed")
        if self.groups_fixed:
            parts.append(f"slots of {_n(self.groups_fixed, 'group')} recounted from the "
                         "lease records")
        if self.render_fixed:
            parts.append(f"r:due of {_hosts(self.render_fixed)} set to their render queues'")
        return f"partition {self.partition}: repaired " + ("; ".join(parts) or "nothing")


@dataclass(slots=True)
class Report:
    """A check (and a repair): the problems found, what was repaired, what remains."""

    crawl: str
    partitions: int
    problems: list[Problem] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    remaining: list[Problem] = field(default_factory=list)  # after the repair
    checked: Counter[str] = field(default_factory=Counter)  # hosts, pending, leased, ...
    repaired: bool = False  # a repair ran (then `remaining` is what a second check found)

    @property
    def clean(self) -> bool:
        """Nothing wrong is left (none found, or all repaired)."""
        return not (self.remaining if self.repaired else self.problems)

    def to_json(self) -> dict[str, Any]:
        return {"crawl": self.crawl, "partitions": self.partitions, "clean": self.clean,
                "checked": dict(self.checked),
                "problems": [p.to_json() for p in self.problems],
                "repaired": [asdict(r) for r in self.repairs],
                "remaining": [p.to_json() for p in self.remaining]}


# -- reads ---------------------------------------------------------------------------------


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
class _Lease:
    """What fsck reads of a lease record."""

    host: str
    fetched: bool  # its response is in: its host's slot was given back
    budgeted: bool  # it holds a page of its host's budget


def _lease(value: bytes) -> _Lease | None:
    m = _LEASE.match(value)
    if not m:
        return None
    owner = m.group(1)
    fetched = owner.startswith(FETCHED)
    return _Lease(_text(m.group(2)), fetched,
                  owner[int(fetched):].startswith(BUDGETED))


@dataclass(frozen=True, slots=True)
class _Conf:
    """The crawl's politeness defaults a partition's ``conf`` holds (lib/hosts.lua's
    crawl_conf)."""

    conc: int  # 0: no limit
    delay: int  # ms
    adapt: int  # adaptive_delay, thousandths (0: off)
    max_delay: int  # ms


@dataclass(slots=True)
class _Partition:
    """What a check reads of one partition."""

    pk: PartitionKeys
    records: dict[str, HostRecord] = field(default_factory=dict)
    unreadable: dict[str, int] = field(default_factory=dict)  # host -> its record's bytes
    index: dict[str, float] = field(default_factory=dict)  # h:queued
    due: dict[str, float] = field(default_factory=dict)
    prio: dict[str, float] = field(default_factory=dict)
    held: dict[str, tuple[int, int, float | None]] = field(default_factory=dict)
    conf: _Conf = field(default_factory=lambda: _Conf(0, 0, 0, 0))
    leased: dict[str, _Lease] = field(default_factory=dict)
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


async def _read(queue: CrawlQueue, pk: PartitionKeys) -> _Partition:
    client = queue.client
    part = _Partition(pk)
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
        if (lease := _lease(value)) is None:
            part.bad_leases.add(tid)
        else:
            part.leased[tid] = lease
    part.leases = await _zscan(client, pk.leases)
    hosts = sorted({*part.records, *part.unreadable, *part.index, *part.due, *part.prio,
                    *(x.host for x in part.leased.values()),
                    *await _queue_hosts(client, pk)})
    part.conf = _Conf(*(int(v or 0) for v in await client.hmget(
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


# -- checks --------------------------------------------------------------------------------


def _host_of(body: bytes | None) -> str | None:
    return _text(body).split(" ", 1)[0] if body else None


def _slots(conc: int) -> str:
    return "unlimited" if conc >= UNLIMITED else str(conc)


def _frontier_problems(p: int, part: _Partition) -> Iterable[Problem]:
    inflight: Counter[str] = Counter(
        x.host for x in part.leased.values() if not x.fetched)
    reserved: Counter[str] = Counter(x.host for x in part.leased.values() if x.budgeted)
    total = 0
    for host, (n, m, top) in sorted(part.held.items()):
        held = n + m
        total += held
        if part.prio.get(host) != top:
            yield Problem("prio_hosts", p, f"partition {p} host {host}: prio_hosts says "
                          f"{part.prio.get(host)}, its priority queue's head {top}",
                          host=host)
        if host in part.unreadable:  # the repair rebuilds it, its counts recounted
            yield Problem("host_record", p, f"partition {p} host {host}: its record is "
                          f"{part.unreadable[host]} bytes, not {RECORD.size} "
                          "(unreadable: every script that meets it stops)", host=host)
            continue
        record = part.records.get(host, HostRecord())
        if record.queued != held:
            yield Problem("host_queued", p, f"partition {p} host {host}: its record counts "
                          f"{record.queued} queued, its queues hold {held} (hq {n}, hp {m})",
                          host=host)
        if (indexed := int(part.index.get(host, 0))) != record.queued:
            yield Problem("queued_index", p, f"partition {p} host {host}: h:queued says "
                          f"{indexed}, its record counts {record.queued} queued", host=host)
        if record.inflight != inflight[host]:
            yield Problem("inflight", p, f"partition {p} host {host}: its record counts "
                          f"{record.inflight} in flight, it holds {inflight[host]} leases "
                          "whose response is not in", host=host)
        if record.reserved != reserved[host]:
            yield Problem("reserved", p, f"partition {p} host {host}: its record counts "
                          f"{record.reserved} pages reserved, {reserved[host]} of its leases "
                          "hold a page of its budget", host=host)
        # A grouped host's place in due also follows its group's record (parked while the
        # group is full): the lease call sets it right, this check does not judge it.
        if not (part.grouping and host in part.group_of):
            yield from _due_problems(p, part, host, replace(
                record, queued=held, inflight=inflight[host], reserved=reserved[host]))
    if part.pending != total + part.render.total:
        yield Problem("pending", p, f"partition {p}: pending is {part.pending}, the host "
                      f"queues hold {total} and the render queues {part.render.total} "
                      "(the records count "
                      f"{sum(r.queued for r in part.records.values())})")


def _due_problems(p: int, part: _Partition, host: str, r: HostRecord) -> Iterable[Problem]:
    """`host` in ``due`` or not, and at its turn, by the due rule (lib/hosts.lua's
    turn_of) on its record `r` as it should be."""
    cc = part.conf
    conc = cc.conc if r.conc is None else r.conc
    conc = conc if conc > 0 else UNLIMITED
    free = r.inflight < conc
    if r.queued and free and not r.budget_spent:
        if host not in part.due:
            yield Problem("due_missing", p, f"partition {p} host {host}: not in due, but it "
                          f"has {r.queued} pending and a free slot ({r.inflight} of "
                          f"{_slots(conc)} in flight)", host=host)
        elif r.pace == 0 and int(part.due[host]) != (turn := _turn(r, cc)):
            # (A taught pace fades with time: a turn with one is not checked.)
            yield Problem("due_turn", p, f"partition {p} host {host}: in due at "
                          f"{int(part.due[host])}, its turn is {turn} (its last request "
                          "+ its delay, or its block's end; ms of Redis TIME)", host=host)
    elif host in part.due:
        why = ("no pending entries" if not r.queued
               else f"no free slot ({r.inflight} of {_slots(conc)} in flight)" if not free
               else "its page budget spent")
        yield Problem("due_extra", p, f"partition {p} host {host}: in due with {why}",
                      host=host)


def _turn(r: HostRecord, cc: _Conf) -> int:
    """A host's turn with no pace (lib/hosts.lua's host_limits and turn_of)."""
    delay = cc.delay if r.delay is None else r.delay
    if r.robots is not None:
        delay = max(delay, r.robots)
    delay = max(delay, r.adaptive_ms(cc.adapt, cc.max_delay))
    return max(r.last + delay, r.blocked)


def _state_problems(p: int, part: _Partition) -> Iterable[Problem]:
    leased = part.leased_ids()
    places: dict[str, list[str]] = defaultdict(list)
    for tid, n in part.pending_ids.items():
        places[tid] += ["pending"] * n
    for name, ids in (("leased", leased), ("waiting", part.delayed),
                      ("dead", part.dead)):
        for tid in ids:
            places[tid].append(name)
    for tid, where in sorted(places.items()):
        if len(where) > 1:
            yield Problem("two_states", p, f"partition {p} task {tid}: in {len(where)} "
                          f"places ({', '.join(where)})", id=tid)
    for tid in sorted(part.bad_leases):
        yield Problem("lease_unreadable", p, f"partition {p} task {tid}: its lease record "
                      "can't be read (no host: reclaim can't take it back)", id=tid)
    for tid in sorted(set(part.leased) - set(part.leases)):
        yield Problem("lease_no_deadline", p, f"partition {p} task {tid}: a lease record "
                      "with no deadline in leases (reclaim never takes it back)",
                      host=part.leased[tid].host, id=tid)
    for tid in sorted(set(part.leases) - leased):
        yield Problem("deadline_no_lease", p, f"partition {p} task {tid}: a deadline in "
                      "leases with no lease record", id=tid)
    for tid in sorted(set(part.bodies) - part.delayed - part.dead):
        state = ("pending" if tid in part.pending_ids else "leased" if tid in leased else "")
        yield Problem("orphan_body", p, f"partition {p} task {tid}: a body in tasks but "
                      "not waiting or dead"
                      + (f" (a stale copy: it is {state})" if state else ""),
                      host=_host_of(part.bodies[tid]), id=tid)
    for name, ids, why in (("waiting", part.delayed, "promote can't put it back"),
                           ("dead", part.dead, "requeue can't put it back")):
        for tid in sorted(ids - set(part.bodies)):
            yield Problem("no_body", p, f"partition {p} task {tid}: {name} with no body in "
                          f"tasks ({why})", id=tid)


def _schedule_problems(p: int, part: _Partition) -> Iterable[Problem]:
    active = {tid: "pending" for tid in part.pending_ids}
    for name, ids in (("leased", part.leased_ids()), ("waiting", part.delayed),
                      ("dead", part.dead)):
        active.update(dict.fromkeys(ids, name))
    for kind, tid in schedule_findings(part.rv_due, part.rv_hosts, active,
                                       part.rv_unscheduled):
        yield Problem(kind, p, f"partition {p} task {tid}: "
                      + describe(kind, active.get(tid, "")), host=part.rv_hosts.get(tid),
                      id=tid)


def _group_problems(p: int, part: _Partition) -> Iterable[Problem]:
    for kind, group, counted, held in group_findings(part.group_records, part.group_of,
                                                     part.group_held):
        if kind == "group_record":
            yield Problem(kind, p, f"partition {p} group {group}: its record is {counted} "
                          "bytes, not 40 (delete it: its slots are recounted by the "
                          "repair then)", host=group)
        else:
            yield Problem(kind, p, f"partition {p} group {group}: its record counts "
                          f"{counted} in flight, {held} leases hold a slot of it",
                          host=group)


def _render_problems(p: int, part: _Partition) -> Iterable[Problem]:
    for kind, host, what in render_findings(part.render):
        yield Problem(kind, p, f"partition {p} {what}", host=host)


def _counter_problems(p: int, part: _Partition) -> Iterable[Problem]:
    s = part.stats
    states = (part.pending + len(part.leased_ids()) + len(part.delayed) + len(part.dead)
              + s.get("done", 0) + s.get("purged", 0) + s.get("lost_pending", 0))
    entered = s.get("enqueued", 0) + s.get("revisits", 0)
    if entered != states:
        yield Problem("counters", p, f"partition {p}: enqueued + revisits is {entered}, "
                      f"pending + leased + waiting + dead + done + purged + lost_pending "
                      f"is {states}")
    if part.dead_reasons != len(part.dead):
        yield Problem("dead_reasons", p, f"partition {p}: dead_reasons sum to "
                      f"{part.dead_reasons}, dead holds {len(part.dead)}")


async def check(queue: CrawlQueue) -> Report:
    """Check every partition of a crawl; the report lists each problem found."""
    report = Report(queue.crawl, len(queue.partitions))
    for p, pk in enumerate(queue.partitions):
        part = await _read(queue, pk)
        report.checked.update(hosts=len(part.held), pending=sum(part.pending_ids.values()),
                              leased=len(part.leased_ids()), waiting=len(part.delayed),
                              dead=len(part.dead))
        if part.rv_due:  # a crawl without revisits reads as it did
            report.checked["scheduled"] += len(part.rv_due)
        for found in (_frontier_problems(p, part), _state_problems(p, part),
                      _schedule_problems(p, part), _group_problems(p, part),
                      _render_problems(p, part), _counter_problems(p, part)):
            report.problems += found
    return report


# -- repair --------------------------------------------------------------------------------


async def repair_hosts(queue: CrawlQueue, partition: int, hosts: Iterable[str], *,
                       inflight: bool = True, pending: bool = True) -> Repair:
    """Set `hosts` of one partition right (fsck_repair.lua, PAGE hosts a call): their
    records (with `inflight`, their inflight and reserved counts too), prio_hosts, due
    and h:queued; with `pending`, the partition's pending (with the last call)."""
    pk = queue.partitions[partition]
    script = register(queue.client, "fsck_repair")
    todo = sorted(set(hosts))
    batches = [todo[i:i + PAGE] for i in range(0, len(todo), PAGE)] or [[]]
    out = Repair(partition)
    for i, batch in enumerate(batches):
        keys: list[str] = []
        for host in batch:
            keys += [pk.host_queue(host), pk.host_prio(host)]
        reply = await script(
            keys=[*pk.host_state, pk.pending, pk.prio_hosts, pk.leased, pk.delay,
                  pk.blocked, pk.budget, pk.stats, pk.render_pending, *keys],
            args=[int(inflight), int(pending and i == len(batches) - 1), len(batch), *batch])
        (recounted, lost, fixed, indexed, rebuilt, before, after, added,
         removed) = (int(v) for v in reply)
        if i == 0:
            out.pending_before = before
        out.pending_after = after
        out.recounted += recounted
        out.lost += lost
        out.leases_fixed += fixed
        out.index_fixed += indexed
        out.rebuilt += rebuilt
        out.due_added += added
        out.due_removed += removed
    return out


async def repair_orphans(queue: CrawlQueue, pk: PartitionKeys,
                         ids: Mapping[str, str | None]) -> tuple[int, int, int, int]:
    """Set right `ids` (id -> the host its body names, None: no body) whose lease or
    body is missing its other half (fsck_orphans.lua, PAGE ids a call); returns
    (deadlines added, deadlines removed, bodies dropped, tasks put back in their
    queues)."""
    script = register(queue.client, "fsck_orphans")
    totals = [0, 0, 0, 0]
    todo = sorted(ids.items())
    for i in range(0, len(todo), PAGE):
        batch = todo[i:i + PAGE]
        keys = [*pk.host_state, *pk.lease_state, pk.tasks, pk.delayed, pk.dead, pk.stats,
                pk.pending, pk.prio_hosts]
        args: list[str] = []
        for tid, host in batch:
            keys += [pk.host_queue(host or ""), pk.host_prio(host or "")]
            args += [tid, host or ""]
        reply = await script(keys=keys, args=args)
        totals = [t + int(v) for t, v in zip(totals, reply, strict=True)]
    added, removed, dropped, queued = totals
    return added, removed, dropped, queued


async def repair(queue: CrawlQueue, problems: Iterable[Problem]) -> list[Repair]:
    """Repair the repairable problems, partition by partition; returns what changed."""
    by_partition: dict[int, list[Problem]] = defaultdict(list)
    for problem in problems:
        if problem.repairable:
            by_partition[problem.partition].append(problem)
    done = []
    for p, found in sorted(by_partition.items()):
        pk = queue.partitions[p]
        kinds = {f.kind for f in found if f.kind in HOST_KINDS}
        out = Repair(p)
        if {f.kind for f in found} & RENDER_KINDS:  # first: pending's recount reads it
            added, removed = await repair_render(
                queue, pk, {f.host for f in found if f.kind in RENDER_KINDS and f.host})
            out.render_fixed = added + removed
        if kinds:
            out = await repair_hosts(
                queue, p, {f.host for f in found if f.kind in HOST_KINDS and f.host},
                inflight=bool(kinds & {"inflight", "reserved"}),
                pending=bool(kinds & {"pending", "host_queued"}))
        orphans: dict[str, str | None] = {}  # id -> the host its body names
        for f in found:
            if f.kind in ORPHAN_KINDS and f.id:
                orphans[f.id] = f.host if f.kind == "orphan_body" else orphans.get(f.id)
        if orphans:
            (out.deadlines_added, out.deadlines_removed, out.bodies_dropped,
             out.bodies_queued) = await repair_orphans(queue, pk, orphans)
        schedule = {f.id: f.host for f in found if f.kind in SCHEDULE_KINDS and f.id}
        if schedule:
            out.unscheduled, out.scheduled = await repair_schedule(queue, pk, schedule)
        out.groups_fixed = await repair_groups(
            queue, pk, {f.host for f in found if f.kind in GROUP_KINDS and f.host})
        done.append(out)
    return done


async def fsck(queue: CrawlQueue, *, fix: bool = False) -> Report:
    """Check a crawl; with `fix`, repair what can be and check again (``remaining``)."""
    report = await check(queue)
    if fix and report.problems:
        report.repairs = await repair(queue, report.problems)
        report.remaining = (await check(queue)).problems
        report.repaired = True
    return report


def report_text(report: Report) -> str:
    """The report as ``crawlq fsck`` prints it: one line per problem, then a summary."""
    lines = [p.message + ("" if p.repairable else "  [not repairable]")
             for p in report.problems]
    lines += [r.text() for r in report.repairs]
    if report.repaired:
        lines += ["still wrong: " + p.message for p in report.remaining]
    c = report.checked
    checked = (f"{report.partitions} partitions, {c['hosts']} hosts, {c['pending']} pending, "
               f"{c['leased']} leased, {c['waiting']} waiting, {c['dead']} dead"
               + (f", {c['scheduled']} scheduled" if c["scheduled"] else ""))
    if not report.problems:
        lines.append(f"crawl {report.crawl}: clean ({checked})")
    elif report.repaired:
        left = len(report.remaining)
        lines.append(f"crawl {report.crawl}: {len(report.problems)} problems found, "
                     + ("all repaired" if not left else f"{left} left after the repair")
                     + f" ({checked})")
    else:
        fixable = sum(1 for p in report.problems if p.repairable)
        lines.append(f"crawl {report.crawl}: {len(report.problems)} problems ({fixable} "
                     f"repairable: run again with --repair) ({checked})")
    return "\n".join(lines)
