"""Redis connections: one place that turns a URL into a client with sane timeouts.

The pool blocks (up to ``pool_timeout``) when every connection is busy instead of
failing with "Too many connections": a consumer's many coroutines share a bounded
number of sockets. redis-py retries a command after a dropped connection with
exponential backoff and jitter; loops that must survive a long outage (the consumer)
add their own backoff around whole steps.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.resp_pack import use_hiredis_packer


def connect(url: str, *, retries: int = 3, socket_timeout: float = 10.0,
            max_connections: int = 32, pool_timeout: float = 30.0) -> aioredis.Redis:
    """A client for ``url`` (redis:// or rediss://); connects lazily on first use."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    client = aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
    use_hiredis_packer(client)
    return client


RedisClient = aioredis.Redis | aioredis.RedisCluster


def connect_cluster(url: str, *, socket_timeout: float = 10.0,
                    max_connections: int = 32) -> aioredis.RedisCluster:
    """A Redis Cluster client; ``url`` names any node, the rest are discovered."""
    return aioredis.RedisCluster.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        max_connections=max_connections,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), 3),
    )


async def open_redis(url: str, *, cluster: bool | None = None) -> RedisClient:
    """A client for a single node or a cluster; ``cluster=None`` asks the server which."""
    if cluster is None:
        probe = connect(url, retries=1)
        try:
            info = await probe.info("cluster")
            cluster = bool(int(info.get("cluster_enabled", 0)))
        finally:
            await probe.aclose()
    return connect_cluster(url) if cluster else connect(url)
