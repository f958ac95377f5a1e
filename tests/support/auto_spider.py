"""A spider for the JS shop (console/demo/jsshop.py) that says nothing of rendering: a
crawl whose policy says rendering=auto decides, per host and route."""

from typing import Any

from crawlq import Spider

spider = Spider("auto", item_key="sku", policy={"max_depth": 50})


@spider.route()
async def home(response: Any, ctx: Any) -> None:
    ctx.follow(css="a.category", label="list")


@spider.route("list")
async def product_list(response: Any, ctx: Any) -> None:
    ctx.follow(css="li.product a", label="product")
    ctx.follow(css="a.next", label="list")


@spider.route("product")
async def product(response: Any, ctx: Any) -> None:
    sku = response.css(".sku::text").get()
    if sku:
        ctx.emit({"sku": sku, "name": response.css(".name::text").get()})
