"""Micro-batching: many coroutines ask, one round trip answers them all."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")


class MicroBatcher(Generic[Req, Res]):
    """Collects requests made in one event-loop turn and answers them with one call.

    ``call`` gets the requests in order and returns one result per request; if it
    raises, every waiting request raises the same error.
    """

    def __init__(self, call: Callable[[Sequence[Req]], Awaitable[Sequence[Res]]],
                 max_batch: int = 500) -> None:
        self._call = call
        self._max_batch = max_batch
        self._pending: list[tuple[Req, asyncio.Future[Res]]] = []
        self._wakeup = asyncio.Event()

    async def request(self, req: Req) -> Res:
        """Queue one request and wait for its answer."""
        fut: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        self._pending.append((req, fut))
        self._wakeup.set()
        return await fut

    async def run(self) -> None:
        """Serve requests until cancelled."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(0)  # let the other coroutines of this turn add theirs
            while self._pending:
                batch = self._pending[:self._max_batch]
                del self._pending[:self._max_batch]
                live = [(r, f) for r, f in batch if not f.done()]
                if not live:
                    continue
                try:
                    results = await self._call([r for r, _ in live])
                except Exception as exc:
                    for _, fut in live:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), result in zip(live, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
