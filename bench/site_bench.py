"""A link-following crawl of a real site: wget, crawlq (one and two consumers), Scrapy.

    python bench/site_bench.py [--root DIR] [--per-host-concurrency 16] [--rounds 1]
                               [--timeout 120] [--skip-scrapy]

The site is a real HTML tree: Debian's python3-doc (``/usr/share/doc/python3-doc/html``,
~530 pages, ~160k links; ``apt-get install -y python3-doc`` is run when it is missing and
no ``--root`` is given), served by an nginx the bench starts on a free 127.0.0.1 port.
Every run starts from the tree's ``index.html`` on that one server and follows links
until nothing new is found:

1. **wget**: ``wget -r -l inf -np -nv --no-host-directories`` into a temp dir, with
   ``--reject-regex`` for stylesheets, scripts and images (wget fetches what pages embed,
   a link-follower doesn't): the reference for which HTML pages the site has. One
   connection, one request at a time; robots.txt fetched (a 404), as crawlq does.
2. **crawlq, one consumer**: a fresh crawl (redis FLUSHALL, a new crawl name) on the
   bench's own redis-server (``RedisServer``), the start URL enqueued with
   ``CrawlQueue.enqueue``, then ``python -m consumer --handler consumer.handlers:links
   --max-depth 1000 --per-host-delay 0 --per-host-concurrency P --allow-private
   --exit-when-empty --empty-grace 0 --concurrency 64 --http-port -1 --sink jsonl``
   (no bodies stored); robots.txt on (a 404).
3. **crawlq, two consumers** together on a fresh crawl, same flags (the per-host
   concurrency P is for the fleet, shared by both).
4. **Scrapy**: a ``CrawlSpider`` with one ``Rule(LinkExtractor(allow_domains=127.0.0.1,
   deny_extensions=[]), follow=True)`` (every link on the host), ``CONCURRENT_REQUESTS``
   64, ``CONCURRENT_REQUESTS_PER_DOMAIN`` P, no robots.txt, no delay, no AutoThrottle,
   no HTTP cache, no items: the spider file is written to a temp dir at run time and run
   in a venv the bench creates once under ``~/.cache/crawlq-bench/scrapy-venv``
   (``pip install scrapy``; ``--skip-scrapy`` skips it).

The server is the instrument: nginx writes one access-log line per request (``$msec``,
``$request_time``, status, bytes, User-Agent, ``X-Bench-Client``, URI) and every figure
but CPU is read from the lines of that run (the log's offset is noted before a run
starts). Each client process is known by its User-Agent, or for crawlq (whose consumers
send their crawl's User-Agent) by the ``X-Bench-Client`` header each consumer adds
(``--header``), so each process's first request is known. Per run:

- **pages**: distinct URIs (query dropped) answered 200 whose path ends in ``.html`` (or
  ``/``); crawlq's and Scrapy's sets are compared with wget's, and any difference is
  printed with examples;
- **requests**: every request of the run, with the count per status;
- **span**: from the start of the first request (its ``$msec - $request_time``) to the end
  of the last (``$msec``): start-up and exit of the clients are outside it;
- **idle** (crawlq and Scrapy): the share of the span the client processes were not on a
  CPU: 1 - their CPU from first request to exit / (span x processes). A consumer is one
  event loop: while it is not computing it waits (on Redis, a timer, a host's slot, an
  empty frontier). A server-side measure can't tell this: nginx logs times in whole
  milliseconds and serves a static page in well under one. What the server does show is
  the share of the span in gaps of at least ``--stall-ms`` (10 ms, many pages' worth of
  client work) between requests: printed beside it (for wget too);
- **CPU** (crawlq and Scrapy): the client processes' user + system CPU from their first
  request at the server to their exit: ``/proc/<pid>/stat`` is read as soon as the
  process's first request shows up in the access log (polled every 2 ms; nginx writes it
  when that response is sent, ~its first lease for a consumer) and subtracted from the
  total ``wait4`` reports at exit. Start-up (imports, Redis connect) is so excluded, the
  drain at the end is included. Per page, and per **discovered link**: every
  ``<a href>`` / ``<area href>`` occurrence on the pages the run fetched, counted once per
  page from the served files with selectolax (independent of crawlq's own parser; the
  same ~300 links a page whether a crawler dedups them or not).

Ratios, with the targets beside them: crawlq-1 span / wget span (<= 1), Scrapy span /
crawlq-1 span (>= 5), consumer CPU per discovered link (<= 8 us), idle share of the
crawlq spans (<= 10%), crawlq-2 speed / crawlq-1 speed (= crawlq-1 span / crawlq-2 span,
>= 1.3). ``--rounds N`` repeats the four runs and prints the medians. A client that is not
done after ``--timeout`` seconds is stopped and reported; every process the bench starts
(nginx, redis-server, consumers, wget, Scrapy) is stopped on exit, Ctrl-C included.
Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import redis.asyncio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402
from benchlib import (  # noqa: E402
    DOC_ROOT,
    apt_install,
    cpu_seconds,
    doc_root,
    run_in_workdir,
    start_nginx,
)

from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.runtime import run_loop  # noqa: E402
from common.urls.canonical import canonicalize, fingerprint  # noqa: E402

SCRAPY_VENV = Path.home() / ".cache" / "crawlq-bench" / "scrapy-venv"
# What pages embed and a link-follower never fetches: wget -r fetches these, so skip them.
WGET_REJECT = r"\.(css|js|png|gif|jpe?g|svg|ico|woff2?|ttf)(\?.*)?$"

TARGET_WGET = 1.0  # crawlq-1 span / wget span, at most
TARGET_SCRAPY = 5.0  # Scrapy span / crawlq-1 span, at least
TARGET_CPU_LINK_US = 8.0  # consumer CPU per discovered link, at most
TARGET_IDLE = 0.10  # idle share of a crawlq span, at most
TARGET_SCALE = 1.3  # crawlq-2 speed / crawlq-1 speed, at least

#: site_bench's part of nginx's http block: the access log it reads ({log}), the types.
NGINX_HTTP = """\
    log_format bench '$msec\\t$request_time\\t$status\\t$body_bytes_sent\\t'
                     '$http_user_agent\\t$http_x_bench_client\\t$request_uri';
    access_log {log} bench;
    types {
        text/html html htm;
        text/css css;
        application/javascript js;
        application/json json;
        image/png png;
        image/svg+xml svg;
        text/plain txt py inv;
    }
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;"""

SPIDER = '''\
"""The Scrapy side of bench/site_bench.py: follow every link on the host, count pages."""

import json
import sys
from urllib.parse import urlsplit

from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

START, PER_HOST, USER_AGENT = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class SiteSpider(CrawlSpider):
    name = "site"
    allowed_domains = ["127.0.0.1"]
    start_urls = [START]
    # allow_domains matches the URL's netloc: the port must be in it.
    rules = (Rule(LinkExtractor(allow_domains=[urlsplit(START).netloc], deny_extensions=[]),
                  callback="page", follow=True),)
    pages = 0

    def parse_start_url(self, response):
        self.pages += 1
        return []

    def page(self, response):
        self.pages += 1

    def closed(self, reason):
        print(json.dumps({"pages": self.pages, "reason": reason}), flush=True)


process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": 64,
    "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    "ROBOTSTXT_OBEY": False,
    "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": False,
    "HTTPCACHE_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "WARNING",
    "USER_AGENT": USER_AGENT,
})
process.crawl(SiteSpider)
process.start()
'''


# -- processes: every one the bench starts, stopped on exit ---------------------------------


STARTED: list[subprocess.Popen[bytes]] = []


def spawn(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
        argv, stdin=subprocess.DEVNULL, **kwargs)
    STARTED.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.returncode is not None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def stop_all() -> None:
    for proc in reversed(STARTED):
        stop(proc)
    STARTED.clear()
    benchlib.stop_all()  # nginx (benchlib.start_nginx)



def count_links(root: Path) -> dict[str, int]:
    """``<a href>`` + ``<area href>`` occurrences of every .html file, by URI path."""
    def count(body: bytes) -> int:
        try:
            from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415
        except ImportError:  # lxml, which crawlq's links handler uses anyway
            import lxml.html  # noqa: PLC0415
            return len(lxml.html.document_fromstring(body).xpath("//a[@href] | //area[@href]"))
        return len(LexborHTMLParser(body).css("a[href], area[href]"))

    counts: dict[str, int] = {}
    for path in root.rglob("*.html"):
        uri = "/" + path.relative_to(root).as_posix()
        counts[uri] = count(path.read_bytes())
        if uri.endswith("/index.html"):  # the same page as its directory
            counts[uri[:-len("index.html")]] = counts[uri]
        if uri.endswith("/index.html"):
            counts[uri[:-len("index.html")]] = counts[uri]
    return counts


@dataclass(frozen=True, slots=True)
class Hit:
    """One access-log line."""

    start: float  # $msec - $request_time
    end: float  # $msec
    status: int
    agent: str
    uri: str


def parse_line(line: str) -> Hit | None:
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 7:
        return None
    msec, rt, status, _, agent, client, uri = parts
    end = float(msec)
    # A crawl's consumers share its User-Agent (the crawl policy's): each names itself
    # in an X-Bench-Client header.
    return Hit(end - float(rt), end, int(status), agent if client == "-" else client, uri)


class AccessLog:
    """The access log, read from an offset: each run's lines are its own (`parse` makes
    one line a hit, None for a line that isn't one: recrawl_bench logs other fields)."""

    def __init__(self, path: Path, parse: Callable[[str], Any] = parse_line) -> None:
        self.path = path
        self.parse = parse

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, start: int, end: int | None = None) -> tuple[list[Any], int]:
        """Whole lines from byte `start` (to `end`); returns them and where they stop."""
        with open(self.path, "rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(end - start)
        cut = data.rfind(b"\n") + 1
        hits = [h for line in data[:cut].decode("utf-8", "replace").splitlines()
                if (h := self.parse(line)) is not None]
        return hits, start + cut


def page_uri(uri: str) -> str | None:
    """The page a request stands for (query dropped), or None when it is not HTML."""
    path = unquote(uri.split("?", 1)[0].split("#", 1)[0])
    return path if path.endswith((".html", ".htm", "/")) else None


def idle_gaps(hits: list[Hit]) -> list[float]:
    """The gaps of the span where no request was in flight: between the segments of the
    union of the requests' [start, end] intervals."""
    gaps: list[float] = []
    end: float | None = None
    for h in sorted(hits, key=lambda h: h.start):
        if end is not None and h.start > end:
            gaps.append(h.start - end)
        end = h.end if end is None else max(end, h.end)
    return gaps


# -- one run: clients started, watched at the server, stopped ------------------------------------


@dataclass
class Client:
    argv: list[str]
    agent: str  # the User-Agent it sends: its lines in the access log
    proc: subprocess.Popen[bytes] | None = None
    out: Path | None = None
    cpu_at_first: float | None = None  # CPU when its first request showed up
    cpu_total: float | None = None  # at exit (wait4)

    @property
    def crawl_cpu(self) -> float:
        """CPU from its first request to exit (0 for one that never sent a request)."""
        if self.cpu_total is None or self.cpu_at_first is None:
            return 0.0
        return self.cpu_total - self.cpu_at_first


@dataclass
class Run:
    label: str
    hits: list[Hit] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    timed_out: bool = False
    over_budget: bool = False  # stopped at run_clients' max_requests
    wall_s: float = 0.0
    exit_codes: list[int | None] = field(default_factory=list)
    note: str = ""

    @property
    def pages(self) -> set[str]:
        return {u for h in self.hits if h.status == 200 and (u := page_uri(h.uri))}

    @property
    def span(self) -> float:
        if not self.hits:
            return 0.0
        return max(h.end for h in self.hits) - min(h.start for h in self.hits)

    @property
    def idle(self) -> float:
        """Share of the span the client processes were off the CPU (0 without a CPU
        reading, as for wget)."""
        span, cpu = self.span, self.cpu
        if not span or not cpu:
            return 0.0
        return max(0.0, 1 - cpu / (span * len(self.clients)))

    def stalled(self, min_gap: float) -> float:
        """Share of the span in idle gaps of at least `min_gap` seconds."""
        span = self.span
        return sum(g for g in idle_gaps(self.hits) if g >= min_gap) / span if span else 0.0

    @property
    def cpu(self) -> float:
        return sum(c.crawl_cpu for c in self.clients)


def run_clients(label: str, clients: list[Client], *, log: AccessLog, workdir: Path,
                timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT,
                max_requests: int = 0) -> Run:
    """Start every client (in `cwd`), note each one's CPU at its first request, wait for
    all to exit (or stop them at `timeout`, or once they have sent `max_requests`
    requests when it is not 0), and return the run with its access-log lines."""
    run = Run(label, clients=clients)
    offset = pos = log.size()
    by_agent = {c.agent: c for c in clients}
    sent = 0
    started = time.monotonic()
    for i, c in enumerate(clients):
        c.out = workdir / f"{label.replace(' ', '_')}-{i}.out"
        with open(c.out, "wb") as out:
            c.proc = spawn(c.argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    running = {c.proc.pid: c for c in clients if c.proc is not None}
    try:
        while running:
            if max_requests or any(c.cpu_at_first is None for c in clients):
                hits, pos = log.read(pos)
                for h in hits:
                    who = by_agent.get(h.agent)
                    sent += who is not None
                    if who is not None and who.cpu_at_first is None and who.proc is not None:
                        who.cpu_at_first = cpu_seconds(who.proc.pid)
            for pid, c in list(running.items()):
                done_pid, status, usage = os.wait4(pid, os.WNOHANG)
                if done_pid == pid and c.proc is not None:
                    c.proc.returncode = os.waitstatus_to_exitcode(status)
                    c.cpu_total = usage.ru_utime + usage.ru_stime
                    del running[pid]
            if running and max_requests and sent >= max_requests:
                run.over_budget = True
                break
            if time.monotonic() - started > timeout:
                run.timed_out = True
                break
            time.sleep(0.002 if any(c.cpu_at_first is None for c in clients) else 0.02)
    finally:
        for c in clients:
            if c.proc is not None:
                stop(c.proc)
    run.wall_s = time.monotonic() - started
    run.exit_codes = [c.proc.returncode if c.proc else None for c in clients]
    time.sleep(0.05)  # nginx logs a request as its answer goes out
    run.hits, _ = log.read(offset)
    return run


def tail(path: Path | None, lines: int = 8) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "\n".join("    | " + line for line in text)


@dataclass
class Env:
    """What every run shares."""

    args: argparse.Namespace
    root: Path
    port: int
    log: AccessLog
    workdir: Path
    redis: RedisServer
    links: dict[str, int]

    @property
    def start_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/index.html"


def run_wget(env: Env) -> Run:
    out = env.workdir / "wget"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["wget", "-r", "-l", "inf", "-np", "-nv", "--no-host-directories", "-P", str(out),
            "--reject-regex", WGET_REJECT, "-U", "wget-bench", "--no-proxy", env.start_url]
    run = run_clients("wget", [Client(argv, "wget-bench")], log=env.log, workdir=env.workdir,
                      timeout=env.args.timeout)
    shutil.rmtree(out, ignore_errors=True)
    if run.exit_codes[0] not in (0, 8):  # 8: the server answered an error (a 404) somewhere
        run.note = f"wget exited {run.exit_codes[0]}\n{tail(run.clients[0].out)}"
    return run


async def fresh_crawl(url: str, crawl: str, start_url: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.flushall()
        canonical = canonicalize(start_url)
        if not isinstance(canonical, str):
            raise SystemExit(f"start URL rejected: {canonical}")
        queue = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=1))
        await queue.enqueue([NewTask(canonical, fingerprint(canonical))])
    finally:
        await client.aclose()


async def crawl_outcome(url: str, crawl: str) -> str:
    client = redis.asyncio.Redis.from_url(url)
    try:
        queue = await CrawlQueue.open(client, crawl)
        s = await queue.stats()
        dead_tasks = await queue.dead_list(limit=3) if s.dead else []
    finally:
        await client.aclose()
    dead = f" ({', '.join(f'{k} {v}' for k, v in s.dead_reasons.items())})" if s.dead else ""
    return (f"done {s.done}, dead {s.dead}{dead}, left pending {s.pending}, "
            f"leased {s.leased}, waiting {s.waiting}" + "".join(
                f"\n      dead: {d.url} {d.reason}: {d.message[:200]}" for d in dead_tasks))


def consumer_argv(redis_url: str, crawl: str, agent: str, out: Path,
                  args: argparse.Namespace) -> list[str]:
    """The benchmarked ``python -m consumer``: every link followed (depth 1000), its
    requests marked ``X-Bench-Client: <agent>``, at `args`' concurrency and per-host
    concurrency, its results as JSON lines under `out`."""
    return [
        sys.executable, "-m", "consumer", "--redis-url", redis_url, "--crawl", crawl,
        "--worker-id", agent, "--header", f"X-Bench-Client: {agent}",
        "--handler", "consumer.handlers:links", "--max-depth", "1000",
        "--per-host-delay", "0", "--per-host-concurrency", str(args.per_host_concurrency),
        "--allow-private", "--exit-when-empty", "--empty-grace", "0",
        "--concurrency", str(args.concurrency), "--http-port", "-1",
        "--sink", "jsonl", "--output", str(out), "--grace", "2",
        "--log-level", "WARNING"]


def run_crawlq(env: Env, consumers: int) -> Run:
    args = env.args
    crawl = f"site-{consumers}x-{int(time.time() * 1000)}"
    run_loop(fresh_crawl(env.redis.url, crawl, env.start_url))
    out = env.workdir / crawl
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    clients = []
    for i in range(consumers):
        agent = f"crawlq-bench-{i}"
        clients.append(Client(consumer_argv(env.redis.url, crawl, agent, out, args), agent))
    label = f"crawlq {consumers} consumer{'s' if consumers > 1 else ''}"
    run = run_clients(label, clients, log=env.log, workdir=env.workdir, timeout=args.timeout,
                      env=child_env)
    run.note = "queue: " + run_loop(crawl_outcome(env.redis.url, crawl))
    if run.timed_out or any(run.exit_codes) or any(
            c.out is not None and c.out.stat().st_size for c in clients):
        run.note += "".join(f"\n  consumer {i} exited {c.proc.returncode if c.proc else '?'}"
                            f"\n{tail(c.out)}" for i, c in enumerate(clients))
    shutil.rmtree(out, ignore_errors=True)
    return run


def scrapy_python(refresh: bool) -> Path:
    """The venv's python, with Scrapy installed (created once, then reused)."""
    python = SCRAPY_VENV / "bin" / "python"
    check = [str(python), "-c", "import scrapy"]
    if not refresh and python.exists() and subprocess.run(
            check, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing Scrapy into {SCRAPY_VENV} (once) ...", flush=True)
    SCRAPY_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(SCRAPY_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "scrapy"], check=True)
    return python


def run_scrapy(env: Env, python: Path) -> Run:
    spider = env.workdir / "site_spider.py"
    spider.write_text(SPIDER)
    agent = "scrapy-bench"
    argv = [str(python), str(spider), env.start_url, str(env.args.per_host_concurrency), agent]
    run = run_clients("scrapy", [Client(argv, agent)], log=env.log, workdir=env.workdir,
                      timeout=env.args.timeout)
    if run.timed_out or run.exit_codes[0]:
        run.note = f"scrapy exited {run.exit_codes[0]}\n{tail(run.clients[0].out)}"
    return run


# -- reporting ----------------------------------------------------------------------------------


def ok(good: bool, *runs: Run | None) -> str:
    if any(run is not None and run.timed_out for run in runs):
        return "n/a (a run timed out)"
    return "OK" if good else "MISSED"


def examples(uris: set[str], n: int = 5) -> str:
    shown = sorted(uris)[:n]
    return ", ".join(shown) + (f", ... ({len(uris)} in all)" if len(uris) > n else "")


@dataclass
class Round:
    wget: Run
    one: Run
    two: Run
    scrapy: Run | None
    links: dict[str, int]

    def discovered(self, run: Run) -> int:
        return sum(self.links.get(u, 0) for u in run.pages)

    def cpu_per_link_us(self, run: Run) -> float:
        links = self.discovered(run)
        return 1e6 * run.cpu / links if links else 0.0

    @property
    def vs_wget(self) -> float:
        return self.one.span / self.wget.span if self.wget.span else 0.0

    @property
    def scrapy_ratio(self) -> float:
        return self.scrapy.span / self.one.span if self.scrapy and self.one.span else 0.0

    @property
    def scale(self) -> float:
        return self.one.span / self.two.span if self.two.span else 0.0


def print_run(run: Run, reference: Run | None, links: dict[str, int], *, cpu: bool,
              stall_s: float) -> None:
    pages = run.pages
    statuses = Counter(h.status for h in run.hits)
    print(f"{run.label:20} {len(pages):5d} pages  {len(run.hits):5d} requests "
          f"({', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))})  "
          f"span {run.span:6.2f} s  idle {100 * run.idle:4.1f}% (in gaps >= "
          f"{1000 * stall_s:.0f} ms: {100 * run.stalled(stall_s):4.1f}%)  "
          f"({run.wall_s:.2f} s wall)")
    others = {h.uri for h in run.hits if h.status != 200 or not page_uri(h.uri)}
    if others:
        print(f"    not pages: {examples(others, 4)}")
    if run.timed_out:
        print(f"    TIMED OUT after {run.wall_s:.0f} s: stopped, figures are partial")
    if reference is not None and reference is not run and pages != reference.pages:
        missing, extra = reference.pages - pages, pages - reference.pages
        if missing:
            print(f"    not found (wget found them): {examples(missing)}")
        if extra:
            print(f"    found beyond wget's set: {examples(extra)}")
    if cpu and pages:
        n_links = sum(links.get(u, 0) for u in pages)
        requests = Counter(h.agent for h in run.hits)
        per_client = ", ".join(f"{c.agent} {c.crawl_cpu:.2f} s for {requests[c.agent]} requests"
                               for c in run.clients)
        print(f"    CPU {run.cpu:.2f} s from first request to exit "
              f"({per_client}): {1e6 * run.cpu / len(pages):.0f} us/page, "
              f"{1e6 * run.cpu / n_links:.2f} us per discovered link ({n_links} links)"
              if n_links else f"    CPU {run.cpu:.2f} s")
    if run.note:
        print("    " + run.note)


def print_round(r: Round, stall_s: float) -> None:
    print_run(r.wget, None, r.links, cpu=False, stall_s=stall_s)
    print_run(r.one, r.wget, r.links, cpu=True, stall_s=stall_s)
    print_run(r.two, r.wget, r.links, cpu=True, stall_s=stall_s)
    if r.scrapy is not None:
        print_run(r.scrapy, r.wget, r.links, cpu=True, stall_s=stall_s)
    print(f"crawlq-1 span / wget span      {r.vs_wget:6.2f}   target <= {TARGET_WGET:.0f}   "
          f"{ok(r.vs_wget <= TARGET_WGET, r.one, r.wget)}")
    if r.scrapy is not None:
        print(f"Scrapy span / crawlq-1 span    {r.scrapy_ratio:6.2f}   target >= "
              f"{TARGET_SCRAPY:.0f}   {ok(r.scrapy_ratio >= TARGET_SCRAPY, r.scrapy, r.one)}")
    cpu1 = r.cpu_per_link_us(r.one)
    print(f"consumer CPU per link (1 / 2)  {cpu1:6.2f} / {r.cpu_per_link_us(r.two):.2f} us"
          f"   target <= {TARGET_CPU_LINK_US:.0f} us   {ok(cpu1 <= TARGET_CPU_LINK_US, r.one)}")
    idle = max(r.one.idle, r.two.idle)
    print(f"idle share (1 / 2)             {100 * r.one.idle:5.1f}% / {100 * r.two.idle:.1f}%"
          f"   target <= {100 * TARGET_IDLE:.0f}%   {ok(idle <= TARGET_IDLE, r.one, r.two)}")
    print(f"  of it in gaps >= {1000 * stall_s:.0f} ms (1 / 2)  "
          f"{100 * r.one.stalled(stall_s):5.1f}% / {100 * r.two.stalled(stall_s):.1f}%"
          f"   (stalls: the part of idle a CPU-bound client doesn't explain)")
    print(f"crawlq-2 speed / crawlq-1      {r.scale:6.2f}   target >= {TARGET_SCALE}   "
          f"{ok(r.scale >= TARGET_SCALE, r.one, r.two)}")
    same = r.one.pages == r.wget.pages and r.two.pages == r.wget.pages
    print(f"crawlq found wget's pages      {'yes' if same else 'NO'} "
          f"({len(r.wget.pages)} pages)")


def print_medians(rounds: list[Round], stall_s: float) -> None:
    def med(values: list[float], digits: int = 2, scale: float = 1.0) -> str:
        v = [x * scale for x in values]
        return (f"{statistics.median(v):.{digits}f} "
                f"(range {min(v):.{digits}f}-{max(v):.{digits}f})")

    print(f"\n-- medians over {len(rounds)} rounds --")
    for name, runs in (("wget", [r.wget for r in rounds]), ("crawlq-1", [r.one for r in rounds]),
                       ("crawlq-2", [r.two for r in rounds]),
                       ("scrapy", [r.scrapy for r in rounds if r.scrapy is not None])):
        if runs:
            print(f"{name + ' span, s':30} {med([x.span for x in runs])}   idle % "
                  f"{med([x.idle for x in runs], 1, 100)}   in gaps >= "
                  f"{1000 * stall_s:.0f} ms % {med([x.stalled(stall_s) for x in runs], 1, 100)}")
    print(f"{'crawlq-1 span / wget span':30} {med([r.vs_wget for r in rounds])}   "
          f"target <= {TARGET_WGET:.0f}")
    if all(r.scrapy is not None for r in rounds):
        print(f"{'Scrapy span / crawlq-1 span':30} {med([r.scrapy_ratio for r in rounds])}   "
              f"target >= {TARGET_SCRAPY:.0f}")
    print(f"{'consumer CPU/link, us (1)':30} "
          f"{med([r.cpu_per_link_us(r.one) for r in rounds])}   target <= "
          f"{TARGET_CPU_LINK_US:.0f}")
    print(f"{'consumer CPU/link, us (2)':30} {med([r.cpu_per_link_us(r.two) for r in rounds])}")
    print(f"{'crawlq-2 speed / crawlq-1':30} {med([r.scale for r in rounds])}   "
          f"target >= {TARGET_SCALE}")


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None,
                   help=f"the HTML tree to serve (default {DOC_ROOT}, installed with "
                   "apt-get install -y python3-doc when missing); must hold index.html")
    p.add_argument("--per-host-concurrency", type=int, default=16,
                   help="requests in flight to the site (crawlq's fleet-wide limit, "
                   "Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN)")
    p.add_argument("--concurrency", type=int, default=64,
                   help="consumer --concurrency and Scrapy's CONCURRENT_REQUESTS")
    p.add_argument("--rounds", type=int, default=1, help="repeat every run; print medians")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="stop a run (and report it) after this many seconds")
    p.add_argument("--stall-ms", type=float, default=10.0,
                   help="idle gaps at least this long are counted apart, as stalls")
    p.add_argument("--keep-log", type=Path, default=None,
                   help="copy nginx's access log (every run, in order) there at the end")
    p.add_argument("--skip-scrapy", action="store_true", help="skip the Scrapy run")
    p.add_argument("--reinstall-scrapy", action="store_true",
                   help=f"recreate {SCRAPY_VENV} before running")
    return p.parse_args(argv)


