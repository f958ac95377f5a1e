"""A command's start-up through a Redis outage: each step (connect, the crawl, the server's
settings, the policy, the scripts, the worker registry) is tried again with backoff
while Redis is away, as the hot path's loops do, until Redis has gone unanswered for
the command's ``--redis-wait``; then `RedisGaveUpError`, which every command turns into
one line (or one log line) and exit 3 (common/exitcodes.py).

Away is an outage: no connection, a timeout, a connection dropped, or a refusal that
ends by itself (``LOADING``, ``READONLY`` of a replica, ``MASTERDOWN``, ``NOREPLICAS``,
... : common/redis/retry.py's "did not run"). A refusal for good (a login, an ACL, out
of memory, a script's error) is raised at once: waiting would not change it.

A step is run again whole, so each is one that may run twice: it reads, or it reads
before it writes (a crawl's policy is created only when the read finds none), or its
writes are the ones common/redis/resend.py lets run twice. Each step has the whole wait,
counted from its start (or from an answer, for a step that gets some and waits on).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import CrawlqError
from common.redis.errors import REDIS_ERRORS, redis_error_message
from common.redis.retry import did_not_run
from common.urls.redact import redact_url

__all__ = ["RedisGaveUpError", "StartupStopped", "StartupWait", "outage"]

T = TypeVar("T")

#: A try again waits a random time up to this, doubling from BACKOFF_BASE_S.
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.1, 2.0


class RedisGaveUpError(CrawlqError):
    """Redis went unanswered for the whole ``--redis-wait`` of a command's start-up;
    the message is the one line to show, `advice` what to check."""

    def __init__(self, message: str, *, step: str, waited_s: float, url: str,
                 error: BaseException) -> None:
        super().__init__(message)
        self.step = step
        self.waited_s = waited_s
        self.url = url
        self.error = error


class StartupStopped(CrawlqError):
    """The command was told to stop (a signal) while it waited for Redis."""


def outage(exc: BaseException) -> bool:
    """Whether `exc` says Redis is away for now (see the module docstring)."""
    if isinstance(exc, AuthenticationError):
        return False
    if did_not_run(exc):
        return True
    if isinstance(exc, ResponseError):
        return False
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)


class StartupWait:
    """The wait of one command's start-up for Redis at `url`: `step` runs each step, up
    to `limit_s` without an answer. `on_wait(step, exc)` is told of each failed try
    (a log line); `stop`, when set, ends a wait with `StartupStopped`."""

    def __init__(self, url: str, limit_s: float, *,
                 on_wait: Callable[[str, BaseException], None] | None = None,
                 stop: asyncio.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.limit_s = limit_s
        self.on_wait = on_wait
        self.stop = stop
        self.clock = clock
        self.since = clock()
        self.failures = 0

    def answered(self) -> None:
        """Redis answered: the next outage gets the whole wait."""
        self.since = self.clock()
        self.failures = 0

    def left(self) -> float:
        """Seconds of the wait left."""
        return self.since + self.limit_s - self.clock()

    def failed(self, step: str, exc: BaseException) -> None:
        """A try of `step` failed with `exc`: raise it when it is no outage, or
        `RedisGaveUpError` when the wait is over; else tell `on_wait`."""
        if not outage(exc):
            raise exc
        waited = self.clock() - self.since
        if waited >= self.limit_s:
            raise self.gave_up(step, exc, waited) from exc
        self.failures += 1
        if self.on_wait is not None:
            self.on_wait(step, exc)

    def gave_up(self, step: str, exc: BaseException, waited: float) -> RedisGaveUpError:
        """The error saying so, in one line (the URL's password hidden)."""
        said = redis_error_message(exc, self.url) if isinstance(exc, RedisError) else None
        said = said or f"cannot reach Redis at {redact_url(self.url)}: {exc}"
        return RedisGaveUpError(
            f"{said}; gave up after {waited:.1f}s without an answer (--redis-wait / "
            "CRAWLQ_REDIS_WAIT sets how long)", step=step, waited_s=waited, url=self.url,
            error=exc)

    async def pause(self) -> None:
        """Wait before the next try: backoff with jitter, never past the wait's end;
        `StartupStopped` if `stop` is set meanwhile."""
        delay = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** self.failures))
        delay = max(0.0, min(delay, self.left()))
        if self.stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)
        if self.stop is not None and self.stop.is_set():
            raise StartupStopped("stopped while waiting for Redis")

    async def step(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`'s result, tried again through an outage (see the module docstring)."""
        self.answered()
        while True:
            if self.stop is not None and self.stop.is_set():
                raise StartupStopped("stopped while waiting for Redis")
            try:
                result = await call()
            except REDIS_ERRORS as exc:
                self.failed(name, exc)
                await self.pause()
                continue
            self.answered()
            return result
