"""Generated sites of real pages beside crawler traps, one per seed (bench/trap_bench.py's
corpus; tests/test_trap_corpus.py serves small ones in-process).

``Site(seed)`` is a deterministic site (``random.Random(seed)``): its real pages, its
traps, and ``answer(method, path, query) -> (status, headers, body)`` for any request
(redirects with a ``Location``); only what a trap makes fresh per visit (a session
token) is not the seed's. It knows every request: ``real_key`` (the real page a request
fetches, tokens dropped), ``trap_of`` (the trap family a request is in, None for a real
page's own URL), ``real_paths`` and ``depth`` (links from ``/`` over real pages'
own links), ``describe()``.

**Real pages** look alike, as a documentation tree's do: one template (a navigation bar,
a header and a footer, 100-200 words of the site's vocabulary, which is Zipf-distributed
like a language's) and text of their own from the same vocabulary: long pages (150-400
own words), short ones (15-40), and families of near-identical siblings (products of one
line: a name, a price and a few words apart). Sections list their items on pages of 8-25
with pagination (``?page=N``, ``/page/N/`` or ``/list?cat=K&page=N``: first, previous,
next, last and the pages around), items at counter paths (``/item/17``, ``/p/17.html``),
by slug, or by a query that matters (``/item?id=<uuid>``); some items have a page of
their own that only they link (specifications, notes); one item starts a chain of 8-15
short "older entries" pages whose last one alone links 4-15 more (the deepest pages);
maybe a shop (a listing of product siblings). Every real page is reachable from ``/`` by
the links of real pages without a session token, and every body is distinct.

**Trap families** (``FAMILIES``; a site has 3-6 of them, more on larger sites, each with
parameters of its own, each reached from several real pages):

- ``session ids``: the items of one or two sections carry a fresh token on every internal
  link (a new one per response), in the query under a known name (``sid``, ``jsessionid``,
  ``PHPSESSID``, ...) or another (``s``, ``token``, ``v``, ...), or in the path (a
  ``/s/<token>/`` prefix, ``;jsessionid=<token>``); the page under a token is the page;
- ``soft 404``: a catch-all, at the root or under one directory, answers any unknown path
  200 with a "not found" page, short (< 16 words, no template) or in the template, its
  title fixed or echoing the path, linking 1-3 fresh random paths of its own; a few real
  pages have a dead link into it;
- ``faceted search``: the shop's listing links every filter: 3-5 parameters of 3-6 values
  each, words or numbers (``/shop?c=1&s=2&p=3``), each link adding, changing or dropping
  one; the unfiltered listing is the real page and links every product;
- ``calendar``: months by path (``/events/2026/05/``) or query (``?month=2026-05``,
  ``?y=2026&m=5``), previous and next for ever, empty or with an event or two;
- ``repeated segments``: a few items link ``files/`` (relative), a listing whose relative
  links (``archive/``, ``2026/``, ...) nest for ever;
- ``redirects``: a loop (A -> B -> A) or a chain to fresh URLs (each hop a new one);
- ``endless pagination``: past a section's last page, ``?page=N`` (or ``/page/N/``)
  answers an empty listing with a "next" link, for ever; the last real page links it.

A request no page and no trap answers gets a 404 (robots.txt always does).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import html
import itertools
import random
import re
import secrets
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode
from zlib import crc32

__all__ = ["FAMILIES", "Site", "serve"]

SESSION_IDS = "session ids"
SOFT_404 = "soft 404"
FACETS = "faceted search"
CALENDAR = "calendar"
SEGMENTS = "repeated segments"
REDIRECTS = "redirects"
PAGINATION = "endless pagination"
#: Every trap family a site may have.
FAMILIES = (SESSION_IDS, SOFT_404, FACETS, CALENDAR, SEGMENTS, REDIRECTS, PAGINATION)
#: What ``trap_of`` says of a request no real page and no trap answers (a 404).
NOT_FOUND = "not found"

Answer = tuple[int, dict[str, str], str]
Query = list[tuple[str, str]]
HTML = {"Content-Type": "text/html; charset=utf-8"}

_SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "ge", "zu", "sha",
              "mor", "len", "tis", "bar", "qui", "fel", "dro", "an", "el", "or", "un", "ist",
              "tro", "ga", "cy", "bel", "nix", "ost", "ra", "wen", "dal", "pri", "cor", "vo",
              "hu", "ix", "pe")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class Vocabulary:
    """A site's words (2-3 syllables of its own set), drawn Zipf-like: a few common,
    most rare, as in a language."""

    def __init__(self, rng: random.Random) -> None:
        syllables = rng.sample(_SYLLABLES, rng.randint(16, 28))
        words = sorted({a + b for a in syllables for b in syllables}
                       | {a + b + c for a in syllables for b in syllables
                          for c in syllables[:8]})
        rng.shuffle(words)
        self.words = words[:rng.randint(800, 2500)]
        skew = rng.uniform(0.7, 1.1)
        self._cum = list(itertools.accumulate(1 / (i + 1) ** skew
                                              for i in range(len(self.words))))

    def draw(self, rng: random.Random, n: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self._cum, k=n)

    def rare(self, rng: random.Random, n: int) -> list[str]:
        """`n` words of the rarer half (names, models)."""
        return rng.sample(self.words[len(self.words) // 2:], n)


def _title(words: list[str]) -> str:
    return " ".join(w.capitalize() if i == 0 else w for i, w in enumerate(words))


@dataclass
class Page:
    """A real page: its text and its links (keys of real pages), and the links the traps
    put on it (hrefs, absolute or relative)."""

    key: str
    kind: str  # home, about, listing, item, sibling, short, child, chain, hidden, shop
    title: str
    paras: list[str]
    links: list[tuple[str, str]] = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=list)
    tokens: bool = False  # every internal link carries a fresh session token


@dataclass
class Section:
    """Items listed on numbered pages."""

    name: str
    items: list[str]  # keys
    per_page: int
    pagination: str  # "query" (?page=N), "path" (/page/N/), "list" (/list?cat=K&page=N)
    cat: int
    endless: bool = False  # past its last page: endless pagination

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.items) // self.per_page))

    def page_key(self, n: int) -> str:
        if self.pagination == "list":
            return f"/list?cat={self.cat}" + (f"&page={n}" if n > 1 else "")
        if n == 1:
            return f"/{self.name}/"
        return f"/{self.name}/?page={n}" if self.pagination == "query" \
            else f"/{self.name}/page/{n}/"

    def page_of(self, path: str, query: Query) -> int | None:
        """The page number a request asks for, if it is one of this section's (any
        number: past the last too), else None."""
        q = dict(query)
        if self.pagination == "list":
            if path != "/list" or q.get("cat") != str(self.cat) or set(q) - {"cat", "page"}:
                return None
            n = q.get("page", "1")
        elif self.pagination == "query":
            if path != f"/{self.name}/" or set(q) - {"page"}:
                return None
            n = q.get("page", "1")
        else:
            if query:
                return None
            m = re.fullmatch(rf"/{re.escape(self.name)}/(?:page/(\d+)/)?", path)
            if m is None:
                return None
            n = m[1] or "1"
        return int(n) if n.isascii() and n.isdigit() and len(n) < 9 else None


class Site:
    """A generated site (see the module's docstring); `families`, `real` (the real pages
    aimed at) and `options` (a family's parameters by name, e.g. ``{"soft 404":
    {"short": True}}``) fix what the seed would draw: tests use small sites of chosen
    families and variants."""

    def __init__(self, seed: int, *, families: tuple[str, ...] | None = None,
                 real: int | None = None,
                 options: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.seed = seed
        rng = random.Random(seed)
        self.vocab = Vocabulary(rng)
        self.name = _title(self.vocab.rare(rng, 2))
        self.skeleton = rng.randrange(3)
        self.header = " ".join(self.vocab.draw(rng, rng.randint(30, 80)))
        self.footer = " ".join(self.vocab.draw(rng, rng.randint(60, 120)))
        target = real if real is not None else rng.randint(150, 500)
        if families is None:
            most = min(len(FAMILIES), 3 + max(0, target - 150) // 90)
            families = tuple(rng.sample(FAMILIES, rng.randint(3, max(3, most))))
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown trap families {sorted(unknown)}; known: {FAMILIES}")
        self.pages: dict[str, Page] = {}
        self.sections: list[Section] = []
        self.nav: list[tuple[str, str]] = []
        self._titles: set[str] = set()
        self._counters = {"item": rng.randint(1, 900), "p": rng.randint(1, 900)}
        self.shop: Shop | None = None
        _build_real(self, rng, target, FACETS in families or rng.random() < 0.4)
        self.traps: dict[str, Trap] = {}
        for name in FAMILIES:  # one order, whatever order `families` came in
            if name in families:
                self.traps[name] = TRAPS[name](self, rng, (options or {}).get(name, {}))
        self.tokens = self.traps.get(SESSION_IDS)
        self.catch_all = self.traps.get(SOFT_404)
        self.depth = self._depths()
        if len(self.depth) != len(self.pages):
            lost = sorted(set(self.pages) - set(self.depth))[:5]
            raise AssertionError(f"seed {seed}: real pages no plain link reaches: {lost}")

    # -- what a crawl is judged by ---------------------------------------------------------

    @property
    def real_paths(self) -> set[str]:
        """Every real page's key: its path and query (``/list?cat=3&page=2``)."""
        return set(self.pages)

    @property
    def deepest(self) -> int:
        return max(self.depth.values())

    def kind_of(self, key: str) -> str:
        return self.pages[key].kind

    def real_key(self, path_qs: str) -> str | None:
        """The real page a request (path and query as sent) fetches, tokens dropped; None
        when it fetches none."""
        path, query, _ = self._untoken(*_split(path_qs))
        key = _key(path, query)
        return key if key in self.pages else None

    def trap_of(self, path_qs: str) -> str | None:
        """The trap family a request belongs to (``NOT_FOUND`` for a 404 no trap makes);
        None for a real page's own URL (a real page under a session token is in
        ``session ids``)."""
        return self._route(*_split(path_qs))[0]

    def floor(self) -> dict[str, int]:
        """Requests in traps, by family, that no crawler can avoid without knowing the
        site and still find every real page: what a link leads to is known only once
        fetched (the first empty page past a listing's last, a loop's second hop, a dead
        link, a probe of the root and of a catch-all's directory, a calendar's entry
        month, a nesting listing and its children). A trap a URL gives away (a session
        token, a facet) costs 0."""
        floor = {name: n for name, t in self.traps.items() if (n := t.floor())}
        # One probe of the root, the way of finding soft 404s: a 404 but where the
        # root is a catch-all.
        root = SOFT_404 if isinstance(self.catch_all, SoftNotFound) and self.catch_all.root \
            else NOT_FOUND
        floor[root] = floor.get(root, 0) + 1
        segments = self.traps.get(SEGMENTS)
        if isinstance(segments, Segments) and segments.parent:
            parent = self.trap_of(segments.dir)
            if parent is not None:
                floor[parent] = floor.get(parent, 0) + 1
        return floor

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for p in self.pages.values():
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        styles = ", ".join(sorted({s.pagination for s in self.sections}))
        traps = "; ".join(f"{name} ({t.describe()})" for name, t in self.traps.items())
        return (f"seed {self.seed}: {len(self.pages)} real pages, deepest {self.deepest} "
                f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}); "
                f"{len(self.sections)} sections, pagination {styles}; traps: {traps}")

    # -- answering -------------------------------------------------------------------------

    def answer(self, method: str, path: str, query: Mapping[str, str] | str = "") -> Answer:
        """The response to a request: `path` as sent (``;jsessionid=`` and all), `query`
        its raw query string or its parameters."""
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD", **HTML}, "method not allowed"
        pairs = parse_qsl(query, keep_blank_values=True) if isinstance(query, str) \
            else list(query.items())
        status, headers, body = self._route(path, pairs)[1]()
        return status, headers, "" if method == "HEAD" else body

    def answer_uri(self, method: str, path_qs: str) -> Answer:
        path, _, query = path_qs.partition("?")
        return self.answer(method, path, query)

    def serve(self, log: Path) -> None:
        """Serve the site until killed (`serve`)."""
        serve(self, log)

    def _untoken(self, path: str, query: Query) -> tuple[str, Query, bool]:
        if self.tokens is None:
            return path, query, False
        return self.tokens.strip(path, query)

    def _route(self, path: str, query: Query) -> tuple[str | None, Callable[[], Answer]]:
        """(the family, None for a real page, and what answers) for a request."""
        if path == "/robots.txt":
            return NOT_FOUND, lambda: (404, {"Content-Type": "text/plain"}, "")
        plain, plain_query, tokened = self._untoken(path, query)
        page = self.pages.get(_key(plain, plain_query))
        if page is not None:
            return (SESSION_IDS if tokened else None), lambda: (200, HTML, self.render(page))
        for name, trap in self.traps.items():
            if trap is not self.catch_all and (how := trap.claim(plain, plain_query)):
                return name, how
        if self.catch_all is not None and (how := self.catch_all.claim(plain, plain_query)):
            return SOFT_404, how
        return NOT_FOUND, lambda: (404, HTML, "<html><body><h1>404 Not Found</h1></body></html>")

    # -- rendering -------------------------------------------------------------------------

    def render(self, page: Page) -> str:
        """A real page in the site's template (fresh tokens on its links if it has them)."""
        tokened = self.tokens is not None and page.tokens
        token = self.tokens.fresh() if self.tokens is not None and tokened else ""

        def href(h: str) -> str:
            return self.tokens.put(h, token) if tokened and self.tokens is not None else h

        links = [(href(k), t) for k, t in page.links] + [(href(h), t) for h, t in page.extra]
        return self.html(page.title, page.paras, links, href)

    def html(self, title: str, paras: list[str], links: list[tuple[str, str]],
             href: Callable[[str], str] = str) -> str:
        """A page in the template: `links` (hrefs as given) in its body."""
        nav = [(href(h), t) for h, t in self.nav]
        esc = html.escape
        items = "".join(f'<li><a href="{esc(h)}">{esc(t)}</a></li>' for h, t in links)
        text = "".join(f"<p>{esc(p)}</p>" for p in paras)
        navs = " ".join(f'<a href="{esc(h)}">{esc(t)}</a>' for h, t in nav)
        head = f"<!doctype html><html><head><title>{esc(title)} - {self.name}</title></head>"
        if self.skeleton == 0:
            body = (f"<header><nav>{navs}</nav><p>{self.header}</p></header><main>"
                    f"<h1>{esc(title)}</h1>{text}<ul>{items}</ul></main>"
                    f"<footer><p>{self.footer}</p></footer>")
        elif self.skeleton == 1:
            body = (f'<div id="top"><div class="menu">{navs}</div><div class="banner">'
                    f'{self.header}</div></div><div id="content"><h2>{esc(title)}</h2>{text}'
                    f'<div class="links"><ul>{items}</ul></div></div>'
                    f'<div id="bottom">{self.footer}</div>')
        else:
            side = "<br>".join(f'<a href="{esc(h)}">{esc(t)}</a>' for h, t in nav)
            body = (f'<table><tr><td class="side">{side}</td><td><p class="intro">'
                    f"{self.header}</p><h1>{esc(title)}</h1>{text}<ol>{items}</ol></td></tr>"
                    f'</table><div class="foot">{self.footer}</div>')
        return f"{head}<body>{body}</body></html>"

    # -- building ---------------------------------------------------------------------------

    def add(self, page: Page) -> Page:
        assert page.key not in self.pages, page.key
        self.pages[page.key] = page
        return page

    def unique_title(self, rng: random.Random, words: int) -> str:
        while True:
            title = _title(self.vocab.rare(rng, words))
            if title not in self._titles:
                self._titles.add(title)
                return title

    def counter(self, name: str) -> int:
        self._counters[name] += 1
        return self._counters[name]

    def _depths(self) -> dict[str, int]:
        """Links from ``/`` to each real page over real pages' plain links (a page whose
        links carry tokens leads nowhere here: no real page needs it)."""
        depth = {"/": 0}
        todo = deque(["/"])
        while todo:
            key = todo.popleft()
            page = self.pages[key]
            if page.tokens:
                continue
            for target, _ in page.links:
                if target not in depth:
                    depth[target] = depth[key] + 1
                    todo.append(target)
        return depth


