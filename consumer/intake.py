"""The link intake: URLs a handler found, made into tasks for the queue, cheaply.

A page of a real site links to ~100-300 URLs, most of them the same navigation links
as on every other page. Each is canonicalized, scoped (``--max-depth``,
``--allow-domains``) and fingerprinted here, and only then sent to Redis, which decides
whether it is new (the crawl's dedup). :class:`SeenCache` remembers the URLs this
consumer sent recently, so a link seen again skips all of that and the round trip.
A route's :class:`~common.tasks.request.Request` goes the same way, keeping its method, body,
label, data and headers; the cache remembers it by its unique key (for a GET, its URL),
which is what the queue deduplicates it by, computed here once. It was checked where the
route followed it (``common.spider.context``): the intake checks it no more.

A link that is not cached loses its session ids (and, where its host showed session
tokens fresh per visit, ``common.traps.rules.fresh_tokens``, is deduplicated without them: its
task's unique key) and is judged by the crawl's trap rules
(``common.traps.rules``: its length, path segments, a repeated segment, query parameters), and
by its page: a page's links to its own path that make a faceted search (``trap_facets``)
are refused. A refused one is counted by its rule's fate and tallied for its host, and
marked like an invalid one, but for a facet, which is one only on its page. `admit` then
asks Redis, once per batch, whether each link with a query is a new variant past its
path's limit (``trap_path_variants``, fleet-wide: ``common.traps.book``), sending the
hosts' tallies with the same call.

Redis stays the authority: the cache only ever skips a URL that this process already
sent to the queue's dedup (it is marked after the enqueue returned), so a URL the cache
evicted, or never saw, goes to Redis and is deduplicated there. With a recrawl window
the cache also forgets within half of it, so it never holds back a URL the window lets
in again by more than that.

The scope is the crawl policy's (``max_depth``, ``allow_domains``), read from the
consumer's live snapshot (``consumer.live``) at each batch, and changes while the
consumer runs: a new depth applies to the pages finished after it; new domains (or new
trap rules) also empty the cache, which remembers the links out of the old ones (or
those the old rules refused or rewrote). So are the attempts each
new task gets and the recrawl window (``max_attempts``, ``recrawl_after``): the links of
the pages finished after a change are stamped with the new value; a new window also
empties the cache, whose generations follow it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.hostmodel.hostkey import host_key
from common.observability.metrics import LINK_FATES, NOT_FOLLOWED, Metrics
from common.policy import follows_from
from common.queue import NewTask
from common.queue.calls import new_op_id
from common.redis.connection import RedisClient
from common.redis.errors import REDIS_ERRORS
from common.tasks.request import Request, request_key
from common.tasks.task import Task
from common.traps.book import TrapBook, Variant
from common.traps.rules import (
    FACETS,
    VARIANTS,
    TrapRules,
    fresh_tokens,
    strip_session_ids,
    variant_of,
    without_tokens,
)
from common.urls.canonical import canonicalize, fingerprint

if TYPE_CHECKING:
    from consumer.live import LivePolicy


#: Pages that must show a fresh session token before it is learned for their host.
TOKEN_PAGES = 1


class Tokens(Protocol):
    """Where the session tokens learned per host are kept (``consumer.judgement``)."""

    def tokens(self, host: str) -> Mapping[str, str]: ...

    def learn(self, host: str, rule: str, value: str) -> None: ...


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


@dataclass(frozen=True, slots=True)
class _TrapCall:
    """One call of `LinkIntake.admit` to the trap book, kept as it was sent until it is
    answered."""

    tasks: Sequence[NewTask]
    checks: list[Variant]
    at: list[int]  # the index in `tasks` of each check
    tallies: dict[tuple[str, str], int]
    limit: int
    op: str


class _Marks(list[str]):
    """URLs to remember once enqueued, and the scope they were judged in."""

    __slots__ = ("scope",)

    def __init__(self, scope: int) -> None:
        super().__init__()
        self.scope = scope


class LinkIntake:
    """Turns the URLs handlers returned for finished tasks into new tasks to enqueue,
    as the policy snapshot `policy` returns says at each batch."""

    def __init__(self, metrics: Metrics, policy: Callable[[], LivePolicy], *,
                 cache_size: int, book: TrapBook | None = None,
                 tokens: Tokens | None = None) -> None:
        self.metrics = metrics
        self._policy = policy
        self.book = book  # None: no fleet-wide trap state (path variants, tallies)
        self.tokens = tokens  # None: no session token is learned
        self._candidates: dict[tuple[str, str], int] = {}  # (host, rule) -> pages
        self._tallies: dict[tuple[str, str], int] = {}  # (host, reason) -> n, not sent
        self._unanswered: _TrapCall | None = None  # the last call that got no answer
        now = self._now = policy()
        self.allow_domains = frozenset(now.allow_domains)
        self._traps = now.traps
        # A URL recrawled after the window is not kept out by the cache for more than
        # half of it: each generation lives at most a quarter.
        self.cache = SeenCache(cache_size, max_age_s=now.recrawl_after / 4)
        self._fates = dict.fromkeys(LINK_FATES, 0)
        self._unsaved: dict[str, int] = {}  # NOT_FOLLOWED fates not in the crawl's stats yet
        self.saved_at = 0.0  # monotonic time of the last `save_counts`
        self._scope = 0  # bumped when the domains change

    def _follow(self) -> LivePolicy:
        """The policy snapshot of the moment, taken in if it is new."""
        now = self._policy()
        if now is self._now:
            return now
        self._now = now
        domains = frozenset(now.allow_domains)
        if domains != self.allow_domains or now.traps != self._traps:
            # Links out of the old domains, or refused (or rewritten) by the old trap
            # rules, were remembered as handled: forget them.
            self.cache.clear()
            self.allow_domains = domains
            self._traps = now.traps
            self._scope += 1
        if now.recrawl_after / 4 != self.cache.max_age_s:
            # The cache may hold URLs sent longer ago than the new window allows.
            self.cache.max_age_s = now.recrawl_after / 4
            self.cache.clear()
        return now

    def children(self, found: Iterable[tuple[Task, Sequence[str | Request]]]
                 ) -> tuple[list[NewTask], list[str]]:
        """The new tasks for ``(parent task, its URLs and Requests)`` pairs, and the URLs
        (unique keys) to mark seen once they are enqueued (:meth:`sent`)."""
        now = self._follow()
        out: list[NewTask] = []
        mark = _Marks(self._scope)
        cache, fates = self.cache, self._fates
        attempts, max_depth, traps = now.max_attempts, now.max_depth, now.traps
        batch: set[str] = set()  # canonical URLs already taken in this batch
        for task, urls in found:
            if not urls:
                continue
            if not follows_from(task.depth, max_depth):
                fates["too_deep"] += len(urls)
                continue
            domains = self.allow_domains or frozenset((_host(task.url),))
            facets = traps.facet_links(task.url, [u if isinstance(u, str) else u.url
                                                  for u in urls])
            rules = self._learn(task.url, urls) if traps.session_ids else {}
            for raw in urls:
                if not isinstance(raw, str):
                    child = self._request(raw, task, domains, attempts, traps,
                                          batch=batch, mark=mark, facets=facets,
                                          rules=rules)
                    if child is not None:
                        out.append(child)
                    continue
                if raw in cache or raw in batch:
                    fates["cached"] += 1
                    continue
                url = canonicalize(raw)
                if not isinstance(url, str):
                    fates["invalid"] += 1
                    mark.append(raw)  # invalid whoever links to it
                    continue
                if traps.session_ids:
                    url = strip_session_ids(url)
                key = without_tokens(url, rules) or url
                if key in cache or key in batch:
                    fates["cached"] += 1
                    if url != raw:
                        mark.append(raw)
                    continue
                if not _in_scope(_host(url), domains):
                    fates["out_of_scope"] += 1
                    if self.allow_domains:  # else the scope is the parent's host
                        mark.append(raw)
                    continue
                refused = traps.judge(url) or (FACETS if raw in facets else None)
                if refused is not None:
                    fates[refused] += 1
                    self.tally(host_key(url), refused)
                    if refused != FACETS:  # a trap whoever links to it
                        mark.append(url)
                        if url != raw:
                            mark.append(raw)
                    continue
                batch.add(key)
                mark.append(key)
                if url != raw:
                    mark.append(raw)
                fates["sent"] += 1
                out.append(NewTask(url, fingerprint(key), max_attempts=attempts,
                                   meta=task.meta, depth=task.depth + 1,
                                   unique_key=key if key != url else None))
        return out, mark

    def _request(self, request: Request, parent: Task, domains: frozenset[str],
                 attempts: int, traps: TrapRules, *, batch: set[str],
                 mark: list[str], facets: frozenset[str],
                 rules: Mapping[str, str] | None = None) -> NewTask | None:
        """The task of a Request a handler returned, or None (counted) if it is not one.
        A GET or HEAD is judged by the trap rules like a link (a route's follow of a
        selector's links is one); a request with a body is the handler's own word."""
        fates = self._fates
        url = canonicalize(request.url)
        if not isinstance(url, str):
            fates["invalid"] += 1
            return None
        if not _in_scope(_host(url), domains):
            fates["out_of_scope"] += 1
            return None
        if request.body is None:
            refused = traps.judge(url) or (FACETS if request.url in facets else None)
            if refused is not None:
                fates[refused] += 1
                self.tally(host_key(url), refused)
                return None
        unique = request.unique_key
        if unique is None and request.body is None:  # a session token is not its identity
            unique = without_tokens(url, rules or {})
            if unique is not None:
                request = dataclasses.replace(request, unique_key=unique)
        key = request_key(request.method, url, request.body, unique)
        if key in self.cache or key in batch:
            fates["cached"] += 1
            return None
        # Checked (and frozen) where the route followed it: trusted from here on.
        task = NewTask.from_request(request, url, max_attempts=attempts,
                                    depth=parent.depth + 1, meta=parent.meta, key=key)
        batch.add(key)
        mark.append(key)
        fates["sent"] += 1
        return task
    def _learn(self, page: str, urls: Sequence[str | Request]) -> Mapping[str, str]:
        """The session-token rules of `page`'s host (``common.traps.rules.fresh_tokens``),
        with those its links show (learned once `TOKEN_PAGES` pages showed them)."""
        if self.tokens is None:
            return {}
        host = host_key(page)
        shown = fresh_tokens(page, [u if isinstance(u, str) else u.url for u in urls])
        for rule, value in shown.items():
            seen = self._candidates[(host, rule)] = self._candidates.get((host, rule), 0) + 1
            if seen >= TOKEN_PAGES:
                self.tokens.learn(host, rule, value)
            if len(self._candidates) > 10_000:
                self._candidates.clear()
        return self.tokens.tokens(host)

    def tally(self, host: str, reason: str, n: int = 1) -> None:
        """Count `n` of `host`'s links refused (or pages not followed) for `reason`, for
        the host's trap tallies (sent with the next `admit`)."""
        key = (host, reason)
        self._tallies[key] = self._tallies.get(key, 0) + n

    async def admit(self, tasks: Sequence[NewTask]) -> list[NewTask]:
        """`tasks` (from `children`) but those whose path has had too many query
        variants across the fleet (``trap_path_variants``, counted ``trap_variants``);
        sends the hosts' trap tallies with the same call. Without a `book`: `tasks`.
        After a call that raised, the next sends its tallies again under its operation
        id (the flusher's retry of the batch: the same `tasks`)."""
        if self.book is None:
            self._tallies.clear()
            return list(tasks)
        call = self._unanswered
        if call is None or call.tasks is not tasks:
            if call is not None:  # another batch (the lost one's was given up): its
                for (host, reason), n in call.tallies.items():  # tallies go with it
                    self.tally(host, reason, n)
            call = self._call(tasks)
            if call is None:
                return list(tasks)
        # A call that got no answer is sent again as it was, with its operation id (the
        # flusher's retry of this batch): counted once, if it ran.
        self._unanswered = call
        verdicts = await self.book.judge(call.checks, call.tallies, call.limit, op=call.op)
        self._unanswered = None
        at = call.at
        refused = {at[j] for j, ok in enumerate(verdicts) if not ok}
        if refused:
            self._fates["sent"] -= len(refused)
            self._fates[VARIANTS] += len(refused)
        return [t for i, t in enumerate(tasks) if i not in refused]

    def _call(self, tasks: Sequence[NewTask]) -> _TrapCall | None:
        """The trap call for `tasks` and the tallies so far (taken), or None for none."""
        limit = self._now.traps.path_variants
        checks: list[Variant] = []
        at: list[int] = []
        if limit:
            for i, task in enumerate(tasks):
                variant = variant_of(task.url)
                if variant is not None:
                    checks.append(Variant(host_key(task.url), *variant))
                    at.append(i)
        if not checks and not self._tallies:
            return None
        tallies, self._tallies = self._tallies, {}
        return _TrapCall(tasks, checks, at, tallies, limit, new_op_id())

    def sent(self, mark: Sequence[str]) -> None:
        """The queue has deduplicated these URLs: later copies may skip it (unless the
        domains changed meanwhile: some were marked for being out of the old ones)."""
        self._follow()
        if isinstance(mark, _Marks) and mark.scope != self._scope:
            return
        self.cache.add_all(mark)

    def capped(self, n: int) -> None:
        """Count links dropped past the per-page cap."""
        self._fates["capped"] += n

    def judged(self, outcome: str, n: int) -> None:
        """Count `n` links not followed of a page judged `outcome` (near_duplicate,
        soft_404: consumer.judgement)."""
        self._fates[outcome] += n

    def publish(self) -> None:
        """Fold the tallies into crawlq_links_total (once per flush, not per link), and
        the links not followed into what `save_counts` adds to the crawl's stats."""
        for fate, n in self._fates.items():
            if n:
                self.metrics.links(fate, n)
                self._fates[fate] = 0
                if fate in NOT_FOLLOWED:
                    self._unsaved[fate] = self._unsaved.get(fate, 0) + n

    async def save_counts(self, client: RedisClient, stats: str) -> None:
        """Add the links not followed since the last call (too_deep, out_of_scope, a trap
        rule's, ...) to the crawl's `stats` HASH as ``links:<fate>``: one pipelined round
        trip, kept for the next call when Redis fails."""
        self.saved_at = time.monotonic()
        fates, self._unsaved = self._unsaved, {}
        if not fates:
            return
        try:
            async with client.pipeline(transaction=False) as pipe:
                for fate, n in fates.items():
                    pipe.hincrby(stats, f"links:{fate}", n)
                await pipe.execute()
        except REDIS_ERRORS:
            for fate, n in fates.items():
                self._unsaved[fate] = self._unsaved.get(fate, 0) + n


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
