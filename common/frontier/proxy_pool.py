"""The proxy pool as an operator reads it (``crawlq proxies``, the dashboard): one row per
proxy, one per host that is past the cheapest tier or bans some proxy. Only what
``common.proxies.health`` holds: ids and redacted URLs, never a credential."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from common.policy import CrawlPolicy, read_values
from common.proxies.health import PoolView, effective_tier, read_pool
from common.proxies.rules import ProxyRules
from common.queue import CrawlQueue
from common.redis.connection import RedisClient

__all__ = ["MAX_HOSTS", "HostRow", "PoolSummary", "ProxyRow", "pool_summary", "read_summary"]

#: Most hosts a summary lists (those with the most bans first).
MAX_HOSTS = 200


@dataclass(frozen=True, slots=True)
class ProxyRow:
    id: str
    shown: str
    tier: str
    ok: int
    fail: int
    ban: int
    state: str  # "ok", or "quarantined"
    quarantined_s: float  # how long its quarantine still lasts (0: none)
    level: int
    lat_ms: int
    banned_by: int  # hosts that ban it now
    seen_s: float  # since its last report


@dataclass(frozen=True, slots=True)
class HostRow:
    host: str
    tier: str  # its tier now (one down per quiet period)
    bans_at_tier: int
    banned: list[str]  # the ids of the proxies it bans now


@dataclass(frozen=True, slots=True)
class PoolSummary:
    tiers: tuple[str, ...]
    proxies: list[ProxyRow]
    hosts: list[HostRow]
    hosts_total: int

    def to_json(self) -> dict[str, Any]:
        return {"tiers": list(self.tiers), "proxies": [asdict(p) for p in self.proxies],
                "hosts": [asdict(h) for h in self.hosts], "hosts_total": self.hosts_total}


def pool_summary(view: PoolView, rules: ProxyRules, limit: int = MAX_HOSTS) -> PoolSummary:
    """The rows of `view` under `rules` (the crawl's tiers and quiet period)."""
    now = view.now_ms
    banned_by: dict[str, list[str]] = {}
    for (pid, host), until in view.bans.items():
        if until > now:
            banned_by.setdefault(host, []).append(pid)
    proxies = [ProxyRow(
        p.id, p.shown, p.tier, p.ok, p.fail, p.ban,
        "quarantined" if p.quarantined(now) else "ok",
        max(0, p.until_ms - now) / 1000, p.level, p.lat_ms,
        sum(p.id in ids for ids in banned_by.values()), max(0, now - p.seen_ms) / 1000)
        for p in sorted(view.proxies.values(), key=lambda p: (p.tier, p.shown, p.id))]
    tiers = _all_tiers(rules.tiers, [p.tier for p in proxies])
    hosts: list[HostRow] = []
    for host in sorted(set(banned_by) | set(view.tiers),
                       key=lambda h: (-len(banned_by.get(h, ())), h)):
        record = view.tiers.get(host)
        at = effective_tier(record, tiers, rules, now)
        if at == 0 and host not in banned_by:
            continue
        kept = record is not None and record.tier == tiers[at]
        hosts.append(HostRow(host, tiers[at], record.bans if kept and record else 0,
                             sorted(banned_by.get(host, []))))
    return PoolSummary(tiers, proxies, hosts[:limit], len(hosts))


def _all_tiers(named: Sequence[str], have: Sequence[str]) -> tuple[str, ...]:
    return (*named, *dict.fromkeys(t for t in have if t not in named and t != "direct"))


async def read_summary(client: RedisClient, crawl: str, limit: int = MAX_HOSTS
                       ) -> PoolSummary:
    """The crawl's proxy pool now (ConfigError when the crawl does not exist)."""
    queue = await CrawlQueue.existing(client, crawl)
    stored = await read_values(client, crawl)
    policy = stored.policy if stored is not None else CrawlPolicy()
    view = await read_pool(client, crawl, queue.partitions)
    return pool_summary(view, policy.proxy_rules(), limit)
