"""Whether the result sink takes writes, and for how long it has not.

A sink write that fails (a full or read-only volume, a permission change, Redis refusing
the results stream) is not a Redis outage of the queue: retrying it forever would hold
leases, renewed by the heartbeat, with nothing ever done. So the flusher gives the
failed batch's tasks back (released, fetched again by someone: at-least-once) and
reports here; the consumer then stops leasing, turns /readyz to 503, releases what it
holds and has not started, and waits:

- the flusher tries the sink again at backoff times (``next_try``): with the next batch
  of results, when fetches in flight left one, else with the sink's ``probe()`` when it
  has one (file sinks); a sink without a probe is "tried" by leasing again;
- an episode starts at the first failure after the last written batch. A written batch
  ends it. A probe that passes lets the consumer lease again but does not end it (a
  probe is smaller than a batch): a write failing again soon after continues it, so
  a sink that passes probes and refuses batches can't keep a consumer alive;
- once an episode has lasted ``--sink-retry-for`` with the sink still failing, the
  consumer gives up: it releases everything and exits ``EXIT_SINK``, for the
  orchestrator to restart it once the volume is fixed.
"""

from __future__ import annotations

import asyncio
import time

from consumer.backoff import Backoff

#: Backoff between tries of a failing sink (full jitter, seconds).
SINK_BACKOFF_BASE_S = 0.25
SINK_BACKOFF_CAP_S = 5.0


class SinkHealth:
    """The sink's state, shared by the flusher (which writes) and the consumer (which
    leases and decides to give up). `changed` is set at every change."""

    def __init__(self, retry_for_s: float) -> None:
        self.retry_for_s = retry_for_s
        self.error: BaseException | None = None  # set while failing: no leasing
        self.last_error: BaseException | None = None  # the episode's latest failure
        self.since: float | None = None  # monotonic start of the open episode
        self.next_try = 0.0  # monotonic time of the next try while failing
        self.failures = 0  # failed writes in the open episode
        self._trial_at: float | None = None  # when a probe passed (or a trial began)
        self._backoff = Backoff(base=SINK_BACKOFF_BASE_S, cap=SINK_BACKOFF_CAP_S)
        self.changed = asyncio.Event()

    @property
    def failing(self) -> bool:
        """The last try failed: don't lease, hand back what can't be written."""
        return self.error is not None

    @property
    def episode_open(self) -> bool:
        """A failure has not yet been followed by a written batch (/readyz fails)."""
        self._expire_trial()
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """A write (or probe) failed with `exc`."""
        self._expire_trial()
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.failures = 0
        self.failures += 1
        self.error = self.last_error = exc
        self._trial_at = None
        self.next_try = now + max(SINK_BACKOFF_BASE_S, self._backoff.next_delay())
        self.changed.set()

    def written(self) -> None:
        """A batch of results reached the sink: the episode, if any, is over."""
        if self.since is not None:
            self._end()
            self.changed.set()

    def trial(self) -> None:
        """The sink looks fine again (a probe passed, or the backoff ran out for a sink
        without a probe): lease again; the next written batch ends the episode."""
        if self.error is not None:
            self.error = None
            self._trial_at = time.monotonic()
            self.changed.set()

    def gave_up(self) -> bool:
        """Failing, and the episode has lasted the whole bound."""
        return self.error is not None and self.since is not None \
            and time.monotonic() - self.since >= self.retry_for_s

    def left_s(self) -> float:
        """Time until the bound runs out (0 when no episode is open)."""
        if self.since is None:
            return 0.0
        return max(0.0, self.since + self.retry_for_s - time.monotonic())

    def _expire_trial(self) -> None:
        """End an episode whose trial has lasted a whole bound with nothing failing (an
        idle crawl wrote nothing since the probe passed): the sink is fine."""
        if self.error is None and self._trial_at is not None \
                and time.monotonic() - self._trial_at > self.retry_for_s:
            self._end()

    def _end(self) -> None:
        self.error = self.last_error = None
        self.since = None
        self._trial_at = None
        self.failures = 0
        self._backoff.reset()
