"""A polite request's time: each lease of a host with a delay is its host's turn, on
Redis' clock, and its request starts DISPATCH_S after it (consumer.leaser). A request
that goes out later keeps the host's delay in one of two ways: a little late, its send
time goes with its ack and the host's next turn counts from it; late enough that the
host's next turn may be leased already (robots.txt looked up first, under the lease of
the page that needed it; a page that waited for that lookup), it first takes a turn of
its own (late_turn.lua). Whether a request is late is judged just before its headers go
out, after its connect (`on_sent`): a busy event loop, a slow connect or a wait for a
connection can make a request that left its slot on time late on the wire.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from common.observability.metrics import Metrics
from common.queue import Code, CrawlQueue, Lease
from consumer.clock import RedisClock
from consumer.handlers import LeaseLostError
from consumer.held import LeaseBook
from consumer.leaser import DISPATCH_MS, DISPATCH_S

#: A polite request this much later than DISPATCH_S after its turn is on time: its host's
#: next turn is not moved (each move is a write, and a late turn a slower crawl).
LATE_SLACK_MS = 10
#: A polite request this much later than DISPATCH_S after its turn takes a turn of its
#: own before it goes: the host's next turn may be leased already, timed from this one's
#: (leases come up to AHEAD_MS early), and would follow it this much too soon at most.
#: Under it, the ack's note (LATE_SLACK_MS) is enough. (At 50, frontier_bench saw one
#: pair of requests 0.942 s apart at a 1 s delay on a slow host: its bound is 50 ms.)
LATE_MS = 25


class Turns:
    """When this consumer's polite requests go out, against their hosts' turns."""

    def __init__(self, queue: CrawlQueue, worker_id: str, clock: RedisClock,
                 book: LeaseBook, metrics: Metrics) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.clock = clock
        self.book = book
        self.metrics = metrics

    def _late_at(self, lease: Lease, local_s: float) -> bool:
        """Whether `lease`'s request, sent at monotonic `local_s`, would go out more than
        LATE_MS after its turn (it waited for a robots.txt lookup, a slot, a connection)."""
        now = self.clock.to_redis_ms(local_s)
        return now is not None and now - DISPATCH_MS - LATE_MS > lease.granted_ms

    async def _take_late_turn(self, lease: Lease) -> bool:
        """Give a late request under `lease` a turn of its own (late_turn.lua) and wait
        for it, to start DISPATCH_S after it as a leased request does; False (the lease
        dropped) when the lease is lost."""
        code, turn, now = await self.queue.late_turn(self.worker_id, lease)
        if code is not Code.OK:
            self.book.drop(lease, lost=True)
            return False
        self.metrics.late_turns_total.inc()
        lease.granted_ms = turn
        await asyncio.sleep(DISPATCH_S + max(0, turn - self._redis_now(now)) / 1000)
        return True

    async def turn_after(self, lease: Lease) -> float | None:
        """A page whose robots.txt this consumer fetched under its lease (that request
        took the lease's turn) takes its own turn, a full delay after that request
        (late_turn.lua with after_ms), instead of going back to its host's queue to be
        leased again; returns the monotonic time its request starts (DISPATCH_S after
        the turn), or None (the lease dropped) when the lease is lost."""
        after = max(lease.granted_ms, lease.sent_ms)
        code, turn, now = await self.queue.late_turn(self.worker_id, lease, after_ms=after)
        if code is not Code.OK:
            self.book.drop(lease, lost=True)
            return None
        lease.granted_ms, lease.sent_ms = turn, 0
        return time.monotonic() + DISPATCH_S + max(0, turn - self._redis_now(now)) / 1000

    def _redis_now(self, reply_ms: int) -> int:
        """Redis' time now by its clock (consumer.clock), never before `reply_ms`, the
        TIME of the reply just read: a wait for a turn counts from it, not from the
        reply, which a busy event loop may have read late."""
        return max(reply_ms, self.clock.to_redis_ms(time.monotonic()) or reply_ms)

    def on_sent(self, lease: Lease) -> Callable[[], Awaitable[None]] | None:
        """For a request to a host with a delay: the fetch's `on_sent`, awaited as its
        headers are about to go out (after the connect; the first hop's, a redirect's are
        later requests). A request more than LATE_MS after its turn there takes a turn of
        its own first (a lost lease raises LeaseLostError: nothing is sent); then when it
        went is noted."""
        if lease.delay_ms <= 0:
            return None
        first = True

        async def sent() -> None:
            nonlocal first
            if not first:
                return
            first = False
            now = time.monotonic()
            if self._late_at(lease, now):
                if not await self._take_late_turn(lease):
                    raise LeaseLostError(f"lease on task {lease.id} was lost")
                now = time.monotonic()
            self._note_sent(lease, now)
        return sent

    def on_visit(self, lease: Lease) -> Callable[[], Awaitable[None]] | None:
        """For a rendered page of a host with a delay: awaited before each later request
        its page makes to its own host (common.browser.fetcher), as `on_sent` is before
        its first. A page is one visit, made under its lease's turn: a request of it
        more than LATE_MS after the turn takes a turn of its own first (the host's next
        turn then counts from it), one within it is noted for the ack."""
        if lease.delay_ms <= 0:
            return None

        async def sent() -> None:
            now = time.monotonic()
            if self._late_at(lease, now):
                if not await self._take_late_turn(lease):
                    raise LeaseLostError(f"lease on task {lease.id} was lost")
                now = time.monotonic()
            self._note_sent(lease, now)
        return sent

    def _note_sent(self, lease: Lease, started: float) -> None:
        """A request to a host with a delay that goes out later than DISPATCH_S after its
        turn (a busy event loop, a slow connect) has its time sent with its ack, and its
        host's next turn counts from it: another consumer's on-time request then can't
        follow it too closely."""
        sent = self.clock.to_redis_ms(started)
        if sent is not None and sent - DISPATCH_MS - LATE_SLACK_MS > lease.granted_ms:
            lease.sent_ms = max(lease.sent_ms, sent - DISPATCH_MS)
