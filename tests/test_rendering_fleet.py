"""A mixed fleet on one crawl (issue 46): one consumer with a browser and two without, as
real processes. Render requests are leased by the first only, plain ones by any; the
host's politeness holds across both kinds (its concurrency: never two requests in
flight; its delay: every visit, a page and its script's calls, starts a delay after the
host's previous request); every item arrives. The consumers reach the shop on 127.0.0.2
by --allow-network alone: their SSRF guard is on."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.chromium import SITE_HOST, needs_chromium

from common.policy import create_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.tasks.request import Request
from common.urls.canonical import canonicalize
from console.demo.jsshop import ShopSpec, expected_items, make_app

ROOT = Path(__file__).resolve().parents[1]
SPIDER = str(ROOT / "tests" / "support" / "mixed_spider.py")
DELAY = 0.2
#: Requests a rendered page makes after its document: parts of its visit, not visits.
VISIT_PARTS = ("/api/", "/s.css")

pytestmark = [needs_chromium, pytest.mark.timeout(180)]


class Wire:
    """What the shop saw: each request's start and end (monotonic) and path, and the
    most requests it had in flight at once."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, float, str]] = []
        self.inflight = 0
        self.most = 0
        self.api_waiting = 0  # a page's script call held by api_wait: mid-render


@asynccontextmanager
async def recorded_shop(spec: ShopSpec, *, api_wait: float = 0.0
                        ) -> AsyncIterator[tuple[str, Wire]]:
    """The shop on 127.0.0.2, what it saw in `Wire`; its JSON API answers after
    `api_wait` s (a page stays mid-render that long)."""
    wire = Wire()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if api_wait and request.path.startswith("/api/"):
            wire.api_waiting += 1
            try:
                await asyncio.sleep(api_wait)
            finally:
                wire.api_waiting -= 1
        wire.inflight += 1
        wire.most = max(wire.most, wire.inflight)
        start = time.monotonic()
        try:
            return await handler(request)  # type: ignore[no-any-return]
        finally:
            wire.inflight -= 1
            wire.requests.append((start, time.monotonic(), request.path_qs))

    app = make_app(spec)
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, SITE_HOST, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{SITE_HOST}:{port}", wire
    finally:
        await runner.cleanup()


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
    out["PYTHONPATH"] = str(ROOT)
    return out


async def consumer(redis_url: str, crawl: str, out: Path, worker: str, *extra: str
                   ) -> asyncio.subprocess.Process:
    with (out.parent / f"{worker}.log").open("wb") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer", "--redis-url", redis_url, "--crawl", crawl,
            "--output", str(out / worker), "--exit-when-empty", "--empty-grace", "2",
            "--allow-network", f"{SITE_HOST}/32", "--http-port", "-1", "--ignore-robots",
            "--spider", SPIDER, "--worker-id", worker, *extra, env=env(), cwd=out.parent,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT)


async def until_true(check: Callable[[], Awaitable[bool]], within: float) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"waited {within}s in vain"
        await asyncio.sleep(0.1)


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(out.rglob("*.jsonl"))
            for line in path.read_text().splitlines() if line]


