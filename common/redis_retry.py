"""Which failed Redis commands are sent again: the ones that did not run, always; the ones
that may have run, only when running them twice is safe.

"Did not run" (sent again with backoff and jitter, on a fresh connection to the current
primary): the connection failed before the command was sent (refused, a connect or
health-check timeout, no primary known to the Sentinels), or the server refused it
before running it: ``READONLY`` (a replica: the old primary after a failover),
``LOADING``, ``MASTERDOWN``, ``NOREPLICAS``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``BUSY``. A
script refused at its first write (a replica, too few replicas) has written nothing.
``NOSCRIPT`` is not retried here: redis-py's registered scripts load themselves and
call again.

"May have run": a timeout or a dropped connection after the command went out. The
server may have run it, its reply lost. A plain command is sent again (crawlq's plain
writes set values; a result XADD sent twice is a duplicate at-least-once allows). A
script is sent again only if it is safe to run twice: `resending` says so around a
call (common/scripts.py's `RESENDABLE` names the scripts and why each is safe).
Anything else is raised to the caller, which decides (the consumer's loops back off
and try the step again later, the reply is never assumed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError
from redis.backoff import ExponentialWithJitterBackoff
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

from common.redis_errors import error_code

T = TypeVar("T")


class NotSentError(RedisConnectionError):
    """The connection failed before the command was sent: the command did not run."""


#: Error codes of a command the server refused without running it.
DID_NOT_RUN = frozenset({"READONLY", "LOADING", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN",
                         "CLUSTERDOWN", "BUSY"})

#: Whether the command being sent may be sent again after an unknown outcome.
_RESEND: ContextVar[bool] = ContextVar("crawlq_resend", default=True)




@contextlib.contextmanager
def resending(safe: bool) -> Iterator[None]:
    """Within: a command whose outcome is unknown is sent again only if `safe`."""
    token = _RESEND.set(safe)
    try:
        yield
    finally:
        _RESEND.reset(token)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or while handling (redis-py wraps a READONLY of
    a demoted primary in a ConnectionError)."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 3:
        yield e
        e = e.__cause__ or e.__context__
        seen += 1


#: The classes redis-py raises for some of those codes (the code taken off the message).
_DID_NOT_RUN_CLASSES = (NotSentError, MasterNotFoundError, ReadOnlyError, BusyLoadingError,
                        TryAgainError, ClusterDownError)


def did_not_run(exc: BaseException) -> bool:
    """True if the command certainly did not run (see the module's docstring)."""
    for e in _chain(exc):
        if isinstance(e, _DID_NOT_RUN_CLASSES):
            return True
        if isinstance(e, ResponseError) and error_code(str(e)) in DID_NOT_RUN:
            return True
    return False


def may_send_again(exc: BaseException) -> bool:
    """Whether the failed command may be sent again."""
    if isinstance(exc, AuthenticationError):
        return False
    if did_not_run(exc):
        return True
    if isinstance(exc, ResponseError):
        return False
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return _RESEND.get()
    return True  # another error the client asked to retry (a cluster's)


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


def mark_not_sent(client: aioredis.Redis) -> None:
    """Make the client's future connections raise `NotSentError` before a command is sent."""
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, _NotSentMixin):
        pool.connection_class = type(f"NotSent{base.__name__}", (_NotSentMixin, base), {})
