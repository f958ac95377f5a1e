"""Servers that push back: crawlq and Scrapy's AutoThrottle against rate-limited hosts.

    python bench/pushback_bench.py [--duration 150] [--settle 60] [--kinds aabbcc]
                                   [--rate 5] [--burst R] [--seeds 20000] [--skip-scrapy]
    python bench/pushback_bench.py --quick      # a smoke run: about a minute, Scrapy included

One local aiohttp server (a child process) answers on H loopback addresses, 127.0.0.1 ..
127.0.0.H, one port: each address is its own host to crawlq (host key ``127.0.0.N:port``)
and to Scrapy (whose download slot, and so its AutoThrottle slot, is per hostname: with
one address per host no ``meta['download_slot']`` is needed). Every host keeps a token
bucket of ``--rate`` R requests/s, ``--burst`` deep (default R: one second's worth, full
at the start), and answers a request without a token 429. The kinds (``--kinds``, one
letter per host, default ``aabbcc``):

- **a**: the 429 carries ``Retry-After: 2`` (``--retry-after``) and opens a window in
  which the host refuses everything: a request arriving inside it gets 429 again (with
  ``Retry-After`` the seconds left, rounded up), takes no token and does not move the
  window's end;
- **b**: 429 without a Retry-After;
- **c**: every answer is late by ``--latency-step`` (20 ms) x the requests in flight at
  the host, its own included, as a loaded server is; 429 without a Retry-After above R.

A page is a few bytes of HTML (no links): each client is given the same ``--seeds``
URLs per host (``/p/0`` ..), interleaved by host, more than it can fetch in the run.
``/robots.txt`` (allow all) is served outside the bucket and left out of every figure.
The server is the instrument: it notes each request's arrival (``time.monotonic()`` in
the handler, the clock the bench starts the clients on), host, status, and whether it
arrived before the end of a Retry-After the host had announced (the latest end any of
its 429s gave).

Two runs of ``--duration`` seconds each (150), each against a fresh server process (fresh
buckets, the same port and URLs):

1. **crawlq**: a redis-server of the bench's own on a free port, ``crawlq crawl create
   per_host_delay=0 per_host_concurrency=4 ignore_robots=true`` (politeness off in the
   policy: the fleet must find the host's rate from its answers alone),
   ``crawlq-producer`` the URLs, then three ``crawlq-consumer`` processes with default
   flags but ``--redis-url``, ``--crawl``, ``--allow-private`` (the SSRF guard refuses
   loopback otherwise), ``--output`` (a temp dir) and ``--http-port -1`` (three
   consumers can't share the default metrics port); their logs, ``crawlq stats`` and
   ``crawlq hosts`` at the end are summed up below the table. ``--rev REV`` runs these
   commands from ``git archive REV`` of this checkout instead of the work tree (e.g.
   ``--rev HEAD`` while the work tree holds someone's unfinished edits).
2. **Scrapy** (``--skip-scrapy`` skips it): a spider with the URLs as ``start_urls``,
   ``AUTOTHROTTLE_ENABLED``, ``AUTOTHROTTLE_TARGET_CONCURRENCY`` 1.0 (``--target-
   concurrency``), ``DOWNLOAD_DELAY`` 0, ``CONCURRENT_REQUESTS_PER_DOMAIN`` 4,
   ``CONCURRENT_REQUESTS`` 4 x H (so the global cap never binds), ``RETRY_HTTP_CODES``
   with 429 (Scrapy's default list), robots.txt off; run in the venv site_bench.py uses
   (``~/.cache/crawlq-bench/scrapy-venv``, created with ``pip install scrapy`` once).
   It prints its slots' AutoThrottle delays every 5 s; the run's median and last delay
   per host are shown.

Each client is stopped at the end (SIGTERM, SIGKILL after 25 s). Figures, crawlq beside
Scrapy, per host and overall, over the window after the first ``--settle`` seconds (60)
of each run unless said otherwise:

- **2xx/R**: 2xx answers per second / R (the best a client can do is R, plus the
  bucket's depth spread over the window);
- **req/R**: every request per second / R (what the client offered);
- **429%**: the share of the requests answered 429;
- **in RA window**: requests that arrived inside an announced Retry-After window, over
  the whole run and after the settle (a and only a hosts announce one); ``late`` counts
  those that came more than 0.1 s after the 429 that opened the window, so could not
  have been on their way when the client got it;
- **CoV**: stdev / mean of the 2xx rate over ``--window`` (10 s) windows; min and max
  of a window's rate / R beside it; **gap**: the longest time without a request to the
  host (after the settle);
- **requests**: every request of the run.

Targets (crawlq): >= 0.9 R of 2xx on every host, <= 1% 429s on every host, zero
requests inside a Retry-After window (whole run), steady (the CoV is stated, no
threshold), and a higher overall 2xx rate than Scrapy. Exits 1 if one is missed.
``--quick``: 25 s runs, a 10 s settle, 5 s windows, two hosts (``ab``), 5000 seeds each.
``--keep DIR`` keeps the logs and the server's records there. Every process the bench
starts is stopped on exit, Ctrl-C included; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchlib import (  # noqa: E402
    add_server_args,
    parse_with_profile,
    run_in_workdir,
    spawn,
    stop,
    stop_all,
    tail,
    wait_port,
)

from common.redis.server import RedisServer, free_port  # noqa: E402

KIND_LABELS = {
    "a": "429 + Retry-After, strict",
    "b": "429, no Retry-After",
    "c": "slower under load, 429",
}
TARGET_RATE = 0.9  # 2xx / R on every host, at least
TARGET_429 = 0.01  # share of requests answered 429 on every host, at most
IN_FLIGHT_S = 0.1  # an in-window request later than this after the 429 was sent after it
STOP_GRACE_S = 25.0  # the consumers' --grace is 20 s by default
QUICK = {"duration": 25.0, "settle": 10.0, "window": 5.0, "kinds": "ab", "seeds": 5000}
FULL = {"duration": 150.0, "settle": 60.0, "window": 10.0, "kinds": "aabbcc", "seeds": 20000}

#: A record of the server: arrival (monotonic), host index, status, inside an announced
#: Retry-After window (0/1), seconds since the 429 that opened that window (-1 if not).
Record = tuple[float, int, int, int, float]


def address(i: int) -> str:
    return f"127.0.0.{i + 1}"


# -- the server (a child process: --serve) ------------------------------------------------


@dataclass
class Bucket:
    """One host's state: its token bucket, its Retry-After window, requests in flight."""

    kind: str
    rate: float
    burst: float
    retry_after: int
    tokens: float = 0.0
    last: float = 0.0
    window_end: float = 0.0  # the host refuses everything before this (kind a)
    window_opened: float = 0.0  # when the 429 that opened the window was sent
    announced: float = 0.0  # the latest end any Retry-After of this host announced
    inflight: int = 0

    def answer(self, now: float) -> tuple[int, dict[str, str], bool, float]:
        """Status, headers, and whether `now` is inside an announced window (and how long
        after the window opened)."""
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        inside = now < self.announced
        since = now - self.window_opened if inside else -1.0
        if self.kind == "a" and now < self.window_end:
            left = math.ceil(self.window_end - now)
            self.announced = max(self.announced, now + left)
            return 429, {"Retry-After": str(left)}, inside, since
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 200, {}, inside, since
        if self.kind == "a":
            self.window_opened, self.window_end = now, now + self.retry_after
            self.announced = max(self.announced, self.window_end)
            return 429, {"Retry-After": str(self.retry_after)}, inside, since
        return 429, {}, inside, since


