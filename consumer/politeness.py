"""Per-host politeness shared by the whole fleet, enforced in Redis.

Each host has at most ``concurrency`` fetches in flight across every consumer and at
least ``delay`` between request starts (or its robots.txt Crawl-delay when larger). A
429/503 answer cools the host down for everyone. Slots are leases: one that is never
released (its consumer died) expires after ``slot_ttl_ms``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.connection import RedisClient
from common.keys import CrawlKeys
from common.scripts import Scripts


@dataclass(frozen=True, slots=True)
class HostRequest:
    """One task's claim on its host: ``delay_ms`` is the spacing this host needs."""

    host: str
    delay_ms: int


@dataclass(frozen=True, slots=True)
class Slot:
    """A granted fetch slot, to be released when the fetch ends."""

    host: str
    token: str


class Politeness:
    """Batched slot acquire/release over the host_acquire/host_release scripts."""

    def __init__(
        self,
        client: RedisClient,
        crawl: str,
        worker: str,
        *,
        concurrency: int,
        delay_s: float,
        slot_ttl_ms: int,
        scripts: Scripts | None = None,
    ) -> None:
        self.keys = CrawlKeys.build(crawl)
        self.concurrency = concurrency
        self.delay_ms = int(delay_s * 1000)
        self.slot_ttl_ms = slot_ttl_ms
        self.scripts = scripts or Scripts(client)
        self._worker = worker
        self._tokens = itertools.count()

    @property
    def enabled(self) -> bool:
        """Off only when both limits are off (a site you own, a benchmark)."""
        return self.concurrency > 0 or self.delay_ms > 0

    def delay_for(self, crawl_delay: float | None) -> int:
        """The spacing for a host: ours, or its robots.txt Crawl-delay when larger."""
        if crawl_delay is None:
            return self.delay_ms
        return max(self.delay_ms, int(crawl_delay * 1000))

    async def acquire(self, requests: Sequence[HostRequest]) -> list[Slot | int]:
        """One round trip: a Slot per granted request, else the ms to wait."""
        if not requests:
            return []
        tokens = [f"{self._worker}:{next(self._tokens)}" for _ in requests]
        keys = [self.keys.hosts, *(self.keys.slots(r.host) for r in requests)]
        args: list[Any] = [self.concurrency or 1_000_000, self.slot_ttl_ms]
        for r, token in zip(requests, tokens, strict=True):
            args += [r.host, r.delay_ms, token]
        waits = await self.scripts.host_acquire(keys=keys, args=args)
        return [Slot(r.host, token) if int(w) == 0 else int(w)
                for r, token, w in zip(requests, tokens, waits, strict=True)]

    async def release(self, slots: Sequence[tuple[Slot, int]]) -> None:
        """Give slots back; a non-zero cooldown_ms slows that host for the whole fleet."""
        if not slots:
            return
        keys = [self.keys.hosts, *(self.keys.slots(s.host) for s, _ in slots)]
        args: list[Any] = []
        for slot, cooldown_ms in slots:
            args += [slot.host, slot.token, max(0, int(cooldown_ms))]
        await self.scripts.host_release(keys=keys, args=args)
