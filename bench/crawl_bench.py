"""Consumer throughput against its ceiling: crawl N distinct local pages, three ways.

    python bench/crawl_bench.py [--pages 20000] [--concurrency 64] [--rounds 5]

1. **ceiling**: a bare aiohttp loop (one ClientSession, ``TCPConnector(limit=C)``, C
   worker coroutines reading every body), no Redis, in this process; then the same loop
   through ``common.http.fetcher.Fetcher``, which tells the fetcher's own cost apart;
2. **one consumer**: ``python -m consumer --exit-when-empty ...`` with concurrency C on
   a crawl of the same N URLs, enqueued beforehand with ``CrawlQueue.enqueue``, then the
   ceiling once more: the ratio is taken against the mean of the two ceilings around
   the consumer (the machine drifts from one run to the next);
3. **two consumers** together on a fresh crawl of the same N URLs, timed from when both
   are up (pages done before are left out: their start-ups don't end together), and
   for scale the bare loop in one process, then in two processes with half the URLs
   each (each timing its own loop): on a small machine the static server and Redis
   compete with the consumers for the CPUs, and this shows how far the ceiling itself
   scales there.

Every round runs all of this, and with ``--rounds`` > 1 (default 5) the medians follow:
on a shared machine one run's ratio can swing by 0.2, so only ratios taken within one
round are compared, and the median is the figure to quote. All of it runs in one
invocation against one static server and one redis-server of its own
(``RedisServer``), on 127.0.0.1 only. The static server is nginx when it is on PATH
(``--install-nginx`` runs ``apt-get install -y nginx`` first when it is not), else an
aiohttp server in a separate process answering a small page for any path.

Throughput is N / the crawl window: from the first lease (the ``leased`` counter moving)
to the last ack (``done`` == N), polled every 20 ms; the process wall time, start-up and
exit included, is printed too, and so is CPU time per page (``time.process_time`` for
the in-process loops, ``/proc/<pid>/stat`` for the consumer). The consumer's RSS is read
from ``/proc/<pid>/status`` (VmRSS) every 0.5 s from its first lease on. Targets: one
consumer >= 0.85 x the ceiling, two >= 1.4 x one, RSS flat. The CPU time the static
server and redis-server spend per page in the one-consumer window is printed too: it
is what a second consumer competes with.

``--profile cprofile`` runs the single consumer under cProfile (main thread only; a
large sink batch written in a thread is not in it) and prints its top functions;
``--profile py-spy`` samples it with py-spy (``pip install py-spy``; every thread) and
prints the top own and inclusive frames from the collapsed stacks it writes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchlib import cpu_seconds, nginx_conf, wait_port, which_nginx  # noqa: E402

from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: E402
from common.redis.server import RedisServer, free_port  # noqa: E402
from common.runtime import run_loop  # noqa: E402
from common.urls.canonical import fingerprint  # noqa: E402

PAGE = ("<!doctype html>\n<html><head><title>bench</title></head><body>"
        + "<p>crawlq benchmark page</p>" * 20 + "</body></html>\n")


# -- the static server ----------------------------------------------------------------------


@dataclass
class StaticServer:
    kind: str
    port: int
    process: subprocess.Popen[bytes]

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/p/{i}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_static(args: argparse.Namespace, workdir: Path) -> StaticServer:
    nginx = None if args.server == "aiohttp" else which_nginx(install=args.install_nginx)
    if args.server == "nginx" and nginx is None:
        raise SystemExit("no nginx on PATH (try --install-nginx)")
    port = free_port()
    if nginx is not None:
        d = workdir / "nginx"
        d.mkdir()
        conf = d / "nginx.conf"
        page = PAGE.replace("'", "\\'")
        conf.write_text(nginx_conf(d, port, workers=args.server_workers,
                                   http="    access_log off;",
                                   server=f"        default_type text/html;\n"
                                          f"        location / {{ return 200 '{page}'; }}"))
        proc = subprocess.Popen([nginx, "-p", str(d), "-c", str(conf)],
                                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, proc, "nginx")
        return StaticServer(f"nginx ({args.server_workers} worker)", port, proc)
    proc = subprocess.Popen([sys.executable, __file__, "--serve-static", str(port)],
                            stdin=subprocess.DEVNULL)
    wait_port(port, proc, "aiohttp static server")
    return StaticServer("aiohttp (1 process)", port, proc)


def serve_static(port: int) -> None:
    """``--serve-static PORT``: answer PAGE for any path (the nginx stand-in)."""
    from aiohttp import web  # noqa: PLC0415

    body = PAGE.encode()

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        uvloop = None
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                backlog=4096, loop=uvloop.new_event_loop() if uvloop else None)


# -- the ceiling: a bare aiohttp loop ----------------------------------------------------------


async def bare_loop(urls: list[str], concurrency: int) -> tuple[float, float]:
    """Fetch every URL once with `concurrency` workers; returns (seconds, CPU seconds)."""
    it: Iterator[str] = iter(urls)
    done = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        for url in it:
            async with session.get(url) as resp:
                await resp.read()
                if resp.status == 200:
                    done += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if done != len(urls):
        raise SystemExit(f"bare loop: only {done} of {len(urls)} answered 200")
    return elapsed, cpu


async def bare_loops_in_processes(port: int, pages: int, concurrency: int,
                                  processes: int) -> float:
    """Pages/s of `processes` bare loops in parallel processes, each on its share of URLs:
    how far the ceiling itself scales on these CPUs (the server competes for them)."""
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--bare-share", f"{port}:{pages}:{processes}:{i}",
        "--concurrency", str(concurrency), stdout=asyncio.subprocess.PIPE)
        for i in range(processes)]
    outs = [await p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"bare loop processes failed: {[p.returncode for p in procs]}")
    return pages / max(float(out) for out, _ in outs)


def bare_share(spec: str, concurrency: int) -> None:
    """``--bare-share PORT:PAGES:SHARES:INDEX``: run the bare loop on one share, print s."""
    port, pages, shares, index = map(int, spec.split(":"))
    urls = [f"http://127.0.0.1:{port}/p/{i}" for i in range(index, pages, shares)]
    elapsed, _ = run_loop(bare_loop(urls, concurrency))
    print(elapsed)


async def fetcher_loop(urls: list[str], concurrency: int) -> tuple[float, float]:
    """The same loop through the consumer's Fetcher (SSRF guard off, caps and timeouts on)."""
    from common.http.fetcher import Fetcher  # noqa: PLC0415
    from common.http.results import FetchSettings  # noqa: PLC0415

    it: Iterator[str] = iter(urls)
    done = 0

    async def worker(fetcher: Fetcher) -> None:
        nonlocal done
        for url in it:
            result = await fetcher.fetch(url)
            if result.status == 200:
                done += 1

    settings = FetchSettings(allow_private=True, concurrency=concurrency, limit_per_host=0)
    async with Fetcher(settings) as fetcher:
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(fetcher) for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if done != len(urls):
        raise SystemExit(f"fetcher loop: only {done} of {len(urls)} answered 200")
    return elapsed, cpu


