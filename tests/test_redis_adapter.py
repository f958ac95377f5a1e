"""What crawlq takes from redis-py's internals (common/redis/adapter.py), one test per
internal, against the installed redis-py: a release that moves one fails here, naming it,
and pyproject.toml's bound keeps such a release out until these pass on it."""

from __future__ import annotations

import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from packaging.requirements import Requirement
from packaging.version import Version
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.connection import HiredisRespSerializer
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.redis import adapter as redis_adapter
from common.redis.connection import connect
from common.redis.errors import error_code
from common.redis.retry import NotSentError
from common.redis.scripts import register
from common.redis.server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]


def params(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


def test_pyproject_bounds_redis_py_to_the_releases_the_adapter_was_tested_on() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if Requirement(d).name == "redis"]
    uppers = [Version(s.version) for s in req.specifier if s.operator == "<"]
    assert uppers, f"{req}: redis-py needs an upper bound (common/redis/adapter.py)"
    newest = max(redis_adapter.TESTED)
    assert uppers == [Version(f"{newest[0]}.{newest[1] + 1}")], (
        f"{req}: the bound is the minor after the newest release in TESTED {newest}")
    lowers = [Version(s.version) for s in req.specifier if s.operator == ">="]
    oldest = min(redis_adapter.TESTED)
    assert lowers == [Version(f"{oldest[0]}.{oldest[1]}")], req
    installed = Version(redis.__version__)
    assert installed in req.specifier, f"redis-py {installed} is outside {req}"
    assert (installed.major, installed.minor) in redis_adapter.TESTED, (
        f"redis-py {installed}: run this file on it, then add it to TESTED")


# -- 1. the retry ----------------------------------------------------------------------


def test_call_with_retry_has_the_signature_and_state_the_override_reads() -> None:
    assert params(Retry.call_with_retry) == ["self", "do", "fail", "is_retryable",
                                             "with_failure_count"]
    retry = redis_adapter.classified_retry(2)
    assert retry._retries == 2
    assert retry._supported_errors == (RedisConnectionError, RedisTimeoutError,
                                       ResponseError)
    assert callable(retry._backoff.compute) and callable(retry._backoff.reset)


