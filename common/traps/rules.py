"""Crawler-trap rules for the links a crawl follows: what a URL's own text says.

A trap is a part of a site that makes URLs without end: a calendar's "next month", a
relative link that repeats path segments (``/a/b/a/b/a/...``), faceted search (every
combination of query parameters), session ids in every link. The crawl's policy sets
these rules (``trap_*``, ``common.policy``); the link intake (``consumer.intake``)
applies them to every link a handler found that is not in its seen cache, before the
link reaches the queue. A seed is the operator's word: the producer applies none.

- `strip_session_ids` (``trap_session_ids``) drops a session id from a link (a query
  parameter or a ``;jsessionid=`` path parameter): the page under another session is
  the same page, and the crawl's dedup then sees it so. The names are Nutch's default
  URL normalizer's (``regex-normalize.xml``: ``sid``, ``jsessionid``, ``phpsessid``,
  ``sessionid``, with ``l``/``j``/``bv_`` prefixes) and Heritrix's ``StripSessionIDs``
  (``aspsessionid<8 letters>``); the value must look like a token (16 or more of
  ``A-Z a-z 0-9 . _ -``, Heritrix asks 32), so a short ``sid=12`` (a story id) stays.
- `TrapRules.judge` refuses a link by the first rule it breaks, cheapest first, each a
  code of its own (`REFUSALS`, the link fates ``crawlq_links_total{fate}`` counts):
  ``trap_length`` (longer than ``trap_max_url_length``), ``trap_segments`` (more path
  segments than ``trap_max_segments``), ``trap_repeats`` (a path segment that occurs
  more than ``trap_repeated_segments`` times), ``trap_params`` (more query parameters
  than ``trap_max_params``).
- ``trap_facets`` (`TrapRules.facet_links`) judges a page's links together: a page
  whose links to its own path vary more than ``trap_page_facets`` parameters by a value
  that is not a number is a faceted search (filters and sort orders that combine into
  every combination of them: a shop's color x size x brand x sort), and those links are
  refused, the ones that only change numbers (pagination, offsets, ids) followed. The
  unfiltered listing and its pages hold every item a filter shows; a sort order shows
  the same items. Google's guidance on faceted navigation has sites keep crawlers out
  of such links; Nutch's default URL filter refuses every URL with a query.
- ``trap_variants`` (more distinct query strings for one host and path than
  ``trap_path_variants``) needs the fleet's count: ``common.traps.book`` keeps it in
  Redis; `variant_of` gives the (path, query) hashes it counts.

A rule at 0 is off.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from urllib.parse import parse_qsl

from common.urls.shape import is_token

__all__ = ["FACETS", "PAGINATION", "REFUSALS", "TrapRules", "fresh_tokens",
           "is_session_value", "strip_session_ids", "variant_of", "without_tokens"]

#: Query parameters that page through a listing: a link that changes only these is
#: never a facet (the unfiltered listing and its pages hold every item a filter shows).
PAGINATION = frozenset({"page", "pg", "paged", "pagenum", "page_num", "pageno", "page_no",
                        "pn", "start", "offset", "from", "skip", "cursor", "after",
                        "before"})
_WORDLIKE = re.compile(r"[A-Za-z0-9_-]+")
#: A fresh session token is shared by links to at least this many paths ...
TOKEN_PATHS = 3
#: ... that make at least this share of the page's links to its host.
TOKEN_SHARE = 0.6
LENGTH = "trap_length"
SEGMENTS = "trap_segments"
REPEATS = "trap_repeats"
PARAMS = "trap_params"
FACETS = "trap_facets"
VARIANTS = "trap_variants"
#: The link fates a trap rule gives, in the order the rules are tried.
REFUSALS = (LENGTH, SEGMENTS, REPEATS, PARAMS, FACETS, VARIANTS)

# A cheap test first: only a URL that holds one of these can carry a session id.
_SESSION_HINT = re.compile(r"sid=|session_?id", re.IGNORECASE)
_SESSION_PARAM = re.compile(
    r"(?:[lj]|bv_)?sid|(?:j|php)?sessid|(?:j)?session_?id|aspsessionid[a-z]{8}",
    re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9._-]{16,}")
_PATH_SESSION = re.compile(r";jsessionid=[A-Za-z0-9._-]{16,}", re.IGNORECASE)


def strip_session_ids(url: str) -> str:
    """`url` (canonical) without its session-id query parameters and ``;jsessionid=``
    path parameter; `url` itself when it has none."""
    if not _SESSION_HINT.search(url):
        return url
    rest, q, query = url.partition("?")
    rest = _PATH_SESSION.sub("", rest)
    if q:
        kept = [p for p in query.split("&") if not _is_session(p)]
        return f"{rest}?{'&'.join(kept)}" if kept else rest
    return rest


def _is_session(param: str) -> bool:
    name, eq, value = param.partition("=")
    return bool(eq) and _SESSION_PARAM.fullmatch(name) is not None \
        and _TOKEN.fullmatch(value) is not None


def _path_query(url: str) -> tuple[str, str]:
    """The path and query of a canonical http(s) URL (no fragment: canonical URLs have
    none), cheaper than a URL parse."""
    after = url.find("/", url.find("://") + 3)
    if after < 0:
        return "/", ""
    path, _, query = url[after:].partition("?")
    return path, query


@dataclass(frozen=True, slots=True)
class TrapRules:
    """The policy's URL trap rules (0: that rule is off; the defaults are the policy's,
    ``CrawlPolicy.trap_rules``)."""

    max_url_length: int
    max_segments: int
    repeated_segments: int
    max_params: int
    path_variants: int
    session_ids: bool
    page_facets: int

    def judge(self, url: str) -> str | None:
        """The first rule canonical `url` breaks (a `REFUSALS` code but
        ``trap_variants``, which is the fleet's count), or None."""
        if self.max_url_length and len(url) > self.max_url_length:
            return LENGTH
        path, query = _path_query(url)
        if self.max_segments or self.repeated_segments:
            segments = [s for s in path.split("/") if s]
            if self.max_segments and len(segments) > self.max_segments:
                return SEGMENTS
            limit = self.repeated_segments
            if limit and len(segments) > limit and _most_repeated(segments) > limit:
                return REPEATS
        if self.max_params and query and query.count("&") >= self.max_params \
                and sum(1 for p in query.split("&") if p) > self.max_params:
            return PARAMS
        return None

    def facet_links(self, page: str, links: Iterable[object]) -> frozenset[str]:
        """The links (strings) of canonical `page` that a faceted search makes
        (``trap_facets``): those to `page`'s own path that set a parameter to a value
        `page`'s query has not, and not a number, when such links vary more than
        ``page_facets`` parameters; none otherwise. A link only its page makes a facet:
        the same URL linked from a page of another kind is judged there on its own."""
        if not self.page_facets:
            return frozenset()
        prefix = page.partition("?")[0] + "?"
        own = set(parse_qsl(page.partition("?")[2], keep_blank_values=True))
        varied: dict[str, list[str]] = {}  # parameter name -> the links that vary it
        for link in links:
            if not isinstance(link, str) or not link.startswith(prefix):
                continue
            query = link[len(prefix):].partition("#")[0]
            for name in {name for name, value in parse_qsl(query, keep_blank_values=True)
                         if value and name.lower() not in PAGINATION
                         and (name, value) not in own}:
                varied.setdefault(name, []).append(link)
        if len(varied) <= self.page_facets:
            return frozenset()
        return frozenset(link for links in varied.values() for link in links)


def is_session_value(text: str) -> bool:
    """Whether a query value or path segment may be a session id: a token
    (``common.urls.shape.is_token``), or 10 or more digits."""
    return is_token(text) or (len(text) >= 10 and text.isascii() and text.isdigit())


def fresh_tokens(page: str, links: Iterable[object]) -> dict[str, str]:
    """The session tokens fresh per visit that canonical `page`'s links show, each rule
    (``q:<name>``, a query parameter, or ``p:<index>``, a path segment) with the value its
    links carry: a session value (`is_session_value`) that `page`'s own URL does not hold
    (a visitor's new session, not the page's own id), the same in links to at least
    `TOKEN_PATHS` paths that make at least `TOKEN_SHARE` of the page's links to its host:
    a server that puts a session id in every link of a response. An id shared by a few
    links (a friend's pages), or the page's own (a category's listing pages), is not
    one."""
    home = page[:page.find("/", page.find("://") + 3)] + "/"
    seen: dict[tuple[str, str], set[str]] = {}  # (rule, value) -> rest of the paths
    total = 0
    for link in links:
        if not isinstance(link, str) or not link.startswith(home):
            continue
        total += 1
        lpath, lquery = _path_query(link)
        if lquery:
            for name, value in parse_qsl(lquery):
                if len(value) >= 10 and "." not in value:  # as a session value may be
                    seen.setdefault((f"q:{name}", value), set()).add(lpath)
        if len(lpath) < 11:
            continue
        segments = lpath.split("/")
        for i, segment in enumerate(segments):
            if len(segment) >= 10 and "." not in segment:  # not a file's name
                seen.setdefault((f"p:{i}", segment), set()).add("/".join(segments[i + 1:]))
    # shared widely first (few values are), a session value then: a page's links are many
    return {rule: value for (rule, value), paths in seen.items()
            if len(paths) >= TOKEN_PATHS and len(paths) >= TOKEN_SHARE * total
            and value not in page and is_session_value(value)}


def without_tokens(url: str, rules: Mapping[str, str]) -> str | None:
    """The key canonical `url` is deduplicated by under its host's learned token rules
    (`fresh_tokens`): a rule's query parameter left out, and a path before and with a
    rule's segment (a ``/s/<token>/`` prefix) left out, when they hold a session value,
    so the page under a session is the page its plain links reached; None when no rule
    changes it."""
    if not rules:
        return None
    path, query = _path_query(url)
    head = url[:len(url) - len(path) - (len(query) + 1 if query else 0)]
    changed = False
    if query:
        kept = [p for p in query.split("&") if not (
            f"q:{p.partition('=')[0]}" in rules
            and _learned_value(p.partition("=")[2], rules[f"q:{p.partition('=')[0]}"]))]
        changed = len(kept) != query.count("&") + 1
        query = "&".join(kept)
    segments = path.split("/")
    for i in range(len(segments) - 1, 0, -1):
        if f"p:{i}" in rules and _learned_value(segments[i], rules[f"p:{i}"], segment=True):
            segments = ["", *segments[i + 1:]]
            changed = True
            break
    if not changed:
        return None
    return head + "/".join(segments) + (f"?{query}" if query else "")


def _learned_value(text: str, like: str, *, segment: bool = False) -> bool:
    """Whether a value of a learned token parameter or segment is a session's: a session
    value; as long as one, of letters and digits both (a search's ``?s=python`` stays);
    or as long as the value it was learned with (`like`: a server's ids have one
    length), of its characters, with a digit or both cases (a random id may have too
    few changes between letters and digits to pass `is_token`: 1 in ~15 of 24
    characters; a slug of that length stays). A path `segment` names a page more often
    than a query value: only one as long as `like` passes but a session value."""
    if is_session_value(text):
        return True
    if len(text) < 12 or _WORDLIKE.fullmatch(text) is None \
            or (segment and len(text) != len(like)):
        return False
    digit, alpha = any(c.isdigit() for c in text), any(c.isalpha() for c in text)
    if digit and alpha:
        return True
    return len(text) == len(like) and (digit or (
        any(c.isupper() for c in text) and any(c.islower() for c in text)))


def _most_repeated(segments: list[str]) -> int:
    """How often the most frequent of `segments` occurs."""
    counts: dict[str, int] = {}
    for s in segments:
        counts[s] = counts.get(s, 0) + 1
    return max(counts.values())


def variant_of(url: str) -> tuple[bytes, bytes] | None:
    """For a canonical URL with a query: an 8-byte hash of its path and a 4-byte hash
    of its query (what ``trap_variants`` counts per host and path); None without a
    query."""
    path, query = _path_query(url)
    if not query:
        return None
    return (blake2b(path.encode(), digest_size=8).digest(),
            blake2b(query.encode(), digest_size=4).digest())
