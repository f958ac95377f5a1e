"""A polite crawl of many hosts, against the bound politeness sets (a benchmark, not a test).

    python bench/frontier_bench.py [--hosts 1000] [--pages 20] [--delay 1] [--latency 0.1]
                                   [--wide-hosts 5000] [--wide-pages 5] [--redis-server PATH]
                                   [--discovery | --no-discovery] [--fanout 3] [--cross-links 2]

One local server answers on H loopback addresses (127.0.x.y, one port: each its own host
to a crawler), sleeps ``--latency`` before every answer (robots.txt included) and records
when every request arrived, per host: the kernel's receive time of its bytes
(``bench/wire_server.py``), so a busy server loop does not read as an impolite crawler.
For each run the bench enqueues H x P URLs (sorted by host, as sitemaps and most seed
lists are, or interleaved across hosts), starts 1 or 2
``crawlq-consumer`` processes (``--per-host-delay``, ``--per-host-concurrency 2``,
``--concurrency 128``, robots.txt on) and waits for them to finish.

The discovery run (in the default set; ``--discovery`` runs only it, ``--no-discovery``
skips it) enqueues only each host's root page, ``/p/0``, and 2 consumers find the rest
with ``--handler consumer.handlers:links``. Page i of a host links to pages
``i*k+1 .. i*k+k`` of its host (``--fanout`` k: a tree, every page reachable from the root
in ``log_k(P)`` levels, the bench's ``--max-depth``) and to ``--cross-links`` pages of
other hosts, each that host's root or one of its leaves. A seed per host, not one seed in
all: hosts found through links would start one discovery chain (fetch, flush, lease) late
each, so the span would hold that chain too, which the politeness bound does not count.
Cross links go to roots and leaves only, so a page first found through one never has
children that it would hand a depth past the tree's: every page is found within
``--max-depth`` and the crawl must still end with H x P pages done. The hosts are IP
addresses, which ``--allow-domains`` matches exactly (``canonical_domain`` keeps an IP as
it is; no suffix of one names them all), so the consumers get every host's address in
``CRAWLQ_ALLOW_DOMAINS``, and a cross link is in scope. The bound is the same: after the
root, each page fetched reveals k >= 1 more, so a host never runs dry as long as a page's
links are enqueued within one delay of its fetch.

Each run prints:

- the span (first request start to last answer) against the politeness bound: every host
  gets robots.txt and P pages, one request per ``--delay``: ``P x delay + latency``, as a
  ratio bound / span (1.0 = as fast as politeness allows);
- politeness violations the server saw: two requests to one host closer than the delay
  minus 50 ms of jitter, robots.txt included;
- Redis CPU per page (INFO cpu) and Redis commands per page (INFO commandstats, which
  counts the commands scripts run);
- the consumers' CPU per page (user + system, from getrusage of the exited processes);
  no target, for comparing runs.

``--runs`` picks runs by name (comma-separated; default all): ``sorted1``, ``sorted2``,
``interleaved1``, ``interleaved2`` (the plain runs, 1 or 2 consumers), ``wide`` (the wide
run and its bare loop), ``unpolite`` (the sorted 2-consumer run without politeness,
printed beside ``sorted2``'s Redis and consumer CPU per page when both run) and
``discovery``; ``--discovery`` and ``--no-discovery`` are shorthands.

``FRONTIER_BENCH_SHOW=1`` prints the first violations; ``FRONTIER_BENCH_COMMANDS=1`` the
commands that took most Redis time per page (INFO commandstats) and each script's time and
calls per page (SLOWLOG at threshold 0, which logs every top-level call with its time).

The wide run (H=5000, P=5, most time spent discovering hosts) is bound by the slots as
much as by politeness: its bound is the larger of ``P x delay + latency`` and every
request's latency over the 2 x 128 slots (Little's law), and beside it a bare aiohttp
loop does the same polite work with as many slots and no queue (``bare_loop``): crawlq
is measured against that. Last, the sorted run with 2 consumers is crawled again without
politeness (delay 0, no per-host limit), and the consumers' CPU per page of the two is
compared.

Targets (H=1000, P=20, delay 1 s, latency 100 ms): >= 0.95 of the bound in both orders,
0 violations, <= 30 us of Redis CPU and <= 20 Redis commands per page; the wide run:
>= 0.9 of the bare loop's speed; the discovery run (H=1000, P=20, 2 consumers): the same
targets as the first four; a polite page's consumer CPU <= 1.2x a page's without
politeness. Exits 1 if one is missed. The default set (eight runs) takes about 3.5
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import random
import re
import resource
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

import aiohttp
import redis.asyncio as aioredis
import uvloop
from wire_server import WireServer

from common.queue import CrawlQueue, NewTask
from common.redis import scripts
from common.redis.server import RedisServer
from common.urls.canonical import fingerprint

ROOT = Path(__file__).resolve().parents[1]
JITTER_S = 0.05
TARGET_RATIO = 0.95
TARGET_WIDE_RATIO = 0.9
TARGET_CPU_US = 30.0
TARGET_COMMANDS = 20.0
#: A polite page may cost the consumers at most this much more CPU than one without
#: politeness (the same pages, delay 0 and no per-host limit).
TARGET_POLITE_CPU = 1.2
PER_HOST = 2  # --per-host-concurrency
CONCURRENCY = 128  # each consumer's --concurrency
HANDLER = "consumer.handlers:links"


def address(i: int) -> str:
    """Loopback address number i (0-based): 127.0.0.1, 127.0.0.2, ... 127.0.1.1, ..."""
    return f"127.{i // 62_500 % 250}.{i // 250 % 250}.{i % 250 + 1}"


@dataclass(frozen=True)
class Site:
    """The pages every host serves: P of them, linked as a tree of fan-out k (0 = pages
    without links, the plain runs), each page also linking to `cross` other hosts."""

    hosts: int
    pages: int
    fanout: int = 0
    cross: int = 0

    def depth(self, page: int) -> int:
        """The tree level of a page (the root is 0)."""
        level = 0
        while page:
            page, level = (page - 1) // self.fanout, level + 1
        return level

    @property
    def max_depth(self) -> int:
        """The consumers' --max-depth: the deepest page of the tree."""
        return self.depth(self.pages - 1)

    def links(self, host: int, page: int, port: int) -> list[str]:
        """The URLs page `page` of host `host` links to: its children in the tree, then
        `cross` pages of other hosts, each its root or a leaf (the same every time)."""
        k, pages = self.fanout, self.pages
        urls = [f"/p/{c}" for c in range(page * k + 1, min(page * k + k, pages - 1) + 1)]
        first_leaf = -(-(pages - 1) // k)  # the first page with no children
        rnd = random.Random(host * pages + page)
        for _ in range(self.cross if self.hosts > 1 else 0):
            other = (host + rnd.randrange(1, self.hosts)) % self.hosts
            target = 0 if rnd.random() < 0.5 else rnd.randrange(first_leaf, pages)
            urls.append(f"http://{address(other)}:{port}/p/{target}")
        return urls

    def html(self, host: int, page: int, port: int) -> str:
        if not self.fanout:
            return "<html><body>page</body></html>"
        anchors = "".join(f'<a href="{u}">{u}</a>\n' for u in self.links(host, page, port))
        return f"<html><body><h1>page {page}</h1>\n{anchors}</body></html>"


# -- the server (a child process) ---------------------------------------------------------


async def serve(site: Site, latency: float) -> dict[str, list[list[Any]]]:
    """Answer on `site.hosts` loopback addresses until SIGTERM; returns every request's
    arrival time (the kernel's, see wire_server) and path, per host."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    seen: dict[str, list[list[Any]]] = defaultdict(list)
    number = {address(i): i for i in range(site.hosts)}

    def answer(host: str, path: str) -> tuple[int, str, bytes]:
        if path == "/robots.txt":
            return 200, "text/plain", b"User-agent: *\nAllow: /\n"
        name, _, port = host.partition(":")
        page = path.removeprefix("/p/")
        if name not in number or not page.isdigit() or int(page) >= site.pages:
            return 404, "text/plain", b"not found"
        body = site.html(number[name], int(page), int(port or 80))
        return 200, "text/html; charset=utf-8", body.encode()

    server = WireServer(answer, latency, lambda host, path, at: seen[host].append([at, path]))
    print(server.listen(address(i) for i in range(site.hosts)), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    if server.untimed:
        print(f"server: {server.untimed} reads without a kernel timestamp", file=sys.stderr)
    return dict(seen)


# -- one run -------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    bound_s: float
    span_s: float
    violations: int
    requests: int
    pages: int
    cpu_us: float
    commands: float
    closest_s: float = 0.0  # the closest two requests to one host came
    consumer_cpu_us: float = 0.0  # the consumers' CPU (user + system) per page

    @property
    def ratio(self) -> float:
        return self.bound_s / self.span_s


async def redis_counters(client: aioredis.Redis) -> tuple[float, int]:
    cpu = await client.info("cpu")
    stats = await client.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values())
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


async def command_costs(client: aioredis.Redis, pages: int) -> str:
    """The commands that took most Redis time, per page: time (us) and calls. A script's
    time includes the commands it ran, which are listed too."""
    stats = await client.info("commandstats")
    top = sorted(stats.items(), key=lambda kv: -float(kv[1]["usec"]))[:12]
    return "  ".join(f"{name.removeprefix('cmdstat_')} {float(v['usec']) / pages:.1f}us "
                     f"{int(v['calls']) / pages:.2f}x" for name, v in top)


async def script_costs(client: aioredis.Redis, pages: int) -> str:
    """Each script's time (us, its commands included) and calls per page, from SLOWLOG."""
    names = {hashlib.sha1(scripts.source(f.stem).encode()).hexdigest(): f.stem
             for f in scripts.LUA.glob("*.lua")}
    await client.config_set("slowlog-log-slower-than", 10_000)
    usec: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for entry in await client.slowlog_get(1_000_000):
        command = entry["command"]
        words = (command.decode("latin-1") if isinstance(command, bytes) else command).split()[:2]
        if len(words) == 2 and words[0].upper() == "EVALSHA":
            name = names.get(words[1], words[1][:8])
            usec[name] += entry["duration"]
            calls[name] += 1
    top = sorted(usec, key=lambda n: -usec[n])
    return "  ".join(f"{n} {usec[n] / pages:.1f}us {calls[n] / pages:.2f}x" for n in top)


def seeds(site: Site, port: int, *, interleaved: bool) -> list[str]:
    """The URLs enqueued up front: every page, or each host's root when the site links."""
    hosts, pages = range(site.hosts), range(1 if site.fanout else site.pages)
    if interleaved:
        return [f"http://{address(h)}:{port}/p/{i}" for i in pages for h in hosts]
    return [f"http://{address(h)}:{port}/p/{i}" for h in hosts for i in pages]


def discovery_options(site: Site) -> tuple[list[str], dict[str, str]]:
    """The consumers' extra flags and environment for a site that links, else none."""
    if not site.fanout:
        return [], {}
    every_host = ",".join(address(h) for h in range(site.hosts))
    return (["--handler", HANDLER, "--max-depth", str(site.max_depth)],
            {"CRAWLQ_ALLOW_DOMAINS": every_host})


async def crawl(server: RedisServer, port: int, *, site: Site, delay: float,
                latency: float, interleaved: bool, consumers: int, label: str,
                work: Path, per_host: int = PER_HOST) -> Result:
    crawl_name = "fb-" + re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")
    urls = seeds(site, port, interleaved=interleaved)
    client = aioredis.Redis.from_url(server.url)
    q = await CrawlQueue.open(client, crawl_name)
    for lo in range(0, len(urls), 2_000):
        await q.enqueue([NewTask(u, fingerprint(u)) for u in urls[lo:lo + 2_000]])
    await client.config_resetstat()
    profiling = bool(os.environ.get("FRONTIER_BENCH_COMMANDS"))
    if profiling:
        await client.config_set("slowlog-max-len", 1_000_000)
        await client.config_set("slowlog-log-slower-than", 0)
        await client.slowlog_reset()
    cpu0, calls0 = await redis_counters(client)
    flags, extra_env = discovery_options(site)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CRAWLQ_LOG_LEVEL": "WARNING", **extra_env}
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer", "--redis-url", server.url, "--crawl", crawl_name,
        "--per-host-delay", f"{delay}", "--per-host-concurrency", str(per_host),
        "--concurrency", str(CONCURRENCY),
        "--allow-private", "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1",
        "--output", str(work / f"{crawl_name}-{i}"), "--lease", "30s", *flags,
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL) for i in range(consumers)]
    for proc in procs:
        assert await proc.wait() == 0, f"{label}: a consumer exited {proc.returncode}"
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the site is still running
    cpu1, calls1 = await redis_counters(client)
    if profiling:
        print(f"  {label}: {await command_costs(client, site.hosts * site.pages)}")
        print(f"  {label}, scripts: {await script_costs(client, site.hosts * site.pages)}")
    stats = await q.stats()
    await client.aclose()
    n = site.hosts * site.pages
    # a crawl's soft-404 probes (one a host, outcome "probe") are its own requests, no page
    probes = int(stats.counters.get("outcome:probe", 0))
    assert stats.done == n + probes, f"{label}: {n} pages, {stats}"
    consumer_s = (children1.ru_utime + children1.ru_stime
                  - children0.ru_utime - children0.ru_stime)
    return Result(label, site.pages * delay + latency, 0.0, 0, 0, n,
                  (cpu1 - cpu0) * 1e6 / n, (calls1 - calls0) / n,
                  consumer_cpu_us=consumer_s * 1e6 / n)


