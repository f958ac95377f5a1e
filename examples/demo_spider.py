"""A spider for crawlq's sample shop: list pages -> product pages -> one item a product,
and each product's reviews from a paged JSON API that must be POSTed.

Serve the shop (``crawlq demo --serve``), then, in another terminal::

    crawlq run examples/demo_spider.py --allow-private --set per_host_delay=0 --out items.jsonl

Products go to items.product.jsonl, reviews to items.review.jsonl (their item types).
The same file runs on a fleet: ``crawlq-producer --spider examples/demo_spider.py`` seeds
the crawl, ``crawlq-consumer --spider examples/demo_spider.py`` on every consumer.
``SHOP_URL`` says where the shop is (default http://127.0.0.1:8000).
"""

import os

from crawlq import Request, Spider

SITE = os.environ.get("SHOP_URL", "http://127.0.0.1:8000").rstrip("/")

# Items are keyed by their "sku" (products) unless a route says otherwise: a product
# fetched twice (a consumer killed mid-task) is one row, not two. Each route's items have
# a type: products and reviews go to tables (or files) of their own.
spider = Spider("demo-shop", start=[f"{SITE}/shop"], item_key="sku")


@spider.route()  # the default route: requests without a label (the start URL)
async def shop(response, ctx):
    for link in response.css("a.category"):
        # data travels with the request to the route of its label, on any consumer
        ctx.follow(link.attrib["href"], label="list",
                   data={"category": link.css("::text").get(), "page": 1})


@spider.route("list")
async def product_list(response, ctx):
    category, page = ctx.request.data["category"], ctx.request.data["page"]
    ctx.follow(css="li.product a::attr(href)", label="product", data={"category": category})
    # pagination: the next page is a request of its own, its page number in its data
    ctx.follow(css="a.next::attr(href)", label="list",
               data={"category": category, "page": page + 1})


@spider.route("product", item_type="product")
async def product(response, ctx):
    sku = response.css(".sku::text").get()
    ctx.emit({
        "sku": sku,
        "name": response.css("h2.name::text").get(),
        "price": float(response.css(".price::text").get()),
        "category": ctx.request.data["category"],
        "url": response.url,
    })
    # A JSON API: POSTed (two bodies to one URL are two requests), paged.
    ctx.follow(Request.json(f"{SITE}/api/reviews", {"sku": sku, "page": 1},
                            label="reviews", data={"sku": sku}))


@spider.route("reviews", item_key="review", item_type="review")
async def reviews(response, ctx):
    page = response.json()
    for review in page["reviews"]:
        ctx.emit(review)
    if page["next_page"] is not None:
        ctx.follow(Request.json(f"{SITE}/api/reviews",
                                {"sku": ctx.request.data["sku"], "page": page["next_page"]},
                                label="reviews", data=ctx.request.data))
