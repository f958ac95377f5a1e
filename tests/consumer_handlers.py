"""Handlers the consumer tests load by name (``--handler consumer_handlers:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from common.http.results import FetchResult
from common.tasks.request import Request
from consumer.handlers import HandlerContext, HandlerResult, links

#: What the paginate handler saw, for the test to read: (task id, checkpoint at start).
SEEN: list[tuple[str, Any]] = []
#: Set by a test to make the paginate handler hang after saving page 2 (a "crash").
HANG_AFTER_PAGE_2 = asyncio.Event()
#: Set by the paginate handler once it saved page 2 and hangs.
HUNG_AFTER_PAGE_2 = asyncio.Event()


async def paginate(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Walks pages 1..4 of a task, saving a checkpoint after each."""
    SEEN.append((ctx.task.id, ctx.checkpoint))
    start = (ctx.checkpoint or {}).get("page", 0) + 1
    items = []
    for page in range(start, 5):
        items.append({"page": page})
        await ctx.save_checkpoint({"page": page})
        if page == 2 and HANG_AFTER_PAGE_2.is_set():
            HUNG_AFTER_PAGE_2.set()
            await asyncio.sleep(3600)
    return HandlerResult(items=items)


async def broken(response: FetchResult, ctx: HandlerContext) -> None:
    """Always raises: the task must fail with handler_error, the consumer must live on."""
    raise RuntimeError("handler bug")


#: The links the idn_links handler returns (an international domain, spelled both ways).
IDN_LINKS = [
    "http://bücher.example/a",
    "http://xn--bcher-kva.example/b",
    "http://sub.bücher.example/",
    "http://other.example/",
    "http://evilxn--bcher-kva.example/",  # ends with the domain, but is not in it
]


async def idn_links(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Returns `IDN_LINKS` for the crawl's seed, nothing for anything deeper."""
    return HandlerResult(items=[{"status": response.status}],
                         urls=IDN_LINKS if ctx.task.depth == 0 else [])


async def labelled(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """A seed (no label) returns two labelled POST Requests to the API its data names; a
    labelled task returns one item saying what reached it: label, data, method, body."""
    task = ctx.task
    if task.label is None:
        api = task.data["api"]
        return HandlerResult(urls=[
            Request.json(api, {"page": n}, label="api",
                         data={"page": n, "category": task.data["category"],
                               "found_by": ctx.worker})
            for n in (1, 2)])
    return HandlerResult(items=[{
        "label": task.label, "data": task.data, "method": task.method, "depth": task.depth,
        "body": (task.body or b"").decode(), "echo": response.body.decode(),
        "worker": ctx.worker}])


async def bad_child(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Returns a link and a Request whose data was changed, after it was made, into
    something JSON can't hold: the task must fail, its link not be enqueued."""
    data: dict[str, Any] = {"ok": 1}
    request = Request(response.final_url + "api", "POST", label="api", data=data)
    data["when"] = {1, 2}
    return HandlerResult(urls=[response.final_url + "link", request])


async def extract(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Two items a page, each naming the page and the consumer that extracted it: keyed
    ``<url>#0`` and ``<url>#1`` by the sink."""
    return HandlerResult(items=[{"url": ctx.task.url, "n": n, "worker": ctx.worker}
                                for n in range(2)])


async def links_and_items(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """The links handler's links, and one item naming the page."""
    found = await links(response, ctx)
    return HandlerResult(items=[{"url": ctx.task.url}], urls=found.urls)
