"""A spider for a shop whose lists and products are built in the browser (crawlq's JS
shop, ``console/demo/jsshop.py``): its list and product routes render their pages; the
product route reads the page's own JSON call when there is one.

Serve the shop (``crawlq demo --serve-js``), then, on a machine with Chromium::

    crawlq run examples/js_spider.py --browser auto --allow-private --out items.jsonl

On a fleet: ``crawlq-producer --spider examples/js_spider.py`` seeds the crawl and
``crawlq-consumer --spider examples/js_spider.py --browser auto`` renders; consumers
without ``--browser`` take the crawl's other requests. ``SHOP_URL`` says where the shop is
(default http://127.0.0.1:8001).
"""

import os

from crawlq import Render, Spider

SITE = os.environ.get("SHOP_URL", "http://127.0.0.1:8001").rstrip("/")

spider = Spider("js-shop", start=[f"{SITE}/"], item_key="sku", policy={"max_depth": 50})


@spider.route()  # the home page: plain HTML
async def home(response, ctx):
    ctx.follow(css="a.category", label="list")


@spider.route("list", render=Render(wait_for="li.product"))
async def product_list(response, ctx):
    ctx.follow(css="li.product a", label="product")
    ctx.follow(css="a.next", label="list")


@spider.route("product", render=Render(wait_for=".sku"))
async def product(response, ctx):
    # The page fetched its product as JSON: the cleanest source when it is there.
    for call in response.fetched:
        if "/api/" in call.url:
            ctx.emit({**call.json(), "url": response.url})
            return
    ctx.emit({"sku": response.css(".sku::text").get(),
              "name": response.css(".name::text").get(),
              "price": float(response.css(".price::text").get()),
              "url": response.url})
