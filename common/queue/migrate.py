"""Converting a live crawl to layout 4 (``common.queue.crawl.FORMAT``): from layout 2
to 3, then from 3 to 4.

2 -> 3: `migrate_crawl` runs ``common/lua/migrate.lua`` on every partition (each
converted in one atomic call: host records from the old per-host ZSETs and ``hostconf``,
lease records from ``owners``, ``tasks`` and ``attempts``, the old keys deleted), then
marks the crawl's settings ``"format": 3``.

3 -> 4: every host's queues (each host ``h:queued`` names) are compacted by
``common/lua/compact_queues.lua`` (``common.tasks.task.compact_entry``), a chunk of `CHUNK`
entries per call, calls for `HOSTS_AT_ONCE` hosts pipelined: a big partition never
blocks Redis for long. Then the done URLs' history records move from layout 3's one
``rv:hist`` HASH of text records to the binary ones in ``rv:hist:<bucket>`` HASHes
(``common/lua/compact_history.lua``, `CHUNK` ids a call, read by HSCAN). Then the
settings are marked ``"format": 4``. (Layout 4 was not released before its history
became compact too, so no crawl holds layout 4 with layout 3's history.)

Each mark comes last, so a run cut short leaves the crawl of the layout before and the
next run converts what is left (both scripts are idempotent: a partition or an entry
converted already is left as it is). One process converts at a time (a SET NX PX lock on
the crawl, `CrawlKeys.migrate_lock`); the others wait for its lock, then find the crawl
converted.

Who runs it: a consumer opening the crawl (`LeasingQueue.open` / `existing`, and the
consumer's start before it writes the crawl's policy) and ``crawlq fsck --repair``.
Everything else refuses a crawl of layout 2 or 3 (`CrawlNeedsMigration`). The producers
and consumers of the older crawlq must be stopped first: their scripts write the old
layout.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from common import codec
from common.errors import ConfigError
from common.keys import (
    HASHTABLE_FIELD,
    LEGACY_HASHTABLE_FIELD,
    CrawlKeys,
    PartitionKeys,
    layout2_keys,
    layout3_history_key,
)
from common.queue.calls import Call, run
from common.queue.crawl import (
    FORMAT,
    LAYOUT2,
    LAYOUT3,
    Crawl,
    CrawlNeedsMigration,
    CrawlSettings,
    partition_keys,
)
from common.redis.connection import RedisClient
from common.redis.scripts import register
from common.tasks.task import is_task_id

log = logging.getLogger("crawlq.migrate")

#: How long the lock holds without a refresh (refreshed after every partition).
LOCK_TTL_MS = 60_000
#: The most entries of one host's queue one compact_queues call converts.
CHUNK = 1000
#: The hosts whose compact_queues calls go in one pipeline.
HOSTS_AT_ONCE = 200
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


def _pending(raw: bytes | str | None, crawl: str) -> tuple[CrawlSettings, int] | None:
    """The settings and layout of a crawl that holds layout 2 or 3, None for one that
    needs nothing (no such crawl, or layout 4); CrawlFormatError for a crawl of an older
    layout."""
    if raw is None:
        return None
    try:
        CrawlSettings.from_json(raw, crawl)
    except CrawlNeedsMigration as exc:
        return exc.settings, exc.layout
    return None


async def migrate_crawl(client: RedisClient, crawl_name: str, *,
                        wait_s: float = WAIT_S) -> int:
    """Convert crawl `crawl_name` to layout 4 (from 2, or 3); returns how many partitions
    this call converted (0: nothing to do, no such crawl, or another process did it
    meanwhile). MigrationBusyError when another process holds the conversion longer than
    `wait_s`; CrawlFormatError for a crawl of a layout older than 2."""
    meta = CrawlKeys.build(crawl_name).meta
    if _pending(await client.hget(meta, "settings"), crawl_name) is None:
        return 0
    held = _Lock(client, CrawlKeys.build(crawl_name).migrate_lock, uuid.uuid4().hex)
    given_up = time.monotonic() + wait_s
    while not await client.set(held.key, held.token, nx=True, px=LOCK_TTL_MS):
        if time.monotonic() > given_up:
            raise MigrationBusyError(
                f"crawl {crawl_name!r} is being converted to layout 4 by another process "
                f"(it holds {held.key}) for more than {wait_s:g}s: try again later")
        await asyncio.sleep(POLL_S)
    try:
        converted = 0
        while True:  # the holder before may have finished, or done 2 -> 3
            raw = await client.hget(meta, "settings")
            pending = _pending(raw, crawl_name)
            if pending is None or raw is None:
                return converted
            settings, layout = pending
            step = _convert2 if layout == LAYOUT2 else _convert3
            converted = max(converted, await step(client, crawl_name, settings, held))
            await _mark(client, crawl_name, raw, layout + 1)
    finally:
        await held.release()


async def _mark(client: RedisClient, crawl: str, raw: bytes | str, layout: int) -> None:
    """The crawl's settings say `layout`: the last step of a conversion."""
    stored = codec.loads(raw)
    stored["format"] = layout
    await client.hset(CrawlKeys.build(crawl).meta, "settings", codec.dumps(stored))


