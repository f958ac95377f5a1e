"""What a fetch is given and what it gives back: `FetchSettings` (built once from flags
and env; its repr redacts proxies), `FetchResult` (a response as the consumer keeps it:
the headers it reads, the raw ones capped), and what a status means: `classify_status`
(the table of outcomes: a `FetchError` or none), `parse_retry_after`, and which
Content-Types a fetch reads (`content_type_accepted`)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC
from email.utils import parsedate_to_datetime

from aiohttp import ClientResponse, HttpVersion11
from selectolax.lexbor import LexborHTMLParser

from common import reasons
from common.errors import ConfigError, FetchError
from common.http.hops import is_proxy_url
from common.tasks.headers import (
    DEFAULT_USER_AGENT,
    checked_headers,
    redacted_headers,
)
from common.urls.redact import redact_url

MAX_RAW_HEADERS = 256


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
            if not is_proxy_url(proxy):  # the URL is not echoed: it may hold a password
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
            return bad_status(status)
        reason = reasons.HTTP_5XX
    elif status == 429:
        reason = reasons.HTTP_429
    elif status == 408:
        reason = reasons.HTTP_408
    elif status < 100:
        return bad_status(status)
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


def bad_status(status: int) -> FetchError:
    return FetchError(
        reasons.BAD_STATUS,
        f"HTTP status {status} is outside 100-599: not a response HTTP defines",
        retryable=False,
        status=status,
    )


def result_of(
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
