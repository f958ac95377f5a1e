"""``crawlq fsck``: check a crawl's invariants partition by partition, and repair what can be.

What is checked, per partition (``common/keys.py`` has the schema):

- every task is in exactly one state: a task id is in at most one of the host queues
  (``hq:<host>``/``hp:<host>``, once), ``leases``, ``delayed`` and ``dead``;
- the counts add up: each host's ``h:queued`` == the entries its queues hold,
  ``pending`` == their sum, each host's ``h:inflight`` == its leases (their host read
  from ``tasks``) less those whose response is in (their owner marked fetched); the
  stats: ``enqueued`` + ``revisits`` (a revisit is done once more without an enqueue)
  == pending + leased + waiting + dead + done + purged + lost_pending, and the
  ``dead_reasons`` add up to ``dead``;
- ``due`` holds exactly the hosts with pending entries and a free slot, and
  ``prio_hosts`` the hosts with priority entries, at their highest priority;
- every lease has an owner and a body, every owner a lease, every body in ``tasks`` a
  state (leased, waiting or dead);
- the revisit schedule: every id in ``rv:due`` has a history and no other state, every
  history is scheduled or being revisited (``console.fsck_revisits``).

Reads are bounded per call (SCAN, ZSCAN, HSCAN with COUNT; LRANGE and ZRANGE pages), so
a check never blocks Redis; it is not a snapshot, so on a running crawl a task that moved
between two reads can show as a problem: check a quiet crawl, or check twice.

``repair`` fixes the counts and the frontier: ``fsck_repair.lua`` recounts the hosts
given (h:queued from their queues, prio_hosts, h:inflight from the leases, pending from
h:queued) and puts them in ``due`` or takes them out, atomically per call, so it is
safe on a running crawl; ``fsck_revisits.lua`` sets the schedule of the ids found
wrong right, each checked again. What it can't fix (an id in two states, a lease without a body,
an orphan body, counters that don't add up) is reported, for an operator to decide.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from common.codec import text as _text
from common.hostmodel.hostconf import HostConf
from common.keys import HASHTABLE_FIELD, PartitionKeys
from common.queue import CrawlQueue
from common.scripts import register
from console.fsck_revisits import KINDS as SCHEDULE_KINDS
from console.fsck_revisits import describe, repair_schedule, schedule_findings

#: The most values one read asks Redis for (SCAN COUNT, a page of LRANGE or ZRANGE) and
#: the most hosts one repair call takes.
PAGE = 1000
UNLIMITED = 10**9
#: The mark of an ``owners`` entry whose lease's response is in: its host's slot was
#: given back then (lib/leases.lua's fetched_owner), so h:inflight no longer counts it.
FETCHED = b"f"
#: Problems the repair fixes (the others are reported only).
REPAIRABLE = frozenset({"host_queued", "pending", "inflight", "due_missing", "due_extra",
                        "prio_hosts", *SCHEDULE_KINDS})


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant. ``kind`` is a stable code (REPAIRABLE lists the ones
    ``repair`` fixes); ``message`` says what, where and the counts."""

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


def _hosts(n: int) -> str:
    return f"{n} host" + ("" if n == 1 else "s")


@dataclass(slots=True)
class Repair:
    """What one partition's repair changed (sums of fsck_repair.lua's replies)."""

    partition: int
    recounted: int = 0
    lost: int = 0
    inflight_fixed: int = 0
    pending_before: int = 0
    pending_after: int = 0
    due_added: int = 0
    due_removed: int = 0
    unscheduled: int = 0  # ids taken out of rv:due
    scheduled: int = 0  # histories put in rv:due

    def changed(self) -> bool:
        return bool(self.recounted or self.inflight_fixed or self.due_added
                    or self.due_removed or self.pending_before != self.pending_after
                    or self.unscheduled or self.scheduled)

    def text(self) -> str:
        parts = []
        if self.recounted:
            parts.append(f"h:queued of {_hosts(self.recounted)} recounted from the "
                         f"queues ({self.lost} entries were missing)")
        if self.pending_before != self.pending_after:
            parts.append(f"pending {self.pending_before} -> {self.pending_after}")
        if self.inflight_fixed:
            parts.append(f"h:inflight of {_hosts(self.inflight_fixed)} recounted from "
                         "the leases")
        if self.due_added or self.due_removed:
            parts.append(f"due: {self.due_added} added, {self.due_removed} removed")
        if self.unscheduled or self.scheduled:
            parts.append(f"rv:due: {self.scheduled} scheduled, {self.unscheduled} removed")
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
                yield _text(entry[:32])
            if len(page) < PAGE:
                break
            start += PAGE


