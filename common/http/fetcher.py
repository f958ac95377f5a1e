"""The consumer's HTTP fetcher: one pooled aiohttp session, bounded in time, size and reach.

`Fetcher.fetch(url)` returns a `FetchResult` or raises `FetchError` (see `classify_status`
for the table of outcomes). Redirects are followed by hand so that every hop is checked by
the SSRF guard (`common.http.ssrf`), counted, loop-checked and stripped of credentials when it
changes origin. Bodies are streamed and capped on decompressed bytes.

Request headers: `FetchSettings.headers` are the crawl's (``--header``). Those that are not
credentials (`common.tasks.headers.is_credential`) are the session's defaults, sent on every
request, robots.txt included; the credential ones are added only when a fetch asks for
them (`fetch(..., crawl_credentials=True)`: the worker does, robots.txt does not).
A fetch's own `headers` (a task's) override the crawl's, name by name. Every credential
header, the crawl's or a task's, is dropped from the first hop that changes origin on.
The User-Agent is a session default too: `FetchSettings.user_agent`, or what the
fetcher's `user_agent` source returns when a request is made (the consumer's: the crawl
policy's ``user_agent`` of the moment).

One deadline covers the whole fetch, kept by aiohttp's own per-request `total` timer: it
cancels any wait of the request (pool, DNS, connect, headers, every body read) and aiohttp
runs it anyway, so a second layer (an `asyncio.timeout` per fetch cost ~5-10 us a page) is
not paid. The first hop gets the full `total_timeout`; each later hop (redirect or proxy
retry) only what is left of it, and a hop with nothing left is not sent.

Content types: `fetch(..., accept=("text/html", "image/*"))` reads a final response's
body only when its Content-Type media type (parameters dropped, case-insensitive) is one
of them (``type/*`` matches the type); a 2xx response of another type is closed unread
(its connection is not reused) and returned with ``filtered`` set and an empty body. A
response without a Content-Type is read. Only the final response is checked, never a
redirect hop; `accept=None` (robots.txt) reads everything. Other statuses (4xx, a final
3xx) are read as ever: their outcome says more than their type.

Methods and bodies: `fetch(url, method="POST", body=b"...")` sends any of
``common.tasks.request.METHODS`` (GET by default) with its body. Redirects follow HTTP as
browsers do (RFC 9110 15.4, the Fetch standard): a 303 turns any method but HEAD into a
GET, a 301 or 302 turns a POST into a GET, and those drop the body with the headers that
describe it (``Content-Type``, ...); a 307 or 308 repeats the method and the body. Every
hop of every method goes through the same SSRF guard, credential rule and caps.

Conditional requests (a revisit, GET or HEAD only):
`fetch(..., conditional={"If-None-Match": etag})` adds those headers to the request for
`url` itself only: the first redirect drops them (a validator is its URL's own, never
sent to another URL), and a name the crawl's or the fetch's own `headers` set is not
replaced. A 304 is a result with an empty body, never
read (it has none; a server that sends one anyway is not believed).

Proxies: with `FetchSettings.proxies`, each fetch goes through the next proxy round-robin,
unless it names one (``proxy=``: the consumer's proxy pool picks it, docs/proxies.md).
Cookies stay off (a dummy jar) unless a fetch brings a session's jar (``cookies=``).
An HTTP proxy resolves host names itself, so for names the SSRF guard can only check the
proxy's own address (keep proxies inside `allow_networks` if they live on a private
network); IP-literal targets are still checked here before the request is sent. Proxy
credentials are kept out of every message, log line and repr (`redact_url`).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from aiohttp import ClientResponse, ClientSession, ClientTimeout, HttpVersion11, TCPConnector
from selectolax.lexbor import LexborHTMLParser
from yarl import URL

from common import reasons
from common.errors import ConfigError, FetchError
from common.http.cookies import CookieJar
from common.http.ssrf import GuardedResolver, SsrfGuard, literal_host_ip, ssrf_error_from
from common.tasks.headers import (
    DEFAULT_USER_AGENT,
    checked_headers,
    is_credential,
    redacted_headers,
)
from common.urls.redact import redact_url

__all__ = [
    "MAX_RETRY_AFTER_S",
    "FetchResult",
    "FetchSettings",
    "Fetcher",
    "classify_status",
    "content_type_accepted",
    "parse_retry_after",
    "redact_url",
]

log = logging.getLogger(__name__)

CHUNK_SIZE = 64 * 1024
MAX_RAW_HEADERS = 256
_LITERAL_CACHE_SIZE = 4096
KEPT_HEADERS = (
    "content-type",
    "content-length",
    "last-modified",
    "etag",
    "location",
    "retry-after",
    "server",
    "date",
)
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Headers that describe a request's body: dropped with it when a redirect turns it into a
#: GET (the Fetch standard's "request-body-header names").
_BODY_HEADERS = frozenset({"content-type", "content-encoding", "content-language",
                           "content-location"})
#: The methods validators (If-None-Match, If-Modified-Since) go with.
_CONDITIONAL_METHODS = frozenset({"GET", "HEAD"})
_HTTP_SCHEMES = frozenset({"http", "https"})
# After these, a proxied fetch is tried again once on the next proxy.
_PROXY_RETRY_STATUSES = frozenset({403, 407, 429})
_PROXY_RETRY_REASONS = frozenset({reasons.CONNECT_ERROR, reasons.HTTP_429})


@dataclass(frozen=True, slots=True, repr=False)
class FetchSettings:
    """How the fetcher behaves: built once from flags/env, passed down; repr redacts proxies."""

    user_agent: str = DEFAULT_USER_AGENT
    total_timeout: float = 30.0
    connect_timeout: float = 10.0
    sock_read_timeout: float = 15.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 5
    allow_private: bool = False
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    proxies: tuple[str, ...] = ()  # http(s) proxy URLs, may contain user:pass
    # The connection pool's limits (TCPConnector's limit and limit_per_host; 0 = none).
    # The consumer sets none: the frontier's lease is the limit, and a request waiting
    # for a pooled connection would spend its total timeout before it was sent.
    concurrency: int = 0
    limit_per_host: int = 0
    headers: tuple[tuple[str, str], ...] = ()  # the crawl's (name, value); repr redacts

    def __post_init__(self) -> None:
        for name in ("total_timeout", "connect_timeout", "sock_read_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0")
        if self.max_body_bytes < 1:
            raise ConfigError("max_body_bytes must be >= 1")
        if self.max_redirects < 0:
            raise ConfigError("max_redirects must be >= 0")
        if self.concurrency < 0 or self.limit_per_host < 0:
            raise ConfigError("concurrency and limit_per_host must be >= 0 (0 = no limit)")
        for i, proxy in enumerate(self.proxies):
            if not _is_proxy_url(proxy):  # the URL is not echoed: it may hold a password
                raise ConfigError(
                    f"proxies[{i}] is not an http(s)://[user:pass@]host[:port] proxy URL"
                )
        checked_headers(self.headers, ConfigError, "headers")

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "proxies":
                value = tuple(redact_url(p) for p in value)
            elif f.name == "headers":
                value = tuple(redacted_headers(dict(value)).items())
            parts.append(f"{f.name}={value!r}")
        return f"FetchSettings({', '.join(parts)})"


@dataclass(slots=True)
class FetchResult:
    """A response that is the final word on a URL (2xx, 3xx without Location, 304, 4xx)."""

    url: str  # as asked for
    final_url: str  # the last redirect target, or `url` (fragment dropped, quoted)
    status: int
    headers: dict[str, str]  # lowercased subset: see KEPT_HEADERS
    raw_headers: tuple[tuple[bytes, bytes], ...]  # as received, at most MAX_RAW_HEADERS
    body: bytes  # decompressed
    elapsed: float  # seconds, whole redirect chain
    redirects: tuple[str, ...]  # each hop's URL after the first, in order
    http_version: str  # "HTTP/1.1"
    filtered: bool = False  # its Content-Type is not accepted: closed unread, body b""
    _tree: LexborHTMLParser | None = field(default=None, init=False, repr=False,
                                           compare=False)

    def tree(self) -> LexborHTMLParser:
        """The body parsed as HTML by Lexbor (selectolax), once: the links handler and
        the near-duplicate fingerprint read the same tree. Don't change it: use
        `take_tree` for a tree of your own."""
        if self._tree is None:
            self._tree = LexborHTMLParser(self.body, encoding=True)
        return self._tree

    def take_tree(self) -> LexborHTMLParser:
        """The parsed body (`tree`), handed over: the caller may change it, and a later
        `tree` parses the body again."""
        tree, self._tree = self.tree(), None
        return tree


def content_type_accepted(value: str | None, accept: tuple[str, ...] | None) -> bool:
    """Whether a Content-Type header `value` is one of `accept` (``type/subtype`` or
    ``type/*``, lowercase); no `accept` (None or empty) and no Content-Type accept all."""
    if not accept or value is None:
        return True
    media = value.partition(";")[0].strip().lower()
    if not media:
        return True
    return media in accept or f"{media.partition('/')[0]}/*" in accept


#: The longest wait `parse_retry_after` returns (a year): a larger value, or a date further
#: off, gives this. The queue caps it again at the crawl policy's ``max_retry_after``.
MAX_RETRY_AFTER_S = 365 * 86400.0
_MAX_RETRY_AFTER_DIGITS = len(str(int(MAX_RETRY_AFTER_S)))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delay-seconds or an HTTP-date.

    A date is turned into seconds from `now` (default: `time.time()`), clamped at 0.
    Both are clamped at `MAX_RETRY_AFTER_S`, however many digits. Anything unparseable
    (negative, fractional, not ASCII) gives None. It never raises: the header is the
    server's, whatever it holds.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or not value.isascii():  # an HTTP-date or delay-seconds is ASCII
        return None
    if value.isdigit():
        digits = value.lstrip("0")
        if len(digits) > _MAX_RETRY_AFTER_DIGITS:  # int() refuses > 4300 digits
            return MAX_RETRY_AFTER_S
        return min(MAX_RETRY_AFTER_S, float(int(digits or "0")))
    stamp = http_date(value)
    if stamp is None:
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, stamp - (time.time() if now is None else now)))


def http_date(value: str) -> float | None:
    """An HTTP-date (RFC 9110) as a Unix time; None when it is not one. Never raises."""
    try:
        when = parsedate_to_datetime(value.strip())
        if when.tzinfo is None:  # "-0000" or asctime: RFC 9110 dates are GMT
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


def classify_status(status: int, headers: Mapping[str, str]) -> FetchError | None:
    """The FetchError a final (non-redirect) status stands for, or None for a result.

    | what | result |
    | --- | --- |
    | connection error (DNS, refused, reset), timeout (connect / read / total) | FetchError retryable, reason `connect_error` / `timeout` |
    | 5xx, 408, 429 | FetchError retryable, reason `http_5xx` / `http_408` / `http_429`, `retry_after` parsed from Retry-After (seconds or HTTP-date), `status` set |
    | other 4xx | FetchResult (the queue records done with that status; not retried) |
    | 2xx, 304 etc. | FetchResult |
    | too many redirects (> max_redirects, default 5) | FetchError permanent `too_many_redirects` |
    | redirect loop (a URL seen twice in the chain) | FetchError permanent `redirect_loop` |
    | redirect to non-http(s) (file:, ftp:, javascript:), to no host (http://), to a host aiohttp refuses (127.1), or a malformed Location | FetchError permanent `bad_redirect` |
    | the URL asked for is malformed, not http(s), or its host is one aiohttp refuses (127.1, 2130706433) | FetchError permanent `bad_url` |
    | a status outside 100-599 | FetchError permanent `bad_status`, `status` set |
    | body over max_body_bytes (decompressed, counted while streaming), or a Content-Length over it (refused before reading) | FetchError permanent `body_too_large` |
    | address refused by the SSRF guard (first hop or any redirect hop) | FetchError permanent `ssrf_blocked` |
    | anything else unexpected from aiohttp (e.g. a malformed response) | FetchError retryable `http_error` |

    This function decides the status rows only; `Fetcher.fetch` does the rest.
    """  # noqa: E501
    if status >= 500:
        if status > 599:
            return _bad_status(status)
        reason = reasons.HTTP_5XX
    elif status == 429:
        reason = reasons.HTTP_429
    elif status == 408:
        reason = reasons.HTTP_408
    elif status < 100:
        return _bad_status(status)
    else:
        return None
    value = headers.get("Retry-After")
    if value is None:
        value = headers.get("retry-after")
    return FetchError(
        reason,
        f"HTTP {status}",
        retryable=True,
        retry_after=parse_retry_after(value),
        status=status,
    )


def _bad_status(status: int) -> FetchError:
    return FetchError(
        reasons.BAD_STATUS,
        f"HTTP status {status} is outside 100-599: not a response HTTP defines",
        retryable=False,
        status=status,
    )


async def _headers_sent(session: ClientSession, ctx: Any, params: Any) -> None:
    """aiohttp's trace signal, awaited just before a request's headers are written (no
    wait between: aiohttp 3.9+'s StreamWriter.write_headers); tell its fetch's `on_sent`."""
    on_sent = ctx.trace_request_ctx
    if on_sent is not None:
        await on_sent()


class Fetcher:
    """One pooled aiohttp session with SSRF guard, caps and hand-followed redirects.

    Use as `async with Fetcher(settings) as f: result = await f.fetch(url)`. See
    `classify_status` for every outcome of `fetch`. `user_agent` is read at each request
    (default: `settings.user_agent`).
    """

    def __init__(self, settings: FetchSettings, *,
                 user_agent: Callable[[], str] | None = None) -> None:
        self._settings = settings
        self._guard = SsrfGuard(settings.allow_private, settings.allow_networks)
        self._session: ClientSession | None = None
        # A second pool for requests that say when they went out (fetch's `on_sent`):
        # aiohttp's trace signals cost every request of a session, so only these pay.
        self._sent_session: ClientSession | None = None
        self._proxies: tuple[URL, ...] = tuple(URL(p) for p in settings.proxies)
        self._proxy_cursor = 0
        self._secrets = _proxy_secrets(self._proxies)
        self._total = settings.total_timeout
        self._timeout = _client_timeout(settings, settings.total_timeout)
        self._cap = settings.max_body_bytes
        self._credentials = {k: v for k, v in settings.headers if is_credential(k)}
        self._crawl_header_names = frozenset(k.lower() for k, _ in settings.headers)
        self._user_agent_of = user_agent or (lambda: settings.user_agent)
        self._user_agent = self._user_agent_of()  # what the sessions send
        # raw host -> why the guard refuses it as an IP literal, or None (also for names).
        self._literal_verdicts: dict[str | None, str | None] = {}

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"Fetcher({state}, {self._settings!r})"

    async def start(self) -> None:
        """Create the session and its connection pool (idempotent)."""
        if self._session is None:
            self._session = self._new_session()

    def _new_session(self, traces: list[aiohttp.TraceConfig] | None = None) -> ClientSession:
        s = self._settings
        connector = TCPConnector(
            limit=s.concurrency,
            limit_per_host=s.limit_per_host,
            resolver=GuardedResolver(self._guard),
            socket_factory=None if s.allow_private else self._guard.socket_factory,
            ttl_dns_cache=60,
        )
        return ClientSession(
            connector=connector,
            timeout=self._timeout,
            headers={"User-Agent": self._user_agent,
                     **{k: v for k, v in s.headers if not is_credential(k)}},
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=CHUNK_SIZE,
            max_line_size=16 * 1024,
            max_field_size=16 * 1024,
            trust_env=False,
            trace_configs=traces,
        )

    def _sent_pool(self) -> ClientSession:
        """The session of `on_sent` fetches, made on first use."""
        if self._sent_session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_headers_sent)
            self._sent_session = self._new_session([trace])
        return self._sent_session

    @property
    def user_agent(self) -> str:
        """The User-Agent every request sends (robots.txt's included)."""
        return self._user_agent_of()

    def _take_user_agent(self) -> None:
        """Have the next requests send the source's User-Agent, if it changed.

        The session's default headers are copied into each request when it is made, so
        replacing the entry there changes later requests only, never one under way."""
        user_agent = self._user_agent_of()
        if user_agent != self._user_agent:
            self._user_agent = user_agent
            for session in (self._session, self._sent_session):
                if session is not None:
                    session.headers["User-Agent"] = user_agent

    async def close(self) -> None:
        sessions = (self._session, self._sent_session)
        self._session = self._sent_session = None
        for session in sessions:
            if session is not None:
                await session.close()

    async def __aenter__(self) -> Fetcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def fetch(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        crawl_credentials: bool = False,
        accept: tuple[str, ...] | None = None,
        on_sent: Callable[[], Awaitable[None]] | None = None,
        conditional: Mapping[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
        proxy: str | None = None,
        cookies: CookieJar | None = None,
    ) -> Coroutine[Any, Any, FetchResult]:
        """Request `url` with `method` (and `body`), following up to `max_redirects`
        redirects as the module's docstring says; raise FetchError.

        `proxy`: None sends it as the settings say (the next of their proxies
        round-robin, or direct); a proxy URL sends it through that one proxy, once (a
        failure of the proxy itself raises a FetchError with `proxy_failed` set); ""
        sends it direct. The proxy pool of the consumer picks them (docs/proxies.md).
        `cookies`: a session's jar (common.http.cookies), asked for each hop's ``Cookie``
        and given each hop's ``Set-Cookie``; None: no cookie is sent or kept.

        `headers` go over the crawl's; `crawl_credentials` adds the crawl's credential
        headers (a task's fetch, not robots.txt). Credentials are dropped at the first hop
        to another origin. `accept`: the media types whose bodies are read (see the
        module's docstring); a 2xx of another type comes back `filtered`, unread.
        The whole fetch (every hop, every proxy retry, the body) runs under one
        `total_timeout` deadline, so a server dripping one byte at a time cannot outlast it.
        Await it like a coroutine function (it returns the fetch's coroutine: no extra
        coroutine frame per page). `on_sent` is called as each request's headers are
        about to be written to its connection (after any connect: a request's real start,
        for politeness), through a pool of its own, and awaited: it may wait, and an
        exception it raises stops that request before anything is sent and leaves fetch
        as it is. `conditional`:
        validators for `url` only, for a GET or HEAD (see the module's docstring).
        """
        session = self._session
        if session is None:
            raise RuntimeError("Fetcher.start() has not been called")
        if on_sent is not None:
            session = self._sent_pool()
        started = time.monotonic()
        if crawl_credentials and self._credentials:
            headers = self._with_credentials(headers)
        if conditional:
            conditional = (self._not_set(conditional, headers)
                           if method in _CONDITIONAL_METHODS else None)
        if proxy is not None or not self._proxies:
            return self._fetch_via(
                session, url, headers, URL(proxy) if proxy else None, started=started,
                limits=self._timeout,
                accept=accept, on_sent=on_sent, conditional=conditional, method=method,
                body=body, cookies=cookies,
            )
        return self._fetch_proxied(session, url, headers, started, accept, on_sent=on_sent,
                                   conditional=conditional, method=method, body=body,
                                   cookies=cookies)

    async def _fetch_proxied(
        self,
        session: ClientSession,
        url: str,
        headers: Mapping[str, str] | None,
        started: float,
        accept: tuple[str, ...] | None,
        *,
        on_sent: Callable[[], Awaitable[None]] | None = None,
        conditional: Mapping[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
        cookies: CookieJar | None = None,
    ) -> FetchResult:
        proxies = self._proxies
        n = len(proxies)
        first = self._proxy_cursor
        self._proxy_cursor = (first + 1) % n
        for attempt in range(n):
            proxy = proxies[(first + attempt) % n]
            last = attempt == n - 1
            limits = self._timeout if attempt == 0 else self._time_left(started)
            try:
                result = await self._fetch_via(
                    session, url, headers, proxy, started=started, limits=limits,
                    accept=accept, on_sent=on_sent, conditional=conditional, method=method,
                    body=body, cookies=cookies,
                )
            except FetchError as exc:
                if last or exc.reason not in _PROXY_RETRY_REASONS:
                    raise
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("fetch_proxy_retry reason=%s proxy=%s", exc.reason, _redact(proxy))
                continue
            if last or result.status not in _PROXY_RETRY_STATUSES:
                return result
            if log.isEnabledFor(logging.DEBUG):
                log.debug("fetch_proxy_retry status=%d proxy=%s", result.status, _redact(proxy))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _fetch_via(
        self,
        session: ClientSession,
        url: str,
        headers: Mapping[str, str] | None,
        proxy: URL | None,
        *,
        started: float,
        limits: ClientTimeout,
        accept: tuple[str, ...] | None = None,
        on_sent: Callable[[], Awaitable[None]] | None = None,
        conditional: Mapping[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
        cookies: CookieJar | None = None,
    ) -> FetchResult:
        """Fetch `url` through `proxy`: the first hop under `limits` (aiohttp's timeouts,
        `total` included), each redirect hop under what is left of the deadline; the
        `conditional` headers go with the first hop only; `method` and `body` as each
        redirect leaves them (`_redirected`)."""
        self._take_user_agent()
        current, current_text = _parse_start_url(url)
        later = headers
        if conditional:
            headers = {**headers, **conditional} if headers else conditional
        check_literals = not self._guard.allow_private
        max_redirects = self._settings.max_redirects
        redirects: list[str] = []
        seen: set[str] | None = None
        try:
            while True:
                if check_literals:
                    self._check_literal(current.raw_host)
                async with session.request(
                    method, current, allow_redirects=False, data=body,
                    headers=headers if cookies is None else _with_cookies(headers, cookies,
                                                                          current),
                    proxy=proxy, timeout=limits, trace_request_ctx=on_sent,
                ) as resp:
                    if cookies is not None:
                        cookies.take(resp.headers.getall("Set-Cookie", ()), current)
                    status = resp.status
                    if status in _REDIRECT_STATUSES:
                        location = resp.headers.get("Location")
                        if location is not None:
                            target = _redirect_target(current, location)
                            key = str(target)
                            if seen is None:
                                seen = {str(current)}
                            if key in seen:
                                raise FetchError(
                                    reasons.REDIRECT_LOOP,
                                    f"{key} seen twice in the redirect chain",
                                    retryable=False,
                                )
                            if len(redirects) >= max_redirects:
                                raise FetchError(
                                    reasons.TOO_MANY_REDIRECTS,
                                    f"more than {max_redirects} redirects",
                                    retryable=False,
                                )
                            if conditional:  # a validator is its URL's own
                                headers, conditional = later, None
                            if method != "GET" and _becomes_get(status, method):
                                method, body = "GET", None
                                if headers:
                                    headers = _without_body_headers(headers)
                            if headers and _origin(target) != _origin(current):
                                headers = _without_credentials(headers)
                            seen.add(key)
                            redirects.append(key)
                            current, current_text = target, key
                            limits = self._time_left(started)
                            continue
                    error = classify_status(status, resp.headers)
                    if error is not None:
                        raise error
                    if accept and 200 <= status < 300 and not content_type_accepted(
                            resp.headers.get("Content-Type"), accept):
                        resp.close()  # the body is never read: drop the connection
                        return _result(
                            url, current_text, resp=resp, body=b"", started=started,
                            redirects=redirects, filtered=True,
                        )
                    # A 304 has no body (RFC 9110 15.4.5): none is read, whatever is sent.
                    body = b"" if status == 304 else await self._read_body(resp)
                    return _result(
                        url, current_text, resp=resp, body=body, started=started,
                        redirects=redirects,
                    )
        except FetchError:
            raise
        except aiohttp.ServerTimeoutError as exc:  # connect / sock_connect / sock_read
            raise FetchError(
                reasons.TIMEOUT, self._describe(exc), retryable=True,
                proxy_failed=proxy is not None
                and isinstance(exc, aiohttp.ConnectionTimeoutError)) from None
        except TimeoutError:  # the `total` timer: this fetch's deadline
            raise self._deadline_error() from None
        except aiohttp.ClientConnectorError as exc:
            blocked = ssrf_error_from(exc)
            if blocked is not None:
                raise FetchError(
                    reasons.SSRF_BLOCKED, self._scrub(blocked.message), retryable=False
                ) from None
            raise FetchError(reasons.CONNECT_ERROR, self._describe(exc), retryable=True,
                             proxy_failed=proxy is not None) from None
        except aiohttp.InvalidURL as exc:  # e.g. a non-canonical IPv4 host such as 127.1
            reason = reasons.BAD_REDIRECT if redirects else reasons.BAD_URL
            raise FetchError(reason, self._describe(exc), retryable=False) from None
        except aiohttp.ClientHttpProxyError as exc:  # CONNECT refused by the proxy
            # 407: the proxy refused us; another status is its word on the target.
            raise FetchError(
                reasons.CONNECT_ERROR, self._describe(exc), retryable=True, status=exc.status,
                proxy_failed=exc.status == 407) from None
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            # Through a proxy, the connection that broke is the proxy's.
            raise FetchError(reasons.CONNECT_ERROR, self._describe(exc), retryable=True,
                             proxy_failed=proxy is not None) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise FetchError(reasons.HTTP_ERROR, self._describe(exc), retryable=True) from None

    def _with_credentials(self, headers: Mapping[str, str] | None) -> Mapping[str, str]:
        if not headers:
            return self._credentials  # aiohttp copies it: never changed in place
        names = {k.lower() for k in headers}  # a task's header replaces the crawl's
        merged = {k: v for k, v in self._credentials.items() if k.lower() not in names}
        merged.update(headers)
        return merged

    def _not_set(self, conditional: Mapping[str, str],
                 headers: Mapping[str, str] | None) -> dict[str, str]:
        """The `conditional` headers whose names neither the crawl nor `headers` set."""
        taken = self._crawl_header_names
        if headers:
            taken = taken | {k.lower() for k in headers}
        return {k: v for k, v in conditional.items() if k.lower() not in taken}

    def _time_left(self, started: float) -> ClientTimeout:
        """The session's timeouts with `total` cut to what is left of the fetch's deadline."""
        left = self._total - (time.monotonic() - started)
        if left <= 0:  # ClientTimeout(total=0) would mean no deadline at all
            raise self._deadline_error()
        return _client_timeout(self._settings, left)

    def _deadline_error(self) -> FetchError:
        return FetchError(
            reasons.TIMEOUT, f"no complete response within {self._total:g}s", retryable=True
        )

    def _check_literal(self, host: str | None) -> None:
        """Refuse an IP-literal host before sending (aiohttp never resolves literals)."""
        verdicts = self._literal_verdicts
        try:
            why = verdicts[host]
        except KeyError:
            ip = literal_host_ip(host)
            why = None if ip is None else self._guard.refusal(ip)
            if len(verdicts) >= _LITERAL_CACHE_SIZE:
                verdicts.clear()
            verdicts[host] = why
        if why is not None:
            raise FetchError(
                reasons.SSRF_BLOCKED, f"address {host} refused: {why}", retryable=False
            )

    async def _read_body(self, resp: ClientResponse) -> bytes:
        cap = self._cap
        content = resp.content
        # A body still on its way is refused at once on an honest oversize Content-Length;
        # one that already arrived whole (a small page) is only counted below.
        if not content.is_eof():
            length = resp.content_length
            if length is not None and length > cap:
                resp.close()
                raise FetchError(
                    reasons.BODY_TOO_LARGE,
                    f"Content-Length {length} > {cap} bytes",
                    retryable=False,
                )
        # aiohttp decompresses transparently and in bounded steps (read(n) also bounds how
        # much one feed may inflate; read() without n would lift that bound), so these are
        # decompressed bytes and a gzip bomb is stopped here after ~cap bytes of output.
        # Checking at_eof() after each chunk saves the final empty read: a page that
        # arrived whole takes one read, whatever its Content-Length or encoding.
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await content.read(CHUNK_SIZE)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                resp.close()
                raise FetchError(
                    reasons.BODY_TOO_LARGE, f"body exceeds {cap} bytes", retryable=False
                )
            if content.at_eof():
                if not chunks:
                    return chunk
                chunks.append(chunk)
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def _describe(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        return self._scrub(f"{type(exc).__name__}: {text}")

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _parse_start_url(url: str) -> tuple[URL, str]:
    """The URL to send and its text: `url` itself when it is already quoted and has no
    fragment (canonical task URLs: no str() of the parsed URL per fetch)."""
    # A URL that is already fully quoted (canonical task URLs are) is sent as is:
    # re-quoting would turn /a%3Bb into /a;b, a different resource.
    quoted = _is_quoted(url)
    try:
        parsed = URL(url, encoded=quoted)
        scheme = parsed.scheme
        host = parsed.raw_host
        _ = parsed.port
    except (ValueError, TypeError):
        raise FetchError(
            reasons.BAD_URL, f"malformed URL {redact_url(str(url))!r}", retryable=False
        ) from None
    if scheme not in _HTTP_SCHEMES or not host:
        raise FetchError(
            reasons.BAD_URL, f"not an http(s) URL: {redact_url(url)!r}", retryable=False
        )
    if parsed.raw_fragment:
        parsed = parsed.with_fragment(None)
        return parsed, str(parsed)
    return parsed, url if quoted else str(parsed)


# Any character that is not printable ASCII, or is one of  "<>\^`{|}  or a space: a URL
# without them is taken as already quoted (one C-level scan; ranges #-; and ?-[ hold 0-9, A-Z).
_NOT_QUOTED = re.compile(r"[^!#-;=?-\[\]_a-z~]")


def _is_quoted(url: str) -> bool:
    return _NOT_QUOTED.search(url) is None


def _redirect_target(current: URL, location: str) -> URL:
    """The absolute URL a Location header points to, or FetchError `bad_redirect`."""
    if not location.strip():
        raise FetchError(reasons.BAD_REDIRECT, "empty Location header", retryable=False)
    try:
        target = URL(location)
        # A Location that names a scheme is absolute, as aiohttp and RFC 3986 take it:
        # joined, "http://" (no host) would become the current URL and look like a loop.
        if not target.scheme:
            target = current.join(target)
        scheme = target.scheme
        host = target.raw_host
        _ = target.port
        if target.raw_fragment:
            target = target.with_fragment(None)
    except (ValueError, TypeError):
        raise FetchError(
            reasons.BAD_REDIRECT,
            f"malformed Location {redact_url(location)[:200]!r}",
            retryable=False,
        ) from None
    if scheme not in _HTTP_SCHEMES:
        raise FetchError(
            reasons.BAD_REDIRECT,
            f"redirect to a non-http(s) URL {redact_url(location)[:200]!r}",
            retryable=False,
        )
    if not host:
        raise FetchError(
            reasons.BAD_REDIRECT,
            f"redirect to a URL without a host {redact_url(location)[:200]!r}",
            retryable=False,
        )
    return target


def _client_timeout(settings: FetchSettings, total: float) -> ClientTimeout:
    # ceil_threshold=inf: aiohttp would otherwise round deadlines over 5 s up to the next
    # whole second; the fetch's deadline stays exact.
    return ClientTimeout(
        total=total,
        connect=settings.connect_timeout,
        sock_connect=settings.connect_timeout,
        sock_read=settings.sock_read_timeout,
        ceil_threshold=math.inf,
    )


def _origin(url: URL) -> tuple[str, str | None, int | None]:
    return (url.scheme, url.raw_host, url.port)


def _becomes_get(status: int, method: str) -> bool:
    """Whether a redirect with `status` turns a `method` request into a GET (dropping its
    body): a 303 but for HEAD, a 301 or 302 of a POST (RFC 9110 15.4.2-4 allow it and
    every browser does it: the Fetch standard); never a 307 or 308."""
    if status == 303:
        return method != "HEAD"
    return status in (301, 302) and method == "POST"


def _without_body_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}


def _with_cookies(headers: Mapping[str, str] | None, jar: CookieJar,
                  url: URL) -> Mapping[str, str] | None:
    """`headers` with the jar's ``Cookie`` for `url` (over any a task set), if it has one."""
    cookie = jar.header(url)
    if cookie is None:
        return headers
    kept = {k: v for k, v in (headers or {}).items() if k.lower() != "cookie"}
    return {**kept, "Cookie": cookie}


def _without_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if not is_credential(k)}


def _result(
    url: str,
    final_url: str,
    *,
    resp: ClientResponse,
    body: bytes,
    started: float,
    redirects: list[str],
    filtered: bool = False,
) -> FetchResult:
    h = resp.headers
    kept = {}
    for name in KEPT_HEADERS:
        value = h.get(name)
        if value is not None:
            kept[name] = value
    raw = resp.raw_headers
    if len(raw) > MAX_RAW_HEADERS:
        raw = raw[:MAX_RAW_HEADERS]
    version = resp.version
    if version is None or version is HttpVersion11:  # the parser's constant, no formatting
        http_version = "HTTP/1.1"
    else:
        http_version = f"HTTP/{version.major}.{version.minor}"
    return FetchResult(
        url=url,
        final_url=final_url,
        status=resp.status,
        headers=kept,
        raw_headers=raw,
        body=body,
        elapsed=time.monotonic() - started,
        redirects=tuple(redirects),
        http_version=http_version,
        filtered=filtered,
    )


def _is_proxy_url(proxy: object) -> bool:
    try:
        url = URL(proxy)  # type: ignore[arg-type]
        _ = url.port
    except (ValueError, TypeError):
        return False
    return (
        url.scheme in _HTTP_SCHEMES
        and bool(url.raw_host)
        and url.raw_path in ("", "/")
        and not url.raw_query_string
        and not url.raw_fragment
    )


def _redact(url: URL) -> str:
    return redact_url(str(url))


def _proxy_secrets(proxies: tuple[URL, ...]) -> tuple[str, ...]:
    """Every spelling of every proxy password/userinfo, longest first, to scrub from messages."""
    found: set[str] = set()
    for proxy in proxies:
        for value in (proxy.raw_password, proxy.password):
            if value:
                found.add(value)
        if proxy.raw_password and proxy.raw_user:
            found.add(f"{proxy.raw_user}:{proxy.raw_password}")
    return tuple(sorted(found, key=len, reverse=True))
