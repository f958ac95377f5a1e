"""Running a consumer in-process against a crawl: the crawl's tasks, the consumer's flags,
its run, what it wrote, and a sink that keeps nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from common.queue import LeasingQueue, NewTask
from common.urls.canonical import fingerprint
from consumer.config import build_parser, settings_from_args
from consumer.sinks import Record
from consumer.wiring import run


async def enqueue(client: aioredis.Redis, crawl: str, urls: list[str],
                  **task: Any) -> LeasingQueue:
    queue = await LeasingQueue.open(client, crawl)
    await queue.enqueue([NewTask(u, fingerprint(u), **task) for u in urls])
    return queue


def consumer_args(redis_url: str, crawl: str, out: Path, *extra: str) -> list[str]:
    return ["--redis-url", redis_url, "--crawl", crawl, "--output", str(out),
            "--exit-when-empty", "--empty-grace", "0", "--allow-private", "--http-port", "-1",
            "--retry-base", "0.05", "--per-host-concurrency", "0", "--per-host-delay", "0",
            "--ignore-robots", *extra]


async def consume(redis_url: str, crawl: str, out: Path, *extra: str,
                  limit_s: float = 60) -> int:
    settings = settings_from_args(build_parser().parse_args(
        consumer_args(redis_url, crawl, out, *extra)))
    return await asyncio.wait_for(run(settings), limit_s)


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(out.glob("*.jsonl"))
            for line in f.read_text().splitlines()]


class NullSink:
    """A sink that keeps nothing (a Consumer built in-process needs one)."""

    async def open(self) -> None:
        pass

    async def write(self, records: list[Record]) -> None:
        pass

    async def close(self) -> None:
        pass
