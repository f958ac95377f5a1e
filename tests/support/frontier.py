"""A crawl's frontier as the tests set it up and lease from it: tasks for URLs, a queue
with the crawl's politeness defaults, a lease that waits for a host's turn, and the host
records (read, and changed as a test sets one up)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import redis.asyncio as aioredis

from common.frontier.hosts import Frontier
from common.hostmodel.hostrec import HostRecord
from common.keys import PartitionKeys
from common.queue import CrawlSettings, Lease, LeasingQueue, NewTask
from common.urls.canonical import fingerprint


def tasks(urls: list[str], **kw: int) -> list[NewTask]:
    return [NewTask(u, fingerprint(u), **kw) for u in urls]  # type: ignore[arg-type]


async def lease_when_due(q: LeasingQueue, worker: str, n: int, lease_ms: int,
                         within: float = 10.0) -> list[Lease]:
    """Lease until something is granted: a host's turn comes on Redis' clock, which a
    wall-clock sleep only approximates."""
    deadline = time.monotonic() + within
    while not (got := await q.lease(worker, n, lease_ms)):
        assert time.monotonic() < deadline, f"nothing leased within {within:g}s"
        await asyncio.sleep(0.01)
    return got


async def polite_queue(client: aioredis.Redis, crawl: str, *, delay_s: float = 0.0,
                       concurrency: int = 0, partitions: int = 1) -> LeasingQueue:
    q = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=partitions))
    await Frontier(q).set_defaults(delay_s=delay_s, concurrency=concurrency)
    return q


async def host_records(client: aioredis.Redis, pk: PartitionKeys) -> dict[str, HostRecord]:
    """Every host record of a partition (the ``hosts`` HASH), decoded."""
    return {h.decode(): HostRecord.decode(v) for h, v in (await client.hgetall(pk.hosts)).items()}


async def host_record(client: aioredis.Redis, pk: PartitionKeys, host: str) -> HostRecord:
    """One host's record (all defaults for a host never seen)."""
    return HostRecord.decode(await client.hget(pk.hosts, host))


async def put_record(client: aioredis.Redis, pk: PartitionKeys, host: str,
                     **changes: int | None) -> HostRecord:
    """Change fields of a host's record as a test sets them up (what no script does)."""
    record = replace(await host_record(client, pk, host), **changes)  # type: ignore[arg-type]
    await client.hset(pk.hosts, host, record.encode())
    return record
