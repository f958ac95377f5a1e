"""Exponential backoff with full jitter, for the consumer's loops that must outlive a
Redis outage."""

from __future__ import annotations

import asyncio
import contextlib
import random


class Backoff:
    """``sleep()`` waits a random time up to base * 2^failures (at most `cap`)."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self) -> float:
        """Count a failure; the time to wait before the next try."""
        self.failures += 1
        return random.uniform(0, min(self.cap, self.base * 2 ** self.failures))

    async def sleep(self, stop: asyncio.Event | None = None, *,
                    at_most: float | None = None) -> None:
        """Wait the next delay (no longer than `at_most`), or until `stop` is set."""
        delay = self.next_delay()
        if at_most is not None:
            delay = max(0.0, min(delay, at_most))
        if stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)

    def reset(self) -> None:
        self.failures = 0
