"""The proxy pool as Redis holds it: each proxy's health, each host's bans and tier.

`read_pool` reads it all in one pipelined round trip (the crawl's ``px`` HASH, and each
partition's ``px:ban`` ZSET and ``px:tier`` HASH, ``common/keys.py``): what a consumer's
snapshot is refreshed from every few seconds, and what ``crawlq proxies`` and the
dashboard show. Only bans still in force are read. `effective_tier` reckons a host's tier
as of a time as ``proxy_bans.lua``'s ``tier_now`` does: one tier down per quiet period
without a ban.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from common.codec import text
from common.keys import CrawlKeys, PartitionKeys
from common.proxies.rules import ProxyRules
from common.redis.connection import RedisClient

__all__ = ["HostTier", "PoolView", "ProxyHealth", "effective_tier", "read_pool"]


@dataclass(frozen=True, slots=True)
class ProxyHealth:
    """One proxy's record in ``px`` (see ``proxy_report.lua``)."""

    id: str
    tier: str
    ok: int
    fail: int
    ban: int
    streak: int  # failures in a row
    level: int  # quarantines in a row
    until_ms: int  # its quarantine's end (ms of Redis TIME; past: not quarantined)
    lat_ms: int  # response time, a moving average (-1: none yet)
    seen_ms: int  # its last report
    shown: str  # its URL, credentials redacted

    @classmethod
    def parse(cls, pid: str, value: str) -> ProxyHealth | None:
        """A record's text as a ProxyHealth; None when it is not one."""
        f = value.split(" ", 9)
        try:
            n = [int(x) for x in f[1:9]]
            return cls(pid, f[0], n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], f[9])
        except (IndexError, ValueError):
            return None

    def quarantined(self, now_ms: int) -> bool:
        return self.until_ms > now_ms


@dataclass(frozen=True, slots=True)
class HostTier:
    """A host's record in ``px:tier``: its tier, when it was last banned there (or
    escalated), its bans at that tier."""

    tier: str
    since_ms: int
    bans: int


def effective_tier(record: HostTier | None, tiers: Sequence[str], rules: ProxyRules,
                   now_ms: int) -> int:
    """The index in `tiers` of a host's tier at `now_ms` (0 without a record): a
    ``proxy_tier_quiet`` without a ban takes it one tier down (proxy_bans.lua)."""
    if record is None or record.tier not in tiers:
        return 0
    at = tiers.index(record.tier)
    if at and rules.quiet_ms > 0:
        at = max(0, at - max(0, now_ms - record.since_ms) // rules.quiet_ms)
    return at


@dataclass(slots=True)
class PoolView:
    """The pool as read at `now_ms` (Redis TIME): proxies by id, bans in force by (proxy
    id, host) -> until, host tiers by host."""

    now_ms: int = 0
    proxies: dict[str, ProxyHealth] = field(default_factory=dict)
    bans: dict[tuple[str, str], int] = field(default_factory=dict)
    tiers: dict[str, HostTier] = field(default_factory=dict)


async def read_pool(client: RedisClient, crawl: str, partitions: Sequence[PartitionKeys]
                    ) -> PoolView:
    """The crawl's proxy pool, in one pipelined round trip."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.hgetall(CrawlKeys.build(crawl).proxies)
        for pk in partitions:
            # Read from the past second on: a ban that ends meanwhile is dropped below.
            pipe.zrangebyscore(pk.proxy_bans, "(0", "+inf", withscores=True)
            pipe.hgetall(pk.proxy_tiers)
        replies = await pipe.execute()
    secs, micros = replies[0]
    view = PoolView(now_ms=int(secs) * 1000 + int(micros) // 1000)
    for raw_id, raw in replies[1].items():
        health = ProxyHealth.parse(text(raw_id), text(raw))
        if health is not None:
            view.proxies[health.id] = health
    for i in range(len(partitions)):
        for member, score in replies[2 + 2 * i]:
            pid, _, host = text(member).partition(" ")
            if score > view.now_ms and host:
                view.bans[(pid, host)] = int(score)
        for raw_host, raw in replies[3 + 2 * i].items():
            parts = text(raw).split(" ")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                view.tiers[text(raw_host)] = HostTier(parts[0], int(parts[1]), int(parts[2]))
    return view
