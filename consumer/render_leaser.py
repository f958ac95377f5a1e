"""The render leaser of a consumer started with --browser: leases render tasks
(``common/lua/lease_render.lua``) for its browser's free pages, and hands them to the
fetch slots as the leaser hands its own (``consumer.leaser``): the runner renders them
(``consumer.fetch_choice``), the flusher ends them. A consumer without a browser has none,
and lease.lua never leases it a render task: so render tasks go to browsers only.

It asks for as many tasks as the page pool has pages not already taken by its render
leases, and sleeps, when none is ready, until the render lane's next host may be (at most
a second) or until it is kicked: a render lease ended, or another process queued work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from common.observability.metrics import Metrics
from common.queue import Lease, LeasingQueue
from common.redis.errors import REDIS_ERRORS
from common.redis.resend import may_run_again
from consumer.backoff import Backoff
from consumer.clock import RedisClock
from consumer.held import LeaseBook
from consumer.live import PolicyReader
from consumer.slots import Slots, Stage
from consumer.stopping import Stopping
from consumer.write_health import SinkHealth

log = logging.getLogger("consumer")

#: The shortest sleep between two render lease calls that leased nothing, and the longest:
#: render tasks reach the lane when a plain lease call meets them (lib/render.lua), which
#: tells nobody, so an empty lane is asked again this often (a call on no hosts, a
#: partition: two reads).
MIN_WAIT_S = 0.02
MAX_WAIT_S = 0.25
#: What the render lease loop runs again after a Redis error (common/redis/resend.py: its
#: operation id answers a call sent again, as lease.lua's).
RENDER_LEASE_SCRIPTS = ("lease_render",)


class RenderLeaser:
    """Leases render tasks for the browser's free pages (see the module's docstring)."""

    def __init__(self, queue: LeasingQueue, book: LeaseBook, slots: Slots, *,
                 worker: str, lease_ms: int, pages: Callable[[], int], metrics: Metrics,
                 stopping: Stopping, health: SinkHealth, policy: PolicyReader,
                 clock: RedisClock, dispatch: Callable[[Sequence[Lease], int], None]) -> None:
        self.queue = queue
        self.book = book
        self.slots = slots
        self.worker = worker
        self.lease_ms = lease_ms
        self._pages = pages
        self.metrics = metrics
        self.stopping = stopping
        self.health = health
        self.policy = policy
        self.clock = clock
        self._dispatch = dispatch
        self._mine: dict[str, Lease] = {}  # task id -> its lease
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Look again now (a page may be free, or work queued)."""
        self._kick.set()

    def active(self) -> int:
        """This leaser's leases not finished (each takes, or will take, a page)."""
        self._mine = {tid: lease for tid, lease in self._mine.items()
                      if self.slots.stage(lease) is not Stage.DONE}
        return len(self._mine)

    async def run(self) -> None:
        """Lease render tasks until the consumer drains (an error it did not expect is
        logged, and it goes on after a pause)."""
        while not self.stopping.draining:
            try:
                await self._run()
            except Exception:
                log.exception("render_leaser_failed")
                await self._wait(MAX_WAIT_S)

    async def _run(self) -> None:
        errors = Backoff()
        while not self.stopping.draining:
            self._kick.clear()  # a kick from now on ends the wait below
            room = self._pages() - self.active()
            if self.health.failing or room <= 0:
                await self._wait(MAX_WAIT_S)
                continue
            t0 = time.monotonic()
            try:
                batch = await self.queue.lease_renders(self.worker, room, self.lease_ms)
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors_total.inc()
                if not may_run_again(exc, RENDER_LEASE_SCRIPTS):
                    raise
                log.warning("redis_error", extra={"during": "lease_render",
                                                  "error": str(exc)[:200]})
                await errors.sleep(self.stopping.stop)
                continue
            errors.reset()
            self.policy.named(batch.policy_version)
            if batch.leases:
                self._took(batch.leases, t0, batch.now_ms)
                continue
            await self._wait(MAX_WAIT_S if batch.wait_s is None else batch.wait_s)

    def _took(self, leases: Sequence[Lease], t0: float, now_ms: int) -> None:
        self.clock.observe(time.monotonic(), now_ms)
        for lease in leases:
            old = self.book.hold(lease, t0)
            if old is not None:
                self.slots.drop(old)
            self._mine[lease.id] = lease
        self._dispatch(leases, now_ms)

    async def _wait(self, seconds: float) -> None:
        kicked = asyncio.ensure_future(self._kick.wait())
        stop = asyncio.ensure_future(self.stopping.stop.wait())
        try:
            await asyncio.wait({kicked, stop}, return_when=asyncio.FIRST_COMPLETED,
                               timeout=min(MAX_WAIT_S, max(MIN_WAIT_S, seconds)))
        finally:
            for waiter in (kicked, stop):
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
