"""URL canonicalization and fingerprints: one spelling per page, one id per spelling.

The producer canonicalizes every input URL before it is fingerprinted, so that
``HTTP://Example.COM:80/a/./b#x`` and ``http://example.com/a/b`` are deduplicated
as the same page. The rules are the meaning-preserving normalizations of
RFC 3986 section 6.2.2 plus a few HTTP-specific ones:

* surrounding whitespace is stripped; control characters inside are rejected;
* only ``http`` and ``https`` are accepted; scheme and host are lowercased;
* the host is IDNA-encoded (``bücher.example`` -> ``xn--bcher-kva.example``), one
  trailing dot is removed, IPv6 literals are compressed and kept in brackets;
* the default port (80 for http, 443 for https) is removed, other ports are kept;
* the fragment is removed, dot-segments are resolved, an empty path becomes ``/``;
* percent-encoding is normalized: hex digits uppercased, escaped *unreserved*
  characters (``A-Z a-z 0-9 - . _ ~``) decoded, and characters that must be escaped
  (space, non-ASCII as UTF-8, ``"<>[]\\^`{|}``, a ``%`` not starting an escape)
  escaped. Escaped *reserved* characters (``%2F``, ``%26``, ``%3D``, ...) are never
  decoded: ``/a%2Fb`` and ``/a/b`` are different resources;
* the query keeps its order (``sort_query=True`` sorts it by key), an empty ``?``
  is dropped; URLs with userinfo (``user:pass@``) are rejected.

Parsing is done by ``yarl`` (the parser aiohttp uses, so the consumer fetches exactly
the URL we fingerprinted). Where yarl's own normalization does not fit it is
filled in here, which is why the URL is split with ``encoded=True`` and the path and
query are normalized by this module:

* yarl's requoting decodes escaped sub-delimiters (``%3B`` -> ``;`` in the path,
  ``%2C``/``%2F``/``%3F`` in the query), which can change meaning;
* it writes a space in the query as ``+`` (form encoding), which is a different
  URL for a server that does not use form encoding; we write ``%20``;
* it keeps a trailing dot on the host and does not validate ASCII host names
  (``a..b``, ``a_b!.com``) or label lengths;
* its port parser is Python's ``int()``, so ``:+80``, ``:8_0`` and full-width digits
  are accepted as port 80; we accept ASCII digits only, and not port 0;
* a bracketed ``[v1.x]`` (IPvFuture) host would come back without its brackets.

For the same reason, fetch a canonical URL as ``yarl.URL(url, encoded=True)`` (what
aiohttp is given): a plain ``URL(url)`` requotes it, so ``/a%3Bb`` would be
requested as ``/a;b`` and ``%2C`` in a query as ``,``.

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
from ipaddress import IPv4Address, IPv6Address
from urllib.parse import quote

from yarl import URL

__all__ = [
    "MAX_URL_BYTES",
    "RejectReason",
    "Rejection",
    "canonicalize",
    "fingerprint",
    "partition_of",
    "task_id",
]

MAX_URL_BYTES = 2048
"""Longest URL accepted, in UTF-8 bytes, both as input and as canonical output."""

_MAX_HOST_LEN = 253
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
_NO_HOST = Rejection(RejectReason.NO_HOST, "URL has no host")

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
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_HEX_LABEL = re.compile(r"0x[0-9a-f]*")

# Already-canonical URLs: lowercase scheme and LDH host, no port, no userinfo, no
# escapes, no fragment, nothing to escape, a non-empty query if any.
_FAST = re.compile(
    r"https?://([a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63})*)"
    f"(/[{_PATH_CHARS}]*)?"
    f"(?:\\?[{_QUERY_CHARS}]+)?"
)
_DIGITS = frozenset("0123456789")


def canonicalize(raw: str, *, sort_query: bool = False) -> str | Rejection:
    """Return the canonical form of ``raw``, or a :class:`Rejection`; never raises.

    ``sort_query=True`` also sorts the query parameters by key (stable, so repeated
    keys keep their order); use it only for sites where order does not matter.
    """
    try:
        url = raw.strip()
        if len(url) > MAX_URL_BYTES:
            return _TOO_LONG
        match = _FAST.fullmatch(url)
        if match is not None:
            host = match[1]
            path = match[2]
            if (
                host[-1] not in _DIGITS
                and len(host) <= _MAX_HOST_LEN
                and "0x" not in host
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
        return _canonicalize_full(url, sort_query)
    except Exception as exc:  # the contract is "never raises"
        return _unparseable(raw, exc)


def _canonicalize_slow(raw: str, *, sort_query: bool = False) -> str | Rejection:
    """``canonicalize`` without the fast path; the tests compare the two."""
    try:
        url = raw.strip()
        if len(url) > MAX_URL_BYTES:
            return _TOO_LONG
        return _canonicalize_full(url, sort_query)
    except Exception as exc:
        return _unparseable(raw, exc)


def _canonicalize_full(url: str, sort_query: bool) -> str | Rejection:
    """The full canonicalization of an already-stripped URL of at most 2048 chars."""
    if not url:
        return _EMPTY
    if not url.isascii() and len(url.encode("utf-8", "surrogatepass")) > MAX_URL_BYTES:
        return _TOO_LONG
    if (control := _CONTROL.search(url)) is not None:
        return Rejection(
            RejectReason.CONTROL_CHARS,
            f"control character U+{ord(control.group()):04X} at position {control.start()}",
        )
    try:
        # encoded=True: split only, do not requote (see the module docstring).
        parsed = URL(url, encoded=True)
    except ValueError as exc:
        return _unparseable(url, exc)
    scheme = parsed.scheme
    default_port = _DEFAULT_PORTS.get(scheme)
    if default_port is None:
        if not scheme:
            return _NO_SCHEME
        return Rejection(RejectReason.BAD_SCHEME, f"scheme {scheme[:16]!r} is not http or https")
    netloc = parsed.raw_authority
    if not netloc:
        return _NO_HOST
    if "@" in netloc:
        return _USERINFO
    bracketed = netloc[0] == "["
    port_text = netloc.partition("]")[2][1:] if bracketed else netloc.partition(":")[2]
    try:
        raw_host = parsed.raw_host
        port = parsed.explicit_port
    except ValueError:
        return _invalid_port(port_text)
    if not raw_host:
        return _NO_HOST
    if port is not None:
        if not (port_text.isascii() and port_text.isdigit()) or port == 0:
            return _invalid_port(port_text)
        if port == default_port:
            port = None
    host = _normalize_host(raw_host, bracketed)
    if isinstance(host, Rejection):
        return host

    path = _normalize_escapes(parsed.raw_path, _PATH_DIRTY, _PATH_TOKEN)
    if "/." in path:
        path = _remove_dot_segments(path)
    if not path:
        path = "/"
    query = parsed.raw_query_string
    if query:
        query = _normalize_escapes(query, _QUERY_DIRTY, _QUERY_TOKEN)
        if sort_query:
            query = _sort_query(query)

    authority = host if port is None else f"{host}:{port}"
    result = f"{scheme}://{authority}{path}?{query}" if query else f"{scheme}://{authority}{path}"
    if len(result) > MAX_URL_BYTES:  # the result is ASCII: chars == bytes
        return _TOO_LONG
    return result


def _invalid_port(port_text: str) -> Rejection:
    return Rejection(RejectReason.INVALID_PORT, f"invalid port {port_text[:16]!r}")


def _invalid_host(host: str, why: str) -> Rejection:
    return Rejection(RejectReason.INVALID_HOST, f"invalid host {host[:64]!r}: {why}")


def _unparseable(raw: object, exc: Exception) -> Rejection:
    # Parser messages may quote the authority; never echo them if it could hold
    # credentials.
    text = str(exc)
    if not isinstance(raw, str) or "@" in raw or "@" in text:
        text = ""
    detail = f"{type(exc).__name__}: {text[:120]}" if text else type(exc).__name__
    return Rejection(RejectReason.UNPARSEABLE, f"URL could not be parsed ({detail})")


@lru_cache(maxsize=16384)
def _normalize_host(raw_host: str, bracketed: bool) -> str | Rejection:
    """Lowercase, IDNA-encode and validate a host (hosts repeat a lot: cached)."""
    if len(raw_host) > _MAX_HOST_LEN + 1:
        return _invalid_host(raw_host, "too long")
    if "%" in raw_host:
        return _invalid_host(raw_host, "percent-encoded host or IPv6 zone id")
    if bracketed:
        try:
            address = IPv6Address(raw_host)
        except ValueError:
            return _invalid_host(raw_host, "not an IPv6 address")
        return f"[{address.compressed}]"
    try:
        # URL.build validates and lowercases the host, IDNA-encodes non-ASCII ones
        # (UTS 46, falling back to IDNA 2003) and compresses IP addresses.
        encoded = URL.build(scheme="http", host=raw_host).raw_host
    except ValueError as exc:  # UnicodeError is a ValueError
        return _invalid_host(raw_host, f"IDNA: {str(exc)[:80]}")
    if not encoded:
        return _invalid_host(raw_host, "empty")
    # The IDNA 2003 fallback keeps the case of ASCII labels. One trailing dot (the
    # DNS root) goes; IDNA may have mapped it from a full stop such as U+3002.
    encoded = encoded.lower()
    if encoded[-1] == ".":
        encoded = encoded[:-1]
    if len(encoded) > _MAX_HOST_LEN:
        return _invalid_host(raw_host, "longer than 253 characters")
    labels = encoded.split(".")
    for label in labels:
        if _LABEL.fullmatch(label) is None:
            return _invalid_host(raw_host, "empty label, bad character or label over 63")
    last = labels[-1]
    if last.isdigit() or _HEX_LABEL.fullmatch(last) is not None:
        # WHATWG: a host ending in a number is an IPv4 address, and must be one.
        # Only the dotted-quad form is accepted (not 127.1, 0x7f.1 or 2130706433).
        try:
            return str(IPv4Address(encoded))
        except ValueError:
            return _invalid_host(raw_host, "numeric but not a dotted-quad IPv4 address")
    return encoded


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


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4 for an absolute path: resolve "." and ".." segments."""
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _sort_query(query: str) -> str:
    return "&".join(sorted(query.split("&"), key=_query_key))


def _query_key(param: str) -> str:
    return param.partition("=")[0]


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
