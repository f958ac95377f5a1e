"""Redis' clock as seen from this process: the time a request really went out, in the
same milliseconds as the lease's turn, without trusting the worker's wall clock."""

from __future__ import annotations

WINDOW_S = 30.0


class RedisClock:
    """Maps ``time.monotonic()`` to Redis TIME (ms) by the least-delayed reply seen.

    Each lease reply carries the Redis time it ran at; the smallest gap between when a
    reply was read here and that time is the clocks' offset plus the fastest round trip's
    return leg. The minimum is taken over the last one or two windows of WINDOW_S, so
    the two clocks drifting apart (NTP slewing Redis' host) is followed.
    """

    def __init__(self) -> None:
        self._best: float | None = None  # this window's smallest offset (ms)
        self._previous: float | None = None
        self._window_end = 0.0

    def observe(self, local_s: float, redis_ms: int) -> None:
        """A reply read at monotonic `local_s` ran at Redis time `redis_ms`."""
        offset = local_s * 1000 - redis_ms
        if local_s >= self._window_end:
            self._previous, self._best = self._best, None
            self._window_end = local_s + WINDOW_S
        if self._best is None or offset < self._best:
            self._best = offset

    def to_redis_ms(self, local_s: float) -> int | None:
        """Redis time at monotonic `local_s`; None before any reply was seen."""
        known = [o for o in (self._best, self._previous) if o is not None]
        if not known:
            return None
        return int(local_s * 1000 - min(known))
