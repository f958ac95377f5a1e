"""`CrawlQueue`: one crawl's queue calls in one object, for any process; and
`LeasingQueue`, the same for a consumer, which also owns its lease client."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any, Self

from common.queue import deadletters, housekeeping, inspection, transitions
from common.queue.crawl import Crawl, CrawlSettings, existing_settings, open_settings
from common.queue.enqueue import enqueue
from common.queue.known import KnownRecrawl, recrawl_known
from common.queue.lease_client import LeaseClient
from common.queue.migrate import migrate_crawl
from common.queue.model import (
    Code,
    DeadTask,
    EnqueueResult,
    Failure,
    Lease,
    LeaseBatch,
    NewTask,
    RetryPolicy,
    Stats,
)
from common.queue.render_leasing import RenderLeaseClient
from common.queue.rendermodes import RenderModes
from common.redis.connection import RedisClient


class CrawlQueue:
    """One crawl's queue on one Redis (or Redis Cluster) client: stateless calls, but
    for the crawl policy's values it applies (`configure`)."""

    def __init__(self, client: RedisClient, crawl: str, settings: CrawlSettings, *,
                 retry: RetryPolicy | None = None, recrawl_after_s: int = 0,
                 jitter: Callable[[], float] = random.random) -> None:
        self.on = Crawl.on(client, crawl, settings)
        self.client, self.crawl, self.settings = client, crawl, settings
        self.crawl_keys, self.partitions, self.scripts = (
            self.on.keys, self.on.partitions, self.on.scripts)
        self._retry = retry or RetryPolicy()
        self._recrawl_after_s = recrawl_after_s
        self._revisits = False
        self._render_all = False
        #: A rendering=auto crawl's decisions (None: not auto): common.queue.rendermodes.
        self.render_modes: RenderModes | None = None
        self._jitter = jitter

    @classmethod
    async def open(cls, client: RedisClient, crawl: str,
                   settings: CrawlSettings | None = None, **kwargs: Any) -> Self:
        """Open a crawl, creating it with ``settings`` if new (see `open_settings`)."""
        return cls(client, crawl, await open_settings(client, crawl, settings), **kwargs)

    @classmethod
    async def existing(cls, client: RedisClient, crawl: str, **kwargs: Any) -> Self:
        """Open a crawl that must exist already."""
        return cls(client, crawl, await existing_settings(client, crawl), **kwargs)

    # -- the crawl policy's values ----------------------------------------------------

    @property
    def retry(self) -> RetryPolicy:
        """Backoff and stall limit of the fail and reclaim calls."""
        return self._retry

    @property
    def recrawl_after_s(self) -> int:
        """How long after its last enqueue a done URL is enqueued again (0: never)."""
        return self._recrawl_after_s

    @property
    def revisits(self) -> bool:
        """Whether the crawl keeps its URLs' history (revisits on, or a recrawl window
        with conditional recrawls): each ack then sends what its fetch observed (the
        URL's history, and its next visit with revisits on)."""
        return self._revisits

    @property
    def render_all(self) -> bool:
        """Whether every task enqueued is a render request (the policy's rendering=all)."""
        return self._render_all

    def configure(self, *, retry: RetryPolicy | None = None,
                  recrawl_after_s: int | None = None, revisits: bool | None = None,
                  render_all: bool | None = None, adaptive: bool | None = None) -> None:
        """Apply the crawl policy's values: the next fail, reclaim, enqueue or ack call
        takes them (None: keep the current one)."""
        if retry is not None:
            self._retry = retry
        if recrawl_after_s is not None:
            self._recrawl_after_s = recrawl_after_s
        if revisits is not None:
            self._revisits = revisits
        if render_all is not None:
            self._render_all = render_all
        if adaptive is not None:
            self.render_modes = (self.render_modes or RenderModes(self.client, self.crawl)) \
                if adaptive else None

    # -- calls ------------------------------------------------------------------------

    def partition_of(self, host: str) -> int:
        """The partition that holds a host."""
        return self.on.partition_of(host)

    async def enqueue(self, tasks: Sequence[NewTask]) -> EnqueueResult:
        """Dedup and enqueue a batch (see `common.queue.enqueue.enqueue`); a bad request
        in a task built by hand refuses the whole batch: InvalidRequestError."""
        return await enqueue(self.on, tasks, self._recrawl_after_s,
                             render_all=self._render_all, modes=self.render_modes)

    async def recrawl_known(self, *, stop: asyncio.Event | None = None) -> KnownRecrawl:
        """Queue again every done URL whose history record is older than the recrawl
        window (Nutch's generate: `common.queue.known`); nothing without a window."""
        if not self._recrawl_after_s:
            return KnownRecrawl()
        return await recrawl_known(self.on, self._recrawl_after_s, stop=stop)

    async def renew(self, worker: str, leases: Sequence[Lease], lease_ms: int
                    ) -> list[tuple[Lease, Code]]:
        """Extend held leases; returns the ones lost, with why. Updates deadlines."""
        return await transitions.renew(self.on, worker, leases, lease_ms)

    async def ack(self, worker: str, items: Sequence[tuple[Lease, str]], *,
                  op: str = "") -> list[Code]:
        """Mark tasks done with an outcome code; returns a code per item, in order.
        `op`: the call's operation id (new when ''): a call sent again with it gets the
        codes of its first run."""
        return await transitions.ack(self.on, worker, items, revisits=self._revisits, op=op)

    async def fail(self, worker: str, failures: Sequence[Failure], *,
                   op: str = "") -> list[tuple[Code, int]]:
        """Record failed attempts; returns (RETRY with delay ms | DEAD | refusal, -1).
        `op` as `ack`'s."""
        return await transitions.fail(self.on, worker, failures, self._retry, self._jitter,
                                      op=op)

    async def release(self, worker: str, leases: Sequence[Lease], *,
                      restart_turn: bool = False) -> list[Code]:
        """Hand leases back to the head of their hosts' queues (see
        `transitions.release`)."""
        return await transitions.release(self.on, worker, leases, restart_turn=restart_turn)

    async def late_turn(self, worker: str, lease: Lease, *,
                        after_ms: int = 0) -> tuple[Code, int, int]:
        """A turn of its own for a late request under a held lease, or one a delay after
        a request made under it (see `transitions.late_turn`)."""
        return await transitions.late_turn(self.on, worker, lease, after_ms=after_ms)

    async def checkpoint(self, worker: str, lease: Lease, value: Any) -> Code:
        """Save a checkpoint for a held lease (a lost lease can't)."""
        return await transitions.checkpoint(self.on, worker, lease, value)

    async def reclaim(self, limit: int = 1000) -> tuple[int, int]:
        """Take back expired leases in every partition; returns (reclaimed, dead)."""
        return await housekeeping.reclaim(self.on, self._retry.max_stalls, limit)

    async def promote(self, limit: int = 1000) -> tuple[int, int]:
        """Put due retries back in their hosts' queues; returns (moved, ms to the next
        due retry or -1)."""
        return await housekeeping.promote(self.on, limit)

    async def reap(self, guard_ms: int) -> tuple[int, int, int] | None:
        """Reclaim and promote, at most once per guard_ms across the fleet."""
        return await housekeeping.reap(self.on, self._retry.max_stalls, guard_ms)

    async def dead_list(self, *, reason: str | None = None, limit: int = 50,
                        page: int = 500) -> list[DeadTask]:
        """Dead tasks, oldest first, optionally only those with one reason."""
        return await deadletters.dead_list(self.on, reason=reason, limit=limit, page=page)

    async def dead_get(self, task_id: str) -> DeadTask | None:
        """One dead task by its id; None when it is not dead."""
        return await deadletters.dead_get(self.on, task_id)

    async def dead_requeue(self, ids: Sequence[str]) -> int:
        """Put dead tasks back in their hosts' queues; returns how many moved."""
        return await deadletters.dead_requeue(self.on, ids)

    async def dead_purge(self, ids: Sequence[str]) -> int:
        """Delete dead tasks for good; returns how many were deleted."""
        return await deadletters.dead_purge(self.on, ids)

    async def dead_ids(self, reason: str | None = None) -> list[str]:
        """Every dead id (optionally of one reason)."""
        return await deadletters.dead_ids(self.on, reason)

    async def stats(self) -> Stats:
        """Every state's count and every counter, summed over the partitions, and the
        revisit schedule's numbers when it is in use (`Stats.revisits`)."""
        return await inspection.stats(self.on)

    async def is_empty(self) -> bool:
        """Whether nothing is pending, leased, waiting or a due revisit (see
        `inspection.is_empty`)."""
        return await inspection.is_empty(self.on)

    async def state_of(self, tid: str, url: str | None = None) -> str:
        """The state of one task: pending, leased, waiting, dead, done or unknown."""
        return await inspection.state_of(self.on, tid, url)