async def serve(args: argparse.Namespace) -> dict[str, Any]:
    """Answer on every host's address until SIGTERM; returns the records."""
    from aiohttp import web  # noqa: PLC0415

    now = time.monotonic()
    buckets = [Bucket(k, args.rate, args.burst, args.retry_after, args.burst, now)
               for k in args.kinds]
    records: list[Record] = []
    robots = [0]

    def handler(i: int) -> Any:
        bucket = buckets[i]

        async def handle(request: web.Request) -> web.Response:
            if request.path == "/robots.txt":
                robots[0] += 1
                return web.Response(text="User-agent: *\nAllow: /\n")
            arrived = time.monotonic()
            bucket.inflight += 1
            try:
                status, headers, inside, since = bucket.answer(arrived)
                records.append((arrived, i, status, int(inside), round(since, 4)))
                if bucket.kind == "c":
                    await asyncio.sleep(args.latency_step * bucket.inflight)
            finally:
                bucket.inflight -= 1
            body = (f"<html><body>page {request.path}</body></html>" if status == 200
                    else "<html><body>slow down</body></html>")
            return web.Response(status=status, text=body, headers=headers,
                                content_type="text/html")
        return handle

    runners = []
    for i in range(len(buckets)):
        app = web.Application()
        app.router.add_get("/{tail:.*}", handler(i))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, address(i), args.port, backlog=1024).start()
        runners.append(runner)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for runner in runners:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner.cleanup(), 2)
    return {"records": records, "robots": robots[0]}