@dataclass(frozen=True, slots=True)
class _Lock:
    """The conversion's lock, as this process holds it: extended and released only by
    its holder (the token locks' scripts; common.fleet.locks is a layer above the queue)."""

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


async def _convert2(client: RedisClient, crawl: str, settings: CrawlSettings,
                    held: _Lock) -> int:
    script = register(client, "migrate")
    done = Converted()
    log.info("crawl_migrating", extra={"crawl": crawl, "partitions": settings.partitions,
                                       "layout": LAYOUT2})
    for keys in partition_keys(crawl, settings):
        done.add(await script(keys=migration_keys(keys), args=[]))
        await held.refresh()
    log.info("crawl_migrated", extra={
        "crawl": crawl, "partitions": done.partitions, "hosts": done.hosts,
        "leases": done.leases, "hosts_kept": done.hosts_kept,
        "leases_kept": done.leases_kept, "layout": LAYOUT3})
    if done.no_body:
        log.warning("crawl_migrated_leases_without_body", extra={
            "crawl": crawl, "leases": done.no_body,
            "advice": f"crawlq fsck --crawl {crawl} lists them"})
    return done.partitions


async def _convert3(client: RedisClient, crawl: str, settings: CrawlSettings,
                    held: _Lock) -> int:
    script = register(client, "compact_queues")
    log.info("crawl_migrating", extra={"crawl": crawl, "partitions": settings.partitions,
                                       "layout": LAYOUT3})
    hosts = entries = 0
    for pk in partition_keys(crawl, settings):
        batch: list[str] = []
        async for member, _ in client.zscan_iter(pk.queued, count=HOSTS_AT_ONCE):
            batch.append(codec.text(member))
            if len(batch) == HOSTS_AT_ONCE:
                entries += await _compact_hosts(client, script, pk, batch)
                hosts += len(batch)
                batch = []
                await held.refresh()
        entries += await _compact_hosts(client, script, pk, batch)
        hosts += len(batch)
        await held.refresh()
    on = Crawl.on(client, crawl, settings)
    histories = dropped = 0
    for pk in on.partitions:
        if await client.hdel(pk.leased, LEGACY_HASHTABLE_FIELD):
            await client.hsetnx(pk.leased, HASHTABLE_FIELD, "1")
        converted, malformed = await _compact_history(on, pk, held)
        histories, dropped = histories + converted, dropped + malformed
    log.info("crawl_migrated", extra={"crawl": crawl, "partitions": settings.partitions,
                                      "hosts": hosts, "entries": entries,
                                      "histories": histories, "layout": FORMAT})
    if dropped:
        log.warning("crawl_migrated_malformed_histories", extra={
            "crawl": crawl, "dropped": dropped,
            "advice": "their URLs are recrawled without validators, as before"})
    return settings.partitions


async def _compact_history(on: Crawl, pk: PartitionKeys, held: _Lock) -> tuple[int, int]:
    """Move partition `pk`'s history records of layout 3 into its buckets, `CHUNK` ids a
    call; returns (converted, malformed ones dropped)."""
    script = register(on.client, "compact_history")
    old = layout3_history_key(pk)
    converted = dropped = 0
    cursor = 0
    while True:  # each call deletes the ids it converts: the scan goes on over the rest
        cursor, fields = await on.client.hscan(old, cursor, count=CHUNK)
        ids = [codec.text(k) for k in fields]
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            done, bad = await script(
                keys=[old, pk.conf, *(on.history_key(pk, tid) if is_task_id(tid) else old
                                      for tid in chunk)], args=chunk)
            converted, dropped = converted + int(done), dropped + int(bad)
        await held.refresh()
        if int(cursor) == 0:
            return converted, dropped


async def _compact_hosts(client: RedisClient, script: Any, pk: PartitionKeys,
                         hosts: list[str]) -> int:
    """Compact the queues of `hosts` (of partition `pk`), a chunk per host per round trip;
    returns the entries rotated or compacted."""
    if not hosts:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.llen(pk.host_queue(host))
        lengths = await pipe.execute()
    left = {host: int(n) for host, n in zip(hosts, lengths, strict=True)}
    cursor = dict.fromkeys(hosts, "0")  # each ZSET's walk, from its start
    done = 0
    while left:
        todo = list(left)
        calls: list[Call] = [
            (script, [pk.host_queue(h), pk.host_prio(h)], [h, min(left[h], CHUNK), cursor[h],
                                                            CHUNK]) for h in todo]
        for host, (rotated, after, compacted) in zip(todo, await run(client, calls),
                                                     strict=True):
            # None rotated: the LIST is empty (shorter than LLEN said): done with it.
            left[host] = left[host] - int(rotated) if int(rotated) else 0
            cursor[host] = codec.text(after)
            done += int(rotated) + int(compacted)
            if left[host] <= 0 and cursor[host] == "-":
                del left[host]
    return done
