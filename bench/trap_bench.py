"""A site of real pages behind crawler traps: crawlq, wget and Scrapy with one depth limit.

    python bench/trap_bench.py [--depth 15] [--timeout 120] [--skip-scrapy] [--skip-wget]

The site (served by this file, ``--serve``, an aiohttp app in its own process on a free
127.0.0.1 port) has ~400 real pages: an index, 10 section pages of 30 articles each, an
about page, a shop of 12 products, and a chain of 12 pages under section 9 whose last one
alone links 60 more (``/hidden/``, at depth 14: found only by a crawl that goes deep).
Every page shares one template (a navigation bar and a footer, ~150 words) and has text
of its own (~120 words). Beside them, five traps, each reached from real pages:

1. **calendar**: every article links ``/calendar?month=2026-05``; each month links the
   previous and the next one, for ever (no events in any).
2. **session ids**: the articles of sections 5-7 link their neighbours and their
   section with ``?sid=<32 hex>``, a new id in every response (a server that tracks
   sessions in URLs for a client without cookies).
3. **repeated segments**: the articles of section 4 link ``files/``: any path under
   ``/doc/files/`` answers the same listing, with relative links ``archive/``, ``2026/``,
   ``images/`` (``/doc/files/archive/2026/archive/...``).
4. **soft 404**: five articles of sections 2-3 have a dead link ``/old/<n>.html``;
   any path under ``/old/`` answers 200, "page not found", with three "you may like"
   links to more paths under ``/old/``.
5. **faceted search**: ``/shop/`` lists the products with links that add, change or
   drop a filter (color, size, brand) or the sort order: every combination is a URL
   (4 x 5 x 5 x 4 = 400), most of them listing no product or one.

Each crawler starts at ``/`` with the same depth limit (``--depth``, 15: the hidden
pages are at 14): **wget** ``-r -l <depth>`` (one connection), **crawlq** one consumer,
the links handler, ``--max-depth <depth>``, per-host concurrency 8, no delay, its trap
rules and near-duplicate check at their defaults (``--set KEY=VALUE`` changes one for
its run), **Scrapy** a CrawlSpider following
every link, ``DEPTH_LIMIT`` <depth>, ``CONCURRENT_REQUESTS_PER_DOMAIN`` 8 (the venv of
bench/site_bench.py). robots.txt answers 404.

The server is the instrument: it logs every request (site_bench's access-log format),
and each run's lines are read after it. Per client: **real pages** found (distinct real
paths answered 200) of those the site has, **requests** in all (robots.txt left out),
**in traps**: every request that was not the first fetch of a real page (a trap's URL,
or a real page fetched again under another session id), its share of the requests, by
trap, and the **span** (first request to last). Target: crawlq finds every real page
with <= 5% of its requests in traps, fewer than wget's and Scrapy's. A client still
running after ``--timeout`` is stopped: its figures are what it did until then.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402
import site_bench  # noqa: E402
from benchlib import apt_install, run_in_workdir, wait_port  # noqa: E402
from site_bench import AccessLog, Client, Run, run_clients, scrapy_python, spawn  # noqa: E402

from common.policy import parse_assignments, set_policy  # noqa: E402
from common.redis_server import RedisServer  # noqa: E402
from common.runtime import run_loop  # noqa: E402

TARGET_TRAP_SHARE = 0.05
SECTIONS, ARTICLES, DEEP, HIDDEN = 10, 30, 12, 60
COLORS, SIZES, BRANDS, SORTS = ("red", "green", "blue"), ("s", "m", "l", "xl"), \
    ("acme", "globex", "initech", "umbrella"), ("name", "price", "newest")
PRODUCTS = [(f"product {p}", COLORS[p % 3], SIZES[p % 4], BRANDS[p * 7 % 4])
            for p in range(12)]
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "ge", "zu", "sha",
              "mor", "len", "tis", "bar", "qui", "fel", "dro")
WORDS = sorted({a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES})
TEMPLATE = " ".join(random.Random("template").choices(WORDS, k=150))

SPIDER = '''\
"""The Scrapy side of bench/trap_bench.py: follow every link on the host."""

import sys
from urllib.parse import urlsplit

from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

START, PER_HOST, USER_AGENT, DEPTH = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])


class TrapSpider(CrawlSpider):
    name = "traps"
    start_urls = [START]
    rules = (Rule(LinkExtractor(allow_domains=[urlsplit(START).netloc], deny_extensions=[]),
                  follow=True),)


process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    "DEPTH_LIMIT": DEPTH, "ROBOTSTXT_OBEY": False, "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": False, "HTTPCACHE_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "WARNING", "USER_AGENT": USER_AGENT,
})
process.crawl(TrapSpider)
process.start()
'''


# -- the site ----------------------------------------------------------------------------------


def real_paths() -> set[str]:
    """Every real page of the site."""
    return ({"/", "/about.html", "/shop/"} | {f"/sec/{s}.html" for s in range(SECTIONS)}
            | {f"/doc/{n}.html" for n in range(SECTIONS * ARTICLES)}
            | {f"/deep/{k}.html" for k in range(1, DEEP + 1)}
            | {f"/hidden/{h}.html" for h in range(HIDDEN)}
            | {f"/product/{p}.html" for p in range(len(PRODUCTS))})


def trap_of(uri: str) -> str:
    """The trap a request's URI belongs to (a real page's: "session ids", a refetch)."""
    path = uri.split("?", 1)[0]
    for prefix, name in (("/calendar", "calendar"), ("/doc/files/", "repeated segments"),
                         ("/old/", "soft 404"), ("/shop/", "faceted search")):
        if path.startswith(prefix):
            return name
    return "session ids" if path in real_paths() else "other"


def text(seed: str, n: int = 120) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=n))


def html(title: str, body: str, links: list[tuple[str, str]]) -> str:
    nav = " ".join(f'<a href="{h}">{t}</a>' for h, t in
                   (("/", "home"), ("/shop/", "shop"), ("/about.html", "about")))
    hrefs = "".join(f'<li><a href="{h}">{t}</a></li>' for h, t in links)
    return (f"<!doctype html><html><head><title>{title}</title></head><body>"
            f"<nav>{nav}</nav><header>{TEMPLATE[:600]}</header><h1>{title}</h1>"
            f"<main><p>{body}</p><ul>{hrefs}</ul></main><footer>{TEMPLATE[600:]}</footer>"
            "</body></html>")


def token() -> str:
    return os.urandom(16).hex()


def article(n: int) -> str:
    s = n // ARTICLES
    links = [(f"/sec/{s}.html", "section")]
    for m in (n - 1, n + 1):
        if s * ARTICLES <= m < (s + 1) * ARTICLES:
            links.append((f"/doc/{m}.html", "article"))
    if 5 <= s <= 7:  # session ids in every internal link
        links = [(f"{h}?sid={token()}", t) for h, t in links]
    links.append(("/calendar?month=2026-05", "events"))
    if s in (2, 3) and n % 12 == 0:  # a few dead links
        links.append((f"/old/{n}.html", "older notes"))
    if s == 4:
        links.append(("files/", "attachments"))
    return html(f"Article {n}", text(f"doc{n}"), links)


def section(s: int) -> str:
    links = [(f"/doc/{n}.html", "article") for n in range(s * ARTICLES, (s + 1) * ARTICLES)]
    if s == SECTIONS - 1:
        links.append(("/deep/1.html", "the archive"))
    return html(f"Section {s}", text(f"sec{s}", 60), links)


def calendar(month: str) -> str:
    year, _, m = month.partition("-")
    y, mo = int(year) if year.isdigit() else 2026, min(max(int(m) if m.isdigit() else 5, 1), 12)
    prev = f"{y - (mo == 1)}-{(mo - 2) % 12 + 1:02d}"
    nxt = f"{y + (mo == 12)}-{mo % 12 + 1:02d}"
    grid = " ".join(DAYS) + " " + " ".join(str(d) for d in range(1, 31 if mo % 2 else 32))
    return html(f"Events: {MONTHS[mo - 1]} {y}", f"{grid} No events this month.",
                [(f"/calendar?month={prev}", "previous month"),
                 (f"/calendar?month={nxt}", "next month")])


def soft_404(path: str) -> str:
    rng = random.Random(path)
    return html("Page not found", "Sorry, we could not find that page. It may have moved "
                "or never existed. You may like these instead:",
                [(f"/old/{rng.choice(WORDS)}-{rng.choice(WORDS)}.html", "you may like")
                 for _ in range(3)])


def listing(path: str) -> str:
    return html(f"Index of {path}", "Name Last modified Size Description Parent directory",
                [("archive/", "archive/"), ("2026/", "2026/"), ("images/", "images/")])


def shop(query: dict[str, str]) -> str:
    shown = [p for p, (_, color, size, brand) in enumerate(PRODUCTS)
             if query.get("color", color) == color and query.get("size", size) == size
             and query.get("brand", brand) == brand]
    if query.get("sort") == "name":
        shown.sort(key=lambda p: PRODUCTS[p][0])
    links = [(f"/product/{p}.html", PRODUCTS[p][0]) for p in shown]
    for facet, values in (("color", COLORS), ("size", SIZES), ("brand", BRANDS),
                          ("sort", SORTS)):
        for value in (*values, ""):
            q = {k: v for k, v in query.items() if k != facet}
            if value:
                q[facet] = value
            links.append(("/shop/?" + urlencode(sorted(q.items())) if q else "/shop/",
                          f"{facet} {value or 'any'}"))
    body = ("Our products. " + " ".join(f"{PRODUCTS[p][0]}: a {PRODUCTS[p][1]} "
                                        f"{PRODUCTS[p][3]} in size {PRODUCTS[p][2]}."
                                        for p in shown)) or "No products match."
    return html("Shop", body, links)


def page_for(path: str, query: dict[str, str]) -> tuple[int, str]:
    """The status and HTML the site answers for a path and query."""
    parts = path.strip("/").split("/")
    name = parts[-1].removesuffix(".html")
    if path == "/":
        return 200, html("Home", text("home"), [(f"/sec/{s}.html", "section")
                                                for s in range(SECTIONS)])
    if path == "/about.html":
        return 200, html("About", text("about"), [])
    if path.startswith("/doc/files/"):
        return 200, listing(path)
    if path.startswith("/old/"):
        return 200, soft_404(path)
    if path == "/calendar":
        return 200, calendar(query.get("month", "2026-05"))
    if path == "/shop/":
        return 200, shop(query)
    if len(parts) == 2 and name.isdigit():
        n = int(name)
        if parts[0] == "doc" and n < SECTIONS * ARTICLES:
            return 200, article(n)
        if parts[0] == "sec" and n < SECTIONS:
            return 200, section(n)
        if parts[0] == "deep" and 1 <= n <= DEEP:
            links = [(f"/deep/{n + 1}.html", "older")] if n < DEEP else \
                [(f"/hidden/{h}.html", "found it") for h in range(HIDDEN)]
            return 200, html(f"Archive {n}", text(f"deep{n}"), links)
        if parts[0] == "hidden" and n < HIDDEN:
            return 200, html(f"Hidden {n}", text(f"hidden{n}"), [])
        if parts[0] == "product" and n < len(PRODUCTS):
            return 200, html(PRODUCTS[n][0], text(f"product{n}", 80), [("/shop/", "shop")])
    return 404, html("Not found", "Not found.", [])


def serve(log: Path) -> None:
    """Run the site on a free port (printed first), logging each request as nginx does
    for site_bench (msec, request time, status, bytes, agent, client, URI)."""
    from aiohttp import web  # noqa: PLC0415

    out = open(log, "a", buffering=1)  # noqa: SIM115 - open while the site runs

    async def handle(request: web.Request) -> web.Response:
        started = time.time()
        status, body = page_for(request.path, dict(request.query))
        data = body.encode()
        end = time.time()
        agent = request.headers.get("User-Agent", "-").replace("\t", " ")
        client = request.headers.get("X-Bench-Client", "-")
        out.write(f"{end:.3f}\t{end - started:.3f}\t{status}\t{len(data)}\t{agent}\t{client}"
                  f"\t{request.path_qs}\n")
        return web.Response(body=data, status=status, content_type="text/html")

    async def main() -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the runs ----------------------------------------------------------------------------------


def run_crawlq(args: argparse.Namespace, start: str, log: AccessLog, workdir: Path,
               redis: RedisServer) -> Run:
    crawl = f"traps-{int(time.time() * 1000)}"
    run_loop(site_bench.fresh_crawl(redis.url, crawl, start))
    if args.set:  # the policy the consumer's flags would make, and these values over it
        run_loop(create_policy(redis.url, crawl, {
            "max_depth": args.depth, "per_host_delay": 0.0, "per_host_concurrency": 8,
            **parse_assignments(args.set)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    agent = "crawlq-bench-0"
    client = Client([sys.executable, "-m", "consumer", "--redis-url", redis.url,
                     "--crawl", crawl, "--worker-id", agent, "--header",
                     f"X-Bench-Client: {agent}", "--handler", "consumer.handlers:links",
                     "--max-depth", str(args.depth), "--per-host-delay", "0",
                     "--per-host-concurrency", "8", "--allow-private", "--exit-when-empty",
                     "--empty-grace", "0", "--concurrency", "32", "--http-port", "-1",
                     "--sink", "jsonl", "--output", str(workdir / crawl), "--grace", "2",
                     "--log-level", "WARNING"], agent)
    run = run_clients("crawlq", [client], log=log, workdir=workdir, timeout=args.timeout,
                      env=env)
    run.note = "queue: " + run_loop(site_bench.crawl_outcome(redis.url, crawl))
    shutil.rmtree(workdir / crawl, ignore_errors=True)
    return run


async def create_policy(url: str, crawl: str, values: dict[str, Any]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await set_policy(client, crawl, values, by="trap_bench", create=True)
    finally:
        await client.aclose()


def run_wget(args: argparse.Namespace, start: str, log: AccessLog, workdir: Path) -> Run:
    out = workdir / "wget"
    argv = ["wget", "-r", "-l", str(args.depth), "-nv", "--no-host-directories", "-P",
            str(out), "-U", "wget-bench", "--no-proxy", start]
    run = run_clients("wget", [Client(argv, "wget-bench")], log=log, workdir=workdir,
                      timeout=args.timeout)
    shutil.rmtree(out, ignore_errors=True)
    return run


def run_scrapy(args: argparse.Namespace, start: str, log: AccessLog, workdir: Path) -> Run:
    python = scrapy_python(False)
    spider = workdir / "trap_spider.py"
    spider.write_text(SPIDER)
    agent = "scrapy-bench"
    argv = [str(python), str(spider), start, "8", agent, str(args.depth)]
    return run_clients("scrapy", [Client(argv, agent)], log=log, workdir=workdir,
                       timeout=args.timeout)


def report(run: Run, real: set[str]) -> float:
    """Print a run's line; returns its share of requests in traps."""
    hits = [h for h in run.hits if not h.uri.startswith("/robots.txt")]
    found: set[str] = set()
    traps: Counter[str] = Counter()
    for h in sorted(hits, key=lambda h: h.start):
        path = h.uri.split("?", 1)[0]
        if h.status == 200 and path in real and path not in found:
            found.add(path)
        else:
            traps[trap_of(h.uri)] += 1
    wasted = sum(traps.values())
    share = wasted / len(hits) if hits else 0.0
    late = " (TIMED OUT: stopped)" if run.timed_out else ""
    print(f"{run.label:8} real pages {len(found):4d}/{len(real)}  requests {len(hits):6d}  "
          f"in traps {wasted:6d} ({100 * share:5.1f}%)  span {run.span:7.2f} s{late}")
    print("         by trap: " + ", ".join(f"{t} {n}" for t, n in traps.most_common()))
    missing = real - found
    if missing:
        print(f"         not found: {', '.join(sorted(missing)[:6])}"
              f"{' ...' if len(missing) > 6 else ''}")
    if run.note:
        print("         " + run.note)
    return share


