"""``crawlq fsck``'s checks of the revisit schedule (``rv:due``, ``rv:hist:<bucket>``:
common/keys.py) and their repair (``fsck_revisits.lua``).

The invariant: an id in ``rv:due`` has a history record and is in no other state (a
done URL waiting for its next visit); a history record is in ``rv:due`` unless its URL is
being revisited: a revisit brought back keeps its record while it is pending, leased,
waiting or dead (the ack of that visit writes the next one; a purge deletes it), or it
is a recrawl window's (interval 0: the validators of a crawl with revisits off, never
scheduled). So:

- ``due_no_history``: scheduled with no record (revisit.lua can never bring it back);
- ``scheduled_and_active``: scheduled while pending, leased, waiting or dead (it would
  be fetched twice);
- ``history_unscheduled``: a record neither scheduled nor active (never revisited).

The repair takes the first two out of ``rv:due`` and schedules the third at its last
visit + its interval, each id checked again inside the script.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.redis.scripts import register

#: The problems of the schedule, all repairable.
KINDS = frozenset({"due_no_history", "scheduled_and_active", "history_unscheduled"})
_WHY = {
    "due_no_history": "in rv:due with no history record in rv:hist (never brought back)",
    "scheduled_and_active": "in rv:due while {where} (would be fetched twice)",
    "history_unscheduled": "a history record in rv:hist, neither in rv:due nor pending, "
                           "leased, waiting or dead (never revisited)",
}
#: The most ids one repair call takes.
PAGE = 500


def schedule_findings(due: Collection[str], hosts: Mapping[str, str],
                      active: Mapping[str, str], unscheduled: Collection[str] = ()
                      ) -> Iterable[tuple[str, str]]:
    """(kind, id) of each broken rule: `due` the ids in rv:due, `hosts` each history
    record's host by id, `active` the state of each id pending, leased, waiting or dead,
    `unscheduled` the ids whose record is a recrawl window's (interval 0)."""
    for tid in sorted(due):
        if tid not in hosts:
            yield "due_no_history", tid
        elif tid in active:
            yield "scheduled_and_active", tid
    for tid in sorted(set(hosts) - set(due) - set(active) - set(unscheduled)):
        yield "history_unscheduled", tid


def describe(kind: str, where: str) -> str:
    """What a finding of `kind` means (`where`: the other state, if any)."""
    return _WHY[kind].format(where=where)


async def repair_schedule(queue: CrawlQueue, pk: PartitionKeys,
                          ids: Mapping[str, str | None]) -> tuple[int, int]:
    """Set the schedule of `ids` (id -> its record's host, None: no record) right;
    returns (removed from rv:due, added)."""
    script = register(queue.client, "fsck_revisits")
    removed = added = 0
    todo = sorted(ids.items())
    for i in range(0, len(todo), PAGE):
        batch = todo[i:i + PAGE]
        keys = [pk.rv_due, pk.leased, pk.delayed, pk.dead]
        for tid, host in batch:
            keys += [queue.on.history_key(pk, tid), pk.host_queue(host or ""),
                     pk.host_prio(host or "")]
        out, into = await script(keys=keys, args=[tid for tid, _ in batch])
        removed, added = removed + int(out), added + int(into)
    return removed, added
