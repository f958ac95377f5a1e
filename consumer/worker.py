"""The consumer's work loop: lease hosts' turns, fetch, write results, ack — and drain.

Coroutines of one process:

- the leaser asks the frontier for as many tasks as there are free fetch slots; the
  frontier only hands out tasks whose host's turn has come (``common/lua/lease.lua``),
  so a leased task is fetched at once. With none ready it sleeps until the next host's
  turn (at most a second, so pauses and host settings apply within one);
- ``--concurrency`` workers (the fetch slots) take leases off a local queue: each checks
  robots.txt, fetches, runs the handler and queues a completion. A lease whose robots.txt
  is not known yet waits outside the workers while it is looked up; when this consumer
  fetched robots.txt itself, that request was the host's turn, so the task goes back to
  the head of its host's queue for the next one;
- the flusher (``consumer.flush``) writes results, enqueues discovered URLs (through
  ``consumer.intake``), then acks/fails/releases in batches; at once when a fetch slot
  idles waiting for what a flush frees, and then tells the crawl's idle consumers
  (``common.wake``);
- the wake listener: another process freed a host's slot or queued work, so the leaser
  asks again now instead of at the end of its back-off; or the crawl's policy changed, so
  it is read again (one HGETALL; also when a lease reply names a newer version, and at
  every heartbeat): its content types, user agent, robots.txt rule and TTL, link scope,
  the attempts and recrawl window of the links' tasks and the retry timing apply to the
  work that starts after, and the leaser asks again at once (turns may have moved
  earlier);
- the heartbeat and the reaper (``consumer.housekeeping``).

When the sink refuses a write (``consumer.sinkhealth``) the leaser stops, what is held
and not started is released, and the consumer waits for the sink to take writes again;
after ``--sink-retry-for`` it gives up: drains at once and exits ``EXIT_SINK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import ConfigError, FetchError, RedisUnavailableError
from common.exitcodes import EXIT_OK, EXIT_SINK
from common.frontier.hosts import Frontier
from common.http.fetcher import Fetcher, FetchResult
from common.metrics import Metrics
from common.policy import OPTIONS, is_pushback, read_values
from common.queue import Code, DedupMode, Failure, Lease, LeaseBatch, LeasingQueue
from common.reasons import CONNECT_ERROR
from common.redis_errors import REDIS_ERRORS
from common.wake import WakeChannel
from common.workers import WorkerRegistry
from consumer.backoff import Backoff
from consumer.clock import RedisClock
from consumer.config import ConsumerSettings
from consumer.flush import Completion, Flusher, describe_error
from consumer.handlers import Handler, HandlerContext, LeaseLostError, as_result
from consumer.housekeeping import Housekeeping
from consumer.intake import LinkIntake
from consumer.leases import LeaseBook
from consumer.robots import RobotsCache, RobotsVerdict
from consumer.sinkhealth import SinkHealth
from consumer.sinks import Record, Sink, sink_target

log = logging.getLogger("consumer")

SHUTDOWN_WAIT_S = 5.0
#: In a polite crawl, a lease's request starts this long after the lease call returned
#: (see Consumer._dispatch): event-loop delays up to this long don't bring two requests to
#: a host closer than its delay; a request later still moves its host's next turn
#: (Consumer._note_sent). Each ms of it is a ms a fetch slot waits (frontier_bench, one
#: consumer: 0.78 of the bound at 50 ms, 0.92 at 20).
DISPATCH_S = 0.02
DISPATCH_MS = int(DISPATCH_S * 1000)
#: A polite request this much later than DISPATCH_S after its turn is on time: its host's
#: next turn is not moved (each move is a write, and a late turn a slower crawl).
LATE_SLACK_MS = 10
#: Responses waiting for (or in) the handler past which the consumer leases nothing: its
#: CPU is the bottleneck, and leases it took would wait for it while another consumer of
#: the fleet could serve them (a host's slot comes back when the response is in).
MAX_HANDLING = 4
#: The fewest unfinished leases the CPU window (Consumer._window) allows.
MIN_WINDOW = 2
#: Shortest sleep between lease calls when a host's turn is close.
MIN_IDLE_WAIT_S = 0.005
#: An ended lease whose host's next turn comes within this long wakes the leaser (and
#: the fleet's idle consumers) at once; a later turn is the leaser's idle wait's to end.
TURN_SOON_MS = 50


class Consumer:
    """One consumer process's work loop over one crawl."""

    def __init__(
        self,
        settings: ConsumerSettings,
        queue: LeasingQueue,
        fetcher: Fetcher,
        sink: Sink,
        metrics: Metrics,
        *,
        robots: RobotsCache | None = None,
        handler: Handler | None = None,
    ) -> None:
        self.s = settings
        self.worker = settings.worker_id
        self.queue = queue
        self.frontier = Frontier(queue)
        self.fetcher = fetcher
        self.metrics = metrics
        self.robots = robots
        self.handler = handler
        self.book = LeaseBook(settings.lease_s, metrics)
        intake = LinkIntake(metrics, max_depth=settings.max_depth,
                            allow_domains=settings.allow_domains,
                            cache_size=settings.link_cache,
                            recrawl_after_s=queue.recrawl_after_s)
        self.wake = WakeChannel(queue.client, queue.crawl_keys.wake, listening=True)
        self.sink_health = SinkHealth(settings.sink_retry_for_s)
        self.flusher = Flusher(queue, sink, metrics, self.book, worker=self.worker,
                               batch=max(8, settings.lease_batch // 4), intake=intake,
                               on_freed=self._slot_freed, turn_soon=self._turn_soon,
                               urgent=self._starved,
                               notify=self.wake.notify, health=self.sink_health)
        self.housekeeping = Housekeeping(
            queue, self.book, metrics,
            WorkerRegistry(queue.client, queue.crawl, self.worker, ttl_s=settings.lease_s),
            worker=self.worker, lease_s=settings.lease_s, status=self._status,
            on_lost=self._lost, settling=self.flusher.finishing, on_beat=self.read_policy)
        #: The media types whose bodies are read (the crawl policy's accept_content_type;
        #: empty: all), read at start and again on a policy change.
        self.accept: tuple[str, ...] = settings.accept_content_type
        #: Whether robots.txt is skipped (the crawl policy's ignore_robots), likewise.
        self.ignore_robots = settings.ignore_robots
        #: The outcomes that count as push-back (the crawl policy's backoff_on), likewise.
        self.backoff_on: tuple[str, ...] = OPTIONS["backoff_on"].default
        #: Whether acks carry response times (the crawl policy's adaptive_delay is on).
        self.adaptive = False
        #: The longest Crawl-delay obeyed (the crawl policy's max_crawl_delay; 0: any).
        self.max_crawl_delay: float = OPTIONS["max_crawl_delay"].default
        self._policy_read: asyncio.Task[None] | None = None
        self._policy_again = False
        self._policy_version = -1  # the version read last (-1: none yet)
        self._policy_named = -1  # the newest version a lease reply named
        self.sink = sink
        self._pending: deque[Lease] = deque()  # leased, waiting for a worker
        self._running: dict[str, tuple[asyncio.Task[None], Lease]] = {}  # id -> worker
        self._waiting: dict[str, asyncio.Task[None]] = {}  # robots.txt lookups
        self._scheduled: dict[str, asyncio.TimerHandle] = {}  # leased, to start soon
        self._clock = RedisClock()
        self._dropping: dict[asyncio.Task[None], Lease] = {}  # workers told to drop it
        self._idle: deque[asyncio.Future[None]] = deque()
        self._workers: list[asyncio.Task[None]] = []
        self._fetching: set[str] = set()
        self._handling = 0  # responses in the handler (or waiting for the CPU to run it)
        # How many unfinished leases this consumer's CPU keeps up with: shrinks by one for
        # each response that finds MAX_HANDLING others waiting for the handler, grows by
        # one for each that finds the handler idle. An I/O-bound consumer stays at its
        # full room; a CPU-bound one holds only what it can handle, and its hosts' other
        # slots go to the fleet.
        self._window = float(2 * settings.concurrency)
        self._started: set[str] = set()  # fetch begun: drained within --grace, not cut
        self._room = asyncio.Event()
        self._freed = asyncio.Event()
        self._stop = asyncio.Event()
        self._hard_stop = asyncio.Event()
        self.draining = False
        self._closing = False
        self.stop_reason = ""
        self.exit_code = EXIT_OK
        self.started = time.monotonic()
        metrics.in_flight.set_function(lambda: len(self._fetching))
        self._leaser_idle = False  # the leaser waits for a host's slot or new work
        # Leases whose response is in, to a host with a concurrency limit: the next lease
        # call gives their hosts' slots back (the ack comes after the handler and sink).
        self._responses_in: list[Lease] = []
        self._wake_at = 0.0  # monotonic time the leaser's idle wait ends (0: not idle)
        self._max_held = 4 * settings.concurrency
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

    @property
    def done(self) -> int:
        return self.flusher.done

    @property
    def failed(self) -> int:
        return self.flusher.failed

    @property
    def held(self) -> dict[str, Lease]:
        return self.book.held

    def _status(self) -> dict[str, int | str]:
        state = "draining" if self.draining else \
            "sink_failing" if self.sink_health.failing else "running"
        return {"in_flight": len(self._fetching), "done": self.done, "failed": self.failed,
                "state": state}

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: drain gracefully. Second call: release everything and exit now."""
        if self.draining:
            self._hard_stop.set()
        self.draining = True
        self._stop.set()
        self._room.set()

    async def ready_problem(self) -> str | None:
        """Why /readyz should fail, or None."""
        if self.draining:
            return "draining"
        if self.sink_health.episode_open:
            kind, target = sink_target(self.sink)
            return (f"sink failing: {kind} {target}: "
                    f"{describe_error(self.sink_health.last_error)}")
        try:
            await self.queue.client.ping()
        except REDIS_ERRORS as exc:
            return f"redis unreachable: {type(exc).__name__}"
        return None

    async def run(self) -> int:
        """Work until stopped (signal, or an empty crawl with --exit-when-empty)."""
        log.info("consumer_started", extra={"worker": self.worker, "crawl": self.queue.crawl,
                                             "concurrency": self.s.concurrency})
        closing = self._is_closing
        await self.read_policy()
        helpers = [asyncio.create_task(c) for c in (
            self.housekeeping.heartbeat(closing), self.housekeeping.reaper(closing),
            self.flusher.run(closing))]
        listener = asyncio.create_task(
            self.wake.listen(self._woken, closing, on_policy=self._policy_changed))
        self._workers = [asyncio.create_task(self._worker())
                         for _ in range(self.s.concurrency)]
        try:
            await self._leaser()
            await self._drain()
        finally:
            # redis-py can turn a cancellation that lands mid-command into a connection
            # error, which a loop would catch and go on: so the loops also check _closing,
            # and shutdown waits for them a bounded time.
            self._closing = True
            everything = [*helpers, *self._workers]
            if self._policy_read is not None:
                everything.append(self._policy_read)
            for task in everything:
                task.cancel()
            await asyncio.wait(everything, timeout=SHUTDOWN_WAIT_S)
            # The listener stops on _closing by itself (a cancel could lose its
            # connection mid-connect); cancelled only if it doesn't.
            await asyncio.wait({listener}, timeout=1.0)
            if not listener.done():
                listener.cancel()
                await asyncio.wait({listener}, timeout=SHUTDOWN_WAIT_S)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.housekeeping.registry.leave()
        log.info("consumer_stopped", extra={"worker": self.worker, "reason": self.stop_reason,
                                            "done": self.done, "failed": self.failed})
        return self.exit_code

    def _is_closing(self) -> bool:
        return self._closing

    # -- the crawl's policy -------------------------------------------------------------

    async def read_policy(self) -> None:
        """Read the crawl's policy (one HGETALL) and apply what the consumer takes from
        it live (`accept`, `ignore_robots`, the user agent of the fetcher and of robots.txt,
        robots.txt's TTL, the link intake's scope and the attempts and recrawl window of
        its tasks, the queue's retry policy); on a Redis error keep what it had (the next
        heartbeat reads it again)."""
        try:
            stored = await read_values(self.queue.client, self.queue.crawl)
        except REDIS_ERRORS as exc:
            log.warning("redis_error", extra={"during": "policy", "error": str(exc)[:200]})
            return
        except ConfigError as exc:  # a stored value this crawlq can't read
            log.warning("crawl_policy_unreadable", extra={"error": str(exc)[:200]})
            return
        if stored is None or stored.version == self._policy_version:
            return
        self._policy_version = stored.version
        policy = stored.policy
        self.accept = policy.accept_content_type
        self.ignore_robots = policy.ignore_robots
        self.backoff_on = policy.backoff_on
        self.max_crawl_delay = policy.max_crawl_delay
        self.adaptive = policy.adaptive_delay > 0
        self.fetcher.set_user_agent(policy.user_agent)
        if self.robots is not None:
            self.robots.set_user_agent(policy.user_agent)
            self.robots.set_ttl(policy.robots_ttl)
        recrawl_after = self._recrawl_after(policy.recrawl_after)
        self.flusher.intake.set_scope(policy.max_depth, policy.allow_domains)
        self.flusher.intake.set_tasks(policy.max_attempts, recrawl_after)
        # The queue reads these at each fail, reclaim and enqueue call: the next one
        # takes them.
        self.queue.configure(retry=policy.retry(), recrawl_after_s=recrawl_after)
        texts = policy.texts()
        log.info("crawl_policy_applied", extra={
            "version": stored.version, "accept_content_type": ",".join(self.accept) or "*/*",
            "per_host_delay": policy.per_host_delay,
            "per_host_concurrency": policy.per_host_concurrency,
            **{k: texts[k] for k in ("user_agent", "ignore_robots", "robots_ttl",
                                     "max_depth", "allow_domains", "retry_base",
                                     "retry_cap", "max_retry_after", "max_stalls",
                                     "max_attempts", "recrawl_after")}})

    def _recrawl_after(self, window: int) -> int:
        """The policy's recrawl window for the links this consumer enqueues; none on a
        bloom crawl (no timestamps: the policy was set before the crawl was created)."""
        if window and self.queue.settings.dedup is DedupMode.BLOOM:
            log.warning("crawl_policy_not_applied", extra={
                "key": "recrawl_after", "value": f"{window}s",
                "advice": "this crawl uses bloom dedup, which keeps no timestamps: links "
                          "are enqueued without a recrawl window. Set recrawl_after=0 with "
                          f"crawlq crawl set --crawl {self.queue.crawl} recrawl_after=0"})
            return 0
        return window

    def _policy_changed(self) -> None:
        """The policy changed (a policy message, or a lease reply naming a newer version):
        read it again, one read at a time (a change during a read gets one more); and
        lease again now: the change may have moved hosts' turns earlier."""
        self._woken()
        if self._policy_read is not None and not self._policy_read.done():
            self._policy_again = True
            return
        self._policy_read = asyncio.create_task(self._read_policy_again())

    async def _read_policy_again(self) -> None:
        self._policy_again = True
        while self._policy_again and not self._closing:
            self._policy_again = False
            await self.read_policy()

    # -- leasing ----------------------------------------------------------------------

    async def _leaser(self) -> None:
        idle = Backoff(base=0.02, cap=1.0)
        errors = Backoff()
        me = asyncio.current_task()
        while not self.draining:
            if me is not None and me.cancelling():
                # Python 3.11's asyncio.wait_for (redis-py's socket writes) drops a cancel
                # that lands as the write completes; the task still counts it: honour it.
                raise asyncio.CancelledError
            if self.sink_health.failing:
                await self._sink_failing()
                continue
            room, least = self._lease_room(), self._least()
            if room < least and not self._responses_in:
                self._room.clear()
                await self._room.wait()
                continue
            n = min(room, self.s.lease_batch) if room >= least else 0
            t0 = time.monotonic()
            try:
                # Hosts whose responses are in get their slots back in the same call.
                batch = await self.queue.lease_turns(self.worker, n, self.s.lease_ms,
                                                     self._responses_in, self.book.slots)
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                log.warning("redis_error", extra={"during": "lease", "error": str(exc)[:200]})
                await errors.sleep(self._stop)
                continue
            errors.reset()
            if batch.policy_version > max(self._policy_version, self._policy_named):
                self._policy_named = batch.policy_version
                self._policy_changed()
            if batch.leases:
                self._clock.observe(time.monotonic(), batch.leases[-1].granted_ms)
                for lease in batch.leases:
                    old = self.book.hold(lease, t0)
                    if old is not None:
                        self._drop_work(old)
                timed = any(lease.delay_ms > 0 for lease in batch.leases)
                if timed != self._timed:
                    self._set_timed(timed)
                self._dispatch(batch.leases)
                idle.reset()
                continue
            if not n:
                # Only gave slots back, with no room to use them: lease.lua told the
                # fleet's idle consumers at once (this one's handlers are behind).
                continue
            if self.s.exit_when_empty and await self._crawl_finished():
                self.stop_reason = "crawl empty"
                self.draining = True
                return
            self._leaser_idle = True
            self.flusher.poke()  # links a handler found meanwhile are this consumer's work
            try:
                await self._idle_wait(batch, idle)
            finally:
                self._leaser_idle = False
        if not self.stop_reason:
            self.stop_reason = "signal"

    async def _idle_wait(self, batch: LeaseBatch, idle: Backoff) -> None:
        """Sleep until the next host's turn, else (no host ready: busy or nothing pending)
        a growing poll interval; a lease of ours ending (a slot freed) ends the sleep."""
        if batch.wait_s is not None and not batch.paused:
            delay = max(MIN_IDLE_WAIT_S, batch.wait_s)
            idle.reset()
        else:
            delay = idle.next_delay()
        self._freed.clear()
        stop, freed = asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(
            self._freed.wait())
        self._wake_at = time.monotonic() + delay
        try:
            await asyncio.wait({stop, freed}, timeout=delay,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._wake_at = 0.0
            stop.cancel()
            freed.cancel()
        if freed.done() and not freed.cancelled():
            idle.reset()

    async def _sink_failing(self) -> None:
        """The sink refused a write: lease nothing, release what is held and not started
        (fetches in flight go on: their results are the flusher's next try), until the
        sink takes writes again or the episode has lasted --sink-retry-for (give up)."""
        health = self.sink_health
        log.warning("sink_failing", extra={"error": describe_error(health.last_error),
                                           "held": len(self.book),
                                           "left_s": round(health.left_s(), 1)})
        while health.failing and not self.draining:
            await self._shed()
            if health.gave_up():
                self._give_up()
                return
            health.changed.clear()
            stop = asyncio.ensure_future(self._stop.wait())
            changed = asyncio.ensure_future(health.changed.wait())
            try:  # at least once a second: a release that met a Redis outage is retried
                await asyncio.wait({stop, changed}, timeout=min(1.0, health.left_s()),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                changed.cancel()
        if not health.failing and not self.draining:
            log.info("sink_trying_again", extra={"failures": health.failures})

    async def _shed(self) -> None:
        """Give back every held lease that is not being fetched and has no result waiting."""
        self._pending.clear()
        self._scheduled.clear()
        parked = list(self._waiting.values())
        self._waiting.clear()
        await self._cancel(parked)
        await self._release_unfinished()

    def _give_up(self) -> None:
        """The sink failed for the whole --sink-retry-for: say so once, then stop now
        (no grace: results can't be written) and exit EXIT_SINK."""
        health = self.sink_health
        kind, target = sink_target(self.sink)
        log.error("sink_failed", extra={
            "sink": kind, "target": target, "error": describe_error(health.last_error),
            "failures": health.failures, "retried_s": round(health.retry_for_s, 1),
            "exit_code": EXIT_SINK,
            "advice": f"the {kind} sink ({target}) refused every write for "
                      f"--sink-retry-for; its tasks were released for other consumers. "
                      f"Fix the volume (space, permissions, read-only mount) or the "
                      f"stream's Redis, then restart this consumer"})
        self.stop_reason = "sink failed"
        self.exit_code = EXIT_SINK
        self.draining = True
        self._hard_stop.set()
        self._stop.set()
        self._room.set()

    def _dispatch(self, leases: Sequence[Lease]) -> None:
        """Hand new leases to the workers. Those whose host has a delay (the lease reply
        says, whatever this consumer's flags), all of one call's at the same moment,
        DISPATCH_S after the reply: each is its host's turn on Redis' clock, and starting
        every such request a fixed time after its turn (rather than whenever the event
        loop gets to it) keeps two requests to a host at least the host's delay apart at
        the server, whichever consumers send them. The others start at once."""
        timed = [lease for lease in leases if lease.delay_ms > 0]
        if len(timed) < len(leases):
            self._pending.extend(lease for lease in leases if lease.delay_ms <= 0)
            self._wake_workers()
        if not timed:
            return
        handle = asyncio.get_running_loop().call_later(DISPATCH_S, self._start, timed)
        for lease in timed:
            self._scheduled[lease.id] = handle

    def _start(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            if self._scheduled.pop(lease.id, None) is not None and self.book.holds(lease) \
                    and not self.draining:
                self._pending.append(lease)
        self._wake_workers()

    def _lease_room(self) -> int:
        # Leases not yet finished keep every worker fed; finished ones waiting for their
        # flush don't count, or leasing would stall in waves. Held leases in all are
        # capped too, so a stuck flush can't make a consumer hoard work.
        unfinished = (len(self._pending) + len(self._running) + len(self._waiting)
                      + len(self._scheduled))
        if self._handling >= MAX_HANDLING:
            return 0  # CPU-bound: what it would lease would wait here, not at the host
        # The CPU window sizes untimed leasing only: a timed lease is its host's turn,
        # and a turn not taken is a turn lost.
        active = self._max_active if self._timed else min(self._max_active, int(self._window))
        return min(active - unfinished, self._max_held - len(self.book))

    def _least(self) -> int:
        """The least room worth a lease call (a batch's quarter, less in a small window)."""
        return min(self._lease_min, max(1, int(self._window) // 4))

    def _wake_leaser(self) -> None:
        """Wake the leaser once a lease call's worth of room is free (not every page)."""
        if not self._room.is_set() and self._lease_room() >= self._least():
            self._room.set()

    def _woken(self) -> None:
        """Another process freed a host's slot or queued work: look again now."""
        self.queue.woken()
        self._slot_freed(True)

    def _starved(self) -> bool:
        """A fetch slot idles while the leaser waits for a host's turn or new work."""
        return self._leaser_idle and bool(self._idle)

    def _slot_freed(self, turn: bool) -> None:
        """Leases of ours ended in Redis: room for more; with `turn`, a host may take
        another request now (end the leaser's idle wait)."""
        if turn:
            self._freed.set()
        self._wake_leaser()

    def _turn_soon(self, ended: Sequence[Lease]) -> bool:
        """Whether a host of these ended leases may take a request before the leaser asks
        again (its idle wait's end; at least TURN_SOON_MS from now: the fleet's idle
        consumers are told too): one without a delay (a free slot was all it waited
        for), or one whose next turn, its turn plus its delay, comes before then. A host
        whose next turn is later is served then: a lease call before it would find it
        not due (each such call is a script's work for no page)."""
        local = time.monotonic()
        now = self._clock.to_redis_ms(local)
        if now is None:
            return True
        until = now + max(TURN_SOON_MS, (self._wake_at - local) * 1000)
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

    # -- workers ----------------------------------------------------------------------

    async def _worker(self) -> None:
        """One fetch slot: take leases off the local queue one at a time and work each in
        place (no task per lease); return once draining and nothing is queued."""
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        pending, running, book, idle = self._pending, self._running, self.book, self._idle
        while True:
            if not pending:
                if self.draining:
                    return
                wake: asyncio.Future[None] = loop.create_future()
                idle.append(wake)
                await wake
                continue
            lease = pending.popleft()
            if not book.holds(lease):
                continue  # lost at a heartbeat before it started
            entry = running[lease.id] = (me, lease)
            try:
                await self._work(lease)
            except asyncio.CancelledError:
                # Told to drop a lease (lost at a heartbeat): go on with the next one. The
                # drop may have been meant for the lease before this one, if the worker moved
                # on before the cancellation reached it: then this lease starts again. Any
                # other cancellation (the consumer stopping: draining or closing is set
                # first) stops the worker. A library call can swallow a cancel (Python
                # 3.11's wait_for, which redis-py uses), leaving it counted: so a drop
                # clears every count, or the next drop would look like a stop and end
                # this fetch slot for good.
                dropped = self._dropping.pop(me, None)
                if dropped is None or self.draining or self._closing:
                    raise
                while me.uncancel() > 0:
                    pass
                if dropped is not lease and book.holds(lease):
                    pending.appendleft(lease)
            finally:
                if running.get(lease.id) is entry:
                    del running[lease.id]
                    self._started.discard(lease.id)
                self._wake_leaser()

    def _lost(self, lease: Lease) -> None:
        """A heartbeat found `lease` lost: stop its work and forget it."""
        self._drop_work(lease)
        self.book.drop(lease, lost=True)
        self._wake_leaser()

    def _drop_work(self, lease: Lease) -> None:
        """Stop working on a lease that is not ours anymore: cancel its fetch, or its wait."""
        entry = self._running.get(lease.id)
        if entry is not None and entry[1] is lease:
            worker = entry[0]
            self._dropping[worker] = lease
            worker.cancel()
        waiter = self._waiting.pop(lease.id, None)
        if waiter is not None:
            waiter.cancel()
        self._scheduled.pop(lease.id, None)  # _start skips it

    def _wake_workers(self) -> None:
        """Wake one idle worker per queued lease (all of them when draining, to return)."""
        idle = self._idle
        n = len(idle) if self.draining else len(self._pending)
        while idle and n > 0:
            wake = idle.popleft()
            if not wake.done():  # a worker cancelled while idle leaves its future behind
                wake.set_result(None)
                n -= 1

    def _complete(self, completion: Completion) -> None:
        self.flusher.add(completion)

    async def _robots_lookup(self, lease: Lease) -> None:
        """Fetch (or read the fleet's copy of) a lease's robots.txt while no worker waits.

        If this consumer fetched it, that request was the host's turn: record the host's
        Crawl-delay and give the task back to the head of its host's queue. Otherwise
        queue the lease again: its worker then finds the verdict cached.
        """
        assert self.robots is not None
        outage: Backoff | None = None
        try:
            while True:
                try:
                    verdict, fetched = await self.robots.lookup(lease.task.url)
                    break
                except RedisUnavailableError:
                    outage = outage or Backoff()
                    await outage.sleep()
            if fetched:
                self.metrics.robots_turns_total.inc()
                delay = verdict.crawl_delay if isinstance(verdict, RobotsVerdict) else None
                if delay:
                    await self.frontier.set_robots_delay(lease.host, self._crawl_delay(
                        lease.host, delay))
        except Exception as exc:  # a FetchError such as ssrf_blocked is not cached
            self._waiting.pop(lease.id, None)
            if self.book.holds(lease):
                if isinstance(exc, FetchError):
                    self._complete_error(lease, exc)
                elif isinstance(exc, REDIS_ERRORS):
                    self._complete(Completion(lease, "release"))
                else:
                    log.exception("task_crashed", extra={"id": lease.id})
                    self._complete(Completion(lease, "fail", failure=Failure(
                        lease, "internal_error", f"{type(exc).__name__}: {exc}")))
            self._wake_leaser()
            return
        self._waiting.pop(lease.id, None)
        if not self.book.holds(lease):
            self._wake_leaser()
        elif fetched:
            self._complete(Completion(lease, "release"))
        elif not self.draining:
            self._pending.appendleft(lease)
            self._wake_workers()

    async def _work(self, lease: Lease) -> None:
        """Take a lease through robots.txt, the fetch and the handler to its completion,
        or hand it to a robots.txt lookup outside the workers."""
        try:
            url = lease.task.url
            if self.robots is not None and not self.ignore_robots:
                try:
                    verdict = self.robots.cached(url)
                except FetchError as exc:  # a cached failure (robots_unavailable)
                    self._complete_error(lease, exc)
                    return
                if verdict is None:
                    self._waiting[lease.id] = asyncio.create_task(self._robots_lookup(lease))
                    return
                if not verdict.allowed:
                    self._complete(Completion(lease, "ack", "robots_disallowed",
                                              record=self._record(lease, None,
                                                                  "robots_disallowed")))
                    return
            if self.book.expired(lease):
                # e.g. the process was stopped: someone else may own it now.
                self.book.drop(lease, lost=True)
                return
            await self._fetch(lease)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("task_crashed", extra={"id": lease.id})
            self._complete(Completion(lease, "fail", failure=Failure(
                lease, "internal_error", f"{type(exc).__name__}: {exc}")))

    def _crawl_delay(self, host: str, asked: float) -> float:
        """A robots.txt Crawl-delay as the crawl obeys it: cut to the policy's
        max_crawl_delay (logged and counted) when longer."""
        cap = self.max_crawl_delay
        if cap <= 0 or asked <= cap:
            return asked
        self.metrics.robots_crawl_delay_capped_total.inc()
        log.warning("robots_crawl_delay_capped", extra={
            "host": host, "crawl_delay": asked, "max_crawl_delay": cap,
            "advice": "the crawl obeys at most max_crawl_delay; raise it (crawlq crawl set) "
                      "to obey the site, or block the host"})
        return cap

    def _note_sent(self, lease: Lease, started: float) -> None:
        """A request to a host with a delay that goes out later than DISPATCH_S after its
        turn (a busy event loop, a slow connect) has its time sent with its ack, and its
        host's next turn counts from it: another consumer's on-time request then can't
        follow it too closely."""
        sent = self._clock.to_redis_ms(started)
        if sent is not None and sent - DISPATCH_MS - LATE_SLACK_MS > lease.granted_ms:
            lease.sent_ms = max(lease.sent_ms, sent - DISPATCH_MS)

    def _on_sent(self, lease: Lease) -> Callable[[], None] | None:
        """For a request to a host with a delay: note when its headers really go out
        (after the connect; the first hop's, a redirect's are later requests)."""
        if lease.delay_ms <= 0:
            return None
        first = True

        def sent() -> None:
            nonlocal first
            if first:
                first = False
                self._note_sent(lease, time.monotonic())
        return sent

    async def _fetch(self, lease: Lease) -> None:
        self._started.add(lease.id)
        self._fetching.add(lease.id)
        started = time.monotonic()
        try:
            task = lease.task
            result = await self.fetcher.fetch(task.url, headers=task.headers or None,
                                              crawl_credentials=True,
                                              accept=self.accept or None,
                                              on_sent=self._on_sent(lease))
        except FetchError as exc:
            self.metrics.response(exc.status)
            # A status is the host's response, a page of its budget (a proxy's refusal
            # of CONNECT is not); a timeout or a refused connection is not.
            lease.responded = exc.status is not None and exc.reason != CONNECT_ERROR
            self._complete_error(lease, exc)
            return
        finally:
            self.metrics.fetch_duration_seconds.observe(time.monotonic() - started)
            self._fetching.discard(lease.id)
            # A host with a delay is bound by it: its next turn is a delay away whatever
            # its slots do, so its slot comes back with the ack (no extra script work).
            if lease.concurrency > 0 and not lease.delay_ms and not self.draining:
                self._responses_in.append(lease)
                self.book.slot_back(lease)
                self._freed.set()  # ends the leaser's idle wait
                self._room.set()  # and its wait for room
        lease.responded = True  # a page of its host's budget, whatever becomes of it
        if self.adaptive:
            lease.elapsed_ms = round(result.elapsed * 1000)
        self.metrics.response(result.status, len(result.body))
        if result.filtered:  # its Content-Type is not accepted: no body, no handler
            outcome = "filtered"
            self._complete(Completion(lease, "ack", outcome,
                                      record=self._record(lease, result, outcome)))
            return
        outcome = "ok" if result.status < 400 else "http_4xx"
        record = self._record(lease, result, outcome)
        urls: Sequence[str] = ()
        if self.handler is not None:
            # Counted before the handler's CPU work, and the loop goes round once: the
            # responses that came in together are all counted when the leaser runs next,
            # so a consumer whose CPU is behind gives its hosts' slots back (to the
            # fleet) instead of taking them all again.
            if self._handling >= MAX_HANDLING:
                self._window = max(MIN_WINDOW, self._window - 1)
            elif not self._handling:
                self._window = min(2 * self.s.concurrency, self._window + 1)
            self._handling += 1
            try:
                await asyncio.sleep(0)
                handled = as_result(await self.handler(result, self._context(lease)))
            except LeaseLostError:
                self._complete(Completion(lease, "drop"))
                return
            except Exception as exc:
                self.metrics.error("handler_error")
                self._complete(Completion(lease, "fail", failure=Failure(
                    lease, "handler_error", f"{type(exc).__name__}: {exc}"[:500])))
                return
            finally:
                self._handling -= 1
            record.items = handled.items
            urls = handled.urls
            if len(urls) > self.s.max_links:
                self.flusher.intake.capped(len(urls) - self.s.max_links)
                urls = urls[:self.s.max_links]
        self._complete(Completion(lease, "ack", outcome, record=record, urls=urls))

    def _context(self, lease: Lease) -> HandlerContext:
        async def save(value: Any) -> bool:
            return await self.queue.checkpoint(self.worker, lease, value) == Code.OK
        return HandlerContext(task=lease.task, worker=self.worker, _save=save,
                              max_links=self.s.max_links)

    def _complete_error(self, lease: Lease, exc: FetchError) -> None:
        self.metrics.error(exc.reason)
        pushback = is_pushback(self.backoff_on, exc.reason, exc.status)
        if pushback:
            self.metrics.pushback(exc.reason)
        self._complete(Completion(lease, "fail", failure=Failure(
            lease, exc.reason, exc.message[:500], retry_after=exc.retry_after,
            permanent=not exc.retryable, pushback=pushback)))

    def _record(self, lease: Lease, result: FetchResult | None, outcome: str) -> Record:
        task = lease.task
        if result is None:
            return Record(task_id=task.id, url=task.url, final_url=task.url, status=None,
                          outcome=outcome, headers={}, raw_headers=(), body=None, bytes=0,
                          elapsed=0.0, attempt=task.attempt, fetched_at=time.time(),
                          worker=self.worker, depth=task.depth, meta=task.meta)
        return Record(task_id=task.id, url=task.url, final_url=result.final_url,
                      status=result.status, outcome=outcome, headers=result.headers,
                      raw_headers=result.raw_headers,
                      body=None if result.filtered else result.body,
                      bytes=len(result.body), elapsed=result.elapsed, attempt=task.attempt,
                      fetched_at=time.time(), worker=self.worker,
                      http_version=result.http_version, depth=task.depth, meta=task.meta)

    async def flush(self) -> None:
        """Flush every completion now (shutdown, tests)."""
        await self.flusher.flush()

    async def renew(self) -> None:
        """Renew every held lease now (the heartbeat does it every lease / 3)."""
        await self.housekeeping.renew()

    # -- draining -----------------------------------------------------------------------

    async def _drain(self) -> None:
        """Release what hasn't started, let fetches finish within --grace, release the rest.

        A second signal (``request_stop`` again) ends the grace at once.
        """
        self.draining = True
        log.info("consumer_draining", extra={"held": len(self.book),
                                             "in_flight": len(self._fetching)})
        self._pending.clear()  # never started: released below
        self._scheduled.clear()
        parked = list(self._waiting.values())
        self._waiting.clear()
        await self._cancel(parked)
        self._wake_workers()  # idle workers see the drain and return
        await self._cancel([w for i, (w, _) in self._running.items() if i not in self._started])
        await self._release_unfinished()
        running = {w for w, _ in self._running.values()}  # each returns after its fetch
        if running and not self._hard_stop.is_set():
            hard = asyncio.create_task(self._hard_stop.wait())
            deadline = time.monotonic() + self.s.grace_s
            while running and not hard.done() and time.monotonic() < deadline:
                done, _ = await asyncio.wait({*running, hard}, return_when=asyncio.FIRST_COMPLETED,
                                             timeout=deadline - time.monotonic())
                running -= done
            hard.cancel()
            if running:
                log.warning("drain_grace_over", extra={"releasing": len(running)})
        await self._cancel(self._workers)
        await self.flush()
        with contextlib.suppress(TimeoutError):  # the flusher's own batch, if one is on
            await asyncio.wait_for(self.flusher.settle(), SHUTDOWN_WAIT_S)
        await self._release_unfinished()
        try:
            await self.sink.close()
        except Exception as exc:
            if self.exit_code != EXIT_SINK and not self.sink_health.episode_open:
                raise
            log.warning("sink_close_failed", extra={"error": describe_error(exc)})

    async def _cancel(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        tasks = [t for t in tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_S)

    async def _release_unfinished(self) -> None:
        """Release every held lease whose task no longer runs and has no result to flush."""
        finishing = self.flusher.finishing()
        leases = [lease for tid, lease in self.book.held.items()
                  if tid not in self._running and tid not in finishing]
        if not leases:
            return
        try:
            codes = await asyncio.wait_for(self.queue.release(self.worker, leases), 10)
        except (TimeoutError, *REDIS_ERRORS) as exc:
            log.warning("release_failed", extra={"n": len(leases), "error": str(exc)[:200]})
            return
        for lease, code in zip(leases, codes, strict=True):
            self.book.drop(lease, lost=code != Code.OK)
            if code == Code.OK:
                self.metrics.task("released")
        self._wake_leaser()
