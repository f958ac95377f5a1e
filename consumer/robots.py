"""robots.txt for the consumer fleet: fetched once per origin, cached in Redis and in-process.

`RobotsCache.check(url)` answers "may we fetch this URL, and how slowly?" as a
`RobotsVerdict`. robots.txt is parsed with Protego (the Scrapy project's parser) rather
than `urllib.robotparser`: urllib's parser ignores ``*``/``$`` wildcards and applies the
first matching rule instead of the longest one, so ``Allow: /private/open`` under
``Disallow: /private/`` and ``Disallow: /*.pdf$`` both come out wrong. Protego follows
RFC 9309 / Google (wildcards, longest match wins, Allow wins a tie) and also reads
Crawl-delay, Request-rate and Sitemap.

Where a verdict comes from, cheapest first:

1. an in-process LRU (`local_size` origins) of parsed robots.txt, each entry kept as long
   as its Redis copy lives: a known origin costs no Redis call;
2. concurrent coroutines of one process asking for the same unknown origin share one
   lookup (one task per origin);
3. the fleet-wide Redis copy ``CrawlKeys.robots(origin)``, a STRING holding JSON
   ``{"status": int, "body": str, "fetched_at": unix s}`` (plus ``"error"`` after a failed
   fetch) with EX `ttl_s`;
4. on a miss, the lock ``<key>:lock`` (SET NX PX lock_ms, in the same script that read
   the copy: ``common/lua/robots_claim.lua``, one round trip) picks the one consumer that
   fetches ``<origin>/robots.txt`` through the given `Fetcher` (so the SSRF guard,
   timeouts and body cap apply) and writes the Redis copy, releasing the lock in the same
   round trip; the others poll the Redis copy every 100 ms and take the lock over if it
   is released or expires without a copy being written.

What a robots.txt fetch means:

| robots.txt fetch | verdict | cached for |
| --- | --- | --- |
| 2xx | parse the body: its first 512 KiB (Google's limit, cut at the last line break), UTF-8, invalid bytes replaced, BOM dropped | `ttl_s` |
| 3xx | followed by the fetcher (up to its `max_redirects`, 5) | as the final answer |
| 404, 410 and every other 4xx except 429; a 3xx without Location | allow all | `ttl_s` |
| too many redirects, a redirect loop, a bad redirect target (RFC 9309: "unavailable") | allow all | `ttl_s` |
| body over the fetcher's `max_body_bytes` (`body_too_large`: nothing to parse) | allow all | `ttl_s` |
| a status outside 100-599 (`bad_status`) | allow all | `ttl_s` |
| 429, 408, 5xx, timeout, connection error, malformed response | `FetchError("robots_unavailable", retryable=True)`, `retry_after` = time left in the cache | 60 s (`failure_ttl_s`), so the task is retried with backoff instead of being marked disallowed |
| `ssrf_blocked` (the origin resolves to a refused address), any other permanent fetcher error | that `FetchError` re-raised as is (permanent) | not cached |
| a body that is not robots.txt (HTML, binary garbage) | whatever Protego makes of it (usually allow all); content never raises | `ttl_s` |
| the URL asked about is not an absolute http(s) URL | `FetchError("bad_url", retryable=False)` | - |

Crawl-delay is Protego's ``crawl_delay(agent)``; without one, a ``Request-rate: n/s``
gives ``s / n`` seconds. Groups are matched on the product token of `user_agent` (its
first word up to ``/``: ``crawlq`` for ``crawlq/0.1 (+https://...)``), so a group for a
word that merely appears in our full User-Agent string (``github``) does not apply to us.
The user agent and the TTL (``robots_ttl``) are read from the consumer's live policy
snapshot (``consumer.live``) at each use, and the crawl policy may change them while a
consumer runs: what is cached is the parsed robots.txt, the same for every agent, and
each verdict, Crawl-delay included, is judged for the agent of the moment; the copies
fetched after a new TTL get it, a copy read from Redis lives no longer than it
in-process, and a copy already cached keeps its expiry.
"""  # noqa: E501

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from protego import Protego
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError
from yarl import URL

from common import codec, reasons
from common.errors import ConfigError, FetchError, RedisUnavailableError
from common.fleet.locks import TokenLocks
from common.keys import CrawlKeys
from common.policy import product_token
from common.redis.connection import RedisClient
from common.redis.scripts import register

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from common.http.fetcher import Fetcher
    from common.queue import Lease
    from consumer.live import LivePolicy

__all__ = ["MAX_ROBOTS_BYTES", "RobotsCache", "RobotsVerdict", "product_token", "read_ahead"]

