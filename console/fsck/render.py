"""``crawlq fsck``'s check of the render lane (``r:due``, ``r:pending``, ``rq:<host>``:
common/keys.py, lib/render.lua) and its repair (``fsck_render.lua``).

The invariants: ``r:due`` holds exactly the hosts whose render queue holds entries
(``render_due``: one missing is never leased again, one extra is looked at for nothing),
and ``r:pending`` counts the entries of every render queue (``render_pending``). The
entries are pending tasks (in ``pending`` too): the check counts their ids among the
pending ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.redis.scripts import register
from common.tasks.task import queued_id

#: The problems of the render lane fsck_render.lua fixes.
KINDS = frozenset({"render_due", "render_pending"})
PAGE = 1000


@dataclass(slots=True)
class RenderLane:
    """What a check reads of a partition's render lane."""

    held: dict[str, int] = field(default_factory=dict)  # host -> entries of its rq
    due: set[str] = field(default_factory=set)
    pending: int = 0  # r:pending
    ids: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.held.values())


async def read_render(client: Any, pk: PartitionKeys) -> RenderLane:
    """A partition's render lane: its render queues (found by SCAN) and their ids."""
    lane = RenderLane()
    lane.due = {_text(h) async for h, _ in client.zscan_iter(pk.render_due, count=PAGE)}
    lane.pending = int(await client.get(pk.render_pending) or 0)
    pattern = pk.prefix.replace("{", "\\{").replace("}", "\\}") + "rq:*"
    hosts = {_text(k)[len(pk.prefix) + 3:]
             async for k in client.scan_iter(match=pattern, count=PAGE)} | lane.due
    for host in sorted(hosts):
        key, start = pk.render_queue(host), 0
        lane.held[host] = 0
        while True:
            page = await client.lrange(key, start, start + PAGE - 1)
            for entry in page:
                lane.ids[queued_id(entry)] += 1
            lane.held[host] += len(page)
            if len(page) < PAGE:
                break
            start += PAGE
    return lane


def render_findings(lane: RenderLane) -> Iterable[tuple[str, str | None, str]]:
    """(kind, host or None, what is wrong) of each problem of the render lane."""
    for host, n in sorted(lane.held.items()):
        if n and host not in lane.due:
            yield "render_due", host, f"host {host}: {n} render entries, not in r:due"
        elif not n and host in lane.due:
            yield "render_due", host, f"host {host}: in r:due with no render entries"
    if lane.pending != lane.total:
        yield "render_pending", None, (f"r:pending is {lane.pending}, the render queues "
                                       f"hold {lane.total}")


async def repair_render(queue: CrawlQueue, pk: PartitionKeys,
                        hosts: Mapping[str, int] | Iterable[str]) -> tuple[int, int]:
    """Set the render lane of `pk` right: each host's place in r:due, and r:pending from
    every render queue (read again here); returns (r:due entries added, removed)."""
    script = register(queue.client, "fsck_render")
    lane = await read_render(queue.client, pk)
    todo = sorted(set(lane.held) | set(hosts))
    pages = [todo[i:i + PAGE] for i in range(0, len(todo), PAGE)] or [[]]
    added = removed = 0
    for i, page in enumerate(pages):
        others = sum(lane.held.get(h, 0) for h in todo if h not in page)
        reply = await script(keys=[pk.render_due, pk.render_pending,
                                   *(pk.render_queue(h) for h in page)],
                             args=[others if i == len(pages) - 1 else -1, len(page), *page])
        added += int(reply[0])
        removed += int(reply[1])
    return added, removed
