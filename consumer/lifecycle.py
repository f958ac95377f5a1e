"""The consumer: lease hosts' turns, fetch, write results, ack — and drain.

Coroutines of one process, each part in its own module:

- the leaser (``consumer.leaser``) asks the frontier for as many tasks as there are free
  fetch slots, and dispatches them: a host's turn DISPATCH_S after the lease reply;
- ``--concurrency`` fetch slots (``consumer.slots``, where each lease's local `Stage`
  is kept) hand leases to the runner (``consumer.runner``): robots.txt, the fetch, the
  handler, and one completion per lease;
- the flusher (``consumer.flush``) writes results, enqueues discovered URLs (through
  ``consumer.intake``), then acks/fails/releases in batches; at once when a fetch slot
  idles waiting for what a flush frees, and then tells the crawl's idle consumers
  (``common.fleet.wake``);
- the wake listener: another process freed a host's slot or queued work, so the leaser
  asks again now instead of at the end of its back-off; or the crawl's policy changed, so
  it is read again (``consumer.live``; also when a lease reply names a newer version,
  and at every heartbeat): its content types, user agent, robots.txt rule and TTL, link
  scope, the attempts and recrawl window of the links' tasks and the retry timing apply
  to the work that starts after, and the leaser asks again at once (turns may have
  moved earlier);
- the heartbeat and the reaper (``consumer.housekeeping``).

This module is the lifecycle: start those, shed what is held while the sink fails, and
drain. When the sink refuses a write (``consumer.write_health``) the leaser stops, what is
held and not started is released, and the consumer waits for the sink to take writes
again; after ``--sink-retry-for`` it gives up: drains at once and exits ``EXIT_SINK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.exitcodes import EXIT_OK, EXIT_REDIS, EXIT_SINK
from common.fleet.wake import WakeChannel
from common.fleet.workers import WorkerRegistry
from common.http.fetcher import Fetcher
from common.observability.metrics import Metrics
from common.queue import Code, Lease, LeasingQueue
from common.redis.errors import REDIS_ERRORS
from common.redis.scripts import load_registered
from common.redis.startup import StartupWait, outage
from common.spider import Spider
from common.traps.book import TrapBook
from consumer.config import ConsumerSettings
from consumer.flush import FlushAbandoned, Flusher, describe_error
from consumer.handlers import Handler
from consumer.held import LeaseBook
from consumer.housekeeping import Housekeeping
from consumer.intake import LinkIntake
from consumer.judgement import Judge
from consumer.leaser import Leaser
from consumer.live import Live, LivePolicy, PolicyReader
from consumer.proxied import PageFetch
from consumer.robots import RobotsCache, read_ahead
from consumer.routing import Router
from consumer.runner import Runner
from consumer.sessions import FlushHooks
from consumer.sinks import Sink, sink_target
from consumer.slots import IN_SLOT, SHUTDOWN_WAIT_S, Slots, Stage, cancel
from consumer.stopping import Stopping
from consumer.window import CpuWindow
from consumer.write_health import SinkHealth

if TYPE_CHECKING:
    from common.browser.fetcher import BrowserFetcher

log = logging.getLogger("consumer")

#: How long a stopping consumer's last flush retries an unreachable Redis before it gives
#: up (EXIT_REDIS): its leases then expire and their tasks are leased again.
FLUSH_GIVE_UP_S = 30.0


class Consumer:
    """One consumer process over one crawl: runs its parts, sheds, drains. `live` is the
    policy snapshot `fetcher` and `robots` read (a new one when they read none)."""

    def __init__(self, settings: ConsumerSettings, queue: LeasingQueue, fetcher: Fetcher,
                 sink: Sink, metrics: Metrics, *, live: Live | None = None,
                 robots: RobotsCache | None = None, handler: Handler | None = None,
                 spider: Spider | None = None, browser: BrowserFetcher | None = None
                 ) -> None:
        self.s = settings
        self.worker_id = settings.worker_id
        self.queue = queue
        self.fetcher = fetcher
        self.sink = sink
        self.metrics = metrics
        self.stopping = Stopping()
        self.book = LeaseBook(settings.lease_s, metrics)
        self.window = CpuWindow(settings.concurrency)
        self.slots = Slots(self.book, self.stopping, on_slot_free=self._wake_leaser)
        if live is None:
            live = Live(LivePolicy.of_flags(settings))
        self.policy = PolicyReader(queue, live, stopping=self.stopping,
                                   on_change=self._woken)
        book = TrapBook(queue, self.worker_id)
        judge = Judge(book, live, metrics, self.worker_id)
        intake = LinkIntake(metrics, live, cache_size=settings.link_cache, book=book,
                            tokens=judge)
        self.wake = WakeChannel(queue.client, queue.crawl_keys.wake, listening=True)
        self.sink_health = SinkHealth(settings.sink_retry_for_s)
        self.hooks = FlushHooks.of(settings, queue, live, metrics)  # proxies, sessions
        self.flusher = Flusher(queue, sink, metrics, self.book, worker=self.worker_id,
                               batch=max(8, settings.lease_batch // 4), intake=intake,
                               on_freed=self._slot_freed, turn_soon=self._turn_soon,
                               urgent=self._starved,
                               notify=self.wake.notify, health=self.sink_health,
                               judge=judge, hooks=self.hooks)
        self.leaser = Leaser(settings, queue, self.book, self.slots, window=self.window,
                             metrics=metrics, stopping=self.stopping, health=self.sink_health,
                             policy=self.policy, sink_failing=self._sink_failing,
                             flusher=self.flusher, on_timed=read_ahead(robots, live),
                             browser_pages=None if browser is None else browser.page_capacity)
        router = Router.of(spider, handler, max_links=settings.max_links)
        self.runner = Runner(settings, queue, fetcher=fetcher, robots=robots, router=router,
                             metrics=metrics, book=self.book, slots=self.slots,
                             leaser=self.leaser, flusher=self.flusher, policy=self.policy,
                             window=self.window, stopping=self.stopping,
                             pages=PageFetch(fetcher, self.hooks.proxies,
                                             self.hooks.sessions), browser=browser)
        self.housekeeping = Housekeeping(
            queue, self.book, metrics,
            WorkerRegistry(queue.client, queue.crawl, self.worker_id, ttl_s=settings.lease_s),
            worker=self.worker_id, lease_s=settings.lease_s, status=self._status,
            on_lost=self.lost, settling=self.flusher.finishing, on_beat=self.policy.read)
        self.stop_reason = ""
        self.exit_code = EXIT_OK
        self.prepared = False  # `prepare`d: the policy read, the scripts loaded
        metrics.in_flight.set_function(lambda: self.slots.count(Stage.FETCHING))

    # The callbacks the flusher is built with go through the leaser made after it.
    def _wake_leaser(self) -> None:
        self.leaser.wake()

    def _slot_freed(self, turn: bool) -> None:
        self.leaser.slot_freed(turn)

    def _turn_soon(self, ended: Sequence[Lease]) -> bool:
        return self.leaser.turn_soon(ended)

    def _starved(self) -> bool:
        return self.leaser.starved()

    def _woken(self) -> None:
        self.leaser.woken()

    @property
    def draining(self) -> bool:
        return self.stopping.draining

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
        return {"in_flight": self.slots.count(Stage.FETCHING), "done": self.done,
                "failed": self.failed, "state": state}

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: drain gracefully. Second call: release everything and exit now."""
        if self.draining:
            self.stopping.hard.set()
        self.stopping.draining = True
        self.stopping.stop.set()
        self.leaser.room.set()

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
        log.info("consumer_started", extra={"worker": self.worker_id, "crawl": self.queue.crawl,
                                             "concurrency": self.s.concurrency})
        closing = self.stopping.is_closing
        if not self.prepared:
            await self.policy.read()
        await self.hooks.start()  # the fleet's word on its proxies before any pick
        helpers = [asyncio.create_task(c) for c in (
            self.housekeeping.heartbeat(closing), self.housekeeping.reaper(closing),
            self.flusher.run(closing), *self.hooks.loops(closing))]
        listener = asyncio.create_task(
            self.wake.listen(self._woken, closing, on_policy=self.policy.changed))
        self.slots.start(self.runner.work, self.s.concurrency)
        try:
            reason = await self.leaser.run()
            self.stop_reason = self.stop_reason or reason
            await self._drain()
        finally:
            # redis-py can turn a cancellation that lands mid-command into a connection
            # error, which a loop would catch and go on: so the loops also check closing,
            # and shutdown waits for them a bounded time.
            self.stopping.closing = True
            everything = [*helpers, *self.slots.tasks]
            if self.policy.task is not None:
                everything.append(self.policy.task)
            for task in everything:
                task.cancel()
            await asyncio.wait(everything, timeout=SHUTDOWN_WAIT_S)
            # The listener stops on closing by itself (a cancel could lose its
            # connection mid-connect); cancelled only if it doesn't.
            await asyncio.wait({listener}, timeout=1.0)
            if not listener.done():
                listener.cancel()
                await asyncio.wait({listener}, timeout=SHUTDOWN_WAIT_S)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.housekeeping.registry.leave()
        log.info("consumer_stopped", extra={"worker": self.worker_id,
                                            "reason": self.stop_reason,
                                            "done": self.done, "failed": self.failed})
        return self.exit_code

    def lost(self, lease: Lease) -> None:
        """A heartbeat found `lease` lost: stop its work and forget it."""
        self.slots.drop(lease)
        self.book.drop(lease, lost=True)
        self.leaser.wake()

    async def flush(self) -> None:
        """Flush every completion now (shutdown, tests)."""
        await self.flusher.flush()

    async def renew(self) -> None:
        """Renew every held lease now (the heartbeat does it every lease / 3)."""
        await self.housekeeping.renew()

    # -- a failing sink -------------------------------------------------------------------

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
            stop = asyncio.ensure_future(self.stopping.stop.wait())
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
        await self.slots.shed()
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
        self.stopping.draining = True
        self.stopping.hard.set()
        self.stopping.stop.set()
        self.leaser.room.set()

    # -- draining -----------------------------------------------------------------------

    async def _drain(self) -> None:
        """Release what hasn't started, let fetches finish within --grace, release the rest.

        A second signal (``request_stop`` again) ends the grace at once.
        """
        self.stopping.draining = True
        log.info("consumer_draining", extra={"held": len(self.book),
                                             "in_flight": self.slots.count(Stage.FETCHING)})
        await self.slots.shed()  # never started: released below
        self.slots.wake()  # idle slots see the drain and return
        await cancel(self.slots.working({Stage.STARTING}))
        await self._release_unfinished()
        running = self.slots.working()  # each returns after its fetch
        if running and not self.stopping.hard.is_set():
            hard = asyncio.create_task(self.stopping.hard.wait())
            deadline = time.monotonic() + self.s.grace_s
            while running and not hard.done() and time.monotonic() < deadline:
                done, _ = await asyncio.wait({*running, hard}, return_when=asyncio.FIRST_COMPLETED,
                                             timeout=deadline - time.monotonic())
                running -= done
            hard.cancel()
            if running:
                log.warning("drain_grace_over", extra={"releasing": len(running)})
        await cancel(self.slots.tasks)
        self.flusher.give_up_at = time.monotonic() + FLUSH_GIVE_UP_S
        with contextlib.suppress(FlushAbandoned):
            await self.flush()
            await self.flusher.save_link_counts()
        with contextlib.suppress(TimeoutError):  # the flusher's own batch, if one is on
            await asyncio.wait_for(self.flusher.settle(), SHUTDOWN_WAIT_S + FLUSH_GIVE_UP_S)
        if self.flusher.abandoned is not None:
            self._abandoned(self.flusher.abandoned)
        else:
            await self._release_unfinished()
        try:
            await self.sink.close()
        except Exception as exc:
            if self.exit_code != EXIT_SINK and not self.sink_health.episode_open:
                raise
            log.warning("sink_close_failed", extra={"error": describe_error(exc)})

    def _abandoned(self, exc: FlushAbandoned) -> None:
        """The last flush could not reach Redis for FLUSH_GIVE_UP_S: stop anyway (EXIT_REDIS)."""
        self.exit_code = EXIT_REDIS
        log.error("flush_abandoned", extra={
            "held": len(self.book), "error": str(exc),
            "advice": "Redis was unreachable as the consumer stopped: its leases expire and "
                      "their tasks are leased again (a result written to the sink already "
                      "may be written twice)"})

    async def _release_unfinished(self) -> None:
        """Release every held lease whose task no longer runs and has no result to flush."""
        busy = self.slots.ids(*IN_SLOT) | self.flusher.finishing()
        leases = [lease for tid, lease in self.book.held.items() if tid not in busy]
        if not leases:
            return
        try:
            codes = await asyncio.wait_for(self.queue.release(self.worker_id, leases), 10)
        except (TimeoutError, *REDIS_ERRORS) as exc:
            log.warning("release_failed", extra={"n": len(leases), "error": str(exc)[:200]})
            return
        for lease, code in zip(leases, codes, strict=True):
            self.book.drop(lease, lost=code != Code.OK)
            if code == Code.OK:
                self.metrics.task("released")
        self.leaser.wake()


async def prepare(consumer: Consumer, wait: StartupWait) -> None:
    """A consumer's last start-up steps, each waiting through a Redis outage
    (common.redis.startup): the crawl's policy read, its scripts loaded, itself in the worker
    registry. `Consumer.run` reads the policy itself when these were not run (tests)."""
    await wait.step("live policy", consumer.policy.load)
    await wait.step("scripts", lambda: load_registered(consumer.queue.client))
    await wait.step("registry", lambda: _join(consumer))
    consumer.prepared = True


async def _join(consumer: Consumer) -> None:
    """The registry's first beat; a refusal that is no outage (a full Redis, an ACL) is
    a WARNING, as at every heartbeat: the registry is for the operator, the crawl goes
    on without it."""
    try:
        await consumer.housekeeping.beat()
    except REDIS_ERRORS as exc:
        if outage(exc):
            raise
        log.warning("worker_registry_not_written", extra={"error": str(exc)[:200]})
