"""A shop whose pages are built in the browser: the target of rendering's tests, of
``bench/render_bench.py`` and of ``examples/js_spider.py``.

``async with js_shop(spec) as base:`` serves, on 127.0.0.1 (or `host`) and a free port:

================================  ====================================================
``/``                             links to each category's first list page
``/js/<cat>?page=<n>``            a list page that is an empty shell: its script fetches
                                  ``/api/<cat>?page=<n>`` (JSON) and builds the product
                                  links (``li.product a``) and the ``a.next`` link
``/js/<cat>/item/<i>``            a product page built the same way from
                                  ``/api/<cat>/item/<i>``: ``h2.name``, ``.price``,
                                  ``.sku``
``/plain/<cat>?page=<n>``         the same list, built by the server (for a category
``/plain/<cat>/item/<i>``         ``plain``: an HTTP fetch sees everything)
``/js/<cat>/more``                the whole category on one page: the first
                                  ``page_size`` products, then ``button.more`` adds the
                                  next ones (a "load more" button)
``/js/<cat>/scroll``              the same, the next ones added as the page is scrolled
                                  to its bottom (an infinite scroll)
``/s.css``                        every page's stylesheet: only a browser asks for it
================================  ====================================================

A category is ``js`` or ``plain`` (`ShopSpec.plain`: how many of the categories are
plain); its list and product pages link to its own kind. Every product is an item a
spider must find (`expected_items`). Nothing here reaches outside its host.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

__all__ = ["ShopSpec", "expected_items", "js_shop", "make_app", "product_of"]


@dataclass(frozen=True, slots=True)
class ShopSpec:
    """The shop's size: `categories` of `products` each, `page_size` a list page; the
    first `plain` categories are built by the server."""

    categories: int = 3
    products: int = 20
    page_size: int = 10
    plain: int = 0

    def kind(self, cat: int) -> str:
        return "plain" if cat < self.plain else "js"


def product_of(cat: int, i: int) -> dict[str, object]:
    """Product `i` of category `cat`: what its page shows and a spider emits."""
    return {"sku": f"c{cat}-p{i}", "name": f"Product {i} of category {cat}",
            "price": round(1 + (cat * 131 + i * 17) % 900 / 10, 2)}


def expected_items(spec: ShopSpec) -> set[str]:
    """The SKUs of every product of the shop."""
    return {f"c{c}-p{i}" for c in range(spec.categories) for i in range(spec.products)}


_LIST_JS = """
<script>
fetch('/api/' + CAT + '?page=' + PAGE).then(r => r.json()).then(d => {
  const ul = document.getElementById('products');
  for (const p of d.products) {
    const li = document.createElement('li'); li.className = 'product';
    const a = document.createElement('a'); a.href = '/js/' + CAT + '/item/' + p.i;
    a.textContent = p.name; li.appendChild(a); ul.appendChild(li);
  }
  if (d.next !== null) {
    const a = document.createElement('a'); a.className = 'next';
    a.href = '/js/' + CAT + '?page=' + d.next; a.textContent = 'next';
    document.body.appendChild(a);
  }
});
</script>"""
_ITEM_JS = """
<script>
fetch('/api/' + CAT + '/item/' + ITEM).then(r => r.json()).then(p => {
  document.getElementById('product').innerHTML =
    '<h2 class="name"></h2><span class="price"></span><span class="sku"></span>';
  document.querySelector('.name').textContent = p.name;
  document.querySelector('.price').textContent = p.price;
  document.querySelector('.sku').textContent = p.sku;
});
</script>"""
_GROW_JS = """
<script>
let next = 0, busy = false;
function more() {
  if (busy || next === null) return; busy = true;
  fetch('/api/' + CAT + '?page=' + next).then(r => r.json()).then(d => {
    const ul = document.getElementById('products');
    for (const p of d.products) {
      const li = document.createElement('li'); li.className = 'product';
      li.innerHTML = '<a href="/js/' + CAT + '/item/' + p.i + '"></a>';
      li.firstChild.textContent = p.name; ul.appendChild(li);
    }
    next = d.next; busy = false;
    if (next === null) { const b = document.querySelector('button.more'); if (b) b.remove(); }
  });
}
more();
HOOK
</script>"""


def _page(title: str, body: str, script: str = "", **consts: object) -> web.Response:
    head = "".join(f"const {k} = {json.dumps(v)};" for k, v in consts.items())
    # Tall rows: a page of them is taller than a window, as an infinite scroll's is.
    text = (f"<!doctype html><html><head><title>{title}</title>"
            '<link rel="stylesheet" href="/s.css">'
            "<style>li.product { min-height: 200px }</style>"
            f"<script>{head}</script></head><body>{body}{script}</body></html>")
    return web.Response(text=text, content_type="text/html")


def _list(spec: ShopSpec, cat: int, page: int) -> dict[str, object]:
    first = page * spec.page_size
    rows = range(first, min(first + spec.page_size, spec.products))
    nxt = page + 1 if first + spec.page_size < spec.products else None
    return {"products": [{"i": i, "name": product_of(cat, i)["name"]} for i in rows],
            "next": nxt}


def make_app(spec: ShopSpec, *, plain_at: str = "") -> web.Application:
    """The shop's application (see the module's docstring); with `plain_at` (another
    base URL serving this app), the home page links the plain categories there: a
    half-plain shop on two hosts."""

    def cat_of(request: web.Request) -> int:
        cat = int(request.match_info["cat"])
        if not 0 <= cat < spec.categories:
            raise web.HTTPNotFound
        return cat

    def item_of(request: web.Request) -> int:
        i = int(request.match_info["i"])
        if not 0 <= i < spec.products:
            raise web.HTTPNotFound
        return i

    def page_of(request: web.Request) -> int:
        try:
            return max(0, int(request.query.get("page", "0")))
        except ValueError:
            raise web.HTTPBadRequest from None

    async def home(request: web.Request) -> web.Response:
        def base(c: int) -> str:
            return plain_at if plain_at and spec.kind(c) == "plain" else ""
        links = "".join(f'<li><a class="category" href="{base(c)}/{spec.kind(c)}/{c}'
                        f'?page=0">category {c}</a></li>' for c in range(spec.categories))
        return _page("shop", f"<ul>{links}</ul>")

    async def js_list(request: web.Request) -> web.Response:
        cat = cat_of(request)
        return _page(f"category {cat}", '<ul id="products"></ul>', _LIST_JS,
                     CAT=cat, PAGE=page_of(request))

    async def js_item(request: web.Request) -> web.Response:
        cat, i = cat_of(request), item_of(request)
        return _page(f"product {i}", '<div id="product"></div>', _ITEM_JS, CAT=cat, ITEM=i)

    async def plain_list(request: web.Request) -> web.Response:
        cat, page = cat_of(request), page_of(request)
        got = _list(spec, cat, page)
        rows = "".join(f'<li class="product"><a href="/plain/{cat}/item/{p["i"]}">'
                       f'{p["name"]}</a></li>' for p in got["products"])  # type: ignore[attr-defined]
        nxt = (f'<a class="next" href="/plain/{cat}?page={got["next"]}">next</a>'
               if got["next"] is not None else "")
        return _page(f"category {cat}", f'<ul id="products">{rows}</ul>{nxt}')

    async def plain_item(request: web.Request) -> web.Response:
        cat, i = cat_of(request), item_of(request)
        p = product_of(cat, i)
        return _page(f"product {i}", f'<div id="product"><h2 class="name">{p["name"]}</h2>'
                     f'<span class="price">{p["price"]}</span>'
                     f'<span class="sku">{p["sku"]}</span></div>')

    async def grow(request: web.Request) -> web.Response:
        cat, how = cat_of(request), request.match_info["how"]
        if how == "more":
            body = '<ul id="products"></ul><button class="more" onclick="more()">more</button>'
            hook = ""
        else:
            body = '<ul id="products"></ul>'
            hook = ("window.addEventListener('scroll', () => { if (window.innerHeight + "
                    "window.scrollY >= document.body.offsetHeight - 2) more(); });")
        return _page(f"category {cat}", body, _GROW_JS.replace("HOOK", hook), CAT=cat)

    async def css(request: web.Request) -> web.Response:
        return web.Response(text="body { margin: 0 }", content_type="text/css")

    async def api_list(request: web.Request) -> web.Response:
        return web.json_response(_list(spec, cat_of(request), page_of(request)))

    async def api_item(request: web.Request) -> web.Response:
        return web.json_response(product_of(cat_of(request), item_of(request)))

    app = web.Application()
    app.router.add_get("/", home)
    app.router.add_get("/s.css", css)
    app.router.add_get(r"/js/{cat:\d+}", js_list)
    app.router.add_get(r"/js/{cat:\d+}/item/{i:\d+}", js_item)
    app.router.add_get(r"/js/{cat:\d+}/{how:more|scroll}", grow)
    app.router.add_get(r"/plain/{cat:\d+}", plain_list)
    app.router.add_get(r"/plain/{cat:\d+}/item/{i:\d+}", plain_item)
    app.router.add_get(r"/api/{cat:\d+}", api_list)
    app.router.add_get(r"/api/{cat:\d+}/item/{i:\d+}", api_item)
    return app


@asynccontextmanager
async def js_shop(spec: ShopSpec | None = None, *, host: str = "127.0.0.1",
                  port: int = 0) -> AsyncIterator[str]:
    """Serve the shop on `host` (a free port unless `port`); yields its base URL."""
    runner = web.AppRunner(make_app(spec or ShopSpec()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()
