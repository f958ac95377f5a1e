"""The leases one consumer holds: which, until when (local clock), and losing them."""

from __future__ import annotations

import time
from collections import Counter

from common.observability.metrics import Metrics
from common.queue import Lease


class LeaseBook:
    """Held leases by task id, each with a local monotonic deadline.

    Redis decides whether a lease is still ours (its fencing token and Redis TIME); the
    local deadline only tells when it *may* have expired, so that work is not started
    or finished on a lease someone else may own by now.
    """

    def __init__(self, lease_s: float, metrics: Metrics) -> None:
        self.lease_s = lease_s
        self.held: dict[str, Lease] = {}
        self._deadline: dict[str, float] = {}
        self._margin_s = min(1.0, lease_s / 10)
        self._metrics = metrics
        # Host -> held leases still taking one of its slots; a lease whose slot came back
        # when its response was in (`response_in`) is in `_back` until it ends.
        self._slots: Counter[str] = Counter()
        self._back: set[str] = set()

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, lease: Lease, since: float) -> Lease | None:
        """Hold a new lease taken at monotonic `since`; returns an older lease of the same
        task this one replaces (reclaimed, then leased to us again: the old one is dead)."""
        old = self.held.get(lease.id)
        if old is not None:
            self._end_slot(old)
        self.held[lease.id] = lease
        self._deadline[lease.id] = since + self.lease_s
        self._slots[lease.host] += 1
        return old

    def response_in(self, lease: Lease) -> None:
        """`lease`'s response is in: its host slot goes back while the lease is held."""
        if self.holds(lease) and lease.id not in self._back:
            self._back.add(lease.id)
            self._take_slot(lease.host)

    def slots(self, host: str) -> int:
        """How many of `host`'s slots this consumer's leases take now."""
        return self._slots.get(host, 0)

    def _end_slot(self, lease: Lease) -> None:
        if lease.id in self._back:
            self._back.discard(lease.id)
        else:
            self._take_slot(lease.host)

    def _take_slot(self, host: str) -> None:
        left = self._slots.get(host, 0) - 1
        if left > 0:
            self._slots[host] = left
        else:
            self._slots.pop(host, None)

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` (not an older or newer lease of its task) is held."""
        return self.held.get(lease.id) is lease

    def renewed(self, lease: Lease, since: float) -> None:
        """A renewal sent at monotonic `since` succeeded."""
        if self.held.get(lease.id) is lease:
            self._deadline[lease.id] = since + self.lease_s

    def expired(self, lease: Lease) -> bool:
        """Whether this lease may have expired in Redis by now (local clock, with margin)."""
        return time.monotonic() > self._deadline.get(lease.id, 0) - self._margin_s

    def drop(self, lease: Lease, *, lost: bool = False) -> bool:
        """Stop holding `lease` (not a newer lease of the same task); whether it was held."""
        if self.held.get(lease.id) is not lease:
            return False
        del self.held[lease.id]
        self._deadline.pop(lease.id, None)
        self._end_slot(lease)
        if lost:
            self._metrics.leases_lost_total.inc()
        return True
