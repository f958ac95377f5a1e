"""Rendering on the frontier: a consumer started with --browser crawls a shop whose lists
and products its scripts build, through a spider whose routes render; a request asks
with ``render=True``, a route with ``render=``, a crawl with its policy's ``rendering=all``.
(The browser fetcher's own guarantees: test_browser_fetcher.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.chromium import SITE_HOST, needs_chromium
from support.consume import consume
from support.forward_proxy import proxies

from common.policy import create_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.spider import load_spider
from common.tasks.request import Request
from common.tasks.task import decode_entry, encode_entry
from common.urls.canonical import canonicalize
from console.demo.jsshop import ShopSpec, expected_items, js_shop, make_app

ROOT = Path(__file__).resolve().parents[1]
JS_SPIDER = str(ROOT / "examples" / "js_spider.py")

pytestmark = pytest.mark.timeout(120)


def task_of(request: Request) -> NewTask:
    url = canonicalize(request.url)
    assert isinstance(url, str), url
    return NewTask.from_request(request, url)


def items_in(out: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in sorted(out.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for key, item in zip(record["item_keys"], record["items"], strict=True):
                found[key] = item
    return found


def test_a_render_request_is_marked_first_in_its_entry_and_read_back() -> None:
    tid = "0" * 32
    entry = encode_entry(tid, "https://a.test/x", render=True, label="list", priority=3)
    assert entry.startswith(f'{tid}https://a.test/x {{"r":1,')
    task = decode_entry(entry)
    assert task.render and task.as_request().render
    assert not decode_entry(encode_entry(tid, "https://a.test/x")).render
    assert Request.json("https://a.test/api", {"q": 1}, render=True).render


def test_a_spiders_rendering_route_marks_its_requests() -> None:
    spider = load_spider(JS_SPIDER)
    [start] = spider.start()
    assert not start.render  # the home page is plain HTML
    assert spider.rendered(Request("http://x.test/l", label="list")).render
    assert spider.render_of("product").wait_for == ".sku"
    assert spider.render_of(None).wait_for is None


@needs_chromium
async def test_a_consumer_with_a_browser_crawls_a_shop_its_scripts_build(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ShopSpec(categories=2, products=7, page_size=3)
    out = tmp_path / "out"
    async with js_shop(spec, host=SITE_HOST) as base:
        monkeypatch.setenv("SHOP_URL", base)
        spider = load_spider(JS_SPIDER)
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([task_of(r) for r in spider.start()])
        code = await consume(redis_url, crawl_name, out, "--spider", JS_SPIDER,
                             "--browser", "auto", "--browser-pages", "2", limit_s=100)
    assert code == 0
    items = items_in(out)
    assert set(items) == expected_items(spec)
    assert items["c1-p5"]["url"] == f"{base}/js/1/item/5"
    stats = await q.stats()
    probes = stats.counters.get("outcome:probe", 0)  # the crawl's soft-404 probes
    assert (stats.done - probes, stats.dead) == (1 + 2 * 3 + 14, 0)  # home, 3 lists each


@needs_chromium
async def test_a_render_request_goes_through_the_pools_proxy_with_every_request_of_its_page(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer with a proxy pool and a browser: a rendered page's document and every
    request its scripts make go through the pool's pick for its host, one proxy (one of
    the pool's died: a document's fetch through it goes on at once through another)."""
    spec = ShopSpec(categories=1, products=4, page_size=2)
    out = tmp_path / "out"
    seen: list[tuple[str, str]] = []  # (path and query, the proxy it came through)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append((request.path_qs, request.headers.get("X-Via-Proxy", "direct")))
        return await handler(request)  # type: ignore[no-any-return]

    app = make_app(spec)
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with proxies(f"127.0.0.1:{port}", ["p1", "p2", "p3"]) as px:
            await px["p3"].kill()
            monkeypatch.setenv("SHOP_URL", "http://shop.test")
            spider = load_spider(JS_SPIDER)
            q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
            await q.enqueue([task_of(r) for r in spider.start()])
            code = await consume(redis_url, crawl_name, out, "--spider", JS_SPIDER,
                                 "--browser", "auto", "--browser-pages", "2",
                                 *(a for p in px.values() for a in ("--proxy", p.url)),
                                 limit_s=100)
    finally:
        await runner.cleanup()
    assert code == 0
    assert set(items_in(out)) == expected_items(spec)
    assert (await q.stats()).dead == 0
    assert "direct" not in {via for _, via in seen}
    # Each page's script calls /api/<the page's path>: through its document's proxy.
    docs = {path.removeprefix("/js"): via for path, via in seen if path.startswith("/js/")}
    calls = [(path.removeprefix("/api"), via) for path, via in seen
             if path.startswith("/api/")]
    assert len(calls) >= 4 + 2  # each product's call, each list page's
    assert [(path, via, docs.get(path)) for path, via in calls
            if docs.get(path) != via] == []


@needs_chromium
async def test_a_crawl_whose_policy_says_render_all_renders_every_request(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    spec = ShopSpec(categories=1, products=2, page_size=5)
    out = tmp_path / "out"
    await create_policy(redis_client, crawl_name, {"rendering": "all"}, by="test")
    async with js_shop(spec, host=SITE_HOST) as base:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        q.configure(render_all=True)
        await q.enqueue([task_of(Request(f"{base}/js/0/item/{i}")) for i in range(2)])
        code = await consume(redis_url, crawl_name, out, "--browser", "auto",
                             "--store-body", limit_s=60)
    assert code == 0
    bodies = [json.loads(line)["body"] for f in sorted(out.glob("*.jsonl"))
              for line in f.read_text().splitlines()]
    assert len(bodies) == 2
    assert all('<span class="sku">c0-p' in body for body in bodies)


@needs_chromium
@pytest.mark.integration  # crawlq run, its consumers and their Chromium
async def test_crawlq_run_renders_on_this_machine_with_its_chromium(tmp_path: Path) -> None:
    """A spider whose routes render: ``crawlq run`` gives its first consumer the local
    Chromium by itself (--browser auto) and gets every item."""
    spec = ShopSpec(categories=2, products=5, page_size=3)
    items_file = tmp_path / "items.jsonl"
    async with js_shop(spec) as base:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")
               and k != "REDIS_URL"}
        env.update(PYTHONPATH=str(ROOT), SHOP_URL=base)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
            "run", JS_SPIDER, "--allow-private", "--set", "per_host_delay=0",
            "--set", "per_host_concurrency=4", "--consumers", "2",
            "--output", str(tmp_path / "run"), "--out", str(items_file), "--timeout", "90",
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = stdout.decode()
    assert proc.returncode == 0, text
    items = [json.loads(line) for line in items_file.read_text().splitlines()]
    assert {i["sku"] for i in items} == expected_items(spec), text
    assert "0 dead" in text
