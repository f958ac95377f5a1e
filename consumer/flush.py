"""The consumer's flush path: results to the sink, discovered links to the queue, then
ack / fail / release in batches — acks only after the sink has the result."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from yarl import URL

from common.metrics import Metrics
from common.queue import Code, CrawlQueue, Failure, Lease, NewTask
from common.urls import canonicalize, fingerprint
from consumer.backoff import Backoff
from consumer.leases import LeaseBook
from consumer.sinks import Record, Sink

log = logging.getLogger("consumer")

FLUSH_INTERVAL_S = 0.02
REDIS_ERRORS = (RedisError, OSError)
_LOST = frozenset({Code.STALE, Code.EXPIRED, Code.UNKNOWN})  # the lease was not ours anymore


@dataclass(slots=True)
class Completion:
    """What became of one leased task, waiting for the flusher.

    ``kind``: "ack" (done, with an outcome and maybe a record), "fail", "release" (back
    to its host's queue, no attempt counted) or "drop" (lost: nothing to send).
    """

    lease: Lease
    kind: str
    outcome: str = "ok"
    record: Record | None = None
    failure: Failure | None = None
    urls: Sequence[str] = ()


class Flusher:
    """Collects completions and flushes them in batches."""

    def __init__(self, queue: CrawlQueue, sink: Sink, metrics: Metrics, book: LeaseBook,
                 *, worker: str, batch: int, max_depth: int,
                 allow_domains: Sequence[str], on_freed: Callable[[], None]) -> None:
        self.queue = queue
        self.sink = sink
        self.metrics = metrics
        self.book = book
        self.worker = worker
        self.max_depth = max_depth
        self.allow_domains = tuple(allow_domains)
        self._on_freed = on_freed
        self._flush_at = batch
        self.completions: list[Completion] = []
        self._completed = asyncio.Event()
        self.done = 0
        self.failed = 0

    def add(self, completion: Completion) -> None:
        """Queue a completion; wakes the flusher for the first one and for a full batch."""
        self.completions.append(completion)
        if len(self.completions) >= self._flush_at or len(self.completions) == 1:
            self._completed.set()

    def finishing(self) -> set[str]:
        """Ids whose results wait to be flushed (they are not to be released)."""
        return {c.lease.id for c in self.completions if c.kind != "drop"}

    async def run(self, closing: Callable[[], bool]) -> None:
        """Flush as soon as a good batch is ready, else at most FLUSH_INTERVAL_S late."""
        while not closing():
            await self._completed.wait()
            deadline = time.monotonic() + FLUSH_INTERVAL_S
            while len(self.completions) < self._flush_at:
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
        while self.completions:
            batch = self.completions[:1000]
            del self.completions[:1000]
            await self._flush_batch(batch)

    async def _flush_batch(self, batch: list[Completion]) -> None:
        live: list[Completion] = []
        records: list[Record] = []
        acks: list[tuple[Lease, str]] = []
        fails: list[Failure] = []
        releases: list[Lease] = []
        book = self.book
        for c in batch:
            lease = c.lease
            if c.kind == "drop" or not book.holds(lease):
                continue  # dropped, or lost at a heartbeat: its result is dropped
            if book.expired(lease):
                book.drop(lease, lost=True)  # expired (e.g. the process was stopped)
                self._on_freed()
                continue
            live.append(c)
            if c.kind == "ack":
                acks.append((lease, c.outcome))
                if c.record is not None:
                    records.append(c.record)
            elif c.kind == "fail" and c.failure is not None:
                fails.append(c.failure)
            elif c.kind == "release":
                releases.append(lease)
        children = self._children(live)
        if records:
            await self._retry("sink", lambda: self.sink.write(records))
        if children:
            await self._retry("enqueue", lambda: self.queue.enqueue(children))
        if acks:
            codes = await self._retry("ack", lambda: self.queue.ack(self.worker, acks))
            self._account([a[0] for a in acks], codes, [a[1] for a in acks])
        if fails:
            results = await self._retry("fail", lambda: self.queue.fail(self.worker, fails))
            self._account([f.lease for f in fails], [c for c, _ in results],
                          [""] * len(fails))
        if releases:
            # A release here is a robots.txt fetch that took the task's turn: the host's
            # next turn counts from now, after that request.
            codes = await self._retry("release", lambda: self.queue.release(
                self.worker, releases, restart_turn=True))
            self._account(releases, codes, ["released"] * len(releases))
        self.metrics.publish()

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
        self._on_freed()

    def _children(self, live: Sequence[Completion]) -> list[NewTask]:
        """Discovered URLs, canonical, within --max-depth and --allow-domains."""
        out: list[NewTask] = []
        for c in live:
            if not c.urls or c.lease.task.depth + 1 > self.max_depth:
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
        domains = self.allow_domains or (parent_host,)
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
