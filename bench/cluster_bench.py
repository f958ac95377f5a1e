"""Queue throughput on one Redis vs a local 3-shard Redis Cluster, side by side.

Not a test: ``python bench/cluster_bench.py [--tasks 200000] [--procs 2]``.

Both runs use the same crawl layout (``--partitions``, default 6) and the same client
processes, each leasing batches and acking them (no-op tasks). On one Redis every
partition's scripts queue on one server thread; on the cluster the partitions live on
three shards that run their scripts in parallel. Also runs a small crawl through one
consumer process on each, against a local page server.

On a machine with few cores the client processes and the Redis servers compete for the
same CPUs, so the ratio measured here is a floor of what separate machines would show.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.queue import CrawlSettings, LeasingQueue, NewTask  # noqa: E402
from common.redis.connection import open_redis  # noqa: E402
from common.redis.server import RedisClusterServers, RedisServer  # noqa: E402
from common.urls.canonical import fingerprint  # noqa: E402

BATCH = 500


async def _fill(url: str, crawl: str, tasks: int, partitions: int) -> None:
    client = await open_redis(url)
    queue = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=partitions))
    for start in range(0, tasks, 5000):
        urls = [f"http://bench.example/{i}" for i in range(start, min(tasks, start + 5000))]
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    await client.aclose()


async def _drain(url: str, crawl: str, worker: str, coroutines: int) -> int:
    client = await open_redis(url)
    queue = await LeasingQueue.existing(client, crawl)
    done = 0

    async def loop() -> None:
        nonlocal done
        while True:
            leases = await queue.lease(worker, BATCH, 60_000)
            if not leases:
                if (await queue.stats()).pending == 0:
                    return
                continue
            await queue.ack(worker, [(lease, "ok") for lease in leases])
            done += len(leases)

    await asyncio.gather(*(loop() for _ in range(coroutines)))
    await client.aclose()
    return done


def _drain_process(url: str, crawl: str, worker: str, coroutines: int,
                   out: mp.Queue[int]) -> None:
    out.put(asyncio.run(_drain(url, crawl, worker, coroutines)))


def lease_ack_rate(url: str, crawl: str, tasks: int, partitions: int, procs: int) -> float:
    """Tasks/s leased and acked by `procs` client processes until the crawl is empty."""
    asyncio.run(_fill(url, crawl, tasks, partitions))
    out: mp.Queue[int] = mp.Queue()
    workers = [mp.Process(target=_drain_process, args=(url, crawl, f"w{i}", 4, out))
               for i in range(procs)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    total = sum(out.get() for _ in workers)
    elapsed = time.perf_counter() - started
    for w in workers:
        w.join()
    assert total == tasks, f"drained {total} of {tasks}"
    return tasks / elapsed


def crawl_rate(url: str, crawl: str, pages: int, partitions: int, site: str) -> float:
    """Pages/s of one consumer process crawling `pages` local pages."""
    async def fill() -> None:
        client = await open_redis(url)
        queue = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=partitions))
        urls = [f"{site}/p/{i}" for i in range(pages)]
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
        await client.aclose()

    asyncio.run(fill())
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "consumer", "--redis-url", url, "--crawl", crawl,
             "--output", out, "--exit-when-empty", "--empty-grace", "0", "--allow-private",
             "--ignore-robots", "--per-host-concurrency", "0", "--per-host-delay", "0",
             "--http-port", "-1", "--log-level", "WARNING"],
            cwd=ROOT, check=True)
        return pages / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--pages", type=int, default=5000, help="pages of the crawl run")
    args = parser.parse_args()

    site_proc = subprocess.Popen([sys.executable, "-m", "tests.sites", "--port", "0"],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert site_proc.stdout is not None
    site = f"http://127.0.0.1:{site_proc.stdout.readline().strip()}"
    try:
        with RedisServer() as single, RedisClusterServers(masters=3) as cluster:
            print(f"{args.tasks} no-op tasks, {args.partitions} partitions, {args.procs} client "
                  f"processes x 4 coroutines, batches of {BATCH}, {os.cpu_count()} CPUs")
            one = lease_ack_rate(single.url, "qa", args.tasks, args.partitions, args.procs)
            print(f"lease+ack, one Redis          {one:10,.0f} tasks/s")
            three = lease_ack_rate(cluster.url, "qa", args.tasks, args.partitions, args.procs)
            print(f"lease+ack, 3-shard cluster    {three:10,.0f} tasks/s   "
                  f"ratio {three / one:.2f}x")
            c1 = crawl_rate(single.url, "ca", args.pages, args.partitions, site)
            print(f"crawl, one Redis              {c1:10,.0f} pages/s  (one consumer, "
                  f"{args.pages} local pages)")
            c3 = crawl_rate(cluster.url, "ca", args.pages, args.partitions, site)
            print(f"crawl, 3-shard cluster        {c3:10,.0f} pages/s  ratio {c3 / c1:.2f}x")
    finally:
        site_proc.terminate()
        site_proc.wait()


if __name__ == "__main__":
    main()
