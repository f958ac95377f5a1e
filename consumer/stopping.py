"""How far one consumer is in stopping: read by each of its parts, set by its lifecycle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Stopping:
    """`draining`: lease nothing more, finish what started; `closing`: every loop ends
    (checked as well as cancelled: redis-py can turn a cancellation that lands
    mid-command into a connection error, which a loop would catch and go on)."""

    draining: bool = False
    closing: bool = False
    #: Set at the first stop request: ends the leaser's waits.
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set at the second (or when the sink gave up): ends the drain's grace at once.
    hard: asyncio.Event = field(default_factory=asyncio.Event)

    def is_closing(self) -> bool:
        return self.closing
