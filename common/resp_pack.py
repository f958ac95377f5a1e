"""Pack Redis commands with hiredis on every crawlq client.

redis-py's asyncio connections pack every argument in Python (its sync client uses
hiredis when installed). An enqueue call carries ~5 arguments per URL and a lease or
ack ~3 per task, so packing is a large share of the hot path's CPU;
``hiredis.pack_command`` writes the same bytes (a test compares them) several times
faster. ``common.connection.connect`` applies it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer

try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    HAVE_HIREDIS = False
else:
    HAVE_HIREDIS = True

__all__ = ["HAVE_HIREDIS", "use_hiredis_packer"]

_SERIALIZER = HiredisRespSerializer()


class _HiredisPackMixin:
    """Overrides the two packing methods of a redis.asyncio connection class."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # The common case (a one-word command, no memoryviews) goes straight to hiredis;
        # anything else takes redis-py's own hiredis path, which handles those.
        head = args[0]
        if isinstance(head, str) and " " not in head:
            try:
                return [_pack(args)]
            except TypeError:
                pass
        packed: list[bytes] = _SERIALIZER.pack(*args)
        return packed

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        out: list[bytes] = []
        for cmd in commands:
            out.extend(_SERIALIZER.pack(*cmd))
        return [b"".join(out)]


def use_hiredis_packer(client: aioredis.Redis) -> bool:
    """Make the client's future connections pack with hiredis; False if it can't."""
    if not HAVE_HIREDIS:
        return False
    pool = client.connection_pool
    base = pool.connection_class
    if issubclass(base, _HiredisPackMixin):
        return True
    pool.connection_class = type(f"HiredisPack{base.__name__}", (_HiredisPackMixin, base), {})
    return True
