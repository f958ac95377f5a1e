"""A fetch's hops, as the fetcher follows them by hand: the start URL parsed (sent as is
when already quoted), a redirect's target, what a hop carries to the next (the method
and body a redirect keeps, the headers dropped with a body, credentials dropped across
origins, a session's cookies), and proxy URLs checked and shown without secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping

from yarl import URL

from common import reasons
from common.errors import FetchError
from common.http.cookies import CookieJar
from common.tasks.headers import (
    is_credential,
)
from common.urls.redact import redact_url

#: Headers that describe a request's body: dropped with it when a redirect turns it into a
#: GET (the Fetch standard's "request-body-header names").
BODY_HEADERS = frozenset({"content-type", "content-encoding", "content-language",
                           "content-location"})


HTTP_SCHEMES = frozenset({"http", "https"})


def parse_start_url(url: str) -> tuple[URL, str]:
    """The URL to send and its text: `url` itself when it is already quoted and has no
    fragment (canonical task URLs: no str() of the parsed URL per fetch)."""
    # A URL that is already fully quoted (canonical task URLs are) is sent as is:
    # re-quoting would turn /a%3Bb into /a;b, a different resource.
    quoted = is_quoted(url)
    try:
        parsed = URL(url, encoded=quoted)
        scheme = parsed.scheme
        host = parsed.raw_host
        _ = parsed.port
    except (ValueError, TypeError):
        raise FetchError(
            reasons.BAD_URL, f"malformed URL {redact_url(str(url))!r}", retryable=False
        ) from None
    if scheme not in HTTP_SCHEMES or not host:
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


def is_quoted(url: str) -> bool:
    return _NOT_QUOTED.search(url) is None


def redirect_target(current: URL, location: str) -> URL:
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
    if scheme not in HTTP_SCHEMES:
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


def origin(url: URL) -> tuple[str, str | None, int | None]:
    return (url.scheme, url.raw_host, url.port)


def becomes_get(status: int, method: str) -> bool:
    """Whether a redirect with `status` turns a `method` request into a GET (dropping its
    body): a 303 but for HEAD, a 301 or 302 of a POST (RFC 9110 15.4.2-4 allow it and
    every browser does it: the Fetch standard); never a 307 or 308."""
    if status == 303:
        return method != "HEAD"
    return status in (301, 302) and method == "POST"


def without_body_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in BODY_HEADERS}


def with_cookies(headers: Mapping[str, str] | None, jar: CookieJar,
                  url: URL) -> Mapping[str, str] | None:
    """`headers` with the jar's ``Cookie`` for `url` (over any a task set), if it has one."""
    cookie = jar.header(url)
    if cookie is None:
        return headers
    kept = {k: v for k, v in (headers or {}).items() if k.lower() != "cookie"}
    return {**kept, "Cookie": cookie}


def without_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if not is_credential(k)}


def is_proxy_url(proxy: object) -> bool:
    try:
        url = URL(proxy)  # type: ignore[arg-type]
        _ = url.port
    except (ValueError, TypeError):
        return False
    return (
        url.scheme in HTTP_SCHEMES
        and bool(url.raw_host)
        and url.raw_path in ("", "/")
        and not url.raw_query_string
        and not url.raw_fragment
    )


def redacted(url: URL) -> str:
    return redact_url(str(url))


def proxy_secrets(proxies: tuple[URL, ...]) -> tuple[str, ...]:
    """Every spelling of every proxy password/userinfo, longest first, to scrub from messages."""
    found: set[str] = set()
    for proxy in proxies:
        for value in (proxy.raw_password, proxy.password):
            if value:
                found.add(value)
        if proxy.raw_password and proxy.raw_user:
            found.add(f"{proxy.raw_user}:{proxy.raw_password}")
    return tuple(sorted(found, key=len, reverse=True))
