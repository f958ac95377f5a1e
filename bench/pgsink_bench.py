"""The PostgreSQL sink against the JSONL sink on the same extraction crawl (issue 32).

    python bench/pgsink_bench.py [--rounds 5] [--concurrency 32] [--consumers 1]

A crawl of python3-doc's HTML tree (~530 pages, served by nginx on 127.0.0.1; both are
apt-get installed when missing) by ``--consumers`` consumers with bench/doc_items.py's
handler: every documented signature of a page (``dt.sig[id]``) an item, its links
followed. Each round crawls the tree twice at once, into JSONL files and into a PostgreSQL
table (Debian's postgres, run as tests/support/postgres.py runs it, fsync on: a database's
real commit cost), each a fresh crawl with its own consumers: on a shared machine the load
falls on both alike (one after the other, a round's ratio swung from 0.2 to 2 at a load
average of 15 on 2 cores). Per crawl: pages/s over its own window (the first lease to the
last ack, polled every 20 ms) and over the time both crawled (the ratio is taken there),
items/s, the consumers' CPU per page, and for PostgreSQL the server's CPU per page (the
postmaster and its backends). Then the medians over the rounds. Target: a ratio >= 0.85
(the database costs the crawl at most 15% of its pages/s). Every PostgreSQL run is
checked against the JSONL run of its round: the same item keys, each one row. Last, one
crawl into PostgreSQL by two consumers with ``--lease 3s``, one of them SIGKILLed at random
moments three times (each replaced): every expected row present, no key twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):  # run as a script from a checkout; tests/support
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from benchlib import cpu_seconds, doc_root, run_in_workdir, start_nginx, stop_all  # noqa: E402
from support.postgres import PostgresServer, find_bindir  # noqa: E402

from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.urls.canonical import canonicalize, fingerprint  # noqa: E402

TARGET = 0.85


@dataclass
class Run:
    sink: str
    pages: int = 0
    window_s: float = 0.0
    items: int = 0
    keys: frozenset[str] = frozenset()
    consumer_cpu_s: float = 0.0
    db_cpu_s: float = 0.0
    together_pages_s: float = 0.0  # pages/s while the other crawl ran too
    note: str = ""

    @property
    def pages_s(self) -> float:
        return self.pages / self.window_s if self.window_s else 0.0

    @property
    def items_s(self) -> float:
        return self.items / self.window_s if self.window_s else 0.0

    def line(self) -> str:
        per_page = 1e3 / self.pages if self.pages else 0.0
        db = f", db CPU {self.db_cpu_s * per_page:5.2f} ms/page" if self.sink == "postgres" \
            else ""
        return (f"  {self.sink:8} {self.pages:5d} pages {self.pages_s:7.1f} pages/s "
                f"{self.items:6d} items {self.items_s:8.1f} items/s, consumer CPU "
                f"{self.consumer_cpu_s * per_page:5.2f} ms/page{db}{self.note}")


def _stat(pid: int | str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def tree_cpu(root_pid: int) -> float:
    """CPU seconds of `root_pid` (a postmaster), of its children that ended (its backends:
    one a connection, gone with the consumer) and of those still running."""
    tick = os.sysconf("SC_CLK_TCK")
    own = _stat(root_pid)
    total = sum(int(v) for v in own[11:15]) / tick if own else 0.0
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else []
        if fields and fields[1] == str(root_pid):
            total += (cpu_seconds(int(entry.name)) or 0.0)
    return total


async def crawl(args: argparse.Namespace, redis: RedisServer, start_url: str, *, sink: str,
                out: Path, crawl_name: str, kills: int = 0
                ) -> tuple[list[tuple[float, int]], float]:
    """Run the consumers to the end, SIGKILLing one at random `kills` times (each replaced by
    a new one); (when the done count moved: (time, done), from the first lease on; the
    consumers' CPU seconds)."""
    client = aioredis.Redis.from_url(redis.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "bench")])
    # A killed consumer's leases come back after --lease: short, when there are kills.
    lease = ("--lease", "3s") if kills else ()

    async def start(i: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer", "--redis-url", redis.url, "--crawl", crawl_name,
            "--worker-id", f"bench-{i}", "--handler", "doc_items:signatures",
            "--max-depth", "1000", "--per-host-delay", "0", "--per-host-concurrency", "0",
            "--allow-private", "--exit-when-empty", "--empty-grace", "0",
            "--concurrency", str(args.concurrency), "--http-port", "-1", "--sink", sink,
            "--output", str(out), "--log-level", "WARNING", *lease, env=env,
            stdin=asyncio.subprocess.DEVNULL)

    try:
        queue = await CrawlQueue.open(client, crawl_name, CrawlSettings(partitions=4))
        await queue.enqueue([NewTask(start_url, fingerprint(start_url))])
        procs = [await start(i) for i in range(args.consumers)]
        killed: set[int] = set()
        next_kill = time.monotonic() + random.uniform(1.0, 3.0)
        timeline: list[tuple[float, int]] = []
        cpu: dict[int, float] = {}
        while any(p.returncode is None for p in procs):
            live = [p for p in procs if p.returncode is None]
            for p in live:
                cpu[p.pid] = cpu_seconds(p.pid) or cpu.get(p.pid, 0.0)
            if len(killed) < kills and time.monotonic() >= next_kill and timeline:
                victim = random.choice(live)
                victim.kill()  # SIGKILL: mid-fetch, mid-write or mid-ack, as it comes
                killed.add(victim.pid)
                procs.append(await start(len(procs)))
                next_kill = time.monotonic() + random.uniform(0.5, 2.0)
            stats = await queue.stats()
            if (timeline or stats.leased + stats.done) and \
                    (not timeline or stats.done != timeline[-1][1]):
                timeline.append((time.monotonic(), stats.done))
            await asyncio.sleep(0.02)
        codes = [await p.wait() for p in procs if p.pid not in killed]
        if any(codes) or len(killed) < kills:
            raise SystemExit(f"consumers exited {codes}, {len(killed)} of {kills} killed "
                             f"({sink})")
        return timeline, sum(cpu.values())
    finally:
        await client.aclose()