class LeasingQueue(CrawlQueue):
    """A consumer's queue: the calls, and `leases`, the lease client that owns this
    consumer's lease state (told when its leases end, so a partition is asked again)."""

    def __init__(self, client: RedisClient, crawl: str, settings: CrawlSettings,
                 **kwargs: Any) -> None:
        super().__init__(client, crawl, settings, **kwargs)
        self.leases = LeaseClient(self.on, self.fail)
        self.renders = RenderLeaseClient(self.on, self.fail)

    @classmethod
    async def open(cls, client: RedisClient, crawl: str,
                   settings: CrawlSettings | None = None, **kwargs: Any) -> Self:
        """`CrawlQueue.open`, converting a crawl of layout 2 or 3 first (a consumer converts:
        `common.queue.migrate`)."""
        await migrate_crawl(client, crawl)
        return await super().open(client, crawl, settings, **kwargs)

    @classmethod
    async def existing(cls, client: RedisClient, crawl: str, **kwargs: Any) -> Self:
        """`CrawlQueue.existing`, converting a crawl of layout 2 or 3 first."""
        await migrate_crawl(client, crawl)
        return await super().existing(client, crawl, **kwargs)

    async def lease(self, worker: str, n: int, lease_ms: int) -> list[Lease]:
        """Lease up to n tasks from hosts whose turn has come (see `LeaseClient`)."""
        return await self.leases.lease(worker, n, lease_ms)

    async def lease_turns(self, worker: str, n: int, lease_ms: int,
                          responses_in: list[Lease] | None = None,
                          held: Callable[[str], int] | None = None, *,
                          ahead_ms: int = 0) -> LeaseBatch:
        """Lease up to n tasks (see `LeaseClient.lease_turns`)."""
        return await self.leases.lease_turns(worker, n, lease_ms, responses_in, held,
                                             ahead_ms=ahead_ms)

    async def lease_renders(self, worker: str, n: int, lease_ms: int) -> LeaseBatch:
        """Lease up to n render tasks, for a consumer with a browser (see
        `RenderLeaseClient`)."""
        return await self.renders.lease(worker, n, lease_ms)

    def woken(self) -> None:
        """Another process says work may be ready: ask every partition on the next call."""
        self.leases.woken()
        self.renders.woken()

    async def ack(self, worker: str, items: Sequence[tuple[Lease, str]], *,
                  op: str = "") -> list[Code]:
        self.leases.ended({lease.partition for lease, _ in items})
        self.renders.ended([lease for lease, _ in items])
        return await super().ack(worker, items, op=op)

    async def fail(self, worker: str, failures: Sequence[Failure], *,
                   op: str = "") -> list[tuple[Code, int]]:
        self.leases.ended({f.lease.partition for f in failures})
        self.renders.ended([f.lease for f in failures])
        return await super().fail(worker, failures, op=op)

    async def release(self, worker: str, leases: Sequence[Lease], *,
                      restart_turn: bool = False) -> list[Code]:
        self.leases.ended({lease.partition for lease in leases})
        return await super().release(worker, leases, restart_turn=restart_turn)
