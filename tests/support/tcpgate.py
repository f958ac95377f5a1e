"""A TCP relay on 127.0.0.1 whose client-to-server direction a test can hold and release.

A client connected through the gate talks to the real server as usual; while the gate
holds, what the client sends is kept (in the order sent) instead of forwarded, and
released to the server at `release()`. The server's answers always pass. A test uses it
to make a real client's request reach the server late, after other clients' requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class TcpGate:
    """Relays connections on `port` to 127.0.0.1:`target_port`; see the module docstring."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.held_bytes = 0  # client bytes kept since hold()
        self.replied_bytes = 0  # server bytes passed since release()
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def hold(self) -> None:
        """Keep what clients send from now on."""
        self.held_bytes = 0
        self._open.clear()

    def release(self) -> None:
        """Forward what was kept, and everything after it."""
        self.replied_bytes = 0
        self._open.set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    *, upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upstream:
                    if not self._open.is_set():
                        self.held_bytes += len(data)
                    await self._open.wait()
                else:
                    self.replied_bytes += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        for coro in (self._pipe(client_r, server_w, upstream=True),
                     self._pipe(server_r, client_w, upstream=False)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TcpGate]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
