"""User handlers: code that sees each 2xx response and may return items and new URLs.

A handler is ``async def handler(response: FetchResult, ctx: HandlerContext)`` named on
the command line as ``module:function``. It may return ``None``, a
:class:`HandlerResult`, or a dict with ``items`` and/or ``urls``. A handler is a spider
with one default route (`handler_spider`): what it returns goes through that route's
``ctx.follow`` like any route's, so URLs it returns, as strings (resolved against the
page) or as :class:`~common.tasks.request.Request` objects (a method, a body, a label for
the route that parses it, data for that route), are checked there once and enqueued
through the crawl's dedup with depth + 1 (bounded by ``--max-depth`` and
``--allow-domains``); a Request keeps its label, data, method, body and headers on the
way, to whichever consumer leases it. A Request that is not valid (or whose label no
route knows) fails the task that returned it with ``handler_error``, saying why, and
none of its links are enqueued. ``await ctx.save_checkpoint(value)`` stores progress
that a reclaimed task resumes from (``ctx.checkpoint``). An exception fails the task
with reason ``handler_error``; it never stops the consumer.

Alone, a handler parses every task, whatever its label (its own to read:
``ctx.task.label``); beside a ``--spider`` without a default route, it is that route.

``consumer.handlers:links`` is a ready-made handler that follows ``<a href>`` and
``<area href>`` links.
"""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError
from common.http.results import FetchResult
from common.spider import Context, Response, RouteFn, Spider, mark_returned
from common.tasks.request import Request
from common.tasks.task import Task
from consumer.links import extract_links


class LeaseLostError(Exception):
    """The task's lease was lost: its checkpoint can't be saved and its result is dropped."""


@dataclass(slots=True)
class HandlerResult:
    """What a handler returns: items for the sink and what to crawl next: URLs, or
    Requests (with a method, body, label, data)."""

    items: list[Any] = field(default_factory=list)
    urls: Sequence[str | Request] = field(default_factory=list)


@dataclass(slots=True)
class HandlerContext:
    """What a handler knows about its task and can do with it."""

    task: Task
    worker: str
    _save: Callable[[Any], Awaitable[bool]]
    #: the most links taken from one page; the consumer drops the rest and counts it
    max_links: int = 10_000

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved for this task (None on a first attempt)."""
        return self.task.checkpoint

    async def save_checkpoint(self, value: Any) -> None:
        """Store progress; raises LeaseLostError if this consumer no longer owns the task."""
        if not await self._save(value):
            raise LeaseLostError(f"lease on task {self.task.id} was lost")


Handler = Callable[[FetchResult, HandlerContext], Awaitable[HandlerResult | dict[str, Any] | None]]


def load_handler(spec: str) -> Handler:
    """Import ``module:function``; ConfigError saying what is wrong otherwise."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--handler {spec!r} must look like module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--handler {spec!r}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def as_result(value: HandlerResult | dict[str, Any] | None) -> HandlerResult:
    """Normalize what a handler returned; TypeError on anything else."""
    if value is None:
        return HandlerResult()
    if isinstance(value, HandlerResult):
        return value
    if isinstance(value, dict):
        return HandlerResult(items=list(value.get("items") or []),
                             urls=[u if isinstance(u, Request) else str(u)
                                   for u in value.get("urls") or []])
    raise TypeError(f"a handler must return None, HandlerResult or dict, not "
                    f"{type(value).__name__}")


def handler_spider(handler: Handler, spider: Spider | None = None, *,
                   max_links: int = 10_000) -> Spider:
    """A spider whose default route is `handler`: `spider`'s routes (a copy: `spider`
    is left as it is) and it, or alone, that route for every label (`Spider.catch_all`).
    `max_links`: the handler's ``ctx.max_links``. ValueError when `spider` has a default
    route already."""
    if spider is None:
        out = Spider("handler", catch_all=True)
    else:
        out = copy.copy(spider)
        out.routes = dict(spider.routes)
    out.route()(_route_of(handler, max_links))
    return out


def _route_of(handler: Handler, max_links: int) -> RouteFn:
    """The route that runs `handler`: its items go to the sink as they are, its URLs and
    Requests through the route's follow (checked there, once)."""
    @functools.wraps(handler)  # its name, and its file for a route error's place
    async def route(response: Response, ctx: Context) -> None:
        async def save(value: Any) -> bool:
            await ctx.save_checkpoint(value)  # raises LeaseLostError for a lost lease
            return True
        assert ctx.task is not None  # the consumer runs a route with its task
        done = as_result(await handler(response.result, HandlerContext(
            task=ctx.task, worker=ctx.worker, _save=save, max_links=max_links)))
        ctx.items.extend(done.items)  # any JSON value, as ever: no key or type to add
        try:
            ctx.follow(done.urls)
        except Exception as exc:
            mark_returned(exc, handler)
            raise
    return route


async def links(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Follow the ``<a href>`` and ``<area href>`` links of an HTML page.

    Links are resolved against the page's ``<base href>`` or final URL; at most
    ``ctx.max_links + 1`` are returned, so the caller can tell the cap was hit.
    """
    ctype = response.headers.get("content-type", "")
    if "html" not in ctype or not response.body:
        return HandlerResult()
    return HandlerResult(urls=extract_links(response.tree(), response.final_url,
                                            ctx.max_links + 1))
