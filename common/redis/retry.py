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
call (common/redis/resend.py's `SCRIPTS` classifies every script: why running it twice is
safe, or what happens instead). Anything else is raised to the caller, which decides
(the consumer's loops back off and run the step again only when that table says the
step's scripts may run twice, the reply is never assumed).

The client's retry that applies this rule, and the connections that tell "not sent"
apart, reach into redis-py: common/redis/adapter.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from redis.asyncio.sentinel import MasterNotFoundError
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

from common.redis.errors import error_code


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
