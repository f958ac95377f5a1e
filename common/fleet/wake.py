"""Wake-ups: telling a crawl's idle consumers that work may be ready, over pub/sub.

A consumer with nothing to lease backs off (up to a second) before it asks again. When a
flush frees a host's slot or enqueues discovered links, or a producer enqueues, it
publishes on the crawl's wake channel, and every consumer subscribed to it asks at once.
It is a hint, never the truth: Redis' queues stay the only state, a lost message costs
one poll interval, and a consumer that can't subscribe polls as before.

A publish costs a round trip, so a publisher that found nobody else listening (PUBLISH
returns how many did: itself, or none) stays quiet for `quiet_s` before it looks again.

The same channel carries one other message, `POLICY` (``notify_policy``, sent by
``common.policy`` after a change): the crawl's policy changed, read it again. It is
never held back by the quiet time (changes are rare and a listener may have just come).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from common.redis.connection import RedisClient
from common.redis.errors import REDIS_ERRORS

log = logging.getLogger("crawlq.wake")

#: A wake-up's payload (work may be ready) and a policy change's.
WAKE = b"1"
POLICY = b"policy"
_POLICIES = (POLICY, POLICY.decode())  # as bytes, or as text from a decoding client


#: How often a listener looks whether it should stop (a wait on its socket, no command).
LISTEN_POLL_S = 0.1


class WakeChannel:
    """One crawl's wake channel: `notify` publishes, `listen` calls back on each message."""

    def __init__(self, client: RedisClient, channel: str, *, listening: bool = False,
                 quiet_s: float = 0.1) -> None:
        self.client = client
        self.channel = channel
        self._self = 1 if listening else 0  # a listener's own publish reaches itself
        self._quiet_s = quiet_s
        self._quiet_until = 0.0

    async def notify(self) -> None:
        """Publish a wake-up, unless nobody else was listening a moment ago; errors are
        logged, never raised (a wake-up is a hint)."""
        now = time.monotonic()
        if now < self._quiet_until:
            return
        try:
            heard = int(await self.client.publish(self.channel, WAKE))
        except REDIS_ERRORS as exc:
            log.debug("wake_publish_failed", extra={"error": str(exc)[:200]})
            heard = 0
        if heard <= self._self:
            self._quiet_until = now + self._quiet_s

    async def notify_policy(self) -> None:
        """Publish a policy change; errors are logged, never raised."""
        try:
            await self.client.publish(self.channel, POLICY)
        except REDIS_ERRORS as exc:
            log.debug("wake_publish_failed", extra={"error": str(exc)[:200]})

    async def listen(self, on_wake: Callable[[], None], closing: Callable[[], bool], *,
                     on_policy: Callable[[], None] | None = None) -> None:
        """Call `on_wake` for every wake-up and `on_policy` for every policy change until
        `closing()` (looked at every LISTEN_POLL_S); resubscribe after errors.

        Stop it through `closing`, not by cancelling it: a cancel that lands while
        redis-py opens the subscription's connection loses that connection unclosed."""
        delay = 0.1
        while not closing():
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                delay = 0.1
                while not closing():
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=LISTEN_POLL_S)
                    if message is None:
                        continue
                    if message.get("data") in _POLICIES:
                        if on_policy is not None:
                            on_policy()
                    else:
                        on_wake()
            except REDIS_ERRORS as exc:
                log.debug("wake_listen_failed", extra={"error": str(exc)[:200]})
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()
