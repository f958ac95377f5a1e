"""A polite crawl of many hosts, against the bound politeness sets (a benchmark, not a test).

    python bench/frontier_bench.py [--hosts 1000] [--pages 20] [--delay 1] [--latency 0.1]
                                   [--wide-hosts 5000] [--wide-pages 5] [--redis-server PATH]

One local server answers on H loopback addresses (127.0.x.y, one port: each its own host
to a crawler), sleeps ``--latency`` before every answer (robots.txt included) and records
when every request started, per host. For each run the bench enqueues H x P URLs (sorted
by host, as sitemaps and most seed lists are, or interleaved across hosts), starts 1 or 2
``crawlq-consumer`` processes (``--per-host-delay``, ``--per-host-concurrency 2``,
``--concurrency 128``, robots.txt on) and waits for them to finish. It prints:

- the span (first request start to last answer) against the politeness bound: every host
  gets robots.txt and P pages, one request per ``--delay``: ``P x delay + latency``, as a
  ratio bound / span (1.0 = as fast as politeness allows);
- politeness violations the server saw: two requests to one host closer than the delay
  minus 50 ms of jitter, robots.txt included;
- Redis CPU per page (INFO cpu) and Redis commands per page (INFO commandstats, which
  counts the commands scripts run).

Targets (H=1000, P=20, delay 1 s, latency 100 ms): >= 0.95 of the bound in both orders,
0 violations, <= 30 us of Redis CPU and <= 20 Redis commands per page; the wide run
(H=5000, P=5, most time spent discovering hosts): >= 0.9. Exits 1 if one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
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

import redis.asyncio as aioredis
import uvloop
from aiohttp import web

from common.queue import CrawlQueue, NewTask
from common.redis_server import RedisServer
from common.urls import fingerprint

ROOT = Path(__file__).resolve().parents[1]
JITTER_S = 0.05
TARGET_RATIO = 0.95
TARGET_WIDE_RATIO = 0.9
TARGET_CPU_US = 30.0
TARGET_COMMANDS = 20.0


def address(i: int) -> str:
    """Loopback address number i (0-based): 127.0.0.1, 127.0.0.2, ... 127.0.1.1, ..."""
    return f"127.{i // 62_500 % 250}.{i // 250 % 250}.{i % 250 + 1}"


# -- the server (a child process) ---------------------------------------------------------


async def serve(hosts: int, latency: float) -> dict[str, list[list[Any]]]:
    """Answer on `hosts` loopback addresses until SIGTERM; returns every request's start
    and path, per host."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    seen: dict[str, list[list[Any]]] = defaultdict(list)

    async def answer(request: web.Request) -> web.Response:
        seen[request.host].append([time.monotonic(), request.path])
        await asyncio.sleep(latency)
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n")
        return web.Response(text="<html><body>page</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    first = web.TCPSite(runner, address(0), 0, backlog=1024)
    await first.start()
    port = int(runner.addresses[0][1])
    for i in range(1, hosts):
        await web.TCPSite(runner, address(i), port, backlog=128).start()
    print(port, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
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

    @property
    def ratio(self) -> float:
        return self.bound_s / self.span_s


async def redis_counters(client: aioredis.Redis) -> tuple[float, int]:
    cpu = await client.info("cpu")
    stats = await client.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values())
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


async def crawl(server: RedisServer, port: int, *, hosts: int, pages: int, delay: float,
                latency: float, interleaved: bool, consumers: int, label: str,
                work: Path) -> Result:
    crawl_name = "fb-" + re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")
    urls = [f"http://{address(h)}:{port}/p/{i}" for h in range(hosts) for i in range(pages)]
    if interleaved:
        urls = [f"http://{address(h)}:{port}/p/{i}" for i in range(pages) for h in range(hosts)]
    client = aioredis.Redis.from_url(server.url)
    q = await CrawlQueue.open(client, crawl_name)
    for lo in range(0, len(urls), 2_000):
        await q.enqueue([NewTask(u, fingerprint(u)) for u in urls[lo:lo + 2_000]])
    await client.config_resetstat()
    cpu0, calls0 = await redis_counters(client)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CRAWLQ_LOG_LEVEL": "WARNING"}
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer", "--redis-url", server.url, "--crawl", crawl_name,
        "--per-host-delay", f"{delay}", "--per-host-concurrency", "2", "--concurrency", "128",
        "--allow-private", "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1",
        "--output", str(work / f"{crawl_name}-{i}"), "--lease", "30s",
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL) for i in range(consumers)]
    for proc in procs:
        assert await proc.wait() == 0, f"{label}: a consumer exited {proc.returncode}"
    cpu1, calls1 = await redis_counters(client)
    stats = await q.stats()
    await client.aclose()
    n = hosts * pages
    assert stats.done == n, f"{label}: {stats}"
    return Result(label, pages * delay + latency, 0.0, 0, 0, n, (cpu1 - cpu0) * 1e6 / n,
                  (calls1 - calls0) / n)


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


