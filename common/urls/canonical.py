"""URL canonicalization and fingerprints: one spelling per page, one id per spelling.

The producer canonicalizes every input URL before it is fingerprinted, so that
``HTTP://Example.COM:80/a/./b#x`` and ``http://example.com/a/b`` are deduplicated
as the same page.

**Parsing follows the WHATWG URL Standard** (what browsers do), through
`ada-url <https://github.com/ada-url/ada-python>`_, the Python binding of the ada
parser Node.js uses, which passes the web-platform-tests URL suite. So a URL means
here what it means to a browser: a backslash is a slash in the path
(``http://a.com\\@b/`` is ``http://a.com/@b/``), ``127.1``, ``0x7f.1`` and
``2130706433`` are the IPv4 address ``127.0.0.1``, non-ASCII hosts are IDNA-encoded
(UTS 46), ``'`` in a query is ``%27``, dot-segments (also ``%2e``) are resolved, and
the default port is dropped. Two spellings WHATWG calls the same URL always get one
canonical form.

On top of WHATWG's serialization crawlq merges a few more spellings (RFC 3986
section 6.2.2 and HTTP practice):

* the fragment and an empty ``?`` are removed; one trailing dot of the host too;
* percent-encoding is normalized: hex digits uppercased, escaped *unreserved*
  characters (``A-Z a-z 0-9 - . _ ~``) decoded, characters RFC 3986 does not allow
  raw (``|``, ``[``, ``\\`` in a query, a ``%`` that starts no escape, ...) escaped.
  Escaped *reserved* characters (``%2F``, ``%26``, ``%3D``, ...) are never decoded:
  ``/a%2Fb`` and ``/a/b`` are different resources;
* ``sort_query=True`` sorts the query parameters by key.

And it is stricter than WHATWG, refusing what a crawl should not fetch:

* only absolute ``http``/``https`` URLs with ``//`` (``/`` and ``\\`` alike) after
  the scheme: ``http:/a.com``, ``http:a.com`` and ``http:///a.com`` depend on a base
  URL or are typos;
* tab, newline and other control characters inside a URL (WHATWG drops or escapes
  them; leading and trailing ones are stripped, as WHATWG does);
* userinfo, even empty (``http://@a.com/``), so credentials never reach the queue;
* port 0; a percent-encoded host (``ex%41mple.com``);
* host names that DNS can't resolve: labels of letters, digits, ``-`` and ``_``, 1 to
  63 of them, 253 in all, no empty label (WHATWG allows ``a..b``, ``a!b.com``, ...);
  an ``xn--`` label must be the punycode of a valid IDN label (WHATWG stopped
  checking this in 2026: ``http://xn--/`` parses there);
* more than :data:`MAX_URL_BYTES` bytes, as input or as canonical output.

The canonical form is ASCII and valid RFC 3986; fetch it as
``yarl.URL(url, encoded=True)`` (what aiohttp is given): a plain ``URL(url)``
requotes it, so ``/a%3Bb`` would be requested as ``/a;b``.

``canonicalize`` never raises: every failure is a :class:`Rejection` with a stable
reason code (used as a counter label) and a short message that is safe to log.
A fast path handles URLs that are already canonical (plain lowercase host, no
port, no escapes, no dot-segments) with one regular expression; the tests check it
against the full path on generated URLs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from urllib.parse import quote

from ada_url import idna_to_ascii, normalize_url

from common.errors import ConfigError

__all__ = [
    "MAX_URL_BYTES",
    "RejectReason",
    "Rejection",
    "canonical_domain",
    "canonicalize",
    "fingerprint",
    "partition_of",
    "task_id",
]

MAX_URL_BYTES = 2048
"""Longest URL accepted, in UTF-8 bytes, both as input and as canonical output."""

_MAX_HOST_LEN = 253
# WHATWG strips these from both ends of a URL: C0 controls and space.
_C0_AND_SPACE = "".join(map(chr, range(0x21)))


class RejectReason(StrEnum):
    """Why a URL was rejected; the values are stable snake_case counter labels."""

    EMPTY = "empty"
    TOO_LONG = "too_long"
    CONTROL_CHARS = "control_chars"
    BAD_SCHEME = "bad_scheme"
    USERINFO = "userinfo"
    NO_HOST = "no_host"
    INVALID_HOST = "invalid_host"
    INVALID_PORT = "invalid_port"
    UNPARSEABLE = "unparseable"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A URL that cannot be crawled: a stable reason and a message safe to log."""

    reason: RejectReason
    message: str


