"""Servers that push back, and the crawl's policy as the only limit (issue 24).

A consumer started with default flags must serve what the crawl's policy allows: its own
``--per-host-concurrency`` only seeds a new policy, so nothing in the process (its
connection pool) may narrow it, and time a request waits locally never counts as the
server's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.clock import redis_ms
from support.consume import enqueue, records
from support.frontier import host_record, lease_when_due, tasks
from support.routes import hanging, page, serve

from common.frontier.hosts import Frontier
from common.hostmodel.hostrec import HostRecord
from common.keys import PartitionKeys
from common.policy import (
    PUSHBACK_OUTCOMES,
    create_policy,
    is_pushback,
    pushback_outcomes,
    set_policy,
)
from common.queue import Code, Failure, Lease, LeasingQueue, RetryPolicy
from consumer.config import build_parser, settings_from_args
from consumer.wiring import run


def default_consumer_args(redis_url: str, crawl: str, out: Path, *extra: str) -> list[str]:
    """A consumer with the policy's per-host flags left at their defaults (2 in flight,
    1 s apart): only what a test needs to reach its local site and stop when done."""
    return ["--redis-url", redis_url, "--crawl", crawl, "--output", str(out),
            "--exit-when-empty", "--empty-grace", "0", "--allow-private",
            "--http-port", "-1", *extra]


async def consume_defaults(redis_url: str, crawl: str, out: Path, *extra: str,
                           limit_s: float = 60) -> int:
    settings = settings_from_args(build_parser().parse_args(
        default_consumer_args(redis_url, crawl, out, *extra)))
    return await asyncio.wait_for(run(settings), limit_s)


async def test_a_default_consumer_serves_the_policys_concurrency(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """Policy: 8 in flight per host, no delay; the consumer's flag default is 2. The server
    sees 8 requests at once."""
    in_flight = peak = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.4)
        finally:
            in_flight -= 1
        return web.Response(text="ok")

    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": 0.0, "per_host_concurrency": 8,
                         "ignore_robots": True}, by="test")
    async with serve({"/s/{i}": slow}) as site:
        await enqueue(redis_client, crawl_name, [site.url(f"/s/{i}") for i in range(24)])
        assert await consume_defaults(redis_url, crawl_name, tmp_path) == 0
    assert peak == 8
    assert sorted(r["outcome"] for r in records(tmp_path)) == ["ok"] * 24


async def test_hanging_routes_make_no_other_task_of_their_host_die_unsent(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """Politeness off in the policy, default consumer flags: four routes that hang past
    the fetch's timeout hold four requests; every other page of the host is sent and
    answered, and a permanent outcome (a body over the cap) is reached on its first
    attempt."""
    sent: dict[str, int] = {}

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="late")

    async def fast(request: web.Request) -> web.Response:
        sent[request.path] = sent.get(request.path, 0) + 1
        await asyncio.sleep(0.05)
        return web.Response(text="ok")

    async def huge(request: web.Request) -> web.Response:
        sent[request.path] = sent.get(request.path, 0) + 1
        return web.Response(body=b"x" * 4096)

    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": 0.0, "per_host_concurrency": 0,
                         "ignore_robots": True, "retry_base": 0.05, "retry_cap": 0.05},
                        by="test")
    async with serve({"/hang/{i}": hang, "/fast/{i}": fast, "/huge": huge}) as site:
        urls = [site.url(f"/hang/{i}") for i in range(4)]
        urls += [site.url(f"/fast/{i}") for i in range(40)]
        urls.append(site.url("/huge"))
        await enqueue(redis_client, crawl_name, urls, max_attempts=2)
        code = await consume_defaults(redis_url, crawl_name, tmp_path, "--timeout", "1.5s",
                                      "--max-body-bytes", "1024", "--concurrency", "16")
        assert code == 0
    outcomes: dict[str, Any] = {r["url"].rsplit("/", 2)[-2]: r["outcome"]
                                for r in records(tmp_path) if "/fast/" in r["url"]}
    assert set(outcomes.values()) == {"ok"} and len(sent) == 41
    assert all(n == 1 for n in sent.values()), "a page was asked for twice"
    pk = PartitionKeys.build(crawl_name, 0)
    dead = await redis_client.zrange(pk.dead, 0, -1)
    errors = await redis_client.hgetall(pk.errors)
    reasons = sorted(errors[i].decode().split()[0] for i in dead)
    assert reasons == ["body_too_large"] + ["timeout"] * 4


def test_backoff_on_counts_an_opt_in_outcome_only_when_named() -> None:
    """429 and 503 by default; 5xx, 408, a timeout and a refused connection only when
    backoff_on names them."""
    default = pushback_outcomes("429,503")
    every = pushback_outcomes(",".join(PUSHBACK_OUTCOMES))
    cases = [("http_429", 429), ("http_503", 503), ("http_500", 500), ("http_502", 502),
             ("http_408", 408), ("timeout", None), ("connect_error", None)]
    assert [is_pushback(default, r, s) for r, s in cases] == [True, True] + [False] * 5
    assert [is_pushback(every, r, s) for r, s in cases] == [True] * 7
    assert is_pushback(pushback_outcomes("5xx"), "http_502", 502)
    assert not is_pushback(pushback_outcomes("5xx"), "http_429", 429)
    assert is_pushback(pushback_outcomes("408"), "http_408", 408)
    assert is_pushback(pushback_outcomes("timeout"), "timeout", None)
    assert not is_pushback(pushback_outcomes("timeout"), "connect_error", None)
    assert is_pushback(pushback_outcomes("connect_error"), "connect_error", None)
    assert not is_pushback(every, "http_404", 404)


async def test_a_timeout_named_in_backoff_on_blocks_its_host(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """backoff_on=timeout: a route that hangs past the fetch's timeout pushes its host
    back, fleet-wide: blocked for backoff_base at level 1."""
    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": 0.0, "ignore_robots": True, "backoff_on": ("timeout",),
                         "backoff_base": 600.0, "backoff_cap": 600.0}, by="test")
    async with serve({"/hang": hanging(asyncio.Event(), "late")}) as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/hang")], max_attempts=1)
        code = await consume_defaults(redis_url, crawl_name, tmp_path, "--timeout", "1s")
        assert code == 0
        host = site.base.removeprefix("http://")
    conf = await host_record(redis_client, queue.partitions[0], host)
    assert (conf.level, conf.pushbacks) == (1, 1)
    assert conf.blocked - await redis_ms(redis_client) > 500_000
    assert (await queue.stats()).counters["backoffs"] == 1


# -- the backoff, fleet-wide, in the scripts (lib/backoff.lua) ----------------------------

FOREVER_MS = 600_000


async def two_consumers(client: aioredis.Redis, crawl: str, **policy: int
                        ) -> tuple[LeasingQueue, LeasingQueue]:
    """Two consumers' queues on one crawl, politeness off, their backoff from `policy`
    (RetryPolicy's fields) and jitter 0.5: a block is exactly base * 2^(level-1)."""
    retry = RetryPolicy(base_ms=60_000, **policy)
    first = await LeasingQueue.open(client, crawl, retry=retry, jitter=lambda: 0.5)
    await Frontier(first).set_defaults(delay_s=0, concurrency=0)
    second = await LeasingQueue.existing(client, crawl, retry=retry, jitter=lambda: 0.5)
    return first, second


async def host_conf(q: LeasingQueue, host: str) -> HostRecord:
    return await host_record(q.client, q.partitions[0], host)


async def push_back(q: LeasingQueue, worker: str, retry_after: float | None = None
                    ) -> tuple[int, HostRecord]:
    """Lease one a.test task when its turn comes and fail it as a 429: the block's length
    (ms from the fail) and the host's settings after."""
    [lease] = await lease_when_due(q, worker, 1, 60_000)
    before = await redis_ms(q.client)
    await q.fail(worker, [Failure(lease, "http_429", "slow down", retry_after=retry_after,
                                  pushback=True)])
    conf = await host_conf(q, "a.test")
    assert conf.blocked  # 0: not blocked
    return conf.blocked - before, conf


async def test_the_backoff_grows_caps_and_is_shared_by_two_consumers(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    one, two = await two_consumers(redis_client, crawl_name, backoff_base_ms=100,
                                   backoff_cap_ms=350, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(8)]
                            + ["http://b.test/"]))
    blocks, levels = [], []
    for i in range(4):
        mine, other = (one, two) if i % 2 == 0 else (two, one)
        block, conf = await push_back(mine, f"w{i % 2}")
        blocks.append(block)
        levels.append(conf.level)
        # The other consumer is refused a.test at once, served b.test.
        assert {x.host for x in await other.lease(f"w{1 - i % 2}", 5, 60_000)} <= {"b.test"}
    assert levels == [1, 2, 3, 4]
    for got, want in zip(blocks, [100, 200, 350, 350], strict=True):
        assert want - 5 <= got <= want + 50, blocks  # + the fail call's round trip
    row = await Frontier(one).host("a.test")
    assert row is not None and (row.backoff_level, row.pushbacks) == (4, 4)
    assert (await one.stats()).counters["backoffs"] == 4