async def one_run(args: argparse.Namespace, server: RedisServer, work: Path, *, hosts: int,
                  pages: int, interleaved: bool, consumers: int) -> Result:
    out = work / "seen.json"
    site = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", str(hosts), "--latency", str(args.latency),
        "--out", str(out), stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert site.stdout is not None
        port = int(await asyncio.wait_for(site.stdout.readline(), 120))
        order = "interleaved" if interleaved else "sorted by host"
        label = f"H={hosts} P={pages}, {order}, {consumers} consumer(s)"
        result = await crawl(server, port, hosts=hosts, pages=pages, delay=args.delay,
                             latency=args.latency, interleaved=interleaved,
                             consumers=consumers, label=label, work=work)
    finally:
        with contextlib.suppress(ProcessLookupError):
            site.send_signal(signal.SIGTERM)
        await site.wait()
    return judge(result, json.loads(out.read_text()), args.delay, args.latency)


def report(r: Result, target: float) -> bool:
    ok = (r.ratio >= target and r.violations == 0 and r.cpu_us <= TARGET_CPU_US
          and r.commands <= TARGET_COMMANDS)
    print(f"{r.label:<46} bound {r.bound_s:5.1f}s span {r.span_s:5.1f}s "
          f"ratio {r.ratio:4.2f} (>= {target})  violations {r.violations} "
          f"(closest {r.closest_s:.3f}s)  "
          f"requests {r.requests:,}  Redis {r.cpu_us:5.1f} us/page (<= {TARGET_CPU_US:g}), "
          f"{r.commands:4.1f} commands/page (<= {TARGET_COMMANDS:g})  "
          f"{'OK' if ok else 'MISSED'}", flush=True)
    return ok


async def run(args: argparse.Namespace) -> int:
    missed = 0
    with tempfile.TemporaryDirectory() as tmp, RedisServer(binary=args.redis_server) as server:
        work = Path(tmp)
        version = ".".join(map(str, server.version()))
        print(f"frontier bench: redis-server {version} ({server.binary}), {os.cpu_count()} "
              f"CPUs, delay {args.delay}s, latency {args.latency}s, --per-host-concurrency 2,"
              f" --concurrency 128, load average {os.getloadavg()[0]:.2f}", flush=True)
        for interleaved in (False, True):
            for consumers in (1, 2):
                r = await one_run(args, server, work, hosts=args.hosts, pages=args.pages,
                                  interleaved=interleaved, consumers=consumers)
                missed += not report(r, TARGET_RATIO)
        if args.wide_hosts:
            r = await one_run(args, server, work, hosts=args.wide_hosts, pages=args.wide_pages,
                              interleaved=False, consumers=2)
            missed += not report(r, TARGET_WIDE_RATIO)
    print("all targets met" if not missed else f"{missed} run(s) missed a target")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--latency", type=float, default=0.1)
    p.add_argument("--wide-hosts", type=int, default=5000, help="0 skips the wide run")
    p.add_argument("--wide-pages", type=int, default=5)
    p.add_argument("--redis-server", default=None, help="redis-server binary (default: PATH)")
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        # The server is the instrument: on a shared machine its own scheduling delays
        # would read as requests arriving closer together than they were sent.
        with contextlib.suppress(PermissionError):  # raising priority needs root
            os.nice(-10)
        args.out.write_text(json.dumps(uvloop.run(serve(args.serve, args.latency))))
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
