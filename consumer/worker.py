"""The consumer's work loop: lease, fetch politely, write results, ack — and drain.

Coroutines of one process:

- the leaser keeps up to 2 x ``--concurrency`` leases unfinished, leasing in batches
  into a local queue;
- ``--concurrency`` workers (the fetch slots) take leases off that queue one at a time:
  each checks robots.txt, takes a host slot (Redis, micro-batched), fetches, runs the
  handler, and queues a completion. A lease that must wait (its robots.txt being looked
  up, a short per-host delay) is parked outside the workers and queued again after;
- the flusher writes completed results to the sink, enqueues discovered URLs, then
  acks/fails/defers in batches — acks only after the sink has the result;
- the heartbeat renews every held lease in one script call per partition, cancels work
  whose lease was lost, and refreshes the worker registry;
- the reaper reclaims expired leases and promotes due retries (one worker per interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from yarl import URL

from common import history
from common.errors import FetchError, RedisUnavailableError
from common.metrics import Metrics
from common.queue import Code, CrawlQueue, Failure, Lease, NewTask
from common.urls import canonicalize, fingerprint
from common.workers import WorkerRegistry
from consumer.batching import MicroBatcher
from consumer.config import ConsumerSettings
from consumer.fetcher import Fetcher, FetchResult
from consumer.handlers import Handler, HandlerContext, LeaseLostError, as_result
from consumer.politeness import HostRequest, Politeness, Slot
from consumer.robots import RobotsCache
from consumer.sinks import Record, Sink

log = logging.getLogger("consumer")

#: A host wait up to this long is slept locally; a longer one defers the task in Redis.
LOCAL_WAIT_MAX_MS = 500
#: A 429/503 without Retry-After cools its host down this long, fleet-wide.
DEFAULT_COOLDOWN_MS = 30_000
MAX_COOLDOWN_MS = 600_000
FLUSH_INTERVAL_S = 0.02
PROGRESS_EVERY_S = 30.0
SHUTDOWN_WAIT_S = 5.0
REDIS_ERRORS = (RedisError, OSError)
_LOST = frozenset({Code.STALE, Code.EXPIRED, Code.UNKNOWN})  # the lease was not ours anymore


@dataclass(slots=True)
class Completion:
    """What became of one leased task, waiting for the flusher."""

    lease: Lease
    kind: str  # "ack" | "fail" | "defer"
    outcome: str = "ok"
    record: Record | None = None
    failure: Failure | None = None
    delay_ms: int = 0
    urls: Sequence[str] = ()
    slot: Slot | None = None
    cooldown_ms: int = 0


class Backoff:
    """Exponential backoff with full jitter for loops that must survive Redis outages."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    async def sleep(self) -> None:
        self.failures += 1
        await asyncio.sleep(random.uniform(0, min(self.cap, self.base * 2 ** self.failures)))

    def reset(self) -> None:
        self.failures = 0


def host_key(url: str) -> str:
    """The politeness key of a URL: host, plus the port when it is not the default."""
    u = URL(url, encoded=True)
    host = u.raw_host or ""
    return f"{host}:{u.explicit_port}" if u.explicit_port else host


