"""The memory floor of a done URL's history (and revisit schedule), layout by layout.

Issue 34 asks for history + schedule <= 64 B + the URL's path and query + its ETag (122 B
for queue_bench's URLs and ETag; 442 B with revisits on today, 194.5 B for a recrawl
window's history, which keeps no entry). This bench writes the same facts for N done URLs
(queue_bench's URLs over 997 hosts, its ETag, Last-Modified and digest) in candidate
layouts to a fresh redis-server each, and prints the ``used_memory`` growth per URL:

- today's text record in one ``rv:hist`` HASH (32-hex-digit field), with and without its
  entry (a recrawl window's keeps none), and the ``rv:due`` ZSET (revisits on);
- a binary record (priority, interval, fetched and Last-Modified as epoch seconds, the
  digest's 8 bytes, the ETag as sent, the host by name or by a 3-byte index, the URL's
  path and query) in one HASH under the id's 16 bytes;
- the same record in 2^bits small HASHes keyed by the id's first bits (as ``seen:<b>``),
  under the id's last 14 bytes: listpack-encoded while a bucket holds at most
  ``hash-max-listpack-entries`` (128) fields and every value is at most
  ``hash-max-listpack-value`` bytes (64 by default: a record longer than that turns its
  whole bucket into a hashtable, so the bench runs both 64 and 160);
- the schedule as a ZSET, or as a LIST of ids per minute of due time;
- "crawlq now": the layout built (binary records in ``rv:hist:<bucket>``, 2^bits buckets
  of the crawl's ``seen_bits``, the schedule in ``rv:due``), written by the real scripts:
  the URLs enqueued, leased and acked with that ETag, Last-Modified and digest, under
  ``revisit`` fixed (history + schedule) and under a recrawl window alone (history: since
  issue 43 with the URL's host and entry, which the producer brings it back with past its
  window); what its history and schedule keys hold is what deleting them frees.

    python bench/history_floor_bench.py --redis-server /usr/bin/redis-server
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import redis
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

from common.policy import set_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.redis.server import RedisServer
from common.revisits.previous import Observed
from common.urls.canonical import fingerprint

ETAG = b'"5f2b-1a3c9e7d"'
LAST_MODIFIED = b"Wed, 21 Oct 2015 07:28:00 GMT"
DIGEST = "0123456789abcdef"
NOW = 1_764_000_000
HOSTS = 997
#: The target: this many bytes beyond the URL's path and query and its ETag.
TARGET = 64


def url_of(i: int) -> str:
    return f"https://site{i % HOSTS}.example.com/articles/{i}/index.html?ref=bench&page={i % 13}"


class Urls:
    def __init__(self, n: int) -> None:
        self.n = n
        self.urls = [url_of(i) for i in range(n)]
        self.ids = [hashlib.blake2b(u.encode(), digest_size=16).digest() for u in self.urls]
        self.paths = ["/" + u.split("/", 3)[3] for u in self.urls]
        self.hosts = [f"site{i % HOSTS}.example.com" for i in range(n)]

    def text_record(self, i: int, entry: bool, revisit: bool) -> bytes:
        """Today's record (lib/revisits.lua record_encode)."""
        head = (f"{self.hosts[i]} 0 {86400 if revisit else 0} {NOW} {DIGEST} "
                f"{'~1,0,86400 ' if revisit else ''}{len(ETAG)} {len(LAST_MODIFIED)} ")
        tail = (self.ids[i].hex() + self.urls[i]).encode() if entry else b""
        return head.encode() + ETAG + LAST_MODIFIED + tail

    def binary_record(self, i: int, by_index: bool) -> bytes:
        host = (struct.pack("<I", i % HOSTS)[:3] if by_index
                else bytes([len(self.hosts[i])]) + self.hosts[i].encode())
        head = struct.pack("<BIII8sB", 0, 86400, NOW, NOW - 1000, bytes.fromhex(DIGEST),
                           len(ETAG))
        return head + ETAG + host + self.paths[i].encode()

    def due_s(self, i: int) -> int:
        return NOW + 86400 + (i * 7919) % 86400  # spread over a day


