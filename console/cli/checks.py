"""``crawlq check``: whether Redis answers and keeps its keys (and an HTTP endpoint
answers); ``crawlq fsck``: a crawl's invariants checked, and repaired (``console.fsck``)."""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from redis.exceptions import RedisError

from common.errors import CrawlqError
from common.exitcodes import EXIT_FAIL, EXIT_INCONSISTENT, EXIT_OK
from common.keys import CrawlKeys
from common.queue import CrawlSettings, migrate_crawl
from common.redis.connection import RedisClient
from common.redis.durability import EVICTION_ADVICE, ServerSettings, server_settings
from common.redis.errors import redis_error_message
from common.urls.redact import redact_url
from console.cli.output import emit, open_queue
from console.fsck import fsck, report_text


async def _check_http(url: str, timeout_s: float) -> str | None:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
                s.get(url) as resp:
            if resp.status >= 300:
                return f"{url} answered HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"{url} did not answer: {type(exc).__name__}: {exc}"
    return None


def _evicting(nodes: list[ServerSettings]) -> str | None:
    """The problem of an evicting server (or Cluster primary), if any."""
    for n in nodes:
        if n.evicting:
            return f"Redis at {n.node} has maxmemory-policy {n.eviction}: {EVICTION_ADVICE}"
    return None


async def cmd_check(args: argparse.Namespace, client: RedisClient) -> int:
    problem: str | None = None
    nodes: list[ServerSettings] = []
    try:
        async with asyncio.timeout(args.timeout):
            await client.ping()
            raw = await client.hget(CrawlKeys.build(args.crawl).meta, "settings")
            if raw is not None:
                CrawlSettings.from_json(raw, args.crawl)
            nodes = await server_settings(client)
    except TimeoutError:
        problem = f"Redis at {redact_url(args.redis_url)} did not answer in {args.timeout:g}s"
    except RedisError as exc:
        problem = redis_error_message(exc, args.redis_url) or f"Redis error: {exc}"
    except (ValueError, KeyError, CrawlqError) as exc:
        problem = f"crawl {args.crawl} has unreadable settings: {exc}"
    if problem is None:
        problem = _evicting(nodes)
    if problem is None and args.http_url:
        problem = await _check_http(args.http_url, args.timeout)
    if problem is not None:
        print(f"unhealthy: {problem}")
    else:
        print(f"ok: Redis at {redact_url(args.redis_url)} answers"
              + (f", {args.http_url} answers" if args.http_url else ""))
    for n in nodes:
        print(f"redis {n.node}: {n.text()}")
    for warning in filter(None, (n.listpack_warning() for n in nodes)):
        print(f"warning: {warning}")
    return EXIT_OK if problem is None else EXIT_FAIL


async def cmd_fsck(args: argparse.Namespace, client: RedisClient) -> int:
    if args.repair:  # a crawl of layout 2 or 3 is converted first (common.queue.migrate)
        await migrate_crawl(client, args.crawl)
    queue = await open_queue(client, args.crawl)
    report = await fsck(queue, fix=args.repair)
    code = EXIT_OK if report.clean else EXIT_INCONSISTENT
    if args.json:
        emit({**report.to_json(), "exit_code": code})
    else:
        print(report_text(report), flush=True)
    return code
