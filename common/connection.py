"""Redis connections: one place that turns a URL into a client with sane timeouts.

The URL forms are common/redis_url.py's: a mistake in one is a `ConfigError`, before
anything connects. A ``redis+sentinel://`` URL gives a client of the primary its
Sentinels name; every new connection asks them again, so a client finds the new primary
after a failover without a restart, also when it retries a command on the same
connection (redis-py alone reconnects to the old address there: redis-py #3874).

The pool blocks (up to ``pool_timeout``) when every connection is busy instead of
failing with "Too many connections": a consumer's many coroutines share a bounded
number of sockets. Which failed commands are sent again is common/redis_retry.py's
rule (what did not run, always; what may have run, only if it is safe to run twice);
loops that must survive a long outage (the consumer) add their own backoff around
whole steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import ConfigError
from common.redis_retry import classified_retry, mark_not_sent
from common.redis_url import check_redis_url, is_sentinel, parse_sentinel
from common.redis_wait import wait_after_writes
from common.resp_pack import use_hiredis_packer


class _SentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel pool that blocks like `connect`'s pool when every connection is busy,
    and asks the Sentinels where the primary is at most every `ASK_EVERY_S` while
    connections are taken (in the background: a slow Sentinel delays no command): a
    connection to another address is dropped and made again when next taken.

    Without it a pooled connection stays with an old primary that still takes writes
    (until Sentinel demotes it, ~10 s after a promotion; `min-replicas-to-write` makes it
    refuse them sooner). Sentinels that don't answer leave the connections as they are.
    """

    ASK_EVERY_S = 1.0
    _asked = float("-inf")
    asking: asyncio.Task[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if time.monotonic() - self._asked >= self.ASK_EVERY_S and (
                self.asking is None or self.asking.done()):
            self._asked = time.monotonic()
            self.asking = asyncio.ensure_future(self._ask())
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]

    async def _ask(self) -> None:
        with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
            await self.get_master_address()  # type: ignore[no-untyped-call]

    async def ensure_connection(self, connection: Any) -> None:
        if (self.master_address is not None and connection.is_connected
                and (connection.host, connection.port) != tuple(self.master_address)):
            await connection.disconnect()
        await super().ensure_connection(connection)


class _SentinelClient(aioredis.Redis):
    """A client of a Sentinel-named primary; closing it closes its Sentinel clients too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pool = self.connection_pool
        if isinstance(pool, _SentinelPool) and pool.asking is not None:
            pool.asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pool.asking
        await super().aclose(close_connection_pool)
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


class _AskSentinelMixin:
    """A Sentinel-managed connection that asks the Sentinels where the primary is at every
    socket connect, also the reconnect of a retried command."""

    connection_pool: Any
    host: str
    port: int

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if not getattr(self, "is_connected", False) and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(  # type: ignore[misc]
            check_health=check_health, retry_socket_connect=retry_socket_connect)


class _Sentinels(Sentinel):
    """redis-py's Sentinel manager, with a short message when no Sentinel names the
    primary (redis-py's holds the repr of each Sentinel client)."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError:
            where = ", ".join(f"{s.connection_pool.connection_kwargs['host']}:"
                              f"{s.connection_pool.connection_kwargs['port']}"
                              for s in self.sentinels)
            raise MasterNotFoundError(f"no Sentinel of {where} answered with a primary "
                                      f"named {service_name!r}") from None


def _sentinel_client(url: str, options: dict[str, Any]) -> aioredis.Redis:
    parsed = parse_sentinel(url)
    # Each ask goes once to each Sentinel: the client's retry tries the whole ask again.
    sentinel_kwargs = {"socket_timeout": options["socket_timeout"],
                       "socket_connect_timeout": options["socket_connect_timeout"],
                       "retry": Retry(NoBackoff(), 0), **parsed.sentinel_kwargs}
    sentinel = _Sentinels(list(parsed.sentinels),  # type: ignore[no-untyped-call]
                          sentinel_kwargs=sentinel_kwargs)
    client: aioredis.Redis = sentinel.master_for(
        parsed.master, redis_class=_SentinelClient, connection_pool_class=_SentinelPool,
        **{**options, **parsed.kwargs})
    pool = client.connection_pool
    pool.connection_class = type(f"AskSentinel{pool.connection_class.__name__}",
                                 (_AskSentinelMixin, pool.connection_class), {})
    return client


def connect(url: str, *, retries: int = 3, socket_timeout: float = 10.0,
            max_connections: int = 32, pool_timeout: float = 30.0,
            wait_replicas: int = 0, wait_timeout_s: float = 1.0) -> aioredis.Redis:
    """A client for ``url`` (common/redis_url.py's forms); connects lazily on first use.
    With `wait_replicas`, the queue's writes on it WAIT for that many replicas
    (common/redis_wait.py).

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