@dataclass(slots=True)
class _Partition:
    """What a check reads of one partition."""

    pk: PartitionKeys
    queued: dict[str, float] = field(default_factory=dict)
    inflight: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)
    prio: dict[str, float] = field(default_factory=dict)
    held: dict[str, tuple[int, int, float | None]] = field(default_factory=dict)
    conc: dict[str, int] = field(default_factory=dict)
    spent: set[str] = field(default_factory=set)  # hosts whose page budget is spent
    leases: dict[str, float] = field(default_factory=dict)
    owners: dict[str, bytes] = field(default_factory=dict)
    bodies: dict[str, bytes] = field(default_factory=dict)
    delayed: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    pending_ids: Counter[str] = field(default_factory=Counter)
    pending: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    dead_reasons: int = 0
    rv_due: set[str] = field(default_factory=set)
    rv_hosts: dict[str, str] = field(default_factory=dict)  # history record id -> host


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
    part.queued = await _zscan(client, pk.queued)
    part.inflight = await _zscan(client, pk.inflight)
    part.due = await _zscan(client, pk.due)
    part.prio = await _zscan(client, pk.prio_hosts)
    hosts = sorted({*part.queued, *part.inflight, *part.due, *part.prio,
                    *await _queue_hosts(client, pk)})
    default = int(await client.hget(pk.conf, "concurrency") or 0)
    for i in range(0, len(hosts), PAGE):
        batch = hosts[i:i + PAGE]
        async with client.pipeline(transaction=False) as pipe:
            for host in batch:
                pipe.llen(pk.host_queue(host))
                pipe.zrange(pk.host_prio(host), 0, 0, withscores=True)
                pipe.zcard(pk.host_prio(host))
            pipe.hmget(pk.hostconf, batch)
            replies = await pipe.execute()
        for j, host in enumerate(batch):
            n, top, m = replies[3 * j:3 * j + 3]
            part.held[host] = (int(n), int(m), top[0][1] if top else None)
            conf = HostConf.decode(replies[-1][j])
            conc = default if conf.conc is None else conf.conc
            part.conc[host] = conc if conc > 0 else UNLIMITED
            if conf.budget_spent:
                part.spent.add(host)
    part.leases = await _zscan(client, pk.leases)
    part.owners = await _hscan(client, pk.owners)
    part.owners.pop(HASHTABLE_FIELD, None)
    part.bodies = await _hscan(client, pk.tasks)
    part.delayed = set(await _zscan(client, pk.delayed))
    part.dead = set(await _zscan(client, pk.dead))
    for host, (n, m, _) in part.held.items():
        if n or m:
            async for tid in _entries(client, pk.host_queue(host), pk.host_prio(host)):
                part.pending_ids[tid] += 1
    part.pending = int(await client.get(pk.pending) or 0)
    part.stats = {_text(k): int(v) for k, v in (await client.hgetall(pk.stats)).items()}
    part.dead_reasons = sum(int(v) for v in (await client.hgetall(pk.dead_reasons)).values())
    part.rv_due = set(await _zscan(client, pk.rv_due))
    part.rv_hosts = {tid: _text(v).split(" ", 1)[0]
                     for tid, v in (await _hscan(client, pk.rv_hist)).items()}
    return part


# -- checks --------------------------------------------------------------------------------


def _host_of(body: bytes | None) -> str | None:
    return _text(body).split(" ", 1)[0] if body else None


def _frontier_problems(p: int, part: _Partition) -> Iterable[Problem]:
    leased_by_host: Counter[str] = Counter(
        h for tid in part.leases if (h := _host_of(part.bodies.get(tid)))
        and not part.owners.get(tid, b"").startswith(FETCHED))
    total = 0
    for host, (n, m, top) in sorted(part.held.items()):
        held = n + m
        total += held
        counted = int(part.queued.get(host, 0))
        if counted != held:
            yield Problem("host_queued", p, f"partition {p} host {host}: h:queued counts "
                          f"{counted}, its queues hold {held} (hq {n}, hp {m})", host=host)
        leased = leased_by_host[host]
        if int(part.inflight.get(host, 0)) != leased:
            yield Problem("inflight", p, f"partition {p} host {host}: h:inflight counts "
                          f"{int(part.inflight.get(host, 0))}, it holds {leased} leases",
                          host=host)
        free = leased < part.conc[host] and host not in part.spent  # parked: not due
        if held and free and host not in part.due:
            yield Problem("due_missing", p, f"partition {p} host {host}: not in due, but it "
                          f"has {held} pending and a free slot ({leased} of "
                          f"{_slots(part.conc[host])} in flight)", host=host)
        elif host in part.due and not (held and free):
            why = ("no pending entries" if not held
                   else "its page budget spent" if host in part.spent
                   else f"no free slot ({leased} of {_slots(part.conc[host])} in flight)")
            yield Problem("due_extra", p, f"partition {p} host {host}: in due with {why}",
                          host=host)
        if part.prio.get(host) != top:
            yield Problem("prio_hosts", p, f"partition {p} host {host}: prio_hosts says "
                          f"{part.prio.get(host)}, its priority queue's head {top}",
                          host=host)
    if part.pending != total:
        yield Problem("pending", p, f"partition {p}: pending is {part.pending}, the host "
                      f"queues hold {total} (h:queued sums to "
                      f"{int(sum(part.queued.values()))})")


