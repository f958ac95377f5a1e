"""The invariants a check judges on a partition as read (`console.fsck.reads`), each
kind of them a generator of `Problem`s: the frontier's hosts and ``due``, the states of
the tasks, the revisit schedule, the politeness groups, the render lane, the counters."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace

from common.codec import text as _text
from common.hostmodel.hostrec import FORMAT as RECORD
from common.hostmodel.hostrec import HostRecord
from console.fsck.groups import group_findings
from console.fsck.reads import Conf, Partition
from console.fsck.render import render_findings
from console.fsck.report import Problem
from console.fsck.revisits import describe, schedule_findings

UNLIMITED = 10**9


def _host_of(body: bytes | None) -> str | None:
    return _text(body).split(" ", 1)[0] if body else None


def _slots(conc: int) -> str:
    return "unlimited" if conc >= UNLIMITED else str(conc)


def frontier_problems(p: int, part: Partition) -> Iterable[Problem]:
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
            yield from due_problems(p, part, host, replace(
                record, queued=held, inflight=inflight[host], reserved=reserved[host]))
    if part.pending != total + part.render.total:
        yield Problem("pending", p, f"partition {p}: pending is {part.pending}, the host "
                      f"queues hold {total} and the render queues {part.render.total} "
                      "(the records count "
                      f"{sum(r.queued for r in part.records.values())})")


def due_problems(p: int, part: Partition, host: str, r: HostRecord) -> Iterable[Problem]:
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
        elif r.pace == 0 and int(part.due[host]) != (turn := turn_of(r, cc)):
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


def turn_of(r: HostRecord, cc: Conf) -> int:
    """A host's turn with no pace (lib/hosts.lua's host_limits and turn_of)."""
    delay = cc.delay if r.delay is None else r.delay
    if r.robots is not None:
        delay = max(delay, r.robots)
    delay = max(delay, r.adaptive_ms(cc.adapt, cc.max_delay))
    return max(r.last + delay, r.blocked)


def state_problems(p: int, part: Partition) -> Iterable[Problem]:
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


def schedule_problems(p: int, part: Partition) -> Iterable[Problem]:
    active = {tid: "pending" for tid in part.pending_ids}
    for name, ids in (("leased", part.leased_ids()), ("waiting", part.delayed),
                      ("dead", part.dead)):
        active.update(dict.fromkeys(ids, name))
    for kind, tid in schedule_findings(part.rv_due, part.rv_hosts, active,
                                       part.rv_unscheduled):
        yield Problem(kind, p, f"partition {p} task {tid}: "
                      + describe(kind, active.get(tid, "")), host=part.rv_hosts.get(tid),
                      id=tid)


def group_problems(p: int, part: Partition) -> Iterable[Problem]:
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


def render_problems(p: int, part: Partition) -> Iterable[Problem]:
    for kind, host, what in render_findings(part.render):
        yield Problem(kind, p, f"partition {p} {what}", host=host)


def counter_problems(p: int, part: Partition) -> Iterable[Problem]:
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
