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
  history is scheduled or being revisited (``console.fsck.revisits``);
- the politeness groups: each group's record counts in flight the lease records holding
  a slot of it (``console.fsck.groups``); a grouped host's place in ``due`` (which also
  follows its group's turn, or leaves it while the group is full) is not judged;
- the render lane: ``r:due`` holds exactly the hosts with render entries, ``r:pending``
  counts them, and ``pending`` counts them too (``console.fsck.render``).

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

Here: `check`, `repair` and `fsck`. What a check reads of a partition is `reads`, the
invariants it judges `checks` (the schedule's, the groups' and the render lane's own in
`revisits`, `groups` and `render`), what it finds and says `report`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.redis.scripts import register
from console.fsck.checks import (
    counter_problems,
    frontier_problems,
    group_problems,
    render_problems,
    schedule_problems,
    state_problems,
)
from console.fsck.groups import KINDS as GROUP_KINDS
from console.fsck.groups import repair_groups
from console.fsck.reads import PAGE, read_partition
from console.fsck.render import KINDS as RENDER_KINDS
from console.fsck.render import repair_render
from console.fsck.report import HOST_KINDS, ORPHAN_KINDS, Problem, Repair, Report, report_text
from console.fsck.revisits import KINDS as SCHEDULE_KINDS
from console.fsck.revisits import repair_schedule

__all__ = ["check", "fsck", "repair", "repair_hosts", "repair_orphans", "report_text"]


async def check(queue: CrawlQueue) -> Report:
    """Check every partition of a crawl; the report lists each problem found."""
    report = Report(queue.crawl, len(queue.partitions))
    for p, pk in enumerate(queue.partitions):
        part = await read_partition(queue, pk)
        report.checked.update(hosts=len(part.held), pending=sum(part.pending_ids.values()),
                              leased=len(part.leased_ids()), waiting=len(part.delayed),
                              dead=len(part.dead))
        if part.rv_due:  # a crawl without revisits reads as it did
            report.checked["scheduled"] += len(part.rv_due)
        for found in (frontier_problems(p, part), state_problems(p, part),
                      schedule_problems(p, part), group_problems(p, part),
                      render_problems(p, part), counter_problems(p, part)):
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


