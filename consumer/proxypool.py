"""This consumer's side of the crawl's proxy pool: a pick per request from a local
snapshot, what it learns applied here at once and sent to the fleet with its flush.

The snapshot (``common.proxies.read_pool``: every proxy's health, the bans in force per
host, the hosts' tiers) is read again every `REFRESH_S`, one pipelined round trip; a pick
never waits on Redis. What this consumer sees itself counts at once, before the fleet
hears of it: a proxy that failed is left alone here for `SUSPECT_MS` (twice as long at each
failure in a row), one that failed ``proxy_max_failures`` times in a row is quarantined
here (as ``proxy_report.lua`` will for the fleet), a proxy a host banned is not picked for
that host again, and a host whose tier has none left moves up a tier. Its outcomes wait in a
`Report` until the flush sends them (`flush`): at the next flush when it holds a ban, a
failure or a host no proxy reaches, else at most every `REPORT_EVERY_S`.

A pick for a host: its tier of the moment (the fleet's record, one tier down per quiet
period; or the one this consumer escalated it to), then each tier above it, then those
below, the first tier with a proxy that is neither quarantined nor banned by the host;
round-robin among those. None when there is none (`wait_ms` says for how long).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from common.observability.metrics import Metrics
from common.proxies import (
    DIRECT,
    DIRECT_ID,
    PoolView,
    ProxyRules,
    ProxySpec,
    Report,
    ReportCalls,
    effective_tier,
    read_pool,
    send_report,
)
from common.queue import CrawlQueue
from common.redis.errors import REDIS_ERRORS
from consumer.config import ConsumerSettings
from consumer.live import Live

log = logging.getLogger("consumer")

#: How often the snapshot is read again.
REFRESH_S = 1.0
#: How long successes alone may wait before they are reported.
REPORT_EVERY_S = 1.0
#: How long a host stays at a tier this consumer moved it to, without the fleet's word.
LOCAL_TIER_S = 30.0
#: How long a proxy that failed (not yet quarantined) is left alone by this consumer
#: after its first failure in a row (doubling with each): the request went on through
#: another at once, and the fleet's quarantine comes with the next reports.
SUSPECT_MS = 5000
#: The least time a host no proxy reaches is blocked for.
MIN_WAIT_MS = 1000


@dataclass(slots=True)
class _Learned:
    """What this consumer saw itself: quarantines, bans and tiers by (Redis) ms until
    they end, and failures in a row."""

    quarantined: dict[str, int] = field(default_factory=dict)
    bans: dict[tuple[str, str], int] = field(default_factory=dict)
    tiers: dict[str, tuple[int, int]] = field(default_factory=dict)  # host -> (index, until)
    streak: dict[str, int] = field(default_factory=dict)

    def forget_before(self, now_ms: int) -> None:
        for pid in [k for k, until in self.quarantined.items() if until <= now_ms]:
            del self.quarantined[pid]
        for ban in [k for k, until in self.bans.items() if until <= now_ms]:
            del self.bans[ban]
        for host in [h for h, (_, until) in self.tiers.items() if until <= now_ms]:
            del self.tiers[host]


class ProxyPool:
    """Picks a proxy for each request from the fleet's snapshot and what this consumer
    learned; reports outcomes with the flush (`flush`) and reads the snapshot again in
    `run`."""

    def __init__(self, specs: Sequence[ProxySpec], calls: ReportCalls,
                 rules: Callable[[], ProxyRules], metrics: Metrics | None = None) -> None:
        self.specs = tuple(specs)
        self.calls = calls
        self._rules_of = rules
        self.view = PoolView(now_ms=int(time.time() * 1000))
        self._read_at = time.monotonic()
        self.learned = _Learned()
        self.report = Report()
        self._sent_at = 0.0
        self._turn = itertools.count()
        self.counts = {"ok": 0, "failed": 0, "banned": 0, "gone": 0}
        self._metric = None if metrics is None else metrics.proxy_requests_total
        if self._metric is not None:
            for outcome in self.counts:
                self._metric.labels(outcome)

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        if self._metric is not None:
            self._metric.labels(outcome).inc()

    # -- the rules and the tiers --------------------------------------------------------

    def rules(self) -> ProxyRules:
        """The crawl's rules with this consumer's tiers: the policy's, then any of its
        proxies' tiers the policy does not name, in the order they were given."""
        rules = self._rules_of()
        extra = [s.tier for s in self.specs if s.tier not in rules.tiers]
        if not extra:
            return rules
        return replace(rules, tiers=(*rules.tiers, *dict.fromkeys(extra)))

    def members(self, tier: str) -> list[ProxySpec]:
        if tier == DIRECT_ID:
            return [DIRECT]
        return [s for s in self.specs if s.tier == tier]

    def now_ms(self) -> int:
        """Redis time, as the snapshot's reading of it moved on by this process' clock."""
        return self.view.now_ms + int((time.monotonic() - self._read_at) * 1000)

    # -- picking ------------------------------------------------------------------------

    def usable(self, spec: ProxySpec, host: str, now_ms: int) -> bool:
        """Neither quarantined (the fleet's word or this consumer's) nor banned by `host`."""
        health = self.view.proxies.get(spec.id)
        if health is not None and health.until_ms > now_ms:
            return False
        if self.learned.quarantined.get(spec.id, 0) > now_ms:
            return False
        key = (spec.id, host)
        return self.view.bans.get(key, 0) <= now_ms and self.learned.bans.get(key, 0) <= now_ms

    def tier_of(self, host: str, tiers: Sequence[str], rules: ProxyRules, now_ms: int) -> int:
        """The index of `host`'s tier now: the fleet's, or this consumer's if higher."""
        at = effective_tier(self.view.tiers.get(host), tiers, rules, now_ms)
        mine = self.learned.tiers.get(host)
        if mine is not None and mine[1] > now_ms:
            at = max(at, mine[0])
        return min(at, len(tiers) - 1)

    def pick(self, host: str, prefer: str = "") -> ProxySpec | None:
        """The proxy (or `DIRECT`) `host`'s next request goes through; None: none now.
        `prefer`: a proxy id (a session's), taken if this consumer has it and it is
        usable for `host`."""
        now = self.now_ms()
        if prefer:
            for spec in (*self.specs, DIRECT):
                if spec.id == prefer and self.usable(spec, host, now):
                    return spec
        rules = self.rules()
        tiers = rules.tiers
        start = self.tier_of(host, tiers, rules, now)
        for i in (*range(start, len(tiers)), *range(start - 1, -1, -1)):
            found = [s for s in self.members(tiers[i]) if self.usable(s, host, now)]
            if found:
                return found[next(self._turn) % len(found)]
        return None

    def wait_ms(self, host: str) -> int:
        """How long until a proxy of this consumer may reach `host` again (at least
        MIN_WAIT_MS)."""
        now = self.now_ms()
        soonest: int | None = None
        for tier in self.rules().tiers:
            for spec in self.members(tier):
                health = self.view.proxies.get(spec.id)
                free = max(health.until_ms if health else 0,
                           self.learned.quarantined.get(spec.id, 0),
                           self.view.bans.get((spec.id, host), 0),
                           self.learned.bans.get((spec.id, host), 0))
                soonest = free if soonest is None else min(soonest, free)
        return max(MIN_WAIT_MS, (soonest or now) - now)

    # -- what a request taught ----------------------------------------------------------

    def succeeded(self, spec: ProxySpec, elapsed_s: float) -> None:
        self._count("ok")
        self.learned.streak.pop(spec.id, None)
        self.report.succeeded(spec, elapsed_s)

    def failed(self, spec: ProxySpec) -> None:
        """The proxy itself failed (no connection through it, refused, dropped)."""
        self._count("failed")
        if spec.url is None:  # no proxy: the host's failure, not the pool's
            return
        self.report.failed(spec)
        rules = self._rules_of()
        streak = self.learned.streak.get(spec.id, 0) + 1
        health = self.view.proxies.get(spec.id)
        level = health.level if health is not None else 0
        if streak >= rules.max_failures:
            self.learned.quarantined[spec.id] = self.now_ms() + rules.quarantine_for(level)
            streak = 0
            log.info("proxy_quarantined", extra={"proxy": spec.shown, "proxy_id": spec.id})
        else:  # suspect: left alone here a while, twice as long each time, till the verdict
            self.learned.quarantined[spec.id] = self.now_ms() + min(
                rules.quarantine_for(level), SUSPECT_MS * 2 ** (streak - 1))
        self.learned.streak[spec.id] = streak

    def banned(self, spec: ProxySpec, host: str) -> None:
        """`host` answered a request through `spec` with a block: not for it again (for
        the ban's time), and its tier moves up when none of that tier is left for it."""
        self._count("banned")
        now = self.now_ms()
        rules = self.rules()
        self.learned.bans[(spec.id, host)] = now + rules.ban_ms
        exhausted = not any(self.usable(s, host, now) for s in self.members(spec.tier))
        if exhausted and spec.tier in rules.tiers:
            at = rules.tiers.index(spec.tier) + 1
            if at < len(rules.tiers):
                self.learned.tiers[host] = (at, now + int(LOCAL_TIER_S * 1000))
        self.report.banned(spec, host, exhausted)
        log.info("proxy_banned", extra={"proxy": spec.shown, "proxy_id": spec.id,
                                        "host": host, "exhausted": exhausted})

    def gone(self, host: str) -> int:
        """No proxy reaches `host` now: the fleet blocks it for `wait_ms` (sent with the
        next flush); returns that wait."""
        self._count("gone")
        wait = self.wait_ms(host)
        self.report.gone(host, wait)
        log.warning("proxy_none_left", extra={"host": host, "wait_ms": wait})
        return wait

    # -- the fleet ----------------------------------------------------------------------

    async def flush(self) -> None:
        """Send the outcomes gathered (the flush calls it before it acks): at once when
        they hold a ban, a failure or a gone host, else at most every REPORT_EVERY_S.
        Kept to be sent again when Redis fails (the error is raised)."""
        report = self.report
        if not report or (not report.urgent()
                          and time.monotonic() - self._sent_at < REPORT_EVERY_S):
            return
        self.report = Report()
        try:
            until, tiers = await send_report(self.calls, report, self.rules())
        except BaseException:
            report.merge(self.report)
            self.report = report
            raise
        self._sent_at = time.monotonic()
        now = self.now_ms()
        for pid, end in until.items():
            if end > now:
                self.learned.quarantined[pid] = max(end, self.learned.quarantined.get(pid, 0))
        del tiers  # the next snapshot brings them

    async def refresh(self) -> None:
        """Read the fleet's snapshot again (one round trip)."""
        view = await read_pool(self.calls.client, self.calls.crawl, self.calls.partitions)
        self.view, self._read_at = view, time.monotonic()
        self.learned.forget_before(view.now_ms)

    async def start(self) -> None:
        """The first snapshot, before the consumer's first pick (a Redis error leaves
        the pool empty until `run` reads it: logged)."""
        await self._read()

    async def _read(self) -> None:
        try:
            await self.refresh()
        except REDIS_ERRORS as exc:
            log.warning("redis_error", extra={"during": "proxy_pool", "error": str(exc)[:200]})

    async def run(self, closing: Callable[[], bool]) -> None:
        """Read the snapshot every REFRESH_S until `closing`; a Redis error keeps the
        last one (logged), read again at the next turn."""
        while not closing():
            await asyncio.sleep(REFRESH_S)
            await self._read()


def proxy_pool(settings: ConsumerSettings, queue: CrawlQueue, live: Live,
               metrics: Metrics) -> ProxyPool | None:
    """The pool of a consumer's ``--proxy`` proxies under its crawl's live policy; None
    without proxies (every request goes direct, as without a pool)."""
    if not settings.proxies:
        return None
    calls = ReportCalls(queue.client, queue.crawl, queue.partitions, queue.partition_of,
                        settings.worker_id)
    return ProxyPool(settings.proxies, calls, lambda: live.now.proxies, metrics)
