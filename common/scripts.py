"""Loads the Lua scripts of ``common/lua`` and registers them with a Redis client.

Each script file gets ``lib.lua`` (shared helpers) prepended, then is registered once
with redis-py's ``register_script``, which runs it by EVALSHA and reloads it on NOSCRIPT
(so a ``SCRIPT FLUSH`` or a Redis restart mid-run is harmless).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

NAMES = (
    "enqueue", "enqueue_bloom", "lease", "renew", "ack", "fail", "release", "checkpoint",
    "reclaim", "promote", "requeue", "purge", "host_set", "is_empty",
)


@cache
def source(name: str) -> str:
    """The full source of one script, library prepended."""
    lua = Path(__file__).parent / "lua"
    return (lua / "lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


class Scripts:
    """The registered scripts of one client, as attributes named after their files."""

    def __init__(self, client: Any) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))

    enqueue: Any
    enqueue_bloom: Any
    lease: Any
    renew: Any
    ack: Any
    fail: Any
    release: Any
    checkpoint: Any
    reclaim: Any
    promote: Any
    requeue: Any
    purge: Any
    host_set: Any
    is_empty: Any
