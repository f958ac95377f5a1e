"""Rendering pages in a browser: Playwright driving the system's Chromium, every request
the page makes fetched by crawlq's own guarded HTTP client (docs/rendering.md).

`Render` (what a route asks of a render) and `RenderResult` import nothing of
Playwright; `BrowserFetcher` (``common.browser.fetcher``) does, and is imported only by a
consumer started with ``--browser``.
"""

from common.browser.render import Fetched, Render, RenderResult

__all__ = ["Fetched", "Render", "RenderResult"]
