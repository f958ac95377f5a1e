"""The crawl's policy as this consumer applies it: one immutable snapshot (`LivePolicy`)
held by `Live`, replaced whole each time the policy is read (at start, on a policy
message, when a lease reply names a newer version, and at every heartbeat: a fallback
for a lost message).

Whatever uses a value reads the snapshot of the moment when it uses it: the consumer's
parts through `PolicyReader.now` (the content types, robots.txt's rule, push-back
outcomes, adaptive timing, the longest Crawl-delay), the fetcher (its user agent), the
robots.txt cache (its user agent and TTL) and the link intake (its scope, the attempts
and recrawl window of its tasks) through the `Live` they were given. The queue's retry
policy and recrawl window are assigned in `PolicyReader.read`, the one place: the queue
reads them at each fail, reclaim and enqueue call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import ConfigError
from common.policy import OPTIONS, CrawlPolicy, read_values
from common.proxies import ProxyRules
from common.proxies.bans import Blocked
from common.proxies.sessions import SessionRules
from common.queue import CrawlQueue, DedupMode
from common.redis.errors import REDIS_ERRORS
from common.traps.rules import TrapRules
from consumer.config import ConsumerSettings
from consumer.stopping import Stopping

log = logging.getLogger("consumer")


@dataclass(frozen=True, slots=True)
class LivePolicy:
    """One read of the crawl's policy, as this consumer applies it."""

    version: int  # -1: none read yet (this consumer's flags)
    accept: tuple[str, ...]  # media types whose bodies are read (empty: all)
    ignore_robots: bool
    backoff_on: tuple[str, ...]  # the outcomes that count as push-back
    adaptive: bool  # acks carry response times (adaptive_delay is on)
    max_crawl_delay: float  # the longest Crawl-delay obeyed (0: any)
    user_agent: str  # every request's, robots.txt's included
    robots_ttl: float  # seconds a fetched robots.txt is trusted
    max_depth: int  # the deepest link depth enqueued
    allow_domains: tuple[str, ...]  # where links may go (empty: each page's own host)
    max_attempts: int  # stamped on each link's task
    recrawl_after: int  # the links' recrawl window, s (0: none)
    revisits: bool  # the crawl keeps each URL's history: each fetch notes what it observed
    conditional: bool  # a recrawl sends its URL's validators
    traps: TrapRules  # the links refused as crawler traps
    near_duplicate_distance: int  # bits a near duplicate's fingerprint may differ (-1: off)
    soft_404: bool  # hosts are probed for soft 404s
    drop_judged_items: bool  # a near duplicate's or soft 404's items are dropped
    proxies: ProxyRules  # the proxy pool's tiers, bans and quarantines
    bans: Blocked  # what a blocked answer looks like (the crawl's rules)
    sessions: SessionRules  # a host's pool of sessions, and their usage count

    @classmethod
    def of_flags(cls, settings: ConsumerSettings) -> LivePolicy:
        """What the consumer applies until it has read the crawl's policy."""
        return cls(-1, settings.accept_content_type, settings.ignore_robots,
                   OPTIONS["backoff_on"].default, False, OPTIONS["max_crawl_delay"].default,
                   settings.fetch.user_agent, settings.robots_ttl_s, settings.max_depth,
                   settings.allow_domains, OPTIONS["max_attempts"].default,
                   OPTIONS["recrawl_after"].default, False, OPTIONS["conditional"].default,
                   CrawlPolicy().trap_rules(), OPTIONS["near_duplicate_distance"].default,
                   OPTIONS["soft_404"].default, OPTIONS["drop_judged_items"].default,
                   CrawlPolicy().proxy_rules(), CrawlPolicy().ban_rules(),
                   CrawlPolicy().session_rules())

    @classmethod
    def of(cls, version: int, policy: CrawlPolicy, recrawl_after: int) -> LivePolicy:
        """`policy` as applied, with the links' window `recrawl_after` (the policy's, or
        none on a bloom crawl)."""
        return cls(version, policy.accept_content_type, policy.ignore_robots,
                   policy.backoff_on, policy.adaptive_delay > 0, policy.max_crawl_delay,
                   policy.user_agent, policy.robots_ttl, policy.max_depth,
                   policy.allow_domains, policy.max_attempts, recrawl_after,
                   policy.keeps_history, policy.conditional, policy.trap_rules(),
                   policy.near_duplicate_distance, policy.soft_404, policy.drop_judged_items,
                   policy.proxy_rules(), policy.ban_rules(), policy.session_rules())