_EMPTY = Rejection(RejectReason.EMPTY, "blank URL")
_TOO_LONG = Rejection(RejectReason.TOO_LONG, f"URL is over {MAX_URL_BYTES} bytes")
_USERINFO = Rejection(RejectReason.USERINFO, "URL contains userinfo (user[:password]@), not logged")
_NO_SCHEME = Rejection(RejectReason.BAD_SCHEME, "URL has no scheme (http or https)")
_NO_HOST = Rejection(RejectReason.NO_HOST, "URL has no host (give scheme://host/...)")
_SURROGATE = Rejection(RejectReason.UNPARSEABLE, "URL is not valid Unicode (invalid UTF-8?)")

# RFC 3986 character classes. A path may hold pchar and "/"; a query also "?".
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_CHARS = r"A-Za-z0-9._~!$&'()*+,;=:@/\-"
_QUERY_CHARS = _PATH_CHARS + "?"
# Anything outside the class (including "%") means the component needs work.
_PATH_DIRTY = re.compile(f"[^{_PATH_CHARS}]")
_QUERY_DIRTY = re.compile(f"[^{_QUERY_CHARS}]")
# Tokens to rewrite: an escape, a run of characters to escape, or a stray "%".
_PATH_TOKEN = re.compile(f"%[0-9A-Fa-f]{{2}}|[^{_PATH_CHARS}%]+|%")
_QUERY_TOKEN = re.compile(f"%[0-9A-Fa-f]{{2}}|[^{_QUERY_CHARS}%]+|%")

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AUTHORITY_END = re.compile(r"[/\\?#]")
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")  # as WHATWG serializes one
_ENDS_IN_NUMBER = re.compile(r"(?:^|\.)(?:\d+|0x[0-9a-f]*)\.?$", re.IGNORECASE)

# Already-canonical URLs: lowercase scheme and LDH host, no port, no userinfo, no
# escapes, no fragment, nothing to escape, a non-empty query if any. WHATWG writes
# "'" in a query as %27, so a raw one there takes the full path.
_FAST = re.compile(
    r"https?://([a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63})*)"
    f"(/[{_PATH_CHARS}]*)?"
    f"(?:\\?[{_QUERY_CHARS.replace(chr(39), '')}]+)?"
)
_DIGITS = frozenset("0123456789")


def canonicalize(raw: str, *, sort_query: bool = False) -> str | Rejection:
    """Return the canonical form of ``raw``, or a :class:`Rejection`; never raises.

    ``sort_query=True`` also sorts the query parameters by key (stable, so repeated
    keys keep their order); use it only for sites where order does not matter.
    """
    try:
        # str.strip() is the fastest; it strips what WHATWG strips (C0 controls and
        # space) unless it stripped a non-ASCII space, which the full path then keeps.
        url = raw.strip()
        match = _FAST.fullmatch(url) if len(url) <= MAX_URL_BYTES else None
        if match is not None and (len(url) == len(raw) or raw.isascii()):
            host = match[1]
            path = match[2]
            if (
                host[-1] not in _DIGITS  # a host ending in a number is an IPv4 address
                and len(host) <= _MAX_HOST_LEN
                and "0x" not in host
                and "xn--" not in host
                and (path is None or "/." not in path)
            ):
                if path is None:
                    end = match.end(1)
                    url = f"{url[:end]}/{url[end:]}"
                    if len(url) > MAX_URL_BYTES:
                        return _TOO_LONG
                if sort_query:
                    base, _, query = url.partition("?")
                    if "&" in query:
                        url = f"{base}?{_sort_query(query)}"
                return url
        return _canonicalize_full(raw, sort_query)
    except Exception as exc:  # the contract is "never raises"
        return _unparseable(raw, exc)


def _canonicalize_slow(raw: str, *, sort_query: bool = False) -> str | Rejection:
    """``canonicalize`` without the fast path; the tests compare the two."""
    try:
        return _canonicalize_full(raw, sort_query)
    except Exception as exc:
        return _unparseable(raw, exc)


