"""Which code parses a leased task: its label's route in the ``--spider``, or the
``--handler`` as the default route.

A task with a label goes to the spider's route of that label; one without goes to the
spider's default route, else to the ``--handler``. A task whose label the spider has no
route for (a spider deployed without it) is refused before it is fetched: `knows` says
so and the runner ends it dead with reason ``unknown_label``, never done unparsed.
Without a spider, the ``--handler`` gets every task as it always did (the label is its
own to read: ``ctx.task.label``); a consumer with neither runs no code: it has no
`Router`, and writes every page it fetches whatever its label.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from common.browser.render import DEFAULT_RENDER, Render
from common.http.results import FetchResult
from common.proxies.bans import NO_RULES, Blocked
from common.spider import Spider, run_route
from common.tasks.task import Task
from consumer.handlers import Handler, HandlerContext, HandlerResult, as_result

__all__ = ["Router"]


class Router:
    """Routes a task by its label to the spider's route or the default handler."""

    def __init__(self, spider: Spider | None, handler: Handler | None) -> None:
        self.spider = spider
        self.handler = handler

    @classmethod
    def of(cls, spider: Spider | None, handler: Handler | None) -> Router | None:
        """The router of a consumer's ``--spider`` and ``--handler``; None for neither."""
        if spider is None and handler is None:
            return None
        return cls(spider, handler)

    @property
    def labels(self) -> frozenset[str] | None:
        """The labels a route parses here (None: any, a --handler alone takes them all)."""
        if self.spider is None:
            return None
        return frozenset(label for label in self.spider.routes if label is not None)

    @property
    def files(self) -> frozenset[str]:
        """The files the spider's routes and the handler are defined in: where a route
        error is looked for in its traceback."""
        fns: list[Callable[..., Any]] = [r.fn for r in self.spider.routes.values()] \
            if self.spider is not None else []
        fns += [self.handler] if self.handler is not None else []
        return frozenset(code.co_filename for fn in fns
                         if (code := getattr(inspect.unwrap(fn), "__code__", None)))

    def knows(self, task: Task) -> bool:
        """Whether `task`'s label has a route here."""
        if self.spider is None or self.spider.knows(task.label):
            return True
        return task.label is None and self.handler is not None

    def render_of(self, task: Task) -> Render:
        """The page actions of a rendered task: its route's (none but the load for a
        --handler's task)."""
        if self.spider is None:
            return DEFAULT_RENDER
        return self.spider.render_of(task.label)

    def blocked(self, task: Task) -> Blocked:
        """What a blocked answer to `task` looks like by its route (the crawl's apart)."""
        if self.spider is None:
            return NO_RULES
        route = self.spider.routes.get(task.label)
        return NO_RULES if route is None else route.blocked

    def unknown(self, task: Task) -> str:
        """Why `task` can't be parsed here, and what to do."""
        assert self.spider is not None
        return self.spider.unknown(task.label)

    async def __call__(self, result: FetchResult, ctx: HandlerContext) -> HandlerResult:
        """Run the task's route on its response (the caller checked `knows`)."""
        task = ctx.task
        if self.spider is None or not self.spider.knows(task.label):
            assert self.handler is not None
            return as_result(await self.handler(result, ctx))
        done = await run_route(self.spider, result, task.as_request(), worker=ctx.worker,
                               checkpoint=ctx.checkpoint, save=ctx.save_checkpoint)
        return HandlerResult(items=done.items, urls=done.requests)
