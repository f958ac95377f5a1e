"""Producer throughput and memory, against the raw Redis SADD rate of the same fingerprints.

    python bench/producer_bench.py [--lines 1000000] [--redis-url URL] [--keep]

1. Writes a file of ``--lines`` URLs, half of them duplicates (every URL appears twice:
   the first half in order, the second half shuffled).
2. Runs ``python -m producer`` on it as a subprocess into a fresh crawl and reports its
   end-to-end URLs/s (process start to exit, and the producer's own elapsed time) and
   its peak RSS (the child's VmHWM, sampled while it runs).
3. In the same run, SADDs the same 16-byte fingerprints into a scratch set with a
   pipelined client (1000 commands per round trip) and reports that rate and the ratio.

Targets: >= 100,000 URLs/s end to end from one process; peak RSS < 100 MB at any input
size. Without ``--redis-url`` an embedded redis-server is started (and stopped).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from common import codec
from common.redis.server import RedisServer
from common.urls.canonical import canonicalize

TARGET_URLS_PER_S = 100_000
TARGET_RSS_MB = 100


def url_of(i: int) -> str:
    return f"https://site{i % 997}.example.com/articles/{i}/index.html?ref=bench&page={i % 13}"


def write_input(path: Path, lines: int, seed: int = 7) -> int:
    """Write ``lines`` URLs, every unique one twice; returns the number of unique URLs."""
    unique = lines // 2
    with path.open("w") as f:
        for start in range(0, unique, 100_000):
            f.write("".join(url_of(i) + "\n" for i in range(start, min(unique, start + 100_000))))
        rng = random.Random(seed)
        order = list(range(unique))
        rng.shuffle(order)
        for start in range(0, unique, 100_000):
            f.write("".join(url_of(i) + "\n" for i in order[start:start + 100_000]))
        if lines % 2:
            f.write(url_of(0) + "\n")
    return unique


def _peak_rss(pid: int) -> int:
    """VmHWM (the high-water mark of resident memory) of a live process, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class ProducerRun:
    wall_s: float
    cpu_s: float  # user + system CPU of the producer process
    redis_cpu_s: float  # user + system CPU of redis-server meanwhile
    peak_rss: int
    summary: dict[str, Any]


def _redis_cpu(client: redis.Redis) -> float:
    info = cast(dict[str, Any], client.info("cpu"))
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run_producer(redis_url: str, crawl: str, path: Path) -> ProducerRun:
    """Run the producer: wall and CPU time (its own and Redis's), peak RSS, JSON summary.

    The peak is the child's own VmHWM, sampled until it exits. (``ru_maxrss`` of a
    child is not used: Linux counts the parent's resident pages at fork time in it, so
    it reports this benchmark's memory, not the producer's.)
    """
    argv = [sys.executable, "-m", "producer", "--redis-url", redis_url, "--crawl", crawl,
            "--progress", "off", "--json", "--log-level", "WARNING", str(path)]
    client = redis.Redis.from_url(redis_url)
    redis_before = _redis_cpu(client)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, _peak_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"producer exited {proc.returncode}:\n{err.decode()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    redis_cpu = _redis_cpu(client) - redis_before
    client.close()
    return ProducerRun(wall, cpu, redis_cpu, peak,
                       codec.loads(out.decode().strip().splitlines()[-1]))


def sadd_rate(redis_url: str, path: Path, key: str, per_round_trip: int = 1000) -> float:
    """Fingerprints of the same input, SADDed one command per URL, pipelined."""
    fps = []
    with path.open() as f:
        for line in f:
            url = canonicalize(line)
            assert isinstance(url, str)
            fps.append(hashlib.blake2b(url.encode(), digest_size=16).digest())
    client = redis.Redis.from_url(redis_url)
    client.delete(key)
    started = time.perf_counter()
    for i in range(0, len(fps), per_round_trip):
        pipe = client.pipeline(transaction=False)
        for fp in fps[i:i + per_round_trip]:
            pipe.sadd(key, fp)
        pipe.execute()
    elapsed = time.perf_counter() - started
    client.delete(key)
    client.close()
    return len(fps) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--keep", action="store_true", help="keep the crawl's keys")
    parser.add_argument("--skip-sadd", action="store_true", help="measure the producer only")
    args = parser.parse_args()

    server = None if args.redis_url else RedisServer().start()
    redis_url = args.redis_url or (server.url if server else "")
    crawl = f"bench-{os.getpid()}-{int(time.time())}"
    try:
        with tempfile.TemporaryDirectory(prefix="crawlq-bench-") as tmp:
            path = Path(tmp) / "urls.txt"
            unique = write_input(path, args.lines)
            size_mb = path.stat().st_size / 1e6
            print(f"input: {args.lines:,} lines ({unique:,} unique), {size_mb:.0f} MB")

            run = run_producer(redis_url, crawl, path)
            summary, rss = run.summary, run.peak_rss
            inner = float(summary["elapsed_s"])
            e2e = args.lines / run.wall_s
            print(f"producer: enqueued {summary['enqueued']:,}, duplicates "
                  f"{summary['duplicates']:,}, invalid {summary['invalid']}")
            print(f"producer: {e2e:,.0f} URLs/s end to end (process wall {run.wall_s:.2f}s), "
                  f"{args.lines / inner:,.0f} URLs/s in the pipeline ({inner:.2f}s)")
            # On a shared machine wall time depends on the neighbours; CPU time does not.
            print(f"producer: {run.cpu_s:.2f} s CPU = {run.cpu_s / args.lines * 1e6:.2f} us/URL "
                  f"(one core: {args.lines / run.cpu_s:,.0f} URLs/s); redis-server "
                  f"{run.redis_cpu_s:.2f} s CPU = {run.redis_cpu_s / args.lines * 1e6:.2f} us/URL")
            print(f"producer: peak RSS {rss / 2**20:.1f} MiB")
            if not args.skip_sadd:
                rate = sadd_rate(redis_url, path, f"bench:sadd:{crawl}")
                print(f"raw Redis: {rate:,.0f} pipelined SADD/s of the same fingerprints")
                print(f"ratio: producer end to end / raw SADD = {e2e / rate:.2f}")
            ok_rate = e2e >= TARGET_URLS_PER_S
            ok_rss = rss < TARGET_RSS_MB * 2**20
            print(f"targets: >= {TARGET_URLS_PER_S:,} URLs/s {'met' if ok_rate else 'MISSED'}; "
                  f"RSS < {TARGET_RSS_MB} MB {'met' if ok_rss else 'MISSED'}")
            if not args.keep:
                client = redis.Redis.from_url(redis_url)
                keys = list(client.scan_iter(match=f"crawlq:{{{crawl}*", count=1000))
                for i in range(0, len(keys), 1000):
                    client.unlink(*keys[i:i + 1000])
                client.srem("crawlq:crawls", crawl)
                client.close()
            return 0 if ok_rate and ok_rss else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