def judge(result: Result, seen: dict[str, list[list[Any]]], delay: float,
          latency: float) -> Result:
    """Fill the span and violations in from what the server saw."""
    starts = [t for reqs in seen.values() for t, _ in reqs]
    result.requests = len(starts)
    result.span_s = max(starts) + latency - min(starts)
    shown = 0
    result.closest_s = delay
    for host, reqs in seen.items():
        ordered = sorted(reqs)
        for (a, pa), (b, pb) in itertools.pairwise(ordered):
            result.closest_s = min(result.closest_s, b - a)
            if b - a < delay - JITTER_S:
                result.violations += 1
                if shown < 3 and os.environ.get("FRONTIER_BENCH_SHOW"):
                    shown += 1
                    print(f"  violation at {host}: {pa} then {pb} {b - a:.3f}s apart")
    return result


async def one_run(args: argparse.Namespace, server: RedisServer, work: Path, *, site: Site,
                  interleaved: bool, consumers: int, polite: bool = True,
                  bare: bool = False) -> Result:
    """One crawl of `site` by `consumers` consumers (delay 0 and no per-host limit unless
    `polite`), or by the bare loop with as many slots, against a fresh server."""
    out = work / "seen.json"
    server_proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", str(site.hosts), "--pages", str(site.pages),
        "--fanout", str(site.fanout), "--cross-links", str(site.cross),
        "--latency", str(args.latency), "--out", str(out),
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert server_proc.stdout is not None
        port = int(await asyncio.wait_for(server_proc.stdout.readline(), 120))
        order = "interleaved" if interleaved else "sorted by host"
        if site.fanout:
            order = f"discovery k={site.fanout} depth {site.max_depth}"
        label = f"H={site.hosts} P={site.pages}, {order}, {consumers} consumer(s)"
        if bare:
            result = await bare_loop(port, site, delay=args.delay, latency=args.latency,
                                     slots=consumers * CONCURRENCY,
                                     label=f"H={site.hosts} P={site.pages}, bare aiohttp loop, "
                                           f"{consumers * CONCURRENCY} slots")
        else:
            result = await crawl(server, port, site=site,
                                 delay=args.delay if polite else 0.0, latency=args.latency,
                                 interleaved=interleaved, consumers=consumers,
                                 label=label if polite else f"{label}, no politeness",
                                 work=work, per_host=PER_HOST if polite else 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            server_proc.send_signal(signal.SIGTERM)
        await server_proc.wait()
    return judge(result, json.loads(out.read_text()), args.delay, args.latency)


async def bare_loop(port: int, site: Site, *, delay: float, latency: float, slots: int,
                    label: str) -> Result:
    """The same polite work with no queue: one aiohttp session of `slots` connections,
    each host's robots.txt then its pages, one request per `delay` (a host's requests
    one after another, so never more than PER_HOST at once). What the machine and the
    site allow at this concurrency: the wide run's reference."""
    connector = aiohttp.TCPConnector(limit=slots, limit_per_host=PER_HOST)
    timeout = aiohttp.ClientTimeout(total=120)
    slot = asyncio.Semaphore(slots)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def host(h: int) -> None:
            last = -delay
            for path in ["/robots.txt", *(f"/p/{i}" for i in range(site.pages))]:
                await asyncio.sleep(max(0.0, last + delay - time.monotonic()))
                async with slot:
                    last = time.monotonic()
                    async with session.get(f"http://{address(h)}:{port}{path}") as resp:
                        await resp.read()
        await asyncio.gather(*(host(h) for h in range(site.hosts)))
    return Result(label, wide_bound(site, delay, latency, slots), 0.0, 0, 0,
                  site.hosts * site.pages, 0.0, 0.0)


def wide_bound(site: Site, delay: float, latency: float, slots: int) -> float:
    """The least span politeness and the slots allow: P x delay + latency, or, when the
    slots are the limit (Little's law), every request's latency over the slots."""
    requests = site.hosts * (site.pages + 1)
    return max(site.pages * delay + latency, requests * latency / slots)


def reference(r: Result) -> None:
    """A run other runs are measured against: what it took, no targets."""
    print(f"{r.label:<46} span {r.span_s:5.1f}s  requests {r.requests:,}  Redis "
          f"{r.cpu_us:5.1f} us/page, {r.commands:4.1f} commands/page  consumers "
          f"{r.consumer_cpu_us:4.0f} us/page  (reference)", flush=True)


def report(r: Result, target: float) -> bool:
    ok = (r.ratio >= target and r.violations == 0 and r.cpu_us <= TARGET_CPU_US
          and r.commands <= TARGET_COMMANDS)
    print(f"{r.label:<46} bound {r.bound_s:5.1f}s span {r.span_s:5.1f}s "
          f"ratio {r.ratio:4.2f} (>= {target:.2f})  violations {r.violations} "
          f"(closest {r.closest_s:.3f}s)  "
          f"requests {r.requests:,}  Redis {r.cpu_us:5.1f} us/page (<= {TARGET_CPU_US:g}), "
          f"{r.commands:4.1f} commands/page (<= {TARGET_COMMANDS:g})  "
          f"consumers {r.consumer_cpu_us:4.0f} us/page  "
          f"{'OK' if ok else 'MISSED'}", flush=True)
    return ok


async def run(args: argparse.Namespace) -> int:
    missed = 0
    runs = selected_runs(args)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(binary=args.redis_server) as server:
        work = Path(tmp)
        version = ".".join(map(str, server.version()))
        print(f"frontier bench: redis-server {version} ({server.binary}), {os.cpu_count()} "
              f"CPUs, delay {args.delay}s, latency {args.latency}s, --per-host-concurrency 2,"
              f" --concurrency 128, load average {os.getloadavg()[0]:.2f}", flush=True)
        plain = Site(args.hosts, args.pages)
        polite: Result | None = None  # the sorted 2-consumer run's
        for interleaved in (False, True):
            for consumers in (1, 2):
                if f"{'interleaved' if interleaved else 'sorted'}{consumers}" not in runs:
                    continue
                r = await one_run(args, server, work, site=plain,
                                  interleaved=interleaved, consumers=consumers)
                missed += not report(r, TARGET_RATIO)
                if consumers == 2 and not interleaved:
                    polite = r
        if args.wide_hosts and "wide" in runs:
            wide = Site(args.wide_hosts, args.wide_pages)
            r = await one_run(args, server, work, site=wide, interleaved=False, consumers=2)
            r.bound_s = wide_bound(wide, args.delay, args.latency, 2 * CONCURRENCY)
            bare = await one_run(args, server, work, site=wide, interleaved=False,
                                 consumers=2, bare=True)
            reference(bare)
            missed += not report(r, TARGET_WIDE_RATIO * bare.ratio)
            print(f"  wide run: crawlq {r.span_s:.1f}s, the bare loop {bare.span_s:.1f}s: "
                  f"{bare.span_s / r.span_s:.2f} of the bare loop (>= {TARGET_WIDE_RATIO})",
                  flush=True)
        if "unpolite" in runs:
            off = await one_run(args, server, work, site=plain, interleaved=False,
                                consumers=2, polite=False)
            reference(off)
            if polite is not None:
                ratio = polite.consumer_cpu_us / max(off.consumer_cpu_us, 1e-9)
                missed += ratio > TARGET_POLITE_CPU
                print(f"  consumers' CPU a polite page: {polite.consumer_cpu_us:.0f} us, "
                      f"without politeness {off.consumer_cpu_us:.0f} us: {ratio:.2f}x "
                      f"(<= {TARGET_POLITE_CPU}); Redis CPU a polite page: "
                      f"{polite.cpu_us:.0f} us, without {off.cpu_us:.0f} us: "
                      f"{polite.cpu_us / max(off.cpu_us, 1e-9):.2f}x", flush=True)
        if "discovery" in runs:
            linked = Site(args.hosts, args.pages, args.fanout, args.cross_links)
            r = await one_run(args, server, work, site=linked, interleaved=False, consumers=2)
            missed += not report(r, TARGET_RATIO)
    print("all targets met" if not missed else f"{missed} run(s) missed a target")
    return 1 if missed else 0


RUNS = ("sorted1", "sorted2", "interleaved1", "interleaved2", "wide", "unpolite",
        "discovery")


def selected_runs(args: argparse.Namespace) -> set[str]:
    """The runs to make: --runs, else all, narrowed by --discovery / --no-discovery."""
    runs = set(args.runs.split(",")) if args.runs else set(RUNS)
    if args.discovery:
        return {"discovery"}
    if args.discovery is False:
        runs.discard("discovery")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--latency", type=float, default=0.1)
    p.add_argument("--wide-hosts", type=int, default=5000, help="0 skips the wide run")
    p.add_argument("--wide-pages", type=int, default=5)
    p.add_argument("--discovery", action=argparse.BooleanOptionalAction, default=None,
                   help="run only the discovery run (--no-discovery: all runs but it)")
    p.add_argument("--runs", default="",
                   help=f"comma-separated runs to make (default all): {','.join(RUNS)}")
    p.add_argument("--fanout", type=int, default=3,
                   help="discovery: each page links to this many pages of its host")
    p.add_argument("--cross-links", type=int, default=2,
                   help="discovery: each page links to this many pages of other hosts")
    p.add_argument("--redis-server", default=None, help="redis-server binary (default: PATH)")
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(filter(None, args.runs.split(","))) - set(RUNS)
    if unknown:
        p.error(f"--runs: unknown run(s) {', '.join(sorted(unknown))}; choose from "
                f"{', '.join(RUNS)}")
    if args.fanout < 1 and not args.serve:
        p.error("--fanout must be at least 1: the tree is how the consumers find pages")
    if args.serve:
        # The server is the instrument: on a shared machine its own scheduling delays
        # would read as requests arriving closer together than they were sent.
        with contextlib.suppress(PermissionError):  # raising priority needs root
            os.nice(-10)
        site = Site(args.serve, args.pages, args.fanout, args.cross_links)
        args.out.write_text(json.dumps(uvloop.run(serve(site, args.latency))))
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