def _slots(conc: int) -> str:
    return "unlimited" if conc >= UNLIMITED else str(conc)


def _state_problems(p: int, part: _Partition) -> Iterable[Problem]:
    places: dict[str, list[str]] = defaultdict(list)
    for tid, n in part.pending_ids.items():
        places[tid] += ["pending"] * n
    for name, ids in (("leased", part.leases), ("waiting", part.delayed),
                      ("dead", part.dead)):
        for tid in ids:
            places[tid].append(name)
    for tid, where in sorted(places.items()):
        if len(where) > 1:
            yield Problem("two_states", p, f"partition {p} task {tid}: in {len(where)} "
                          f"places ({', '.join(where)})", id=tid)
    for tid in sorted(part.leases):
        if tid not in part.owners:
            yield Problem("lease_no_owner", p, f"partition {p} task {tid}: leased with no "
                          "owner (reclaim takes it back at its deadline)", id=tid)
        if tid not in part.bodies:
            yield Problem("lease_no_body", p, f"partition {p} task {tid}: leased with no "
                          "body in tasks (no host, no URL: reclaim can't requeue it)", id=tid)
    for tid in sorted(set(part.owners) - set(part.leases)):
        yield Problem("owner_no_lease", p, f"partition {p} task {tid}: an owner with no "
                      "lease", id=tid)
    live = {*part.leases, *part.delayed, *part.dead}
    for tid in sorted(set(part.bodies) - live):
        yield Problem("orphan_body", p, f"partition {p} task {tid}: a body in tasks but "
                      "not leased, waiting or dead", id=tid)


def _schedule_problems(p: int, part: _Partition) -> Iterable[Problem]:
    active = {tid: "pending" for tid in part.pending_ids}
    for name, ids in (("leased", part.leases), ("waiting", part.delayed),
                      ("dead", part.dead)):
        active.update(dict.fromkeys(ids, name))
    for kind, tid in schedule_findings(part.rv_due, part.rv_hosts, active):
        yield Problem(kind, p, f"partition {p} task {tid}: "
                      + describe(kind, active.get(tid, "")), host=part.rv_hosts.get(tid),
                      id=tid)


def _counter_problems(p: int, part: _Partition) -> Iterable[Problem]:
    s = part.stats
    states = (part.pending + len(part.leases) + len(part.delayed) + len(part.dead)
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
                              leased=len(part.leases), waiting=len(part.delayed),
                              dead=len(part.dead))
        if part.rv_due:  # a crawl without revisits reads as it did
            report.checked["scheduled"] += len(part.rv_due)
        for found in (_frontier_problems(p, part), _state_problems(p, part),
                      _schedule_problems(p, part), _counter_problems(p, part)):
            report.problems += found
    return report


# -- repair --------------------------------------------------------------------------------


async def repair_hosts(queue: CrawlQueue, partition: int, hosts: Iterable[str], *,
                       inflight: bool = True, pending: bool = True) -> Repair:
    """Recount `hosts` of one partition (h:queued, prio_hosts, due), and with `inflight`
    every host's h:inflight, with `pending` the partition's pending (fsck_repair.lua,
    PAGE hosts a call; the recounts of the whole partition go with the first and the
    last call)."""
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
            keys=[*pk.host_state, pk.pending, pk.prio_hosts, pk.leases, pk.tasks, pk.owners,
                  pk.stats, *keys],
            args=[int(inflight and i == 0), int(pending and i == len(batches) - 1),
                  len(batch), *batch])
        recounted, lost, fixed, before, after, added, removed = (int(v) for v in reply)
        if i == 0:
            out.pending_before = before
        out.pending_after = after
        out.recounted += recounted
        out.lost += lost
        out.inflight_fixed += fixed
        out.due_added += added
        out.due_removed += removed
    return out


async def repair(queue: CrawlQueue, problems: Iterable[Problem]) -> list[Repair]:
    """Repair the repairable problems, partition by partition; returns what changed."""
    by_partition: dict[int, list[Problem]] = defaultdict(list)
    for problem in problems:
        if problem.repairable:
            by_partition[problem.partition].append(problem)
    done = []
    for p, found in sorted(by_partition.items()):
        frontier = [f for f in found if f.kind not in SCHEDULE_KINDS]
        kinds = {f.kind for f in frontier}
        out = Repair(p)
        if frontier:
            out = await repair_hosts(
                queue, p, {f.host for f in frontier if f.host},
                inflight="inflight" in kinds, pending=bool(kinds & {"pending", "host_queued"}))
        schedule = {f.id: f.host for f in found if f.kind in SCHEDULE_KINDS and f.id}
        if schedule:
            out.unscheduled, out.scheduled = await repair_schedule(
                queue, queue.partitions[p], schedule)
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