# -- consumers ---------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    pages: int  # pages done inside the window
    window_s: float = 0.0
    wall_s: float = 0.0
    rss_kib: list[int] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU time of the (first) consumer during the crawl window
    server_cpu_s: dict[str, float] = field(default_factory=dict)  # static server, redis

    @property
    def rate(self) -> float:
        return self.pages / self.window_s if self.window_s else 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children (nginx: the master and its workers)."""
    total = cpu_seconds(pid) or 0.0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(tree_cpu_seconds(int(c)) for c in children)


def vm_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def enqueue_all(client: aioredis.Redis, crawl: str, urls: list[str]) -> CrawlQueue:
    queue = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=1))
    tasks = [NewTask(u, fingerprint(u)) for u in urls]
    for i in range(0, len(tasks), 1000):
        await queue.enqueue(tasks[i:i + 1000])
    stats = await queue.stats()
    if stats.pending != len(urls):
        raise SystemExit(f"enqueued {stats.pending} of {len(urls)}")
    return queue


def consumer_argv(args: argparse.Namespace, redis_url: str, crawl: str, out: Path,
                  worker: str) -> list[str]:
    return [sys.executable, "-m", "consumer", "--redis-url", redis_url, "--crawl", crawl,
            "--worker-id", worker, "--exit-when-empty", "--empty-grace", "0",
            "--allow-private", "--ignore-robots", "--per-host-concurrency", "0",
            "--per-host-delay", "0", "--http-port", "-1", "--log-level", "WARNING",
            "--output", str(out), "--concurrency", str(args.concurrency)]


@dataclass
class Env:
    """What every consumer run shares."""

    args: argparse.Namespace
    client: aioredis.Redis
    redis_url: str
    urls: list[str]
    workdir: Path
    servers: dict[str, int] = field(default_factory=dict)  # name -> pid, for their CPU time


async def run_consumers(env: Env, n: int, *, profile: str = "none") -> Run:
    """Enqueue every URL in a fresh crawl, then crawl it with `n` consumer processes."""
    args, urls, workdir = env.args, env.urls, env.workdir
    crawl = f"bench-{n}x-{int(time.time() * 1000)}"
    queue = await enqueue_all(env.client, crawl, urls)
    out = workdir / crawl
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    procs = []
    for i in range(n):
        argv = consumer_argv(args, env.redis_url, crawl, out, f"bench-{i}")
        if profile == "cprofile":
            argv[1:1] = ["-m", "cProfile", "-o", str(args.profile_out)]
        elif profile == "py-spy":
            spy = shutil.which("py-spy")
            if spy is None:
                raise SystemExit("py-spy not found: pip install py-spy")
            argv = [spy, "record", "--format", "raw", "-o", str(args.profile_out),
                    "--rate", "250", "--nonblocking", "--", *argv]
        procs.append(await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env=child_env, stdin=asyncio.subprocess.DEVNULL))
    run = Run(f"{n} consumer{'s' if n > 1 else ''}", len(urls))
    started = time.perf_counter()
    first = last = None
    cpu_first: float | None = None
    cpu_seen: float | None = None
    servers_first: dict[str, float] = {}
    next_rss = 0.0
    target = procs[0].pid
    try:
        while True:
            now = time.perf_counter()
            if now >= next_rss:
                pid = target if profile != "py-spy" else _child_pid(target) or target
                rss = vm_rss_kib(pid)
                if rss is not None and first is not None:  # from the first lease on
                    run.rss_kib.append(rss)
                next_rss = now + 0.5
            if first is not None and last is None:
                # The latest reading while it runs: the consumer may exit (done, empty)
                # before the poll that sees the last ack reads /proc.
                cpu_seen = cpu_seconds(target) or cpu_seen
            leased, done = await progress(env.client, queue)
            if first is None and leased > 0 and (
                    n == 1 or await env.client.zcard(queue.crawl_keys.workers) >= n):
                # The window opens once every consumer is up: their start-up (imports,
                # a few hundred ms) doesn't end together, and the pages done before the
                # last one is up are left out, as the bare loops time their own loop.
                first = now
                run.pages = len(urls) - done
                next_rss = now
                cpu_first = cpu_seconds(target)
                servers_first = {k: tree_cpu_seconds(p) for k, p in env.servers.items()}
            if done >= len(urls) and last is None:
                last = time.perf_counter()
                cpu_last = cpu_seconds(target) or cpu_seen
                if cpu_first is not None and cpu_last is not None:
                    run.cpu_s = cpu_last - cpu_first
                run.server_cpu_s = {k: tree_cpu_seconds(p) - servers_first.get(k, 0.0)
                                    for k, p in env.servers.items()}
            if all(p.returncode is not None for p in procs):
                break
            if now - started > args.timeout:
                raise SystemExit(f"{run.label}: not done after {args.timeout}s "
                                 f"({await queue.stats()})")
            await asyncio.sleep(0.02)
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()
                await p.wait()
    run.wall_s = time.perf_counter() - started
    codes = [p.returncode for p in procs]
    stats = await queue.stats()
    if stats.done != len(urls) or any(codes):
        raise SystemExit(f"{run.label}: exit codes {codes}, stats {stats}")
    run.window_s = (last or time.perf_counter()) - (first or started)
    shutil.rmtree(out, ignore_errors=True)
    return run


async def progress(client: aioredis.Redis, queue: CrawlQueue) -> tuple[int, int]:
    """Tasks leased and done so far: two counters of the crawl's one partition, a probe
    light enough to poll every 20 ms next to the consumers (``stats()`` is 7 commands)."""
    leased, done = await client.hmget(queue.partitions[0].stats, ["leased", "done"])
    return int(leased or 0), int(done or 0)


def _child_pid(pid: int) -> int | None:
    """The python process py-spy started (its only child)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def print_cprofile(path: Path, top: int = 30) -> None:
    stats = pstats.Stats(str(path))
    stats.strip_dirs()
    print(f"\n-- cProfile of the consumer, top {top} by own time --")
    stats.sort_stats("tottime").print_stats(top)
    print(f"-- top {top} by cumulative time --")
    stats.sort_stats("cumulative").print_stats(top)