# -- one run: a fresh server, clients started, stopped after --duration ---------------------


@dataclass
class Run:
    label: str
    start: float = 0.0  # monotonic, when the clients were started
    records: list[Record] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    delays: dict[int, list[float]] = field(default_factory=dict)  # Scrapy's, per host


@dataclass
class Env:
    args: argparse.Namespace
    workdir: Path
    port: int
    urls: Path
    code: Path  # where crawlq's commands run from: the checkout, or --rev's archive
    hostnames: dict[str, int] = field(default_factory=dict)  # address -> host index

    def start_server(self, label: str) -> tuple[subprocess.Popen[bytes], Path]:
        a = self.args
        out = self.workdir / f"{label}-records.json"
        proc = spawn([sys.executable, __file__, "--serve", "--port", str(self.port),
                      "--kinds", a.kinds, "--rate", str(a.rate), "--burst", str(a.burst),
                      "--retry-after", str(a.retry_after),
                      "--latency-step", str(a.latency_step), "--out", str(out)],
                     log=self.workdir / f"{label}-server.log")
        wait_port(self.port, proc, "the bench's server")
        for i in range(len(a.kinds)):  # every address listens once the first does: check
            with socket.create_connection((address(i), self.port), 5):
                pass
        return proc, out

    def hold(self, run: Run, procs: list[subprocess.Popen[bytes]]) -> None:
        """Let the clients run until --duration after run.start (or until all exit)."""
        end = run.start + self.args.duration
        while time.monotonic() < end:
            if all(p.poll() is not None for p in procs):
                run.notes.append(f"every client exited early, after "
                                 f"{time.monotonic() - run.start:.1f} s")
                break
            time.sleep(0.2)


def finish_server(run: Run, proc: subprocess.Popen[bytes], out: Path) -> None:
    stop([proc], 10)
    if not out.exists():
        raise SystemExit(f"{run.label}: the server wrote no records (exit {proc.returncode})")
    data = json.loads(out.read_text())
    run.records = [(float(t), int(h), int(s), int(i), float(x))
                   for t, h, s, i, x in data["records"]]
    if data["robots"]:
        run.notes.append(f"robots.txt requests: {data['robots']} (left out of the figures)")


