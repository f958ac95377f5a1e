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

import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import aiohttp
from aiohttp import ClientResponse, ClientSession, ClientTimeout, TCPConnector
from yarl import URL

from common import reasons
from common.errors import FetchError
from common.http.cookies import CookieJar
from common.http.hops import (
    becomes_get,
    origin,
    parse_start_url,
    proxy_secrets,
    redacted,
    redirect_target,
    with_cookies,
    without_body_headers,
    without_credentials,
)
from common.http.results import (
    FetchResult,
    FetchSettings,
    classify_status,
    content_type_accepted,
    result_of,
)
from common.http.ssrf import GuardedResolver, SsrfGuard, literal_host_ip, ssrf_error_from
from common.tasks.headers import (
    is_credential,
)

__all__ = ["Fetcher"]

log = logging.getLogger(__name__)

CHUNK_SIZE = 64 * 1024
_LITERAL_CACHE_SIZE = 4096
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The methods validators (If-None-Match, If-Modified-Since) go with.
_CONDITIONAL_METHODS = frozenset({"GET", "HEAD"})
# After these, a proxied fetch is tried again once on the next proxy.
_PROXY_RETRY_STATUSES = frozenset({403, 407, 429})
_PROXY_RETRY_REASONS = frozenset({reasons.CONNECT_ERROR, reasons.HTTP_429})


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
        self._secrets = proxy_secrets(self._proxies)
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
                    log.debug("fetch_proxy_retry reason=%s proxy=%s", exc.reason, redacted(proxy))
                continue
            if last or result.status not in _PROXY_RETRY_STATUSES:
                return result
            if log.isEnabledFor(logging.DEBUG):
                log.debug("fetch_proxy_retry status=%d proxy=%s", result.status, redacted(proxy))
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
        current, current_text = parse_start_url(url)
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
                    headers=headers if cookies is None else with_cookies(headers, cookies,
                                                                          current),
                    proxy=proxy, timeout=limits, trace_request_ctx=on_sent,
                ) as resp:
                    if cookies is not None:
                        cookies.take(resp.headers.getall("Set-Cookie", ()), current)
                    status = resp.status
                    if status in _REDIRECT_STATUSES:
                        location = resp.headers.get("Location")
                        if location is not None:
                            target = redirect_target(current, location)
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
                            if method != "GET" and becomes_get(status, method):
                                method, body = "GET", None
                                if headers:
                                    headers = without_body_headers(headers)
                            if headers and origin(target) != origin(current):
                                headers = without_credentials(headers)
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
                        return result_of(
                            url, current_text, resp=resp, body=b"", started=started,
                            redirects=redirects, filtered=True,
                        )
                    # A 304 has no body (RFC 9110 15.4.5): none is read, whatever is sent.
                    body = b"" if status == 304 else await self._read_body(resp)
                    return result_of(
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


