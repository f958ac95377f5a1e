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
