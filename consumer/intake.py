"""The link intake: URLs a handler found, made into tasks for the queue, cheaply.

A page of a real site links to ~100-300 URLs, most of them the same navigation links
as on every other page. Each is canonicalized, scoped (``--max-depth``,
``--allow-domains``) and fingerprinted here, and only then sent to Redis, which decides
whether it is new (the crawl's dedup). :class:`SeenCache` remembers the URLs this
consumer sent recently, so a link seen again skips all of that and the round trip.

Redis stays the authority: the cache only ever skips a URL that this process already
sent to the queue's dedup (it is marked after the enqueue returned), so a URL the cache
evicted, or never saw, goes to Redis and is deduplicated there. With a recrawl window
the cache also forgets within half of it, so it never holds back a URL the window lets
in again by more than that.

The scope is the crawl policy's (``max_depth``, ``allow_domains``) and changes while the
consumer runs (`LinkIntake.set_scope`): a new depth applies to the pages finished after
it; new domains also empty the cache, which remembers the links out of the old ones. So
are the attempts each new task gets and the recrawl window (``max_attempts``,
``recrawl_after``; `LinkIntake.set_tasks`): the links of the pages finished after a change
are stamped with the new value; a new window also empties the cache, whose generations
follow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from common.metrics import LINK_FATES, Metrics
from common.queue import NewTask
from common.task import DEFAULT_MAX_ATTEMPTS, Task
from common.urls import canonicalize, fingerprint


class SeenCache:
    """A bounded set of recently sent URLs: two generations of at most ``size // 2``
    each; when the newer fills (or is older than ``max_age_s``), the older is dropped.
    O(1) per lookup, no per-entry bookkeeping, memory at most ``size`` strings."""

    def __init__(self, size: int, *, max_age_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._half = max(1, size // 2) if size > 0 else 0
        self.max_age_s = max_age_s
        self._clock = clock
        self._new: set[str] = set()
        self._old: set[str] = set()
        self._born = clock()

    def __contains__(self, url: object) -> bool:
        return url in self._new or url in self._old

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def add_all(self, urls: Iterable[str]) -> None:
        """Remember these URLs (they were just sent to the queue's dedup)."""
        if not self._half:
            return
        if self.max_age_s and self._clock() - self._born > self.max_age_s:
            self._rotate()
        new = self._new
        for url in urls:
            new.add(url)
            if len(new) >= self._half:
                self._rotate()
                new = self._new

    def clear(self) -> None:
        """Forget every URL."""
        self._old, self._new = set(), set()
        self._born = self._clock()

    def _rotate(self) -> None:
        self._old, self._new = self._new, set()
        self._born = self._clock()


class _Marks(list[str]):
    """URLs to remember once enqueued, and the scope they were judged in."""

    __slots__ = ("scope",)

    def __init__(self, scope: int) -> None:
        super().__init__()
        self.scope = scope


class LinkIntake:
    """Turns the URLs handlers returned for finished tasks into new tasks to enqueue."""

    def __init__(self, metrics: Metrics, *, max_depth: int, allow_domains: Sequence[str],
                 cache_size: int, recrawl_after_s: float = 0.0,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.metrics = metrics
        self.max_depth = max_depth
        self.allow_domains = frozenset(allow_domains)
        self.max_attempts = max_attempts
        # A URL recrawled after the window is not kept out by the cache for more than
        # half of it: each generation lives at most a quarter.
        self.cache = SeenCache(cache_size, max_age_s=recrawl_after_s / 4)
        self._fates = dict.fromkeys(LINK_FATES, 0)
        self._scope = 0  # bumped when the domains change

    def set_scope(self, max_depth: int, allow_domains: Sequence[str]) -> None:
        """Take links up to `max_depth` into `allow_domains` (none: each page's own host)
        from the next batch on."""
        self.max_depth = max_depth
        domains = frozenset(allow_domains)
        if domains != self.allow_domains:
            # Links out of the old domains were remembered as handled: forget them.
            self.cache.clear()
            self.allow_domains = domains
            self._scope += 1

    def set_tasks(self, max_attempts: int, recrawl_after_s: float) -> None:
        """Give the new tasks `max_attempts` each, and follow a recrawl window of
        `recrawl_after_s` (0: none), from the next batch on."""
        self.max_attempts = max_attempts
        if recrawl_after_s / 4 != self.cache.max_age_s:
            # The cache may hold URLs sent longer ago than the new window allows.
            self.cache.max_age_s = recrawl_after_s / 4
            self.cache.clear()

    def children(self, found: Iterable[tuple[Task, Sequence[str]]]
                 ) -> tuple[list[NewTask], list[str]]:
        """The new tasks for ``(parent task, its URLs)`` pairs, and the URLs to mark seen
        once they are enqueued (:meth:`sent`)."""
        out: list[NewTask] = []
        mark = _Marks(self._scope)
        cache, fates, attempts = self.cache, self._fates, self.max_attempts
        batch: set[str] = set()  # canonical URLs already taken in this batch
        for task, urls in found:
            if not urls or task.depth + 1 > self.max_depth:
                continue
            domains = self.allow_domains or frozenset((_host(task.url),))
            for raw in urls:
                if raw in cache or raw in batch:
                    fates["cached"] += 1
                    continue
                url = canonicalize(raw)
                if not isinstance(url, str):
                    fates["invalid"] += 1
                    mark.append(raw)  # invalid whoever links to it
                    continue
                if url in cache or url in batch:
                    fates["cached"] += 1
                    if url != raw:
                        mark.append(raw)
                    continue
                if not _in_scope(_host(url), domains):
                    fates["out_of_scope"] += 1
                    if self.allow_domains:  # else the scope is the parent's host
                        mark.append(raw)
                    continue
                batch.add(url)
                mark.append(url)
                if url != raw:
                    mark.append(raw)
                fates["sent"] += 1
                out.append(NewTask(url, fingerprint(url), max_attempts=attempts,
                                   meta=task.meta, depth=task.depth + 1))
        return out, mark

    def sent(self, mark: Sequence[str]) -> None:
        """The queue has deduplicated these URLs: later copies may skip it (unless the
        domains changed meanwhile: some were marked for being out of the old ones)."""
        if isinstance(mark, _Marks) and mark.scope != self._scope:
            return
        self.cache.add_all(mark)

    def capped(self, n: int) -> None:
        """Count links dropped past the per-page cap."""
        self._fates["capped"] += n

    def publish(self) -> None:
        """Fold the tallies into crawlq_links_total (once per flush, not per link)."""
        for fate, n in self._fates.items():
            if n:
                self.metrics.links(fate, n)
                self._fates[fate] = 0


def _in_scope(host: str, domains: frozenset[str]) -> bool:
    """Whether `host` is one of `domains` or a subdomain of one: a lookup per label, not
    per domain (a fleet may allow thousands)."""
    while True:
        if host in domains:
            return True
        dot = host.find(".")
        if dot < 0:
            return False
        host = host[dot + 1:]


def _host(url: str) -> str:
    """The host of an http(s) URL (no port, no userinfo), lowercase as canonical URLs
    carry it; cheaper than a URL parse."""
    authority = url.partition("://")[2]
    for stop in "/?#":
        authority = authority.partition(stop)[0]
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        return authority[: authority.find("]") + 1].lower()
    return authority.partition(":")[0].lower()