def bench(args: argparse.Namespace, workdir: Path) -> int:
    root = doc_root(args.root)
    scrapy = None if args.skip_scrapy else scrapy_python(args.reinstall_scrapy)
    if shutil.which("wget") is None:
        apt_install("wget")
    started = time.perf_counter()
    links = count_links(root)  # reads the tree once: the page cache is warm for run 1
    html_files = sum(1 for u in links if u.endswith(".html"))
    print(f"{root}: {html_files} .html files, {sum(links[u] for u in links if u.endswith('.html'))}"
          f" links (<a href>/<area href>, counted in {time.perf_counter() - started:.1f} s)")
    port, log_path = start_nginx(root, workdir, NGINX_HTTP)
    redis_server = RedisServer().start()
    try:
        env = Env(args, root, port, AccessLog(log_path), workdir, redis_server, links)
        print(f"nginx on 127.0.0.1:{port}, redis-server "
              f"{'.'.join(map(str, redis_server.version()))}, per-host concurrency "
              f"{args.per_host_concurrency}, concurrency {args.concurrency}, "
              f"{os.cpu_count()} CPUs; start URL {env.start_url}")
        rounds = []
        for i in range(args.rounds):
            if args.rounds > 1:
                print(f"\n-- round {i + 1} of {args.rounds} --")
            w = run_wget(env)
            one = run_crawlq(env, 1)
            two = run_crawlq(env, 2)
            sc = run_scrapy(env, scrapy) if scrapy is not None else None
            r = Round(w, one, two, sc, links)
            print_round(r, args.stall_ms / 1000)
            rounds.append(r)
        if args.rounds > 1:
            print_medians(rounds, args.stall_ms / 1000)
    finally:
        redis_server.stop()
        if args.keep_log is not None:
            shutil.copyfile(log_path, args.keep_log)
            print(f"access log kept in {args.keep_log}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_in_workdir("crawlq-site-bench-", lambda workdir: bench(args, workdir),
                          stop_all)


if __name__ == "__main__":
    sys.exit(main())
