"""A session's cookie jar: what ``Set-Cookie`` stored, sent back as ``Cookie`` where it
belongs (RFC 6265's rules: domain and host-only, path, Secure, expiry).

Only a request that uses a session has a jar (``Fetcher.fetch(..., cookies=jar)``): the
fetcher asks it for each hop's ``Cookie`` header and hands it each hop's ``Set-Cookie``
headers, redirects included, so a login that answers ``302`` with its cookie reaches its
next page logged in. Requests without a session keep the client's dummy jar: cookies off.

Each header is parsed alone by the standard library's ``http.cookies`` (a malformed one
is dropped, not the others). What a jar learned since it was loaded waits in `changes`
(field -> value, ``""`` for a cookie removed), the form Redis keeps a session's cookies
in (``common.proxies.sessions``): field ``c:<domain>\\t<path>\\t<name>``, value
``<value>\\t<expires ms, -1 for a session cookie>\\t<flags>`` (``s`` Secure, ``h``
host-only). A jar's repr holds no value: cookies are credentials.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from http.cookies import CookieError, SimpleCookie

from yarl import URL

__all__ = ["FIELD_PREFIX", "Cookie", "CookieJar", "redact_set_cookie"]

FIELD_PREFIX = "c:"
#: Most cookies a jar keeps (a site setting more is refused the rest).
MAX_COOKIES = 200
#: Longest cookie value kept (RFC 6265 asks browsers for 4096 bytes a cookie).
MAX_VALUE = 4096


@dataclass(frozen=True, slots=True)
class Cookie:
    name: str
    value: str
    domain: str
    path: str
    host_only: bool
    secure: bool
    expires_ms: int  # -1: until the session ends

    @property
    def field(self) -> str:
        return f"{FIELD_PREFIX}{self.domain}\t{self.path}\t{self.name}"

    def stored(self) -> str:
        flags = ("s" if self.secure else "") + ("h" if self.host_only else "")
        return f"{self.value}\t{self.expires_ms}\t{flags}"

    def __repr__(self) -> str:
        return f"Cookie({self.name!r}, domain={self.domain!r}, path={self.path!r})"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _domain_match(host: str, domain: str) -> bool:
    return host == domain or (host.endswith("." + domain) and not _is_ip(host))


def _path_match(path: str, cookie_path: str) -> bool:
    if path == cookie_path:
        return True
    if not path.startswith(cookie_path):
        return False
    return cookie_path.endswith("/") or path[len(cookie_path)] == "/"


def _default_path(path: str) -> str:
    if not path.startswith("/") or path.count("/") == 1:
        return "/"
    return path[:path.rindex("/")]


def _expiry(max_age: str, expires: str, now_ms: int) -> int | None:
    """Its expiry in ms (-1: a session cookie), or None when it is malformed."""
    if max_age:
        try:
            seconds = int(max_age)
        except ValueError:
            return None
        return now_ms + seconds * 1000 if seconds > 0 else 0
    if expires:
        try:
            return int(parsedate_to_datetime(expires).timestamp() * 1000)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return -1


class CookieJar:
    """One session's cookies; `changes` holds what changed since it was loaded."""

    def __init__(self, cookies: Iterable[Cookie] = ()) -> None:
        self._cookies: dict[tuple[str, str, str], Cookie] = {
            (c.domain, c.path, c.name): c for c in cookies}
        self.changes: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"CookieJar({len(self._cookies)} cookies)"

    def __len__(self) -> int:
        return len(self._cookies)

    def all(self) -> list[Cookie]:
        return list(self._cookies.values())

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> CookieJar:
        """A jar of a session's stored fields (others than cookies are skipped)."""
        cookies = []
        for name, value in fields.items():
            if not name.startswith(FIELD_PREFIX):
                continue
            key = name[len(FIELD_PREFIX):].split("\t")
            parts = value.split("\t")
            if len(key) != 3 or len(parts) != 3:
                continue
            try:
                expires = int(parts[1])
            except ValueError:
                continue
            cookies.append(Cookie(key[2], parts[0], key[0], key[1], "h" in parts[2],
                                  "s" in parts[2], expires))
        return cls(cookies)

    def reload(self, stored: CookieJar) -> None:
        """Take `stored`'s cookies (a newer copy read from Redis), keeping what this jar
        learned since it was loaded (`changes`) over them: in place, so a fetch under way
        with this jar keeps writing to the one the flush reads."""
        cookies = dict(stored._cookies)
        for cookie in CookieJar.from_fields(
                {k: v for k, v in self.changes.items() if v}).all():
            cookies[(cookie.domain, cookie.path, cookie.name)] = cookie
        for field, value in self.changes.items():
            if not value:
                domain, path, name = field[len(FIELD_PREFIX):].split("\t")
                cookies.pop((domain, path, name), None)
        self._cookies = cookies

    def header(self, url: URL, now_ms: int | None = None) -> str | None:
        """The ``Cookie`` header a request to `url` sends (None: no cookie): longest
        paths first, as RFC 6265 asks."""
        host = (url.raw_host or "").lower()
        path = url.raw_path or "/"
        now = int(time.time() * 1000) if now_ms is None else now_ms
        secure = url.scheme == "https"
        found = [c for c in self._cookies.values()
                 if (c.expires_ms < 0 or c.expires_ms > now)
                 and (host == c.domain if c.host_only else _domain_match(host, c.domain))
                 and _path_match(path, c.path) and (secure or not c.secure)]
        if not found:
            return None
        found.sort(key=lambda c: -len(c.path))
        return "; ".join(f"{c.name}={c.value}" for c in found)

    def take(self, headers: Iterable[str], url: URL, now_ms: int | None = None) -> None:
        """Store the cookies of a response's ``Set-Cookie`` `headers` from `url`."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        for header in headers:
            self._take_one(header, url, now)

    def _take_one(self, header: str, url: URL, now: int) -> None:
        parsed: SimpleCookie = SimpleCookie()
        try:
            parsed.load(header)
        except CookieError:
            return
        host = (url.raw_host or "").lower()
        for name, morsel in parsed.items():
            domain = morsel["domain"].lower().lstrip(".")
            host_only = not domain or _is_ip(host)
            if host_only:
                domain = host
            elif not _domain_match(host, domain):
                continue  # a cookie for a domain the response's host is not in
            path = morsel["path"] if morsel["path"].startswith("/") else \
                _default_path(url.raw_path or "/")
            expires = _expiry(morsel["max-age"], morsel["expires"], now)
            if expires is None or len(morsel.value) > MAX_VALUE:
                continue
            cookie = Cookie(name, morsel.value, domain, path, host_only,
                            bool(morsel["secure"]), expires)
            key = (domain, path, name)
            if expires == 0 or 0 < expires <= now:  # deleted, or expired already
                if self._cookies.pop(key, None) is not None:
                    self.changes[cookie.field] = ""
                continue
            if key not in self._cookies and len(self._cookies) >= MAX_COOKIES:
                continue
            if self._cookies.get(key) != cookie:
                self._cookies[key] = cookie
                self.changes[cookie.field] = cookie.stored()


def redact_set_cookie(raw: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """Raw response headers with each ``Set-Cookie`` value's cookie value hidden
    (``sid=***; Path=/``): what a record of a session's response keeps."""
    out = []
    for name, value in raw:
        if name.lower() == b"set-cookie":
            head, eq, rest = value.partition(b"=")
            tail = rest.partition(b";")[2]
            out.append((name, head + eq + b"***" + (b";" + tail if tail else b"")))
        else:
            out.append((name, value))
    return tuple(out)