def _canonicalize_full(raw: str, sort_query: bool) -> str | Rejection:
    """The full canonicalization of ``raw``."""
    url = raw.strip(_C0_AND_SPACE)
    if len(url) > MAX_URL_BYTES:
        return _TOO_LONG
    if not url:
        return _EMPTY
    if not url.isascii():
        try:
            size = len(url.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate, e.g. from undecodable bytes
            return _SURROGATE
        if size > MAX_URL_BYTES:
            return _TOO_LONG
    if (control := _CONTROL.search(url)) is not None:
        return Rejection(
            RejectReason.CONTROL_CHARS,
            f"control character U+{ord(control.group()):04X} at position {control.start()}",
        )
    problem = _check_authority(url)
    if problem is not None:
        return problem
    try:
        href = normalize_url(url)
    except ValueError:
        # The scheme, the authority's shape and the port were checked: WHATWG refused
        # the host.
        return _invalid_host(_raw_host(url), _host_problem(_raw_host(url)))

    # WHATWG serializes a special URL as scheme://host[:port]/path[?query][#fragment],
    # userinfo excluded above, "?" and "#" escaped where they are not delimiters.
    after_scheme = href.index("://") + 3
    path_start = href.index("/", after_scheme)
    authority = href[after_scheme:path_start]
    bracket = authority.rfind("]")
    colon = authority.find(":", bracket + 1)
    host = _check_host(authority if colon < 0 else authority[:colon])
    if isinstance(host, Rejection):
        return host
    port = "" if colon < 0 else authority[colon:]
    path, _, query = href[path_start:].partition("#")[0].partition("?")
    path = _normalize_escapes(path, _PATH_DIRTY, _PATH_TOKEN)
    if query:
        query = _normalize_escapes(query, _QUERY_DIRTY, _QUERY_TOKEN)
        if sort_query:
            query = _sort_query(query)

    result = f"{href[:after_scheme]}{host}{port}{path}"
    if query:
        result = f"{result}?{query}"
    if len(result) > MAX_URL_BYTES:  # the result is ASCII: chars == bytes
        return _TOO_LONG
    return result


def _check_authority(url: str) -> Rejection | None:
    """crawlq's rules before WHATWG parsing: scheme, ``//``, userinfo, port."""
    scheme_match = _SCHEME.match(url)
    if scheme_match is None:
        return _NO_SCHEME
    scheme = scheme_match[1].lower()
    if scheme not in ("http", "https"):
        return Rejection(RejectReason.BAD_SCHEME, f"scheme {scheme[:16]!r} is not http or https")
    rest = url[scheme_match.end():]
    if len(rest) < 2 or rest[0] not in "/\\" or rest[1] not in "/\\":
        return _NO_HOST
    end = _AUTHORITY_END.search(rest, 2)
    authority = rest[2:] if end is None else rest[2:end.start()]
    if "@" in authority:
        return _USERINFO
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return Rejection(RejectReason.UNPARSEABLE, "unclosed '[' in the host")
        host, port = authority[:close + 1], authority[close + 1:]
        if port and port[0] != ":":
            return _invalid_host(authority, "text after the IPv6 address")
        port = port[1:]
    else:
        host, _, port = authority.partition(":")
    if not host:
        return _NO_HOST
    # ASCII digits only (not "+80", "8_0" or full-width digits), and not port 0.
    valid_port = not port or (port.isascii() and port.isdigit() and 0 < int(port) <= 65535)
    if not valid_port:
        return Rejection(RejectReason.INVALID_PORT, f"invalid port {port[:16]!r}")
    if "%" in host:
        return _invalid_host(host, "percent-encoded host or IPv6 zone id")
    return None


def _raw_host(url: str) -> str:
    """The host as written, for messages (the authority was checked already)."""
    rest = url[url.index(":") + 3:]
    end = _AUTHORITY_END.search(rest)
    authority = rest if end is None else rest[:end.start()]
    if authority.startswith("["):
        return authority[:authority.find("]") + 1]
    return authority.partition(":")[0]


def _host_problem(host: str) -> str:
    if host.startswith("["):
        return "not an IPv6 address"
    if _ENDS_IN_NUMBER.search(host):
        return "ends in a number but is not an IPv4 address"
    return "forbidden character, or not a valid international domain name"


def _invalid_host(host: str, why: str) -> Rejection:
    return Rejection(RejectReason.INVALID_HOST, f"invalid host {host[:64]!r}: {why}")


def _unparseable(raw: object, exc: Exception) -> Rejection:
    # Exception messages may quote the authority; never echo them if it could hold
    # credentials.
    text = str(exc)
    if not isinstance(raw, str) or "@" in raw or "@" in text:
        text = ""
    detail = f"{type(exc).__name__}: {text[:120]}" if text else type(exc).__name__
    return Rejection(RejectReason.UNPARSEABLE, f"URL could not be parsed ({detail})")


@lru_cache(maxsize=16384)
def _check_host(host: str) -> str | Rejection:
    """crawlq's rules on a host WHATWG accepted (hosts repeat a lot: cached).

    ``host`` is WHATWG's serialization: lowercase, IDNA-encoded, an IPv4 address as a
    dotted quad, an IPv6 address compressed in brackets.
    """
    if host[0] == "[" or _IPV4.fullmatch(host) is not None:
        return host
    name = host[:-1] if host[-1] == "." else host  # one trailing dot: the DNS root
    if not name:
        return _invalid_host(host, "empty")
    if len(name) > _MAX_HOST_LEN:
        return _invalid_host(host, f"longer than {_MAX_HOST_LEN} characters")
    for label in name.split("."):
        if _LABEL.fullmatch(label) is None:
            return _invalid_host(
                host, "empty label, a character other than a-z 0-9 - _, or a label over 63"
            )
        if label.startswith("xn--") and not _is_idn_label(label):
            return _invalid_host(host, f"{label!r} is not the punycode of a valid IDN label")
    return name


def _is_idn_label(label: str) -> bool:
    """Whether an ``xn--`` label is the IDNA (UTS 46) encoding of a non-ASCII label."""
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except UnicodeError:
        return False
    return not decoded.isascii() and idna_to_ascii(decoded) == label.encode("ascii")


def _normalize_escapes(component: str, dirty: re.Pattern[str], token: re.Pattern[str]) -> str:
    """Normalize the percent-encoding of an (undecoded) path or query."""
    if dirty.search(component) is None:
        return component
    return token.sub(_rewrite_token, component)


def _rewrite_token(match: re.Match[str]) -> str:
    text = match.group()
    if len(text) == 3 and text[0] == "%":
        char = chr(int(text[1:], 16))
        return char if char in _UNRESERVED else text.upper()
    # Characters that must be escaped (UTF-8), or a "%" that starts no escape.
    return quote(text, safe="")


def _sort_query(query: str) -> str:
    return "&".join(sorted(query.split("&"), key=_query_key))


def _query_key(param: str) -> str:
    return param.partition("=")[0]


_NOT_IN_DOMAIN = re.compile(r"[\s/\\?#@:\[\]]")


def canonical_domain(domain: str) -> str:
    """A domain as a user types it, in the form canonical URLs carry; ConfigError if invalid.

    ``Bücher.Example.`` -> ``xn--bcher-kva.example``: IDNA-encoded, lowercase, without
    the trailing dot (and without a leading one, as in ``.example.com``). For options
    such as ``--allow-domains``, which are compared with the hosts of canonical URLs.
    """
    text = domain.strip().removeprefix(".")
    if not text or _NOT_IN_DOMAIN.search(text) is not None:
        raise ConfigError(f"invalid domain {domain!r}: give a host name such as example.com "
                          "or bücher.example, without scheme, port, path or spaces")
    result = canonicalize(f"http://{text}/")
    if isinstance(result, Rejection):
        raise ConfigError(f"invalid domain {domain!r}: {result.message}")
    return result[len("http://"):-1]


def fingerprint(canonical_url: str) -> bytes:
    """The 16-byte dedup key of a canonical URL: BLAKE2b-128 of its UTF-8 bytes.

    Why BLAKE2b: it is in the standard library (``hashlib``), fast for short inputs
    (about as fast as MD5, faster than SHA-256), and a cryptographic hash: a hostile
    site cannot craft a URL that collides with another one and so silently
    "dedups" a page out of the crawl, which it could with CRC or xxHash. 128 bits
    make accidental collisions negligible: about 1e-20 at a billion URLs
    (birthday bound n^2 / 2^129).
    """
    return hashlib.blake2b(canonical_url.encode(), digest_size=16).digest()


def task_id(fp: bytes) -> str:
    """The task id of a fingerprint: its 32 lowercase hex digits."""
    return fp.hex()


def partition_of(fp: bytes, partitions: int) -> int:
    """The partition (0 <= p < partitions) of a fingerprint: its first 8 bytes mod n."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return int.from_bytes(fp[:8], "big") % partitions