class Consumer:
    """One consumer process's work loop over one crawl."""

    def __init__(
        self,
        settings: ConsumerSettings,
        queue: CrawlQueue,
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
        self.fetcher = fetcher
        self.sink = sink
        self.metrics = metrics
        self.robots = robots
        self.handler = handler
        self.politeness = Politeness(
            queue.client, queue.crawl, self.worker,
            concurrency=settings.per_host_concurrency, delay_s=settings.per_host_delay_s,
            slot_ttl_ms=settings.lease_ms, scripts=queue.scripts)
        self.registry = WorkerRegistry(queue.client, queue.crawl, self.worker,
                                       ttl_s=settings.lease_s)
        self._acquirer: MicroBatcher[HostRequest, Slot | int] = MicroBatcher(
            self.politeness.acquire)
        self.held: dict[str, Lease] = {}
        self._deadline: dict[str, float] = {}  # id -> local monotonic lease deadline
        self._pending: deque[Lease] = deque()  # leased, waiting for a worker
        self._running: dict[str, tuple[asyncio.Task[None], Lease]] = {}  # id -> worker
        self._waiting: dict[str, asyncio.Handle | asyncio.Task[None]] = {}  # parked
        self._dropping: dict[asyncio.Task[None], Lease] = {}  # workers told to drop it
        self._idle: deque[asyncio.Future[None]] = deque()
        self._workers: list[asyncio.Task[None]] = []
        self._acquire_errors = 0
        self._fetching: set[str] = set()
        self._started: set[str] = set()  # fetch begun: drained within --grace, not cut
        self._completions: list[Completion] = []
        self._completed = asyncio.Event()
        self._room = asyncio.Event()
        self._stop = asyncio.Event()
        self._hard_stop = asyncio.Event()
        self.draining = False
        self._closing = False
        self.stop_reason = ""
        self.started = time.monotonic()
        self.done = 0
        self.failed = 0
        metrics.in_flight.set_function(lambda: len(self._fetching))
        self._margin_s = min(1.0, settings.lease_s / 10)
        self._flush_at = max(8, settings.lease_batch // 4)
        self._max_active = 2 * settings.concurrency
        self._max_held = 4 * settings.concurrency
        self._lease_min = max(1, min(settings.lease_batch, self._max_active) // 4)
        self._last_history = 0.0

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
        try:
            await self.queue.client.ping()
        except REDIS_ERRORS as exc:
            return f"redis unreachable: {type(exc).__name__}"
        return None

    async def run(self) -> int:
        """Work until stopped (signal, or an empty crawl with --exit-when-empty)."""
        log.info("consumer_started", extra={"worker": self.worker, "crawl": self.queue.crawl,
                                             "concurrency": self.s.concurrency})
        helpers = [asyncio.create_task(c) for c in (
            self._heartbeat(), self._reaper(), self._flusher(), self._acquirer.run())]
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
            for task in everything:
                task.cancel()
            await asyncio.wait(everything, timeout=SHUTDOWN_WAIT_S)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.registry.leave()
        log.info("consumer_stopped", extra={"worker": self.worker, "reason": self.stop_reason,
                                            "done": self.done, "failed": self.failed})
        return 0

    # -- leasing ----------------------------------------------------------------------

    async def _leaser(self) -> None:
        idle = Backoff(base=0.02, cap=1.0)
        errors = Backoff()
        while not self.draining:
            room = self._lease_room()
            if room < self._lease_min:
                self._room.clear()
                await self._room.wait()
                continue
            t0 = time.monotonic()
            try:
                leases = await self.queue.lease(self.worker, min(room, self.s.lease_batch),
                                                self.s.lease_ms)
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                log.warning("redis_error", extra={"during": "lease", "error": str(exc)})
                await self._sleep_unless_stopped(errors)
                continue
            errors.reset()
            deadline = t0 + self.s.lease_s
            for lease in leases:
                old = self.held.get(lease.id)
                if old is not None:  # reclaimed, then leased to us again: `old` is dead
                    self._drop_work(old)
                self.held[lease.id] = lease
                self._deadline[lease.id] = deadline
            if leases:
                self._pending.extend(leases)
                self._wake_workers()
                idle.reset()
                continue
            if self.s.exit_when_empty and await self._crawl_finished():
                self.stop_reason = "crawl empty"
                self.draining = True
                return
            await self._sleep_unless_stopped(idle)
        if not self.stop_reason:
            self.stop_reason = "signal"

    def _lease_room(self) -> int:
        # Leases not yet finished keep every worker fed; finished ones waiting for their
        # flush don't count, or leasing would stall in waves. Held leases in all are
        # capped too, so a stuck flush can't make a consumer hoard work.
        unfinished = len(self._pending) + len(self._running) + len(self._waiting)
        return min(self._max_active - unfinished, self._max_held - len(self.held))

    def _wake_leaser(self) -> None:
        """Wake the leaser once a lease call's worth of room is free (not every page)."""
        if not self._room.is_set() and self._lease_room() >= self._lease_min:
            self._room.set()

    async def _sleep_unless_stopped(self, backoff: Backoff) -> None:
        with contextlib.suppress(TimeoutError):
            backoff.failures += 1
            delay = min(backoff.cap, backoff.base * 2 ** backoff.failures)
            await asyncio.wait_for(self._stop.wait(), timeout=random.uniform(delay / 2, delay))

    async def _crawl_finished(self) -> bool:
        if self.held or self._completions:
            return False
        if time.monotonic() - self.started < self.s.empty_grace_s:
            return False
        try:
            await self.queue.promote()
            stats = await self.queue.stats()
        except REDIS_ERRORS:
            return False
        return stats.active == 0

    # -- workers ----------------------------------------------------------------------

    async def _worker(self) -> None:
        """One fetch slot: take leases off the local queue one at a time and work each in
        place (no task per lease); return once draining and nothing is queued."""
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        pending, running, held, idle = self._pending, self._running, self.held, self._idle
        while True:
            if not pending:
                if self.draining:
                    return
                wake: asyncio.Future[None] = loop.create_future()
                idle.append(wake)
                await wake
                continue
            lease = pending.popleft()
            if held.get(lease.id) is not lease:
                continue  # lost at a heartbeat before it started
            entry = running[lease.id] = (me, lease)
            try:
                await self._work(lease)
            except asyncio.CancelledError:
                # Told to drop this lease (lost at a heartbeat): go on with the next one.
                # Any other cancellation stops the worker.
                if self._dropping.pop(me, None) is not lease or me.uncancel() > 0:
                    raise
            finally:
                if running.get(lease.id) is entry:
                    del running[lease.id]
                    self._started.discard(lease.id)
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

    def _wake_workers(self) -> None:
        """Wake one idle worker per queued lease (all of them when draining, to return)."""
        idle = self._idle
        n = len(idle) if self.draining else len(self._pending)
        while idle and n > 0:
            wake = idle.popleft()
            if not wake.done():  # a worker cancelled while idle leaves its future behind
                wake.set_result(None)
                n -= 1

    def _wait_outside(self, lease: Lease, waiter: asyncio.Handle | asyncio.Task[None]) -> None:
        """Park a lease outside the workers until `waiter` puts it back (`_requeue`)."""
        self._waiting[lease.id] = waiter

    def _requeue(self, lease: Lease) -> None:
        """A parked lease is ready again: first in the queue, it was leased before the rest."""
        self._waiting.pop(lease.id, None)
        if self.held.get(lease.id) is lease and not self.draining:
            self._pending.appendleft(lease)
            self._wake_workers()
        else:
            self._wake_leaser()

    async def _robots_lookup(self, lease: Lease) -> None:
        """Fetch (or read the fleet's copy of) a lease's robots.txt while no worker waits,
        then queue the lease again: its worker then finds the verdict cached."""
        assert self.robots is not None
        outage: Backoff | None = None
        try:
            while True:
                try:
                    await self.robots.check(lease.task.url)
                    break
                except RedisUnavailableError:
                    outage = outage or Backoff()
                    await outage.sleep()
        except Exception as exc:  # a FetchError such as ssrf_blocked is not cached
            self._waiting.pop(lease.id, None)
            if self.held.get(lease.id) is lease:
                if isinstance(exc, FetchError):
                    self._complete_error(lease, exc, None)
                else:
                    log.exception("task_crashed", extra={"id": lease.id})
                    self._complete(Completion(lease, "fail", failure=Failure(
                        lease, "internal_error", f"{type(exc).__name__}: {exc}")))
            self._wake_leaser()
            return
        self._requeue(lease)

    async def _work(self, lease: Lease) -> None:
        """Take a lease through robots.txt, politeness, the fetch and the handler to its
        completion, or park it outside the workers (robots.txt lookup, a short host wait)."""
        slot: Slot | None = None
        try:
            url = lease.task.url
            crawl_delay = None
            if self.robots is not None:
                try:
                    verdict = self.robots.cached(url)
                except FetchError as exc:  # a cached failure (robots_unavailable)
                    self._complete_error(lease, exc, None)
                    return
                if verdict is None:
                    self._wait_outside(lease, asyncio.create_task(self._robots_lookup(lease)))
                    return
                if not verdict.allowed:
                    self._complete(Completion(lease, "ack", "robots_disallowed",
                                              record=self._record(lease, None,
                                                                  "robots_disallowed")))
                    return
                crawl_delay = verdict.crawl_delay
            if self.politeness.enabled:
                try:
                    got = await self._acquirer.request(HostRequest(
                        host_key(url), self.politeness.delay_for(crawl_delay)))
                    self._acquire_errors = 0
                except REDIS_ERRORS:
                    self._acquire_errors += 1
                    delay = min(5.0, 0.1 * 2 ** self._acquire_errors)
                    self._wait_outside(lease, asyncio.get_running_loop().call_later(
                        random.uniform(delay / 2, delay), self._requeue, lease))
                    return
                if isinstance(got, int):  # the host has no room yet: ms to wait
                    if got > LOCAL_WAIT_MAX_MS or self.draining:
                        self.metrics.deferrals_total.inc()
                        self._complete(Completion(lease, "defer", "deferred", delay_ms=got))
                    else:
                        self._wait_outside(lease, asyncio.get_running_loop().call_later(
                            got / 1000, self._requeue, lease))
                    return
                slot = got
            if self._expired(lease):
                # e.g. the process was stopped: someone else may own it now.
                self._complete(Completion(lease, "drop", slot=slot))
                slot = None
                self._forget(lease, lost=True)
                return
            await self._fetch(lease, slot)
            slot = None
        except asyncio.CancelledError:
            if slot is not None:
                self._complete(Completion(lease, "drop", slot=slot))
            raise
        except Exception as exc:
            log.exception("task_crashed", extra={"id": lease.id})
            self._complete(Completion(lease, "fail", failure=Failure(
                lease, "internal_error", f"{type(exc).__name__}: {exc}"), slot=slot))

    def _expired(self, lease: Lease) -> bool:
        """Whether this lease may have expired in Redis by now (local clock, with margin)."""
        return time.monotonic() > self._deadline.get(lease.id, 0) - self._margin_s

    async def _fetch(self, lease: Lease, slot: Slot | None) -> None:
        self._started.add(lease.id)
        self._fetching.add(lease.id)
        started = time.monotonic()
        try:
            result = await self.fetcher.fetch(lease.task.url)
        except FetchError as exc:
            self.metrics.response(exc.status)
            self._complete_error(lease, exc, slot)
            return
        finally:
            self.metrics.fetch_duration_seconds.observe(time.monotonic() - started)
            self._fetching.discard(lease.id)
        self.metrics.response(result.status, len(result.body))
        outcome = "ok" if result.status < 400 else "http_4xx"
        record = self._record(lease, result, outcome)
        urls: Sequence[str] = ()
        if self.handler is not None:
            try:
                handled = as_result(await self.handler(result, self._context(lease)))
            except LeaseLostError:
                self._complete(Completion(lease, "drop", slot=slot))
                return
            except Exception as exc:
                self.metrics.error("handler_error")
                self._complete(Completion(lease, "fail", failure=Failure(
                    lease, "handler_error", f"{type(exc).__name__}: {exc}"[:500]), slot=slot))
                return
            record.items = handled.items
            urls = handled.urls
        self._complete(Completion(lease, "ack", outcome, record=record, urls=urls, slot=slot))

    def _context(self, lease: Lease) -> HandlerContext:
        async def save(value: Any) -> bool:
            return await self.queue.checkpoint(self.worker, lease, value) == Code.OK
        return HandlerContext(task=lease.task, worker=self.worker, _save=save)

    def _complete_error(self, lease: Lease, exc: FetchError, slot: Slot | None) -> None:
        self.metrics.error(exc.reason)
        cooldown = 0
        if exc.status in (429, 503):
            cooldown = (DEFAULT_COOLDOWN_MS if exc.retry_after is None
                        else min(MAX_COOLDOWN_MS, max(1000, int(exc.retry_after * 1000))))
        self._complete(Completion(lease, "fail", failure=Failure(
            lease, exc.reason, exc.message[:500], retry_after=exc.retry_after,
            permanent=not exc.retryable), slot=slot, cooldown_ms=cooldown))

    def _record(self, lease: Lease, result: FetchResult | None, outcome: str) -> Record:
        task = lease.task
        if result is None:
            return Record(task_id=task.id, url=task.url, final_url=task.url, status=None,
                          outcome=outcome, headers={}, raw_headers=(), body=None, bytes=0,
                          elapsed=0.0, attempt=task.attempt, fetched_at=time.time(),
                          worker=self.worker, depth=task.depth, meta=task.meta)
        return Record(task_id=task.id, url=task.url, final_url=result.final_url,
                      status=result.status, outcome=outcome, headers=result.headers,
                      raw_headers=result.raw_headers, body=result.body,
                      bytes=len(result.body), elapsed=result.elapsed, attempt=task.attempt,
                      fetched_at=time.time(), worker=self.worker,
                      http_version=result.http_version, depth=task.depth, meta=task.meta)

    def _complete(self, completion: Completion) -> None:
        self._completions.append(completion)
        if len(self._completions) >= self._flush_at or len(self._completions) == 1:
            self._completed.set()

    # -- flushing ---------------------------------------------------------------------

    async def _flusher(self) -> None:
        """Flush as soon as a good batch is ready, else at most FLUSH_INTERVAL_S late."""
        while not self._closing:
            await self._completed.wait()
            deadline = time.monotonic() + FLUSH_INTERVAL_S
            while len(self._completions) < self._flush_at:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._completed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._completed.wait(), left)
            self._completed.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write completed results, then ack/fail/defer them (retrying through outages)."""
        while self._completions:
            batch = self._completions[:1000]
            del self._completions[:1000]
            await self._flush_batch(batch)

    async def _flush_batch(self, batch: list[Completion]) -> None:
        live: list[Completion] = []
        records: list[Record] = []
        acks: list[tuple[Lease, str]] = []
        fails: list[Failure] = []
        defers: list[tuple[Lease, int]] = []
        slots: list[tuple[Slot, int]] = []
        held = self.held
        for c in batch:
            if c.slot is not None:
                slots.append((c.slot, c.cooldown_ms))
            lease = c.lease
            if c.kind == "drop" or held.get(lease.id) is not lease:
                continue  # dropped, or lost at a heartbeat: its result is dropped
            if self._expired(lease):
                self._forget(lease, lost=True)  # expired (e.g. the process was stopped)
                continue
            live.append(c)
            if c.kind == "ack":
                acks.append((lease, c.outcome))
                if c.record is not None:
                    records.append(c.record)
            elif c.kind == "fail" and c.failure is not None:
                fails.append(c.failure)
            elif c.kind == "defer":
                defers.append((lease, c.delay_ms))
        children = self._children(live)
        if records:
            await self._retry("sink", lambda: self.sink.write(records))
        if children:
            await self._retry("enqueue", lambda: self.queue.enqueue(children))
        if acks:
            codes = await self._retry("ack", lambda: self.queue.ack(self.worker, acks))
            self._account(acks, codes, lambda a: a[0], lambda a: a[1])
        if fails:
            results = await self._retry("fail", lambda: self.queue.fail(self.worker, fails))
            self._account(fails, [c for c, _ in results], lambda f: f.lease, lambda f: "")
        if defers:
            codes = await self._retry("defer", lambda: self.queue.defer(self.worker, defers))
            self._account(defers, codes, lambda d: d[0], lambda d: "deferred")
        if slots:
            await self._retry("release_host", lambda: self.politeness.release(slots))
        self.metrics.publish()

    def _account(self, items: Sequence[Any], codes: Sequence[Code],
                 lease_of: Callable[[Any], Lease], outcome_of: Callable[[Any], str]) -> None:
        counts: dict[str, int] = {}
        lost = 0
        for item, code in zip(items, codes, strict=True):
            lease = lease_of(item)
            self._unhold(lease)
            if code in _LOST:
                lost += 1
                outcome = "stale"
            elif code == Code.RETRY:
                self.failed += 1
                outcome = "retried"
            elif code == Code.DEAD:
                self.failed += 1
                outcome = "dead"
                log.debug("task_dead", extra={"id": lease.id})
            else:
                outcome = outcome_of(item)
                if outcome != "deferred":
                    self.done += 1
            counts[outcome] = counts.get(outcome, 0) + 1
        for outcome, n in counts.items():  # one metric update per outcome, not per task
            self.metrics.task(outcome, n)
        if lost:
            self.metrics.leases_lost_total.inc(lost)
        self._wake_leaser()

    def _forget(self, lease: Lease, *, lost: bool) -> None:
        if self._unhold(lease):
            self._wake_leaser()
        if lost:
            self.metrics.leases_lost_total.inc()

    def _unhold(self, lease: Lease) -> bool:
        """Stop holding `lease` (not a newer lease of the same task); whether it was held."""
        if self.held.get(lease.id) is not lease:
            return False
        del self.held[lease.id]
        self._deadline.pop(lease.id, None)
        return True

    def _children(self, live: Sequence[Completion]) -> list[NewTask]:
        """Discovered URLs, canonical, within --max-depth and --allow-domains."""
        out: list[NewTask] = []
        for c in live:
            if not c.urls or c.lease.task.depth + 1 > self.s.max_depth:
                continue
            task = c.lease.task
            parent_host = URL(task.url, encoded=True).raw_host or ""
            for raw in c.urls:
                url = canonicalize(raw)
                if not isinstance(url, str):
                    continue
                host = URL(url, encoded=True).raw_host or ""
                if not self._allowed(host, parent_host):
                    continue
                out.append(NewTask(url, fingerprint(url), max_attempts=task.max_attempts,
                                   meta=task.meta, depth=task.depth + 1))
        return out

    def _allowed(self, host: str, parent_host: str) -> bool:
        domains = self.s.allow_domains or (parent_host,)
        return any(host == d or host.endswith("." + d) for d in domains)

    async def _retry(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run a flush step until it succeeds: results are never dropped for an outage."""
        backoff = Backoff()
        while True:
            try:
                return await call()
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                log.warning("flush_retry", extra={"step": what, "error": str(exc)[:200]})
                await backoff.sleep()

    # -- heartbeat and reaping -------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = self.s.lease_s / 3
        last_log, last_done = time.monotonic(), 0
        while not self._closing:
            with contextlib.suppress(*REDIS_ERRORS):
                await self.registry.beat(in_flight=len(self._fetching), done=self.done,
                                         failed=self.failed,
                                         state="draining" if self.draining else "running")
            await asyncio.sleep(interval)
            await self.renew()
            now = time.monotonic()
            if now - last_log >= PROGRESS_EVERY_S:
                log.info("progress", extra={
                    "done": self.done, "failed": self.failed, "held": len(self.held),
                    "in_flight": len(self._fetching),
                    "per_s": round((self.done - last_done) / (now - last_log), 1)})
                last_log, last_done = now, self.done

    async def renew(self) -> None:
        """Renew every held lease; cancel the work of the ones lost."""
        leases = list(self.held.values())
        t0 = time.monotonic()
        try:
            lost = await self.queue.renew(self.worker, leases, self.s.lease_ms)
        except REDIS_ERRORS as exc:
            self.metrics.redis_errors_total.inc()
            log.warning("redis_error", extra={"during": "renew", "error": str(exc)[:200]})
            return
        lost_ids = {lease.id for lease, _ in lost}
        for lease in leases:
            if lease.id not in lost_ids and self.held.get(lease.id) is lease:
                self._deadline[lease.id] = t0 + self.s.lease_s
        self.metrics.leases_renewed_total.inc(len(leases) - len(lost))
        if lost:
            log.warning("leases_lost", extra={"n": len(lost)})
        for lease, code in lost:
            if self.held.get(lease.id) is not lease:
                continue  # finished meanwhile, or leased again: the newer lease is alive
            log.debug("lease_lost", extra={"id": lease.id, "code": code.name})
            self._drop_work(lease)
            self._forget(lease, lost=True)

    async def _reaper(self) -> None:
        interval = max(0.2, min(2.0, self.s.lease_s / 4))
        while not self._closing:
            try:
                reaped = await self.queue.reap(int(interval * 1000))
                if reaped is not None:
                    reclaimed, died, _ = reaped
                    self.metrics.reclaimed_total.inc(reclaimed)
                    if reclaimed or died:
                        log.info("leases_reclaimed", extra={"reclaimed": reclaimed,
                                                            "dead": died})
                    await self._snapshot()
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                log.warning("redis_error", extra={"during": "reap", "error": str(exc)[:200]})
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))

    async def _snapshot(self) -> None:
        """Append the crawl's counters to its history (for rates), every few seconds."""
        now = time.time()
        if now - self._last_history < history.HISTORY_EVERY_S:
            return
        self._last_history = now
        stats = await self.queue.stats()
        # Running counters only (rates are their differences); the state counts share
        # some names (leased, dead) and are read live by `crawlq stats` anyway.
        await history.record(self.queue.client, self.queue.crawl, stats.counters)

    # -- draining -----------------------------------------------------------------------

    async def _drain(self) -> None:
        """Release what hasn't started, let fetches finish within --grace, release the rest.

        A second signal (``request_stop`` again) ends the grace at once.
        """
        self.draining = True
        log.info("consumer_draining", extra={"held": len(self.held),
                                             "in_flight": len(self._fetching)})
        self._pending.clear()  # never started: released below
        parked = list(self._waiting.values())
        self._waiting.clear()
        for waiter in parked:
            waiter.cancel()
        await self._cancel([w for w in parked if isinstance(w, asyncio.Task)])
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
        await self._release_unfinished()
        await self.sink.close()

    async def _cancel(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        tasks = [t for t in tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_S)

    async def _release_unfinished(self) -> None:
        """Release every held lease whose task no longer runs and has no result to flush."""
        finishing = {c.lease.id for c in self._completions if c.kind != "drop"}
        leases = [lease for tid, lease in self.held.items()
                  if tid not in self._running and tid not in finishing]
        if not leases:
            return
        try:
            codes = await asyncio.wait_for(self.queue.release(self.worker, leases), 10)
        except (TimeoutError, *REDIS_ERRORS) as exc:
            log.warning("release_failed", extra={"n": len(leases), "error": str(exc)[:200]})
            return
        for lease, code in zip(leases, codes, strict=True):
            self._forget(lease, lost=code != Code.OK)
            if code == Code.OK:
                self.metrics.task("released")
