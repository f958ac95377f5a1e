"""The page pool within its bounds (common/browser/pool.py): contexts recycled after N
renders and browsers restarted after M, a browser that dies mid-page fails that render
``browser_crashed`` (retryable) and the next render gets a fresh one, and the pool
renders fewer pages at once when its memory passes the limit. Nothing of a closed pool
is left running."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from support.chromium import ALLOW, CHROMIUM, SITE_HOST, needs_chromium
from support.routes import serve

from common.browser.chromium import BrowserSettings
from common.browser.fetcher import BrowserFetcher
from common.browser.metrics import BrowserCollector
from common.browser.pool import tree_memory
from common.browser.render import Render
from common.errors import FetchError
from common.http.fetcher import Fetcher
from common.http.results import FetchResult, FetchSettings

pytestmark = [needs_chromium, pytest.mark.timeout(120), pytest.mark.integration]  # Chromium


def browsers() -> list[psutil.Process]:
    """This process's Chromium main processes (a renderer carries --type=)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name() and not any(a.startswith("--type=")
                                                   for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def page(request: web.Request) -> web.Response:
    return web.Response(text="<html><body><p id=x></p><script>fetch('/api' + "
                             "location.search).then(r => r.text()).then(t => "
                             "x.textContent = t)</script></body></html>",
                        content_type="text/html")


async def api(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query.get("wait", "0")))
    return web.Response(text="ok")


@pytest.fixture
async def http() -> AsyncIterator[Fetcher]:
    async with Fetcher(FetchSettings(allow_networks=(ALLOW,), total_timeout=30)) as f:
        yield f


async def make(http: Fetcher, **bounds: Any) -> BrowserFetcher:
    assert CHROMIUM is not None
    fetcher = BrowserFetcher(http, BrowserSettings(CHROMIUM, **bounds), total_timeout=30,
                             max_body_bytes=1 << 20)
    await fetcher.start()
    return fetcher


async def test_contexts_are_recycled_and_browsers_restarted_and_closing_leaves_nothing(
        http: Fetcher) -> None:
    before = descendants()
    fetcher = await make(http, pages=2, context_pages=3, browser_pages=8)
    try:
        async with serve({"/p/{i}": page, "/api": api}, host=SITE_HOST) as site:
            both = asyncio.Semaphore(2)  # as many at once as the pool has pages: each
            # render's total timeout is its own, not the wait for a page (a loaded machine)

            async def render(i: int) -> FetchResult:
                async with both:
                    return await fetcher.fetch(site.url(f"/p/{i}"),
                                               render=Render(wait_for="#x:not(:empty)"))
            results = await asyncio.gather(*(render(i) for i in range(20)))
        assert all(b'<p id="x">ok</p>' in r.body for r in results)
        figures = fetcher.pool.figures
        assert figures.renders == 20
        registry = CollectorRegistry()
        registry.register(BrowserCollector(fetcher))
        scraped = generate_latest(registry).decode()
        assert "crawlq_browser_renders_total 20.0" in scraped
        assert "crawlq_browser_started_total 3.0" in scraped
        assert figures.browsers == 3  # restarted after 8 renders, twice
        assert figures.contexts >= 20 // 3
        assert len(browsers()) <= 2  # a retired one closes once its pages are back
    finally:
        await fetcher.close()
    await asyncio.sleep(0.5)
    assert [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE] == []


async def test_a_browser_killed_mid_page_fails_that_render_and_the_next_gets_a_new_one(
        http: Fetcher) -> None:
    fetcher = await make(http, pages=2)
    try:
        async with serve({"/p/{i}": page, "/api": api}, host=SITE_HOST) as site:
            [first] = browsers()
            slow = asyncio.create_task(fetcher.fetch(
                site.url("/p/1?wait=10"), render=Render(wait_for="#x:not(:empty)")))
            pending = asyncio.create_task(fetcher.fetch(
                site.url("/p/2"), render=Render(wait_for="#never")))
            for _ in range(100):  # both pages under way
                if fetcher.pool.figures.contexts == 2:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            os.kill(first.pid, signal.SIGKILL)
            outcomes = await asyncio.gather(slow, pending, return_exceptions=True)
            errors = [o for o in outcomes if isinstance(o, FetchError)]
            assert errors and all(e.reason == "browser_crashed" and e.retryable
                                  for e in errors), outcomes
            again = await fetcher.fetch(site.url("/p/3"), render=Render(wait_for="#x:not(:empty)"))
            assert b'<p id="x">ok</p>' in again.body
            assert fetcher.pool.figures.crashes == 1 and fetcher.pool.figures.browsers == 2
            await asyncio.sleep(1.0)
            assert not first.is_running() or first.status() == psutil.STATUS_ZOMBIE
    finally:
        await fetcher.close()


async def test_over_its_memory_limit_the_pool_renders_fewer_pages_at_once(
        http: Fetcher) -> None:
    assert tree_memory() > 10 << 20  # this process alone
    fetcher = await make(http, pages=3, memory_bytes=1)  # always over: shrinks to one page
    try:
        async with serve({"/p/{i}": page, "/api": api}, host=SITE_HOST) as site:
            for _ in range(40):
                if fetcher.pool.capacity == 1:
                    break
                await asyncio.sleep(0.25)
            assert fetcher.pool.capacity == 1 and fetcher.pool.figures.shrinks >= 2
            assert fetcher.page_capacity() == 1
            results = await asyncio.gather(*(
                fetcher.fetch(site.url(f"/p/{i}"), render=Render(wait_for="#x:not(:empty)"))
                for i in range(4)))
            assert all(b'<p id="x">ok</p>' in r.body for r in results)
    finally:
        await fetcher.close()
