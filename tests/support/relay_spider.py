"""A spider the process tests run with ``--spider tests/support/relay_spider.py``.

``list`` follows each ``<a href>`` of its page, joined to ``data["children_at"]`` (another
host), as a ``child`` request whose data says who found it; ``child`` emits what reached
it. A task labelled anything else has no route here.
"""

from typing import Any

from crawlq import Spider

spider = Spider("relay", item_key="path")


@spider.route("list")
async def listing(response: Any, ctx: Any) -> None:
    data = ctx.request.data
    for href in response.css("a::attr(href)").getall():
        ctx.follow(data["children_at"] + href, label="child",
                   data={"category": data["category"], "found_by": ctx.worker})


@spider.route("child")
async def child(response: Any, ctx: Any) -> None:
    ctx.emit({"path": response.url.rpartition("/")[2], "label": ctx.request.label,
              "data": dict(ctx.request.data), "worker": ctx.worker,
              "text": response.css("body::text").get()})
