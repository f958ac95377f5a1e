"""A Redis that goes away at a chosen command, for the start-up fault tests: a TCP relay on
127.0.0.1 to a real redis-server that, when a client sends the `occurrence`-th command
holding `marker` (counted once a command holding `after` has gone by, when given),
drops that command (it never reaches Redis), every connection, and refuses new ones
(its listening socket closed) for `for_s` seconds; then it listens on the same port
again. `gone()` takes Redis away for good."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

_WORD = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n(?:\$\d+\r\n([^\r]{0,60})\r\n)?")


class RedisOutage:
    """See the module docstring. `seen` lists the commands relayed (name and first
    argument), `fired` is set when the outage began, `ended` when it ended."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.seen: list[str] = []
        self.fired = asyncio.Event()
        self.ended = asyncio.Event()
        self._marker: bytes | None = None
        self._after: bytes | None = None
        self._left = 0
        self._for_s = 0.0
        self._forever = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, marker: bytes, *, occurrence: int = 1, after: bytes | None = None,
            for_s: float = 3.0) -> None:
        """Go away for `for_s` s at the `occurrence`-th command holding `marker` (after
        a command holding `after`); for good with `for_s` 0."""
        self._marker, self._left, self._after = marker, occurrence, after
        self._for_s, self._forever = for_s, for_s <= 0

    async def start(self) -> RedisOutage:
        await self._listen()
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def gone(self) -> None:
        """Redis away for good: nothing listens, every connection dropped."""
        self._forever = True
        await self._drop()

    async def _drop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _outage(self) -> None:
        self.fired.set()
        await self._drop()
        await asyncio.sleep(self._for_s)
        if not self._forever:
            await self._listen()
            self.ended.set()

    def _hit(self, data: bytes) -> bool:
        for m in _WORD.finditer(data):
            self.seen.append(b" ".join(g for g in m.groups() if g).decode("latin-1"))
        if self._after is not None:
            at = data.find(self._after)
            if at < 0:
                return False
            data, self._after = data[at + len(self._after):], None
        if self._marker is None or self._marker not in data:
            return False
        self._left -= data.count(self._marker)
        if self._left > 0:
            return False
        self._marker = None
        task = asyncio.ensure_future(self._outage())
        self._tasks.add(task)
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def to_redis() -> None:
            while data := await reader.read(65536):
                if self._hit(data):
                    return  # the command never reaches Redis
                up_writer.write(data)
                await up_writer.drain()

        async def to_client() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(to_redis()), asyncio.ensure_future(to_client())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for pump in pumps:
                pump.cancel()
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()
                with contextlib.suppress(OSError, ConnectionError, asyncio.CancelledError):
                    await w.wait_closed()

    async def close(self) -> None:
        self._forever = True
        await self._drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def outage_relay(upstream_port: int) -> AsyncIterator[RedisOutage]:
    """A started `RedisOutage` to `upstream_port`, closed at the end."""
    relay = await RedisOutage(upstream_port).start()
    try:
        yield relay
    finally:
        await relay.close()