#: Writes the URLs' history; returns the bytes it takes when that is not all the server
#: grew by (None: it is).
Fill = Callable[[redis.Redis, Urls], float | None]


def batched(c: redis.Redis, u: Urls, write: Callable[[redis.client.Pipeline, int], None]
            ) -> None:
    pipe = c.pipeline(transaction=False)
    for i in range(u.n):
        write(pipe, i)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def today(entry: bool, revisit: bool) -> Fill:
    def fill(c: redis.Redis, u: Urls) -> None:
        def write(pipe: redis.client.Pipeline, i: int) -> None:
            pipe.hset("rv:hist", u.ids[i].hex(), u.text_record(i, entry, revisit))
            if revisit:
                pipe.zadd("rv:due", {u.ids[i].hex(): u.due_s(i) * 1000})
        batched(c, u, write)
    return fill


def binary(bits: int, by_index: bool, due: str) -> Fill:
    def fill(c: redis.Redis, u: Urls) -> None:
        def write(pipe: redis.client.Pipeline, i: int) -> None:
            if bits:
                bucket = int.from_bytes(u.ids[i][:4], "big") >> (32 - bits)
                pipe.hset(f"rv:hist:{bucket}", u.ids[i][2:], u.binary_record(i, by_index))
            else:
                pipe.hset("rv:hist", u.ids[i], u.binary_record(i, by_index))
            if by_index and i < HOSTS:
                pipe.hset("rv:hostname", struct.pack("<I", i)[:3], u.hosts[i])
            if due == "zset":
                pipe.zadd("rv:due", {u.ids[i]: u.due_s(i) * 1000})
            elif due == "minutes":
                pipe.rpush(f"rv:due:{u.due_s(i) // 60}", u.ids[i])
        batched(c, u, write)
    return fill


async def _crawl(url: str, u: Urls, bits: int, revisit: bool) -> None:
    """The URLs through the real scripts: enqueued, leased and acked with what their fetch
    observed, in a crawl of one partition with 2^bits buckets."""
    client = aioredis.Redis.from_url(url)
    try:
        q = await LeasingQueue.open(client, "floor", CrawlSettings(seen_bits=bits))
        await set_policy(client, "floor", {
            "revisit": "fixed" if revisit else "off", "recrawl_after": 86400,
            "per_host_delay": 0.0, "per_host_concurrency": 0}, by="bench", create=True)
        q.configure(revisits=True)  # a consumer's, for a policy that keeps history
        for lo in range(0, u.n, 5_000):
            await q.enqueue([NewTask(x, fingerprint(x)) for x in u.urls[lo:lo + 5_000]])
        observed = Observed(ETAG.decode(), LAST_MODIFIED.decode(), DIGEST)
        while leases := await q.lease("bench", 1_000, 600_000):
            for lease in leases:
                lease.observed = observed
            await q.ack("bench", [(lease, "ok") for lease in leases])
    finally:
        await client.aclose()


def crawlq_now(bits: int, revisit: bool, schedule: bool = True) -> Fill:
    """The built layout's history (and with `schedule`, rv:due) after a crawl."""
    def fill(c: redis.Redis, u: Urls) -> float:
        kwargs = c.connection_pool.connection_kwargs
        asyncio.run(_crawl(f"redis://{kwargs['host']}:{kwargs['port']}/0", u, bits, revisit))
        keys = [*c.scan_iter(match="crawlq:*rv:hist:*", count=10_000)]
        if schedule:
            keys += c.scan_iter(match="crawlq:*rv:due", count=10_000)
        with_history = int(c.info("memory")["used_memory"])
        for lo in range(0, len(keys), 1_000):
            c.delete(*keys[lo:lo + 1_000])
        return with_history - int(c.info("memory")["used_memory"])
    return fill