def print_collapsed(path: Path, top: int = 30) -> None:
    """Own and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.rsplit("/", 1)[-1] if " (" in f else f
                  for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            incl[frame] += n
    if not total:
        print(f"py-spy wrote no samples to {path}")
        return
    print(f"\n-- py-spy: {total} samples; top {top} by own time --")
    for frame, n in own.most_common(top):
        print(f"{100 * n / total:5.1f}%  {frame}")
    print(f"-- top {top} by inclusive time --")
    for frame, n in incl.most_common(top):
        print(f"{100 * n / total:5.1f}%  {frame}")
    print(f"(collapsed stacks in {path}: feed them to flamegraph.pl or speedscope)")


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--server", choices=("auto", "nginx", "aiohttp"), default="auto")
    p.add_argument("--server-workers", type=int, default=1, help="nginx worker processes")
    p.add_argument("--install-nginx", action="store_true",
                   help="apt-get install -y nginx when it is missing")
    p.add_argument("--skip-two", action="store_true", help="skip the two-consumer run")
    p.add_argument("--rounds", type=int, default=5,
                   help="repeat everything, printing each round and the medians")
    p.add_argument("--profile", choices=("none", "cprofile", "py-spy"), default="none",
                   help="profile the single-consumer run (slows it down)")
    p.add_argument("--profile-out", type=Path, default=None,
                   help="where the profile goes (default /tmp/crawlq-consumer.pstats or "
                   ".collapsed)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up on a run after this")
    p.add_argument("--serve-static", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--bare-share", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


@dataclass
class Round:
    """The figures of one round: every ratio is taken within the round."""

    bare: float  # pages/s
    fetcher: float
    one: Run
    two: Run | None = None
    bare_solo: float = 0.0  # bare loop in 1 process, then in 2 (pages/s)
    bare_pair: float = 0.0

    @property
    def ratio(self) -> float:
        return self.one.rate / self.bare

    @property
    def scale(self) -> float:
        return self.two.rate / self.one.rate if self.two else 0.0


async def one_round(env: Env, port: int, profile: str) -> Round:
    """Ceiling, Fetcher loop, one consumer, then two consumers and the bare loop's scaling."""
    args, urls, n = env.args, env.urls, len(env.urls)
    bare_s, bare_cpu = await bare_loop(urls, args.concurrency)
    print(f"ceiling (bare aiohttp loop)  {n / bare_s:8.0f} pages/s  ({bare_s:.2f} s, "
          f"{1e6 * bare_cpu / n:.0f} us CPU/page)")
    fetcher_s, fetcher_cpu = await fetcher_loop(urls, args.concurrency)
    print(f"same loop through Fetcher    {n / fetcher_s:8.0f} pages/s  ({fetcher_s:.2f} s, "
          f"{1e6 * fetcher_cpu / n:.0f} us CPU/page; no Redis: the fetcher's own cost)")
    one = await run_consumers(env, 1, profile=profile)
    # The ceiling again right after: the machine drifts between runs, so the consumer is
    # compared with the mean of the ceilings that bracket it.
    again_s, _ = await bare_loop(urls, args.concurrency)
    r = Round((n / bare_s + n / again_s) / 2, n / fetcher_s, one)
    print(f"one consumer                 {one.rate:8.0f} pages/s  ({one.window_s:.2f} s "
          f"crawling, {one.wall_s:.2f} s wall)")
    print(f"ceiling again                {n / again_s:8.0f} pages/s  -> one consumer / mean "
          f"ceiling {r.ratio:.2f} (target >= 0.85) {'OK' if r.ratio >= 0.85 else 'BELOW TARGET'}")
    if profile != "py-spy":  # py-spy's pid is not the consumer's
        print(f"consumer CPU                 {one.cpu_s:.2f} s over the {one.window_s:.2f}"
              f" s window: {100 * one.cpu_s / one.window_s:.0f}% of one core, "
              f"{1e6 * one.cpu_s / n:.0f} us/page")
    if one.server_cpu_s:
        print("server CPU                   " + ", ".join(
            f"{k} {1e6 * v / n:.0f} us/page" for k, v in one.server_cpu_s.items())
            + " (what a second consumer competes with on these CPUs)")
    if one.rss_kib:
        rss = one.rss_kib
        print(f"consumer RSS                 start {rss[0] / 1024:.1f} MiB, peak "
              f"{max(rss) / 1024:.1f} MiB, end {rss[-1] / 1024:.1f} MiB "
              f"({len(rss)} samples every 0.5 s)")
    if not args.skip_two:
        r.two = await run_consumers(env, 2)
        print(f"two consumers                {r.two.rate:8.0f} pages/s  "
              f"({r.two.pages} pages in {r.two.window_s:.2f} s with both up)  "
              f"{r.scale:.2f} x one (target >= 1.4) "
              f"{'OK' if r.scale >= 1.4 else 'BELOW TARGET'}")
        r.bare_solo = await bare_loops_in_processes(port, n, args.concurrency, 1)
        r.bare_pair = await bare_loops_in_processes(port, n, args.concurrency, 2)
        print(f"bare loop, 1 vs 2 processes  {r.bare_solo:8.0f} -> {r.bare_pair:.0f} pages/s  "
              f"{r.bare_pair / r.bare_solo:.2f} x (the ceiling's own scaling on these CPUs)")
    return r


