"""Transitions of held leases: renew, ack, fail, release, checkpoint. Each checks the
lease's fencing token in its script: a lease lost to another worker changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from common import codec
from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue.calls import Call, by_partition, host_args, in_order, new_op_id, run
from common.queue.crawl import Crawl, DedupMode
from common.queue.model import CODES, RESPONSE_REASONS, Code, Failure, Lease, RetryPolicy
from common.queue.revisits import MARKS_OBSERVED, observed_arg
from common.reasons import ROBOTS_DISALLOWED


async def renew(crawl: Crawl, worker: str, leases: Sequence[Lease], lease_ms: int
                ) -> list[tuple[Lease, Code]]:
    """Extend held leases; returns the ones lost, with why. Updates deadlines."""
    groups = by_partition(leases, lambda x: x)
    calls = []
    for p, group in groups.items():
        pk = crawl.partitions[p]
        args: list[Any] = [worker, lease_ms]
        for lease in group:
            args += [lease.id, lease.token]
        calls.append((crawl.scripts.renew, [*pk.lease_state, pk.stats], args))
    if not calls:
        return []
    lost: list[tuple[Lease, Code]] = []
    for group, reply in zip(groups.values(), await run(crawl.client, calls), strict=True):
        deadline = int(reply[0])
        lost_codes = {_text(reply[i]): Code(int(reply[i + 1]))
                      for i in range(1, len(reply), 2)}
        for lease in group:
            code = lost_codes.get(lease.id)
            if code is None:
                lease.deadline_ms = deadline
            else:
                lost.append((lease, code))
    return lost


def _ack_item(lease: Lease, outcome: str) -> tuple[Any, ...]:
    """One task's ARGV group in ack.lua (but its seen mark)."""
    responded = outcome != ROBOTS_DISALLOWED if lease.responded is None else lease.responded
    return lease.id, lease.token, outcome, lease.sent_ms, int(responded), lease.elapsed_ms


async def ack(crawl: Crawl, worker: str, items: Sequence[tuple[Lease, str]], *,
              revisits: bool = False, op: str = "") -> list[Code]:
    """Mark tasks done with an outcome code; returns a code per item, in order. With the
    crawl's `revisits` on, each item also carries what its fetch observed (the URL's
    history and next visit: common/queue/revisits.py). `op`: the call's operation id
    (new when ''; lib/once.lua)."""
    groups = by_partition(items, lambda x: x[0])
    calls = []
    who = f"{worker} {op or new_op_id()}"
    marks = crawl.settings.dedup is DedupMode.EXACT
    mode = (MARKS_OBSERVED if revisits else 1) if marks else 0
    for p, group in groups.items():
        pk = crawl.partitions[p]
        keys = [*pk.host_state, *pk.lease_state, pk.checkpoints, pk.errors, pk.stalls,
                pk.stats, *pk.group_state]
        args: list[Any] = [who, mode]
        histories = []
        for lease, outcome in group:
            args.extend(_ack_item(lease, outcome))
            if marks:
                bucket, seen_field = crawl.seen_mark(pk, lease.id)
                keys.append(bucket)
                args.append(seen_field)
            if mode == MARKS_OBSERVED:
                args.append(observed_arg(lease.observed))
                histories.append(crawl.history_key(pk, lease.id))
        if mode == MARKS_OBSERVED:
            keys += [*histories, pk.rv_due]
        keys.append(pk.ops(worker))
        calls.append((crawl.scripts.ack, keys, args))
    return in_order(items, groups, await run(crawl.client, calls) if calls else [],
                    lambda reply, i: CODES[int(reply[i])])