def _split(path_qs: str) -> tuple[str, Query]:
    path, _, query = path_qs.partition("?")
    return path, parse_qsl(query, keep_blank_values=True)


def _key(path: str, query: Query) -> str:
    """A real page's key for a path and query: the query sorted by name."""
    return f"{path}?{urlencode(sorted(query))}" if query else path


def _hash(*parts: object) -> int:
    return crc32("\0".join(map(str, parts)).encode())


# -- the real pages ---------------------------------------------------------------------------

ITEM_STYLES = ("counter", "html", "slug", "dir", "uuid")


def _item_key(site: Site, rng: random.Random, style: str, section: str) -> str:
    if style == "counter":
        return f"/item/{site.counter('item')}"
    if style == "html":
        return f"/p/{site.counter('p')}.html"
    if style == "uuid":
        return f"/item?id={uuid.UUID(int=rng.getrandbits(128), version=4)}"
    n = site.counter("item")
    return f"/{section}/{n}/" if style == "dir" else \
        f"/{section}/{site.vocab.rare(rng, 1)[0]}-{n}.html"


def _child_key(key: str) -> str:
    if "?" in key:
        return key + "&view=notes"  # (id=<uuid>&view=notes: sorted)
    if key.endswith("/"):
        return key + "notes/"
    if key.endswith(".html"):
        return key[:-5] + "-notes.html"
    return key + "/notes"


