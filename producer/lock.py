"""The producer lock: one producer run per crawl at a time.

``SET crawlq:{crawl}:lock:producer <token> NX PX 30000``, refreshed every 10 s while the
run lasts and deleted at the end only if it still holds our token (compare-and-delete),
so a run that was paused past the TTL never deletes a newer run's lock. If a producer
dies, its lock expires within 30 s. Dedup already keeps two runs from enqueueing a URL
twice; the lock keeps them from doing the same work twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from common.errors import CrawlqError
from common.fleet.locks import TokenLocks
from common.keys import CrawlKeys
from common.redis.connection import RedisClient

__all__ = ["LockHeldError", "ProducerLock"]

log = logging.getLogger("producer.lock")

TTL_MS = 30_000
REFRESH_S = 10.0
POLL_S = 0.25



class LockHeldError(CrawlqError):
    """Another producer holds the crawl's lock."""


class ProducerLock:
    """``async with ProducerLock(client, crawl, wait_s):`` holds the lock for the block."""

    def __init__(self, client: RedisClient, crawl: str, wait_s: float = 0.0,
                 *, ttl_ms: int = TTL_MS, refresh_s: float = REFRESH_S) -> None:
        self._client = client
        self._crawl = crawl
        self._key = CrawlKeys.build(crawl).producer_lock
        self._wait_s = wait_s
        self._ttl_ms = ttl_ms
        self._refresh_s = refresh_s
        self._token = secrets.token_hex(16)
        self._locks = TokenLocks(client)
        self._task: asyncio.Task[None] | None = None

    async def acquire(self) -> None:
        """Take the lock, waiting up to ``wait_s``; raises LockHeldError after that."""
        deadline = time.monotonic() + self._wait_s
        waited = False
        while True:
            if await self._client.set(self._key, self._token, nx=True, px=self._ttl_ms) \
                    or await self._client.get(self._key) == self._token.encode():
                break  # ours; also when a SET sent again finds what its first run set
            left = deadline - time.monotonic()
            if left <= 0:
                ttl_ms = await self._client.pttl(self._key)
                expires = f"expires in {max(1, -(-int(ttl_ms) // 1000))}s" if ttl_ms > 0 \
                    else "just released"
                raise LockHeldError(
                    f"another producer is running for crawl {self._crawl} (lock held, "
                    f"{expires}); retry later or pass --lock-wait")
            if not waited:
                log.info("producer_lock_wait", extra={"crawl": self._crawl,
                                                      "wait_s": round(self._wait_s, 1)})
                waited = True
            await asyncio.sleep(min(POLL_S, left))
        self._task = asyncio.create_task(self._keep(), name="producer-lock-refresh")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                ok = await self._locks.refresh(self._key, self._token, self._ttl_ms)
            except Exception as exc:  # a blip must not kill the run; the TTL covers 30 s
                log.warning("producer_lock_refresh_failed", extra={"error": str(exc)})
                continue
            if not ok:
                log.warning("producer_lock_lost", extra={"crawl": self._crawl})
                if await self._client.set(self._key, self._token, nx=True, px=self._ttl_ms):
                    log.info("producer_lock_retaken", extra={"crawl": self._crawl})

    async def release(self) -> None:
        """Stop refreshing and delete the lock if it is still ours."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._locks.release(self._key, self._token)

    async def close(self) -> None:
        """`release`, whatever Redis answers (the lock expires by itself)."""
        with contextlib.suppress(Exception):
            await self.release()

    async def __aenter__(self) -> ProducerLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
