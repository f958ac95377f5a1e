"""Which code parses a leased task: a route of the consumer's one spider, picked by the
task's label.

The spider is the ``--spider``, the ``--handler`` (a spider of one default route that
takes every label: ``consumer.handlers.handler_spider``), or the ``--spider`` with the
``--handler`` as its default route. A task with a label goes to the route of that label;
one without goes to the default route. A task whose label the spider has no route for
(a spider deployed without it) is refused before it is fetched: `knows` says so and the
runner ends it dead with reason ``unknown_label``, never done unparsed. A consumer with
neither flag runs no code: it has no `Router`, and writes every page it fetches
whatever its label.
"""

from __future__ import annotations

import inspect

from common.browser.render import Render
from common.http.results import FetchResult
from common.proxies.bans import NO_RULES, Blocked
from common.spider import Spider, run_route
from common.tasks.task import Task
from consumer.handlers import Handler, HandlerContext, HandlerResult, handler_spider

__all__ = ["Router"]


class Router:
    """Routes a task by its label to a route of the consumer's spider."""

    def __init__(self, spider: Spider) -> None:
        self.spider = spider

    @classmethod
    def of(cls, spider: Spider | None, handler: Handler | None, *,
           max_links: int = 10_000) -> Router | None:
        """The router of a consumer's ``--spider`` and ``--handler`` (its default route;
        alone, a spider of its own), None for neither. `max_links`: a handler's
        ``ctx.max_links``."""
        if handler is not None:
            spider = handler_spider(handler, spider, max_links=max_links)
        return None if spider is None else cls(spider)

    @property
    def files(self) -> frozenset[str]:
        """The files the spider's routes (a handler's included) are defined in: where a
        route error is looked for in its traceback."""
        return frozenset(code.co_filename for route in self.spider.routes.values()
                         if (code := getattr(inspect.unwrap(route.fn), "__code__", None)))

    def knows(self, task: Task) -> bool:
        """Whether `task`'s label has a route here."""
        return self.spider.knows(task.label)

    def render_of(self, task: Task) -> Render:
        """The page actions of a rendered task: its route's (none but the load for a
        route that renders only when its requests ask)."""
        return self.spider.render_of(task.label)

    def blocked(self, task: Task) -> Blocked:
        """What a blocked answer to `task` looks like by its route (the crawl's apart)."""
        route = self.spider.routes.get(task.label)
        return NO_RULES if route is None else route.blocked

    def unknown(self, task: Task) -> str:
        """Why `task` can't be parsed here, and what to do."""
        return self.spider.unknown(task.label)

    async def __call__(self, result: FetchResult, ctx: HandlerContext) -> HandlerResult:
        """Run the task's route on its response (the caller checked `knows`): what it
        emitted, and what it followed (checked there)."""
        task = ctx.task
        done = await run_route(self.spider, result, task.as_request(), worker=ctx.worker,
                               checkpoint=ctx.checkpoint, save=ctx.save_checkpoint,
                               task=task)
        return HandlerResult(items=done.items, urls=done.requests)
