"""What ``crawlq fsck`` finds and does: a `Problem` (a broken invariant, by a stable
kind), a partition's `Repair`, the `Report` of a check (and a repair), and its text."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from console.fsck.groups import KINDS as GROUP_KINDS
from console.fsck.render import KINDS as RENDER_KINDS
from console.fsck.revisits import KINDS as SCHEDULE_KINDS

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
