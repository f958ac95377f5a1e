"""lease.lua's reply, parsed. Its layout is declared once, here: the field order of
`LeaseReply` (less `granted`) is the reply's head, the field order of `Granted` one leased
task's group after it. tests/test_lua_headers.py checks both against the script's header
("Returns"), so neither side can move a value alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from common import codec
from common.codec import text as _text
from common.errors import MalformedTaskError
from common.queue.model import MALFORMED, Failure, Lease
from common.tasks.task import Task, decode_entry


@dataclass(frozen=True, slots=True)
class Granted:
    """One leased task, as lease.lua gives it (bytes as Redis sends them)."""

    id: bytes
    token: bytes
    attempt: int
    entry: bytes
    checkpoint: bytes | None  # its checkpoint JSON, None (Lua false) for none
    last_error: bytes | None
    host: bytes
    delay_ms: int  # the host's delay: with one, the request goes out at its turn
    concurrency: int  # the host's concurrency, 0 if unlimited
    turn_ms: int  # its turn (Redis ms): the call's time, or up to ahead_ms later

    def lease(self, partition: int, deadline_ms: int) -> Lease:
        """The lease; MalformedTaskError or ValueError when its entry can't be read."""
        checkpoint = codec.loads(self.checkpoint) if self.checkpoint else None
        task = decode_entry(self.entry, attempt=int(self.attempt),
                            last_error=_text(self.last_error) if self.last_error else None,
                            checkpoint=checkpoint)
        return Lease(task, partition, _text(self.token), deadline_ms, _text(self.host),
                     int(self.turn_ms), delay_ms=int(self.delay_ms),
                     concurrency=int(self.concurrency))


@dataclass(frozen=True, slots=True)
class LeaseReply:
    """One lease.lua reply: what the call saw, then the tasks it leased."""

    now_ms: int  # Redis TIME of the call
    deadline_ms: int
    wait_ms: int  # -1: no host holds work; 0: hosts are ready; else ms to the next turn
    retry_ms: int  # ms until the next retry is due (0: one is due now), -1 if none waits
    paused: int  # 1: the crawl is paused (nothing leased)
    next: list[bytes]  # the candidate hosts for the next call
    policy_version: int  # of this partition's conf (-1: a call on no hosts didn't read it)
    render_met: int  # 1: a call without the render lane's keys met a render entry
    granted: tuple[Granted, ...] = ()

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> LeaseReply:
        return cls(**dict(zip(HEAD_NAMES, raw, strict=False)), granted=tuple(
            Granted(*raw[i:i + WIDTH]) for i in range(HEAD, len(raw), WIDTH)))

    def leases(self, partition: int) -> tuple[list[Lease], list[Failure]]:
        """The leases, and a permanent failure for each task whose body can't be
        decoded (to dead-letter as ``malformed``, its raw bytes kept)."""
        leases: list[Lease] = []
        malformed: list[Failure] = []
        for g in self.granted:
            try:
                leases.append(g.lease(partition, self.deadline_ms))
            except (MalformedTaskError, ValueError) as exc:
                stub = Task(id=_text(g.id), url="", attempt=int(g.attempt))
                malformed.append(Failure(
                    Lease(stub, partition, _text(g.token), self.deadline_ms, _text(g.host)),
                    MALFORMED, str(exc), permanent=True))
        return leases, malformed


#: The reply's head (before the leased tasks), its length, and one leased task's width.
HEAD_NAMES = tuple(f.name for f in fields(LeaseReply) if f.name != "granted")
HEAD = len(HEAD_NAMES)
WIDTH = len(fields(Granted))
