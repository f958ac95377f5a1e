"""The worker registry: who is consuming, since when, how busy, how productive.

Written by each consumer (`WorkerRegistry.beat`, every heartbeat) and read by
``crawlq workers``, ``crawlq stats`` and the dashboard (`read_workers`). A worker's entry
is the hash ``worker:<id>`` (expires after a TTL of about three heartbeats) plus its
score in the crawl's ``workers`` ZSET.

One clock, one unit: every time stored here is milliseconds of Redis ``TIME``, written
by ``worker_beat.lua`` and compared by the reader with Redis ``TIME`` again, so neither
the consumer's nor the reader's own clock enters a heartbeat age.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from common.codec import text as _text
from common.keys import CrawlKeys
from common.redis.connection import RedisClient
from common.redis.scripts import register

#: At most this many workers are read per call (the freshest heartbeats first).
MAX_WORKERS = 500
#: A heartbeat older than this many beat intervals is shown as stale.
STALE_BEATS = 2


class WorkerRegistry:
    """Registers one consumer and keeps its entry fresh."""

    def __init__(self, client: RedisClient, crawl: str, worker_id: str, ttl_s: float,
                 interval_s: float | None = None) -> None:
        self.client = client
        self.keys = CrawlKeys.build(crawl)
        self.worker_id = worker_id
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        # The consumer beats every lease/3 and the TTL is the lease: three beats.
        self.interval_ms = int(interval_s * 1000) if interval_s else self.ttl_ms // 3
        self._beat = register(client, "worker_beat")
        self._host = socket.gethostname()

    async def beat(self, *, in_flight: int, done: int, failed: int, state: str) -> int:
        """Write this worker's entry (one script call); returns its Redis-time stamp, ms."""
        return int(await self._beat(
            keys=[self.keys.worker(self.worker_id), self.keys.workers],
            args=[self.worker_id, self._host, os.getpid(), state, in_flight, done, failed,
                  self.ttl_ms, self.interval_ms]))

    async def leave(self) -> None:
        """Remove this worker's entry (graceful exit)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.worker(self.worker_id))
            pipe.zrem(self.keys.workers, self.worker_id)
            await pipe.execute()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One live worker as the registry holds it; times are ms of Redis TIME."""

    id: str
    host: str
    pid: int
    state: str
    started_ms: int
    heartbeat_ms: int
    age_ms: int
    interval_ms: int
    in_flight: int
    done: int
    failed: int
    pages_per_s: float

    @property
    def stale(self) -> bool:
        """The heartbeat is late: more than `STALE_BEATS` intervals old."""
        return self.age_ms > STALE_BEATS * max(self.interval_ms, 1000)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "state": self.state,
                "started_ms": self.started_ms, "heartbeat_ms": self.heartbeat_ms,
                "heartbeat_age_s": round(self.age_ms / 1000, 1), "stale": self.stale,
                "in_flight": self.in_flight, "done": self.done, "failed": self.failed,
                "pages_per_s": self.pages_per_s}


@dataclass(frozen=True, slots=True)
class Workers:
    """The live workers of a crawl, read at `now_ms` (Redis TIME)."""

    now_ms: int
    workers: list[WorkerInfo]
    total: int  # registered workers, also those past MAX_WORKERS


def _number(info: dict[str, str], name: str) -> float:
    try:
        return float(info.get(name) or 0)
    except ValueError:
        return 0.0


def _worker(info: dict[str, str], wid: str, now_ms: int) -> WorkerInfo:
    beat = int(_number(info, "heartbeat_ms"))
    return WorkerInfo(
        id=wid, host=info.get("host", ""), pid=int(_number(info, "pid")),
        state=info.get("state", ""), started_ms=int(_number(info, "started_ms")),
        heartbeat_ms=beat, age_ms=max(0, now_ms - beat),
        interval_ms=int(_number(info, "interval_ms")), in_flight=int(_number(info, "in_flight")),
        done=int(_number(info, "done")), failed=int(_number(info, "failed")),
        pages_per_s=round(_number(info, "pages_per_s"), 2))


async def read_workers(client: RedisClient, crawl: str, limit: int = MAX_WORKERS) -> Workers:
    """The crawl's live workers, sorted by id (two pipelined round trips, no writes).

    An id whose hash has expired (a consumer that died) is left out; the next heartbeat
    of any consumer removes it from the ZSET.
    """
    keys = CrawlKeys.build(crawl)
    async with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.zcard(keys.workers)
        pipe.zrevrange(keys.workers, 0, limit - 1)
        (secs, micros), total, ids = await pipe.execute()
    now_ms = int(secs) * 1000 + int(micros) // 1000
    if not ids:
        return Workers(now_ms, [], int(total))
    async with client.pipeline(transaction=False) as pipe:
        for member in ids:
            pipe.hgetall(keys.worker(_text(member)))
        hashes = await pipe.execute()
    live = [_worker({_text(k): _text(v) for k, v in fields.items()}, _text(member), now_ms)
            for member, fields in zip(ids, hashes, strict=True) if fields]
    return Workers(now_ms, sorted(live, key=lambda w: w.id), int(total))
