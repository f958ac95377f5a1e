"""Proxies that die and proxies that hosts ban: crawlq's fleet-wide pool beside Scrapy with
scrapy-rotating-proxies, side by side on one local world (issue 47).

    python bench/proxy_bench.py [--hosts 4] [--pages 250] [--consumers 3] [--timeout 180]
                                [--skip-scrapy]

The world, all on 127.0.0.1 in the bench's own process: one site that answers H host
names (``h0.test`` ... , reached through the proxies, which resolve every name to it:
``Host`` kept) with P pages each, and 12 local forward proxies in front of it
(tests/support/forward_proxy.py), each tagging what it forwards with its name (what a
real site sees as its address):

- p0-p5 are healthy;
- p6 and p7 die mid-crawl (once the site has served a quarter of the pages): their port
  then answers nothing but accepts and drops connections, counting each (a dead proxy
  costs a client one connection a try, which the bench so sees);
- h0 bans p8 and p9 with a 403; h1 bans p10 and p11 with a 200 captcha page (``<div
  class='captcha'>``); every other host serves them.

Three runs: crawlq (``--consumers`` consumer processes, every proxy as ``--proxy``, the
crawl's ``ban_selector`` told the captcha, per-host delay 0 and concurrency 4, robots.txt
ignored, default attempts), then Scrapy with scrapy-rotating-proxies (a venv of the
bench's own under ``~/.cache/crawlq-bench/proxy-scrapy-venv``: ``pip install scrapy
scrapy-rotating-proxies``; ``CONCURRENT_REQUESTS_PER_DOMAIN`` 4, no delay) twice: with
its default ``BanDetectionPolicy`` (a ban is a status other than 200/301/302, an empty
body or an exception) and told the captcha (a policy whose ``response_is_ban`` also looks
for it). Each figure is the site's and the proxies' count of that run:

- **pages done**: the pages the crawler delivered as data (crawlq's records, Scrapy's
  items) that are the page and not a captcha, of H x P;
- **wasted**: requests sent through a dead proxy (connections its port dropped) or
  through a proxy to a host that bans it (403s and captchas served), of all requests;
- **captchas as data**: captcha pages among what the crawler delivered;
- **banned proxies kept for other hosts**: requests the banned proxies p8-p11 carried to
  the hosts that do not ban them after their first ban;
- **span**: from the site's first request to its last.

Targets (issue 47): every page done, <= 2% of requests wasted, 0 captchas as data, the
banned proxies still used for the other hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import redis.asyncio as aioredis  # noqa: E402
from aiohttp import web  # noqa: E402
from support.forward_proxy import CAPTCHA, ForwardProxy  # noqa: E402

from common.policy import create_policy  # noqa: E402
from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.urls.canonical import fingerprint  # noqa: E402

VENV = Path.home() / ".cache" / "crawlq-bench" / "proxy-scrapy-venv"
HEALTHY, DYING = [f"p{i}" for i in range(6)], ["p6", "p7"]
BANS = {"h0": {"p8": "403", "p9": "403"}, "h1": {"p10": "captcha", "p11": "captcha"}}
TARGET_WASTED = 0.02

SPIDER = '''\
"""The Scrapy side of bench/proxy_bench.py: every URL of a file through rotating proxies."""
import os
import sys

import scrapy
from rotating_proxies.policy import BanDetectionPolicy
from scrapy.crawler import CrawlerProcess

URLS, PROXIES, OUT, TOLD = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "told"


class CaptchaPolicy(BanDetectionPolicy):
    def response_is_ban(self, request, response):
        return super().response_is_ban(request, response) or b"captcha" in response.body


class Pages(scrapy.Spider):
    name = "pages"
    start_urls = open(URLS).read().split()  # Scrapy 2.13+: start() yields them

    def parse(self, response):
        yield {"url": response.url, "captcha": b"captcha" in response.body}


settings = {
    "ROTATING_PROXY_LIST": open(PROXIES).read().split(),
    "DOWNLOADER_MIDDLEWARES": {"rotating_proxies.middlewares.RotatingProxyMiddleware": 610,
                               "rotating_proxies.middlewares.BanDetectionMiddleware": 620},
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": 4, "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": False, "AUTOTHROTTLE_ENABLED": False, "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": os.environ.get("SCRAPY_LOG_LEVEL", "WARNING"),
    "FEEDS": {OUT: {"format": "jsonlines"}},
}
if TOLD:
    settings["ROTATING_PROXY_BAN_POLICY"] = "__main__.CaptchaPolicy"
process = CrawlerProcess(settings=settings)
process.crawl(Pages)
process.start()
'''


@dataclass
class World:
    """The site and its proxies, and what they saw of one run."""

    hosts: int
    pages: int
    seen: Counter[tuple[str, str]] = field(default_factory=Counter)  # (host, proxy)
    times: list[float] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)  # a dead proxy's connections
    proxies: dict[str, ForwardProxy] = field(default_factory=dict)
    tarpit: asyncio.subprocess.Process | None = None
    base: str = ""
    first_ban: dict[str, float] = field(default_factory=dict)  # proxy -> first ban time
    after_ban: Counter[str] = field(default_factory=Counter)  # proxy -> kept elsewhere

    async def page(self, request: web.Request) -> web.Response:
        host = request.host.split(":")[0].removesuffix(".test")
        via = request.headers.get("X-Via-Proxy", "direct")
        self.seen[(host, via)] += 1
        now = time.monotonic()
        self.times.append(now)
        if via in self.first_ban and BANS.get(host, {}).get(via) is None:
            self.after_ban[via] += 1
        how = BANS.get(host, {}).get(via)
        if how is not None:
            self.first_ban.setdefault(via, now)
        if how == "403":
            return web.Response(status=403, text="banned")
        if how == "captcha":
            return web.Response(text=CAPTCHA, content_type="text/html")
        await asyncio.sleep(0.005)  # a page takes a few ms to make
        return web.Response(text=f"<html><body><p class='item'>{host} "
                            f"{request.match_info['i']}</p></body></html>",
                            content_type="text/html")

    def urls(self) -> list[str]:
        return [f"http://h{h}.test/p/{i}" for i in range(self.pages) for h in range(self.hosts)]

    def reset(self) -> None:
        self.seen.clear()
        self.times.clear()
        self.dropped.clear()
        self.first_ban.clear()
        self.after_ban.clear()

    async def revive(self) -> None:
        if self.tarpit is not None:
            self.tarpit.terminate()
            out, _ = await self.tarpit.communicate()
            self.dropped.update(json.loads(out or b"{}"))
            self.tarpit = None
        for name in DYING:
            await self.proxies[name].revive()

    async def kill_mid_crawl(self) -> None:
        """Kill the dying proxies once a quarter of the pages were served; their ports then
        reset every connection at once, as a dead host's do, counting them (a process of
        its own: the bench's loop, busy with the site, would answer late)."""
        quarter = self.hosts * self.pages // 4
        while sum(self.seen.values()) < quarter:  # noqa: ASYNC110 - the site's count
            await asyncio.sleep(0.02)
        ports = {}
        for name in DYING:
            await self.proxies[name].kill()
            ports[name] = self.proxies[name].port
        self.tarpit = await asyncio.create_subprocess_exec(
            sys.executable, "-c", TARPIT, json.dumps(ports), stdout=asyncio.subprocess.PIPE)


