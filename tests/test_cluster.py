"""One crawl over 8 partitions on a local 3-master Redis Cluster, with a consumer killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from sites import start_site_process

from common.queue import CrawlQueue, CrawlSettings, NewTask
from common.redis.connection import open_redis
from common.redis.server import RedisClusterServers
from common.urls.canonical import fingerprint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    with RedisClusterServers(masters=3) as servers:
        yield servers


@pytest.fixture
async def cluster_client(cluster: RedisClusterServers) -> AsyncIterator[aioredis.RedisCluster]:
    client = await open_redis(cluster.url)
    assert isinstance(client, aioredis.RedisCluster)
    try:
        yield client
    finally:
        await client.aclose()


def start_consumer(url: str, crawl: str, out: Path, worker: str,
                   lease: str = "60s") -> subprocess.Popen[bytes]:
    """A consumer in batch mode. Only the victim gets a short lease (its tasks come back
    soon after the kill): on a busy machine a 2 s lease of a live consumer can expire
    between heartbeats, and a task reclaimed past --max-stalls is dead `stalled`."""
    return subprocess.Popen(
        [sys.executable, "-m", "consumer", "--redis-url", url, "--crawl", crawl,
         "--output", str(out), "--worker-id", worker, "--exit-when-empty",
         "--empty-grace", "1", "--allow-private", "--ignore-robots", "--http-port", "-1",
         "--per-host-concurrency", "0", "--per-host-delay", "0", "--lease", lease,
         "--concurrency", "16", "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


async def test_crawl_over_8_partitions_survives_a_killed_consumer(
        cluster: RedisClusterServers, cluster_client: aioredis.RedisCluster,
        crawl_name: str, tmp_path: Path) -> None:
    async with start_site_process(delay_ms=15, hosts=96) as site:
        # A partition holds whole hosts: 96 loopback hosts spread the crawl over every
        # partition (one left empty: 8 * (7/8)^96, about 2e-5).
        urls = [site.url(f"/p/{i}", host=i % 96) for i in range(600)]
        queue = await CrawlQueue.open(cluster_client, crawl_name, CrawlSettings(partitions=8))
        result = await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
        assert result.enqueued == 600
        slots = {await cluster_client.cluster_keyslot(pk.due) for pk in queue.partitions}
        nodes = {cluster_client.get_node_from_key(pk.due).name for pk in queue.partitions}
        assert len(slots) == 8 and len(nodes) == 3  # the crawl really spans every shard

        victim = start_consumer(cluster.url, crawl_name, tmp_path / "a", "victim", lease="2s")
        survivor = start_consumer(cluster.url, crawl_name, tmp_path / "b", "survivor")
        procs = [victim, survivor]
        try:
            deadline = time.monotonic() + 30
            while (await queue.stats()).done < 200:
                assert time.monotonic() < deadline, "the crawl did not progress"
                await asyncio.sleep(0.05)
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)
            late = start_consumer(cluster.url, crawl_name, tmp_path / "c", "late")
            procs.append(late)
            for proc in (survivor, late):
                assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if proc.stderr:
                    proc.stderr.close()

    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.waiting) == (0, 0, 0)
    assert (stats.done, stats.dead) == (600, 0), stats.dead_reasons
    for pk in queue.partitions:  # every partition drained, and every one did work
        assert await cluster_client.get(pk.pending) in (None, b"0")
        assert await cluster_client.zcard(pk.leases) == 0
        assert int(await cluster_client.hget(pk.stats, "done") or 0) > 0
    states = {await queue.state_of(NewTask(u, fingerprint(u)).fp.hex()) for u in urls}
    assert states == {"done"}


async def test_a_crawl_of_6_partitions_splits_its_memory_evenly_over_3_primaries(
        cluster_client: aioredis.RedisCluster) -> None:
    """Each partition's hash tag is placed in its own sixth of the slots (keys.partition_tag),
    so a cluster made with equal slot ranges holds two partitions on each primary, and the
    crawl's memory splits in thirds. (Tags left where CRC16 throws them put this crawl's 6
    partitions 4, 1 and 1 on the primaries.)"""
    crawl = "memory-split"
    queue = await CrawlQueue.open(cluster_client, crawl, CrawlSettings(partitions=6))
    urls = [f"http://h{i % 600}.test/page/{i}?q={i * 7}" for i in range(30_000)]
    for i in range(0, len(urls), 1000):
        batch = urls[i:i + 1000]
        assert (await queue.enqueue([NewTask(u, fingerprint(u)) for u in batch])).enqueued \
            == len(batch)
    nodes = [cluster_client.get_node_from_key(pk.due).name for pk in queue.partitions]
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2, 2]
    used: dict[str, int] = {}
    for pk in queue.partitions:
        match = pk.prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        async for key in cluster_client.scan_iter(match=match, count=1000):
            node = cluster_client.get_node_from_key(key).name
            used[node] = used.get(node, 0) + (await cluster_client.memory_usage(key) or 0)
    shares = sorted(b / sum(used.values()) for b in used.values())
    assert len(shares) == 3 and shares[0] > 0.25 and shares[-1] < 0.42, shares
