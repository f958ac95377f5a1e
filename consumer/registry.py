"""The worker registry: who is consuming, since when, how busy, how productive.

Each consumer refreshes ``worker:<id>`` (a hash with a TTL of three heartbeats) and its
score in the crawl's ``workers`` ZSET at every heartbeat, so a dead consumer vanishes
by itself. ``crawlq workers`` and fleet-wide "is the crawl finished" checks read it.
"""

from __future__ import annotations

import os
import socket
import time

from common.connection import RedisClient
from common.keys import CrawlKeys


class WorkerRegistry:
    """Registers one consumer and keeps its entry fresh."""

    def __init__(self, client: RedisClient, crawl: str, worker_id: str,
                 ttl_s: float) -> None:
        self.client = client
        self.keys = CrawlKeys.build(crawl)
        self.worker_id = worker_id
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self.started = time.time()

    async def beat(self, *, in_flight: int, done: int, failed: int, state: str) -> None:
        """Write this worker's entry (one pipelined round trip)."""
        now = time.time()
        key = self.keys.worker(self.worker_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={
                "id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "started": f"{self.started:.3f}", "heartbeat": f"{now:.3f}",
                "in_flight": in_flight, "done": done, "failed": failed, "state": state,
            })
            pipe.pexpire(key, self.ttl_ms)
            pipe.zadd(self.keys.workers, {self.worker_id: int(now * 1000)})
            await pipe.execute()

    async def leave(self) -> None:
        """Remove this worker's entry (graceful exit)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.worker(self.worker_id))
            pipe.zrem(self.keys.workers, self.worker_id)
            await pipe.execute()
