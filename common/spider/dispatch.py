"""Running one route on one response: what the consumer calls for a spider's task."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from common.http.results import FetchResult
from common.spider.context import Context
from common.spider.response import Response
from common.spider.spider import Spider
from common.tasks.items import Item
from common.tasks.request import Request
from common.tasks.task import Task

__all__ = ["mark_returned", "returned_by", "run_route"]


async def run_route(spider: Spider, result: FetchResult, request: Request, *, worker: str,
                    checkpoint: Any, save: Callable[[Any], Awaitable[None]],
                    task: Task | None = None) -> Context:
    """Run the route of `request`'s label on `result` (the leased `task`'s); the context
    holds what it emitted and followed. A route parses pages: a response other than 2xx
    (a 404, a final 3xx) runs none, as in Scrapy, and its task is done as its outcome
    says (``http_4xx``). UnknownLabelError when the label has no route; whatever the
    route raises is raised: what it yielded and could not take, raised at its ``yield``
    (its traceback then names the route's line)."""
    route = spider.route_for(request.label)
    response = Response(result)
    ctx = Context(spider, route, request, response, worker=worker, checkpoint=checkpoint,
                  save=save, task=task)
    if not 200 <= result.status < 300:
        return ctx
    if inspect.isasyncgenfunction(route.fn):
        await _run_generator(route.fn(response, ctx), ctx)
        return ctx
    returned = route.fn(response, ctx)
    if inspect.isawaitable(returned):
        returned = await returned
    if returned is not None:
        for out in returned if isinstance(returned, list | tuple) else (returned,):
            try:
                _take(ctx, out)
            except Exception as exc:
                mark_returned(exc, route.fn)
                raise
    return ctx


def mark_returned(exc: BaseException, fn: Callable[..., Any]) -> None:
    """Say on `exc` that it is about what `fn` (a route, a handler) returned: its frame is
    gone from the traceback, so `returned_by` gives its file and the line of its ``def``
    instead."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is not None and not hasattr(exc, _RETURNED_BY):
        setattr(exc, _RETURNED_BY, (code.co_filename, code.co_firstlineno, code.co_name))


def returned_by(exc: BaseException) -> tuple[str, int, str] | None:
    """(file, line of its ``def``, name) of the route whose returned value raised `exc`;
    None when a route's own code raised it."""
    origin = getattr(exc, _RETURNED_BY, None)
    return origin if isinstance(origin, tuple) else None


_RETURNED_BY = "crawlq_returned_by"


async def _run_generator(gen: AsyncGenerator[Any, None], ctx: Context) -> None:
    """Take what an async generator route yields; what it yielded and can't be taken (a
    bad Request, a label with no route) is thrown back in at its ``yield``."""
    async with contextlib.aclosing(gen):
        try:
            out = await anext(gen)
            while True:
                try:
                    _take(ctx, out)
                except Exception as exc:  # the route's to catch, or raised from its yield
                    out = await gen.athrow(exc)
                else:
                    out = await anext(gen)
        except StopAsyncIteration:
            pass


def _take(ctx: Context, out: Any) -> None:
    """What a route yielded or returned: a Request is followed, an item emitted."""
    if isinstance(out, Request):
        ctx.follow(out)
    elif isinstance(out, dict | Item):
        ctx.emit(out)
    elif out is not None:
        raise TypeError(f"a route yields or returns items (dicts, Items) and Requests, "
                        f"not {type(out).__name__}")
