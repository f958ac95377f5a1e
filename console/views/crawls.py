"""What an operator sees of a crawl at a glance: its settings, age, states, rates; and
its keys, to delete it whole.

`summary` reads one crawl (the queue's `stats()` pipeline, the last minute of its
history, the crawl's creation time and its worker count); `summaries` does it for every
crawl in the Redis. ``crawlq stats``, ``crawlq crawls`` and the dashboard print them.
`crawl_keys` and `delete_crawl`: ``crawlq reset``, and ``crawlq demo`` / ``crawlq run``,
which start their crawl afresh.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from common.codec import text as _text
from common.errors import ConfigError
from common.fleet import history
from common.fleet.workers import read_workers
from common.frontier.hosts import Frontier
from common.keys import CRAWLS, PREFIX, CrawlKeys
from common.queue import CrawlQueue, Stats
from common.redis.connection import RedisClient
from console.views.losses import link_fates

#: At most this many crawls are summarized per call (by name).
MAX_CRAWLS = 200
#: Crawls summarized at once: each holds a few connections while it reads.
CONCURRENCY = 8
STATES = ("pending", "leased", "waiting", "dead", "done")
_OUTCOME = "outcome:"


@dataclass(frozen=True, slots=True)
class CrawlSummary:
    """One crawl's state at `now_ms` (ms of Redis TIME)."""

    crawl: str
    partitions: int
    dedup: str
    created_ms: int | None  # None for a crawl created before creation times were kept
    now_ms: int
    stats: Stats
    rates: dict[str, Any] | None  # history.rates over the last minute
    workers: int  # live workers
    paused: bool = False

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        return {
            "crawl": self.crawl,
            "settings": {"partitions": self.partitions, "dedup": self.dedup},
            "created_ms": self.created_ms,
            "now_ms": self.now_ms,
            "states": dict(zip(STATES, (s.pending, s.leased, s.waiting, s.dead, s.done),
                               strict=True)),
            "hosts_due": s.hosts_due,
            "parked": s.parked,
            "render_pending": s.render_pending,
            "paused": self.paused,
            "counters": dict(sorted(s.counters.items())),
            "outcomes": {k[len(_OUTCOME):]: v for k, v in sorted(s.counters.items())
                         if k.startswith(_OUTCOME)},
            "links": link_fates(s.counters),
            "rates": self.rates,
            "dead_reasons": dict(sorted(s.dead_reasons.items(), key=lambda kv: -kv[1])),
            "workers": self.workers,
            "revisits": None if s.revisits is None else s.revisits.to_json(),
        }


async def summary(queue: CrawlQueue) -> CrawlSummary:
    """One crawl's summary: a handful of round trips, whatever the crawl's size."""
    client = queue.client
    workers = await read_workers(client, queue.crawl)
    stats, snaps, created, paused = await asyncio.gather(
        queue.stats(),
        history.read(client, queue.crawl,
                     back_to=workers.now_ms / 1000 - history.RATE_WINDOW_S),
        client.hget(CrawlKeys.build(queue.crawl).meta, "created_ms"),
        Frontier(queue).is_paused())
    return CrawlSummary(queue.crawl, queue.settings.partitions, queue.settings.dedup.value,
                        int(created) if created else None, workers.now_ms, stats,
                        history.rates(snaps), len(workers.workers), paused)


async def crawl_names(client: RedisClient) -> list[str]:
    """Every crawl name in this Redis, sorted."""
    return sorted(_text(n) for n in await client.smembers(CRAWLS))


async def summaries(client: RedisClient, limit: int = MAX_CRAWLS
                    ) -> tuple[list[CrawlSummary | str], int]:
    """Summaries of the first `limit` crawls by name, and how many crawls there are.

    A crawl whose settings are missing or unreadable (partly deleted) is its bare name.
    """
    names = await crawl_names(client)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(name: str) -> CrawlSummary | str:
        async with gate:
            try:
                return await summary(await CrawlQueue.existing(client, name))
            except (ConfigError, ValueError, KeyError):
                return name

    return list(await asyncio.gather(*(one(n) for n in names[:limit]))), len(names)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\{}])", r"\\\1", text)


async def crawl_keys(client: RedisClient, crawl: str) -> list[str]:
    """Every key of one crawl: its crawl-wide keys and those of each of its partitions.

    Matches are checked again in Python, so a crawl named ``a`` never takes ``ab``'s keys.
    """
    name = _glob_escape(crawl)
    own = re.compile(rf"^{re.escape(PREFIX)}:\{{{re.escape(crawl)}(?::\d+(?:\.\d+)?)?\}}:")
    found: list[str] = []
    for pattern in (f"{PREFIX}:\\{{{name}\\}}:*", f"{PREFIX}:\\{{{name}:*"):
        async for key in client.scan_iter(match=pattern, count=10_000):
            text = _text(key)
            if own.match(text):
                found.append(text)
    return sorted(set(found))


async def delete_crawl(client: RedisClient, crawl: str) -> int:
    """Delete every key of one crawl (`crawl_keys`) and its name; returns how many keys."""
    keys = await crawl_keys(client, crawl)
    for i in range(0, len(keys), 500):
        await client.unlink(*keys[i:i + 500])
    await client.srem(CRAWLS, crawl)
    return len(keys)