log = logging.getLogger(__name__)

#: What a lookup runs: after a Redis error the task is handed back, and its next lease
#: runs them again (common/redis/resend.py: each may run twice).
ROBOTS_SCRIPTS = ("robots_claim", "release_lock")

MAX_ROBOTS_BYTES = 512 * 1024  # Google parses the first 500 KiB; RFC 9309 asks for >= 500 KiB
POLL_INTERVAL_S = 0.1
#: What a lookup's robots.txt request awaits as its headers go out (`Fetcher.fetch`).
OnSent = Callable[[], Awaitable[None]]
# Fetcher errors after which robots.txt counts as unavailable (RFC 9309 2.3.1.3): allow all.
_ALLOW_ALL_REASONS = frozenset({
    reasons.TOO_MANY_REDIRECTS, reasons.REDIRECT_LOOP, reasons.BAD_REDIRECT,
    reasons.BODY_TOO_LARGE, reasons.BAD_STATUS,
})



@dataclass(frozen=True, slots=True)
class RobotsVerdict:
    """Whether our user agent may fetch a URL, and the origin's crawl delay for it."""

    allowed: bool
    crawl_delay: float | None  # seconds, from Crawl-delay (or Request-rate), for our user agent


class RobotsDoc(TypedDict):
    """The JSON stored at ``CrawlKeys.robots(origin)``."""

    status: int  # HTTP status of the final response; 0 when there was none
    body: str  # the (capped, decoded) robots.txt; "" unless 2xx
    fetched_at: float  # unix seconds
    error: NotRequired[str]  # "<reason>: <message>" of a failed fetch: robots_unavailable
    note: NotRequired[str]  # why robots.txt counts as absent (fetcher reason), for humans


@dataclass(slots=True)
class _Entry:
    """One origin in the in-process cache."""

    robots: Protego | None  # None: allow all
    crawl_delay: float | None  # for `agent`
    error: str | None  # set: robots.txt unavailable, raise robots_unavailable
    expires: float  # time.monotonic()
    fetched: bool = False  # made by a fetch over HTTP in this process (not read from Redis)
    agent: str = ""  # the product token `crawl_delay` was read for


_ALLOW_ALL = RobotsVerdict(allowed=True, crawl_delay=None)


def origin_of(url: str) -> tuple[str, str]:
    """``(scheme://host[:port], path?query)`` of an absolute http(s) URL; FetchError bad_url.

    Host lowercased and IDNA-encoded, default port dropped, userinfo and fragment dropped.
    """
    try:
        parsed = URL(url)
        scheme = parsed.scheme
        host = parsed.raw_host
        origin = str(parsed.origin())
        path = parsed.raw_path_qs
    except (ValueError, TypeError):
        raise FetchError(reasons.BAD_URL, f"malformed URL {url[:200]!r}", retryable=False) from None
    if scheme not in ("http", "https") or not host:
        raise FetchError(reasons.BAD_URL, f"not an http(s) URL: {url[:200]!r}", retryable=False)
    return origin, path or "/"


def decode_body(body: bytes) -> str:
    """The part of a robots.txt body we parse: first MAX_ROBOTS_BYTES, whole lines, as text."""
    if len(body) > MAX_ROBOTS_BYTES:
        body = body[:MAX_ROBOTS_BYTES]
        cut = body.rfind(b"\n")
        if cut != -1:
            body = body[: cut + 1]
    return body.decode("utf-8-sig", errors="replace")


def _doc_entry(doc: RobotsDoc, ttl_s: float, agent: str) -> _Entry:
    """A fetched robots.txt (`doc`) parsed for `agent`, trusted for `ttl_s`."""
    expires = time.monotonic() + ttl_s
    error = doc.get("error")
    if error is not None:
        return _Entry(None, None, error, expires)
    status = doc["status"]
    if not 200 <= status < 300:
        return _Entry(None, None, None, expires)
    try:
        robots = Protego.parse(doc["body"])
        delay = _crawl_delay(robots, agent)
    except Exception as exc:  # content must never fail a crawl: treat as no robots.txt
        log.warning("robots_unparseable", extra={"error": repr(exc)[:200]})
        return _Entry(None, None, None, expires)
    return _Entry(robots, delay, None, expires, agent=agent)