def done_at(timeline: list[tuple[float, int]], at: float) -> int:
    """The done count at time `at` (the last sample at or before it)."""
    return max((done for t, done in timeline if t <= at), default=0)


def jsonl_items(out: Path) -> tuple[int, frozenset[str]]:
    keys: list[str] = []
    for f in sorted(out.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            record = json.loads(line)
            keys += [f"{record['url']}#{i}" for i in range(len(record["items"]))]
    return len(keys), frozenset(keys)


async def table_items(url: str, table: str) -> tuple[int, frozenset[str]]:
    conn = await asyncpg.connect(url)
    try:
        keys = [r[0] for r in await conn.fetch(f"SELECT key FROM {table}")]
    finally:
        await conn.close()
    return len(keys), frozenset(keys)


async def one_round(args: argparse.Namespace, n: int, redis: RedisServer, *,
                    pg: PostgresServer, start_url: str, workdir: Path) -> list[Run]:
    """Both crawls at once: the machine's load falls on both alike."""
    table = f"items_{n}"
    sinks = {"jsonl": "jsonl", "postgres": f"{pg.url()}?table={table}"}
    assert pg.process is not None
    db_before = tree_cpu(pg.process.pid)
    results = await asyncio.gather(*(
        crawl(args, redis, start_url, sink=target, out=workdir / f"out-{n}-{name}",
              crawl_name=f"pg-bench-{n}-{name}") for name, target in sinks.items()))
    db_cpu = tree_cpu(pg.process.pid) - db_before
    # Rates over the time both crawled: from the later first lease to the earlier last ack.
    start = max(timeline[0][0] for timeline, _ in results)
    end = min(timeline[-1][0] for timeline, _ in results)
    runs = []
    for (name, _), (timeline, cpu) in zip(sinks.items(), results, strict=True):
        run = Run(name, pages=timeline[-1][1], window_s=timeline[-1][0] - timeline[0][0],
                  consumer_cpu_s=cpu, db_cpu_s=db_cpu if name == "postgres" else 0.0)
        run.together_pages_s = (done_at(timeline, end) - done_at(timeline, start)) / (
            end - start) if end > start else 0.0
        run.items, run.keys = (await table_items(pg.url(), table) if name == "postgres"
                               else jsonl_items(workdir / f"out-{n}-{name}"))
        runs.append(run)
    if runs[1].keys != runs[0].keys:
        runs[1].note = f"  ITEMS DIFFER: {len(runs[1].keys)} keys vs {len(runs[0].keys)}"
    return runs


async def kill_round(args: argparse.Namespace, redis: RedisServer, *, pg: PostgresServer,
                     start_url: str, workdir: Path, expected: frozenset[str]) -> str:
    """The crawl into PostgreSQL by two consumers, one SIGKILLed at random 3 times: what
    reached the table against the JSONL run's item keys."""
    kills, table = 3, "items_killed"
    two = argparse.Namespace(**{**vars(args), "consumers": 2})
    timeline, _ = await crawl(two, redis, start_url, sink=f"{pg.url()}?table={table}",
                              out=workdir / "out-killed", crawl_name="pg-bench-killed",
                              kills=kills)
    rows, keys = await table_items(pg.url(), table)
    lost = len(expected - keys)
    return (f"kill -9 x{kills} of 2 consumers mid-crawl into postgres: {timeline[-1][1]} pages "
            f"done, {len(keys & expected)} of {len(expected)} expected rows, "
            f"{rows - len(keys)} keys twice, {len(keys - expected)} unexpected"
            + (f", {lost} LOST" if lost else ""))


async def bench_async(args: argparse.Namespace, workdir: Path) -> int:
    root = doc_root(None)
    port, _ = start_nginx(root, workdir, http="    access_log off;")
    start_url = canonicalize(f"http://127.0.0.1:{port}/index.html")
    assert isinstance(start_url, str)
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    ratios: list[float] = []
    results: list[list[Run]] = []
    with RedisServer() as redis, PostgresServer(bindir, durable=args.fsync == "on") as pg:
        print(f"nginx :{port} serving {root}; redis :{redis.port}; postgres :{pg.port} "
              f"({bindir}, fsync {args.fsync}); {args.consumers} consumer(s) x "
              f"{args.concurrency}", flush=True)
        for n in range(args.rounds):
            runs = await one_round(args, n, redis, pg=pg, start_url=start_url, workdir=workdir)
            results.append(runs)
            jsonl, postgres = runs
            ratio = postgres.together_pages_s / jsonl.together_pages_s \
                if jsonl.together_pages_s else 0.0
            ratios.append(ratio)
            print(f"round {n + 1}/{args.rounds}", flush=True)
            for run in runs:
                print(run.line(), flush=True)
            print(f"  while both crawled: jsonl {jsonl.together_pages_s:.1f} pages/s, postgres "
                  f"{postgres.together_pages_s:.1f} pages/s: postgres / jsonl {ratio:.2f}",
                  flush=True)
        killed = await kill_round(args, redis, pg=pg, start_url=start_url, workdir=workdir,
                                  expected=results[-1][0].keys)
    med = statistics.median(ratios)

    def per_page(i: int, cpu: str) -> float:
        return statistics.median(1e3 * getattr(r[i], cpu) / r[i].pages for r in results)

    print(f"median over {len(ratios)} rounds, while both crawled: jsonl "
          f"{statistics.median(r[0].together_pages_s for r in results):.1f} pages/s, postgres "
          f"{statistics.median(r[1].together_pages_s for r in results):.1f} pages/s, ratio "
          f"{med:.2f} (target >= {TARGET}: {'ok' if med >= TARGET else 'MISSED'}); "
          f"postgres items/s {statistics.median(r[1].items_s for r in results):.0f}; CPU "
          f"ms/page: consumer jsonl {per_page(0, 'consumer_cpu_s'):.2f}, postgres "
          f"{per_page(1, 'consumer_cpu_s'):.2f} + db {per_page(1, 'db_cpu_s'):.2f}")
    same = all(not r[1].note for r in results)
    print(f"same items in every round: {'yes' if same else 'NO'}")
    print(killed)
    return 0 if same and "LOST" not in killed else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--fsync", choices=("on", "off"), default="on",
                   help="the database's fsync and synchronous_commit (off: what the commit's "
                        "flush to disk costs, by difference)")
    args = p.parse_args(argv)
    return run_in_workdir("crawlq-pgsink-bench-",
                          lambda workdir: asyncio.run(bench_async(args, workdir)), stop_all)


if __name__ == "__main__":
    sys.exit(main())
