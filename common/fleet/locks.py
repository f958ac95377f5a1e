"""Token locks (``SET key token NX PX``) released or extended only by their holder.

The robots.txt fetch lock and the producer's crawl lock both use them; the check and the
write are one script each (``common/lua/release_lock.lua``, ``refresh_lock.lua``).
"""

from __future__ import annotations

from typing import Any

from common.redis.connection import RedisClient
from common.redis.scripts import register


class TokenLocks:
    """The two lock scripts, registered once on a client."""

    def __init__(self, client: RedisClient) -> None:
        self._release: Any = register(client, "release_lock")
        self._refresh: Any = register(client, "refresh_lock")

    async def release(self, key: str, token: str) -> bool:
        """Delete `key` if it still holds `token`; whether it did."""
        return int(await self._release(keys=[key], args=[token])) == 1

    async def refresh(self, key: str, token: str, ttl_ms: int) -> bool:
        """Extend `key` to `ttl_ms` if it still holds `token`; whether it did."""
        return int(await self._refresh(keys=[key], args=[token, ttl_ms])) == 1
