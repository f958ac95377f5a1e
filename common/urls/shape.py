"""A URL's shape: what stays the same between the variants of one page.

Two URLs can be variants of one page only where they differ in a part that varies
between such variants: the query (a sort order, a filter, a session id), a path segment
that is a counter or a date (its digits), or one that is a token (a session id in the
path). A URL's **shape** is its path with those parts masked: each run of digits becomes
``#`` and a token-like segment ``*``; the query is left out (DUST, Bar-Yossef, Keidar and
Schonfeld, WWW 2007: duplicates differ by such rewrite rules). ``/events/2026/05/`` and
``/events/2027/11/`` have one shape, ``/doc/17.html`` and ``/doc/18.html`` another,
``/library/os.html`` and ``/library/re.html`` two of their own: a page is compared only
with pages of its shape (`common.traps.book`), never with a sibling of another path.

A **token** is what a server makes up rather than names: 16 or more characters of
``A-Z a-z 0-9 _ -``, with a digit, a letter and at least three changes between letters
and digits (``8f3a9c1d2e4b5a6f``, ``A1b2C3d4E5f6G7h8``), or a UUID. A slug
(``release-notes-2024``) is not one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from hashlib import blake2b

__all__ = ["common_directory", "counter_neighbours", "directory", "is_token", "is_variant",
           "masked", "shape",
           "shape_tag", "url_words"]

_DIGITS = re.compile(r"[0-9]+")
_DIGIT = re.compile(r"[0-9]")
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_-]{16,}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}")
_CHANGE = re.compile(r"[0-9](?=[A-Za-z])|[A-Za-z](?=[0-9])")
_WORD = re.compile(r"[^\W_]+")


def is_token(text: str) -> bool:
    """Whether `text` (a path segment or a query value) looks made up by a server: a
    session id, a cache buster, a UUID."""
    if len(text) < 16:
        return False
    if _UUID.fullmatch(text):
        return True
    return _TOKEN_CHARS.fullmatch(text) is not None and len(_CHANGE.findall(text)) >= 3


def _path_query(url: str) -> tuple[str, str]:
    """The path and query of an absolute http(s) URL (no fragment), cheaper than a
    parse."""
    after = url.find("/", url.find("://") + 3)
    if after < 0:
        return "/", ""
    path, _, query = url[after:].partition("#")[0].partition("?")
    return path, query


def shape(url: str) -> str:
    """The shape of an absolute URL's path: digit runs as ``#``, token segments as
    ``*`` (the query and the host left out)."""
    path, _ = _path_query(url)
    return "/".join("*" if is_token(s) else _DIGITS.sub("#", s) for s in path.split("/"))


def counter_neighbours(url: str, links: Iterable[str]) -> set[str]:
    """The links one step from `url` in a counter (one run of digits one more or one less,
    all else the same: the previous and the next month, or page) when it links both ways:
    a page between its neighbours, as an empty month or an empty page past a listing's
    last is. Empty when it links one way only (a class page's member list one number on,
    in a generator's counter names) or a step changes two runs (December's next month)."""
    form, runs = _counter(url)
    ways: dict[int, dict[int, list[str]]] = {}  # the run that steps -> +1/-1 -> links
    for link in links:
        other, values = _counter(link)
        if other != form or len(values) != len(runs):
            continue
        differ = [i for i, (a, b) in enumerate(zip(runs, values, strict=True)) if a != b]
        if len(differ) == 1 and abs(step := values[differ[0]] - runs[differ[0]]) == 1:
            ways.setdefault(differ[0], {}).setdefault(step, []).append(link)
    return {link for by_way in ways.values() if len(by_way) == 2
            for found in by_way.values() for link in found}


def _counter(url: str) -> tuple[str, list[int]]:
    """`url` (no fragment) with its runs of digits as ``#``, and their values."""
    url = url.partition("#")[0]
    return _DIGITS.sub("#", url), [int(run) for run in _DIGITS.findall(url)]


def masked(url: str) -> str:
    """`url` with its token path segments and query values as ``*`` (a link under
    another session id is the same link); `url` itself when it has none."""
    if len(url) < 40:  # a scheme, a host and a 16-character token at least
        return url
    head, q, query = url.partition("?")
    start = head.find("/", head.find("://") + 3)
    if start >= 0:
        segments = head[start:].split("/")
        if any(is_token(s) for s in segments):
            head = head[:start] + "/".join("*" if is_token(s) else s for s in segments)
    if q:
        pairs = [p.partition("=") for p in query.split("&")]
        query = "&".join(f"{k}{eq}{'*' if is_token(v) else v}" for k, eq, v in pairs)
    return f"{head}{q}{query}"


def is_variant(url: str) -> bool:
    """Whether `url` may be a variant of another page: it has a query, a digit or a
    token in its path."""
    path, query = _path_query(url)
    return bool(query) or _DIGIT.search(path) is not None or any(
        is_token(s) for s in path.split("/") if len(s) >= 16)


def shape_tag(host: str, url: str) -> int:
    """A 32-bit tag of `host` and `url`'s shape (what the fleet stores beside a page's
    fingerprint)."""
    digest = blake2b(f"{host} {shape(url)}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def directory(url: str) -> str:
    """The directory of `url`'s path: up to and with its last ``/``."""
    path, _ = _path_query(url)
    return path[:path.rfind("/") + 1] or "/"


def common_directory(a: str, b: str) -> str:
    """The deepest directory two paths (or URLs' directories) share."""
    parts = []
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1], strict=False):
        if x != y:
            break
        parts.append(x)
    return "/".join(parts) + "/" if parts else "/"


def url_words(url: str) -> frozenset[str]:
    """The words of `url`'s path and query of three letters or more, lowercased: what a
    page that echoes its URL (``/old/kalo-mine.html was not found``) says of it; a shorter
    one (``/dir/a/``) is as likely a word of any page (``a``)."""
    path, query = _path_query(url)
    return frozenset(w.lower() for w in _WORD.findall(f"{path} {query}") if len(w) >= 3)
