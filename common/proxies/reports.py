"""What a consumer learned about its proxies since its last report, and sending it.

A `Report` gathers, per proxy, its successes, failures (and those after its last
success), bans and response times, and per host the bans and the hosts no proxy could
reach (``gone``). `send_report` hands it to Redis in one ``proxy_report.lua`` call for the
crawl's ``px`` and one ``proxy_bans.lua`` call per partition with bans or gone hosts: a
flush's worth in a couple of calls, never a round trip per request. Each call carries an
operation id, so a call sent again after a lost reply counts nothing twice.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from common.keys import CrawlKeys, PartitionKeys
from common.proxies.rules import ProxyRules
from common.proxies.spec import ProxySpec
from common.redis.connection import RedisClient
from common.redis.scripts import LuaScript, register

__all__ = ["Report", "ReportCalls", "Tally", "send_report"]

_OPS = itertools.count(1)
_PROCESS = os.urandom(4).hex()


def _op_id() -> str:
    """An id unique to one call of this process."""
    return f"{_PROCESS}-{next(_OPS)}"


@dataclass(slots=True)
class Tally:
    """One proxy's outcomes since the last report."""

    spec: ProxySpec
    ok: int = 0
    failed: int = 0
    tail: int = 0  # failures after its last success
    banned: int = 0
    lat_sum_ms: float = 0.0

    def args(self) -> list[str | int]:
        lat = round(self.lat_sum_ms / self.ok) if self.ok else -1
        return [self.spec.id, self.spec.tier, self.spec.shown, self.ok, self.failed,
                self.tail, self.banned, lat]


@dataclass(slots=True)
class Report:
    """A consumer's proxy outcomes waiting to be sent."""

    tallies: dict[str, Tally] = field(default_factory=dict)
    # (event, host, proxy id, tier, wait_ms, exhausted)
    events: list[tuple[str, str, str, str, int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tallies or self.events)

    def urgent(self) -> bool:
        """Whether the fleet should hear it at the next flush: a ban, a gone host or a
        failure (successes alone may wait)."""
        return bool(self.events) or any(t.failed for t in self.tallies.values())

    def tally(self, spec: ProxySpec) -> Tally:
        found = self.tallies.get(spec.id)
        if found is None:
            found = self.tallies[spec.id] = Tally(spec)
        return found

    def succeeded(self, spec: ProxySpec, elapsed_s: float) -> None:
        t = self.tally(spec)
        t.ok += 1
        t.tail = 0
        t.lat_sum_ms += elapsed_s * 1000

    def failed(self, spec: ProxySpec) -> None:
        t = self.tally(spec)
        t.failed += 1
        t.tail += 1

    def banned(self, spec: ProxySpec, host: str, exhausted: bool) -> None:
        self.tally(spec).banned += 1
        self.events.append(("ban", host, spec.id, spec.tier, 0, int(exhausted)))

    def merge(self, later: Report) -> None:
        """Add `later`'s outcomes, which came after these."""
        for t in later.tallies.values():
            mine = self.tally(t.spec)
            mine.tail = t.tail if t.ok else mine.tail + t.tail
            mine.ok += t.ok
            mine.failed += t.failed
            mine.banned += t.banned
            mine.lat_sum_ms += t.lat_sum_ms
        self.events += later.events

    def gone(self, host: str, wait_ms: int) -> None:
        self.events.append(("gone", host, "-", "-", max(0, wait_ms), 0))


@dataclass(slots=True)
class ReportCalls:
    """The two scripts on one client, and where each host's partition is."""

    client: RedisClient
    crawl: str
    partitions: list[PartitionKeys]
    partition_of: Callable[[str], int]
    worker: str
    report: LuaScript = field(init=False)
    bans: LuaScript = field(init=False)

    def __post_init__(self) -> None:
        self.report = register(self.client, "proxy_report")
        self.bans = register(self.client, "proxy_bans")


async def send_report(calls: ReportCalls, report: Report, rules: ProxyRules
                      ) -> tuple[dict[str, int], dict[str, str]]:
    """Send `report`; returns each reported proxy's quarantine end (ms, 0: none) and each
    host's tier after it."""
    until: dict[str, int] = {}
    tiers: dict[str, str] = {}
    if report.tallies:
        keys = CrawlKeys.build(calls.crawl)
        args: list[str | int] = [_op_id(), rules.quarantine_ms, rules.quarantine_cap_ms,
                                 rules.max_failures]
        tallies = list(report.tallies.values())
        for t in tallies:
            args += t.args()
        reply = await calls.report(keys=[keys.proxies, keys.proxy_op(calls.worker)],
                                   args=args)
        until = {t.spec.id: int(u) for t, u in zip(tallies, reply, strict=True)}
    by_partition: dict[int, list[tuple[str, str, str, str, int, int]]] = {}
    for event in report.events:
        by_partition.setdefault(calls.partition_of(event[1]), []).append(event)
    for p, events in by_partition.items():
        pk = calls.partitions[p]
        args = [_op_id(), rules.ban_ms, rules.quiet_ms, rules.tier_bans,
                ",".join(rules.tiers)]
        for event in events:
            args += event
        reply = await calls.bans(
            keys=[*pk.host_state, pk.blocked, pk.proxy_bans, pk.proxy_tiers,
                  pk.proxy_op(calls.worker)], args=args)
        for event, tier in zip(events, reply, strict=True):
            tiers[event[1]] = tier.decode() if isinstance(tier, bytes) else str(tier)
    return until, tiers
