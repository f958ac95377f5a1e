"""A bare HTTP/1.1 server that times each request by when its bytes reached the socket.

A politeness check is only as good as its clock. A server that notes the time in its
request handler notes when its event loop got round to the request: during a start burst
(a thousand hosts' first connections at once) that is up to ~100 ms after the bytes
arrived, so two requests sent a full delay apart read as closer. Here every read asks the
kernel for the receive timestamp of the data (SO_TIMESTAMPNS, Linux, TCP included), so a
request's time is when it arrived, however late the loop reads it.

It answers GET requests with keep-alive (what crawlers send); anything else is closed.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable, Iterable

SO_TIMESTAMPNS = 35  # Linux; socket does not name it (SCM_TIMESTAMPNS is the same number)
TIMESPEC = struct.Struct("@ll")
CMSG_SPACE = socket.CMSG_SPACE(TIMESPEC.size)
READ = 65_536

# (host header, path) -> (status, content type, body)
Answer = Callable[[str, str], tuple[int, str, bytes]]
REASONS = {200: "OK", 404: "Not Found"}


class WireServer:
    """Listens on every (address, port) given; `on_request(host, path, t)` is called with
    the kernel's receive time `t` (seconds, CLOCK_REALTIME) of each request's first
    bytes, and the answer is sent `latency` seconds after the request was read."""

    def __init__(self, answer: Answer, latency: float,
                 on_request: Callable[[str, str, float], None]) -> None:
        self.answer, self.latency, self.on_request = answer, latency, on_request
        self.untimed = 0  # reads the kernel gave no timestamp for (timed on reading)
        self._listeners: list[socket.socket] = []
        self._loop = asyncio.get_running_loop()

    def listen(self, addresses: Iterable[str], port: int = 0) -> int:
        """Listen on each address, on `port` (0: the first address picks one, the others
        use it); returns the port."""
        for address in addresses:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Set before connections arrive: an accepted socket inherits it, so even the
            # bytes that come with the handshake carry a timestamp.
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.bind((address, port))
            s.listen(1024)
            s.setblocking(False)
            port = s.getsockname()[1]
            self._listeners.append(s)
            self._loop.add_reader(s.fileno(), self._accept, s)
        return port

    def close(self) -> None:
        for s in self._listeners:
            self._loop.remove_reader(s.fileno())
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Connection(self, conn)


class _Connection:
    def __init__(self, server: WireServer, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.buf = b""
        self.started: float | None = None  # receive time of the pending request's start
        self.out = bytearray()
        self.writing = False
        server._loop.add_reader(sock.fileno(), self._read)

    def _read(self) -> None:
        try:
            data, ancdata, _, _ = self.sock.recvmsg(READ, CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close()
            return
        stamp = next((TIMESPEC.unpack_from(d) for level, kind, d in ancdata
                      if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS), None)
        if stamp is None:
            self.server.untimed += 1
            at = time.time()
        else:
            at = stamp[0] + stamp[1] / 1e9
        if not self.buf:
            self.started = at
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self._request(head, self.started or at)
            self.started = at if self.buf else None

    def _request(self, head: bytes, at: float) -> None:
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0]
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        host = next((v.strip() for k, v in headers.items() if k.lower() == "host"), "")
        if method != "GET":
            self._close()
            return
        self.server.on_request(host, path, at)
        status, kind, body = self.server.answer(host, path)
        reply = (f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n"
                 f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
                 ).encode() + body
        self.server._loop.call_later(self.server.latency, self._send, reply)

    def _send(self, reply: bytes) -> None:
        if self.sock.fileno() < 0:
            return
        self.out += reply
        self._flush()

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close()
            return
        del self.out[:sent]
        if self.out and not self.writing:
            self.writing = True
            self.server._loop.add_writer(self.sock.fileno(), self._flush)
        elif not self.out and self.writing:
            self.writing = False
            self.server._loop.remove_writer(self.sock.fileno())

    def _close(self) -> None:
        if self.sock.fileno() < 0:
            return
        self.server._loop.remove_reader(self.sock.fileno())
        if self.writing:
            self.server._loop.remove_writer(self.sock.fileno())
        self.sock.close()
