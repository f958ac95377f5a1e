"""Redis connections: one place that turns a URL into a client with sane timeouts.

The URL forms are common/redis/url.py's: a mistake in one is a `ConfigError`, before
anything connects. A ``redis+sentinel://`` URL gives a client of the primary its
Sentinels name; every new connection asks them again, so a client finds the new primary
after a failover without a restart, also when it retries a command on the same
connection. What that and the rest take from redis-py's internals is
common/redis/adapter.py's.

The pool blocks (up to ``pool_timeout``) when every connection is busy instead of
failing with "Too many connections": a consumer's many coroutines share a bounded
number of sockets. Which failed commands are sent again is common/redis/retry.py's
rule (what did not run, always; what may have run, only if it is safe to run twice);
loops that must survive a long outage (the consumer) add their own backoff around
whole steps.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from common.errors import ConfigError
from common.redis.adapter import (
    classified_retry,
    mark_not_sent,
    sentinel_client,
    use_hiredis_packer,
)
from common.redis.url import check_redis_url, is_sentinel, parse_sentinel
from common.redis.wait import wait_after_writes


def _sentinel_client(url: str, options: dict[str, Any]) -> aioredis.Redis:
    parsed = parse_sentinel(url)
    return sentinel_client(parsed.sentinels, parsed.master, {
        "socket_timeout": options["socket_timeout"],
        "socket_connect_timeout": options["socket_connect_timeout"],
        **parsed.sentinel_kwargs}, {**options, **parsed.kwargs})


def connect(url: str, *, retries: int = 3, socket_timeout: float = 10.0,
            max_connections: int = 32, pool_timeout: float = 30.0,
            wait_replicas: int = 0, wait_timeout_s: float = 1.0) -> aioredis.Redis:
    """A client for ``url`` (common/redis/url.py's forms); connects lazily on first use.
    With `wait_replicas`, the queue's writes on it WAIT for that many replicas
    (common/redis/wait.py).

    Raises ConfigError for a URL crawlq can't use."""
    check_redis_url(url)
    options: dict[str, Any] = {
        "max_connections": max_connections, "timeout": pool_timeout,
        "socket_timeout": socket_timeout, "socket_connect_timeout": 5.0,
        "health_check_interval": 15, "retry": classified_retry(retries),
    }
    if is_sentinel(url):
        client = _sentinel_client(url, options)
    else:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        client = aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
    mark_not_sent(client)
    use_hiredis_packer(client)
    wait_after_writes(client, wait_replicas, wait_timeout_s)
    return client


RedisClient = aioredis.Redis | aioredis.RedisCluster


def connect_cluster(url: str, *, socket_timeout: float = 10.0,
                    max_connections: int = 32) -> aioredis.RedisCluster:
    """A Redis Cluster client; ``url`` names any node, the rest are discovered."""
    check_redis_url(url)
    return aioredis.RedisCluster.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        max_connections=max_connections,
        retry=classified_retry(3),
    )


async def open_redis(url: str, *, cluster: bool | None = None, wait_replicas: int = 0,
                     wait_timeout_s: float = 1.0) -> RedisClient:
    """A client for a single node or a cluster; ``cluster=None`` asks the server which
    (a Sentinel-named primary is never a cluster). `wait_replicas`: as `connect`'s, not
    with a cluster."""
    check_redis_url(url)
    if cluster is None and is_sentinel(url):
        cluster = False
    if cluster is None:
        probe = connect(url, retries=1)
        try:
            info = await probe.info("cluster")
            cluster = bool(int(info.get("cluster_enabled", 0)))
        finally:
            await probe.aclose()
    if cluster and wait_replicas:
        raise ConfigError("--redis-wait-replicas works with one primary (and Sentinel), "
                          "not with a Redis Cluster")
    if cluster:
        return connect_cluster(url)
    return connect(url, wait_replicas=wait_replicas, wait_timeout_s=wait_timeout_s)
