"""A politeness group's record as Redis keeps it: its field of the partition's ``groups``
HASH, 5 little-endian doubles (``struct`` ``<5d``). lib/groups.lua's ``group_decode`` /
``group_encode`` are the scripts' side; this is Python's. Its delay and concurrency are
-1 in the record when unset (None here: the crawl's group_delay / group_concurrency)."""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

FORMAT = struct.Struct("<5d")


class GroupRecordError(ValueError):
    """A group record of the wrong size (damaged, or written by another crawlq)."""


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One group's counters and settings (times in ms of Redis TIME)."""

    last: int = 0  # the start of the last request to one of its hosts
    inflight: int = 0  # leases holding a slot of it
    delay: int | None = None  # ms between requests to its hosts, when not the crawl's
    conc: int | None = None  # requests in flight to its hosts (0: no limit), likewise
    blocked: int = 0  # no request before this (a push-back of one of its hosts)

    @classmethod
    def decode(cls, value: bytes | None) -> GroupRecord:
        """The record of a ``groups`` field (None: a group with no record yet)."""
        if value is None:
            return cls()
        if len(value) != FORMAT.size:
            raise GroupRecordError(f"a group record is {FORMAT.size} bytes, this one "
                                   f"{len(value)}: run crawlq fsck --repair")
        last, inflight, delay, conc, blocked = FORMAT.unpack(value)
        return cls(int(last), int(inflight), None if delay < 0 else int(delay),
                   None if conc < 0 else int(conc), int(blocked))

    def encode(self) -> bytes:
        """The record's bytes (tests, and fsck when it writes a count)."""
        return FORMAT.pack(*(-1 if v is None else v for v in astuple(self)))
