"""Dead letters for operators: a page of them, and the choice of which to act on.

`dead_page` reads one page of a crawl's dead tasks, newest first, at a cost that
follows the page, not the number of dead tasks: a rank range of each partition's
``dead`` ZSET, then one pipelined HMGET per partition for the page's errors, bodies and
attempts. `select_dead` turns "these ids", "this reason" or "all" into ids for
`CrawlQueue.dead_requeue` / `dead_purge`; ``crawlq dead`` and the dashboard share it.

Deep pages: with one partition any page is one ZREVRANGE. With several, the newest
``offset + size`` of each partition are merged, so a page must end within `MAX_WINDOW`.
A reason filter has no index to use (``errors`` holds the reason per task), so it looks
through the newest `REASON_WINDOW` dead tasks and says when there are more.
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from common.errors import BadRequestError
from common.queue import CrawlQueue, DeadTask
from common.tasks.task import entry_url, stored_entry

MAX_PAGE_SIZE = 500
MAX_WINDOW = 10_000
REASON_WINDOW = 5_000
_REASON = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_TASK_ID = re.compile(r"^[0-9a-f]{32}$")


def check_reason(reason: str) -> str:
    """`reason` if it looks like a dead-letter reason code, else BadRequestError."""
    if not _REASON.match(reason):
        raise BadRequestError(f"{reason[:80]!r} is not a dead-letter reason (a code such "
                              "as http_5xx or redirect_loop; see the dead letters by reason)")
    return reason


def check_task_id(tid: str) -> str:
    """`tid` if it is a task id (32 hex digits), else BadRequestError."""
    if not _TASK_ID.match(tid):
        raise BadRequestError(f"{tid[:80]!r} is not a task id (32 hex digits, see the "
                              "dead letters list)")
    return tid


@dataclass(frozen=True, slots=True)
class DeadPage:
    """One page of dead letters, newest first."""

    items: list[DeadTask]
    offset: int
    size: int
    total: int  # dead tasks in the crawl, or with the reason asked for
    reason: str | None
    searched: int  # dead tasks a reason filter looked through (total when unfiltered)
    complete: bool  # False: a reason filter did not reach the oldest dead tasks


async def _newest(queue: CrawlQueue, start: int, stop: int) -> list[tuple[int, str, int]]:
    """(died_at_ms, id, partition) of ranks start..stop (newest first) of every
    partition, merged newest first."""
    async with queue.client.pipeline(transaction=False) as pipe:
        for pk in queue.partitions:
            pipe.zrevrange(pk.dead, start, stop, withscores=True)
        replies = cast(list[list[tuple[bytes, float]]], await pipe.execute())
    runs = [[(int(score), member.decode(), p) for member, score in reply]
            for p, reply in enumerate(replies)]
    return list(heapq.merge(*runs, key=lambda x: (-x[0], x[1])))


async def _details(queue: CrawlQueue, rows: Sequence[tuple[int, str, int]]) -> list[DeadTask]:
    by_partition: dict[int, list[str]] = defaultdict(list)
    for _, tid, p in rows:
        by_partition[p].append(tid)
    async with queue.client.pipeline(transaction=False) as pipe:
        for p, ids in by_partition.items():
            pk = queue.partitions[p]
            pipe.hmget(pk.errors, ids)
            pipe.hmget(pk.tasks, ids)
            pipe.hmget(pk.attempts, ids)
        replies = await pipe.execute()
    found: dict[str, tuple[Any, Any, Any]] = {}
    for i, ids in enumerate(by_partition.values()):
        errs, bodies, attempts = replies[3 * i:3 * i + 3]
        for tid, err, body, att in zip(ids, errs, bodies, attempts, strict=True):
            found[tid] = (err, body, att)
    out = []
    for died, tid, p in rows:
        err, body, att = found[tid]
        why, _, message = (err or b"unknown ").decode(errors="replace").partition(" ")
        raw = stored_entry(body) if body else None
        out.append(DeadTask(tid, p, why, message, died, int(att or 0), entry_url(raw), raw))
    return out


async def dead_page(queue: CrawlQueue, *, reason: str | None = None, offset: int = 0,
                    size: int = 50) -> DeadPage:
    """One page of dead letters, newest first (optionally of one reason).

    Raises BadRequestError for a negative offset, a size outside 1..MAX_PAGE_SIZE, a
    malformed reason, or (several partitions) a page that ends past MAX_WINDOW.
    """
    if offset < 0:
        raise BadRequestError(f"offset must be 0 or more, got {offset}")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise BadRequestError(f"page size must be 1..{MAX_PAGE_SIZE}, got {size}")
    async with queue.client.pipeline(transaction=False) as pipe:
        for pk in queue.partitions:
            pipe.zcard(pk.dead)
        if reason is not None:
            pipe.hget(queue.partitions[0].dead_reasons, check_reason(reason))
            for pk in queue.partitions[1:]:
                pipe.hget(pk.dead_reasons, reason)
        counts = await pipe.execute()
    dead = sum(int(n) for n in counts[:len(queue.partitions)])
    if reason is None:
        if len(queue.partitions) > 1 and offset + size > MAX_WINDOW:
            raise BadRequestError(
                f"with {len(queue.partitions)} partitions a page must end within the "
                f"newest {MAX_WINDOW:,} dead letters (offset {offset} + size {size}); "
                "filter by reason or use crawlq dead ls")
        if len(queue.partitions) == 1:
            rows = await _newest(queue, offset, offset + size - 1)
        else:
            rows = (await _newest(queue, 0, offset + size - 1))[offset:offset + size]
        return DeadPage(await _details(queue, rows), offset, size, dead, None, dead, True)
    total = sum(int(n or 0) for n in counts[len(queue.partitions):])
    window = (await _newest(queue, 0, REASON_WINDOW - 1))[:REASON_WINDOW]
    matching = await _matching(queue, window, reason)
    rows = matching[offset:offset + size]
    return DeadPage(await _details(queue, rows), offset, size, total, reason, len(window),
                    len(window) >= dead)


async def _matching(queue: CrawlQueue, rows: list[tuple[int, str, int]], reason: str
                    ) -> list[tuple[int, str, int]]:
    """The rows whose last error has `reason` (one pipelined HMGET per partition)."""
    by_partition: dict[int, list[str]] = defaultdict(list)
    for _, tid, p in rows:
        by_partition[p].append(tid)
    async with queue.client.pipeline(transaction=False) as pipe:
        for p, ids in by_partition.items():
            pipe.hmget(queue.partitions[p].errors, ids)
        replies = await pipe.execute()
    prefix = reason.encode() + b" "
    wanted = {tid for ids, errs in zip(by_partition.values(), replies, strict=True)
              for tid, err in zip(ids, errs, strict=True)
              if (err or b"unknown ").startswith(prefix)}
    return [row for row in rows if row[1] in wanted]


async def select_dead(queue: CrawlQueue, *, ids: Sequence[str] = (), reason: str | None = None,
                      every: bool = False) -> list[str]:
    """The dead ids to act on: exactly one of `ids`, `reason` or `every`.

    Raises BadRequestError when none or several are given, or an id or reason is malformed.
    """
    if sum(bool(x) for x in (ids, reason, every)) != 1:
        raise BadRequestError("choose the dead tasks: task ids, a reason, or all "
                              "(exactly one of them)")
    if ids:
        return [check_task_id(tid) for tid in ids]
    return await queue.dead_ids(check_reason(reason) if reason else None)
