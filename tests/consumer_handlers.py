"""Handlers the consumer tests load by name (``--handler consumer_handlers:...``)."""

from __future__ import annotations

import asyncio
from typing import Any

from common.http.fetcher import FetchResult
from consumer.handlers import HandlerContext, HandlerResult

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


async def extract(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Two items a page, each naming the page and the consumer that extracted it: keyed
    ``<url>#0`` and ``<url>#1`` by the sink."""
    return HandlerResult(items=[{"url": ctx.task.url, "n": n, "worker": ctx.worker}
                                for n in range(2)])