async def test_a_push_back_sent_before_the_block_raises_nothing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Two requests in flight together, both answered 429: one incident, not two; a
    Retry-After of 0 waits the backoff; a longer Retry-After on the second stretches the
    block to it."""
    one, two = await two_consumers(redis_client, crawl_name, backoff_base_ms=200,
                                   backoff_cap_ms=10_000, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(4)]))
    [a] = await one.lease("w1", 1, 60_000)
    [b] = await two.lease("w2", 1, 60_000)
    before = await redis_ms(redis_client)
    await one.fail("w1", [Failure(a, "http_429", "x", retry_after=0, pushback=True)])
    conf = await host_conf(one, "a.test")
    assert conf.level == 1 and 195 <= conf.blocked - before <= 250
    await two.fail("w2", [Failure(b, "http_429", "x", retry_after=3, pushback=True)])
    later = await host_conf(one, "a.test")
    assert (later.level, later.pushbacks) == (1, 1)
    assert 2_990 <= later.blocked - before <= 3_100


async def test_two_push_backs_of_one_host_in_one_call_keep_the_longer_retry_after(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Two leases of one host failed in one call, the first with a Retry-After of 0, the
    second of 3 s: one incident, blocked the longer Retry-After, not the first one's
    backoff."""
    one, _ = await two_consumers(redis_client, crawl_name, backoff_base_ms=200,
                                 backoff_cap_ms=10_000, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(3)]))
    a, b = await one.lease("w1", 2, 60_000)
    before = await redis_ms(redis_client)
    codes = await one.fail("w1", [Failure(a, "http_429", "x", retry_after=0, pushback=True),
                                  Failure(b, "http_429", "x", retry_after=3, pushback=True)])
    after = await redis_ms(redis_client)
    assert [code for code, _ in codes] == [Code.RETRY] * 2
    conf = await host_conf(one, "a.test")
    assert (conf.level, conf.pushbacks) == (1, 1)
    assert before + 3_000 <= conf.blocked <= after + 3_000  # the first's backoff: 200 ms