def print_medians(rounds: list[Round]) -> None:
    """Median of each figure over the rounds (shared machines vary a lot run to run)."""
    def med(values: list[float], digits: int = 2) -> str:
        return (f"{statistics.median(values):.{digits}f} "
                f"(range {min(values):.{digits}f}-{max(values):.{digits}f})")

    print(f"\n-- medians over {len(rounds)} rounds --")
    print(f"one consumer / ceiling       {med([r.ratio for r in rounds])}  target >= 0.85")
    print(f"consumer CPU, us/page        "
          f"{med([1e6 * r.one.cpu_s / r.one.pages for r in rounds], 0)}")
    if all(r.two for r in rounds):
        print(f"two consumers / one          {med([r.scale for r in rounds])}  target >= 1.4")
        print(f"bare loop, 2 / 1 processes   "
              f"{med([r.bare_pair / r.bare_solo for r in rounds])}")


async def bench(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="crawlq-bench-"))
    redis = RedisServer().start()
    static = start_static(args, workdir)
    client = aioredis.Redis.from_url(redis.url)
    try:
        urls = [static.url(i) for i in range(args.pages)]
        print(f"{args.pages} pages from {static.kind}, concurrency {args.concurrency}, "
              f"{os.cpu_count()} CPUs, redis-server {'.'.join(map(str, redis.version()))}")
        await bare_loop(urls[:2000], args.concurrency)  # warm up server and imports
        servers = {"static server": static.process.pid}
        if redis.process is not None:
            servers["redis-server"] = redis.process.pid
        env = Env(args, client, redis.url, urls, workdir, servers)
        rounds = []
        for i in range(args.rounds):
            if args.rounds > 1:
                print(f"\n-- round {i + 1} of {args.rounds} --")
            rounds.append(await one_round(env, static.port, args.profile if i == 0 else "none"))
        if args.rounds > 1:
            print_medians(rounds)
        if args.profile == "cprofile":
            print_cprofile(args.profile_out)
        elif args.profile == "py-spy":
            print_collapsed(args.profile_out)
    finally:
        await client.aclose()
        static.stop()
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile_out is None:
        suffix = "pstats" if args.profile == "cprofile" else "collapsed"
        args.profile_out = Path(f"/tmp/crawlq-consumer.{suffix}")
    if args.serve_static:
        serve_static(args.serve_static)
        return 0
    if args.bare_share:
        bare_share(args.bare_share, args.concurrency)
        return 0
    return run_loop(bench(args))


if __name__ == "__main__":
    sys.exit(main())
