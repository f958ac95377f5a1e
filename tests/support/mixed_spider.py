"""A spider for the JS shop (console/demo/jsshop.py) that renders only what needs it: a
link to a ``/js/`` page is followed as a render request, one to a ``/plain/`` page as a
plain one (``Request(render=...)``); its items say which consumer made them."""

from typing import Any

from crawlq import Render, Request, Spider

spider = Spider("mixed", item_key="sku", policy={"max_depth": 50})


def _follow(ctx: Any, response: Any, css: str, label: str) -> None:
    for href in response.css(css + "::attr(href)").getall():
        url = response.urljoin(href)
        ctx.follow(Request(url, label=label, render="/js/" in url))


@spider.route()
async def home(response: Any, ctx: Any) -> None:
    _follow(ctx, response, "a.category", "list")


@spider.route("list")
async def product_list(response: Any, ctx: Any) -> None:
    _follow(ctx, response, "li.product a", "product")
    _follow(ctx, response, "a.next", "list")


@spider.route("product")
async def product(response: Any, ctx: Any) -> None:
    ctx.emit({"sku": response.css(".sku::text").get(), "url": response.url,
              "worker": ctx.worker, "rendered": response.rendered})


# A render request of a route without render= gets the default page actions: the list and
# product pages build their content after load, and the default settle waits for that.
assert Render().settle_ms > 0