async def test_a_mixed_fleet_renders_on_the_browser_only_and_keeps_one_politeness(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    spec = ShopSpec(categories=2, products=6, page_size=3, plain=1)
    out = tmp_path / "out"
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": DELAY, "per_host_concurrency": 1,
        "max_depth": 50}, by="test")
    async with recorded_shop(spec) as (base, wire):
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        url = canonicalize(base + "/")
        assert isinstance(url, str)
        await q.enqueue([NewTask.from_request(Request(url), url)])
        procs = [await consumer(redis_url, crawl_name, out, "w-browser", "--browser", "auto",
                                "--browser-pages", "2"),
                 await consumer(redis_url, crawl_name, out, "w-plain-1"),
                 await consumer(redis_url, crawl_name, out, "w-plain-2")]
        try:
            codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 150)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        assert codes == [0, 0, 0], [(tmp_path / f"{w}.log").read_text()[-3000:]
                                    for w in ("w-browser", "w-plain-1", "w-plain-2")]
    done = records(out)
    items = {i["sku"]: i for r in done for i in r["items"]}
    assert set(items) == expected_items(spec)
    rendered = [r for r in done if "/js/" in r["url"]]
    assert rendered and {r["worker"] for r in rendered} == {"w-browser"}
    assert all(items[s]["rendered"] == ("/js/" in items[s]["url"]) for s in items)
    assert {r["worker"] for r in done if "/plain/" in r["url"]} & {"w-plain-1", "w-plain-2"}
    # One politeness across both kinds: never two requests in flight at the shop, and each
    # visit (a page, then its stylesheet and its script's calls) a delay after the request
    # before.
    assert wire.most == 1
    starts = sorted(wire.requests)
    pairs = [(b[0] - a[0], a[2], b[2]) for a, b in itertools.pairwise(starts)
             if not b[2].startswith(VISIT_PARTS)]
    gaps = [gap for gap, _, _ in pairs]
    # (The shop is in this process: its loop's lag under load is jitter, half the delay
    # its slack, as the other in-process politeness tests allow.)
    assert min(gaps) >= DELAY / 2, sorted(pairs)[:5]
    assert sorted(gaps)[len(gaps) // 10] >= DELAY - 0.03, sorted(gaps)[:5]
    assert (await q.stats()).render_pending == 0


def tree(pid: int) -> list[psutil.Process]:
    """`pid`'s process and every process under it."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def browser_mains(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The Chromium main processes among `procs`: not a child of Chromium (a process
    caught between its fork and its exec still has its parent's command line), and
    without --type= (a renderer's, a zygote's)."""
    found = []
    for proc in procs:
        try:
            parent = proc.parent()
            if "chrom" in proc.name() and proc.status() != psutil.STATUS_ZOMBIE \
                    and (parent is None or "chrom" not in parent.name()) \
                    and not any(a.startswith("--type=") for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            continue
    return out


async def test_a_browser_killed_mid_page_and_a_rendering_consumer_killed_lose_nothing(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """The browser of a rendering consumer is killed mid-page (its pages fail
    browser_crashed and are retried; a new browser renders on), then the consumer is
    killed with SIGKILL: nothing of it is left running (the Playwright driver closes
    its browsers when its parent dies), its leases expire and another consumer ends the
    crawl with every item."""
    spec = ShopSpec(categories=2, products=8, page_size=4)
    out = tmp_path / "out"
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "max_depth": 50}, by="test")
    async with recorded_shop(spec, api_wait=0.5) as (base, wire):
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        url = canonicalize(base + "/")
        assert isinstance(url, str)
        await q.enqueue([NewTask.from_request(Request(url), url)])
        args = ("--browser", "auto", "--browser-pages", "3", "--lease", "3s",
                "--retry-base", "0.1")
        doomed = await consumer(redis_url, crawl_name, out, "w-doomed", *args)
        try:
            async def rendering() -> bool:  # a page mid-render: its script's call held
                return (await q.stats()).done >= 4 and wire.api_waiting > 0

            async def restarted() -> bool:
                return [p.pid for p in browser_mains(tree(doomed.pid))] not in ([], [first])

            await until_true(rendering, 60)
            [browser] = browser_mains(tree(doomed.pid))
            first = browser.pid
            os.kill(first, signal.SIGKILL)  # mid-page: pages were rendering
            await until_true(restarted, 30)
            await until_true(rendering, 30)
            procs = tree(doomed.pid)
            assert len(browser_mains(procs)) == 1
            doomed.kill()  # SIGKILL
            await doomed.wait()
            await until_true(lambda: asyncio.sleep(0, result=not alive(procs[1:])), 15)
            assert alive(procs[1:]) == []
        finally:
            if doomed.returncode is None:
                doomed.kill()
                await doomed.wait()
        heir = await consumer(redis_url, crawl_name, out, "w-heir", *args)
        try:
            assert await asyncio.wait_for(heir.wait(), 120) == 0, \
                (tmp_path / "w-heir.log").read_text()[-3000:]
        finally:
            if heir.returncode is None:
                heir.kill()
                await heir.wait()
        assert alive(tree(heir.pid)[1:]) == []
    items = {i["sku"] for r in records(out) for i in r["items"]}
    assert items == expected_items(spec)
    stats = await q.stats()
    assert (stats.pending, stats.leased, stats.dead) == (0, 0, 0), stats
    assert stats.counters.get("reclaimed", 0) >= 1  # the killed consumer's leases
    assert stats.counters.get("retried", 0) >= 1  # the pages the dead browser held
    died = [line for line in (tmp_path / "w-doomed.log").read_text().splitlines()
            if "browser_died" in line]
    assert len(died) == 1 and "pages_out=0" not in died[0], died
