"""Every ``crawlq`` subcommand against a real crawl built with CrawlQueue (real Redis)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from common.cli import main_async
from common.demo.site import sample_site
from common.history import rates
from common.keys import CRAWLS, CrawlKeys
from common.queue import CrawlQueue, CrawlSettings, Failure, NewTask
from common.redis_server import free_port
from common.urls import fingerprint
from common.workers import WorkerRegistry


@dataclass
class Crawl:
    name: str
    queue: CrawlQueue
    done: list[str]
    dead_5xx: list[str]
    dead_loop: list[str]


async def build_crawl(client: aioredis.Redis, name: str, partitions: int = 2) -> Crawl:
    """12 tasks: 4 done, 2 dead (http_5xx), 1 dead (redirect_loop), 5 pending."""
    queue = await CrawlQueue.open(client, name, CrawlSettings(partitions=partitions))
    urls = [f"https://cli.example/{i}" for i in range(12)]
    result = await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    assert result.enqueued == 12
    leases = []
    while len(leases) < 7:
        leases += await queue.lease("w1", 7 - len(leases), 60_000)
    await queue.ack("w1", [(lease, "ok") for lease in leases[:4]])
    await queue.fail("w1", [Failure(lease, "http_5xx", "HTTP 503", permanent=True)
                            for lease in leases[4:6]])
    await queue.fail("w1", [Failure(leases[6], "redirect_loop", "loop", permanent=True)])
    return Crawl(name, queue, [x.id for x in leases[:4]], [x.id for x in leases[4:6]],
                 [leases[6].id])


async def crawlq(redis_url: str, *args: str) -> int:
    return await main_async([*args, "--redis-url", redis_url, "--cluster", "no"])


async def keys_of(client: aioredis.Redis, name: str) -> set[bytes]:
    """Every key of one crawl, found independently of the code under test."""
    own = re.compile(rb"^crawlq:\{" + re.escape(name.encode()) + rb"(:\d+)?\}:")
    return {k async for k in client.scan_iter(match="crawlq:*", count=10_000)
            if own.match(k)}


@pytest.fixture
async def crawl(redis_client: aioredis.Redis, crawl_name: str) -> Crawl:
    return await build_crawl(redis_client, crawl_name)


async def test_stats_text_and_json(redis_url: str, redis_client: aioredis.Redis, crawl: Crawl,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert f"crawl {crawl.name} (partitions 2, dedup exact)" in out
    for state, n in (("pending", 5), ("leased", 0), ("waiting", 0), ("dead", 3), ("done", 4)):
        assert f"  {state:<8} {n:>10,}" in out
    assert "rates: n/a" in out
    assert "dead letters by reason: http_5xx 2, redirect_loop 1" in out
    assert "live workers: 0" in out

    now = time.time()
    history = CrawlKeys.build(crawl.name).history
    for t, done in ((now - 90, 0), (now - 60, 30), (now, 150)):  # LPUSH: newest ends first
        await redis_client.lpush(history, json.dumps({"t": t, "done": done, "failed": 3}))
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["states"] == {"pending": 5, "leased": 0, "waiting": 0, "dead": 3, "done": 4}
    assert doc["dead_reasons"] == {"http_5xx": 2, "redirect_loop": 1}
    assert doc["counters"]["enqueued"] == 12
    assert doc["settings"] == {"partitions": 2, "dedup": "exact"}
    assert doc["rates"] == {"window_s": 60.0, "done_per_s": 2.0, "failed_per_s": 0.0}
    assert doc["workers"] == 0

    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    assert "rates (last 60s): done 2.0/s, failed 0.0/s" in capsys.readouterr().out


def test_rates_edge_cases() -> None:
    assert rates([]) is None
    assert rates([{"t": 10, "done": 5}]) is None
    assert rates([{"t": 10, "done": 5}, {"t": 10, "done": 1}]) is None  # no time passed
    # Fewer than 60 s of history: the oldest snapshot is the base.
    assert rates([{"t": 30, "done": 50}, {"t": 20, "done": 10}, {"t": 10, "done": 0}]) == {
        "window_s": 20.0, "done_per_s": 2.5}


async def test_stats_of_an_unknown_crawl_is_a_usage_error(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "stats", "--crawl", "no-such-crawl") == 2
    assert "no crawl named 'no-such-crawl'" in capsys.readouterr().err


async def test_workers_lists_live_ones_with_ages_on_the_redis_clock(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl,
        capsys: pytest.CaptureFixture[str]) -> None:
    registry = WorkerRegistry(redis_client, crawl.name, "w-live", ttl_s=30)
    await registry.beat(in_flight=17, done=120, failed=3, state="running")
    keys = CrawlKeys.build(crawl.name)
    await redis_client.zadd(keys.workers, {"w-gone": 1})  # a ghost: no hash
    assert await crawlq(redis_url, "workers", "--crawl", crawl.name, "--json") == 0
    [w] = json.loads(capsys.readouterr().out)
    assert (w["id"], w["in_flight"], w["done"], w["failed"], w["state"]) == (
        "w-live", 17, 120, 3, "running")
    assert w["pid"] == os.getpid() and w["host"] == socket.gethostname()
    assert 0 <= w["heartbeat_age_s"] < 5 and w["stale"] is False
    # Readers never write: the ghost goes at the next heartbeat of any worker.
    assert await redis_client.zscore(keys.workers, "w-gone") is not None
    await registry.beat(in_flight=0, done=130, failed=3, state="running")
    assert await redis_client.zrange(keys.workers, 0, -1) == [b"w-live"]

    assert await crawlq(redis_url, "workers", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert "w-live" in out and str(os.getpid()) in out and "(late)" not in out
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    assert "live workers: 1" in capsys.readouterr().out


async def test_dead_ls_filters_and_limits(redis_url: str, crawl: Crawl,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--json") == 0
    dead = json.loads(capsys.readouterr().out)
    assert sorted(d["id"] for d in dead) == sorted(crawl.dead_5xx + crawl.dead_loop)
    assert all(d["url"].startswith("https://cli.example/") for d in dead)
    assert {d["reason"] for d in dead} == {"http_5xx", "redirect_loop"}

    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--reason",
                        "http_5xx", "--json") == 0
    assert sorted(d["id"] for d in json.loads(capsys.readouterr().out)) == sorted(
        crawl.dead_5xx)
    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--limit", "1",
                        "--json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 1

    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 3 and "redirect_loop" in out and "HTTP 503" in out


async def test_dead_requeue_by_id_and_by_reason(redis_url: str, crawl: Crawl,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    q = crawl.queue
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name,
                        crawl.dead_loop[0]) == 0
    assert "requeued 1 of 1" in capsys.readouterr().out
    assert await q.state_of(crawl.dead_loop[0]) == "pending"

    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name,
                        "--reason", "http_5xx") == 0
    assert "requeued 2 of 2" in capsys.readouterr().out
    assert [await q.state_of(i) for i in crawl.dead_5xx] == ["pending", "pending"]
    assert (await q.stats()).dead == 0

    # Nothing chosen, two choices, or a bad id: usage errors.
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name) == 2
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name, "--all",
                        "--reason", "x") == 2
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name, "zz") == 2


async def test_dead_purge_needs_yes(redis_url: str, crawl: Crawl,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    q = crawl.queue
    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--all") == 2
    assert "would purge 3 dead tasks" in capsys.readouterr().err
    assert (await q.stats()).dead == 3

    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--reason",
                        "redirect_loop", "--yes") == 0
    assert "purged 1 of 1" in capsys.readouterr().out
    assert await q.state_of(crawl.dead_loop[0]) == "done"  # body gone, seen mark kept
    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--all",
                        "--yes") == 0
    assert "purged 2 of 2" in capsys.readouterr().out
    s = await q.stats()
    assert (s.dead, s.dead_reasons.get("http_5xx", 0), s.pending) == (0, 0, 5)


async def test_crawls_lists_each_with_sizes(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = await CrawlQueue.open(redis_client, crawl_name + "-b")
    await other.enqueue([NewTask("https://b.example/", fingerprint("https://b.example/"))])
    assert await crawlq(redis_url, "crawls", "--json") == 0
    rows = {r["crawl"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[crawl.name]["states"] == {"pending": 5, "leased": 0, "waiting": 0, "dead": 3,
                                          "done": 4}
    assert rows[crawl.name]["enqueued"] == 12
    assert rows[crawl_name + "-b"]["states"]["pending"] == 1
    assert await crawlq(redis_url, "crawls") == 0
    out = capsys.readouterr().out
    assert crawl.name in out and crawl_name + "-b" in out


async def test_reset_deletes_one_crawl_and_nothing_else(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A crawl whose name extends this one's, and one with glob characters in its name.
    survivors = [await build_crawl(redis_client, crawl_name + "x", partitions=3),
                 await build_crawl(redis_client, crawl_name + "*", partitions=1)]
    await redis_client.set("unrelated:key", b"1")

    before = {s.name: await keys_of(redis_client, s.name) for s in survivors}
    assert all(before.values())
    assert await keys_of(redis_client, crawl.name)

    assert await crawlq(redis_url, "reset", "--crawl", crawl.name) == 2
    assert "would delete" in capsys.readouterr().err
    assert await keys_of(redis_client, crawl.name)

    assert await crawlq(redis_url, "reset", "--crawl", crawl.name, "--yes") == 0
    assert "deleted" in capsys.readouterr().out
    assert await keys_of(redis_client, crawl.name) == set()
    assert not await redis_client.sismember(CRAWLS, crawl.name)
    for s in survivors:
        assert await keys_of(redis_client, s.name) == before[s.name]
        assert await redis_client.sismember(CRAWLS, s.name)
        assert (await s.queue.stats()).pending == 5
    assert await redis_client.get("unrelated:key") == b"1"


async def test_check(redis_url: str, crawl: Crawl, capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "check", "--crawl", crawl.name) == 0
    assert capsys.readouterr().out.startswith("ok: Redis at")
    closed = f"redis://127.0.0.1:{free_port()}/0"
    assert await crawlq(closed, "check", "--timeout", "2s") == 1
    out = capsys.readouterr().out
    assert out.startswith("unhealthy: cannot reach Redis at") and out.count("\n") == 1

    async with sample_site(pages=5) as base:
        assert await crawlq(redis_url, "check", "--http-url", f"{base}/page/1") == 0
        assert await crawlq(redis_url, "check", "--http-url", f"{base}/missing/0") == 1
        assert "HTTP 404" in capsys.readouterr().out
    assert await crawlq(redis_url, "check", "--http-url",
                        f"http://127.0.0.1:{free_port()}/healthz") == 1


async def test_unreachable_redis_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    assert await crawlq(closed, "stats", "--crawl", "x") == 3
    assert "cannot reach Redis at" in capsys.readouterr().err


async def test_stats_watch_redraws_until_ctrl_c(redis_url: str, crawl: Crawl) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from common.cli import main; sys.exit(main())",
        "stats", "--watch", "--crawl", crawl.name, "--redis-url", redis_url, "--cluster", "no",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readuntil(b"Ctrl-C quits"), 20)
    assert first.startswith(b"\x1b[H\x1b[J") and b"pending" in first
    proc.send_signal(signal.SIGINT)
    await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0
