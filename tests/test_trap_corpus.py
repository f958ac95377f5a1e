"""The trap corpus (issue 43): bench/trap_sites.py's generated sites, whose every request is
known (a real page, or which trap family), and crawls of small ones in-process with the
links handler and the policy's defaults (no depth limit: the crawl must end by itself).

bench/trap_bench.py judges crawlq over 20 of them beside wget and Scrapy; this is the fast
check. Each family gets a small site of its own, so what a crawl spends in it is its own:
the crawl ends by itself having spent at most ALLOWANCE requests in it, and a site
without traps is crawled whole, every real page once."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from selectolax.lexbor import LexborHTMLParser
from support.benches import load_bench
from support.consume import consume, enqueue
from support.routes import serve

from common.policy import set_policy

trap_sites = load_bench("trap_sites")
Site = trap_sites.Site
FAMILIES: tuple[str, ...] = trap_sites.FAMILIES

#: A crawl still running after this many requests per real page is stopped: it would
#: not have ended by itself (a trap without end).
BUDGET = 6
#: The small sites' size (the seed draws the rest: a chain, notes pages, a shop, ...).
REAL = 100
SEED = 4
#: The requests a trap may cost: its entry and a few of its pages (a redirect chain
#: costs 6: the fetcher follows 5 redirects; an endless pagination 3 a listing: its first
#: empty page, a copy of it, a copy reached from a copy, whose links are not followed).
ALLOWANCE = 9


def links(site: Any, path_qs: str) -> list[str]:
    """The path and query of each link of the answer to `path_qs` (a redirect's target)."""
    status, headers, body = site.answer_uri("GET", path_qs)
    if 300 <= status < 400:
        hrefs = [headers["Location"]]
    else:
        hrefs = [a.attributes.get("href") or "" for a in LexborHTMLParser(body).css("a[href]")]
    out = []
    for href in hrefs:
        parts = urlsplit(urljoin("http://a.test" + path_qs, href))
        out.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    return out


def test_a_site_is_its_seed_and_its_real_pages_are_distinct_and_reachable() -> None:
    """The same seed, the same site; every real page answers 200 with a body of its own,
    is no trap's, and has a depth (real pages' plain links reach it from /), the
    deepest behind the chain; each site has 3-6 families and every kind of real page."""
    for seed in range(1, 7):
        site, again = Site(seed), Site(seed)
        assert site.describe() == again.describe()
        assert 150 <= len(site.real_paths) <= 550
        assert 3 <= len(site.traps) <= 6
        bodies = set()
        for key in site.real_paths:
            status, _, body = site.answer_uri("GET", key)
            assert status == 200 and site.trap_of(key) is None and site.real_key(key) == key
            if not site.pages[key].tokens:
                assert again.answer_uri("GET", key)[2] == body
            bodies.add(body)
        assert len(bodies) == len(site.real_paths)
        assert set(site.depth) == site.real_paths
        assert site.deepest >= 10
        assert {site.kind_of(k) for k in site.real_paths} >= {
            "home", "listing", "item", "short", "sibling", "child", "chain", "hidden"}


def test_each_family_answers_as_its_trap_does() -> None:
    """Each family's URLs answer as the module says, and are known as its requests."""
    site = Site(2, families=FAMILIES)
    soft, facets = site.traps["soft 404"], site.traps["faceted search"]
    page = next(k for k in sorted(site.real_paths) if site.pages[k].tokens)
    first, second = links(site, page), links(site, page)
    assert first != second  # a fresh token per response, on every internal link
    tokened = [u for u in first if site.real_key(u) is not None and u not in site.real_paths]
    assert tokened and {site.trap_of(u) for u in tokened} == {"session ids"}
    assert site.answer_uri("GET", tokened[0])[0] == 200
    lost = f"{soft.dir}no-such-page.html"
    assert site.answer_uri("GET", lost)[0] == 200 and site.trap_of(lost) == "soft 404"
    assert links(site, lost) == links(site, lost)  # the same answer each time
    filters = [u for u in links(site, facets.shop.path) if u.startswith(facets.shop.path + "?")]
    assert len(filters) == sum(len(v) for v in facets.params.values())
    assert {site.trap_of(u) for u in filters} == {"faceted search"}
    month = site.traps["calendar"].url(*site.traps["calendar"].entry)
    for _ in range(30):  # next month, for ever
        assert site.trap_of(month) == "calendar"
        month = [u for u in links(site, month) if site.trap_of(u) == "calendar"][1]
    seg = site.traps["repeated segments"]
    path = f"{seg.dir}{seg.name}/"
    for _ in range(8):
        assert site.trap_of(path) == "repeated segments"
        path = links(site, path)[0]
    assert path.count(seg.children[0]) == 8
    loop = site.traps["redirects"]
    if loop.kind != "chain":
        assert links(site, links(site, loop.a)[0]) == [loop.a]
    if loop.kind != "loop":
        hop = links(site, loop.chain + "start")[0]
        assert links(site, hop) != links(site, hop)  # each hop a fresh URL
    section = site.traps["endless pagination"].sections[0]
    past = section.page_key(section.pages + 1)
    assert past in links(site, section.page_key(section.pages))
    assert site.trap_of(past) == "endless pagination"
    assert section.page_key(section.pages + 3) in links(site, section.page_key(section.pages + 2))
    assert site.answer_uri("GET", "/robots.txt")[0] == 404


@dataclass
class Crawl:
    """What a crawl of a site did, as the site saw it."""

    real: int
    found: set[str]
    requests: int
    traps: Counter[str]
    ended: bool  # by itself, before BUDGET requests a real page

    @property
    def share(self) -> float:
        return sum(self.traps.values()) / self.requests if self.requests else 0.0

    def __str__(self) -> str:
        return (f"found {len(self.found)}/{self.real}, {self.requests} requests, "
                f"{100 * self.share:.1f}% in traps {dict(self.traps)}, "
                f"{'ended' if self.ended else 'stopped at the budget'}")


async def crawl(site: Any, client: aioredis.Redis, redis_url: str, crawl_name: str,
                out: Path) -> Crawl:
    """One consumer, the links handler, the policy's defaults but for no depth limit, no
    delay and no robots.txt, until the crawl ends or has spent its budget."""
    await set_policy(client, crawl_name, {"max_depth": 1_000_000, "per_host_delay": 0.0,
                                          "per_host_concurrency": 8, "ignore_robots": True},
                     by="test", create=True)
    spent = asyncio.Event()
    budget = BUDGET * len(site.real_paths)
    paths: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        paths.append(request.raw_path)
        if len(paths) >= budget:
            spent.set()
        path, _, query = request.raw_path.partition("?")
        status, headers, body = site.answer(request.method, path, query)
        return web.Response(body=body.encode(), status=status, headers=headers)

    async with serve({"/{tail:.*}": answer}) as served:
        await enqueue(client, crawl_name, [served.url("/")])
        # Results into a Redis stream: a consumer cancelled at the budget leaves no file
        # open behind it.
        run = asyncio.create_task(consume(redis_url, crawl_name, out, "--handler",
                                          "consumer.handlers:links", "--sink",
                                          "redis-stream", limit_s=60))
        stop = asyncio.create_task(spent.wait())
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        ended = run.done()
        stop.cancel()
        if ended:
            assert run.result() == 0
        else:
            run.cancel()
            await asyncio.wait({run}, timeout=10)
            with contextlib.suppress(asyncio.CancelledError):
                run.result()
    found: set[str] = set()
    traps: Counter[str] = Counter()
    for uri in paths:
        key = site.real_key(uri)
        if key is not None and key not in found:
            found.add(key)
        else:
            traps[site.trap_of(uri) or "refetch"] += 1
    return Crawl(len(site.real_paths), found, len(paths), traps, ended)


def case(family: str, variant: str, *marks: pytest.MarkDecorator, **options: object) -> Any:
    return pytest.param((family, options), id=f"{family}: {variant}", marks=marks)


#: Each family, in its easy and hard variants, on a small site of its own (SEED 4, REAL
#: 100).
CASES = [
    case("session ids", "?sid=<32 hex>", style="known", name="sid", alphabet="hex", size=32),
    case("session ids", "?s=<20 letters>", style="other", name="s", alphabet="b62",
         size=20),
    case("session ids", "/s/<token>/ prefix", style="prefix", alphabet="hex", size=24),
    case("session ids", "?PHPSESSID=<12 digits>", style="known", name="PHPSESSID",
         alphabet="digits", size=12),
    case("soft 404", "short, at the root", root=True, short=True, fanout=2),
    case("soft 404", "in the template, under a directory", root=False, short=False,
         fanout=2),
    case("faceted search", "four word values", kind="words", params=4),
    case("faceted search", "three word values", kind="words", params=3),
    case("faceted search", "numeric values", kind="numbers", params=4),
    case("calendar", "by path, in the nav", style="path", in_nav=True),
    case("calendar", "by query", style="ym", in_nav=False),
    case("repeated segments", "a bare listing of three", children=3, bare=True),
    case("repeated segments", "a listing in the template", children=2, bare=False),
    case("redirects", "a loop and a chain", kind="both"),
    case("endless pagination", "past the last page"),
]


@pytest.mark.parametrize("trap", CASES)
async def test_a_trap_costs_a_few_requests_and_the_crawl_ends(
        trap: tuple[str, dict[str, object]], redis_client: aioredis.Redis, redis_url: str,
        crawl_name: str, tmp_path: Path) -> None:
    """A crawl of a site with one trap ends by itself, having spent at most ALLOWANCE
    requests in it: its entry and a few of its pages."""
    family, options = trap
    site = Site(SEED, families=(family,), real=REAL, options={family: options})
    done = await crawl(site, redis_client, redis_url, crawl_name, tmp_path)
    print(f"\n{family} {options}: {done}")
    assert done.ended, done
    assert done.traps[family] <= ALLOWANCE, done


async def test_a_crawl_finds_every_real_page_of_a_site_without_traps(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    site = Site(SEED, families=(), real=REAL)
    done = await crawl(site, redis_client, redis_url, crawl_name, tmp_path)
    print(f"\nno traps: {done}")
    # every real page once, beside the crawl's own soft-404 probes (404s here): its root's
    # and one of a directory's, once a hundred pages of the host are judged
    assert done.ended and done.requests - done.traps["not found"] == len(done.found), done
    assert done.traps["not found"] <= 2, done
    assert done.found == site.real_paths, sorted(site.real_paths - done.found)
