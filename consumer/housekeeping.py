"""The consumer's housekeeping loops: the heartbeat (renew held leases, refresh the worker
registry, read the crawl's policy again, log progress) and the reaper (reclaim expired
leases, promote due retries, record the crawl's history, read its revisit figures)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from common.fleet import history
from common.fleet.workers import WorkerRegistry
from common.observability.metrics import Metrics
from common.queue import CrawlQueue, Lease
from common.redis.errors import REDIS_ERRORS
from common.redis.resend import may_run_again
from consumer.held import LeaseBook

log = logging.getLogger("consumer")

PROGRESS_EVERY_S = 30.0
#: What each loop runs again, at its next round, after a Redis error (common/redis/resend.py:
#: each may run twice).
HEARTBEAT_SCRIPTS = ("renew", "worker_beat")
REAPER_SCRIPTS = ("reclaim", "promote", "revisit", "history_get", "history_push")


class Housekeeping:
    """Heartbeat and reaper of one consumer."""

    def __init__(self, queue: CrawlQueue, book: LeaseBook, metrics: Metrics,
                 registry: WorkerRegistry, *, worker: str, lease_s: float,
                 status: Callable[[], dict[str, int | str]],
                 on_lost: Callable[[Lease], None],
                 settling: Callable[[], set[str]] = set,
                 on_beat: Callable[[], Awaitable[None]] | None = None) -> None:
        self.queue = queue
        self.book = book
        self.metrics = metrics
        self.registry = registry
        self.worker = worker
        self.lease_s = lease_s
        self._status = status
        self._on_lost = on_lost
        #: Ids whose results the flusher holds or is sending: their ack or fail settles
        #: them, and says itself if they were lost.
        self._settling = settling
        #: Run after each renewal (the consumer re-reads the crawl's policy: a fallback
        #: for a lost policy message).
        self.on_beat = on_beat
        self._last_history = 0.0
        self._last_figures = 0.0

    async def heartbeat(self, closing: Callable[[], bool]) -> None:
        """Renew every lease_s / 3; beat the registry; log progress now and then."""
        interval = self.lease_s / 3
        last_log, last_done = time.monotonic(), 0
        while not closing():
            status = self._status()
            with contextlib.suppress(*REDIS_ERRORS):
                await self.beat(status)
            if self._stopped(closing):
                return
            await asyncio.sleep(interval)
            if self._stopped(closing):
                return
            await self.renew()
            if self.on_beat is not None:
                await self.on_beat()
            now = time.monotonic()
            if now - last_log >= PROGRESS_EVERY_S:
                done = int(status["done"])
                log.info("progress", extra={
                    "done": done, "failed": status["failed"], "held": len(self.book),
                    "in_flight": status["in_flight"],
                    "per_s": round((done - last_done) / (now - last_log), 1)})
                last_log, last_done = now, done

    async def beat(self, status: dict[str, int | str] | None = None) -> None:
        """This worker's entry in the registry, written (raises a Redis error)."""
        status = status or self._status()
        await self.registry.beat(
            in_flight=int(status["in_flight"]), done=int(status["done"]),
            failed=int(status["failed"]), state=str(status["state"]))

    @staticmethod
    def _stopped(closing: Callable[[], bool]) -> bool:
        """The consumer is closing, or a cancel reached this task and redis-py turned it
        into a connection error (or Python 3.11's wait_for dropped it): stop now, since
        the client may be closed and a command would open a connection nobody closes."""
        me = asyncio.current_task()
        return closing() or (me is not None and me.cancelling() > 0)

    async def renew(self) -> None:
        """Renew every held lease; hand the ones lost to `on_lost`."""
        leases = list(self.book.held.values())
        t0 = time.monotonic()
        try:
            lost = await self.queue.renew(self.worker, leases, int(self.book.lease_s * 1000))
        except REDIS_ERRORS as exc:
            self.metrics.redis_errors_total.inc()
            if not may_run_again(exc, HEARTBEAT_SCRIPTS):
                raise
            log.warning("redis_error", extra={"during": "renew", "error": str(exc)[:200]})
            return
        lost_ids = {lease.id for lease, _ in lost}
        for lease in leases:
            if lease.id not in lost_ids:
                self.book.renewed(lease, t0)
        self.metrics.leases_renewed_total.inc(len(leases) - len(lost))
        # A lease acked while the renewal was on its way is not ours to renew any more, and
        # not lost either: only the ones still held count, and of those not the ones whose
        # ack may be in Redis already, its reply still on its way (the flusher's).
        settling = self._settling()
        really = [(lease, code) for lease, code in lost
                  if self.book.holds(lease) and lease.id not in settling]
        if really:
            log.warning("leases_lost", extra={"n": len(really)})
        for lease, code in really:
            log.debug("lease_lost", extra={"id": lease.id, "code": code.name})
            self._on_lost(lease)

    async def reaper(self, closing: Callable[[], bool]) -> None:
        """Reclaim and promote (one consumer of the fleet per interval), and snapshot."""
        # At most every half second across the fleet: a due revisit (or retry) waits for
        # the next reap to go back to its host's queue, and a revisit's lateness is
        # meant to stay under a second (issue 26). A reap that finds nothing due costs a
        # few commands a partition.
        interval = max(0.2, min(0.5, self.lease_s / 4))
        while not closing():
            try:
                reaped = await self.queue.reap(int(interval * 1000))
                if reaped is not None:
                    reclaimed, died, _ = reaped
                    self.metrics.reclaimed_total.inc(reclaimed)
                    if reclaimed or died:
                        log.info("leases_reclaimed", extra={"reclaimed": reclaimed,
                                                            "dead": died})
                await self._snapshot(reaped is not None)
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                if not may_run_again(exc, REAPER_SCRIPTS):
                    raise
                log.warning("redis_error", extra={"during": "reap", "error": str(exc)[:200]})
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))

    async def _snapshot(self, reaper: bool) -> None:
        """Every few seconds: read the crawl's revisit figures for /metrics (every
        consumer serves them) and, as this interval's reaper, append its counters to its
        history (for rates)."""
        now = time.time()
        figures = now - self._last_figures >= history.HISTORY_EVERY_S
        record = reaper and now - self._last_history >= history.HISTORY_EVERY_S
        if not (figures or record):
            return
        stats = await self.queue.stats()
        self._last_figures = now
        self.metrics.revisits.stats = stats.revisits
        if not record:
            return
        self._last_history = now
        # Running counters only (rates are their differences); the state counts share
        # some names (leased, dead) and are read live by `crawlq stats` anyway.
        await history.record(self.queue.client, self.queue.crawl, stats.counters)
