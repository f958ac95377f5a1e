"""Running one route on one response: what the consumer calls for a spider's task."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from common.http.results import FetchResult
from common.spider.context import Context
from common.spider.response import Response
from common.spider.spider import Spider
from common.tasks.items import Item
from common.tasks.request import Request

__all__ = ["run_route"]


async def run_route(spider: Spider, result: FetchResult, request: Request, *, worker: str,
                    checkpoint: Any, save: Callable[[Any], Awaitable[None]]) -> Context:
    """Run the route of `request`'s label on `result`; the context holds what it emitted
    and followed. A route parses pages: a response other than 2xx (a 404, a final 3xx)
    runs none, as in Scrapy, and its task is done as its outcome says (``http_4xx``).
    UnknownLabelError when the label has no route; whatever the route raises is raised."""
    route = spider.route_for(request.label)
    response = Response(result)
    ctx = Context(spider, route, request, response, worker=worker, checkpoint=checkpoint,
                  save=save)
    if not 200 <= result.status < 300:
        return ctx
    if inspect.isasyncgenfunction(route.fn):
        async for out in route.fn(response, ctx):
            _take(ctx, out)
        return ctx
    returned = route.fn(response, ctx)
    if inspect.isawaitable(returned):
        returned = await returned
    if returned is not None:
        for out in returned if isinstance(returned, list | tuple) else (returned,):
            _take(ctx, out)
    return ctx


def _take(ctx: Context, out: Any) -> None:
    """What a route yielded or returned: a Request is followed, an item emitted."""
    if isinstance(out, Request):
        ctx.follow(out)
    elif isinstance(out, dict | Item):
        ctx.emit(out)
    elif out is not None:
        raise TypeError(f"a route yields or returns items (dicts, Items) and Requests, "
                        f"not {type(out).__name__}")
