"""A sample web site to crawl: the demo's target, and a fixture for tests and benchmarks.

``async with sample_site(pages=2000) as base_url:`` serves, on 127.0.0.1 and a free port:

==========================  ==========================================================
``/page/<i>``               ``pages`` HTML pages, each linking to a few others
``/slow/<i>``               answers after 1-2 s
``/flaky/<i>``              500 on the first request, 200 after
``/missing/<i>``            404
``/down/<i>``               503 (Retry-After: 1), always
``/redirect/chain/<n>``     301 -> ``chain/<n-1>`` ... -> ``/page/0`` (n hops)
``/redirect/loop/a``        302 -> ``loop/b`` -> ``loop/a`` ... (a loop)
``/private/<i>``            pages that robots.txt disallows (linked from some pages)
``/robots.txt``             ``Disallow: /private/`` and a ``Sitemap:`` line
``/urls.txt``               the seed list: every URL above, one per line, with a
                            comment and two lines the producer rejects
``/sitemap.xml``            a sitemap index of gzipped sitemaps ``/sitemaps/<j>.xml.gz``
                            listing the pages
``/shop``                   a shop for spiders (examples/demo_spider.py; not in the seed
                            list): links to its categories
``/shop/<cat>?page=<n>``    a category's product list, ``SHOP_PAGE_SIZE`` a page, with
                            a ``next`` link while there are more
``/shop/<cat>/item/<i>``    a product page: name, price, SKU
``POST /api/reviews``       JSON ``{"sku": ..., "page": n}``: that product's reviews,
                            ``REVIEWS_PAGE_SIZE`` a page, and ``next_page`` (null at the
                            end); 400 on a body that isn't such JSON
==========================  ==========================================================

Nothing here reaches outside 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import gzip
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

__all__ = ["SHOP_CATEGORIES", "SiteSpec", "product", "reviews", "sample_site", "seed_urls"]

SITEMAP_PAGE_SIZE = 500
SHOP_CATEGORIES = ("books", "games", "music")
SHOP_PAGE_SIZE = 10
REVIEWS_PAGE_SIZE = 2


@dataclass(frozen=True, slots=True)
class SiteSpec:
    """How many pages of each kind the site has."""

    pages: int = 2000
    slow: int = 4
    flaky: int = 5
    missing: int = 5
    down: int = 3
    private: int = 5
    chain: int = 3
    slow_s: tuple[float, float] = (1.0, 2.0)
    #: products in each shop category
    products: int = 25

    def paths(self) -> list[str]:
        """Every path the seed list names (pages first)."""
        out = [f"/page/{i}" for i in range(self.pages)]
        out += [f"/slow/{i}" for i in range(self.slow)]
        out += [f"/flaky/{i}" for i in range(self.flaky)]
        out += [f"/missing/{i}" for i in range(self.missing)]
        out += [f"/down/{i}" for i in range(self.down)]
        out += [f"/private/{i}" for i in range(self.private)]
        out += [f"/redirect/chain/{self.chain}", "/redirect/loop/a"]
        return out


def seed_urls(base_url: str, spec: SiteSpec) -> list[str]:
    """The absolute URLs the seed list names."""
    return [base_url + p for p in spec.paths()]


_SPEC = web.AppKey("spec", SiteSpec)
_HITS = web.AppKey("hits", Counter[str])


def _links(i: int, spec: SiteSpec) -> list[str]:
    n = spec.pages
    links = [f"/page/{(i + 1) % n}", f"/page/{(i * 7 + 3) % n}", f"/page/{(i * 31 + 11) % n}"]
    if i % 50 == 0 and spec.private:
        links.append(f"/private/{(i // 50) % spec.private}")
    if i % 100 == 1:
        links += ["/redirect/loop/a", f"/redirect/chain/{spec.chain}"]
    return links


def _html(title: str, links: list[str]) -> str:
    items = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<!doctype html><html><head><title>{title}</title></head>"
            f"<body><h1>{title}</h1><ul>{items}</ul></body></html>")


def _index(request: web.Request, attr: str) -> int:
    spec = request.app[_SPEC]
    try:
        i = int(request.match_info["i"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if not 0 <= i < getattr(spec, attr):
        raise web.HTTPNotFound()
    return i


async def page(request: web.Request) -> web.Response:
    i = _index(request, "pages")
    return web.Response(text=_html(f"page {i}", _links(i, request.app[_SPEC])),
                        content_type="text/html")


async def slow(request: web.Request) -> web.Response:
    i = _index(request, "slow")
    spec = request.app[_SPEC]
    low, high = spec.slow_s
    await asyncio.sleep(low + (high - low) * (i % 4) / 3)
    return web.Response(text=_html(f"slow {i}", ["/page/0"]), content_type="text/html")


async def flaky(request: web.Request) -> web.Response:
    i = _index(request, "flaky")
    hits = request.app[_HITS]
    hits[request.path] += 1
    if hits[request.path] == 1:
        return web.Response(status=500, text="try again")
    return web.Response(text=_html(f"flaky {i}", ["/page/1"]), content_type="text/html")


async def missing(request: web.Request) -> web.Response:
    raise web.HTTPNotFound(text="no such page")


async def down(request: web.Request) -> web.Response:
    # Retry-After keeps a consumer's fleet-wide host cool-down short (without it a 503
    # pauses the whole host for 30 s, and this site is one host).
    return web.Response(status=503, text="down for good", headers={"Retry-After": "1"})


async def private(request: web.Request) -> web.Response:
    i = _index(request, "private")
    return web.Response(text=_html(f"private {i}", []), content_type="text/html")


async def chain(request: web.Request) -> web.Response:
    try:
        n = int(request.match_info["n"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if n <= 0:
        raise web.HTTPFound("/page/0")
    raise web.HTTPMovedPermanently(f"/redirect/chain/{n - 1}")


async def loop(request: web.Request) -> web.Response:
    other = "b" if request.match_info["x"] == "a" else "a"
    raise web.HTTPFound(f"/redirect/loop/{other}")


def product(category: str, i: int) -> dict[str, object]:
    """Product `i` of `category` as its page shows it."""
    return {"sku": f"{category}-{i}", "name": f"{category.title()} item {i}",
            "price": round(5 + (i * 37 % 100) / 4, 2), "category": category}


def reviews(sku: str) -> list[dict[str, object]]:
    """Every review of product `sku` (0 to 4 of them), in the API's order."""
    i = int(sku.rpartition("-")[2])
    return [{"review": f"{sku}/r{n}", "sku": sku, "stars": 1 + (i + n) % 5,
             "text": f"review {n} of {sku}"} for n in range(i % 5)]