def measure(binary_path: str, u: Urls, fill: Fill, listpack_value: int = 64) -> float:
    extra = ("--hash-max-listpack-value", str(listpack_value))
    with RedisServer(binary=binary_path, extra_args=extra) as server:
        c = redis.Redis.from_url(server.url)
        try:
            before = int(c.info("memory")["used_memory"])
            used = fill(c, u)
            if used is None:
                used = int(c.info("memory")["used_memory"]) - before
            return used / u.n
        finally:
            c.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=100_000, help="done URLs")
    parser.add_argument("--bits", type=int, default=10,
                        help="bucket bits (at most 128 records a bucket: URLs / 2^bits)")
    parser.add_argument("--redis-server", default="", help="redis-server binary to run")
    parser.add_argument("--only-crawlq", action="store_true",
                        help="measure the built layout's rows alone")
    args = parser.parse_args(argv)
    u = Urls(args.urls)
    path = sum(map(len, u.paths)) / u.n
    target = TARGET + path + len(ETAG)
    print(f"{u.n:,} done URLs of {sum(map(len, u.urls)) / u.n:.0f} B ({path:.0f} B of path "
          f"and query), ETag {len(ETAG)} B: target {TARGET} + {path:.0f} + {len(ETAG)} = "
          f"{target:.0f} B a URL; a binary record is {len(u.binary_record(0, True))} B "
          f"(host by index), {len(u.binary_record(0, False))} B (by name)")
    b = args.bits
    rows: list[tuple[str, Fill, int]] = [
        ("today: text record with its entry + rv:due ZSET (revisit on)", today(True, True), 64),
        ("today: text record, no entry (a recrawl window's)", today(False, False), 64),
        ("binary, one HASH, host by index (recrawl)", binary(0, True, ""), 64),
        ("binary, one HASH, host by index + rv:due ZSET", binary(0, True, "zset"), 64),
        ("binary, one HASH, host by index + a LIST per due minute", binary(0, True, "minutes"),
         64),
        (f"binary, 2^{b} HASHes, host by index (recrawl), listpack-value 64",
         binary(b, True, ""), 64),
        (f"binary, 2^{b} HASHes, host by index (recrawl), listpack-value 160",
         binary(b, True, ""), 160),
        (f"binary, 2^{b} HASHes, host by index + a LIST per due minute, listpack-value 160",
         binary(b, True, "minutes"), 160),
        (f"binary, 2^{b} HASHes, host by name + a LIST per due minute, listpack-value 160",
         binary(b, False, "minutes"), 160),
        (f"crawlq now: 2^{b} rv:hist buckets, recrawl window (with entry), listpack-value 64",
         crawlq_now(b, False), 64),
        (f"crawlq now: 2^{b} rv:hist buckets, recrawl window (with entry), listpack-value 192",
         crawlq_now(b, False), 192),
        (f"crawlq now: 2^{b} rv:hist buckets (revisit: with entry), listpack-value 64",
         crawlq_now(b, True, schedule=False), 64),
        (f"crawlq now: 2^{b} rv:hist buckets (revisit: with entry), listpack-value 192",
         crawlq_now(b, True, schedule=False), 192),
        (f"crawlq now: 2^{b} rv:hist buckets + rv:due ZSET (revisit), listpack-value 64",
         crawlq_now(b, True), 64),
        (f"crawlq now: 2^{b} rv:hist buckets + rv:due ZSET (revisit), listpack-value 192",
         crawlq_now(b, True), 192),
    ]
    if args.only_crawlq:
        rows = [row for row in rows if row[0].startswith("crawlq now")]
    for label, fill, lpv in rows:
        per = measure(args.redis_server, u, fill, lpv)
        verdict = "OK" if per <= target else "over"
        print(f"{label:<84} {per:7.1f} B/URL   <= {target:.0f}: {verdict}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