#: A dead proxy's port: every connection reset at once (SO_LINGER 0), counted; the counts
#: as JSON on SIGTERM.
TARPIT = """
import json, selectors, signal, socket, struct, sys
ports = json.loads(sys.argv[1]); counts = dict.fromkeys(ports, 0); sel = selectors.DefaultSelector()
for name, port in ports.items():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(512); sel.register(s, selectors.EVENT_READ, name)
def done(*_):
    print(json.dumps(counts), flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close(); counts[key.data] += 1
"""


@contextlib.asynccontextmanager
async def world(hosts: int, pages: int):  # type: ignore[no-untyped-def]
    w = World(hosts, pages)
    app = web.Application()
    app.router.add_get("/p/{i}", w.page)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    w.base = f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    for name in [*HEALTHY, *DYING, *[p for bans in BANS.values() for p in bans]]:
        w.proxies[name] = await ForwardProxy(name, w.base).start()
    try:
        yield w
    finally:
        if w.tarpit is not None:
            w.tarpit.kill()
            await w.tarpit.wait()
        for proxy in w.proxies.values():
            await proxy.close()
        await runner.cleanup()


@dataclass
class Result:
    label: str
    delivered: list[tuple[str, bool]]  # (url, captcha)
    seen: Counter[tuple[str, str]]
    dropped: int
    span: float
    after_ban: int
    note: str = ""

    @property
    def pages(self) -> int:
        return len({u for u, captcha in self.delivered if not captcha})

    @property
    def captchas(self) -> int:
        return sum(captcha for _, captcha in self.delivered)

    @property
    def requests(self) -> int:
        return sum(self.seen.values()) + self.dropped

    @property
    def wasted(self) -> int:
        banned = sum(n for (h, p), n in self.seen.items() if BANS.get(h, {}).get(p))
        return banned + self.dropped