def _shop_html(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><title>{title}</title></head>"
            f"<body><h1>{title}</h1>{body}</body></html>")


async def shop(request: web.Request) -> web.Response:
    items = "".join(f'<li><a class="category" href="/shop/{c}">{c}</a></li>'
                    for c in SHOP_CATEGORIES)
    return web.Response(text=_shop_html("shop", f"<ul>{items}</ul>"),
                        content_type="text/html")


async def shop_list(request: web.Request) -> web.Response:
    category = request.match_info["cat"]
    spec = request.app[_SPEC]
    try:
        page = int(request.query.get("page", "1"))
    except ValueError:
        raise web.HTTPNotFound() from None
    first = (page - 1) * SHOP_PAGE_SIZE
    if category not in SHOP_CATEGORIES or page < 1 or (first >= spec.products and page > 1):
        raise web.HTTPNotFound()
    items = "".join(
        f'<li class="product"><a href="/shop/{category}/item/{i}">{category} {i}</a></li>'
        for i in range(first, min(spec.products, first + SHOP_PAGE_SIZE)))
    more = first + SHOP_PAGE_SIZE < spec.products
    nxt = f'<a class="next" href="/shop/{category}?page={page + 1}">next</a>' if more else ""
    return web.Response(text=_shop_html(f"{category}, page {page}", f"<ul>{items}</ul>{nxt}"),
                        content_type="text/html")


