"""Converting a live crawl from layout 2 to layout 3 (``common.queue.crawl.FORMAT``).

`migrate_crawl` runs ``common/lua/migrate.lua`` on every partition (each converted in
one atomic call: host records from the old per-host ZSETs and ``hostconf``, lease records
from ``owners``, ``tasks`` and ``attempts``, the old keys deleted), then marks the crawl's
settings ``"format": 3``. The mark comes last, so a run cut short leaves the crawl of
layout 2 and the next run converts what is left (the script is idempotent: a partition
converted already is left as it is). One process converts at a time (a SET NX PX lock on
the crawl, `CrawlKeys.migrate_lock`); the others wait for its lock, then find the crawl
converted.

Who runs it: a consumer opening the crawl (`LeasingQueue.open` / `existing`, and the
consumer's start before it writes the crawl's policy) and ``crawlq fsck --repair``.
Everything else refuses a crawl of layout 2 (`CrawlNeedsMigration`). The producers and
consumers of the older crawlq must be stopped first: their scripts write the old keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from common import codec
from common.connection import RedisClient
from common.errors import ConfigError
from common.keys import CrawlKeys, PartitionKeys, layout2_keys
from common.queue.crawl import FORMAT, CrawlNeedsMigration, CrawlSettings, partition_keys
from common.scripts import register

log = logging.getLogger("crawlq.migrate")

#: How long the lock holds without a refresh (refreshed after every partition).
LOCK_TTL_MS = 60_000
#: How long a process waits for another one's conversion before it gives up.
WAIT_S = 600.0
#: How often a waiting process looks again.
POLL_S = 0.2


class MigrationBusyError(ConfigError):
    """Another process held the crawl's conversion longer than this one waited."""


@dataclass(slots=True)
class Converted:
    """What migrate.lua reported, summed over partitions."""

    partitions: int = 0
    hosts: int = 0
    hosts_kept: int = 0  # had a record already
    leases: int = 0
    leases_kept: int = 0  # had a record already
    no_body: int = 0  # an owner without a task body: left as it was

    def add(self, reply: list[int]) -> None:
        hosts, hosts_kept, leases, leases_kept, no_body = (int(v) for v in reply)
        self.partitions += 1
        self.hosts += hosts
        self.hosts_kept += hosts_kept
        self.leases += leases
        self.leases_kept += leases_kept
        self.no_body += no_body


def migration_keys(pk: PartitionKeys) -> list[str]:
    """migrate.lua's KEYS for one partition, in its header's order."""
    return [*pk.host_state, pk.leased, pk.tasks, pk.attempts,
            *layout2_keys(pk.crawl, pk.partition)]


def _pending_settings(raw: bytes | str | None, crawl: str) -> CrawlSettings | None:
    """The settings of a crawl that holds layout 2, None for one that needs nothing (no
    such crawl, or layout 3); CrawlFormatError for a crawl of an older layout."""
    if raw is None:
        return None
    try:
        CrawlSettings.from_json(raw, crawl)
    except CrawlNeedsMigration as exc:
        return exc.settings
    return None


async def migrate_crawl(client: RedisClient, crawl_name: str, *,
                        wait_s: float = WAIT_S) -> int:
    """Convert crawl `crawl_name` from layout 2 to layout 3; returns how many partitions
    this call converted (0: nothing to do, no such crawl, or another process did it
    meanwhile). MigrationBusyError when another process holds the conversion longer than
    `wait_s`; CrawlFormatError for a crawl of a layout older than 2."""
    meta = CrawlKeys.build(crawl_name).meta
    if _pending_settings(await client.hget(meta, "settings"), crawl_name) is None:
        return 0
    held = _Lock(client, CrawlKeys.build(crawl_name).migrate_lock, uuid.uuid4().hex)
    given_up = time.monotonic() + wait_s
    while not await client.set(held.key, held.token, nx=True, px=LOCK_TTL_MS):
        if time.monotonic() > given_up:
            raise MigrationBusyError(
                f"crawl {crawl_name!r} is being converted from layout 2 by another process "
                f"(it holds {held.key}) for more than {wait_s:g}s: try again later")
        await asyncio.sleep(POLL_S)
    try:
        raw = await client.hget(meta, "settings")  # the holder before may have finished
        settings = _pending_settings(raw, crawl_name)
        if settings is None or raw is None:
            return 0
        return await _convert(client, crawl_name, settings, raw, held)
    finally:
        await held.release()


@dataclass(frozen=True, slots=True)
class _Lock:
    """The conversion's lock, as this process holds it: extended and released only by
    its holder (the token locks' scripts; common.locks is a layer above the queue)."""

    client: RedisClient
    key: str
    token: str

    async def refresh(self) -> None:
        # A lock lost meanwhile (its TTL passed) is harmless: a partition converted twice
        # is unchanged the second time.
        await register(self.client, "refresh_lock")(keys=[self.key],
                                                    args=[self.token, LOCK_TTL_MS])

    async def release(self) -> None:
        await register(self.client, "release_lock")(keys=[self.key], args=[self.token])


async def _convert(client: RedisClient, crawl: str, settings: CrawlSettings,
                   raw: bytes | str, held: _Lock) -> int:
    script = register(client, "migrate")
    done = Converted()
    log.info("crawl_migrating", extra={"crawl": crawl, "partitions": settings.partitions})
    for keys in partition_keys(crawl, settings):
        done.add(await script(keys=migration_keys(keys), args=[]))
        await held.refresh()
    stored = codec.loads(raw)
    stored["format"] = FORMAT
    await client.hset(CrawlKeys.build(crawl).meta, "settings", codec.dumps(stored))
    log.info("crawl_migrated", extra={
        "crawl": crawl, "partitions": done.partitions, "hosts": done.hosts,
        "leases": done.leases, "hosts_kept": done.hosts_kept,
        "leases_kept": done.leases_kept})
    if done.no_body:
        log.warning("crawl_migrated_leases_without_body", extra={
            "crawl": crawl, "leases": done.no_body,
            "advice": f"crawlq fsck --crawl {crawl} lists them"})
    return done.partitions
