"""The consumer's fetch slots and the local stage of every lease they work on.

A held lease (``consumer.held``) is, locally, in one `Stage` until it leaves the slots
(its completion is the flusher's, ``consumer.flush``, or it was dropped or released):
`Slots.move` is the one place a lease changes stage. ``--concurrency`` fetch slots (one
task each, no task per lease) take QUEUED leases in order and hand each to the runner
(``consumer.runner``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from enum import IntEnum

from common.queue import Lease
from consumer.held import LeaseBook
from consumer.stopping import Stopping

SHUTDOWN_WAIT_S = 5.0


class Stage(IntEnum):
    """Where a held lease is, locally, before its completion goes to the flusher. (An
    IntEnum: a lease moves five times a page, and a plain Enum hashes in Python.)"""

    SCHEDULED = 0  # a host's turn, to start DISPATCH_S after the lease reply
    QUEUED = 1  # waits for a free fetch slot
    ROBOTS_WAIT = 2  # its robots.txt is looked up outside the slots
    TURN_WAIT = 3  # its robots.txt went under its lease: it waits for its own turn
    STARTING = 4  # a slot took it: robots.txt gate, lease still ours?
    FETCHING = 5  # its request is under way
    RESPONSE_IN = 6  # the fetch returned: handler, then its completion
    DONE = 7  # left the slots (completion queued, dropped or released)


#: The stages in which a fetch slot works on the lease.
IN_SLOT = frozenset({Stage.STARTING, Stage.FETCHING, Stage.RESPONSE_IN})
#: The stages of a lease whose fetch has begun: drained within --grace, not cut.
STARTED = frozenset({Stage.FETCHING, Stage.RESPONSE_IN})
#: The stages of a lease no slot has begun to fetch (shed and drain release them).
NOT_STARTED = frozenset({Stage.SCHEDULED, Stage.QUEUED, Stage.ROBOTS_WAIT, Stage.TURN_WAIT})
#: The stages of a lease whose wait is the lookup task's (drop cancels it).
LOOKING_UP = frozenset({Stage.ROBOTS_WAIT, Stage.TURN_WAIT})


class _At:
    """A held lease and its stage (changed in place: five moves a page)."""

    __slots__ = ("lease", "stage")

    def __init__(self, lease: Lease, stage: Stage) -> None:
        self.lease, self.stage = lease, stage


class Slots:
    """The fetch slots, and the stage of each lease they hold locally."""

    def __init__(self, book: LeaseBook, stopping: Stopping,
                 on_slot_free: Callable[[], None]) -> None:
        self.book = book
        self.stopping = stopping
        self._on_slot_free = on_slot_free
        self._at: dict[str, _At] = {}  # task id -> its lease and stage
        self._count = [0] * len(Stage)  # leases per stage
        self._queued: deque[Lease] = deque()  # QUEUED, in order (stale entries skipped)
        self._lookups: dict[str, asyncio.Task[None]] = {}  # ROBOTS_WAIT: the lookup
        #: Each slot task -> the lease it works on.
        self.busy: dict[asyncio.Task[None], Lease] = {}
        #: Slot tasks told to drop their lease (lost at a heartbeat).
        self.dropping: dict[asyncio.Task[None], Lease] = {}
        self._idle: deque[asyncio.Future[None]] = deque()
        self.tasks: list[asyncio.Task[None]] = []

    # -- stages ---------------------------------------------------------------------------

    def move(self, lease: Lease, stage: Stage, *, front: bool = False) -> None:
        """Put `lease` in `stage` (DONE: forget it); a QUEUED lease waits at the back of
        the slots' queue, or at its `front` (it had started once), and wakes a slot."""
        at, count = self._at.get(lease.id), self._count
        if at is not None:
            count[at.stage] -= 1
            if stage is Stage.DONE:
                del self._at[lease.id]
                return
            at.lease, at.stage = lease, stage
        elif stage is Stage.DONE:
            return
        else:
            self._at[lease.id] = _At(lease, stage)
        count[stage] += 1
        if stage is Stage.QUEUED:
            if front:
                self._queued.appendleft(lease)
            else:
                self._queued.append(lease)
            self.wake()

    def stage(self, lease: Lease) -> Stage:
        """`lease`'s stage (DONE when not this lease's, e.g. an older lease of its task)."""
        at = self._at.get(lease.id)
        return at.stage if at is not None and at.lease is lease else Stage.DONE

    def count(self, *stages: Stage) -> int:
        """How many leases are in these stages (all stages: every unfinished lease)."""
        if not stages:
            return len(self._at)
        return sum(self._count[s] for s in stages)

    def ids(self, *stages: Stage) -> set[str]:
        """The task ids in these stages (whichever lease of the task it is)."""
        return {tid for tid, at in self._at.items() if at.stage in stages}

    def wait_for_robots(self, lease: Lease, lookup: Awaitable[None]) -> None:
        """Move `lease` to ROBOTS_WAIT while `lookup` runs outside the slots."""
        self.move(lease, Stage.ROBOTS_WAIT)
        self._lookups[lease.id] = asyncio.ensure_future(lookup)

    def robots_done(self, lease: Lease) -> None:
        """`lease`'s robots.txt lookup (and its wait for its turn, TURN_WAIT) ended (the
        caller moves the lease on)."""
        self._lookups.pop(lease.id, None)

    # -- the slots ------------------------------------------------------------------------

    def start(self, work: Callable[[Lease], Awaitable[None]], concurrency: int) -> None:
        """Start `concurrency` fetch slots, each running `work` on one lease at a time."""
        self.tasks = [asyncio.create_task(self._slot(work)) for _ in range(concurrency)]

    async def _slot(self, work: Callable[[Lease], Awaitable[None]]) -> None:
        """One fetch slot: take queued leases one at a time and work each in place (no
        task per lease); return once draining and nothing is queued."""
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        queued, book, idle, stopping = self._queued, self.book, self._idle, self.stopping
        while True:
            if not queued:
                if stopping.draining:
                    return
                wake: asyncio.Future[None] = loop.create_future()
                idle.append(wake)
                await wake
                continue
            lease = queued.popleft()
            if self.stage(lease) is not Stage.QUEUED or not book.holds(lease):
                continue  # shed, requeued ahead, or lost at a heartbeat before it started
            self.move(lease, Stage.STARTING)
            self.busy[me] = lease
            try:
                await work(lease)
            except asyncio.CancelledError:
                # Told to drop a lease (lost at a heartbeat): go on with the next one. The
                # drop may have been meant for the lease before this one, if the slot moved
                # on before the cancellation reached it: then this lease starts again. Any
                # other cancellation (the consumer stopping: draining or closing is set
                # first) stops the slot. A library call can swallow a cancel (Python
                # 3.11's wait_for, which redis-py uses), leaving it counted: so a drop
                # clears every count, or the next drop would look like a stop and end
                # this fetch slot for good.
                dropped = self.dropping.pop(me, None)
                if dropped is None or stopping.draining or stopping.closing:
                    raise
                while me.uncancel() > 0:
                    pass
                if dropped is not lease and book.holds(lease):
                    self.move(lease, Stage.QUEUED, front=True)
            finally:
                if self.busy.get(me) is lease:
                    del self.busy[me]
                if self.stage(lease) in IN_SLOT:
                    self.move(lease, Stage.DONE)
                self._on_slot_free()

    def wake(self) -> None:
        """Wake one idle slot per queued lease (all of them when draining, to return)."""
        idle = self._idle
        n = len(idle) if self.stopping.draining else len(self._queued)
        while idle and n > 0:
            wake = idle.popleft()
            if not wake.done():  # a slot cancelled while idle leaves its future behind
                wake.set_result(None)
                n -= 1

    def has_idle(self) -> bool:
        """Whether a fetch slot waits for a lease."""
        return bool(self._idle)

    def drop(self, lease: Lease) -> None:
        """Stop working on a lease that is not ours anymore: cancel its fetch, or its wait."""
        stage = self.stage(lease)
        if stage in IN_SLOT:
            slot = next((t for t, held in self.busy.items() if held is lease), None)
            if slot is not None:
                self.dropping[slot] = lease
                slot.cancel()
            return
        if stage in LOOKING_UP:
            waiter = self._lookups.pop(lease.id, None)
            if waiter is not None:
                waiter.cancel()
        if stage is not Stage.DONE:
            self.move(lease, Stage.DONE)  # a queued or scheduled lease is skipped

    async def shed(self) -> None:
        """Forget every lease no slot has begun to fetch (their leases are released by
        the caller), cancelling their robots.txt lookups."""
        for at in list(self._at.values()):
            if at.stage in NOT_STARTED:
                self.move(at.lease, Stage.DONE)
        self._queued.clear()
        lookups = list(self._lookups.values())
        self._lookups.clear()
        await cancel(lookups)

    def working(self, stages: Iterable[Stage] = IN_SLOT) -> set[asyncio.Task[None]]:
        """The slot tasks working on a lease in one of `stages`."""
        wanted = frozenset(stages)
        return {t for t, lease in self.busy.items() if self.stage(lease) in wanted}


async def cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait for them, a bounded time."""
    live = [t for t in tasks if not t.done()]
    for task in live:
        task.cancel()
    if live:
        await asyncio.wait(live, timeout=SHUTDOWN_WAIT_S)