async def test_a_push_back_blocks_only_its_own_host_of_a_call(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A 429 from a.test and a plain failure of b.test in one fail call: a.test is
    blocked, b.test is untouched (no block, no level, no push-back) and still served."""
    one, _ = await two_consumers(redis_client, crawl_name, backoff_base_ms=60_000,
                                 backoff_cap_ms=60_000, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks(["http://a.test/1", "http://a.test/2", "http://b.test/1",
                             "http://b.test/2"]))
    leases = await one.lease("w1", 4, 60_000)
    assert len(leases) == 4
    a = next(x for x in leases if x.host == "a.test")
    b = next(x for x in leases if x.host == "b.test")
    await one.ack("w1", [(x, "ok") for x in leases if x not in (a, b)])
    await one.fail("w1", [Failure(a, "http_429", "slow down", pushback=True),
                          Failure(b, "http_500", "oops")])
    pushed, plain = await host_conf(one, "a.test"), await host_conf(one, "b.test")
    assert (pushed.level, pushed.pushbacks) == (1, 1) and pushed.blocked
    assert (plain.level, plain.pushbacks, plain.blocked) == (0, 0, 0)
    assert await redis_client.zscore(one.partitions[0].blocked, "b.test") is None
    assert (await one.stats()).counters["backoffs"] == 1
    await one.enqueue(tasks(["http://a.test/3", "http://b.test/3"]))
    assert [x.host for x in await one.lease("w1", 4, 60_000)] == ["b.test"]


async def test_responses_served_forgive_the_level_and_teach_the_host_its_pace(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """After two push-backs in a row (level 2), the host serves 10 pages: the next
    push-back is level 1 again (not in a row), and the pace it teaches is the interval the
    host served at since its block ended; both consumers then get one a.test task per
    turn, that pace apart."""
    one, two = await two_consumers(redis_client, crawl_name, backoff_base_ms=100,
                                   backoff_cap_ms=10_000, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(20)]))
    await push_back(one, "w1")
    _, conf = await push_back(two, "w2")
    assert (conf.level, conf.pace) == (2, 0)
    served = await lease_when_due(one, "w1", 10, 60_000)
    assert len(served) == 10  # politeness off, no pace yet: all at once
    assert await one.ack("w1", [(x, "ok") for x in served]) == [Code.OK] * 10
    await asyncio.sleep(0.3)
    block, conf = await push_back(two, "w2")
    assert conf.level == 1 and 95 <= block <= 150
    assert conf.pb_at is not None
    # (incident 3 - the end of block 2) / 10 pages: at least the 300 ms sleep.
    assert 30 <= conf.pace <= 300
    first = await lease_when_due(one, "w1", 10, 60_000)
    assert len(first) == 1 and first[0].delay_ms == conf.pace
    assert await two.lease("w2", 10, 60_000) == []  # its turn is a pace away
    row = await Frontier(two).host("a.test")
    assert row is not None and row.pace_ms == conf.pace == row.delay_ms


async def test_quiet_halves_the_pace_and_forgives_the_level(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    one, _ = await two_consumers(redis_client, crawl_name, backoff_base_ms=100,
                                 backoff_cap_ms=10_000, backoff_forgive_ms=400)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(20)]))
    await push_back(one, "w1")
    served = await lease_when_due(one, "w1", 4, 60_000)
    await one.ack("w1", [(x, "ok") for x in served])
    await asyncio.sleep(0.2)  # 4 pages in >= 200 ms: a pace of >= 50 ms to learn
    await push_back(one, "w1")  # after 4 served: level 1 again, a pace learned
    _, conf = await push_back(one, "w1")  # in a row: level 2
    assert conf.level == 2 and conf.pace and conf.blocked
    pace = conf.pace
    now = await redis_ms(redis_client)
    await asyncio.sleep(max(0, conf.blocked + 400 - now) / 1000)
    row = await Frontier(one).host("a.test")
    assert row is not None and pace // 2 - 10 <= row.pace_ms <= pace // 2 + 2
    # Quiet spells take levels off: the next push-back, again in a row (the host served
    # nothing since), is level 1, not 3.
    await asyncio.sleep(0.8)
    block, conf = await push_back(one, "w1")
    assert conf.level == 1 and 95 <= block <= 150


# -- adaptive delay: a host's delay follows its response times, fleet-wide ----------------


async def test_adaptive_delay_follows_response_times_for_every_consumer_within_max_delay(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    one, two = await two_consumers(redis_client, crawl_name, backoff_forgive_ms=FOREVER_MS)
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(30)]))

    async def serve_all(q: LeasingQueue, elapsed_ms: int) -> list[Lease]:
        leases = await lease_when_due(q, "w1", 10, 60_000)
        for x in leases:
            x.elapsed_ms = elapsed_ms
        assert await q.ack("w1", [(x, "ok") for x in leases]) == [Code.OK] * len(leases)
        return leases

    # Off (the default): response times are not even kept.
    assert len(await serve_all(one, 100)) == 10
    assert (await host_conf(one, "a.test")).lat is None
    await set_policy(redis_client, crawl_name, {"adaptive_delay": 2.0, "max_delay": 0.5},
                     by="test")
    # On: 100 ms responses make a 200 ms delay, for the other consumer too.
    await serve_all(one, 100)
    assert (await host_conf(one, "a.test")).lat == 100
    [lease] = await lease_when_due(two, "w2", 10, 60_000)
    assert lease.delay_ms == 200
    assert await one.lease("w1", 10, 60_000) == []  # its turn is 200 ms away
    row = await Frontier(two).host("a.test")
    assert row is not None and row.delay_ms == 200
    # Slow responses: the average moves by 0.3 of each, the delay stops at max_delay.
    lease.elapsed_ms = 2_000
    await two.ack("w2", [(lease, "ok")])
    assert (await host_conf(one, "a.test")).lat == 670
    [lease] = await lease_when_due(one, "w1", 10, 60_000)
    assert lease.delay_ms == 500


async def test_adaptive_delay_never_goes_below_the_hosts_own_delay(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """a.test's own delay is 1 s; adaptive_delay 2 with 100 ms responses gives 200 ms,
    shorter: the host keeps its 1 s (its next turn, and the delay its lease says)."""
    one, _ = await two_consumers(redis_client, crawl_name, backoff_forgive_ms=FOREVER_MS)
    await Frontier(one).set_host("a.test", delay_s=1)
    await set_policy(redis_client, crawl_name, {"adaptive_delay": 2.0, "max_delay": 5.0},
                     by="test")
    await one.enqueue(tasks([f"http://a.test/{i}" for i in range(3)]))
    [first] = await lease_when_due(one, "w1", 10, 60_000)
    first.elapsed_ms = 100
    assert await one.ack("w1", [(first, "ok")]) == [Code.OK]
    conf = await host_conf(one, "a.test")
    assert conf.lat == 100 and conf.delay == 1_000
    turn = await redis_client.zscore(one.partitions[0].due, "a.test")
    assert turn == conf.last + 1_000
    [second] = await lease_when_due(one, "w1", 10, 60_000)
    assert second.delay_ms == 1_000


async def test_a_crawl_delay_over_max_crawl_delay_is_cut_to_it_and_logged(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """robots.txt asks an hour between requests; the crawl obeys 0.2 s and says so."""
    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": 0.0, "max_crawl_delay": 0.2}, by="test")
    caplog.set_level(logging.WARNING, logger="consumer")
    async with serve({"/p/{i}": page}, robots="User-agent: *\nCrawl-delay: 3600\n") as site:
        queue = await enqueue(redis_client, crawl_name, [site.url(f"/p/{i}") for i in range(3)])
        assert await consume_defaults(redis_url, crawl_name, tmp_path, limit_s=30) == 0
        host = site.base.removeprefix("http://")
        row = await Frontier(queue).host(host)
    assert row is not None and row.robots_delay_ms == 200 and row.delay_ms == 200
    assert sorted(r["outcome"] for r in records(tmp_path)) == ["ok"] * 3
    [capped] = [r for r in caplog.records if r.getMessage() == "robots_crawl_delay_capped"]
    assert (capped.crawl_delay, capped.max_crawl_delay) == (3600.0, 0.2)  # type: ignore[attr-defined]


async def test_a_max_crawl_delay_of_0_obeys_any_crawl_delay(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """max_crawl_delay 0 (obey any) and robots.txt asking 2 s: the host gets 2 s, and
    nothing is logged as capped."""
    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": 0.0, "max_crawl_delay": 0.0}, by="test")
    caplog.set_level(logging.WARNING, logger="consumer")
    async with serve({"/p/{i}": page}, robots="User-agent: *\nCrawl-delay: 2\n") as site:
        queue = await enqueue(redis_client, crawl_name, [site.url("/p/0")])
        assert await consume_defaults(redis_url, crawl_name, tmp_path, limit_s=30) == 0
        host = site.base.removeprefix("http://")
    conf = await host_record(redis_client, queue.partitions[0], host)
    assert conf.robots == 2_000
    assert [r["outcome"] for r in records(tmp_path)] == ["ok"]
    assert not [r for r in caplog.records if r.getMessage() == "robots_crawl_delay_capped"]
