"""A crawl that outlives its Redis failing over (docs/failover.md), against real servers:
replicas promoted, a Sentinel that fails over, replies lost after Redis ran the command.

- A call refused without running (READONLY of a replica) is tried again until a primary
  answers; a lease call whose reply was lost is answered, when sent again, with the
  leases the first one granted, never a second set; a script that is not safe to run
  twice is not sent again.
- Fencing tokens granted after a promotion are greater than every token the old
  primary granted, also the ones the promoted replica never saw.
- A client of a ``redis+sentinel://`` URL follows the Sentinel to the new primary.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis_binaries import pause, resume
from support.consume import NullSink
from support.failover import (
    MASTER,
    ReplicalessPrimary,
    ReplyCutter,
    cutting,
    force_failover,
    primary_port,
    replica_of,
    script_sha,
    sentinel,
    sentinel_binary,
)
from support.leases import lease_records
from support.live import snapshot

from common.observability.metrics import Metrics
from common.policy import read_policy, set_policy
from common.queue import Code, CrawlSettings, Failure, LeasingQueue, NewTask
from common.redis.connection import connect
from common.redis.errors import error_code
from common.redis.retry import did_not_run, resending
from common.redis.scripts import source
from common.redis.server import RedisServer, free_port
from common.urls.canonical import canonicalize, fingerprint
from consumer.completion import Completion, CompletionKind
from consumer.flush import Flusher
from consumer.held import LeaseBook
from consumer.intake import LinkIntake
from consumer.live import Live

pytestmark = pytest.mark.timeout(120)


def tasks(n: int, host: str = "failover.test") -> list[NewTask]:
    out = []
    for i in range(n):
        url = canonicalize(f"http://{host}/{i}")
        assert isinstance(url, str)
        out.append(NewTask(url, fingerprint(url)))
    return out


async def until(pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await pred():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def cutter(redis_server: RedisServer) -> AsyncIterator[ReplyCutter]:
    async with cutting(redis_server.port) as relay:
        yield relay


# -- calls whose reply was lost ------------------------------------------------------------


async def test_a_lease_sent_again_after_its_reply_was_lost_gets_the_same_leases(
        cutter: ReplyCutter, redis_client: aioredis.Redis, crawl_name: str) -> None:
    client = connect(cutter.url)
    try:
        q = await LeasingQueue.open(client, crawl_name, CrawlSettings())
        await q.enqueue(tasks(10))
        leases = await q.lease("w", 1, 30_000)  # the next call knows its hosts: one call
        cutter.cut_after(script_sha("lease"))
        leases += await q.lease("w", 3, 30_000)
        assert cutter.cuts == 1  # the call ran, its reply was lost, it was sent again
        assert await redis_client.exists(q.partitions[0].lease_op("w"))  # the kept reply
        assert len(leases) == 4
        held = await lease_records(redis_client, q.partitions[0])
        assert set(held) == {lease.id for lease in leases}  # no second set granted
        stats = await q.stats()
        assert (stats.counters["leased"], stats.pending) == (4, 6)
        assert await q.ack("w", [(lease, "ok") for lease in leases]) == [Code.OK] * 4
    finally:
        await client.aclose()


async def test_a_lease_that_got_no_answer_gives_its_leases_to_the_next_call(
        cutter: ReplyCutter, redis_client: aioredis.Redis, crawl_name: str) -> None:
    client = connect(cutter.url, retries=0)  # the client gives up: the caller tries again
    try:
        q = await LeasingQueue.open(client, crawl_name, CrawlSettings())
        await q.enqueue(tasks(10))
        first = await q.lease("w", 1, 30_000)  # the next call knows its hosts: one call
        cutter.cut_after(script_sha("lease"))
        with pytest.raises(RedisConnectionError):
            await q.lease("w", 3, 30_000)
        granted = set(await lease_records(redis_client, q.partitions[0])) - {first[0].id}
        assert len(granted) == 3
        again = await q.lease("w", 3, 30_000)
        assert {lease.id for lease in again} == granted
        assert set(await lease_records(redis_client, q.partitions[0])) == granted | {
            first[0].id}
    finally:
        await client.aclose()


async def loaded(name: str, redis_client: aioredis.Redis) -> None:
    """Script `name` loaded, so the relay cuts the reply of a call that ran (a call of an
    unloaded script is answered NOSCRIPT, never ran, and is sent again: any test)."""
    await redis_client.script_load(source(name))


async def test_an_ack_sent_again_counts_once(cutter: ReplyCutter, redis_client: aioredis.Redis,
                                             crawl_name: str) -> None:
    client = connect(cutter.url)
    try:
        q = await LeasingQueue.open(client, crawl_name, CrawlSettings())
        await q.enqueue(tasks(2))
        a, b = await q.lease("w", 2, 30_000)
        await loaded("ack", redis_client)
        cutter.cut_after(script_sha("ack"))
        # The first run acked it; the one sent again gets the codes that run kept.
        assert await q.ack("w", [(a, "ok")]) == [Code.OK]
        assert cutter.cuts == 1
        assert await q.ack("w", [(b, "ok"), (b, "ok")]) == [Code.OK, Code.UNKNOWN]
        stats = await q.stats()
        assert stats.counters["done"] == 2
        assert stats.counters["replayed"] == 1  # the second send ran the first's reply
        assert stats.leased == 0
    finally:
        await client.aclose()


def flusher_of(queue: LeasingQueue, metrics: Metrics) -> tuple[Flusher, LeaseBook]:
    book = LeaseBook(30.0, metrics)
    intake = LinkIntake(metrics, Live(snapshot(max_depth=0)), cache_size=0)
    return Flusher(queue, NullSink(), metrics, book, worker="w", batch=8, intake=intake,
                   on_freed=lambda turn: None), book


@pytest.mark.parametrize("kind", ["ack", "fail"])
async def test_a_replayed_ack_or_fail_counts_once_and_no_lease_as_lost(
        cutter: ReplyCutter, redis_client: aioredis.Redis, crawl_name: str,
        kind: str) -> None:
    """A flush whose ack (or fail) ran and lost its reply: sent again, by the client or
    by the flusher's own retry (the client gives up here), it is answered as the first
    run was, so the consumer counts the tasks done (failed) and no lease lost."""
    client = connect(cutter.url, retries=0)
    try:
        q = await LeasingQueue.open(client, crawl_name, CrawlSettings())
        await q.enqueue(tasks(3))
        leases = await q.lease("w", 3, 30_000)
        metrics = Metrics()
        flush, book = flusher_of(q, metrics)
        for lease in leases:
            book.hold(lease, time.monotonic())
            flush.add(Completion(lease, CompletionKind.ACK) if kind == "ack" else Completion(
                lease, CompletionKind.FAIL,
                failure=Failure(lease, "gone", "no page", permanent=True)))
        await loaded(kind, redis_client)
        cutter.cut_after(script_sha(kind))
        await asyncio.wait_for(flush.flush(), 30)
        assert cutter.cuts == 1
        assert metrics.leases_lost_total._value.get() == 0
        assert (flush.done, flush.failed) == ((3, 0) if kind == "ack" else (0, 3))
        stats = await q.stats()
        assert stats.counters["replayed"] == 1
        assert (stats.done, stats.dead) == ((3, 0) if kind == "ack" else (0, 3))
        assert stats.counters.get("stale", 0) == 0
    finally:
        await client.aclose()


async def test_a_call_not_safe_to_run_twice_is_not_sent_again(
        cutter: ReplyCutter, redis_client: aioredis.Redis, crawl_name: str) -> None:
    client = connect(cutter.url)
    key = f"crawlq:{{{crawl_name}}}:counter"
    try:
        cutter.cut_after(key.encode())
        with resending(False), pytest.raises(RedisConnectionError):
            await client.incr(key)
        assert cutter.cuts == 1
        assert await redis_client.get(key) == b"1"  # it ran once, and only once
    finally:
        await redis_client.delete(key)
        await client.aclose()


async def test_a_script_not_safe_to_run_twice_is_not_sent_again(
        cutter: ReplyCutter, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """policy_set is classified `once` (common/redis/resend.py): its reply lost, the client
    raises instead of sending it again, and it ran once (one version, one log entry)."""
    client = connect(cutter.url)
    try:
        await loaded("policy_set", redis_client)
        cutter.cut_after(script_sha("policy_set"))
        with pytest.raises(RedisConnectionError):
            await set_policy(client, crawl_name, {"per_host_delay": 0.5}, by="test",
                             create=True)
        assert cutter.cuts == 1
        stored = await read_policy(redis_client, crawl_name, log_limit=10)
        assert stored is not None and stored.version == 1 and len(stored.log) == 1
    finally:
        await client.aclose()


# -- a replica promoted --------------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer().start()
    replica = None
    try:
        replica = replica_of(primary)
        yield primary, replica
    finally:
        for server in (replica, primary):
            if server is not None:
                resume(server)
                server.stop()


async def test_a_write_a_replica_refused_is_tried_again_until_it_is_promoted(
        pair: tuple[RedisServer, RedisServer], crawl_name: str) -> None:
    primary, replica = pair
    writer, reader = connect(primary.url), connect(replica.url, retries=8)
    admin = aioredis.Redis.from_url(replica.url)
    try:
        q = await LeasingQueue.open(writer, crawl_name, CrawlSettings())
        await q.enqueue(tasks(5))
        assert await writer.execute_command("WAIT", 1, 5000) == 1
        on_replica = await LeasingQueue.existing(reader, crawl_name)
        errors_before = (await admin.info("stats"))["total_error_replies"]
        leasing = asyncio.ensure_future(on_replica.lease("w", 2, 30_000))
        writing = asyncio.ensure_future(reader.hset(f"crawlq:{{{crawl_name}}}:x", "a", "1"))

        async def refused() -> bool:
            return (await admin.info("stats"))["total_error_replies"] > errors_before + 1

        await until(refused, 30, "the replica refused the lease and the write (READONLY)")
        # Refused, not given up: they are tried again.
        assert not leasing.done() and not writing.done()
        await admin.execute_command("REPLICAOF", "NO", "ONE")
        leases = await asyncio.wait_for(leasing, 30)
        assert len(leases) == 2
        assert (await on_replica.stats()).leased == 2
        assert await asyncio.wait_for(writing, 30) == 1
    finally:
        for c in (writer, reader, admin):
            await c.aclose()


@pytest.mark.integration
async def test_a_primary_without_its_replicas_refuses_and_is_tried_again(
        crawl_name: str) -> None:
    """min-replicas-to-write (the docs' guard against split brain): NOREPLICAS means the
    call did not run; it is tried again, and goes through once a replica is back."""
    async with ReplicalessPrimary() as lonely:
        await lonely.setup.config_set("min-replicas-to-write", 0)  # the crawl is created first
        q = await LeasingQueue.open(lonely.client, crawl_name, CrawlSettings())
        await q.enqueue(tasks(3))
        await lonely.setup.config_set("min-replicas-to-write", 1)
        errors_before = await lonely.error_replies()
        leasing = asyncio.ensure_future(q.lease("w", 2, 30_000))

        async def refused() -> bool:
            return await lonely.error_replies() > errors_before

        await until(refused, 30, "the primary refused the lease (NOREPLICAS)")
        assert not leasing.done()
        await lonely.add_replica()
        assert len(await asyncio.wait_for(leasing, 30)) == 2


@pytest.mark.integration
async def test_a_pipelined_enqueue_a_primary_refused_is_tried_again(crawl_name: str) -> None:
    """redis-py's pipeline rewrites a command's error ("Command # 1 (EVALSHA ...) of
    pipeline caused error: NOREPLICAS ..."): the refusal is still seen as one that did not
    run, tried again, and goes through once a replica is back (a producer's enqueue
    across partitions is a pipeline)."""
    async with ReplicalessPrimary() as lonely:
        await lonely.setup.config_set("min-replicas-to-write", 0)
        q = await LeasingQueue.open(lonely.client, crawl_name, CrawlSettings(partitions=4))
        await lonely.setup.config_set("min-replicas-to-write", 1)
        errors_before = await lonely.error_replies()
        enqueuing = asyncio.ensure_future(q.enqueue(tasks(40)))

        async def refused() -> bool:
            return await lonely.error_replies() > errors_before

        await until(refused, 30, "the primary refused the enqueue (NOREPLICAS)")
        assert not enqueuing.done()
        await lonely.add_replica()
        await asyncio.wait_for(enqueuing, 30)
        assert (await q.stats()).pending == 40


@pytest.mark.parametrize("text", [
    "NOREPLICAS Not enough good replicas to write.",
    "Command # 1 (EVALSHA 5e2f 3 a b c) of pipeline caused error: NOREPLICAS Not enough "
    "good replicas to write.",
    "Command # 2 (EVALSHA x) of pipeline caused error: Error running script (call to "
    "f_x): @user_script:9: -NOREPLICAS Not enough good replicas to write."])
def test_a_refusal_is_read_through_a_pipelines_and_a_scripts_wrapping(text: str) -> None:
    assert error_code(text) == "NOREPLICAS"
    assert did_not_run(ResponseError(text))


@pytest.mark.integration
def test_a_producer_refused_for_want_of_replicas_says_so_in_one_line(
        tmp_path: Path, crawl_name: str) -> None:
    """A primary that refuses every write (NOREPLICAS: no replica in sight) ends a
    producer run with one line saying so and exit 3, not a traceback."""
    primary = RedisServer(extra_args=("--min-replicas-to-write", "1")).start()
    try:
        seeds = tmp_path / "seeds.txt"
        seeds.write_text("".join(f"http://h{n}.test/p\n" for n in range(20)))
        proc = subprocess.run(
            [sys.executable, "-m", "producer", "--redis-url", primary.url, "--crawl",
             crawl_name, "--progress", "off", "--redis-wait", "1s", str(seeds)],
            check=False, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert "Traceback" not in proc.stderr
        assert len(lines) == 1 and "NOREPLICAS" in lines[0], proc.stderr
    finally:
        primary.stop()


async def test_tokens_after_a_promotion_pass_the_ones_the_replica_never_saw(
        pair: tuple[RedisServer, RedisServer], crawl_name: str) -> None:
    primary, replica = pair
    old, new = connect(primary.url, retries=0), connect(replica.url)
    try:
        q = await LeasingQueue.open(old, crawl_name, CrawlSettings())
        await q.enqueue(tasks(20))
        before = await q.lease("w1", 4, 30_000)
        assert await old.execute_command("WAIT", 1, 5000) == 1
        # The replication link is cut (the replica follows a server that isn't there):
        # what the primary grants now, the replica never sees.
        await new.execute_command("REPLICAOF", "127.0.0.1", free_port())
        lost = await q.lease("w1", 4, 30_000)
        primary.kill()
        await new.execute_command("REPLICAOF", "NO", "ONE")
        promoted = await LeasingQueue.existing(new, crawl_name)
        assert (await promoted.stats()).leased == 4  # the last grants are lost
        after = await promoted.lease("w2", 4, 30_000)
        assert len(after) == 4
        granted_before = [lease.fence for lease in (*before, *lost)]
        assert min(lease.fence for lease in after) > max(granted_before)
        assert all(0 < lease.fence < 2**63 for lease in (*before, *lost, *after))
        # The old leases are fenced on the new primary: theirs are other tokens.
        assert await promoted.ack("w1", [(lost[0], "ok")]) != [Code.OK]
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_token_starts_past_redis_time_in_microseconds(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """token = max(seq, Redis TIME ms x 1000) + 1 (docs/failover.md): a primary promoted
    a few milliseconds after the old one's last grant starts past every token it gave,
    however many that one gave in its last millisecond (up to 1,000)."""
    def micros(t: tuple[int, int]) -> int:
        return t[0] * 1_000_000 + t[1]

    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    await q.enqueue(tasks(3))
    before = micros(await redis_client.time())
    leases = await q.lease("w", 3, 30_000)
    after = micros(await redis_client.time())
    assert len(leases) == 3
    for lease in leases:
        assert before - 1000 < lease.fence <= after + len(leases), (before, lease.fence)


async def test_writes_wait_for_replicas_when_asked(
        pair: tuple[RedisServer, RedisServer], crawl_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    primary, replica = pair
    client = connect(primary.url, wait_replicas=1, wait_timeout_s=0.5)
    admin = aioredis.Redis.from_url(primary.url, decode_responses=True)

    async def waits() -> int:
        return int((await admin.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0))

    try:
        q = await LeasingQueue.open(client, crawl_name, CrawlSettings(partitions=2))
        before = await waits()
        await q.enqueue(tasks(4, "a.test") + tasks(4, "b.test"))  # a pipeline, then WAIT
        leases = await q.lease("w", 4, 30_000)  # single calls, each then WAIT
        assert await q.ack("w", [(leases[0], "ok")]) == [Code.OK]
        assert await waits() - before >= 3
        stats = await q.stats()
        on_replica = aioredis.Redis.from_url(replica.url)
        done = await on_replica.hget(q.partitions[leases[0].partition].stats, "done")
        await on_replica.aclose()
        assert done == b"1"  # the replica has it when the ack returns
        pause(replica)  # no replica answers: the call waits its timeout, and stands
        started = time.monotonic()
        assert await q.ack("w", [(leases[1], "ok")]) == [Code.OK]
        assert time.monotonic() - started >= 0.4
        assert any(r.message == "redis_wait_short" for r in caplog.records)
        assert (await q.stats()).counters["done"] == stats.counters["done"] + 1
    finally:
        resume(replica)
        await client.aclose()
        await admin.aclose()


# -- Sentinel ------------------------------------------------------------------------------


async def test_a_sentinel_url_follows_a_failover(pair: tuple[RedisServer, RedisServer],
                                                 crawl_name: str) -> None:
    binary = sentinel_binary()
    if binary is None:
        pytest.skip("redis-sentinel is not installed (.ci/run installs it)")
    primary, replica = pair
    with sentinel(binary, primary) as port:
        client = connect(f"redis+sentinel://127.0.0.1:{port}/{MASTER}/0")
        try:
            q = await LeasingQueue.open(client, crawl_name, CrawlSettings())
            await q.enqueue(tasks(6))
            first = await q.lease("w", 2, 30_000)
            assert await client.execute_command("WAIT", 1, 5000) == 1
            force_failover(port)

            async def moved() -> bool:
                return primary_port(port) == replica.port

            await until(moved, 30, "the Sentinel names the replica")

            async def on_the_new_primary() -> bool:
                await q.ack("w", [(first[0], "ok")]) if first else None
                return (await client.config_get("port"))["port"] == str(replica.port)

            await until(on_the_new_primary, 10, "the client talks to the new primary")
            # An ack the old primary took in its last moment is lost with it (the loop's
            # last one may have gone there before the read above came from the new one):
            # once more, now on the new primary (a second ack of a done task is no-op).
            await q.ack("w", [(first[0], "ok")])
            more = await q.lease("w", 2, 30_000)
            assert len(more) == 2
            assert min(x.fence for x in more) > max(x.fence for x in first)
            assert (await q.stats()).leased == 3  # first[1] and the two new ones
        finally:
            await client.aclose()
