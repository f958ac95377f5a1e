"""Which fetcher a lease's request goes to: the HTTP fetcher, or for a render request the
browser's (``common.browser``), with its route's page actions and its host's turns kept
by every request of its page (``consumer.turns``).

In a crawl whose policy says rendering=auto (``common.queue.rendermodes``), a render
request's (host, route) pair decides: ``http``, the HTTP fetcher; ``render``, the
browser; while it is probed, the browser, and then the same URL over HTTP (a request of
the page's visit: ``on_visit`` keeps the host's turns), both handed to its route (the
route runs twice: nothing it does is kept but the rendered run's items and links), and
whether they gave the same items and links is the probe's vote (render_vote.lua).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from common.browser.render import DEFAULT_RENDER, Render, RenderResult
from common.errors import FetchError
from common.http.fetcher import Fetcher
from common.http.results import FetchResult
from common.queue import Lease
from common.queue.rendermodes import RenderModes
from common.reasons import NO_BROWSER
from common.redis.errors import REDIS_ERRORS
from common.tasks.items import Item
from common.tasks.request import Request
from consumer.handlers import HandlerContext, as_result
from consumer.routing import Router
from consumer.turns import Turns

if TYPE_CHECKING:
    from common.browser.fetcher import BrowserFetcher

__all__ = ["fetch_of", "same_output"]

log = logging.getLogger("consumer")


def fetch_of(lease: Lease, fetcher: Fetcher, browser: BrowserFetcher | None,
             router: Router | None, turns: Turns, *, modes: RenderModes | None = None
             ) -> Callable[..., Awaitable[FetchResult]]:
    """The fetch `lease`'s request goes through (called as `Fetcher.fetch`). A render
    request on a consumer without a browser is FetchError ``no_browser`` (the frontier
    leases none to it)."""
    task = lease.task
    if not task.render:
        return fetcher.fetch
    if browser is None:
        raise FetchError(NO_BROWSER, "a render request reached a consumer without "
                         "--browser", retryable=False)
    render = router.render_of(task) if router is not None else DEFAULT_RENDER
    on_visit = turns.on_visit(lease)
    call: Callable[..., Any] = functools.partial(browser.fetch, render=render,
                                                 on_visit=on_visit)
    if modes is not None:
        mode = modes.mode(lease.host, task.label)
        if mode == "http":
            return fetcher.fetch
        if mode == "probe" and router is not None:
            call = functools.partial(_probe, browser=browser, fetcher=fetcher,
                                     router=router, modes=modes, lease=lease, render=render,
                                     on_visit=on_visit)
    return call


async def _probe(url: str, *, browser: BrowserFetcher, fetcher: Fetcher, router: Router,
                 modes: RenderModes, lease: Lease, render: Render,
                 on_visit: Callable[[], Awaitable[None]] | None,
                 **kw: Any) -> FetchResult:
    """Render `url`, fetch it over HTTP too, and vote on whether its route saw the same;
    the rendered result is the task's."""
    rendered = await browser.fetch(url, render=render, on_visit=on_visit, **kw)
    if not isinstance(rendered, RenderResult):
        return rendered
    try:
        plain = await fetcher.fetch(url, **{**kw, "on_sent": on_visit})
    except FetchError:
        return rendered  # no vote: the HTTP fetch said nothing about the page
    if plain.status == rendered.status:
        same = await same_output(router, lease, rendered, plain)
        try:
            await modes.vote(lease.host, lease.task.label, same)
        except REDIS_ERRORS as exc:  # render_vote.lua is never sent again (resend.py)
            log.warning("render_vote_dropped", extra={"host": lease.host,
                                                      "error": str(exc)[:200]})
    return rendered


async def same_output(router: Router, lease: Lease, first: FetchResult,
                      second: FetchResult) -> bool:
    """Whether `lease`'s route gives the same items and links on both results (a route
    that raises on either does not)."""
    async def no_save(value: Any) -> bool:
        return False

    seen = []
    for result in (first, second):
        ctx = HandlerContext(task=lease.task, worker="probe", _save=no_save)
        try:
            handled = as_result(await router(result, ctx))
        except Exception:
            return False
        seen.append((sorted(_item_text(i) for i in handled.items),
                     sorted(_link_text(u) for u in handled.urls)))
    return seen[0] == seen[1]


def _item_text(item: Any) -> str:
    if isinstance(item, Item):
        item = {"key": item.key, "data": dict(item.data)}
    return json.dumps(item, sort_keys=True, default=str)


def _link_text(link: str | Request) -> str:
    if isinstance(link, str):
        return link
    data: Mapping[str, Any] = link.data
    return json.dumps([link.url, link.method, link.label, dict(data)], sort_keys=True,
                      default=str)
