"""A consumer's render lease client: leases render tasks (``common/lua/lease_render.lua``)
for a consumer with a browser, taking the crawl's partitions in turn.

As the lease client (``common.queue.lease_client``), it passes the keys of the candidate hosts
the partition's last reply named, and the hosts of its render leases that ended; a call
on no hosts only names them (the head of ``r:due``), and the next call leases. A partition
whose render lane is empty is skipped until the time its reply gave (at most
MAX_IDLE_WAIT_S), so an idle lane costs a call on no hosts four times a second.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from common.codec import text as _text
from common.keys import PartitionKeys
from common.names import validate_worker_id
from common.queue.crawl import Crawl
from common.queue.lease_reply import LeaseReply
from common.queue.model import Failure, Lease, LeaseBatch

#: Candidate hosts one call reads at most.
CANDIDATES = 32
#: The longest a partition is skipped after a call that leased nothing.
MAX_IDLE_WAIT_S = 0.25

FailCall = Callable[[str, Sequence[Failure]], Awaitable[object]]


class RenderLeaseClient:
    """Leases render tasks for one consumer, taking the crawl's partitions in turn."""

    def __init__(self, crawl: Crawl, fail: FailCall) -> None:
        self.crawl = crawl
        self._fail = fail
        count = crawl.settings.partitions
        self._next_partition = random.randrange(count)
        self._idle_until = [0.0] * count
        self._candidates: list[list[str]] = [[] for _ in range(count)]
        self._unanswered: list[str | None] = [None] * count

    def woken(self) -> None:
        """Work may be ready: ask every partition on the next call."""
        self._idle_until = [0.0] * len(self._idle_until)

    def ended(self, leases: Sequence[Lease]) -> None:
        """Render leases of this consumer ended: their hosts are the next call's
        candidates (a host waiting for its slot has its place in ``r:due`` POLL_MS on)."""
        for lease in leases:
            if lease.task.render:
                p = lease.partition
                self._idle_until[p] = 0.0
                if lease.host not in self._candidates[p]:
                    self._candidates[p].insert(0, lease.host)

    async def lease(self, worker: str, n: int, lease_ms: int) -> LeaseBatch:
        """Up to n render tasks; `wait_s` says how long until one may be ready when none
        was leased (None: unknown)."""
        validate_worker_id(worker)
        batch = LeaseBatch([])
        malformed: list[Failure] = []
        count = len(self._idle_until)
        now = time.monotonic()
        waits: list[float] = []
        for step in range(count):
            if len(batch.leases) >= n:
                break
            p = (self._next_partition + step) % count
            if now < self._idle_until[p]:
                waits.append(self._idle_until[p] - now)
                continue
            reply = await self._call(p, worker, n - len(batch.leases), lease_ms)
            if not reply.granted and self._candidates[p] and reply.wait_ms == 0:
                reply = await self._call(p, worker, n - len(batch.leases), lease_ms)
            batch.now_ms = max(batch.now_ms, reply.now_ms)
            batch.paused = batch.paused or reply.paused == 1
            batch.policy_version = max(batch.policy_version, reply.policy_version)
            leases, bad = reply.leases(p)
            batch.leases += leases
            malformed += bad
            wait = MAX_IDLE_WAIT_S if reply.paused or reply.wait_ms < 0 else \
                min(reply.wait_ms / 1000, MAX_IDLE_WAIT_S)
            if not leases:
                self._idle_until[p] = now + wait
                waits.append(wait)
        self._next_partition = (self._next_partition + 1) % count
        if malformed:
            await self._fail(worker, malformed)
        if waits and not batch.leases:
            batch.wait_s = min(waits)
        return batch

    async def _call(self, p: int, worker: str, n: int, lease_ms: int) -> LeaseReply:
        pk: PartitionKeys = self.crawl.partitions[p]
        hosts, self._candidates[p] = self._candidates[p][:CANDIDATES], []
        op, self._unanswered[p] = self._unanswered[p] or os.urandom(8).hex(), None
        args: list[Any] = [worker, n, lease_ms, CANDIDATES, op, len(hosts), *hosts]
        try:
            raw = await self.crawl.scripts.lease_render(
                keys=[*pk.host_state, *pk.lease_state, pk.tasks, pk.attempts, pk.seq,
                      pk.stats, pk.checkpoints, pk.errors, pk.pending, pk.dead,
                      pk.dead_reasons, pk.render_op(worker), *pk.group_state,
                      pk.render_due, pk.render_pending,
                      *(pk.render_queue(h) for h in hosts)],
                args=args)
        except BaseException:  # it may have run (a lost reply, a cancelled wait)
            self._unanswered[p] = op
            raise
        reply = LeaseReply.parse(raw)
        self._candidates[p] = list(dict.fromkeys(_text(h) for h in reply.next))
        return reply
