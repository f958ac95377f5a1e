"""Everything of crawlq that reaches into redis-py's internals, in one place.

crawlq's clients (common/redis/connection.py) need four things redis-py does not offer as
options, and get them by subclassing or overriding its internals:

1. **Which failed commands are sent again** (common/redis/retry.py's rule):
   `ClassifiedRetry` overrides ``redis.asyncio.retry.Retry.call_with_retry(do, fail,
   is_retryable, with_failure_count)``, reading its ``_backoff``, ``_retries`` and
   ``_supported_errors``; redis-py calls it around a connect and around each command.
2. **A connect that failed is "not sent"**: a runtime mixin over the pool's
   ``connection_class`` overrides ``AbstractConnection.connect_check_health(check_health,
   retry_socket_connect)`` (what ``connect()`` runs) and ``check_health()`` (before a
   command on a connection idle past ``health_check_interval``).
3. **Sentinel**: a pool of ``SentinelConnectionPool`` and ``BlockingConnectionPool``
   (its ``get_connection``, ``ensure_connection(connection)``, ``get_master_address()``,
   ``master_address``, ``is_master``, ``sentinel_manager``), a mixin that asks the
   Sentinels at every socket connect (``connect_check_health`` again), the manager's
   ``discover_master(service_name)`` and ``sentinels``, and ``master_for(redis_class,
   connection_pool_class)``.
4. **Commands packed by hiredis**: a mixin overriding the connection's ``pack_command``
   and ``pack_commands`` with ``hiredis.pack_command`` and redis-py's
   ``HiredisRespSerializer().pack``.

Each of these is tested against the installed redis-py (tests/test_redis_adapter.py: one
test per internal), and pyproject.toml bounds redis-py to the versions those tests ran on
(`TESTED`): a release that moves an internal fails there, loudly, before it reaches a
crawl. To take a new redis-py: raise the bound, run that file, fix what it names.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.redis.retry import NotSentError, may_send_again

try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    HAVE_HIREDIS = False
else:
    HAVE_HIREDIS = True

__all__ = ["HAVE_HIREDIS", "TESTED", "ClassifiedRetry", "classified_retry", "mark_not_sent",
           "sentinel_client", "use_hiredis_packer"]

#: The redis-py releases (major, minor) tests/test_redis_adapter.py passed on; pyproject.toml
#: takes the oldest to the minor after the newest. (8.1 words a pipeline's error
#: differently, so a refusal inside one reads as no code; 8.0 and 7.4 have no aclose on
#: the Sentinel manager; 6.4 retries without a failure count.)
TESTED = ((8, 2),)

T = TypeVar("T")


# -- 1. the retry --------------------------------------------------------------------------


class ClassifiedRetry(Retry):
    """redis-py's Retry, sending again only what `may_send_again` allows."""

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
                              is_retryable: Callable[[Exception], bool] | None = None,
                              with_failure_count: bool = False) -> T:
        self._backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        while True:
            try:
                return await do()
            except self._supported_errors as error:
                if not may_send_again(error) or (is_retryable and not is_retryable(error)):
                    raise
                failures += 1
                await (fail(error, failures) if with_failure_count else fail(error))
                if failures > self._retries:
                    raise error
                await asyncio.sleep(self._backoff.compute(failures))


def classified_retry(retries: int) -> ClassifiedRetry:
    """The retry of every crawlq client: `retries` more tries, 50 ms doubling to 2 s,
    jittered."""
    return ClassifiedRetry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries,
                           (RedisConnectionError, RedisTimeoutError, ResponseError))


# -- 2. not sent ---------------------------------------------------------------------------


class _NotSentMixin:
    """A connection whose failures to connect (or to pass the health check before a
    command) raise `NotSentError`: the command was not sent."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        with _not_sent():
            await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]

    async def check_health(self) -> None:
        with _not_sent():
            await super().check_health()  # type: ignore[misc]


@contextlib.contextmanager
def _not_sent() -> Iterator[None]:
    try:
        yield
    except (AuthenticationError, BusyLoadingError):  # refusals: classified as they are
        raise
    except (RedisConnectionError, RedisTimeoutError) as exc:
        if isinstance(exc, NotSentError):
            raise
        raise NotSentError(str(exc) or type(exc).__name__) from exc


def _mix(client: aioredis.Redis, mixin: type) -> None:
    """Give the client's future connections `mixin`'s methods (once)."""
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, mixin):
        pool.connection_class = type(f"{mixin.__name__.strip('_').removesuffix('Mixin')}"
                                     f"{base.__name__}", (mixin, base), {})


def mark_not_sent(client: aioredis.Redis) -> None:
    """Make the client's future connections raise `NotSentError` before a command is sent."""
    _mix(client, _NotSentMixin)


# -- 3. Sentinel ---------------------------------------------------------------------------


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
    socket connect, also the reconnect of a retried command (redis-py alone reconnects to
    the old address there: redis-py #3874)."""

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


def sentinel_client(sentinels: Iterable[tuple[str, int]], master: str,
                    sentinel_kwargs: dict[str, Any], options: dict[str, Any]
                    ) -> aioredis.Redis:
    """A client of the primary `sentinels` name `master`: each ask goes once to each
    Sentinel (the client's retry tries the whole ask again); every new connection asks."""
    manager = _Sentinels(list(sentinels),
                         sentinel_kwargs={**sentinel_kwargs, "retry": Retry(NoBackoff(), 0)})
    client: aioredis.Redis = manager.master_for(
        master, redis_class=_SentinelClient, connection_pool_class=_SentinelPool, **options)
    _mix(client, _AskSentinelMixin)
    return client


# -- 4. hiredis packing --------------------------------------------------------------------

_SERIALIZER = HiredisRespSerializer()  # type: ignore[no-untyped-call]


class _HiredisPackMixin:
    """Overrides the two packing methods of a redis.asyncio connection class.

    redis-py's asyncio connections pack every argument in Python; an enqueue call carries
    ~5 arguments per URL and a lease or ack ~3 per task, so packing is a large share of
    the hot path's CPU, and ``hiredis.pack_command`` writes the same bytes (a test
    compares them) several times faster."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # The common case (a one-word command, no memoryviews) goes straight to hiredis;
        # anything else takes redis-py's own hiredis path, which handles those.
        head = args[0]
        if isinstance(head, str) and " " not in head:
            try:
                return [_pack(args)]
            except TypeError:
                pass
        packed: list[bytes] = _SERIALIZER.pack(*args)
        return packed

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        out: list[bytes] = []
        for cmd in commands:
            out.extend(_SERIALIZER.pack(*cmd))
        return [b"".join(out)]


def use_hiredis_packer(client: aioredis.Redis) -> bool:
    """Make the client's future connections pack with hiredis; False if it can't."""
    if not HAVE_HIREDIS:
        return False
    _mix(client, _HiredisPackMixin)
    return True
