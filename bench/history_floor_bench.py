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
- the schedule as a ZSET, or as a LIST of ids per minute of due time.

    python bench/history_floor_bench.py --redis-server /usr/bin/redis-server
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code

from common.redis_server import RedisServer

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


Fill = Callable[[redis.Redis, Urls], None]


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


def measure(binary_path: str, u: Urls, fill: Fill, listpack_value: int = 64) -> float:
    extra = ("--hash-max-listpack-value", str(listpack_value))
    with RedisServer(binary=binary_path, extra_args=extra) as server:
        c = redis.Redis.from_url(server.url)
        try:
            before = int(c.info("memory")["used_memory"])
            fill(c, u)
            return (int(c.info("memory")["used_memory"]) - before) / u.n
        finally:
            c.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=100_000, help="done URLs")
    parser.add_argument("--bits", type=int, default=10,
                        help="bucket bits (at most 128 records a bucket: URLs / 2^bits)")
    parser.add_argument("--redis-server", default="", help="redis-server binary to run")
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
    ]
    for label, fill, lpv in rows:
        per = measure(args.redis_server, u, fill, lpv)
        verdict = "OK" if per <= target else "over"
        print(f"{label:<82} {per:7.1f} B/URL   <= {target:.0f}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
