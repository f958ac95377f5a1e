"""Servers that push back, and the crawl's policy as the only limit (issue 24).

A consumer started with default flags must serve what the crawl's policy allows: its own
``--per-host-concurrency`` only seeds a new policy, so nothing in the process (its
connection pool) may narrow it, and time a request waits locally never counts as the
server's timeout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from common.frontier.policy import create_policy
from common.keys import PartitionKeys
from consumer.config import build_parser, settings_from_args
from consumer.run import run
from test_consumer import enqueue, records, serve


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