class Live:
    """This consumer's policy snapshot of the moment, replaced whole by its reader; the
    robots.txt cache and link intake call it, the fetcher calls `user_agent`."""

    __slots__ = ("now",)

    def __init__(self, now: LivePolicy) -> None:
        self.now = now

    def __call__(self) -> LivePolicy:
        return self.now

    def user_agent(self) -> str:
        return self.now.user_agent


class PolicyReader:
    """Reads the crawl's policy into `live`, one read at a time."""

    def __init__(self, queue: CrawlQueue, live: Live, *, stopping: Stopping,
                 on_change: Callable[[], None]) -> None:
        self.live = live
        self.queue = queue
        self.stopping = stopping
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._named = -1  # the newest version a lease reply named

    @property
    def now(self) -> LivePolicy:
        """The snapshot of the moment."""
        return self.live.now

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The read under way after a change, if any (shutdown cancels it)."""
        return self._task

    async def read(self) -> None:
        """Read the crawl's policy (one HGETALL) into a new snapshot, and give the queue
        its retry policy and recrawl window; on a Redis error keep what it had (the next
        heartbeat reads it again)."""
        try:
            await self.load()
        except REDIS_ERRORS as exc:
            log.warning("redis_error", extra={"during": "policy", "error": str(exc)[:200]})

    async def load(self) -> None:
        """`read`, raising a Redis error (a consumer's start-up waits it out)."""
        try:
            stored = await read_values(self.queue.client, self.queue.crawl)
        except ConfigError as exc:  # a stored value this crawlq can't read
            log.warning("crawl_policy_unreadable", extra={"error": str(exc)[:200]})
            return
        if stored is None or stored.version == self.now.version:
            return
        policy = stored.policy
        recrawl_after = self._recrawl_after(policy.recrawl_after)
        self.live.now = LivePolicy.of(stored.version, policy, recrawl_after)
        # The queue reads these at each fail, reclaim and enqueue call: the next one
        # takes them.
        self.queue.configure(retry=policy.retry(), recrawl_after_s=recrawl_after,
                             revisits=policy.keeps_history,
                             render_all=policy.rendering != "off",
                             adaptive=policy.rendering == "auto")
        texts = policy.texts()
        log.info("crawl_policy_applied", extra={
            "version": stored.version,
            "accept_content_type": ",".join(self.now.accept) or "*/*",
            "per_host_delay": policy.per_host_delay,
            "per_host_concurrency": policy.per_host_concurrency,
            **{k: texts[k] for k in ("user_agent", "ignore_robots", "robots_ttl",
                                     "max_depth", "allow_domains", "retry_base",
                                     "retry_cap", "max_retry_after", "max_stalls",
                                     "max_attempts", "recrawl_after")}})

    def _recrawl_after(self, window: int) -> int:
        """The policy's recrawl window for the links this consumer enqueues; none on a
        bloom crawl (no timestamps: the policy was set before the crawl was created)."""
        if window and self.queue.settings.dedup is DedupMode.BLOOM:
            log.warning("crawl_policy_not_applied", extra={
                "key": "recrawl_after", "value": f"{window}s",
                "advice": "this crawl uses bloom dedup, which keeps no timestamps: links "
                          "are enqueued without a recrawl window. Set recrawl_after=0 with "
                          f"crawlq crawl set --crawl {self.queue.crawl} recrawl_after=0"})
            return 0
        return window

    def named(self, version: int) -> None:
        """A lease reply named the policy `version` its partition holds: read the policy
        again if that is newer than the one read (and than the last one named)."""
        if version > max(self.now.version, self._named):
            self._named = version
            self.changed()

    def changed(self) -> None:
        """The policy changed (a policy message, or a lease reply naming a newer version):
        read it again, one read at a time (a change during a read gets one more); and
        lease again now: the change may have moved hosts' turns earlier."""
        self._on_change()
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._read_again())

    async def _read_again(self) -> None:
        self._again = True
        while self._again and not self.stopping.closing:
            self._again = False
            await self.read()