def crawlq_cmd(module: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", module, *argv]


def run_crawlq(env: Env) -> Run:
    a, run = env.args, Run("crawlq")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    child_env["PYTHONPATH"] = str(env.code)
    redis = RedisServer()
    server: subprocess.Popen[bytes] | None = None
    try:
        redis.start()
        crawl = f"pushback-{int(time.time())}"
        common = ["--redis-url", redis.url, "--crawl", crawl]
        policy = ["per_host_delay=0", f"per_host_concurrency={a.per_host_concurrency}",
                  "ignore_robots=true"]
        for what, argv in (
                ("crawl create", crawlq_cmd("console.cli", "crawl", "create", *common,
                                            *policy)),
                ("producer", crawlq_cmd("producer", *common, "--allow-private",
                                        "--progress", "off", str(env.urls)))):
            log = env.workdir / f"crawlq-{what.replace(' ', '-')}.log"
            with open(log, "wb") as fh:
                done = subprocess.run(argv, cwd=env.code, env=child_env, check=False,
                                      stdin=subprocess.DEVNULL, stdout=fh,
                                      stderr=subprocess.STDOUT)
            if done.returncode:
                raise SystemExit(f"crawlq {what} exited {done.returncode}:\n{tail(log)}")
        server, out = env.start_server("crawlq")
        consumers = []
        run.start = time.monotonic()
        for i in range(a.consumers):
            consumers.append(spawn(crawlq_cmd(
                "consumer", *common, "--allow-private", "--http-port", "-1",
                "--output", str(env.workdir / f"crawlq-out-{i}")),
                log=env.workdir / f"consumer-{i}.log", cwd=env.code, env=child_env))
        env.hold(run, consumers)
        stop(consumers, STOP_GRACE_S)
        for i, p in enumerate(consumers):
            log = env.workdir / f"consumer-{i}.log"
            # A text log line: time, level, logger, event, key=value ...
            events = Counter(f"{w[1]} {w[3]}" for line in log.read_text(errors="replace")
                             .splitlines() if len(w := line.split()) > 3
                             and w[1] in ("WARNING", "ERROR", "CRITICAL"))
            run.notes.append(f"consumer {i} exited {p.returncode}; log: " + (", ".join(
                f"{k} x{v}" for k, v in events.most_common()) or "no warnings"))
            if p.returncode not in (0, -signal.SIGTERM) or any(
                    k.startswith(("ERROR", "CRITICAL")) for k in events):
                run.notes.append(tail(log))
        shown = subprocess.run(crawlq_cmd("console.cli", "stats", *common), cwd=env.code,
                               env=child_env, capture_output=True, text=True, check=False)
        hosts = subprocess.run(crawlq_cmd("console.cli", "hosts", *common), cwd=env.code,
                               env=child_env, capture_output=True, text=True, check=False)
        for name, res in (("crawlq stats", shown), ("crawlq hosts", hosts)):
            text = (res.stdout or res.stderr).strip().splitlines()
            run.notes.append(f"{name} at the end:\n" + "\n".join(f"      {t}" for t in text[:24]))
        finish_server(run, server, out)
    finally:
        if server is not None:
            stop([server])
        redis.stop()
    return run


SPIDER = '''\
"""The Scrapy side of bench/pushback_bench.py: fetch the URLs, nothing else."""

import json
import sys
import time

from scrapy import Spider, signals
from scrapy.crawler import CrawlerProcess

URLS, PER_HOST, HOSTS, TARGET = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])


class PushbackSpider(Spider):
    name = "pushback"
    start_urls = open(URLS).read().split()

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.opened, signal=signals.spider_opened)
        return spider

    def opened(self, spider):
        from twisted.internet import task
        self._delays = task.LoopingCall(self.report)
        self._delays.start(5.0, now=False)

    def report(self):
        slots = self.crawler.engine.downloader.slots
        print(json.dumps({"t": time.monotonic(),
                          "delays": {k: s.delay for k, s in slots.items()}}), flush=True)

    def parse(self, response):
        return None

    def closed(self, reason):
        stats = self.crawler.stats.get_stats()
        keep = {k: v for k, v in stats.items()
                if k.startswith(("retry/", "downloader/response_status"))}
        print(json.dumps({"closed": reason, "stats": keep}, default=str), flush=True)


process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": PER_HOST * HOSTS,
    "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": True,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": TARGET,
    "RETRY_ENABLED": True,
    "RETRY_HTTP_CODES": [500, 502, 503, 504, 522, 524, 408, 429],
    "RETRY_GIVE_UP_LOG_LEVEL": "INFO",
    "ROBOTSTXT_OBEY": False,
    "HTTPCACHE_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "WARNING",
})
process.crawl(PushbackSpider)
process.start()
'''


def run_scrapy(env: Env, python: Path) -> Run:
    a, run = env.args, Run("scrapy")
    spider = env.workdir / "pushback_spider.py"
    spider.write_text(SPIDER)
    server, out = env.start_server("scrapy")
    try:
        log = env.workdir / "scrapy.log"
        run.start = time.monotonic()
        proc = spawn([str(python), str(spider), str(env.urls), str(a.per_host_concurrency),
                      str(len(a.kinds)), str(a.target_concurrency)], log=log,
                     cwd=env.workdir)
        env.hold(run, [proc])
        stop([proc], STOP_GRACE_S)
        closed = None
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if "delays" in item and item["t"] <= run.start + a.duration:
                    for slot, delay in item["delays"].items():
                        if slot in env.hostnames:
                            run.delays.setdefault(env.hostnames[slot], []).append(delay)
                elif "closed" in item:
                    closed = item
        run.notes.append(f"scrapy exited {proc.returncode}" + (
            f"; at close: {json.dumps(closed['stats'], sort_keys=True)}" if closed else ""))
        others = [line for line in log.read_text(errors="replace").splitlines()
                  if not line.startswith("{")]
        if others:
            run.notes.append(f"scrapy log: {len(others)} lines besides the bench's, the last:\n"
                             + "\n".join("      | " + line[:300] for line in others[-4:]))
        finish_server(run, server, out)
    finally:
        stop([server])
    return run


# -- figures ------------------------------------------------------------------------------------


@dataclass
class Figures:
    """One host's (or, with host None, every host's) figures over one run."""

    requests: int = 0  # the whole run
    after: int = 0  # requests after the settle
    ok: int = 0  # 2xx after the settle
    n429: int = 0  # after the settle
    inside_all: int = 0
    inside_after: int = 0
    late_all: int = 0  # inside, and later than IN_FLIGHT_S after the window opened
    windows: list[int] = field(default_factory=list)  # 2xx per window after the settle
    gap: float = 0.0  # the longest time without a request after the settle

    def rate(self, span: float, r: float) -> float:
        return self.ok / span / r if span and r else 0.0

    def offered(self, span: float, r: float) -> float:
        return self.after / span / r if span and r else 0.0

    @property
    def share429(self) -> float:
        return self.n429 / self.after if self.after else 0.0

    @property
    def cov(self) -> float:
        if len(self.windows) < 2:
            return float("nan")
        mean = statistics.fmean(self.windows)
        return statistics.pstdev(self.windows) / mean if mean else float("inf")

    def window_range(self, window: float, r: float) -> tuple[float, float]:
        if not self.windows:
            return 0.0, 0.0
        return min(self.windows) / window / r, max(self.windows) / window / r


def figures(run: Run, args: argparse.Namespace) -> tuple[list[Figures], Figures]:
    hosts = len(args.kinds)
    per = [Figures() for _ in range(hosts)]
    total = Figures()
    settle_at, end = run.start + args.settle, run.start + args.duration
    n_windows = int((args.duration - args.settle) // args.window)
    for f in [*per, total]:
        f.windows = [0] * n_windows
    last: list[float] = [settle_at] * hosts
    for t, host, status, inside, since in sorted(run.records):
        if t > end or t < run.start:
            continue
        for f in (per[host], total):
            f.requests += 1
            if inside:
                f.inside_all += 1
                f.late_all += since > IN_FLIGHT_S
        if t < settle_at:
            continue
        per[host].gap = max(per[host].gap, t - last[host])
        last[host] = t
        k = int((t - settle_at) // args.window)
        for f in (per[host], total):
            f.after += 1
            f.inside_after += inside
            if 200 <= status < 300:
                f.ok += 1
                if k < n_windows:
                    f.windows[k] += 1
            elif status == 429:
                f.n429 += 1
    for h in range(hosts):
        per[h].gap = max(per[h].gap, end - last[h])
    total.gap = max(f.gap for f in per)
    return per, total


# -- reporting ----------------------------------------------------------------------------------


def table(heads: list[str], rows: list[list[list[str]]]) -> list[str]:
    """Lines of a table whose cells hold one value per run: the values of a column are
    right-aligned and joined with " | ", the first two columns (host, kind) left-aligned."""
    subs = [max(len(v) for row in rows for v in row[c]) for c in range(len(heads))]
    cells = [[row[c][0] if c < 2 else " | ".join(v.rjust(subs[c]) for v in row[c])
              for c in range(len(heads))] for row in rows]
    widths = [max(len(heads[c]), *(len(r[c]) for r in cells)) for c in range(len(heads))]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(widths[c]) if c < 2 else v.rjust(widths[c])
                         for c, v in enumerate(values)).rstrip()
    return [line(heads), *(line(r) for r in cells)]


def fmt_cov(c: float) -> str:
    return "n/a" if math.isnan(c) else ("inf" if math.isinf(c) else f"{c:.2f}")


def report(runs: list[Run], env: Env) -> bool:
    a = env.args
    span = a.duration - a.settle
    names = [r.label for r in runs]
    figs = [figures(r, a) for r in runs]
    print(f"\nafter the first {a.settle:.0f} s of each {a.duration:.0f} s run "
          f"({span:.0f} s, {a.window:.0f} s windows); each cell: {' | '.join(names)}")
    r_all = a.rate * len(a.kinds)

    def row(name: str, kind: str, fs: list[Figures], r: float, announces: bool) -> list[
            list[str]]:
        return [[name], [kind], [f"{f.rate(span, r):.2f}" for f in fs],
                [f"{f.offered(span, r):.1f}" for f in fs],
                [f"{100 * f.share429:.1f}%" for f in fs],
                [f"{f.inside_all}/{f.inside_after} ({f.late_all})" if announces else "-"
                 for f in fs],
                [fmt_cov(f.cov) for f in fs],
                [f"{lo:.2f}-{hi:.2f}" for lo, hi in (f.window_range(a.window, r) for f in fs)],
                [f"{f.gap:.1f}" for f in fs], [str(f.requests) for f in fs]]

    rows = [row(f"{address(h)}:{env.port}", f"{kind}: {KIND_LABELS[kind]}",
                [per[h] for per, _ in figs], a.rate, kind == "a")
            for h, kind in enumerate(a.kinds)]
    rows.append(row("all hosts", f"R x {len(a.kinds)}", [total for _, total in figs], r_all,
                    "a" in a.kinds))
    heads = ["host", "kind", "2xx/R", "req/R", "429 share", "in RA window all/after (late)",
             "CoV", "min-max window/R", "gap s", "requests"]
    print("\n".join(table(heads, rows)))
    scrapy = next((r for r in runs if r.label == "scrapy"), None)
    if scrapy is not None and scrapy.delays:
        print("scrapy's AutoThrottle delay per host, median / last (s): " + ", ".join(
            f"{address(h)} {statistics.median(d):.3f}/{d[-1]:.3f}"
            for h, d in sorted(scrapy.delays.items())))
    for r in runs:
        for note in r.notes:
            print(f"  {r.label}: {note}")

    if "crawlq" not in names:
        return True
    per, total = figs[names.index("crawlq")]
    worst_rate = min(range(len(per)), key=lambda h: per[h].rate(span, a.rate))
    worst_429 = max(range(len(per)), key=lambda h: per[h].share429)
    covs = [f.cov for f in per if not math.isnan(f.cov)]
    checks: list[tuple[str, str, bool | None]] = [
        (f"2xx >= {TARGET_RATE} R on every host",
         f"worst {per[worst_rate].rate(span, a.rate):.2f} ({address(worst_rate)}, kind "
         f"{a.kinds[worst_rate]}); all hosts {total.rate(span, r_all):.2f}",
         all(f.rate(span, a.rate) >= TARGET_RATE for f in per)),
        (f"429s <= {100 * TARGET_429:.0f}% on every host",
         f"worst {100 * per[worst_429].share429:.1f}% ({address(worst_429)}, kind "
         f"{a.kinds[worst_429]}); all hosts {100 * total.share429:.1f}%",
         all(f.share429 <= TARGET_429 for f in per)),
        ("0 requests inside a Retry-After window",
         f"whole run {total.inside_all} ({total.late_all} late), after the settle "
         f"{total.inside_after}", total.inside_all == 0 if "a" in a.kinds else None),
        (f"steady ({a.window:.0f} s windows' 2xx CoV)",
         f"all hosts {fmt_cov(total.cov)}, worst host "
         f"{fmt_cov(max(covs)) if covs else 'n/a'} (stated, no threshold)", None),
    ]
    if scrapy is not None:
        s_total = figs[names.index("scrapy")][1]
        checks.append(("ahead of Scrapy (all hosts' 2xx/R)",
                       f"crawlq {total.rate(span, r_all):.2f}, scrapy "
                       f"{s_total.rate(span, r_all):.2f}",
                       total.rate(span, r_all) > s_total.rate(span, r_all)))
    print("\ntargets (crawlq):")
    missed = 0
    for what, figure, good in checks:
        verdict = "" if good is None else ("OK" if good else "MISSED")
        missed += good is False
        print(f"  {what:<42} {figure:<64} {verdict}")
    return missed == 0


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="--quick: a smoke run of about a minute, Scrapy included: 25 s runs, a "
        "10 s settle, 5 s windows, hosts 'ab', 5000 seeds per host (any flag given "
        "overrides it). Full defaults: 150 s, 60 s, 10 s, 'aabbcc', 20000.")
    p.add_argument("--quick", action="store_true", help="a short smoke run (see below)")
    p.add_argument("--duration", type=float, default=None, help="seconds per run (150)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds at the start of a run left out of the figures (60)")
    p.add_argument("--window", type=float, default=None,
                   help="window of the oscillation figures, seconds (10)")
    p.add_argument("--kinds", default=None,
                   help="one letter per host, a/b/c (see the docstring; default aabbcc)")
    p.add_argument("--seeds", type=int, default=None, help="URLs per host (20000)")
    p.add_argument("--rate", type=float, default=5.0, help="R: requests/s each host allows")
    p.add_argument("--burst", type=float, default=None,
                   help="token bucket depth (default R: one second's worth)")
    p.add_argument("--retry-after", type=int, default=2,
                   help="the Retry-After of kind a hosts, whole seconds")
    p.add_argument("--latency-step", type=float, default=0.02,
                   help="kind c: seconds of latency per request in flight")
    p.add_argument("--per-host-concurrency", type=int, default=4,
                   help="crawlq's policy per_host_concurrency, Scrapy's "
                   "CONCURRENT_REQUESTS_PER_DOMAIN")
    p.add_argument("--consumers", type=int, default=3, help="crawlq-consumer processes")
    p.add_argument("--target-concurrency", type=float, default=1.0,
                   help="Scrapy's AUTOTHROTTLE_TARGET_CONCURRENCY")
    p.add_argument("--rev", default=None,
                   help="run crawlq's commands from `git archive REV` of this checkout "
                   "(default: the work tree as it is)")
    p.add_argument("--skip-scrapy", action="store_true", help="skip the Scrapy run")
    p.add_argument("--skip-crawlq", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--keep", type=Path, default=None,
                   help="copy the logs and the server's records into this directory")
    add_server_args(p)
    args = parse_with_profile(p, argv, QUICK, FULL)
    if args.burst is None:
        args.burst = args.rate
    if not args.kinds or set(args.kinds) - set(KIND_LABELS) or len(args.kinds) > 250:
        p.error("--kinds: 1 to 250 letters out of a, b, c")
    if args.settle + args.window > args.duration:
        p.error("--duration must leave at least one --window after --settle")
    return args


def write_urls(path: Path, port: int, hosts: int, seeds: int) -> None:
    with open(path, "w") as fh:
        for n in range(seeds):
            fh.writelines(f"http://{address(h)}:{port}/p/{n}\n" for h in range(hosts))


def code_root(rev: str | None, workdir: Path) -> Path:
    if rev is None:
        return ROOT
    dest = workdir / "code"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def describe_code(code: Path, rev: str | None) -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev or "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    if rev is not None:
        return f"git archive {rev} ({head})"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                            "common", "consumer", "producer", "console"],
                           capture_output=True, text=True, check=False).stdout.split("\n")
    changed = [line[3:] for line in dirty if line.strip()]
    return f"the work tree at {head}" + (
        f" with {len(changed)} changed file(s): {', '.join(changed)}" if changed else "")


