"""What ``--redis-wait-replicas`` costs: lease+ack with and without WAIT, side by side.

    python bench/replica_wait_bench.py [--tasks 20000] [--batches 500,20] [--workers 8]

Starts a redis-server primary and one replica on 127.0.0.1 (no persistence), and runs
the lease+ack loop of bench/queue_bench.py (``--workers`` coroutines of one process,
each leasing a batch and acking it) once on a plain client and once on a client whose
writes WAIT for the replica (``connect(..., wait_replicas=1)``), for each batch size.
Prints tasks/s of both and their ratio: a WAIT is a round trip to the replica per
state-changing call, so it costs most where calls are small.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

from queue_bench import bench_lease_ack, line

from common.redis.connection import connect
from common.redis.server import RedisServer


def in_sync(replica: RedisServer) -> None:
    client = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + 30
    while client.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise SystemExit("the replica did not sync")
        time.sleep(0.05)
    client.close()


async def rate(url: str, wait: int, tasks: int, batch: int, workers: int) -> float:
    client = connect(url, max_connections=64, wait_replicas=wait, wait_timeout_s=5.0)
    try:
        meter = await bench_lease_ack(client, tasks, batch, workers, 1)
    finally:
        await client.aclose()
    return tasks / meter.wall


async def run(args: argparse.Namespace) -> None:
    with RedisServer() as primary, RedisServer(extra_args=(
            "--replicaof", "127.0.0.1", str(primary.port))) as replica:
        in_sync(replica)
        print(f"replica WAIT bench: {args.tasks:,} tasks per run, {args.workers} coroutines, "
              "primary and one replica on loopback")
        for batch in args.batches:
            plain = await rate(primary.url, 0, args.tasks, batch, args.workers)
            waited = await rate(primary.url, 1, args.tasks, batch, args.workers)
            line(f"lease+ack, batch {batch}: no WAIT / WAIT 1",
                 f"{plain:>9,.0f} / {waited:>9,.0f} tasks/s  (x{waited / plain:.2f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                        default=[500, 20])
    parser.add_argument("--workers", type=int, default=8)
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
