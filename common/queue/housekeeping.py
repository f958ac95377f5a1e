"""Housekeeping the fleet shares: take back expired leases (reclaim), put due retries back
in their hosts' queues (promote), both at most once per interval across the fleet (reap)."""

from __future__ import annotations

from typing import cast

from redis.exceptions import OutOfMemoryError, ResponseError

from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue.calls import host_args
from common.queue.crawl import Crawl
from common.queue.revisits import promote_revisits


async def due_ids(crawl: Crawl, pk: PartitionKeys, zset: str, limit: int
                  ) -> tuple[list[str], list[str]]:
    """Ids in `zset` (leases or delayed) whose score has passed on Redis TIME, and
    their hosts (from their lease records or task values): the candidates a script then
    re-checks."""
    seconds, micros = await crawl.client.time()
    now_ms = seconds * 1000 + micros // 1000
    raw = cast(list[bytes], await crawl.client.zrangebyscore(zset, "-inf", now_ms, start=0,
                                                               num=limit))
    ids = [_text(m) for m in raw]
    if not ids:
        return [], []
    leased = zset == pk.leases
    values = cast(list[bytes | None],
                  await crawl.client.hmget(pk.leased if leased else pk.tasks, ids))
    # A lease record is "<owner> <attempt> <host> ...", a task value "<host> ...".
    at = 2 if leased else 0
    hosts = [v.split(b" ", at + 1)[at].decode() if v else "" for v in values]
    return ids, hosts


async def reclaim(crawl: Crawl, max_stalls: int, limit: int = 1000) -> tuple[int, int]:
    """Take back expired leases in every partition; returns (reclaimed, dead).
    A task reclaimed more than `max_stalls` times dies."""
    reclaimed = died = 0
    for pk in crawl.partitions:
        while True:
            ids, hosts = await due_ids(crawl, pk, pk.leases, limit)
            if not ids:
                break
            host_keys, host_head = host_args(pk, list(dict.fromkeys(h for h in hosts if h)))
            r = await crawl.scripts.reclaim(
                keys=[*pk.host_state, *pk.lease_state, pk.stalls, pk.tasks, pk.dead,
                      pk.errors, pk.dead_reasons, pk.stats, pk.pending, pk.prio_hosts,
                      pk.errors_by_host, pk.attempts, *pk.group_state, *host_keys],
                args=[max_stalls, *host_head, *ids],
            )
            reclaimed += int(r[0])
            died += int(r[1])
            if len(ids) < limit or int(r[0]) + int(r[1]) == 0:
                break
    return reclaimed, died


async def promote_partition(crawl: Crawl, pk: PartitionKeys, limit: int = 1000
                            ) -> tuple[int, int]:
    """Promote one partition's due retries; returns (moved, ms to its next due retry or
    -1)."""
    moved = 0
    while True:
        ids, hosts = await due_ids(crawl, pk, pk.delayed, limit)
        host_keys, host_head = host_args(pk, list(dict.fromkeys(h for h in hosts if h)))
        r = await crawl.scripts.promote(
            keys=[*pk.host_state, pk.delayed, pk.tasks, pk.stats, pk.pending,
                  pk.prio_hosts, *host_keys],
            args=[*host_head, *ids])
        moved += int(r[0])
        if len(ids) < limit or int(r[0]) == 0:
            return moved, int(r[1])


async def promote(crawl: Crawl, limit: int = 1000) -> tuple[int, int]:
    """Put due retries and due revisits (common/queue/revisits.py) back in their hosts'
    queues; returns (moved, ms to the next due retry or -1)."""
    moved, next_due = 0, -1
    for pk in crawl.partitions:
        moved += (await promote_revisits(crawl, pk, limit))[0]
        n, wait = await promote_partition(crawl, pk, limit)
        moved += n
        if wait >= 0 and (next_due < 0 or wait < next_due):
            next_due = wait
    return moved, next_due


async def reap(crawl: Crawl, max_stalls: int, guard_ms: int) -> tuple[int, int, int] | None:
    """Reclaim and promote, at most once per guard_ms across the fleet.

    Returns (reclaimed, dead, promoted), or None when another worker holds the guard.
    """
    try:
        if not await crawl.client.set(crawl.partitions[0].reap_lock, b"1", nx=True,
                                      px=guard_ms):
            return None
    except ResponseError as exc:
        # At maxmemory the guard can't be written; the scripts are safe to run from
        # every worker at once (they only free or move memory), so reap unguarded.
        if not isinstance(exc, OutOfMemoryError) and "maxmemory" not in str(exc):
            raise
    reclaimed, died = await reclaim(crawl, max_stalls)
    promoted, _ = await promote(crawl)
    return reclaimed, died, promoted