async def fail(crawl: Crawl, worker: str, failures: Sequence[Failure], retry: RetryPolicy,
               jitter: Callable[[], float], *, op: str = "") -> list[tuple[Code, int]]:
    """Record failed attempts; returns (RETRY with delay ms | DEAD | refusal, -1). `op`
    as `ack`'s."""
    groups = by_partition(failures, lambda f: f.lease)
    calls = []
    who = f"{worker} {op or new_op_id()}"
    for p, group in groups.items():
        pk = crawl.partitions[p]
        args: list[Any] = [who, retry.base_ms, retry.cap_ms, retry.max_retry_after_ms,
                           retry.backoff_base_ms, retry.backoff_cap_ms,
                           retry.backoff_forgive_ms]
        for f in group:
            reason = "".join(f.reason.split()) or "error"
            retry_after = -1 if f.retry_after is None else max(0, int(f.retry_after * 1000))
            responded = (f.reason in RESPONSE_REASONS if f.lease.responded is None
                         else f.lease.responded)
            args += [f.lease.id, f.lease.token, f.lease.task.max_attempts, reason,
                     f.message[:1000], retry_after, int(f.permanent),
                     repr(jitter()), int(f.pushback),
                     f.lease.sent_ms, int(responded)]
        calls.append((crawl.scripts.fail, [*pk.host_state, *pk.lease_state, pk.attempts,
                                           pk.delayed, pk.dead, pk.errors, pk.dead_reasons,
                                           pk.stats, pk.tasks, pk.errors_by_host,
                                           pk.blocked, *pk.group_state, pk.ops(worker)],
                      args))
    return in_order(failures, groups, await run(crawl.client, calls) if calls else [],
                    lambda reply, i: (Code(int(reply[2 * i])), int(reply[2 * i + 1])))


async def release(crawl: Crawl, worker: str, leases: Sequence[Lease], *,
                  restart_turn: bool = False) -> list[Code]:
    """Hand leases back to the head of their hosts' queues without counting an attempt;
    `restart_turn`: their hosts were just asked (pages the sink did not take), so their
    next turn is a full delay from now (or later)."""
    groups = by_partition(leases, lambda x: x)
    calls = []
    for p, group in groups.items():
        pk = crawl.partitions[p]
        calls.append(_release_call(crawl, pk, worker, group, restart_turn))
    return in_order(leases, groups, await run(crawl.client, calls) if calls else [],
                    lambda reply, i: CODES[int(reply[i])])


def _release_call(crawl: Crawl, pk: PartitionKeys, worker: str, group: list[Lease],
                  restart_turn: bool) -> Call:
    host_keys, host_head = host_args(pk, list(dict.fromkeys(lease.host for lease in group)))
    args: list[Any] = [worker, *host_head, int(restart_turn)]
    for lease in group:
        args += [lease.id, lease.token]
    return crawl.scripts.release, [*pk.host_state, *pk.lease_state, pk.attempts, pk.stats,
                                   pk.pending, pk.prio_hosts, *pk.group_state,
                                   *host_keys], args


async def late_turn(crawl: Crawl, worker: str, lease: Lease, *,
                    after_ms: int = 0) -> tuple[Code, int, int]:
    """A turn of its own for a request under a held lease that goes out late (robots.txt
    before its page, a page that waited for robots.txt: late_turn.lua), or that follows
    by a full delay a request made under it at Redis ms `after_ms` (its robots.txt):
    (code, the turn in Redis ms, Redis TIME of the call). Only with OK may the request be
    made, from then."""
    pk = crawl.partitions[lease.partition]
    code, turn, now = await crawl.scripts.late_turn(
        keys=[*pk.host_state, *pk.lease_state, *pk.group_state, pk.stats],
        args=[worker, lease.id, lease.token, lease.granted_ms, after_ms])
    return Code(int(code)), int(turn), int(now)


async def checkpoint(crawl: Crawl, worker: str, lease: Lease, value: Any) -> Code:
    """Save a checkpoint for a held lease (a lost lease can't)."""
    pk = crawl.partitions[lease.partition]
    code = await crawl.scripts.checkpoint(
        keys=[*pk.lease_state, pk.checkpoints, pk.stats],
        args=[worker, lease.id, lease.token, codec.dumps(value)],
    )
    if code == Code.OK:
        lease.task.checkpoint = value
    return Code(int(code))
