"""Render only where needed (rendering=auto): each (host, route) pair is probed, its pages
rendered and fetched over HTTP too; where HTTP gave its route the same items and links
three times, its later pages go over HTTP; one difference and they are rendered. The
decisions are the fleet's (render:modes), shown and set by ``crawlq render``."""

from __future__ import annotations

import contextlib
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.chromium import SITE_HOST, needs_chromium
from support.consume import consume

from common.policy import create_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.queue.rendermodes import RenderModes
from common.tasks.request import Request
from common.urls.canonical import canonicalize, fingerprint
from console.cli import main_async
from console.demo.jsshop import ShopSpec, expected_items, make_app

ROOT = Path(__file__).resolve().parents[1]
SPIDER = str(ROOT / "tests" / "support" / "auto_spider.py")


async def test_three_agreeing_probes_decide_http_one_difference_render(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    modes = RenderModes(redis_client, crawl_name)
    assert modes.mode("a.test", "p") == "probe"
    assert [await modes.vote("a.test", "p", True) for _ in range(3)] == \
        ["probe", "probe", "http"]
    assert await modes.vote("a.test", "p", False) == "http"  # decided: no change
    assert await modes.vote("b.test", "p", True) == "probe"
    assert await modes.vote("b.test", "p", False) == "render"
    await modes.set_mode("b.test", "p", "http")
    assert await modes.vote("b.test", "p", False) == "http"  # an operator's, for good
    await modes.set_mode("a.test", "p", "auto")
    await modes.refresh(0)
    assert modes.mode("a.test", "p") == "probe"
    # A pair decided http is enqueued plain in a rendering=auto crawl.
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    q.configure(render_all=True, adaptive=True)
    await modes.set_mode("b.test", None, "http")
    await q.enqueue([NewTask(u, fingerprint(u)) for u in ("http://b.test/1",
                                                          "http://a.test/1")])
    q.woken()
    assert [lease.task.url for lease in await q.lease("w", 5, 60_000)] == ["http://b.test/1"]


async def served(spec: ShopSpec, seen: list[str]) -> tuple[web.AppRunner, str]:
    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.path)
        return await handler(request)  # type: ignore[no-any-return]

    app = make_app(spec)
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, SITE_HOST, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://{SITE_HOST}:{port}"


@needs_chromium
@pytest.mark.timeout(150)
async def test_a_render_auto_crawl_renders_the_host_that_needs_it_only(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """Two shops: one whose pages its scripts build, one the server builds (two hosts).
    The first's routes are decided render, the second's product route http: most of its
    pages are fetched over HTTP (a page rendered asks for its stylesheet), and every item
    of both arrives."""
    spec_js, spec_plain = (ShopSpec(categories=1, products=14, page_size=7),
                           ShopSpec(categories=1, products=14, page_size=7, plain=1))
    await create_policy(redis_client, crawl_name, {"rendering": "auto", "max_depth": 50},
                        by="test")
    js_seen: list[str] = []
    plain_seen: list[str] = []
    js_runner, js_base = await served(spec_js, js_seen)
    plain_runner, plain_base = await served(spec_plain, plain_seen)
    try:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        seeds = [canonicalize(b + "/") for b in (js_base, plain_base)]
        await q.enqueue([NewTask.from_request(Request(u), u) for u in seeds
                         if isinstance(u, str)])
        out = tmp_path / "out"
        code = await consume(redis_url, crawl_name, out, "--spider", SPIDER, "--browser",
                             "auto", "--browser-pages", "2", limit_s=120)
    finally:
        await js_runner.cleanup()
        await plain_runner.cleanup()
    assert code == 0
    items = {i["sku"] for f in sorted(out.glob("*.jsonl"))
             for line in f.read_text().splitlines() for i in json.loads(line)["items"]}
    assert items == expected_items(spec_js) | expected_items(spec_plain)
    modes = RenderModes(redis_client, crawl_name)
    await modes.refresh(0)
    js_host, plain_host = (b.removeprefix("http://") for b in (js_base, plain_base))
    assert modes.mode(js_host, "product") == "render"
    assert modes.mode(js_host, "list") == "render"
    assert modes.mode(plain_host, "product") == "http"
    plain_pages = sum(p.startswith("/plain/") for p in plain_seen)
    plain_renders = plain_seen.count("/s.css")  # at most: a cached stylesheet is not asked
    assert plain_pages >= 16 and plain_renders <= 9, (plain_pages, plain_renders)
    # Every js list and product page rendered: only a render makes its script's call.
    assert sum(p.startswith("/api/") for p in js_seen) >= 2 + 14
    # crawlq render shows it.
    stdout = StringIO()
    with contextlib.redirect_stdout(stdout):
        assert await main_async(["render", "--redis-url", redis_url, "--crawl",
                                 crawl_name]) == 0
    assert f"{plain_host}" in stdout.getvalue() and "http" in stdout.getvalue()