def _build_real(site: Site, rng: random.Random, target: int, shop: bool) -> None:
    """The real pages: home, about, sections of items, maybe a shop, a deep chain."""
    v = site.vocab
    home = site.add(Page("/", "home", site.name, _paras(rng, v.draw(rng, rng.randint(80, 200)))))
    about = site.add(Page("/about.html", "about", "About " + site.name,
                          _paras(rng, v.draw(rng, rng.randint(150, 300)))))
    about.links.append(("/", "home"))
    chain_len, hidden = rng.randint(8, 15), min(rng.randint(4, 15), max(4, target // 25))
    if shop:
        site.shop = Shop(site, rng)
        home.links.append((site.shop.path, "shop"))
    left = target - len(site.pages) - chain_len - hidden
    sections = rng.randint(3, 8)
    names = v.rare(rng, sections)
    weights = [rng.uniform(0.5, 2.0) for _ in names]
    for i, name in enumerate(names):
        per_page = rng.randint(8, 25)
        # items, their listing pages and ~15% notes pages share the section's part
        share = left * weights[i] / sum(weights)
        n = max(3, int(share / (1.15 + 1 / per_page)))
        section = Section(name, [], per_page, rng.choice(("query", "path", "list")), i + 1)
        _fill(site, rng, section, n, rng.choice(ITEM_STYLES))
        site.sections.append(section)
    site.nav = [("/", "home")] + [(s.page_key(1), s.name) for s in site.sections] \
        + [("/about.html", "about")]
    home.links += [(s.page_key(1), s.name) for s in site.sections] + [("/about.html", "about")]
    items = [k for s in site.sections for k in s.items]
    home.links += [(k, site.pages[k].title) for k in rng.sample(items, min(6, len(items)))]
    _chain(site, rng, rng.choice(items), chain_len, hidden)


def _paras(rng: random.Random, words: list[str]) -> list[str]:
    """`words` as 1-5 paragraphs."""
    cuts = sorted(rng.sample(range(1, len(words)), min(len(words) - 1, rng.randint(0, 4))))
    return [" ".join(words[a:b]) for a, b in itertools.pairwise([0, *cuts, len(words)])]


def _fill(site: Site, rng: random.Random, section: Section, n: int, style: str) -> None:
    """`n` items at paths of `style` in `section`, and its listing pages."""
    v, name, per_page = site.vocab, section.name, section.per_page
    family: tuple[list[str], str] | None = None  # a sibling line: its text and name
    for _ in range(n):
        key = _item_key(site, rng, style, name)
        roll = rng.random()
        if (family is not None and rng.random() < 0.7) or roll < 0.15:
            if family is None or rng.random() < 0.2:
                family = (v.draw(rng, rng.randint(60, 150)), site.unique_title(rng, 1))
            page = _sibling(site, rng, key, family[0], family[1])
        else:
            family = None
            own = rng.randint(150, 400) if roll < 0.6 else rng.randint(15, 40)
            page = Page(key, "item" if own > 40 else "short", site.unique_title(rng, 3),
                        _paras(rng, v.draw(rng, own)))
        site.add(page)
        section.items.append(key)
        if rng.random() < 0.15:
            child = site.add(Page(_child_key(key), "child", page.title + ": notes",
                                  _paras(rng, v.draw(rng, rng.randint(20, 120)))))
            child.links.append((key, "back"))
            page.links.append((child.key, "notes"))
    for p in range(1, section.pages + 1):
        shown = section.items[(p - 1) * per_page:p * per_page]
        paras = ([" ".join(v.draw(rng, rng.randint(20, 60)))] if p == 1 else []) + [
            f"{site.pages[k].title}: {' '.join(site.pages[k].paras[0].split()[:10])}"
            for k in shown]
        listing = site.add(Page(section.page_key(p), "listing",
                                f"{name.capitalize()}, page {p} of {section.pages}", paras))
        listing.links += [(k, site.pages[k].title) for k in shown]
        listing.links += [(section.page_key(q), label) for q, label in _pager(p, section.pages)]
        for k in shown:
            site.pages[k].links.insert(0, (listing.key, name))
    for a, b in itertools.pairwise(section.items):
        site.pages[a].links.append((b, "next"))
        site.pages[b].links.append((a, "previous"))


def _sibling(site: Site, rng: random.Random, key: str, text: list[str], line: str) -> Page:
    """One of a line of near-identical pages: the line's text, a model, a price, a few
    words changed."""
    words = list(text)
    for i in rng.sample(range(len(words)), rng.randint(2, 5)):
        words[i] = site.vocab.draw(rng, 1)[0]
    model = f"{line} {rng.randint(10, 999)}{rng.choice(('', 'x', 's', ' pro', ' plus'))}"
    while model in site._titles:
        model += "i"
    site._titles.add(model)
    price = f"price {rng.randint(5, 900)}.{rng.choice(('00', '50', '95', '99'))}"
    return Page(key, "sibling", model, [f"{model} {price}", " ".join(words)])


def _pager(p: int, last: int) -> list[tuple[int, str]]:
    out = [(1, "first")] if p > 1 else []
    out += [(p - 1, "previous")] if p > 1 else []
    out += [(q, str(q)) for q in range(max(1, p - 2), min(last, p + 2) + 1) if q != p]
    out += [(p + 1, "next")] if p < last else []
    out += [(last, "last")] if p < last else []
    return out


def _chain(site: Site, rng: random.Random, start: str, length: int, hidden: int) -> None:
    """A chain of short pages from `start`, the last one linking `hidden` more."""
    style = rng.randrange(3)
    words = site.vocab.draw(rng, rng.randint(8, 20))

    def key(k: int) -> str:
        return (f"/archive/{k}.html", f"/history/{k}/", f"/log?start={20 * k}")[style]

    prev = start
    for k in range(1, length + 1):
        text = list(words)
        text[rng.randrange(len(text))] = site.vocab.draw(rng, 1)[0]
        page = site.add(Page(key(k), "chain", f"Older entries, part {k}",
                             [f"Part {k} of the archive.", " ".join(text)]))
        page.links.append((prev, "newer"))
        site.pages[prev].links.append((page.key, "older entries"))
        prev = page.key
    last = site.pages[prev]
    for h in range(hidden):
        own = rng.randint(150, 300) if rng.random() < 0.5 else rng.randint(15, 40)
        page = site.add(Page(f"/archive/notes/{h + 1}.html", "hidden",
                             site.unique_title(rng, 2),
                             _paras(rng, site.vocab.draw(rng, own))))
        page.links.append((prev, "back"))
        last.links.append((page.key, page.title))


# -- the traps ----------------------------------------------------------------------------------


class Trap:
    """A trap family on a site: it installs its entry links on real pages when made, and
    claims the requests that are its own."""

    OPTIONS: tuple[str, ...] = ()  # the parameters a caller may fix (Site's options)

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        self.site = site
        self.options = options
        unknown = set(options) - set(self.OPTIONS)
        if unknown:
            raise ValueError(f"{type(self).__name__}: no options {sorted(unknown)}; "
                             f"it has {self.OPTIONS}")

    def pick(self, name: str, drawn: Any) -> Any:
        """Option `name`: the caller's, or what the seed drew (drawn either way, so the
        rest of the site is the seed's)."""
        return self.options.get(name, drawn)

    def describe(self) -> str:
        raise NotImplementedError

    def floor(self) -> int:
        """The requests in this trap that no crawler can avoid without knowing the site
        and still find every real page (``Site.floor``): 0 for a trap a URL gives away."""
        return 0

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        """What answers a request of this trap (the path and query with tokens dropped),
        or None when it is not one."""
        raise NotImplementedError

    def carriers(self, rng: random.Random, lo: int = 3, hi: int = 6) -> list[Page]:
        """A few real pages (not home, whose links are the site's spine) to link an
        entry from."""
        pool = [p for p in self.site.pages.values() if p.key != "/" and not p.tokens]
        return rng.sample(pool, min(len(pool), rng.randint(lo, hi)))


class SessionIds(Trap):
    """A fresh token on every internal link of the items of one or two sections."""

    KNOWN = ("sid", "jsessionid", "PHPSESSID", "sessionid", "SID")
    OTHER = ("s", "token", "v", "sess", "u", "k", "visit")
    OPTIONS = ("style", "name", "alphabet", "size")

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        self.style = self.pick("style", rng.choice(("known", "other", "prefix",
                                                    "jsessionid")))
        self.name = self.pick("name", rng.choice(self.KNOWN if self.style == "known"
                                                 else self.OTHER))
        self.prefix = rng.choice(("s", "sess", "u"))
        self.alphabet = self.pick("alphabet", rng.choice(("hex", "b62", "digits")))
        self.size = self.pick("size", rng.randint(16, 32) if self.alphabet != "digits"
                              else rng.randint(10, 13))
        if self.style == "jsessionid":
            self.alphabet = self.pick("alphabet", "b62")
            self.size = self.pick("size", rng.randint(20, 32))
        # Not a page that alone links a real page (its notes, the chain): a token on
        # its link would leave that page reachable only through a trap. (Site checks.)
        self.affected = 0
        for section in rng.sample(site.sections, min(len(site.sections), rng.randint(1, 2))):
            for key in section.items:
                page = site.pages[key]
                if not any(site.pages[k].kind in ("child", "chain") for k, _ in page.links):
                    page.tokens = True
                    self.affected += 1

    def describe(self) -> str:
        where = {"known": f"?{self.name}=", "other": f"?{self.name}=",
                 "prefix": f"/{self.prefix}/<token>/", "jsessionid": ";jsessionid="}
        return f"{where[self.style]} {self.alphabet} x{self.size}, {self.affected} pages"

    def fresh(self) -> str:
        if self.alphabet == "hex":
            return secrets.token_hex(self.size // 2 + 1)[:self.size]
        if self.alphabet == "digits":
            return str(secrets.randbelow(10 ** self.size)).rjust(self.size, "1")
        return secrets.token_urlsafe(self.size)[:self.size].replace("-", "x").replace("_", "y")

    def put(self, href: str, token: str) -> str:
        """`href` with `token` in it (absolute internal links only)."""
        if not href.startswith("/"):
            return href
        path, q, query = href.partition("?")
        if self.style == "prefix":
            return f"/{self.prefix}/{token}{href}"
        if self.style == "jsessionid":
            return f"{path};jsessionid={token}{q}{query}"
        return f"{path}?{query}&{self.name}={token}" if q else f"{path}?{self.name}={token}"

    def strip(self, path: str, query: Query) -> tuple[str, Query, bool]:
        if self.style == "prefix":
            m = re.fullmatch(rf"/{self.prefix}/[A-Za-z0-9]+(/.*)", path)
            return (m[1], query, True) if m else (path, query, False)
        if self.style == "jsessionid":
            plain = re.sub(r";jsessionid=[^/?]*", "", path, flags=re.IGNORECASE)
            return plain, query, plain != path
        kept = [(k, v) for k, v in query if k != self.name]
        return path, kept, len(kept) != len(query)

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        return None  # a page under a token is the page (Site._route)


class SoftNotFound(Trap):
    """A catch-all: any unknown path (at the root or under one directory) is a 200."""

    OPTIONS = ("root", "short", "echo", "fanout")

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        self.root = self.pick("root", rng.random() < 0.5)
        self.dir = "/" if self.root else f"/{rng.choice(('old', 'legacy', 'docs', 'kb'))}/"
        self.short = self.pick("short", rng.random() < 0.5)
        self.echo = self.pick("echo", rng.random() < 0.5)
        self.fanout = self.pick("fanout", rng.randint(1, 3))
        self.words = site.vocab.draw(rng, rng.randint(30, 60))
        dead = [self._path(rng) for _ in range(rng.randint(1, 2))]
        for page in self.carriers(rng):
            page.extra.append((rng.choice(dead), "see also"))

    def _path(self, rng: random.Random) -> str:
        a, b = self.site.vocab.rare(rng, 2)
        return f"{self.dir}{a}/{b}.html" if rng.random() < 0.5 else f"{self.dir}{a}-{b}.html"

    def floor(self) -> int:
        # Each dead link of a real page (it could have been a page), and its directory's
        # probe when it is not the root's (Site.floor counts the root's).
        dead = {h for p in self.site.pages.values() for h, _ in p.extra
                if self.site.trap_of(h) == SOFT_404}
        return len(dead) + (not self.root)

    def describe(self) -> str:
        return (f"under {self.dir}, {'short' if self.short else 'in the template'}, title "
                f"{'echoes the path' if self.echo else 'fixed'}, "
                f"{self.fanout} link{'s' if self.fanout > 1 else ''}")

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        if not path.startswith(self.dir):
            return None
        return lambda: (200, HTML, self._page(path))

    def _page(self, path: str) -> str:
        rng = random.Random(_hash(self.site.seed, "404", path))
        links = [(self._path(rng), "more") for _ in range(self.fanout)]
        title = f"Not found: {path}" if self.echo else "Page not found"
        if self.short:
            hrefs = " ".join(f'<a href="{html.escape(h)}">{t}</a>' for h, t in links)
            return (f"<html><head><title>{html.escape(title)}</title></head><body><h1>"
                    f"Not found</h1><p>Nothing here. Try {hrefs}</p></body></html>")
        return self.site.html(title, ["Sorry, the page you asked for is not here.",
                                      " ".join(self.words)], links)


class Shop:
    """A listing of product siblings at one path (the real page faceted search filters)."""

    def __init__(self, site: Site, rng: random.Random) -> None:
        self.path = rng.choice(("/shop", "/search", "/catalog/", "/products"))
        style = rng.choice(("counter", "html", "uuid"))
        self.products: list[str] = []
        for _ in range(rng.randint(2, 5)):
            text, line = site.vocab.draw(rng, rng.randint(60, 140)), site.unique_title(rng, 1)
            for _ in range(rng.randint(3, 8)):
                page = site.add(_sibling(site, rng, _item_key(site, rng, style, "shop"),
                                         text, line))
                page.links.append((self.path, "shop"))
                self.products.append(page.key)
        self.intro = " ".join(site.vocab.draw(rng, rng.randint(30, 80)))
        base = site.add(Page(self.path, "shop", "Shop", []))
        base.paras = self.paras(site, self.products)
        base.links += [(k, site.pages[k].title) for k in self.products]

    def paras(self, site: Site, shown: list[str]) -> list[str]:
        return [self.intro, f"{len(shown)} products"] + \
            [site.pages[k].paras[0] for k in shown] if shown else \
            [self.intro, "No products match these filters."]


class Facets(Trap):
    """The shop's filters: every combination of 3-5 parameters of 3-6 values."""

    WORDS = ("color", "size", "brand", "material", "style", "fit", "type", "finish")
    LETTERS = ("c", "s", "p", "f", "r", "o", "b", "t")
    OPTIONS = ("kind", "params")

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        shop = site.shop
        assert shop is not None, "faceted search needs the shop"
        self.shop = shop
        self.kind = self.pick("kind", rng.choice(("words", "numbers", "mixed")))
        names = rng.sample(self.LETTERS if self.kind == "numbers" else self.WORDS,
                           self.pick("params", rng.randint(3, 5)))
        if rng.random() < 0.5:  # the last one orders, the others filter
            names[-1] = "sort"
        self.params: dict[str, list[str]] = {}
        for i, name in enumerate(names):
            count = rng.randint(3, 6)
            numeric = self.kind == "numbers" or (self.kind == "mixed" and i % 2 == 1)
            self.params[name] = [str(x) for x in range(1, count + 1)] if numeric \
                else site.vocab.rare(rng, count)
        self.sort = names[-1]
        self.attrs = {k: {p: rng.choice(vals) for p, vals in self.params.items()}
                      for k in shop.products}
        site.pages[shop.path].extra += self.links([])
        for page in self.carriers(rng, 2, 4):  # some pages link the shop too
            page.extra.append((shop.path, "shop"))

    def describe(self) -> str:
        return (f"{self.shop.path}, {self.kind}: "
                + ", ".join(f"{p} x{len(v)}" for p, v in self.params.items()))

    def links(self, query: Query) -> list[tuple[str, str]]:
        """A page's filter links: each parameter's other values, and dropping it."""
        now = dict(query)
        out = []
        for p, values in self.params.items():
            for value in values:
                if now.get(p) != value:
                    out.append((self._url({**now, p: value}), f"{p} {value}"))
            if p in now:
                out.append((self._url({k: v for k, v in now.items() if k != p}), f"any {p}"))
        return out

    def _url(self, query: dict[str, str]) -> str:
        ordered = [(p, query[p]) for p in self.params if p in query]
        return f"{self.shop.path}?{urlencode(ordered)}" if ordered else self.shop.path

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        q = dict(query)
        if path != self.shop.path or not q or len(q) != len(query) \
                or any(v not in self.params.get(p, ()) for p, v in q.items()):
            return None
        shown = [k for k in self.shop.products
                 if all(self.attrs[k][p] == v for p, v in q.items() if p != self.sort)]
        if self.sort in q:
            shown.sort(key=lambda k: _hash(k, q[self.sort]))

        def page() -> Answer:
            links = [(k, self.site.pages[k].title) for k in shown] + self.links(query)
            return 200, HTML, self.site.html("Shop", self.shop.paras(self.site, shown), links)
        return page


class Calendar(Trap):
    """Months for ever, by path or by query, from an entry month several pages link."""

    OPTIONS = ("style", "in_nav")

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        self.style = self.pick("style", rng.choice(("path", "month", "ym")))
        self.base = rng.choice(("/events", "/calendar", "/agenda", "/diary"))
        self.entry = (rng.randint(2019, 2027), rng.randint(1, 12))
        self.busy = rng.uniform(0.0, 0.3)  # share of months with an event
        self.in_nav = self.pick("in_nav", rng.random() < 0.5)
        link = (self.url(*self.entry), "events")
        if self.in_nav:
            site.nav.append(link)
        else:
            for page in self.carriers(rng):
                page.extra.append(link)

    def floor(self) -> int:
        return 1  # the entry month, linked from real pages

    def describe(self) -> str:
        return (f"{self.url(*self.entry)}, {'in the nav' if self.in_nav else 'some pages'}, "
                f"{100 * self.busy:.0f}% of months with events")

    def url(self, y: int, m: int) -> str:
        if self.style == "path":
            return f"{self.base}/{y}/{m:02d}/"
        if self.style == "month":
            return f"{self.base}?month={y}-{m:02d}"
        return f"{self.base}?y={y}&m={m}"

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        q = dict(query)
        found: tuple[str, str] | None = None
        if self.style == "path":
            if m := re.fullmatch(rf"{self.base}/(\d{{1,4}})/(\d{{1,2}})/", path):
                found = (m[1], m[2])
        elif path == self.base and self.style == "month":
            y, _, mo = q.get("month", "").partition("-")
            found = (y, mo)
        elif path == self.base:
            found = (q.get("y", ""), q.get("m", ""))
        if found is None or not all(s.isascii() and s.isdigit() for s in found):
            return None
        y, mo = int(found[0]), int(found[1])
        if not (1 <= y <= 9999 and 1 <= mo <= 12):
            return None
        return lambda: (200, HTML, self._month(y, mo))

    def _month(self, y: int, m: int) -> str:
        rng = random.Random(_hash(self.site.seed, "month", y, m))
        prev = (y - (m == 1), (m - 2) % 12 + 1)
        nxt = (y + (m == 12), m % 12 + 1)
        days = 28 + (m != 2) * (2 + (m in (1, 3, 5, 7, 8, 10, 12)))
        grid = " ".join(_DAYS) + " " + " ".join(str(d) for d in range(1, days + 1))
        links = [(self.url(*prev), "previous month"), (self.url(*nxt), "next month"),
                 (self.url(*self.entry), "this month")]
        events = []
        if rng.random() < self.busy:
            for key in rng.sample(sorted(self.site.pages), rng.randint(1, 2)):
                events.append(f"{rng.randint(1, days)} {_MONTHS[m - 1]}: "
                              f"{self.site.pages[key].title}")
                links.append((key, self.site.pages[key].title))
        return self.site.html(f"Events: {_MONTHS[m - 1]} {y}",
                              [grid, " ".join(events) or "No events this month."], links)


class Segments(Trap):
    """``files/`` (relative) from a few items of one directory: a listing whose relative
    links nest for ever."""

    OPTIONS = ("children", "bare")

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        by_dir: dict[str, list[Page]] = {}
        for p in site.pages.values():
            if not p.tokens and p.key != "/":
                by_dir.setdefault(p.key.partition("?")[0].rsplit("/", 1)[0] + "/", []).append(p)
        dirs = sorted(d for d, pages in by_dir.items() if len(pages) >= 3)
        self.dir = rng.choice(dirs)
        self.name = rng.choice(("files", "attachments", "media", "downloads"))
        self.children = rng.sample(("archive", "2026", "images", "old", "docs", "v2", "pdf"),
                                   self.pick("children", rng.randint(1, 3)))
        self.parent = rng.random() < 0.5
        self.bare = self.pick("bare", rng.random() < 0.5)
        for page in rng.sample(by_dir[self.dir], min(len(by_dir[self.dir]), rng.randint(3, 6))):
            page.extra.append((f"{self.name}/", "attachments"))

    def floor(self) -> int:
        # The listing and its children: the nesting shows one level down. (Its parent
        # link, when no page, is a 404: counted in Site.floor.)
        return 1 + len(self.children)

    def describe(self) -> str:
        return (f"{self.dir}{self.name}/ -> {', '.join(c + '/' for c in self.children)}"
                f"{', ../' if self.parent else ''}, {'bare' if self.bare else 'templated'}")

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        if not path.startswith(f"{self.dir}{self.name}/") or not path.endswith("/"):
            return None
        links = [(c + "/", c + "/") for c in self.children] + \
            ([("../", "Parent Directory")] if self.parent else [])

        def page() -> Answer:
            if not self.bare:
                return 200, HTML, self.site.html(f"Index of {path}",
                                                 ["Name Last modified Size Description"],
                                                 links)
            rows = "".join(f'<tr><td><a href="{h}">{t}</a></td><td>-</td></tr>'
                           for h, t in links)
            return 200, HTML, (f"<html><head><title>Index of {html.escape(path)}</title>"
                               f"</head><body><h1>Index of {html.escape(path)}</h1>"
                               f"<table>{rows}</table></body></html>")
        return page


class Redirects(Trap):
    """A redirect loop (A -> B -> A), or a chain whose every hop is a fresh URL."""

    OPTIONS = ("kind",)

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        self.kind = self.pick("kind", rng.choice(("loop", "chain", "both")))
        self.status = rng.choice((301, 302, 303, 307))
        a, b = site.vocab.rare(rng, 2)
        self.a, self.b = f"/{rng.choice(('login', 'account', a))}", f"/{b}/check"
        self.chain = f"/{rng.choice(('go', 'r', 'out'))}/"
        entries = ([(self.a, "sign in")] if self.kind != "chain" else []) + \
            ([(self.chain + "start", "continue")] if self.kind != "loop" else [])
        for page in self.carriers(rng):
            page.extra.append(rng.choice(entries))

    def floor(self) -> int:
        # A loop shows at its second hop; so does a chain (its first hop could be a page).
        return {"loop": 2, "chain": 2, "both": 4}[self.kind]

    def describe(self) -> str:
        return {"loop": f"loop {self.a} <-> {self.b}",
                "chain": f"chain {self.chain}<fresh>",
                "both": f"loop {self.a} <-> {self.b}, chain {self.chain}<fresh>"}[self.kind] \
            + f", {self.status}"

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        if self.kind != "chain" and path in (self.a, self.b) and not query:
            to = self.b if path == self.a else self.a
        elif self.kind != "loop" and path.startswith(self.chain) and "/" not in \
                path[len(self.chain):] and not query:
            to = f"{self.chain}{secrets.token_hex(8)}"
        else:
            return None
        return lambda: (self.status, {"Location": to, **HTML},
                        f'<html><body><a href="{to}">moved</a></body></html>')


class Pagination(Trap):
    """Past the last page of one or more sections: empty listings, "next" for ever."""

    def __init__(self, site: Site, rng: random.Random, options: Mapping[str, object]) -> None:
        super().__init__(site, rng, options)
        self.sections = rng.sample(site.sections, rng.randint(1, min(3, len(site.sections))))
        for s in self.sections:
            s.endless = True
            site.pages[s.page_key(s.pages)].extra.append((s.page_key(s.pages + 1), "next"))

    def floor(self) -> int:
        return len(self.sections)  # each last page's "next": an empty page once

    def describe(self) -> str:
        return ", ".join(f"{s.page_key(s.pages + 1)}..." for s in self.sections)

    def claim(self, path: str, query: Query) -> Callable[[], Answer] | None:
        for s in self.sections:
            n = s.page_of(path, query)
            if n is not None and n > s.pages:
                return functools.partial(self._empty, s, n)
        return None

    def _empty(self, s: Section, n: int) -> Answer:
        links = [(s.page_key(1), "first"), (s.page_key(n - 1), "previous"),
                 (s.page_key(n + 1), "next")]
        return 200, HTML, self.site.html(f"{s.name.capitalize()}, page {n}",
                                         [f"Page {n}.", "No more entries."], links)


TRAPS: dict[str, Callable[[Site, random.Random, Mapping[str, object]], Trap]] = {
    SESSION_IDS: SessionIds, SOFT_404: SoftNotFound, FACETS: Facets, CALENDAR: Calendar,
    SEGMENTS: Segments, REDIRECTS: Redirects, PAGINATION: Pagination}


# -- serving ------------------------------------------------------------------------------------


def serve(site: Site, log: Path) -> None:
    """Run `site` on a free 127.0.0.1 port (printed first), logging each request as
    site_bench reads it: end time, seconds taken, status, bytes, User-Agent,
    X-Bench-Client, the path and query as sent."""
    from aiohttp import web  # noqa: PLC0415

    out = open(log, "a", buffering=1)  # noqa: SIM115 - open while the site runs

    async def handle(request: web.Request) -> web.Response:
        started = time.time()
        path, _, query = request.raw_path.partition("?")
        status, headers, body = site.answer(request.method, path, query)
        data = body.encode()
        end = time.time()
        agent = request.headers.get("User-Agent", "-").replace("\t", " ")
        client = request.headers.get("X-Bench-Client", "-").replace("\t", " ")
        out.write(f"{end:.3f}\t{end - started:.3f}\t{status}\t{len(data)}\t{agent}\t{client}"
                  f"\t{request.raw_path}\n")
        return web.Response(body=data, status=status, headers=headers)

    async def main() -> None:
        app = web.Application(handler_args={"max_field_size": 16384})
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        tcp = web.TCPSite(runner, "127.0.0.1", 0)
        await tcp.start()
        print(tcp._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    """``python bench/trap_sites.py SEED ...``: describe sites; ``--serve LOG`` one."""
    p = argparse.ArgumentParser(description="generated trap sites")
    p.add_argument("seeds", type=int, nargs="+")
    p.add_argument("--serve", type=Path, default=None, help="serve the first seed's site, "
                   "logging requests there")
    args = p.parse_args(argv)
    if args.serve is not None:
        Site(args.seeds[0]).serve(args.serve)
        return 0
    for seed in args.seeds:
        print(Site(seed).describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
