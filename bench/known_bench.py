"""What the producer's recrawl of the known URLs costs (issue 43, common/queue/known.py):
N done URLs past the window queued again from the crawl's history, beside what feeding
the same N URLs as a file costs and a bare read of the history.

A fresh redis-server (``--redis-server``), a crawl of one partition (``--bits`` seen
bits): N URLs over 997 hosts (queue_bench's) enqueued, leased and acked through the real
scripts with an ETag, a Last-Modified and a digest under ``recrawl_after`` (revisits off,
conditional on: each keeps its record with its entry). Once the window has passed, each
run in a child process (its own peak RSS):

- **known**: ``CrawlQueue.recrawl_known`` (every record read, each queued again);
- **skip**: the same right after with a window of an hour: nothing has come due since
  (one field a partition read);
- **file**: ``CrawlQueue.enqueue`` of the same N URLs in batches of 1,000, what a
  producer run of the URL list does after its file is read (the queue emptied first);
- **bare HSCAN**: the history's buckets read (SCAN, then HSCAN 64 buckets a pipeline, as
  the scan does; every bucket a listpack here: one call each), nothing parsed or queued:
  the floor of any scan.

Printed: wall seconds, URLs/s, the child's CPU, Redis's CPU (INFO used_cpu_*), the
child's peak RSS; ratios to **file**.

    python bench/known_bench.py --urls 200000 --redis-server /usr/bin/redis-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.policy import set_policy  # noqa: E402
from common.queue import CrawlQueue, CrawlSettings, LeasingQueue, NewTask  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.revisits.previous import Observed  # noqa: E402
from common.urls.canonical import fingerprint  # noqa: E402

CRAWL = "known"
HOSTS = 997
WINDOW_S = 1


def url_of(i: int) -> str:
    return f"https://site{i % HOSTS}.example.com/articles/{i}/index.html?ref=bench&page={i % 13}"


async def fill(url: str, n: int, bits: int) -> None:
    """N done URLs through the real scripts, each with its history record."""
    client = aioredis.Redis.from_url(url)
    try:
        q = await LeasingQueue.open(client, CRAWL, CrawlSettings(seen_bits=bits))
        await set_policy(client, CRAWL, {"recrawl_after": WINDOW_S, "per_host_delay": 0.0,
                                         "per_host_concurrency": 0}, by="bench", create=True)
        q.configure(recrawl_after_s=WINDOW_S, revisits=True)
        for lo in range(0, n, 5_000):
            await q.enqueue([NewTask(u, fingerprint(u)) for u in map(url_of, range(lo, min(
                n, lo + 5_000)))])
        observed = Observed('"5f2b-1a3c9e7d"', "Wed, 21 Oct 2015 07:28:00 GMT",
                            "0123456789abcdef")
        while leases := await q.lease("bench", 1_000, 600_000):
            for lease in leases:
                lease.observed = observed
            await q.ack("bench", [(lease, "ok") for lease in leases])
    finally:
        await client.aclose()


async def drain(url: str) -> None:
    """Lease and ack every pending task (what consumers would do), history kept."""
    client = aioredis.Redis.from_url(url)
    try:
        q = await LeasingQueue.existing(client, CRAWL)
        q.configure(recrawl_after_s=WINDOW_S, revisits=True)
        while leases := await q.lease("bench", 1_000, 600_000):
            await q.ack("bench", [(lease, "ok") for lease in leases])
    finally:
        await client.aclose()


async def child(url: str, what: str, n: int) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    try:
        q = await CrawlQueue.existing(client, CRAWL)
        # skip: a window as long as a real one's, so nothing has come due since the scan
        q.configure(recrawl_after_s=3600 if what == "skip" else WINDOW_S)
        started = time.perf_counter()
        queued = 0
        if what in ("known", "skip"):
            done = await q.recrawl_known()
            queued = done.recrawled
        elif what == "file":
            for lo in range(0, n, 1_000):
                urls = [url_of(i) for i in range(lo, min(n, lo + 1_000))]
                queued += (await q.enqueue([NewTask(u, fingerprint(u)) for u in urls])).enqueued
        else:  # bare HSCAN: the keys the scan finds, read as it reads them
            pattern = f"crawlq:\\{{{CRAWL}:*rv:hist:*"
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            for lo in range(0, len(keys), 64):
                async with client.pipeline(transaction=False) as pipe:
                    for key in keys[lo:lo + 64]:
                        pipe.hscan(key, 0, count=1000)
                    queued += sum(len(fields) for _, fields in await pipe.execute())
        wall = time.perf_counter() - started
    finally:
        await client.aclose()
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall": wall, "queued": queued, "cpu": use.ru_utime + use.ru_stime,
            "rss_mb": use.ru_maxrss / 1024}


def run_child(url: str, what: str, n: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", what, "--url", url,
                          "--urls", str(n)], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def redis_cpu(url: str) -> float:
    async def read() -> float:
        client = aioredis.Redis.from_url(url)
        try:
            info = await client.info("cpu")
        finally:
            await client.aclose()
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return asyncio.run(read())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--urls", type=int, default=200_000)
    p.add_argument("--bits", type=int, default=16, help="seen_bits (16: the default)")
    p.add_argument("--redis-server", default="")
    p.add_argument("--child", default="")
    p.add_argument("--url", default="")
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.url, args.child, args.urls))))
        return 0
    with RedisServer(binary=args.redis_server,
                     extra_args=("--hash-max-listpack-value", "192")) as server:
        print(f"{args.urls:,} done URLs over {HOSTS} hosts, 2^{args.bits} buckets ...",
              flush=True)
        asyncio.run(fill(server.url, args.urls, args.bits))
        time.sleep(WINDOW_S + 1.1)
        rows = []
        for what in ("known", "skip", "drain", "bare HSCAN", "file"):
            if what == "drain":
                asyncio.run(drain(server.url))  # the queue empty again, history kept
                time.sleep(WINDOW_S + 1.1)
                continue
            before = redis_cpu(server.url)
            r = run_child(server.url, what, args.urls)
            r["redis"] = redis_cpu(server.url) - before
            rows.append((what, r))
    base = dict(rows)["file"]
    print(f"{'run':<12} {'wall s':>8} {'URLs/s':>10} {'CPU s':>7} {'Redis s':>8} "
          f"{'peak RSS':>9} {'queued':>9}   wall / file")
    for what, r in rows:
        rate = r["queued"] / r["wall"] if r["wall"] and r["queued"] else 0.0
        print(f"{what:<12} {r['wall']:8.2f} {rate:10,.0f} {r['cpu']:7.2f} {r['redis']:8.2f} "
              f"{r['rss_mb']:7.0f}MB {r['queued']:9,}   {r['wall'] / base['wall']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
