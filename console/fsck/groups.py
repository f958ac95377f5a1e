"""``crawlq fsck``'s check of the politeness groups' slot counts (``groups``, ``g:of``:
common/keys.py) and their repair (``fsck_groups.lua``).

The invariant: a group's record counts in flight exactly the lease records that hold a
slot of it, those whose owner is marked ``g`` and not ``f`` (lib/leases.lua) and whose
host is in the group. ``group_inflight`` is a group that counts otherwise (a count too
high keeps the group's hosts parked for good; too low lets more requests reach its
site); the repair recounts it from the lease records, inside one script.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from common.codec import text as _text
from common.hostmodel.group_record import GroupRecord, GroupRecordError
from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.redis.scripts import register

#: The problems of the groups fsck_groups.lua fixes.
KINDS = frozenset({"group_inflight"})
#: A lease record's owner marks (lib/leases.lua): [f][b][g]<token>:<worker>.
_OWNER = re.compile(rb"(f?)b?(g?)\d")


def held_slots(leased: Mapping[str, bytes]) -> Counter[str]:
    """Each host's lease records that hold a slot of its group (marked g, not f)."""
    held: Counter[str] = Counter()
    for value in leased.values():
        owner, _, rest = value.partition(b" ")
        m = _OWNER.match(owner)
        parts = rest.split(b" ", 2)
        if m and m.group(2) and not m.group(1) and len(parts) == 3:
            held[_text(parts[1])] += 1
    return held


def group_findings(records: Mapping[str, bytes], group_of: Mapping[str, str],
                   held: Counter[str]) -> Iterable[tuple[str, str, int, int]]:
    """(kind, group, its count, the leases holding a slot of it) of each group whose
    record counts wrong, or ("group_record", group, bytes, 0) for one that can't be read."""
    actual: Counter[str] = Counter()
    for host, n in held.items():
        if host in group_of:
            actual[group_of[host]] += n
    for group in sorted({*records, *actual}):
        try:
            record = GroupRecord.decode(records.get(group))
        except GroupRecordError:
            yield "group_record", group, len(records[group]), 0
            continue
        if record.inflight != actual[group]:
            yield "group_inflight", group, record.inflight, actual[group]


async def read_groups(client: Any, pk: PartitionKeys
                      ) -> tuple[dict[str, bytes], dict[str, str]]:
    """A partition's group records and its hosts' groups (HSCAN, a page a command)."""
    records = {_text(k): v async for k, v in client.hscan_iter(pk.groups, count=1000)}
    group_of = {_text(k): _text(v) async for k, v in client.hscan_iter(pk.group_of,
                                                                       count=1000)}
    return records, group_of


async def repair_groups(queue: CrawlQueue, pk: PartitionKeys, groups: Iterable[str]) -> int:
    """Recount the slots of `groups` from the lease records; returns how many changed."""
    todo = sorted(set(groups))
    if not todo:
        return 0
    script = register(queue.client, "fsck_groups")
    return int(await script(keys=[*pk.host_state, *pk.group_state, pk.leased], args=todo))
