"""Which fetcher a lease's request goes to: the HTTP fetcher, or for a render request the
browser's (``common.browser``), with its route's page actions and its host's turns kept
by every request of its page (``consumer.turns``)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from common.browser.render import DEFAULT_RENDER
from common.errors import FetchError
from common.http.fetcher import Fetcher, FetchResult
from common.queue import Lease
from common.reasons import NO_BROWSER
from consumer.routing import Router
from consumer.turns import Turns

if TYPE_CHECKING:
    from common.browser.fetcher import BrowserFetcher

__all__ = ["fetch_of"]


def fetch_of(lease: Lease, fetcher: Fetcher, browser: BrowserFetcher | None,
             router: Router | None, turns: Turns
             ) -> Callable[..., Awaitable[FetchResult]]:
    """The fetch `lease`'s request goes through (called as `Fetcher.fetch`). A render
    request on a consumer without a browser is FetchError ``no_browser`` (the frontier
    leases none to it)."""
    if not lease.task.render:
        return fetcher.fetch
    if browser is None:
        raise FetchError(NO_BROWSER, "a render request reached a consumer without "
                         "--browser", retryable=False)
    render = router.render_of(lease.task) if router is not None else DEFAULT_RENDER
    call: Callable[..., Any] = functools.partial(
        browser.fetch, render=render, on_visit=turns.on_visit(lease))
    return call
