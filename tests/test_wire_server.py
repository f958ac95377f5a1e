"""bench/wire_server.py, the instrument frontier_bench's politeness verdict rests on: a
request's time is when its bytes arrived, not when a busy server got round to it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from support.benches import load_bench


def get(port: int, path: str, sent: list[float], replies: list[bytes],
        first_sent: threading.Event) -> None:
    """Two keep-alive GETs on one connection, 50 ms apart; notes when each was sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        for _ in range(2):
            sent.append(time.time())
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            first_sent.set()
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.endswith(b"hello"):
                chunk = conn.recv(4096)
                assert chunk, "the server closed the connection"
                reply += chunk
            replies.append(reply)
            time.sleep(0.05)


@pytest.mark.skipif(not hasattr(socket, "CMSG_SPACE"), reason="needs recvmsg ancillary data")
async def test_a_request_is_timed_when_it_arrived_not_when_a_busy_loop_read_it() -> None:
    wire = load_bench("wire_server")
    seen: list[tuple[str, str, float]] = []
    server = wire.WireServer(lambda host, path: (200, "text/plain", b"hello"), 0.0,
                             lambda host, path, at: seen.append((host, path, at)))
    port = server.listen(["127.0.0.1"])
    sent: list[float] = []
    replies: list[bytes] = []
    first_sent = threading.Event()
    client = threading.Thread(target=get, args=(port, "/p/1", sent, replies, first_sent))
    client.start()
    # The loop is busy (blocked on purpose) from before the first request until 300 ms
    # after it arrived.
    assert first_sent.wait(5)
    time.sleep(0.3)  # noqa: ASYNC251
    read_after = time.time()
    await asyncio.to_thread(client.join, 10)
    server.close()
    assert [r.split(b"\r\n")[0] for r in replies] == [b"HTTP/1.1 200 OK"] * 2
    assert [(h, p) for h, p, _ in seen] == [(f"127.0.0.1:{port}", "/p/1")] * 2
    assert server.untimed == 0
    first, second = seen[0][2], seen[1][2]
    assert abs(first - sent[0]) < 0.05 < read_after - first, "timed when read, not arrived"
    assert abs(second - sent[1]) < 0.05
