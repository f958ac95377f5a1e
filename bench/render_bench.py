"""Rendering crawlers side by side (issue 46): crawlq, Crawlee's PlaywrightCrawler (and its
AdaptivePlaywrightCrawler) and Scrapy + scrapy-playwright, on one local shop whose lists
and products are built by script from JSON calls, all on the system's Chromium at the
same number of pages at once.

    python bench/render_bench.py [--products 200] [--pages 4] [--only crawlq,crawlee]
    python bench/render_bench.py --long 10000        # crawlq alone: memory over 10k renders

The shop (``console.demo.jsshop``, served by a process of its own): 4 categories of
`--products` / 4 products, 10 to a list page; every list and product page an empty shell
its script fills from ``/api/...`` (``li.product a``, ``a.next``, ``.sku``). Two runs:

- **js**: every page built by script: every crawler renders every page;
- **half**: half the categories built by the server, on another host (another port):
  crawlq with the policy's ``rendering=auto`` (each host's route probed, the plain host's
  later pages over HTTP), Crawlee's adaptive crawler (its own predictor), and the
  renderers that render everything (PlaywrightCrawler, scrapy-playwright).

Each crawler gets the same spider: home -> ``a.category`` -> list pages (wait for
``li.product``) -> product pages (wait for ``.sku``) -> one item ``{sku, name, price}``;
no politeness delay, `--pages` pages at once (crawlq: one consumer ``--browser-pages``;
Crawlee: ``max_concurrency``; Scrapy: ``CONCURRENT_REQUESTS``, one context). Printed per
crawler: items (of the shop's), pages, span, pages/s, peak memory (RSS of the crawler's
process and everything under it, browsers included, sampled every 0.2 s; crawlq's Redis
is not counted: it is the fleet's), and the processes of it still running 3 s after it
exited. Then the targets: crawlq >= 1.5 x Crawlee's pages/s on js, >= 3 x
PlaywrightCrawler's on half.

``--long N``: crawlq alone on a js shop of N products, its memory sampled every 0.5 s;
printed: the peak over the first 1,000 pages and over the rest, and the growth.

The peers are installed once into ``~/.cache/crawlq-bench/render-venv`` (``pip install
'crawlee[playwright,adaptive-crawler,parsel]' scrapy scrapy-playwright``); Chromium is
Debian's (``/usr/bin/chromium``), for every crawler: no browser is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from common.browser.chromium import chromium_args, find_chromium  # noqa: E402
from console.demo.jsshop import ShopSpec, expected_items  # noqa: E402

VENV = Path.home() / ".cache" / "crawlq-bench" / "render-venv"
PEERS = ("crawlee[playwright,adaptive-crawler,parsel]", "scrapy", "scrapy-playwright")
TARGET_CRAWLEE = 1.5
TARGET_ADAPTIVE = 3.0

SITE = """
import asyncio, sys
from aiohttp import web
sys.path.insert(0, {root!r})
from console.demo.jsshop import ShopSpec, make_app
async def main():
    spec = ShopSpec(categories={cats}, products={per_cat}, page_size=10, plain={plain})
    runners = []
    plain_port = {plain_port}
    for port, plain_at in (({port}, "http://127.0.0.1:%d" % plain_port if {plain} else ""),
                           (plain_port, "")):
        runner = web.AppRunner(make_app(spec, plain_at=plain_at), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

CRAWLQ_SPIDER = '''
from crawlq import Render, Spider
spider = Spider("bench", start=[{start!r}], item_key="sku", policy={{"max_depth": 1000}})

@spider.route()
async def home(response, ctx):
    ctx.follow(css="a.category", label="list")

@spider.route("list", render=Render(wait_for="li.product"))
async def product_list(response, ctx):
    ctx.follow(css="li.product a", label="product")
    ctx.follow(css="a.next", label="list")

@spider.route("product", render=Render(wait_for=".sku"))
async def product(response, ctx):
    sku = response.css(".sku::text").get()
    if sku:
        ctx.emit({{"sku": sku, "name": response.css(".name::text").get(),
                  "price": response.css(".price::text").get()}})
'''

CRAWLEE = '''
import asyncio, json, sys
from datetime import timedelta
from crawlee import ConcurrencySettings, Request
from crawlee.crawlers import {crawler_import}
from crawlee.storage_clients import MemoryStorageClient
ADAPTIVE = {adaptive}
items, pages = [], set()  # the URLs handled (an adaptive crawler runs a handler twice)

async def main():
    launch = {{"executable_path": {chromium!r}, "args": {args!r}}}
    common = dict(concurrency_settings=ConcurrencySettings(
                      min_concurrency={pages}, desired_concurrency={pages},
                      max_concurrency={pages}),
                  max_request_retries=2, storage_client=MemoryStorageClient(),
                  request_handler_timeout=timedelta(seconds=60))
    if ADAPTIVE:
        crawler = AdaptivePlaywrightCrawler.with_parsel_static_parser(
            playwright_crawler_specific_kwargs={{"browser_launch_options": launch,
                                                 "headless": True}}, **common)
    else:
        crawler = PlaywrightCrawler(browser_launch_options=launch, headless=True, **common)

    @crawler.router.default_handler
    async def home(context):
        pages.add(context.request.url)
        await context.enqueue_links(selector="a.category", label="list")

    @crawler.router.handler("list")
    async def product_list(context):
        pages.add(context.request.url)
        if ADAPTIVE:
            await context.wait_for_selector("li.product", timeout=timedelta(seconds=20))
        else:
            await context.page.wait_for_selector("li.product", state="attached")
        await context.enqueue_links(selector="li.product a", label="product")
        await context.enqueue_links(selector="a.next", label="list")

    @crawler.router.handler("product")
    async def product(context):
        pages.add(context.request.url)
        if ADAPTIVE:  # a parsel Selector, found in the static page or the rendered one
            sku = await context.query_selector_one(".sku", timeout=timedelta(seconds=20))
            text = sku.css("::text").get() if sku is not None else None
        else:
            await context.page.wait_for_selector(".sku", state="attached")
            text = await context.page.text_content(".sku")
        if text:
            items.append(text)

    await crawler.run([{start!r}])
    print(json.dumps({{"items": sorted(set(items)), "pages": len(pages)}}))

asyncio.run(main())
'''

SCRAPY = '''
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy_playwright.page import PageMethod
items, pages = [], [0]

def pw(selector):
    return {{"playwright": True,
            "playwright_page_methods": [PageMethod("wait_for_selector", selector,
                                                   state="attached")]}}

class Bench(scrapy.Spider):
    name = "bench"
    async def start(self):  # Scrapy >= 2.13
        yield scrapy.Request({start!r}, meta={{"playwright": True}})

    def start_requests(self):  # before it
        yield scrapy.Request({start!r}, meta={{"playwright": True}})
    def parse(self, response):
        pages[0] += 1
        for href in response.css("a.category::attr(href)").getall():
            yield response.follow(href, self.parse_list, meta=pw("li.product"))
    def parse_list(self, response):
        pages[0] += 1
        for href in response.css("li.product a::attr(href)").getall():
            yield response.follow(href, self.parse_product, meta=pw(".sku"))
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, self.parse_list, meta=pw("li.product"))
    def parse_product(self, response):
        pages[0] += 1
        sku = response.css(".sku::text").get()
        if sku:
            items.append(sku)

process = CrawlerProcess(settings={{
    "DOWNLOAD_HANDLERS": {{"http": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
                          "https": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"}},
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    "PLAYWRIGHT_LAUNCH_OPTIONS": {{"executable_path": {chromium!r}, "args": {args!r},
                                   "headless": True}},
    "PLAYWRIGHT_MAX_CONTEXTS": 1, "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": {pages},
    "CONCURRENT_REQUESTS": {pages}, "CONCURRENT_REQUESTS_PER_DOMAIN": {pages},
    "DOWNLOAD_DELAY": 0, "ROBOTSTXT_OBEY": False, "LOG_LEVEL": "ERROR",
    "TELNETCONSOLE_ENABLED": False, "DEPTH_LIMIT": 0,
}})
process.crawl(Bench)
process.start()
print(json.dumps({{"items": sorted(set(items)), "pages": pages[0]}}))
'''


@dataclass
class Run:
    """One crawler's run."""

    name: str
    items: int = 0
    expected: int = 0
    pages: int = 0
    span: float = 0.0
    peak_rss: int = 0
    left: list[str] = field(default_factory=list)
    samples: list[tuple[int, int]] = field(default_factory=list)  # (pages so far, rss)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.pages / self.span if self.span else 0.0


class Watch:
    """Samples the memory (RSS) of a process and everything under it, and remembers every
    process seen under it."""

    def __init__(self, pid: int, every: float, pages: Any = None) -> None:
        self.pid, self.every, self.pages = pid, every, pages
        self.peak = 0
        self.seen: dict[int, psutil.Process] = {}
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            total = 0
            for proc in procs:
                self.seen.setdefault(proc.pid, proc)
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
            if total:
                self.peak = max(self.peak, total)
                if self.pages is not None:
                    self.samples.append((self.pages(), total))
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def left(self) -> list[str]:
        """The processes seen under it that still run (not zombies)."""
        out = []
        for pid, proc in self.seen.items():
            if pid == self.pid:
                continue
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {proc.name()}")
            except psutil.Error:
                continue
        return out


def peers_python(refresh: bool) -> Path:
    """The bench venv's python, with the peers installed (created once, then reused)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import crawlee, scrapy, scrapy_playwright"]
    if python.exists() and not refresh and subprocess.run(check, check=False).returncode == 0:
        return python
    print(f"installing {', '.join(PEERS)} into {VENV} (once) ...", flush=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS], check=True)
    return python


def free_port() -> int:
    import socket  # noqa: PLC0415
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_site(workdir: Path, spec: ShopSpec) -> tuple[subprocess.Popen[bytes], str]:
    port, plain_port = free_port(), free_port()
    code = SITE.format(root=str(ROOT), cats=spec.categories, per_cat=spec.products,
                       plain=spec.plain, port=port, plain_port=plain_port)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=open(workdir / "site.log", "wb"))  # noqa: SIM115
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise SystemExit(f"the shop did not start: {(workdir / 'site.log').read_text()}")
    return proc, f"http://127.0.0.1:{port}"


def run_peer(name: str, python: Path, code: str, workdir: Path, *, expected: set[str],
             timeout: float) -> Run:
    script = workdir / f"{name}.py"
    script.write_text(code)
    started = time.monotonic()
    proc = subprocess.Popen([str(python), str(script)], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=open(workdir / f"{name}.log", "wb"))  # noqa: SIM115
    watch = Watch(proc.pid, 0.2)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    span = time.monotonic() - started
    watch.stop()
    time.sleep(3)
    run = Run(name, span=span, peak_rss=watch.peak, left=watch.left(),
              expected=len(expected))
    try:
        got = json.loads(out.decode().strip().splitlines()[-1])
        run.items = len(set(got["items"]) & expected)
        run.pages = int(got["pages"])
    except (ValueError, IndexError, KeyError):
        run.note = f"no result (exit {proc.returncode}): " + \
            (workdir / f"{name}.log").read_text()[-600:]
    return run


def run_crawlq(workdir: Path, base: str, expected: set[str], *, pages: int, auto: bool,
               timeout: float, long_run: bool = False) -> Run:
    """One consumer with a browser, on an embedded redis-server (not counted)."""
    import asyncio  # noqa: PLC0415

    import redis.asyncio as aioredis  # noqa: PLC0415

    from common.policy import create_policy  # noqa: PLC0415
    from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: PLC0415
    from common.redis.server import RedisServer  # noqa: PLC0415
    from common.tasks.request import Request  # noqa: PLC0415
    from common.urls.canonical import canonicalize  # noqa: PLC0415

    spider = workdir / "crawlq_spider.py"
    spider.write_text(CRAWLQ_SPIDER.format(start=base + "/"))
    crawl = "bench-auto" if auto else "bench"
    with RedisServer() as server:
        async def seed() -> None:
            client = aioredis.Redis.from_url(server.url)
            await create_policy(client, crawl, {
                "per_host_delay": 0, "per_host_concurrency": 0, "max_depth": 1000,
                "ignore_robots": True, "rendering": "auto" if auto else "off"}, by="bench")
            q = await CrawlQueue.open(client, crawl, CrawlSettings())
            url = canonicalize(base + "/")
            assert isinstance(url, str)
            await q.enqueue([NewTask.from_request(Request(url), url)])
            await client.aclose()

        async def done() -> tuple[int, dict[str, int]]:
            client = aioredis.Redis.from_url(server.url)
            q = await CrawlQueue.existing(client, crawl)
            stats = await q.stats()
            await client.aclose()
            return stats.done, stats.dead_reasons

        asyncio.run(seed())
        out = workdir / f"out-{crawl}"
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumer", "--redis-url", server.url, "--crawl", crawl,
             "--spider", str(spider), "--browser", "auto", "--browser-pages", str(pages),
             "--concurrency", str(max(16, 4 * pages)), "--allow-private", "--http-port", "-1",
             "--exit-when-empty", "--empty-grace", "0", "--output", str(out),
             "--log-level", "WARNING"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=open(workdir / f"{crawl}.log", "wb"))  # noqa: SIM115
        client = RedisCounter(server.url, crawl) if long_run else None
        watch = Watch(proc.pid, 0.5 if long_run else 0.2,
                      pages=client.done if client is not None else None)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        span = time.monotonic() - started
        watch.stop()
        if client is not None:
            client.close()
        time.sleep(3)
        n, dead = asyncio.run(done())
    items = set()
    for path in out.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            items.update(i["sku"] for i in json.loads(line)["items"])
    run = Run("crawlq (rendering=auto)" if auto else "crawlq", items=len(items & expected),
              expected=len(expected), pages=n, span=span, peak_rss=watch.peak,
              left=watch.left(), samples=watch.samples)
    if dead:
        run.note = f"dead: {dead}"
    return run


class RedisCounter:
    """Tasks done so far, read by the memory watch's thread (its own sync client)."""

    def __init__(self, url: str, crawl: str) -> None:
        import redis  # noqa: PLC0415

        from common.keys import PartitionKeys  # noqa: PLC0415
        self.client = redis.Redis.from_url(url)
        self.key = PartitionKeys.build(crawl, 0).stats

    def done(self) -> int:
        try:
            return int(self.client.hget(self.key, "done") or 0)
        except Exception:
            return -1

    def close(self) -> None:
        self.client.close()


def show(runs: list[Run]) -> None:
    print(f"{'crawler':34} {'items':>11} {'pages':>6} {'span s':>7} {'pages/s':>8} "
          f"{'peak MB':>8} left")
    for r in runs:
        print(f"{r.name:34} {r.items:>5}/{r.expected:<5} {r.pages:>6} {r.span:>7.1f} "
              f"{r.rate:>8.2f} {r.peak_rss / 2**20:>8.0f} {len(r.left)}"
              + (f"  {r.note}" if r.note else ""))
        if r.left:
            print(f"    still running: {', '.join(r.left[:8])}")


def _ratio(a: Run | None, b: Run | None) -> str:
    if a is None or b is None or not b.rate:
        return "n/a"
    return f"{a.rate / b.rate:.2f} x"


def workload(name: str, spec: ShopSpec, args: argparse.Namespace, python: Path | None,
             workdir: Path) -> dict[str, Run]:
    chromium = find_chromium("auto")
    flags = chromium_args(9)  # the same flags (the proxy: a closed port, for the peers)
    peer_flags = ["--no-sandbox", *(f for f in flags if not f.startswith(
        ("--proxy-", "--force-webrtc", "--webrtc")))]
    site, base = start_site(workdir, spec)
    expected = expected_items(spec)
    runs: dict[str, Run] = {}
    try:
        only = set(args.only.split(",")) if args.only else None
        want = ["crawlq", "crawlee", "crawlee-adaptive", "scrapy"]
        auto = name == "half"
        for who in want:
            if only is not None and who not in only:
                continue
            if who == "crawlee-adaptive" and not auto:
                continue
            if who != "crawlq" and python is None:
                continue
            print(f"[{name}] {who} ...", flush=True)
            if who == "crawlq":
                runs[who] = run_crawlq(workdir, base, expected, pages=args.pages, auto=auto,
                                       timeout=args.timeout)
            elif who.startswith("crawlee"):
                adaptive = who == "crawlee-adaptive"
                code = CRAWLEE.format(
                    crawler_import="AdaptivePlaywrightCrawler" if adaptive
                    else "PlaywrightCrawler", adaptive=adaptive, chromium=chromium,
                    args=peer_flags, pages=args.pages, start=base + "/")
                assert python is not None
                label = "AdaptivePlaywrightCrawler" if adaptive else "PlaywrightCrawler"
                runs[who] = run_peer(f"Crawlee {label}", python, code, workdir,
                                     expected=expected, timeout=args.timeout)
            else:
                code = SCRAPY.format(chromium=chromium, args=peer_flags, pages=args.pages,
                                     start=base + "/")
                assert python is not None
                runs[who] = run_peer("Scrapy + scrapy-playwright", python, code, workdir,
                                     expected=expected, timeout=args.timeout)
    finally:
        site.terminate()
        site.wait()
    print(f"\n== {name}: {spec.categories} categories x {spec.products} products"
          + (f", {spec.plain} of them served plain on another host" if spec.plain else "")
          + f"; {args.pages} pages at once")
    show(list(runs.values()))
    return runs


def long_run(args: argparse.Namespace, workdir: Path) -> int:
    spec = ShopSpec(categories=4, products=args.long // 4, page_size=10)
    site, base = start_site(workdir, spec)
    try:
        run = run_crawlq(workdir, base, expected_items(spec), pages=args.pages, auto=False,
                         timeout=args.timeout * 50, long_run=True)
    finally:
        site.terminate()
        site.wait()
    show([run])
    first = [rss for n, rss in run.samples if 0 <= n <= 1000]
    rest = [rss for n, rss in run.samples if n > 1000]
    if first and rest:
        growth = max(rest) / max(first) - 1
        print(f"peak memory over the first 1,000 pages {max(first) / 2**20:.0f} MB, after "
              f"{max(rest) / 2**20:.0f} MB: {growth * 100:+.1f}% (target: at most +10%)")
        step = max(1, len(run.samples) // 12)
        print("pages done -> MB: " + ", ".join(f"{n} -> {rss / 2**20:.0f}"
                                               for n, rss in run.samples[::step]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--products", type=int, default=200, help="products in all")
    p.add_argument("--pages", type=int, default=4, help="pages rendered at once, each")
    p.add_argument("--only", default="", help="crawlq,crawlee,crawlee-adaptive,scrapy")
    p.add_argument("--workloads", default="js,half")
    p.add_argument("--timeout", type=float, default=900.0, help="per crawler, s")
    p.add_argument("--long", type=int, default=0, help="crawlq alone over N products")
    p.add_argument("--refresh", action="store_true", help="reinstall the peers' venv")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="crawlq-render-bench-"))
    try:
        if args.long:
            return long_run(args, workdir)
        needs_peers = not args.only or set(args.only.split(",")) - {"crawlq"}
        python = peers_python(args.refresh) if needs_peers else None
        per_cat = max(1, args.products // 4)
        results = {}
        for name in args.workloads.split(","):
            spec = ShopSpec(categories=4, products=per_cat, page_size=10,
                            plain=2 if name == "half" else 0)
            results[name] = workload(name, spec, args, python, workdir)
        js, half = results.get("js", {}), results.get("half", {})
        print()
        if js:
            print(f"js:   crawlq / Crawlee PlaywrightCrawler pages/s "
                  f"{_ratio(js.get('crawlq'), js.get('crawlee'))} (target >= "
                  f"{TARGET_CRAWLEE}); crawlq / scrapy-playwright "
                  f"{_ratio(js.get('crawlq'), js.get('scrapy'))}")
        if half:
            print(f"half: crawlq rendering=auto / Crawlee PlaywrightCrawler pages/s "
                  f"{_ratio(half.get('crawlq'), half.get('crawlee'))} (target >= "
                  f"{TARGET_ADAPTIVE}); / Crawlee adaptive "
                  f"{_ratio(half.get('crawlq'), half.get('crawlee-adaptive'))}")
        return 0
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