def bench(args: argparse.Namespace, workdir: Path) -> int:
    python = None
    if not args.skip_scrapy:
        from site_bench import scrapy_python  # noqa: PLC0415 - the same venv as site_bench

        python = scrapy_python(False)
    port = free_port()
    urls = workdir / "urls.txt"
    write_urls(urls, port, len(args.kinds), args.seeds)
    env = Env(args, workdir, port, urls, code_root(args.rev, workdir),
              {address(h): h for h in range(len(args.kinds))})
    print(f"pushback bench: {len(args.kinds)} hosts {address(0)}..{address(len(args.kinds) - 1)}"
          f":{port} ({args.kinds}), R {args.rate:g}/s, burst {args.burst:g}, Retry-After "
          f"{args.retry_after} s, latency step {1000 * args.latency_step:.0f} ms, "
          f"{args.seeds} URLs per host; runs of {args.duration:.0f} s, settle "
          f"{args.settle:.0f} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"crawlq: {args.consumers} consumers, policy per_host_delay=0 per_host_concurrency="
          f"{args.per_host_concurrency} ignore_robots=true, from "
          f"{describe_code(env.code, args.rev)}")
    if python is not None:
        print(f"scrapy: AutoThrottle (target concurrency {args.target_concurrency:g}), "
              f"CONCURRENT_REQUESTS_PER_DOMAIN {args.per_host_concurrency}, DOWNLOAD_DELAY 0, "
              f"429 retried; one address per host, so Scrapy's per-hostname download slot "
              f"is per host (no meta['download_slot'] needed)", flush=True)
    runs = []
    if not args.skip_crawlq:
        print(f"running crawlq for {args.duration:.0f} s ...", flush=True)
        runs.append(run_crawlq(env))
    if python is not None:
        print(f"running scrapy for {args.duration:.0f} s ...", flush=True)
        runs.append(run_scrapy(env, python))
    if not runs:
        return 0
    good = report(runs, env)
    return 0 if good else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        with contextlib.suppress(PermissionError):  # the instrument first; needs root
            os.nice(-10)
        try:
            import uvloop  # noqa: PLC0415
        except ImportError:
            seen = asyncio.run(serve(args))
        else:
            seen = uvloop.run(serve(args))
        Path(args.out).write_text(json.dumps(seen))
        return 0
    def keep(workdir: Path) -> None:
        if args.keep is not None:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("code", "crawlq-out-*"))
    return run_in_workdir("crawlq-pushback-bench-", lambda workdir: bench(args, workdir),
                          stop_all, keep)


if __name__ == "__main__":
    sys.exit(main())
