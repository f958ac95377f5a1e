"""Redis' clock, which leases, turns and seen marks are timed by: read it, and wait until
it has passed a lease's deadline or a number of whole seconds."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from common.queue import Lease, LeasingQueue


async def redis_ms(client: aioredis.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def expire(q: LeasingQueue, *leases: Lease) -> None:
    """Sleep until every lease's deadline (Redis clock) has passed."""
    while True:
        now = await redis_ms(q.client)
        wait = max(lease.deadline_ms for lease in leases) - now
        if wait < 0:
            return
        await asyncio.sleep(wait / 1000 + 0.01)


async def window_passed(client: aioredis.Redis, window_s: int, within: float = 10.0) -> None:
    """Return once Redis TIME's seconds are `window_s` past what they read now: a seen mark
    written before this call (whole seconds of Redis TIME) is then that old at least."""
    start = int((await client.time())[0])
    deadline = time.monotonic() + within
    while int((await client.time())[0]) < start + window_s:
        assert time.monotonic() < deadline, f"Redis TIME not {window_s}s on within {within:g}s"
        await asyncio.sleep(0.02)
