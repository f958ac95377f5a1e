"""The known URLs past the recrawl window, back into their hosts' queues: Nutch's
``generate`` for a crawl that recrawls by its window (``recrawl_after`` > 0, revisits off,
validators kept: the policy's ``conditional``).

A re-seeded link-following crawl reaches its pages again only through the links of the
pages it fetches whole, and a page answered 304 has no body: pass 2 of a tree would stop
at its unchanged start page. So the producer brings back every done URL whose window has
passed, from the crawl's history: each done URL's record (``rv:hist:<bucket>``, written
by ack.lua's keep_visits) keeps its host, priority and compact entry (label, data, depth,
method and body included), and its fetch time.

`recrawl_known` finds a partition's history buckets by SCAN (as ``crawlq fsck`` does: a
small crawl holds few of its 2**seen_bits buckets), reads each by HSCAN, `CHUNK` fields a
call, `KEYS_AT_ONCE` buckets a pipeline, picks the records fetched at least the window
ago and queues them `CHUNK` at a time through enqueue.lua with the window
(`enqueue_known`), which decides each against its seen mark atomically (a URL queued,
leased, waiting or dead meanwhile is a duplicate, never doubled) and gives it its
validators, so its fetch is conditional. Memory stays bounded whatever the crawl's size:
a pipeline's buckets and one batch per partition.

A scan is cheap to skip: each partition's ``conf`` keeps ``rc_oldest`` (s of Redis TIME),
the oldest fetch time among the records the last scan did not bring back (or that scan's
start, if older): no record can come due before ``rc_oldest`` + the window, so a run
before then reads one field and scans nothing. A producer run every hour with new URL
files reads a crawl's history only when some of it has come due since the last run.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import cast

from common.codec import text
from common.keys import PREFIX, PartitionKeys
from common.queue.crawl import Crawl
from common.queue.enqueue import KnownEntry, enqueue_known
from common.revisits.record import record_entry, record_fetched

#: HSCAN's COUNT, and the most known URLs one enqueue call takes.
CHUNK = 1000
#: The history buckets whose HSCANs go in one pipeline.
KEYS_AT_ONCE = 64
#: SCAN's COUNT when finding the history buckets.
SCAN_COUNT = 1000
#: The ``conf`` field: the oldest fetch time (s) a record the last scan left can have.
OLDEST = "rc_oldest"


@dataclass(slots=True)
class KnownRecrawl:
    """What one bringing back of known URLs did, summed over partitions."""

    scanned: int = 0  # history records read
    recrawled: int = 0  # queued again
    duplicates: int = 0  # past the window but live (queued, leased, waiting or dead)
    no_entry: int = 0  # past the window, their record without entry (an older crawlq's)
    partitions: int = 0  # partitions scanned (the others had nothing due)
    next_due_s: int | None = None  # when a skipped partition's first record comes due
    stopped: bool = False  # a stop request ended it between batches
    elapsed_s: float = 0.0  # wall time of the scan


async def recrawl_known(crawl: Crawl, window_s: int, *,
                        stop: asyncio.Event | None = None) -> KnownRecrawl:
    """Queue again every done URL of `crawl` whose history record was fetched at least
    `window_s` ago (see the module docstring); a partition with nothing due is not read.
    `stop` set ends it between batches (a partition cut short is scanned again next
    time)."""
    client, done = crawl.client, KnownRecrawl()
    now = int((await client.time())[0])
    horizon = now - window_s
    async with client.pipeline(transaction=False) as pipe:
        for pk in crawl.partitions:
            pipe.hget(pk.conf, OLDEST)
        oldest_kept = await pipe.execute()
    todo: dict[str, _Scan] = {}
    for pk, raw in zip(crawl.partitions, oldest_kept, strict=True):
        if raw is not None and int(raw) > horizon:
            due_in = int(raw) - horizon
            done.next_due_s = due_in if done.next_due_s is None else min(done.next_due_s,
                                                                         due_in)
        else:
            todo[pk.prefix + "rv:hist:"] = _Scan(pk, now, crawl.settings.seen_bits)
    if not todo:
        return done
    done.partitions = len(todo)
    started = time.monotonic()
    try:
        await _scan(crawl, todo, _Scanner(crawl, window_s, horizon, done, stop))
    finally:
        done.elapsed_s = time.monotonic() - started
    return done


async def _scan(crawl: Crawl, todo: dict[str, _Scan], scan: _Scanner) -> None:
    """Read the history buckets of the partitions in `todo` (by their keys' head) and
    queue their due records; each partition's oldest record left is written last."""
    client, done = crawl.client, scan.done
    keys: list[tuple[_Scan, str]] = []
    pattern = f"{PREFIX}:\\{{{crawl.name}:*rv:hist:*"  # every partition's buckets
    async for raw_key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        key = text(raw_key)
        head, _, bucket = key.rpartition(":")
        part = todo.get(head + ":")
        if part is None or not part.first_sight(bucket):
            continue  # another crawl's, a partition with nothing due, or seen already
        keys.append((part, key))
        if len(keys) >= KEYS_AT_ONCE:
            await scan.buckets(keys)
            keys = []
            if done.stopped:
                return
    await scan.buckets(keys)
    if done.stopped:
        return
    for part in todo.values():
        await scan.flush(part)
    async with client.pipeline(transaction=False) as pipe:
        for part in todo.values():
            pipe.hset(part.pk.conf, OLDEST, part.oldest)
        await pipe.execute()


class _Scan:
    """One partition's scan: the buckets seen (SCAN may return a key twice: a bit each),
    the oldest fetch time left, the known URLs waiting for their enqueue call."""

    def __init__(self, pk: PartitionKeys, now: int, seen_bits: int) -> None:
        self.pk = pk
        self.oldest = now  # records written from now on are fetched no earlier
        self.seen = bytearray(max(1, (1 << seen_bits) // 8))
        self.batch: dict[str, list[KnownEntry]] = defaultdict(list)
        self.size = 0

    def first_sight(self, bucket: str) -> bool:
        """Whether bucket `bucket` (hex, as its key ends) is one of the partition's, not
        seen before in this scan."""
        try:
            b = int(bucket, 16)
        except ValueError:
            return False
        if not 0 <= b < len(self.seen) * 8 or self.seen[b >> 3] & (1 << (b & 7)):
            return False
        self.seen[b >> 3] |= 1 << (b & 7)
        return True


class _Scanner:
    def __init__(self, crawl: Crawl, window_s: int, horizon: int, done: KnownRecrawl,
                 stop: asyncio.Event | None) -> None:
        self.crawl, self.window_s, self.horizon = crawl, window_s, horizon
        self.done, self.stop = done, stop

    async def buckets(self, keys: list[tuple[_Scan, str]]) -> None:
        """Read these buckets whole (HSCAN from their start, as many calls as a big one
        takes), queueing their records that are due."""
        cursors = [(part, key, 0) for part, key in keys]
        while cursors:
            async with self.crawl.client.pipeline(transaction=False) as pipe:
                for _, key, cursor in cursors:
                    pipe.hscan(key, cursor, count=CHUNK)
                replies = await pipe.execute()
            more = []
            for (part, key, _), (cursor, fields) in zip(cursors, replies, strict=True):
                await self._records(part, cast(dict[bytes, bytes], fields))
                if int(cursor):
                    more.append((part, key, int(cursor)))
            cursors = more
            if self.stop is not None and self.stop.is_set():
                self.done.stopped = True
                return

    async def _records(self, part: _Scan, fields: dict[bytes, bytes]) -> None:
        done, horizon = self.done, self.horizon
        done.scanned += len(fields)
        for field, value in fields.items():
            fetched = record_fetched(value)
            if fetched is None or len(field) != 16:
                continue  # malformed: fsck's to judge
            if fetched > horizon:
                part.oldest = min(part.oldest, fetched)
                continue
            found = record_entry(value)
            if found is None:
                continue
            host, priority, tail = found
            if not tail or not host:
                done.no_entry += 1
                continue
            part.batch[host].append(KnownEntry(field, priority, field + tail))
            part.size += 1
            if part.size >= CHUNK:
                await self.flush(part)

    async def flush(self, part: _Scan) -> None:
        """Queue the partition's waiting known URLs (one enqueue call)."""
        if not part.size:
            return
        batch, part.batch, part.size = part.batch, defaultdict(list), 0
        result = await enqueue_known(self.crawl, part.pk.partition, batch, self.window_s)
        self.done.recrawled += result.enqueued
        self.done.duplicates += result.duplicates
