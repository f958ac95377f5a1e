"""The consumer's flush path: results to the sink, discovered links to the queue, then
ack / fail / release in batches — acks only after the sink has the result.

Queue calls are retried through a Redis outage, each with its operation id kept across
its retries: an ack or fail that ran, its reply lost, answers the codes it gave then
(common/redis/resend.py, lib/once.lua). A sink write that fails is not an outage: its tasks
are released instead of acked, and `SinkHealth` takes over (see
``consumer.write_health``): while the sink fails, batches wait for its next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import RedisUnavailableError
from common.observability.metrics import Metrics
from common.queue import Code, CrawlQueue, Failure, Lease, NewTask
from common.queue.calls import new_op_id
from common.redis.errors import REDIS_ERRORS
from common.redis.resend import may_run_again
from consumer.backoff import Backoff
from consumer.completion import Completion, CompletionKind
from consumer.held import LeaseBook
from consumer.intake import LinkIntake
from consumer.judgement import Judge
from consumer.sessions import FlushHooks
from consumer.sinks import ProbingSink, Record, Sink
from consumer.write_health import SinkHealth

log = logging.getLogger("consumer")

FLUSH_INTERVAL_S = 0.02
#: How often the links not followed are added to the crawl's stats (and at the end).
LINK_COUNTS_EVERY_S = 1.0
#: How often pages held for a probe's answer are judged again.
HELD_POLL_S = 0.05
_LOST = frozenset({Code.STALE, Code.EXPIRED, Code.UNKNOWN})  # the lease was not ours anymore
DEFAULT_SINK_RETRY_FOR_S = 60.0
#: The scripts each flush step calls: a step that failed is run again only when they may
#: all run twice (common/redis/resend.py), or when it did not run.
STEPS: dict[str, tuple[str, ...]] = {
    "judgement": ("judgement", "fingerprints"), "traps": ("traps",),
    "enqueue": ("enqueue", "enqueue_bloom"), "ack": ("ack",), "fail": ("fail",),
    "release": ("release",),
    "proxies_sessions": ("proxy_report", "proxy_bans", "session_update"),
}


def sink_outage(exc: BaseException) -> bool:
    """Whether a sink write failed because Redis can't be reached (the redis-stream sink,
    ``consumer.sinks.stream``): that is the queue's outage too, retried like its calls.
    Anything else the sink raises (a full or read-only volume, Redis refusing the
    stream: out of memory, ACL, wrong type) is a sink failure."""
    return isinstance(exc, RedisUnavailableError) and isinstance(
        exc.__cause__, RedisConnectionError | RedisTimeoutError)


def describe_error(exc: BaseException | None) -> str:
    """`exc` in one short line, for logs and /readyz."""
    if exc is None:
        return ""
    return f"{type(exc).__name__}: {exc}"[:300]


async def probe_sink(sink: Sink, health: SinkHealth, metrics: Metrics) -> None:
    """Try a failing sink without results to write: its probe() (file sinks), else (no
    probe) let the consumer lease again and try with the next batch."""
    if not isinstance(sink, ProbingSink):
        health.trial()
        return
    try:
        await sink.probe()
    except Exception as exc:
        metrics.sink_errors_total.inc()
        log.warning("sink_probe_failed", extra={"error": describe_error(exc)})
        health.failed(exc)
        return
    log.info("sink_probe_passed", extra={"failures": health.failures})
    health.trial()


class FlushAbandoned(Exception):
    """A flush step could not reach Redis by the flusher's `give_up_at` (a consumer
    stopping): its leases are left to expire, and their tasks to be leased again."""


class Flusher:
    """Collects completions and flushes them in batches."""

    def __init__(self, queue: CrawlQueue, sink: Sink, metrics: Metrics, book: LeaseBook,
                 *, worker: str, batch: int, intake: LinkIntake,
                 on_freed: Callable[[bool], None],
                 turn_soon: Callable[[Sequence[Lease]], bool] = lambda leases: True,
                 urgent: Callable[[], bool] = lambda: False,
                 notify: Callable[[], Awaitable[None]] | None = None,
                 health: SinkHealth | None = None, judge: Judge | None = None,
                 hooks: FlushHooks | None = None) -> None:
        self.queue = queue
        self.sink = sink
        self.metrics = metrics
        self.book = book
        self.worker = worker
        self.intake = intake
        self.judge = judge  # None: no page is judged (no fleet-wide trap state)
        self._on_freed = on_freed
        self._turn_soon = turn_soon
        self._urgent = urgent
        self._links_waiting = False
        self._pushed_back = False  # a push-back waits: its host's block is flushed at once
        self._notify = notify
        self._flush_at = batch
        self.health = health if health is not None else SinkHealth(DEFAULT_SINK_RETRY_FOR_S)
        #: The proxy pool's and the sessions': written before a batch's links and acks.
        self._hooks = hooks or FlushHooks()
        self.completions: list[Completion] = []
        self._held: list[Completion] = []  # pages whose judgement waits for a probe
        self._in_flush: set[str] = set()  # ids of the batches being flushed
        self._quiet = asyncio.Event()  # no batch is being flushed
        self._quiet.set()
        self._completed = asyncio.Event()
        self.done = 0
        self.failed = 0
        #: Monotonic time after which a flush step that can't reach Redis is abandoned
        #: (FlushAbandoned): None while running, set when the consumer stops.
        self.give_up_at: float | None = None
        #: The first flush abandoned for it, if one was.
        self.abandoned: FlushAbandoned | None = None

    def add(self, completion: Completion) -> None:
        """Queue a completion; wakes the flusher for the first one, a full batch, a
        push-back, or discovered links while the consumer is urgent."""
        self.completions.append(completion)
        if completion.urls:
            self._links_waiting = True
        if completion.failure is not None and completion.failure.pushback:
            self._pushed_back = True
        if len(self.completions) >= self._flush_at or len(self.completions) == 1 \
                or self._flush_now():
            self._completed.set()

    def poke(self) -> None:
        """The consumer's state changed (its leaser went idle): flush now if that made
        waiting links urgent."""
        if self.completions and self._flush_now():
            self._completed.set()

    def _flush_now(self) -> bool:
        """A push-back waits (each ms before its fail reaches Redis, the fleet may send
        its host another request), or discovered links wait while the consumer has
        nothing to fetch: they are its next work (a host's slot comes back without the
        ack: lease_turns)."""
        return self._pushed_back or (self._links_waiting and self._urgent())

    def finishing(self) -> set[str]:
        """Ids whose results wait to be flushed or are being flushed (they are not to be
        released)."""
        return {c.lease.id for c in [*self.completions, *self._held]
                if c.kind is not CompletionKind.DROP} | self._in_flush

    async def run(self, closing: Callable[[], bool]) -> None:
        """Flush as soon as a good batch is ready, else at most FLUSH_INTERVAL_S late; at
        once when discovered links wait and the consumer is `urgent` (its fetch slots
        idle for want of work: batching would only leave them idle). Completions that
        arrive during a flush make the next batch. While the sink fails, flush only at
        its next try (the results that came meanwhile are that try), or probe it when
        none came. Ends when a flush is abandoned (the consumer stopping: it reports it)."""
        with contextlib.suppress(FlushAbandoned):
            await self._run(closing)

    async def _run(self, closing: Callable[[], bool]) -> None:
        while not closing():
            if self.health.failing:
                await asyncio.sleep(max(0.0, self.health.next_try - time.monotonic()))
                if not self.health.failing:
                    continue
                if not self.completions:
                    await probe_sink(self.sink, self.health, self.metrics)
                    continue
                self._completed.clear()
                await self.flush()
                continue
            with contextlib.suppress(TimeoutError):  # held pages are judged again soon
                await asyncio.wait_for(self._completed.wait(), HELD_POLL_S if self._held
                                       else None)
            deadline = time.monotonic() + FLUSH_INTERVAL_S
            while len(self.completions) < self._flush_at and not self._flush_now():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._completed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._completed.wait(), left)
            self._completed.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write completed results, then ack/fail/release them (retrying through outages)."""
        self.completions[:0], self._held = self._held, []
        while self.completions:
            batch = self.completions[:1000]
            del self.completions[:1000]
            self._links_waiting = any(c.urls for c in self.completions)
            self._pushed_back = any(c.failure is not None and c.failure.pushback
                                    for c in self.completions)
            ids = {c.lease.id for c in batch}
            self._in_flush |= ids
            self._quiet.clear()
            try:
                await self._flush_batch(batch)
            finally:
                self._in_flush -= ids
                if not self._in_flush:
                    self._quiet.set()

    async def settle(self) -> None:
        """Wait for batches another caller is flushing (shutdown: under a timeout)."""
        await self._quiet.wait()

    async def _flush_batch(self, batch: list[Completion]) -> None:
        live: list[Completion] = []
        records: list[Record] = []
        acks: list[tuple[Lease, str]] = []
        fails: list[Failure] = []
        releases: list[Lease] = []
        recorded: list[Lease] = []  # the lease of each record
        book = self.book
        for c in batch:
            lease = c.lease
            if c.kind is CompletionKind.DROP or not book.holds(lease):
                continue  # dropped, or lost at a heartbeat: its result is dropped
            if book.expired(lease):
                book.drop(lease, lost=True)  # expired (e.g. the process was stopped)
                self._on_freed(False)
                continue
            live.append(c)
        probes, held = await self._judge(live)
        if held:
            self._held += held
            live = [c for c in live if all(c is not h for h in held)]
        for c in live:
            lease = c.lease
            if c.kind is CompletionKind.ACK:
                acks.append((lease, c.outcome))
                if c.record is not None:
                    records.append(c.record)
                    recorded.append(lease)
            elif c.kind is CompletionKind.FAIL and c.failure is not None:
                fails.append(c.failure)
            elif c.kind is CompletionKind.RELEASE:
                releases.append(lease)
        unwritten: set[str] = set()
        if records and not await self._write(records):
            # Never ack what the sink does not have: these tasks go back to their hosts'
            # queues (fetched again, by whoever leases them next), links not sent.
            unwritten = {lease.id for lease in recorded}
            acks = [a for a in acks if a[0].id not in unwritten]
            codes = await self._retry("release", lambda: self.queue.release(
                self.worker, recorded, restart_turn=True))
            self._account(recorded, codes, ["released"] * len(recorded))
        await self._retry("proxies_sessions", self._hooks.write)
        found = ((c.lease.task if c.child_meta is None else replace(c.lease.task,
                                                                    meta=c.child_meta),
                  c.urls) for c in live if c.urls and c.lease.id not in unwritten)
        children, seen = self.intake.children(self._hooks.carry(found))
        for c in live:
            if c.cut and c.lease.id not in unwritten:
                self.intake.judged(c.outcome, c.cut)
        children = self._hooks.stamp(children)
        children = await self._retry("traps", lambda: self.intake.admit(children))
        children += probes
        if children:
            await self._retry("enqueue", lambda: self.queue.enqueue(children))
        self.intake.sent(seen)
        ack_op, fail_op = new_op_id(), new_op_id()  # the same through a step's retries
        if acks:
            codes = await self._retry("ack", lambda: self.queue.ack(self.worker, acks,
                                                                    op=ack_op))
            self._account([a[0] for a in acks], codes, [a[1] for a in acks])
        if fails:
            results = await self._retry("fail", lambda: self.queue.fail(self.worker, fails,
                                                                        op=fail_op))
            self._account([f.lease for f in fails], [c for c, _ in results],
                          [""] * len(fails))
        if releases:
            # A release here is a robots.txt fetch made under the task's lease, which took
            # a turn of its own (late_turn.lua): the host's next turn counts from it.
            codes = await self._retry("release", lambda: self.queue.release(
                self.worker, releases))
            self._account(releases, codes, ["released"] * len(releases))
        self.metrics.publish()
        self.intake.publish()
        if time.monotonic() >= self.intake.saved_at + LINK_COUNTS_EVERY_S:
            await self.save_link_counts()
        # Leases that ended free their hosts' slots; a host with a delay takes its next
        # request only at its next turn (a lease call's reply says when), so only a turn
        # that comes soon wakes this consumer's leaser or the fleet's idle ones.
        soon = self._turn_soon([a[0] for a in acks] + [f.lease for f in fails])
        if soon:
            self._on_freed(True)
        if self._notify is not None and (children or soon):
            await self._notify()  # slots freed, links queued: idle peers may lease now

    async def _judge(self, live: list[Completion]) -> tuple[list[NewTask], list[Completion]]:
        """The batch's pages judged (``consumer.judgement``): the probes to enqueue, the
        pages held for a probe (none while stopping). A retry keeps its operation id."""
        if self.judge is None:
            return [], []
        judge, holding, op = self.judge, self.give_up_at is None, new_op_id()
        verdict = await self._retry("judgement", lambda: judge.judge(
            live, self.intake.tally, holding=holding, op=op))
        return verdict.probes, verdict.held

    async def save_link_counts(self) -> None:
        """The links not followed, to the crawl's stats (`LinkIntake.save_counts`)."""
        await self.intake.save_counts(self.queue.client, self.queue.partitions[0].stats)

    def _account(self, leases: Sequence[Lease], codes: Sequence[Code],
                 outcomes: Sequence[str]) -> None:
        counts: dict[str, int] = {}
        lost = 0
        for lease, code, asked in zip(leases, codes, outcomes, strict=True):
            self.book.drop(lease)
            outcome = asked
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
            elif outcome != "released":
                self.done += 1
            counts[outcome] = counts.get(outcome, 0) + 1
        for outcome, n in counts.items():  # one metric update per outcome, not per task
            self.metrics.task(outcome, n)
        if lost:
            self.metrics.leases_lost_total.inc(lost)
        self._on_freed(False)  # room for more leases; whether a turn comes: the caller

    async def _write(self, records: list[Record]) -> bool:
        """Write `records` to the sink; False when the sink refused them (reported to
        `health`). A redis-stream sink that can't reach Redis is retried as an outage."""
        outage = Backoff()
        while True:
            try:
                await self.sink.write(records)
            except Exception as exc:
                if sink_outage(exc):
                    self.metrics.redis_errors_total.inc()
                    self._give_up_if_due("sink", exc)
                    log.warning("flush_retry", extra={"step": "sink", "error": str(exc)[:200]})
                    await outage.sleep()
                    continue
                self.metrics.sink_errors_total.inc()
                log.warning("sink_write_failed", extra={"records": len(records),
                                                        "error": describe_error(exc)})
                self.health.failed(exc)
                return False
            self.health.written()
            return True

    def _give_up_if_due(self, what: str, exc: Exception) -> None:
        if self.give_up_at is not None and time.monotonic() >= self.give_up_at:
            self.abandoned = FlushAbandoned(f"{what}: {str(exc)[:200]}")
            raise self.abandoned from exc

    async def _retry(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run flush step `what` until it succeeds: results are never dropped for an
        outage while the consumer runs; one stopping gives up at `give_up_at`. A step
        whose call may have run is run again only if its `STEPS` may run twice."""
        backoff = Backoff()
        while True:
            try:
                return await call()
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                if not may_run_again(exc, STEPS[what]):
                    raise
                self._give_up_if_due(what, exc)
                log.warning("flush_retry", extra={"step": what, "error": str(exc)[:200]})
                await backoff.sleep()