def bench(args: argparse.Namespace, workdir: Path) -> int:
    if not args.skip_wget and shutil.which("wget") is None:
        apt_install("wget")
    log_path = workdir / "access.log"
    log_path.touch()
    server = spawn([sys.executable, __file__, "--serve", str(log_path)],
                   stdout=subprocess.PIPE)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    wait_port(port, server, "the trap site")
    start = f"http://127.0.0.1:{port}/"
    log = AccessLog(log_path)
    real = real_paths()
    redis = RedisServer().start()
    try:
        print(f"trap site on {urlsplit(start).netloc}: {len(real)} real pages, five traps; "
              f"depth limit {args.depth}; {os.cpu_count()} CPUs")
        runs = [run_crawlq(args, start, log, workdir, redis)]
        if not args.skip_wget:
            runs.append(run_wget(args, start, log, workdir))
        if not args.skip_scrapy:
            runs.append(run_scrapy(args, start, log, workdir))
        shares = {r.label: report(r, real) for r in runs}
        crawlq = runs[0]
        found_all = real <= {h.uri.split("?", 1)[0] for h in crawlq.hits if h.status == 200}
        others = [s for label, s in shares.items() if label != "crawlq"]
        good = (found_all and shares["crawlq"] <= TARGET_TRAP_SHARE
                and all(shares["crawlq"] < s for s in others))
        print(f"crawlq: every real page {'yes' if found_all else 'NO'}, "
              f"{100 * shares['crawlq']:.1f}% of requests in traps (target <= "
              f"{100 * TARGET_TRAP_SHARE:.0f}%, fewer than "
              f"{' and '.join(r.label for r in runs[1:]) or 'nobody'}): "
              f"{'OK' if good else 'MISSED'}")
    finally:
        redis.stop()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--depth", type=int, default=15, help="every crawler's depth limit")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="stop a crawler (and report it) after this many seconds")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a crawl policy value for crawlq's run (crawlq crawl set's syntax; "
                   "e.g. trap_path_variants=16), over the defaults")
    p.add_argument("--skip-wget", action="store_true")
    p.add_argument("--skip-scrapy", action="store_true")
    p.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    return run_in_workdir("crawlq-trap-bench-", lambda workdir: bench(args, workdir),
                          site_bench.stop_all)


if __name__ == "__main__":
    sys.exit(main())