async def run_clients(w: World, argvs: list[list[str]], env: dict[str, str],
                      limit_s: float, logs: Path) -> str:
    """Run the client processes to their end, the dying proxies killed mid-way."""
    killer = asyncio.create_task(w.kill_mid_crawl())
    procs = []
    for i, argv in enumerate(argvs):
        with (logs / f"client-{i}.log").open("wb") as log:
            procs.append(await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=logs, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT))
    note = ""
    try:
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), limit_s)
        if any(codes):
            note = f"exit codes {codes}"
    except TimeoutError:
        note = f"not done after {limit_s:g}s"
    finally:
        killer.cancel()
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    return note


async def result(label: str, w: World, delivered: list[tuple[str, bool]], note: str
                 ) -> Result:
    await w.revive()  # the tarpit's counts in, the dying proxies back for the next run
    span = max(w.times) - min(w.times) if w.times else 0.0
    return Result(label, delivered, Counter(w.seen), sum(w.dropped.values()), span,
                  sum(w.after_ban.values()), note)


async def run_crawlq(w: World, args: argparse.Namespace, work: Path) -> Result:
    with RedisServer() as redis_server:
        client = aioredis.Redis.from_url(redis_server.url)
        crawl = "proxybench"
        await create_policy(client, crawl, {
            "per_host_delay": 0.0, "per_host_concurrency": 4, "ignore_robots": True,
            "ban_selector": "div.captcha"}, by="proxy_bench")
        queue = await CrawlQueue.open(client, crawl, CrawlSettings())
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in w.urls()])
        out = work / "crawlq-out"
        argvs = [[sys.executable, "-m", "consumer", "--redis-url", redis_server.url,
                  "--crawl", crawl, "--worker-id", f"bench-{i}", "--allow-private",
                  "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1",
                  "--concurrency", "32", "--store-body", "--output", str(out / str(i)),
                  "--log-level", "WARNING",
                  *[a for p in w.proxies.values() for a in ("--proxy", p.url)]]
                 for i in range(args.consumers)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env["PYTHONPATH"] = str(ROOT)
        note = await run_clients(w, argvs, env, args.timeout, work)
        stats = await queue.stats()
        await client.aclose()
    delivered = [(json.loads(line)["url"], "captcha" in json.loads(line).get("body", ""))
                 for path in out.rglob("*.jsonl") for line in path.read_text().splitlines()
                 if json.loads(line)["outcome"] == "ok"]
    note = "; ".join(x for x in (note, f"done {stats.done}, dead {stats.dead} "
                                        f"{dict(stats.dead_reasons)}") if x)
    return await result(f"crawlq {args.consumers} consumers", w, delivered, note)


def scrapy_python() -> Path:
    """The bench's venv python, with Scrapy and scrapy-rotating-proxies (made once)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import scrapy, rotating_proxies"]
    if python.exists() and subprocess.run(check, capture_output=True,
                                                          check=False).returncode == 0:
        return python
    print(f"installing Scrapy and scrapy-rotating-proxies into {VENV} (once) ...", flush=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "scrapy",
                    "scrapy-rotating-proxies"], check=True)
    return python


async def run_scrapy(w: World, args: argparse.Namespace, work: Path, python: Path,
                     policy: str) -> Result:
    spider, urls, proxies = work / "spider.py", work / "urls.txt", work / "proxies.txt"
    spider.write_text(SPIDER)
    urls.write_text("\n".join(w.urls()))
    proxies.write_text("\n".join(p.url for p in w.proxies.values()))
    out = work / f"scrapy-{policy}.jsonl"
    note = await run_clients(w, [[str(python), str(spider), str(urls), str(proxies),
                                  str(out), policy]], dict(os.environ), args.timeout, work)
    items = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    delivered = [(i["url"], i["captcha"]) for i in items]
    if not items:
        lines = (work / "client-0.log").read_text(errors="replace").splitlines()
        note = "; ".join([note, *[ln[:200] for ln in lines if "Error" in ln][-3:]])
    return await result(f"Scrapy rotating-proxies ({policy})", w, delivered, note)


def report(results: list[Result], total: int) -> None:
    print(f"\n{total} pages; 12 proxies: 6 healthy, 2 dying mid-crawl, 2 banned by h0 (403), "
          "2 by h1 (a 200 captcha)")
    head = (f"{'run':<36} {'pages done':>11} {'requests':>9} {'wasted':>15} "
            f"{'captchas':>9} {'kept':>6} {'span':>7}")
    print(head)
    for r in results:
        share = r.wasted / r.requests if r.requests else 0.0
        print(f"{r.label:<36} {r.pages:>5}/{total:<5} {r.requests:>9} "
              f"{r.wasted:>5} ({share:6.2%}) {r.captchas:>9} {r.after_ban:>6} {r.span:6.1f}s")
        print(f"    wasted: {r.dropped} through dead proxies, {r.wasted - r.dropped} to hosts "
              f"banning the proxy" + (f"; {r.note}" if r.note else ""))
    crawlq = results[0]
    share = crawlq.wasted / crawlq.requests if crawlq.requests else 1.0
    print(f"\ntargets (crawlq): every page done {'met' if crawlq.pages == total else 'NOT MET'}"
          f"; wasted <= {TARGET_WASTED:.0%}: {'met' if share <= TARGET_WASTED else 'NOT MET'}"
          f" ({share:.2%}); 0 captchas as data: "
          f"{'met' if crawlq.captchas == 0 else 'NOT MET'}; banned proxies kept for other "
          f"hosts: {'met' if crawlq.after_ban > 0 else 'NOT MET'} ({crawlq.after_ban})")
    print("columns: wasted = requests through a dead proxy or to a host banning the proxy; "
          "captchas = captcha pages delivered as data; kept = requests the banned proxies "
          "carried to other hosts after their first ban")


async def main(args: argparse.Namespace) -> None:
    python = None if args.skip_scrapy else scrapy_python()
    work = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    results = []
    try:
        async with world(args.hosts, args.pages) as w:
            runs = [("crawlq", None)]
            if python is not None:
                runs += [("scrapy", "default"), ("scrapy", "told")]
            for kind, policy in runs:
                w.reset()
                print(f"running {kind} {policy or ''} ...", flush=True)
                run_dir = work / f"{kind}-{policy}"
                run_dir.mkdir()
                if kind == "crawlq":
                    results.append(await run_crawlq(w, args, run_dir))
                else:
                    assert python is not None and policy is not None
                    results.append(await run_scrapy(w, args, run_dir, python, policy))
    finally:
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args.hosts * args.pages)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=4, help="host names on the site (>= 2)")
    p.add_argument("--pages", type=int, default=250, help="pages each host serves")
    p.add_argument("--consumers", type=int, default=3, help="crawlq consumer processes")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds a run may take")
    p.add_argument("--skip-scrapy", action="store_true", help="run crawlq alone")
    args = p.parse_args(argv)
    if args.hosts < 2:
        p.error("--hosts must be >= 2 (h0 and h1 ban proxies)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