async def test_commands_and_connects_go_through_the_classified_retry(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = redis_adapter.ClassifiedRetry.call_with_retry

    async def counted(self: Any, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(do, "__qualname__", ""))
        return await original(self, do, fail, *args, **kwargs)

    monkeypatch.setattr(redis_adapter.ClassifiedRetry, "call_with_retry", counted)
    client = connect(redis_url)
    try:
        assert client.get_retry() is client.connection_pool.connection_kwargs["retry"]
        assert await client.ping()
    finally:
        await client.aclose()
    assert len(calls) >= 2, calls  # the connect, then the command


# -- 2. not sent -----------------------------------------------------------------------


def test_connect_check_health_is_what_connect_runs() -> None:
    assert params(AbstractConnection.connect_check_health) == [
        "self", "check_health", "retry_socket_connect"]
    assert "connect_check_health" in inspect.getsource(AbstractConnection.connect)


async def test_a_refused_connect_is_not_sent() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0", retries=0)
    try:
        with pytest.raises(NotSentError):
            await client.ping()
    finally:
        await client.aclose()


async def test_check_health_runs_before_a_command_on_an_idle_connection(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert params(AbstractConnection.check_health) == ["self"]
    checks = []
    original = redis_adapter._NotSentMixin.check_health

    async def counted(self: Any) -> None:
        checks.append(self)
        await original(self)

    monkeypatch.setattr(redis_adapter._NotSentMixin, "check_health", counted)
    client = connect(redis_url)
    try:
        await client.ping()
        [conn] = client.connection_pool._available_connections  # type: ignore[attr-defined]
        conn.next_health_check = -1  # idle past its interval
        await client.ping()
    finally:
        await client.aclose()
    assert checks


async def test_the_pool_makes_its_connections_of_its_connection_class(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        await client.ping()
        conn = await client.connection_pool.get_connection()
        try:
            assert isinstance(conn, redis_adapter._NotSentMixin)
            assert isinstance(conn, redis_adapter._HiredisPackMixin)
        finally:
            await client.connection_pool.release(conn)
    finally:
        await client.aclose()


def test_the_errors_did_not_run_reads_are_where_it_looks() -> None:
    # Refusals redis-py raises as connection errors: _not_sent and may_send_again tell
    # them apart before they could read as "not sent" or "may have run".
    assert issubclass(AuthenticationError, RedisConnectionError)
    assert issubclass(BusyLoadingError, RedisConnectionError)
    assert issubclass(NotSentError, RedisConnectionError)
    assert issubclass(MasterNotFoundError, RedisConnectionError)
    for cls in (ReadOnlyError, TryAgainError, ClusterDownError):
        assert issubclass(cls, ResponseError), cls


# -- 3. Sentinel -----------------------------------------------------------------------


def test_the_sentinel_pool_and_manager_have_what_the_adapter_overrides() -> None:
    assert params(SentinelConnectionPool.get_master_address) == ["self"]
    assert params(SentinelConnectionPool.ensure_connection) == ["self", "connection"]
    assert "ensure_connection" in inspect.getsource(aioredis.ConnectionPool.get_connection)
    assert params(Sentinel.discover_master) == ["self", "service_name"]
    master_for = inspect.signature(Sentinel.master_for).parameters
    assert {"service_name", "redis_class", "connection_pool_class"} <= set(master_for)
    assert params(aioredis.Redis.aclose) == ["self", "close_connection_pool"]
    # BlockingConnectionPool's blocking get_connection is what the Sentinel pool's ends in.
    mro = redis_adapter._SentinelPool.__mro__
    assert mro.index(SentinelConnectionPool) < mro.index(aioredis.BlockingConnectionPool)


async def test_a_sentinel_client_is_built_of_the_adapters_parts() -> None:
    port = free_port()
    client = redis_adapter.sentinel_client(
        [("127.0.0.1", port)], "main", {"socket_timeout": 1, "socket_connect_timeout": 1},
        {"socket_timeout": 1, "retry": redis_adapter.classified_retry(0)})
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis_adapter._SentinelPool)
        assert pool.is_master and pool.master_address is None
        assert isinstance(pool.sentinel_manager, redis_adapter._Sentinels)
        assert [s.connection_pool.connection_kwargs["port"]
                for s in pool.sentinel_manager.sentinels] == [port]
        assert issubclass(pool.connection_class, redis_adapter._AskSentinelMixin)
        with pytest.raises(MasterNotFoundError,
                           match=f"no Sentinel of 127.0.0.1:{port} answered with a primary"):
            await client.ping()
    finally:
        await client.aclose()


# -- 4. hiredis packing ------------------------------------------------------------------


def test_the_packer_overrides_what_a_connection_packs_with() -> None:
    assert params(AbstractConnection.pack_command) == ["self", "args"]
    assert params(AbstractConnection.pack_commands) == ["self", "commands"]
    assert redis_adapter.HAVE_HIREDIS
    assert HiredisRespSerializer().pack("SET", "k", b"v") == [  # type: ignore[no-untyped-call]
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"]


async def test_commands_and_pipelines_are_packed_by_the_mixin(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    packed: list[str] = []
    one, many = (redis_adapter._HiredisPackMixin.pack_command,
                 redis_adapter._HiredisPackMixin.pack_commands)
    monkeypatch.setattr(redis_adapter._HiredisPackMixin, "pack_command",
                        lambda self, *a: packed.append("one") or one(self, *a))
    monkeypatch.setattr(redis_adapter._HiredisPackMixin, "pack_commands",
                        lambda self, c: packed.append("many") or many(self, c))
    client = connect(redis_url)
    try:
        await client.ping()
        async with client.pipeline(transaction=False) as pipe:
            pipe.ping()
            pipe.ping()
            await pipe.execute()
    finally:
        await client.aclose()
    assert "one" in packed and "many" in packed


# -- what else crawlq reads off redis-py ---------------------------------------------------


async def test_a_pipelines_error_message_is_the_one_redis_errors_unwraps(
        redis_url: str, crawl_name: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    key = f"crawlq:{{{crawl_name}}}:str"
    try:
        await client.set(key, "x")
        with pytest.raises(ResponseError) as caught:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hset(key, "f", "v")
                await pipe.execute()
        assert re.match(r"^Command # \d+ \(.*?\) of pipeline caused error: ", str(caught.value))
        assert error_code(str(caught.value)) == "WRONGTYPE"
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.integration
async def test_a_registered_script_loads_itself_after_a_flush() -> None:
    with RedisServer() as server:  # its own: the flush must not touch other tests' scripts
        client = connect(server.url)
        try:
            script = register(client, "is_empty")
            assert re.fullmatch(r"[0-9a-f]{40}", script.script.sha)
            keys = [f"crawlq:{{adapter}}:{k}"
                    for k in ("pending", "leases", "delayed", "due", "conf", "rv:due",
                              "r:pending")]
            assert await script(keys=keys, args=[]) == 1
            await client.script_flush()
            assert await script(keys=keys, args=[]) == 1  # NOSCRIPT: loaded, called again
        finally:
            await client.aclose()