class _Copies:
    """The process's robots.txt copies by origin: least recently used out past `size`,
    an expired one gone when asked for."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_origin: OrderedDict[str, _Entry] = OrderedDict()

    def get(self, origin: str) -> _Entry | None:
        by_origin = self._by_origin
        entry = by_origin.get(origin)
        if entry is None:
            return None
        if entry.expires <= time.monotonic():
            del by_origin[origin]
            return None
        by_origin.move_to_end(origin)
        return entry

    def put(self, origin: str, entry: _Entry) -> None:
        by_origin = self._by_origin
        by_origin[origin] = entry
        by_origin.move_to_end(origin)
        while len(by_origin) > self.size:
            by_origin.popitem(last=False)


class RobotsCache:
    """robots.txt verdicts for one crawl, shared by every consumer through Redis.

    `policy` returns the snapshot whose ``user_agent`` (our User-Agent, or just its
    product token) and ``robots_ttl`` apply; see the module docstring. `failure_ttl_s`
    bounds how long a failed fetch is remembered (never longer than the TTL). Keep
    `lock_ms` above the fetcher's `total_timeout`, or a slow fetch lets a second consumer
    take the lock over and fetch too. Call `close()` at shutdown to cancel lookups still
    in flight.
    """

    def __init__(
        self,
        redis: RedisClient,
        crawl: str,
        fetcher: Fetcher,
        *,
        policy: Callable[[], LivePolicy],
        local_size: int = 10_000,
        lock_ms: int = 30_000,
        failure_ttl_s: float = 60.0,
    ) -> None:
        if not failure_ttl_s > 0:
            raise ConfigError("robots failure_ttl_s must be > 0")
        if local_size < 1 or lock_ms < 1:
            raise ConfigError("robots local_size and lock_ms must be >= 1")
        self._redis = redis
        self._keys = CrawlKeys.build(crawl)
        self._fetcher = fetcher
        self._policy = policy
        self._user_agent = policy().user_agent
        self._agent = product_token(self._user_agent)
        self._failure_ttl_s = failure_ttl_s
        self.lock_ms = lock_ms
        self._local = _Copies(local_size)
        self._inflight: dict[str, asyncio.Task[_Entry]] = {}
        self._warming: set[asyncio.Future[None]] = set()
        self._locks = TokenLocks(redis)
        self._claim = register(redis, "robots_claim")
        self._release = register(redis, "release_lock")

    async def check(self, url: str) -> RobotsVerdict:
        """The verdict for `url`; raises FetchError robots_unavailable (retryable),
        ssrf_blocked or bad_url (permanent), RedisUnavailableError."""
        verdict = (await self.lookup(url))[0]
        if isinstance(verdict, FetchError):
            raise verdict
        return verdict

    async def lookup(self, url: str, *, on_sent: OnSent | None = None
                     ) -> tuple[RobotsVerdict | FetchError, bool]:
        """The verdict for `url` (a cached robots_unavailable FetchError is returned, not
        raised), and whether this call fetched robots.txt over HTTP itself: that request
        took the turn of the task that asked, at its host. `on_sent` is that request's
        (`Fetcher.fetch`: the caller's turn, it may wait, or raise to send none); it is
        this call's only if this call started the lookup. Raises like `check` otherwise."""
        origin, path = origin_of(url)
        entry = self._local.get(origin)
        fetched = False
        if entry is None:
            entry, fetched = await self._shared_lookup(origin, on_sent)
        try:
            return self._verdict(entry, path), fetched
        except FetchError as exc:
            if not fetched:
                raise
            return exc, fetched

    def cached(self, url: str) -> RobotsVerdict | None:
        """The verdict for `url` if this process holds its origin's robots.txt, else None
        (`check` looks it up); raises like `check` for a cached failure."""
        origin, path = origin_of(url)
        entry = self._local.get(origin)
        return None if entry is None else self._verdict(entry, path)

    def warm_soon(self, urls: Iterable[str]) -> None:
        """`warm` these URLs' origins in a task of its own when this process lacks some
        (`close` cancels it)."""
        origins = self._missing(urls)
        if origins:
            task = asyncio.ensure_future(self._read_copies(origins))
            self._warming.add(task)
            task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Future[None]) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("robots_warm_failed", extra={"error": repr(task.exception())[:200]})

    async def warm(self, urls: Iterable[str]) -> None:
        """Read the fleet's copies of these URLs' robots.txt that this process lacks into
        it, in one round trip, reading nothing else: a page leased for its turn ahead
        then finds its verdict here when the turn comes, and goes on time instead of
        late (a late request waits for a turn of its own). A copy Redis lacks is left to
        `lookup` at the turn; a failed read is only a missed hint."""
        origins = self._missing(urls)
        if origins:
            await self._read_copies(origins)

    def _missing(self, urls: Iterable[str]) -> list[str]:
        """The origins of these URLs this process holds no robots.txt of, nor looks up."""
        origins: dict[str, None] = {}
        for url in urls:
            try:
                origin = origin_of(url)[0]
            except FetchError:
                continue
            if origin not in self._inflight and self._local.get(origin) is None:
                origins[origin] = None
        return list(origins)

    async def _read_copies(self, origins: list[str]) -> None:
        keys = [self._keys.robots(o) for o in origins]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.get(key)
                    pipe.pttl(key)
                replies = await pipe.execute()
        except (RedisConnectionError, RedisTimeoutError):
            return
        for i, origin in enumerate(origins):
            raw, pttl = replies[2 * i], replies[2 * i + 1]
            if raw is None or origin in self._inflight or self._local.get(origin):
                continue
            entry = self._entry_of(keys[i], raw, int(pttl))
            if entry is not None:
                self._local.put(origin, entry)

    @property
    def agent(self) -> str:
        """The product token robots.txt groups are matched on: the user agent's of the
        moment (a new one judges cached robots.txt again, fetches none)."""
        user_agent = self._policy().user_agent
        if user_agent != self._user_agent:
            self._agent = product_token(user_agent)
            self._user_agent = user_agent
        return self._agent

    @property
    def ttl_s(self) -> float:
        """How long robots.txt is trusted: the copies fetched from now on, and those read
        from Redis (never longer than it); a copy already held keeps its expiry."""
        return self._policy().robots_ttl

    @property
    def failure_ttl_s(self) -> float:
        """How long a failed fetch is remembered."""
        return min(self._failure_ttl_s, self.ttl_s)

    async def close(self) -> None:
        """Cancel lookups in flight (their callers get CancelledError) and reads of
        copies (`warm_soon`), and forget them."""
        tasks: list[asyncio.Future[Any]] = [*self._inflight.values(), *self._warming]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
        self._warming.clear()

    # --- in-process -----------------------------------------------------------------------

    def _verdict(self, entry: _Entry, path: str) -> RobotsVerdict:
        if entry.error is not None:
            raise FetchError(
                reasons.ROBOTS_UNAVAILABLE,
                entry.error,
                retryable=True,
                retry_after=max(0.0, entry.expires - time.monotonic()),
            )
        robots = entry.robots
        if robots is None:
            return _ALLOW_ALL
        agent = self.agent
        if entry.agent != agent:  # read for another agent (the policy changed it)
            entry.crawl_delay, entry.agent = _crawl_delay(robots, agent), agent
        return RobotsVerdict(robots.can_fetch(path, agent), entry.crawl_delay)

    async def _shared_lookup(self, origin: str, on_sent: OnSent | None
                             ) -> tuple[_Entry, bool]:
        """The entry, and whether this caller started a lookup that fetched over HTTP."""
        task = self._inflight.get(origin)
        started = task is None
        if task is None:
            task = asyncio.create_task(self._lookup(origin, on_sent),
                                       name=f"robots {origin}")
            self._inflight[origin] = task
            task.add_done_callback(lambda t: self._lookup_done(origin, t))
        # shield: one caller being cancelled must not cancel the lookup the others await.
        entry = await asyncio.shield(task)
        return entry, started and entry.fetched

    def _lookup_done(self, origin: str, task: asyncio.Task[_Entry]) -> None:
        if self._inflight.get(origin) is task:
            del self._inflight[origin]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning if every caller left

    # --- Redis and the fetch ---------------------------------------------------------------

    async def _lookup(self, origin: str, on_sent: OnSent | None) -> _Entry:
        try:
            entry = await self._lookup_redis(origin, on_sent)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailableError(f"robots cache for {origin}: {exc}") from exc
        self._local.put(origin, entry)
        return entry

    async def _lookup_redis(self, origin: str, on_sent: OnSent | None) -> _Entry:
        key = self._keys.robots(origin)
        lock = f"{key}:lock"
        deadline = time.monotonic() + self.lock_ms / 1000 + 1.0
        token = secrets.token_hex(8)
        while True:
            # The copy, or the lock when nobody holds it: one round trip (a lookup is
            # per origin, and a wide crawl's origins are most of its pages).
            raw, pttl, locked = await self._claim(keys=[key, lock], args=[token, self.lock_ms])
            if raw is not None:
                entry = self._entry_of(key, raw, int(pttl))
                if entry is not None:
                    return entry
            if int(locked):
                stored = False
                try:
                    # A wait in on_sent outlasting lock_ms lets a second consumer fetch
                    # it too (under a turn of its own): a copy more, never a rude one.
                    entry = await self._fetch_and_store(origin, key, lock, token, on_sent)
                    stored = True
                    return entry
                finally:
                    if not stored:
                        await self._unlock(lock, token)
            if time.monotonic() >= deadline:
                raise FetchError(
                    reasons.ROBOTS_UNAVAILABLE,
                    f"timed out waiting for another consumer to fetch {origin}/robots.txt",
                    retryable=True,
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    def _entry_of(self, key: str, raw: Any, pttl: int) -> _Entry | None:
        """The Redis copy as an entry living as long as it does, or None (corrupt)."""
        doc = _parse_doc(raw)
        if doc is None:
            log.warning("robots_cache_corrupt", extra={"key": key})
            return None
        ttl_s = self.ttl_s
        return _doc_entry(doc, ttl_s if pttl < 0 else min(pttl / 1000, ttl_s), self.agent)

    async def _fetch_and_store(self, origin: str, key: str, lock: str, token: str,
                               on_sent: OnSent | None = None) -> _Entry:
        """Fetch robots.txt, then write the fleet's copy and release the lock (one round
        trip); ssrf_blocked propagates, uncached (the caller releases the lock)."""
        doc = await self._fetch(origin, on_sent)
        ttl_s = self.failure_ttl_s if "error" in doc else self.ttl_s
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(key, codec.dumps(doc), px=max(1, int(ttl_s * 1000)))
            # EVALSHA itself: a script registered on a pipeline costs a SCRIPT EXISTS
            # round trip first. Unloaded (a restarted Redis), it is unlocked on its own.
            pipe.evalsha(self._release.script.sha, 1, lock, token)
            stored, unlocked = await pipe.execute(raise_on_error=False)
        if isinstance(stored, Exception):
            raise stored
        if isinstance(unlocked, NoScriptError):
            await self._unlock(lock, token)
        elif isinstance(unlocked, Exception):
            raise unlocked
        entry = _doc_entry(doc, ttl_s, self.agent)
        entry.fetched = True
        return entry

    async def _fetch(self, origin: str, on_sent: OnSent | None) -> RobotsDoc:
        url = f"{origin}/robots.txt"
        now = time.time()
        try:
            result = await self._fetcher.fetch(url, on_sent=on_sent)
        except FetchError as exc:
            if exc.reason in _ALLOW_ALL_REASONS:
                log.info("robots_absent", extra={"origin": origin, "reason": exc.reason})
                return {"status": exc.status or 0, "body": "", "fetched_at": now,
                        "note": exc.reason}
            if not exc.retryable:  # ssrf_blocked, bad_url: the page itself can't be had
                raise
            log.info("robots_unavailable", extra={"origin": origin, "reason": exc.reason})
            return {"status": exc.status or 0, "body": "", "fetched_at": now,
                    "error": f"{url}: {exc}"}
        status = result.status
        body = decode_body(result.body) if 200 <= status < 300 else ""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("robots_fetched", extra={"origin": origin, "status": status,
                                               "bytes": len(result.body)})
        return {"status": status, "body": body, "fetched_at": now}

    async def _unlock(self, lock: str, token: str) -> None:
        try:
            await self._locks.release(lock, token)
        except (RedisConnectionError, RedisTimeoutError) as exc:  # it expires by itself
            log.warning("robots_unlock_failed", extra={"key": lock, "error": str(exc)})


def read_ahead(robots: RobotsCache | None, policy: Callable[[], LivePolicy]
               ) -> Callable[[Sequence[Lease]], None]:
    """What the leaser tells the leases it times for their turns, up to AHEAD_MS +
    DISPATCH_S away (``consumer.leaser``): the fleet's copies of their robots.txt that
    this process lacks are read now (one round trip), so a host whose robots.txt another
    consumer fetched costs its page no lookup at its turn, and no turn of its own for
    the lateness that would bring."""
    def ahead(leases: Sequence[Lease]) -> None:
        if robots is not None and not policy().ignore_robots:
            robots.warm_soon(lease.task.url for lease in leases)
    return ahead


def _crawl_delay(robots: Protego, agent: str) -> float | None:
    """Seconds between requests robots.txt asks of `agent`: its Crawl-delay, else its
    Request-rate, else None."""
    delay: float | None = robots.crawl_delay(agent)
    if delay is None:
        rate = robots.request_rate(agent)
        if rate is not None:
            delay = rate.seconds / rate.requests
    return delay


def _parse_doc(raw: Any) -> RobotsDoc | None:
    try:
        doc = codec.loads(raw)
    except ValueError:
        return None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("status"), int)
        or not isinstance(doc.get("body"), str)
        or not isinstance(doc.get("error", ""), str)
    ):
        return None
    return cast("RobotsDoc", doc)
