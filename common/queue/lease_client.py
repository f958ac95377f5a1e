"""One consumer's lease client: which partition's turn it is, which partitions have
nothing ready until when, and which hosts each partition's last reply named.

A lease serves hosts whose turn has come (see ``common/lua/lease.lua``): the scripts are
given every key they touch, so a lease first reads which hosts are at the head of the
line and passes their queues' keys; the script decides on Redis TIME which of them are
ready, so a stale read costs a smaller batch, never a wrong one.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from common.codec import text as _text
from common.keys import PartitionKeys
from common.names import validate_worker_id
from common.queue.calls import host_args, lease_host_args
from common.queue.crawl import Crawl
from common.queue.housekeeping import promote_partition
from common.queue.lease_reply import LeaseReply
from common.queue.model import Failure, Lease, LeaseBatch

#: How long a lease call waits at most before asking again when nothing is ready, so a
#: `crawlq resume`, a host setting or new work is seen within about a second.
MAX_IDLE_WAIT_S = 1.0
#: The most candidate hosts one lease call reads (a call that leaves ready hosts unread
#: is followed at once by another).
CANDIDATE_HOSTS = 128
#: How long a partition with no host ready (every host busy, or nothing pending) is
#: skipped: its next turn is unknown.
UNKNOWN_WAIT_S = 0.05

#: Dead-letters the tasks whose body can't be decoded: (worker, failures).
FailCall = Callable[[str, Sequence[Failure]], Awaitable[object]]


def candidates_for(n: int) -> int:
    """Candidate hosts for a lease of n. Bounded: each is read in the script, and a host
    without a delay can give many."""
    return min(2 * n, CANDIDATE_HOSTS) + 8


class LeaseClient:
    """Leases tasks for one consumer, taking the crawl's partitions in turn."""

    def __init__(self, crawl: Crawl, fail: FailCall) -> None:
        self.crawl = crawl
        self._fail = fail
        count = crawl.settings.partitions
        self._next_partition = random.randrange(count)
        self._idle_until = [0.0] * count  # monotonic: nothing ready before
        self._candidates: list[list[str]] = [[] for _ in range(count)]
        # Per partition: the operation id of a lease call that got no reply (None: none).
        # The next call sends it again, so it gets what that one granted if it ran
        # (lease.lua keeps the reply a minute), not a second set of leases.
        self._unanswered: list[str | None] = [None] * count
        # Per partition: whether its calls give the render lane's keys (lease.lua's render
        # 1): from the first reply that met a render entry on.
        self._render = [False] * count

    def woken(self) -> None:
        """Another process says work may be ready: ask every partition on the next call."""
        self.ended(range(len(self._idle_until)))

    def ended(self, partitions: Iterable[int]) -> None:
        """Leases ended here: their partitions may have a host ready again at once."""
        for p in partitions:
            self._idle_until[p] = 0.0

    async def lease(self, worker: str, n: int, lease_ms: int) -> list[Lease]:
        """Lease up to n tasks from hosts whose turn has come (see `lease_turns`)."""
        return (await self.lease_turns(worker, n, lease_ms)).leases

    async def lease_turns(self, worker: str, n: int, lease_ms: int,
                          responses_in: list[Lease] | None = None,
                          held: Callable[[str], int] | None = None, *,
                          ahead_ms: int = 0) -> LeaseBatch:
        """Lease up to n tasks from hosts whose turn has come, taking partitions in turn
        so none starves; with none, say how long until a host's turn comes.

        `responses_in`: leases of `worker` whose response is in; their hosts get their slots
        back in the same calls, before the leasing (n may be 0 to only do that). The
        list is emptied. `held(host)`: how many of a host's slots `worker`'s leases take
        now; with it, a host's slots are shared with the consumers whose lease calls came
        back empty (lease.lua's fair share), else this worker may take them all.
        `ahead_ms`: hosts whose turn comes within this long are served too, each lease
        timed to its turn (``Lease.granted_ms``): the caller starts its request then.

        A partition with nothing ready is skipped until its next turn (at most
        MAX_IDLE_WAIT_S; UNKNOWN_WAIT_S when no host is due), so an idle partition costs
        almost no round trips. A retry that
        is due is put back in its host's queue on the way. A body that can't be decoded
        is dead-lettered as ``malformed`` (raw bytes kept) and not returned.
        A `worker` outside `WORKER_ID_RULE` is refused (ConfigError): its lease records
        could not be read back, so it could lease tasks but never end them.
        """
        validate_worker_id(worker)
        batch = LeaseBatch([])
        malformed: list[Failure] = []
        count = len(self._idle_until)
        now = time.monotonic()
        waits: list[float] = []
        unknown = False  # a partition could not say when its next turn comes
        by_partition: dict[int, list[Lease]] = defaultdict(list)
        for lease in responses_in or ():
            by_partition[lease.partition].append(lease)
        if responses_in:
            responses_in.clear()
        for step in range(count):
            p = (self._next_partition + step) % count
            mine = by_partition.pop(p, [])
            if len(batch.leases) >= n and not mine:
                continue
            if now < self._idle_until[p] and not mine:
                waits.append(self._idle_until[p] - now)
                continue
            got, wait = await self._lease_in(p, worker, n, lease_ms, mine=mine, held=held,
                                             batch=batch, malformed=malformed,
                                             ahead_ms=ahead_ms)
            if wait is None:
                unknown = True
            elif not got or batch.leases:
                waits.append(wait)
            if count > 1:
                self._idle_until[p] = 0.0 if got else now + (
                    UNKNOWN_WAIT_S if wait is None else wait)
        self._next_partition = (self._next_partition + 1) % count
        if malformed:
            await self._fail(worker, malformed)
        if waits and (not batch.leases or (not unknown and min(waits) > 0)):
            batch.wait_s = min(waits)
        return batch

    async def _lease_in(self, p: int, worker: str, n: int, lease_ms: int, *,
                        mine: list[Lease], held: Callable[[str], int] | None,
                        batch: LeaseBatch, malformed: list[Failure], ahead_ms: int = 0
                        ) -> tuple[bool, float | None]:
        """Lease in partition p into `batch`; whether it gave any, and how long until it
        may (None: unknown)."""
        got = False
        while True:  # again while a full page of candidate hosts gave tasks
            reply, full = await self._lease_partition(
                p, worker, max(0, n - len(batch.leases)), lease_ms, responses_in=mine, held=held,
                ahead_ms=ahead_ms)
            batch.now_ms = max(batch.now_ms, reply.now_ms)
            mine = []
            wait_ms, retry_ms, paused = reply.wait_ms, reply.retry_ms, reply.paused == 1
            batch.paused = batch.paused or paused
            batch.policy_version = max(batch.policy_version, reply.policy_version)
            if retry_ms == 0:
                await promote_partition(self.crawl, self.crawl.partitions[p], 1000)
                wait_ms = 0
            leases, bad = reply.leases(p)
            batch.leases += leases
            malformed += bad
            got_now = bool(reply.granted)
            got = got or got_now
            # Again while a full page of candidates gave tasks, or once a call met a
            # render entry (the next ones give the render lane's keys: it moves).
            if not ((got_now and full) or reply.render_met) or len(batch.leases) >= n:
                break
        for_ms = [w for w in (wait_ms, retry_ms) if w >= 0]
        if paused or for_ms:
            return got, MAX_IDLE_WAIT_S if paused else min(min(for_ms) / 1000,
                                                           MAX_IDLE_WAIT_S)
        # No host with a free slot holds work here: a slot may free at any time
        # (another consumer's ack), so look again soon, and let the caller back off.
        return got, None

    async def _lease_partition(self, p: int, worker: str, n: int, lease_ms: int, *,
                               responses_in: Sequence[Lease] = (),
                               held: Callable[[str], int] | None = None, ahead_ms: int = 0
                               ) -> tuple[LeaseReply, bool]:
        """One lease call; and whether more ready hosts may wait.

        The script is given candidate hosts and checks them again: a call costs what is
        ready, not what is queued. The candidates are the ones the partition's previous
        reply named (or the hosts of `responses_in`), so a steady crawl leases in one round
        trip; with none, a call on no hosts names them (and how long until a host's turn
        or a retry: with none ready, that call is all), and a second call leases.
        """
        pk = self.crawl.partitions[p]
        k = candidates_for(n)
        # A call's work grows with the hosts it reads: no more than its n may use (a call
        # that only gives slots back reads none).
        hosts, self._candidates[p] = (self._candidates[p][:k] if n else []), []
        if not hosts and responses_in and n:  # their hosts are the likely ones to have work
            hosts = list(dict.fromkeys(lease.host for lease in responses_in))
        reply = await self._lease_script(pk, worker, n, lease_ms, hosts=hosts,
                                         responses_in=responses_in, held=held,
                                         ahead_ms=ahead_ms)
        if not reply.granted and self._candidates[p] and n > 0 and reply.wait_ms == 0:
            hosts = self._candidates[p]  # none given, others are ready
            reply = await self._lease_script(pk, worker, n, lease_ms, hosts=hosts,
                                             held=held, ahead_ms=ahead_ms)
        return reply, len(hosts) >= k

    async def _lease_script(self, pk: PartitionKeys, worker: str, n: int, lease_ms: int, *,
                            hosts: list[str], responses_in: Sequence[Lease] = (),
                            held: Callable[[str], int] | None = None, ahead_ms: int = 0
                            ) -> LeaseReply:
        """lease.lua on these candidate hosts (and the leases whose response is in);
        keeps the hosts it names for the next call."""
        p = pk.partition
        render = self._render[p]
        host_keys, host_head = (lease_host_args if render else host_args)(pk, hosts)
        op, self._unanswered[p] = self._unanswered[p] or os.urandom(8).hex(), None
        args: list[Any] = [worker, n, lease_ms, candidates_for(n), self.crawl.keys.wake,
                           ahead_ms, op, int(render), *host_head,
                           ",".join(str(held(h)) for h in hosts) if held else ""]
        for lease in responses_in:
            args += [lease.id, lease.token]
        lane = [pk.render_due, pk.render_pending] if render else []
        try:
            raw = await self.crawl.scripts.lease(
                keys=[*pk.host_state, *pk.lease_state, pk.tasks, pk.attempts, pk.seq,
                      pk.stats, pk.checkpoints, pk.errors, pk.pending, pk.prio_hosts,
                      pk.delayed, pk.dead, pk.dead_reasons, pk.hungry, pk.lease_op(worker),
                      *pk.group_state, *lane, *host_keys],
                args=args)
        except BaseException:  # it may have run (a lost reply, a cancelled wait)
            self._unanswered[p] = op
            raise
        reply = LeaseReply.parse(raw)
        self._candidates[pk.partition] = list(dict.fromkeys(_text(h) for h in reply.next))
        if reply.render_met:
            self._render[p] = True
        return reply
