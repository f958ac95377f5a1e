"""The leaser: asks the frontier for as many tasks as there are free fetch slots.

The frontier only hands out tasks whose host's turn has come (``common/lua/lease.lua``),
so a leased task is fetched at once. With none ready the leaser sleeps until the next
host's turn (at most a second, so pauses and host settings apply within one). The
leases whose response is in give their hosts' slots back in the next lease call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from common.observability.metrics import Metrics
from common.queue import Lease, LeaseBatch, LeasingQueue
from common.redis.errors import REDIS_ERRORS
from common.redis.resend import may_run_again
from consumer.backoff import Backoff
from consumer.clock import RedisClock
from consumer.config import ConsumerSettings
from consumer.flush import Flusher
from consumer.held import LeaseBook
from consumer.live import PolicyReader
from consumer.render_leaser import RenderLeaser
from consumer.slots import Slots, Stage
from consumer.stopping import Stopping
from consumer.window import CpuWindow
from consumer.write_health import SinkHealth

log = logging.getLogger("consumer")

#: What the lease loop runs again after a Redis error (common/redis/resend.py: it may, as each
#: may run twice; lease.lua's operation id answers a call sent again).
LEASE_SCRIPTS = ("lease",)

#: In a polite crawl, a lease's request starts this long after the lease call returned
#: (see Leaser.dispatch): event-loop delays up to this long don't bring two requests to
#: a host closer than its delay; a request later still moves its host's next turn
#: (consumer.turns). Each ms of it is a ms a fetch slot waits (frontier_bench, one
#: consumer: 0.78 of the bound at 50 ms, 0.92 at 20).
DISPATCH_S = 0.02
DISPATCH_MS = int(DISPATCH_S * 1000)
#: A polite crawl leases each host's turn up to this long before it comes, timed to start
#: then (lease.lua's ahead_ms), and asks again at most every half of it while no host is
#: ready: one lease call serves the turns of many hosts, not the one or two whose turn
#: came since the last call. Each ms of it is up to a ms a fetch slot holds a lease
#: before its request.
AHEAD_MS = 100
#: Shortest sleep between lease calls when a host's turn is close.
MIN_IDLE_WAIT_S = 0.005
#: An ended lease whose host's next turn comes within this long wakes the leaser (and
#: the fleet's idle consumers) at once; a later turn is the leaser's idle wait's to end.
TURN_SOON_MS = 50


class Leaser:
    """The lease loop of one consumer, and the room it leases for."""

    def __init__(self, settings: ConsumerSettings, queue: LeasingQueue, book: LeaseBook,
                 slots: Slots, *, window: CpuWindow, metrics: Metrics, stopping: Stopping,
                 health: SinkHealth, policy: PolicyReader, flusher: Flusher,
                 sink_failing: Callable[[], Awaitable[None]],
                 on_timed: Callable[[Sequence[Lease]], None] = lambda leases: None,
                 browser_pages: Callable[[], int] | None = None) -> None:
        self.s = settings
        self.queue = queue
        self.book = book
        self.slots = slots
        self.window = window
        self.metrics = metrics
        self.stopping = stopping
        self.health = health
        self.policy = policy
        self.flusher = flusher
        self._sink_failing = sink_failing
        #: Redis' clock as lease replies show it (turns are on it).
        self.clock = RedisClock()
        self.room = asyncio.Event()
        self.freed = asyncio.Event()
        self.idle = False  # waits for a host's slot or new work
        self.wake_at = 0.0  # monotonic time the idle wait ends (0: not idle)
        # Leases whose response is in, to a host with a concurrency limit: the next lease
        # call gives their hosts' slots back (the ack comes after the handler and sink).
        self.responses_in: list[Lease] = []
        self._max_held = 4 * settings.concurrency
        self.started = time.monotonic()
        #: Told the leases timed for their hosts' turns as they are dispatched (their
        #: robots.txt copies are read ahead of the turns: ``consumer.robots.read_ahead``).
        self._on_timed = on_timed
        #: The render lane's leaser, with a browser (its pages free: `browser_pages`).
        self.renders = None if browser_pages is None else RenderLeaser(
            queue, book, slots, worker=settings.worker_id, lease_ms=settings.lease_ms,
            pages=browser_pages, metrics=metrics, stopping=stopping, health=health,
            policy=policy, clock=self.clock, dispatch=self.dispatch)
        # Whether the crawl's leases come with a delay (the lease reply says, host by
        # host): then each is its host's turn, to be fetched when granted, so nothing is
        # prefetched. Assumed until a lease call shows otherwise.
        self._set_timed(True)

    def _set_timed(self, timed: bool) -> None:
        """Size leasing for timed leases (one slot, one turn) or untimed (prefetch up to
        2x --concurrency, in calls of a quarter batch)."""
        self._timed = timed
        c = self.s.concurrency
        self._max_active = c if timed else 2 * c
        self._lease_min = 1 if timed else max(1, min(self.s.lease_batch, 2 * c) // 4)

    async def run(self) -> str:
        """Lease until draining (render tasks too, with a browser); returns why it stopped
        ("crawl empty" or "signal")."""
        renders = None if self.renders is None else asyncio.create_task(self.renders.run())
        try:
            return await self._run()
        finally:
            if renders is not None:
                renders.cancel()
                await asyncio.wait({renders}, timeout=5)

    async def _run(self) -> str:
        idle = Backoff(base=0.02, cap=1.0)
        errors = Backoff()
        me = asyncio.current_task()
        while not self.stopping.draining:
            if me is not None and me.cancelling():
                # Python 3.11's asyncio.wait_for (redis-py's socket writes) drops a cancel
                # that lands as the write completes; the task still counts it: honour it.
                raise asyncio.CancelledError
            if self.health.failing:
                await self._sink_failing()
                continue
            room, least = self._room(), self._least()
            if room < least and not self.responses_in:
                self.room.clear()
                await self.room.wait()
                continue
            n = min(room, self.s.lease_batch) if room >= least else 0
            t0 = time.monotonic()
            try:
                # Hosts whose responses are in get their slots back in the same call.
                batch = await self.queue.lease_turns(
                    self.s.worker_id, n, self.s.lease_ms, self.responses_in,
                    self.book.slots, ahead_ms=AHEAD_MS if self._timed else 0)
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                if not may_run_again(exc, LEASE_SCRIPTS):
                    raise
                log.warning("redis_error", extra={"during": "lease", "error": str(exc)[:200]})
                await errors.sleep(self.stopping.stop)
                continue
            errors.reset()
            self.policy.named(batch.policy_version)
            if batch.leases:
                self._took(batch.leases, t0, batch.now_ms)
                idle.reset()
                if batch.wait_s is None:  # more may be ready now
                    continue
            elif not n:
                # Only gave slots back, with no room to use them: lease.lua told the
                # fleet's idle consumers at once (this one's handlers are behind).
                continue
            elif self.s.exit_when_empty and await self._crawl_finished():
                self.stopping.draining = True
                return "crawl empty"
            self.idle = True
            self.flusher.poke()  # links a handler found meanwhile are this consumer's work
            try:
                await self._idle_wait(batch, idle)
            finally:
                self.idle = False
        return "signal"

    def _took(self, leases: Sequence[Lease], t0: float, now_ms: int) -> None:
        """Hold the leases of a reply sent at monotonic `t0` at Redis ms `now_ms`, and
        dispatch them."""
        self.clock.observe(time.monotonic(), now_ms)
        for lease in leases:
            old = self.book.hold(lease, t0)
            if old is not None:
                self.slots.drop(old)
        timed = any(lease.delay_ms > 0 for lease in leases)
        if timed != self._timed:
            self._set_timed(timed)
        self.dispatch(leases, now_ms)

    async def _idle_wait(self, batch: LeaseBatch, idle: Backoff) -> None:
        """Sleep until the next host's turn, else (no host ready: busy or nothing pending)
        a growing poll interval; a lease of ours ending (a slot freed) ends the sleep."""
        if batch.wait_s is not None and not batch.paused:
            # A timed crawl's turns come within AHEAD_MS of each call: no call sooner
            # than half of it, or each would serve only the turns come since the last.
            least = AHEAD_MS / 2000 if self._timed else MIN_IDLE_WAIT_S
            delay = max(least, batch.wait_s)
            idle.reset()
        else:
            delay = idle.next_delay()
        self.freed.clear()
        stop, freed = asyncio.ensure_future(self.stopping.stop.wait()), asyncio.ensure_future(
            self.freed.wait())
        self.wake_at = time.monotonic() + delay
        try:
            await asyncio.wait({stop, freed}, timeout=delay,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.wake_at = 0.0
            stop.cancel()
            freed.cancel()
        if freed.done() and not freed.cancelled():
            idle.reset()

    def dispatch(self, leases: Sequence[Lease], now_ms: int) -> None:
        """Hand new leases of a reply at Redis ms `now_ms` to the fetch slots. Those whose
        host has a delay (the lease reply says, whatever this consumer's flags) start
        DISPATCH_S after their turn (``granted_ms``: the reply's time, or up to AHEAD_MS
        later): each is its host's turn on Redis' clock, and starting every such request a
        fixed time after its turn (rather than whenever the event loop gets to it) keeps
        two requests to a host at least the host's delay apart at the server, whichever
        consumers send them. The others start at once."""
        timed = [lease for lease in leases if lease.delay_ms > 0]
        if len(timed) < len(leases):
            for lease in leases:
                if lease.delay_ms <= 0:
                    self.slots.move(lease, Stage.QUEUED)
        if not timed:
            return
        self._on_timed(timed)
        # Timed from Redis' clock now, not from the reply's TIME: a reply read late (a
        # busy event loop) would otherwise start its requests late by its age, and a
        # request late on the wire waits for a turn of its own (consumer.turns). The
        # estimate trails Redis' true time (RedisClock), so none starts early.
        now_ms = max(now_ms, self.clock.to_redis_ms(time.monotonic()) or now_ms)
        by_turn: dict[int, list[Lease]] = {}
        for lease in timed:
            self.slots.move(lease, Stage.SCHEDULED)
            by_turn.setdefault(lease.granted_ms, []).append(lease)
        loop = asyncio.get_running_loop()
        for turn, group in by_turn.items():
            loop.call_later(DISPATCH_S + max(0, turn - now_ms) / 1000, self._start, group)

    def _start(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            if self.slots.stage(lease) is Stage.SCHEDULED:
                if self.book.holds(lease) and not self.stopping.draining:
                    self.slots.move(lease, Stage.QUEUED)
                else:
                    self.slots.move(lease, Stage.DONE)

    def _room(self) -> int:
        # Leases not yet finished keep every slot fed; finished ones waiting for their
        # flush don't count, or leasing would stall in waves. Held leases in all are
        # capped too, so a stuck flush can't make a consumer hoard work.
        # A lease scheduled for its host's turn (AHEAD_MS at most) counts too: when its
        # turn comes a fetch slot must be free, or it would start late and the host's
        # next turn, leased meanwhile, would come too soon after it.
        # A page whose robots.txt went under its lease waits a delay for its own turn
        # (TURN_WAIT) and does not count: a late start takes a turn of its own
        # (consumer.turns), and a wide crawl has a host's first page in that wait.
        unfinished = self.slots.count() - self.slots.count(Stage.TURN_WAIT)
        if self.window.cpu_bound:
            return 0  # CPU-bound: what it would lease would wait here, not at the host
        # The CPU window sizes untimed leasing only: a timed lease is its host's turn,
        # and a turn not taken is a turn lost.
        active = self._max_active if self._timed else min(self._max_active,
                                                           int(self.window.size))
        return min(active - unfinished, self._max_held - len(self.book))

    def _least(self) -> int:
        """The least room worth a lease call (a batch's quarter, less in a small window)."""
        return min(self._lease_min, max(1, int(self.window.size) // 4))

    def wake(self) -> None:
        """Wake the leaser once a lease call's worth of room is free (not every page)."""
        if not self.room.is_set() and self._room() >= self._least():
            self.room.set()

    def response_in(self, lease: Lease) -> None:
        """`lease`'s response is in: its host's slot goes back with the next lease call,
        which is now (the idle wait and the wait for room end)."""
        self.responses_in.append(lease)
        self.book.response_in(lease)
        self.freed.set()  # ends the leaser's idle wait
        self.room.set()  # and its wait for room

    def woken(self) -> None:
        """Another process freed a host's slot or queued work: look again now."""
        self.queue.woken()
        self.slot_freed(True)

    def starved(self) -> bool:
        """A fetch slot idles while the leaser waits for a host's turn or new work."""
        return self.idle and self.slots.has_idle()

    def slot_freed(self, turn: bool) -> None:
        """Leases of ours ended in Redis: room for more; with `turn`, a host may take
        another request now (end the leaser's idle wait)."""
        if turn:
            self.freed.set()
        if self.renders is not None:
            self.renders.kick()
        self.wake()

    def turn_soon(self, ended: Sequence[Lease]) -> bool:
        """Whether a host of these ended leases may take a request before the leaser asks
        again (its idle wait's end; at least TURN_SOON_MS from now: the fleet's idle
        consumers are told too): one without a delay (a free slot was all it waited
        for), or one whose next turn, its turn plus its delay, comes before then. A host
        whose next turn is later is served then: a lease call before it would find it
        not due (each such call is a script's work for no page)."""
        local = time.monotonic()
        now = self.clock.to_redis_ms(local)
        if now is None:
            return True
        until = now + max(TURN_SOON_MS, (self.wake_at - local) * 1000)
        return any(lease.delay_ms <= 0 or lease.granted_ms + lease.delay_ms <= until
                   for lease in ended)

    async def _crawl_finished(self) -> bool:
        if self.book.held or self.flusher.completions:
            return False
        if time.monotonic() - self.started < self.s.empty_grace_s:
            return False
        try:
            return await self.queue.is_empty()
        except REDIS_ERRORS:
            return False
