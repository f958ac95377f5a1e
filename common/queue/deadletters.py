"""Dead letters: list them, put them back in their hosts' queues, or purge them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue.calls import chunks, host_args
from common.queue.crawl import Crawl, DedupMode
from common.queue.model import Code, DeadTask
from common.tasks.task import entry_url, stored_entry


async def dead_list(crawl: Crawl, *, reason: str | None = None, limit: int = 50,
                    page: int = 500) -> list[DeadTask]:
    """Dead tasks, oldest first, optionally only those with one reason."""
    found: list[DeadTask] = []
    client = crawl.client
    for p, pk in enumerate(crawl.partitions):
        start = 0
        while len(found) < limit:
            ids = cast(list[tuple[bytes, float]], await client.zrange(
                pk.dead, start, start + page - 1, withscores=True))
            if not ids:
                break
            start += page
            members = [m for m, _ in ids]
            async with client.pipeline(transaction=False) as pipe:
                pipe.hmget(pk.errors, members)
                pipe.hmget(pk.tasks, members)
                pipe.hmget(pk.attempts, members)
                errs, values, attempts = await pipe.execute()
            for (member, score), err, value, att in zip(ids, errs, values, attempts,
                                                        strict=True):
                why, _, message = (err or b"unknown ").decode().partition(" ")
                if reason is not None and why != reason:
                    continue
                raw = stored_entry(value) if value else None
                found.append(DeadTask(_text(member), p, why, message, int(score),
                                      int(att or 0), entry_url(raw), raw))
                if len(found) >= limit:
                    break
    return found


async def dead_get(crawl: Crawl, task_id: str) -> DeadTask | None:
    """One dead task by its id, whichever partition holds it; None when it is not dead."""
    for p, pk in enumerate(crawl.partitions):
        async with crawl.client.pipeline(transaction=False) as pipe:
            pipe.zscore(pk.dead, task_id)
            pipe.hget(pk.errors, task_id)
            pipe.hget(pk.tasks, task_id)
            pipe.hget(pk.attempts, task_id)
            score, err, value, att = await pipe.execute()
        if score is None:
            continue
        why, _, message = (err or b"unknown ").decode().partition(" ")
        raw = stored_entry(value) if value else None
        return DeadTask(task_id, p, why, message, int(score), int(att or 0), entry_url(raw),
                        raw)
    return None


async def dead_requeue(crawl: Crawl, ids: Sequence[str]) -> int:
    """Put dead tasks back in their hosts' queues with fresh attempts; returns how
    many moved."""
    return await _dead_op(crawl, True, ids)


async def dead_purge(crawl: Crawl, ids: Sequence[str]) -> int:
    """Delete dead tasks for good; returns how many were deleted."""
    return await _dead_op(crawl, False, ids)


async def dead_ids(crawl: Crawl, reason: str | None = None) -> list[str]:
    """Every dead id (optionally of one reason), paged through each partition."""
    return [d.id for d in await dead_list(crawl, reason=reason, limit=10**12)]


async def _dead_op(crawl: Crawl, requeue: bool, ids: Sequence[str]) -> int:
    """Requeue or purge dead ids, in whichever partition holds each."""
    done = 0
    wanted = list(dict.fromkeys(ids))
    for pk in crawl.partitions:
        for chunk in chunks(wanted, 500):
            values = cast(list[bytes | None], await crawl.client.hmget(pk.tasks, list(chunk)))
            here = [(tid, v.split(b" ", 1)[0].decode()) for tid, v in zip(chunk, values,
                                                                        strict=True) if v]
            if not here:
                continue
            if requeue:
                codes = await _requeue(crawl, pk, here)
            else:
                codes = await _purge(crawl, pk, [tid for tid, _ in here])
            done += sum(1 for c in codes if int(c) == Code.OK)
    return done


async def _requeue(crawl: Crawl, pk: PartitionKeys, here: list[tuple[str, str]]) -> Any:
    host_keys, host_head = host_args(pk, list(dict.fromkeys(h for _, h in here)))
    return await crawl.scripts.requeue(
        keys=[*pk.host_state, pk.dead, pk.errors, pk.attempts, pk.stalls, pk.dead_reasons,
              pk.tasks, pk.stats, pk.pending, pk.prio_hosts, *host_keys],
        args=[*host_head, *(tid for tid, _ in here)])


async def _purge(crawl: Crawl, pk: PartitionKeys, tids: list[str]) -> Any:
    marks = crawl.settings.dedup is DedupMode.EXACT
    keys = [pk.dead, pk.errors, pk.dead_reasons, pk.tasks, pk.attempts, pk.stalls,
            pk.checkpoints, pk.stats, pk.rv_due, pk.conf]
    args: list[Any] = [int(marks)]
    for tid in tids:
        args.append(tid)
        if marks:
            bucket, seen_field = crawl.seen_mark(pk, tid)
            keys += [bucket, crawl.history_key(pk, tid)]
            args.append(seen_field)
    return await crawl.scripts.purge(keys=keys, args=args)
