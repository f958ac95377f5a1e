"""WAIT after a write (``--redis-wait-replicas``): each call that changes the queue is
followed, on the same connection, by ``WAIT <replicas> <timeout>``, so a reply says the
change reached that many replicas too, and a promotion of one of them loses none of it.

Redis does not undo a write that too few replicas acknowledged in time: the call stands
(the primary has it) and a WARNING says so, at most once a minute. The cost is one
replication round trip per call (bench/queue_bench.py --wait-replicas measures it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

log = logging.getLogger("crawlq")

_WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas a write waits for, and for how long (ms)."""

    replicas: int
    timeout_ms: int

    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)


_WAITS: WeakKeyDictionary[Any, ReplicaWait] = WeakKeyDictionary()
_warned = float("-inf")


def wait_after_writes(client: Any, replicas: int, timeout_s: float) -> None:
    """Make the queue's writes on `client` wait for `replicas` replicas (0: not)."""
    if replicas > 0:
        _WAITS[client] = ReplicaWait(replicas, max(1, round(timeout_s * 1000)))


def replica_wait(client: Any) -> ReplicaWait | None:
    """What writes on `client` wait for (None: nothing)."""
    return _WAITS.get(client)


def acknowledged(wait: ReplicaWait, replicas: int) -> None:
    """Log (at most once a minute) a WAIT that ended with too few replicas."""
    global _warned  # noqa: PLW0603 - one process-wide rate limit
    if replicas >= wait.replicas or time.monotonic() - _warned < _WARN_EVERY_S:
        return
    _warned = time.monotonic()
    log.warning("redis_wait_short", extra={
        "replicas": replicas, "wanted": wait.replicas, "timeout_ms": wait.timeout_ms,
        "advice": "a write reached fewer replicas than --redis-wait-replicas asks within "
                  "--redis-wait-timeout: a failover now could lose it; check the replicas' "
                  "links (INFO replication)"})
