"""What the fleet knows about its hosts' traps, in Redis: per host, the links the trap
rules refused and the pages found to be near duplicates (by reason), the query variants
of its paths, and its newest page fingerprints (keys: ``common/keys.py``, "Crawler
traps").

Every consumer takes links in and fetches pages on its own, so what a rule counts
across them lives here, per host, under the host's partition (one Cluster slot):

- ``trap_variants``: the 4-byte hashes of the query strings a host's path had in links,
  up to ``trap_path_variants`` per path (``traps.lua``): a path of a faceted search
  costs at most 4 x that many bytes, and a new query past it is refused fleet-wide.
- near duplicates: a host's newest `KEEP` fingerprints (12 bytes each: a 64-bit
  SimHash, ``common.simhash``, and 4 bytes of its URL's fingerprint, so a retry or a
  revisit of a page is never its own near duplicate), at most 3 KiB a host
  (``fingerprints.lua``); a fingerprint that matches is added again, so a trap's
  template that keeps matching stays among them while pages seen once age out.
- tallies: ``tr:<host>`` (reason -> count) and ``h:traps`` (host -> their sum), written
  once per flush of a consumer's batch, with the variant checks.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.queue.calls import run
from common.scripts import register
from common.simhash import distance

#: Fingerprints kept per host (12 bytes each).
KEEP = 256
_ENTRY = struct.Struct("<QI")


@dataclass(frozen=True, slots=True)
class Variant:
    """A link with a query, to be judged by its host's path variants."""

    host: str
    path: bytes  # 8-byte hash (common.traps.variant_of)
    query: bytes  # 4-byte hash


@dataclass(frozen=True, slots=True)
class TrapRow:
    """One host's trap tallies: their sum and each reason's count."""

    host: str
    total: int
    reasons: dict[str, int]


def near(held: bytes, fp: int, url_tag: int, within: int) -> bool:
    """Whether one of `held`'s entries (another URL's) is at most `within` bits from
    `fp`."""
    for other, tag in _ENTRY.iter_unpack(held[:len(held) - len(held) % _ENTRY.size]):
        if tag != url_tag and distance(other, fp) <= within:
            return True
    return False


class TrapBook:
    """The crawl's trap state, through `queue`'s client and partitions."""

    def __init__(self, queue: CrawlQueue) -> None:
        self.queue = queue
        self._traps = register(queue.client, "traps")
        self._fingerprints = register(queue.client, "fingerprints")

    def _pk(self, host: str) -> PartitionKeys:
        return self.queue.partitions[self.queue.partition_of(host)]

    async def judge(self, variants: Sequence[Variant], tallies: Mapping[tuple[str, str], int],
                    limit: int) -> list[bool]:
        """Add `tallies` ((host, reason) -> n) to the hosts' counts and judge `variants`
        by their paths' variants (at most `limit`; 0: none refused): whether each is
        admitted, in order. One script call per partition, pipelined."""
        groups: dict[int, list[tuple[str, list[bytes | str | int]]]] = defaultdict(list)
        order: dict[int, list[int]] = defaultdict(list)
        for (host, reason), n in tallies.items():
            groups[self.queue.partition_of(host)].append((host, ["c", reason, n]))
        for i, v in enumerate(variants):
            p = self.queue.partition_of(v.host)
            groups[p].append((v.host, ["v", v.path, v.query]))
            order[p].append(i)
        calls = []
        for p, records in groups.items():
            pk = self.queue.partitions[p]
            hosts = list(dict.fromkeys(host for host, _ in records))
            at = {host: i for i, host in enumerate(hosts, 1)}
            keys = [pk.trap_index]
            for host in hosts:
                keys += [pk.traps(host), pk.variants(host)]
            args: list[bytes | str | int] = [limit, len(hosts), *hosts]
            for host, (kind, *rest) in records:
                args += [kind, at[host], *rest]
            calls.append((self._traps, keys, args))
        if not calls:
            return []
        replies = await run(self.queue.client, calls)
        admitted = [True] * len(variants)
        for p, reply in zip(groups, replies, strict=True):
            for i, verdict in zip(order[p], reply, strict=True):
                admitted[i] = bool(int(verdict))
        return admitted

    async def seen_like(self, host: str, url_fp: bytes, fp: int, within: int) -> bool:
        """Add page fingerprint `fp` (of the URL whose fingerprint is `url_fp`) to
        `host`'s, and say whether one of the host's others was at most `within` bits
        from it: the page is a near duplicate."""
        url_tag = int.from_bytes(url_fp[:4], "little")
        held = await self._fingerprints(keys=[self._pk(host).fingerprints(host)],
                                        args=[_ENTRY.pack(fp, url_tag),
                                              KEEP * _ENTRY.size])
        return near(bytes(held or b""), fp, url_tag, within)

    async def hosts(self, limit: int = 20) -> list[TrapRow]:
        """The `limit` hosts with the most trap tallies, most first."""
        tops: list[tuple[float, str, PartitionKeys]] = []
        for pk in self.queue.partitions:
            top = cast(list[tuple[bytes, float]], await self.queue.client.zrevrange(
                pk.trap_index, 0, limit - 1, withscores=True))
            tops += [(score, _text(host), pk) for host, score in top]
        tops.sort(key=lambda t: (-t[0], t[1]))
        rows = []
        for score, host, pk in tops[:limit]:
            raw = await self.queue.client.hgetall(pk.traps(host))
            rows.append(TrapRow(host, int(score), {_text(k): int(v) for k, v in
                                                   sorted(raw.items())}))
        return rows
