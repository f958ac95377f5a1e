"""The crawl policy's proxy options, as the pool applies them (`CrawlPolicy.proxy_rules`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUARANTINE_CAP_FACTOR", "ProxyRules"]

#: A quarantine doubles with each one in a row, up to this many times the first.
QUARANTINE_CAP_FACTOR = 32


@dataclass(frozen=True, slots=True)
class ProxyRules:
    """Tiers (cheapest first), how long a ban lasts, when a host's tier moves, when a
    failing proxy is quarantined and for how long (times in ms)."""

    tiers: tuple[str, ...] = ("datacenter", "residential")
    ban_ms: int = 1_800_000
    tier_bans: int = 3
    quiet_ms: int = 600_000
    max_failures: int = 3
    quarantine_ms: int = 30_000

    @property
    def quarantine_cap_ms(self) -> int:
        return self.quarantine_ms * QUARANTINE_CAP_FACTOR

    def quarantine_for(self, level: int) -> int:
        """A quarantine at `level` (quarantines in a row before it), in ms."""
        factor: int = 2 ** min(level, 30)
        return min(self.quarantine_cap_ms, self.quarantine_ms * factor)