async def shop_item(request: web.Request) -> web.Response:
    category = request.match_info["cat"]
    try:
        i = int(request.match_info["i"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if category not in SHOP_CATEGORIES or not 0 <= i < request.app[_SPEC].products:
        raise web.HTTPNotFound()
    p = product(category, i)
    body = (f'<h2 class="name">{p["name"]}</h2><p>price: <span class="price">{p["price"]}'
            f'</span></p><p>SKU: <span class="sku">{p["sku"]}</span></p>')
    return web.Response(text=_shop_html(str(p["name"]), body), content_type="text/html")


async def api_reviews(request: web.Request) -> web.Response:
    try:
        asked = await request.json()
        sku, page = asked["sku"], int(asked.get("page", 1))
        category, _, i = sku.rpartition("-")
        valid = category in SHOP_CATEGORIES and 0 <= int(i) < request.app[_SPEC].products
    except (ValueError, KeyError, TypeError, AttributeError):
        valid = False
    if not valid or page < 1:
        raise web.HTTPBadRequest(text='POST JSON {"sku": "<category>-<i>", "page": n}')
    found = reviews(sku)
    first = (page - 1) * REVIEWS_PAGE_SIZE
    more = first + REVIEWS_PAGE_SIZE < len(found)
    return web.json_response({"sku": sku, "page": page,
                              "reviews": found[first:first + REVIEWS_PAGE_SIZE],
                              "next_page": page + 1 if more else None})


def _base(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def robots(request: web.Request) -> web.Response:
    return web.Response(text=f"User-agent: *\nDisallow: /private/\n\n"
                             f"Sitemap: {_base(request)}/sitemap.xml\n")


async def urls_txt(request: web.Request) -> web.Response:
    spec = request.app[_SPEC]
    lines = ["# crawlq demo seed list: one URL per line", ""]
    lines += seed_urls(_base(request), spec)
    lines += ["javascript:alert(1)", "mailto:someone@example.com"]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def sitemap_index(request: web.Request) -> web.Response:
    spec = request.app[_SPEC]
    base = _base(request)
    count = max(1, -(-spec.pages // SITEMAP_PAGE_SIZE))
    items = "".join(f"<sitemap><loc>{base}/sitemaps/{j}.xml.gz</loc></sitemap>"
                    for j in range(count))
    return web.Response(
        text='<?xml version="1.0" encoding="UTF-8"?>\n'
             f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{items}'
             "</sitemapindex>", content_type="application/xml")


async def sitemap_part(request: web.Request) -> web.Response:
    spec = request.app[_SPEC]
    try:
        j = int(request.match_info["j"])
    except ValueError:
        raise web.HTTPNotFound() from None
    start = j * SITEMAP_PAGE_SIZE
    if j < 0 or (start >= spec.pages and j > 0):
        raise web.HTTPNotFound()
    base = _base(request)
    items = "".join(f"<url><loc>{base}/page/{i}</loc></url>"
                    for i in range(start, min(spec.pages, start + SITEMAP_PAGE_SIZE)))
    xml = ('<?xml version="1.0" encoding="UTF-8"?>\n'
           f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{items}</urlset>')
    return web.Response(body=gzip.compress(xml.encode()), content_type="application/x-gzip")


async def home(request: web.Request) -> web.Response:
    spec = request.app[_SPEC]
    return web.Response(text=_html("crawlq sample site", [f"/page/{i}" for i in
                                                          range(min(10, spec.pages))]),
                        content_type="text/html")


def make_app(spec: SiteSpec) -> web.Application:
    """The site as an aiohttp application."""
    app = web.Application()
    app[_SPEC] = spec
    app[_HITS] = Counter()
    app.router.add_get("/", home)
    app.router.add_get("/page/{i}", page)
    app.router.add_get("/slow/{i}", slow)
    app.router.add_get("/flaky/{i}", flaky)
    app.router.add_get("/missing/{i}", missing)
    app.router.add_get("/down/{i}", down)
    app.router.add_get("/private/{i}", private)
    app.router.add_get("/redirect/chain/{n}", chain)
    app.router.add_get("/redirect/loop/{x}", loop)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/urls.txt", urls_txt)
    app.router.add_get("/sitemap.xml", sitemap_index)
    app.router.add_get("/sitemaps/{j}.xml.gz", sitemap_part)
    app.router.add_get("/shop", shop)
    app.router.add_get("/shop/{cat}", shop_list)
    app.router.add_get("/shop/{cat}/item/{i}", shop_item)
    app.router.add_post("/api/reviews", api_reviews)
    return app


@asynccontextmanager
async def sample_site(pages: int = 2000, *, spec: SiteSpec | None = None,
                      host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve the sample site for the block; yields its base URL (no trailing slash)."""
    spec = spec if spec is not None else SiteSpec(pages=pages)
    runner = web.AppRunner(make_app(spec), access_log=None, handle_signals=False,
                           shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        yield f"http://{host}:{bound[1]}"
    finally:
        await runner.cleanup()
