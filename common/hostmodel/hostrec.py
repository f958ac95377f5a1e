"""A host's record as Redis keeps it: its field of the partition's ``hosts`` HASH, 18
little-endian doubles (``struct`` ``<18d``). lib/hosts.lua's ``host_decode`` /
``host_encode`` are the scripts' side; this is Python's, the one place that names the
fields. Settings are -1 in the record when unset (None here: the crawl's default
applies)."""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

FORMAT = struct.Struct("<18d")
#: The fields in record order; the second group are settings, unset when -1.
FIELDS = ("queued", "inflight", "last", "done", "delay", "conc", "budget", "used", "blocked",
          "robots", "reserved", "level", "pace", "pb_at", "pb_done", "fade", "pushbacks", "lat")
OPTIONAL = frozenset({"delay", "conc", "budget", "robots", "pb_at", "pb_done", "fade", "lat"})


class HostRecordError(ValueError):
    """A host record of the wrong size (written by another crawlq, or damaged)."""


@dataclass(frozen=True, slots=True)
class HostRecord:
    """One host's counters, settings and push-back state (times in ms of Redis TIME)."""

    queued: int = 0  # pending tasks
    inflight: int = 0  # leases whose response is not in
    last: int = 0  # its last request's start
    done: int = 0  # tasks acked
    delay: int | None = None  # ms between requests, when not the crawl's
    conc: int | None = None  # requests in flight (0: no limit), when not the crawl's
    budget: int | None = None  # pages it may be fetched
    used: int = 0  # pages of the budget fetched
    blocked: int = 0  # no request before this
    robots: int | None = None  # robots.txt's Crawl-delay (ms)
    reserved: int = 0  # leases holding a page of the budget
    level: int = 0  # backoff level (push-backs in a row, less what was forgiven)
    pace: int = 0  # the delay its push-back taught (ms, fading: pace_at)
    pb_at: int | None = None  # when its last push-back came
    pb_done: int | None = None  # its done count then
    fade: int | None = None  # the pace's half-life (ms)
    pushbacks: int = 0  # push-backs it gave
    lat: int | None = None  # its response time (ms, moving average; adaptive_delay on)

    @classmethod
    def decode(cls, value: bytes | None) -> HostRecord:
        """The record of a ``hosts`` field (None: a host never seen, all defaults)."""
        if value is None:
            return cls()
        if len(value) != FORMAT.size:
            raise HostRecordError(f"a host record is {FORMAT.size} bytes, this one "
                                  f"{len(value)}: run crawlq fsck --repair")
        values = FORMAT.unpack(value)
        fields: dict[str, int | None] = {
            name: None if name in OPTIONAL and v < 0 else int(v)
            for name, v in zip(FIELDS, values, strict=True)}
        return cls(**fields)  # type: ignore[arg-type]

    def encode(self) -> bytes:
        """The record's bytes (tests, and tools that write a record whole)."""
        return FORMAT.pack(*(-1 if v is None else v for v in astuple(self)))

    def adaptive_ms(self, adapt: int, max_delay_ms: int) -> int:
        """The delay its response time gives under the crawl's adaptive_delay (`adapt`,
        in thousandths; 0: off): lib/hosts.lua's host_limits."""
        if adapt <= 0 or self.lat is None:
            return 0
        return min(max_delay_ms, int(self.lat * adapt / 1000 + 0.5))

    def pace_at(self, now_ms: int) -> int:
        """The delay its push-back taught, at `now_ms`: lib/hosts.lua's pace_now."""
        if self.pace <= 0:
            return 0
        quiet = now_ms - self.blocked
        if quiet <= 0:
            return self.pace
        paced = self.pace * 2 ** (-quiet / max(self.fade or 1, 1))
        return 0 if paced < 1 else int(paced + 0.5)

    @property
    def budget_spent(self) -> bool:
        """Whether a budget is set and its pages used and held fill it."""
        return self.budget is not None and self.used + self.reserved >= self.budget
