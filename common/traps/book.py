"""What the fleet knows about its hosts' traps, in Redis: per host, the links the trap
rules refused and the pages found to be near duplicates (by reason), the query variants
of its paths, and its newest page fingerprints (keys: ``common/keys.py``, "Crawler
traps").

Every consumer takes links in and fetches pages on its own, so what a rule counts
across them lives here, per host, under the host's partition (one Cluster slot):

- ``trap_variants``: the 4-byte hashes of the query strings a host's path had in links,
  up to ``trap_path_variants`` per path (``traps.lua``): a path of a faceted search
  costs at most 4 x that many bytes, and a new query past it is refused fleet-wide.
- near duplicates: a host's newest `KEEP` fingerprints (24 bytes each: a 64-bit SimHash
  of its text and one of its links, ``common.traps.simhash``, 4 bytes of its URL's
  fingerprint, so a retry or a revisit of a page is never its own near duplicate, and 4
  bytes of its URL's shape, ``common.urls.shape``: a page is compared only with pages of
  its shape), at most 6 KiB a host (``fingerprints.lua``); a fingerprint that matches
  is added again, so a trap's template that keeps matching stays among them while pages
  seen once age out. A consumer's flush sends all its pages' fingerprints in one call
  per partition and judges them against what came back (`near_duplicates`), never a
  round trip a page.
- judgement (``judgement.lua``, `HostState`): per host, the soft-404 signature of each
  directory probed (``common.traps.soft404``), the probes claimed (each directory once, at
  most `MAX_PROBES` a host), and the session tokens learned from its links; read back
  and written with the same flush call.
- tallies: ``tr:<host>`` (reason -> count) and ``h:traps`` (host -> their sum), written
  once per flush of a consumer's batch, with the variant checks.

Both calls carry an operation id (lib/once.lua): one sent again after its reply was lost
(by the client, or by the flusher running its step again with the same id) changes
nothing more, so a tally counts each link and page once.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from common.codec import text as _text
from common.keys import PartitionKeys
from common.queue import CrawlQueue
from common.queue.calls import new_op_id, run
from common.redis.scripts import register
from common.traps.simhash import distance
from common.traps.soft404 import Signature

#: Fingerprints kept per host (24 bytes each).
KEEP = 256
_ENTRY = struct.Struct("<QQII")
#: Probes claimed per host at most (its root and directories).
MAX_PROBES = 8


@dataclass(frozen=True, slots=True)
class Variant:
    """A link with a query, to be judged by its host's path variants."""

    host: str
    path: bytes  # 8-byte hash (common.traps.rules.variant_of)
    query: bytes  # 4-byte hash


@dataclass(frozen=True, slots=True)
class Page:
    """A fetched page's fingerprint, to be judged against its host's."""

    host: str
    url_tag: int  # the first 4 bytes of its URL's fingerprint: a retry or revisit of it
    fp: int  # its text's SimHash (common.traps.simhash)
    within: int  # bits: the policy's near_duplicate_distance when it was fetched
    shape: int = 0  # its URL's shape tag (common.urls.shape.shape_tag)
    links: int = 0  # its links' SimHash (common.traps.simhash.set_fingerprint)

    @classmethod
    def of(cls, host: str, url_fp: bytes, fp: int, within: int, *, shape: int = 0,
           links: int = 0) -> Page:
        """The page of the URL whose fingerprint (``common.urls.canonical.fingerprint``; a task's
        id, hex) is `url_fp`."""
        return cls(host, int.from_bytes(url_fp[:4], "little"), fp, within, shape, links)

    def entry(self) -> bytes:
        """The page as its host's fingerprints keep it."""
        return _ENTRY.pack(self.fp, self.links, self.url_tag, self.shape)


@dataclass(frozen=True, slots=True)
class TrapRow:
    """One host's trap tallies: their sum and each reason's count."""

    host: str
    total: int
    reasons: dict[str, int]


def near(held: bytes, page: Page) -> bool:
    """Whether one of `held`'s entries (another URL's, of the same shape) is at most
    `page.within` bits from `page` by its text and by its links."""
    within = page.within
    for text, links, tag, form in _ENTRY.iter_unpack(
            held[:len(held) - len(held) % _ENTRY.size]):
        if form == page.shape and tag != page.url_tag and distance(text, page.fp) <= within \
                and distance(links, page.links) <= within:
            return True
    return False


@dataclass(slots=True)
class HostState:
    """What the fleet learned of one host (``jd:<host>``), as this process last read it."""

    signatures: dict[str, Signature] = field(default_factory=dict)  # directory -> it
    claimed: set[str] = field(default_factory=set)  # directories whose probe is claimed
    tokens: dict[str, str] = field(default_factory=dict)  # learned rule -> its own value
    probes: int = 0  # probes claimed
    read_at: float = -1e9  # monotonic time of the read (never: long ago)

    @classmethod
    def of(cls, fields: Mapping[bytes, bytes], at: float) -> HostState:
        """The state stored as `fields` (judgement.lua's HASH), read at `at`."""
        state = cls(read_at=at)
        for raw, value in fields.items():
            name = _text(raw)
            kind, _, rest = name.partition(":")
            if kind == "s":
                sig = Signature.decode(rest, value)
                if sig is not None:
                    state.signatures[rest] = sig
            elif kind == "p":
                state.claimed.add(rest)
            elif kind == "t":
                state.tokens[rest] = _text(value)
            elif name == "n":
                state.probes = int(value)
        return state


@dataclass(frozen=True, slots=True)
class Learned:
    """What a flush tells the fleet of one host: a probe's signature, a learned token
    rule, or a probe it wants to claim."""

    host: str
    kind: str  # "s" signature, "t" token rule, "c" claim
    value: str  # "<dir> <signature JSON>", "<rule> <its own value>", the directory


class TrapBook:
    """The crawl's trap state, through `queue`'s client and partitions, for `worker`
    (whose calls' operation ids it keeps)."""

    def __init__(self, queue: CrawlQueue, worker: str = "") -> None:
        self.queue = queue
        self.worker = worker or new_op_id()
        self._traps = register(queue.client, "traps")
        self._fingerprints = register(queue.client, "fingerprints")
        self._judgement = register(queue.client, "judgement")

    async def judge(self, variants: Sequence[Variant], tallies: Mapping[tuple[str, str], int],
                    limit: int, op: str = "") -> list[bool]:
        """Add `tallies` ((host, reason) -> n) to the hosts' counts and judge `variants`
        by their paths' variants (at most `limit`; 0: none refused): whether each is
        admitted, in order. One script call per partition, pipelined; `op`: the call's
        operation id (a new one when ''), the same when it is sent again."""
        op = op or new_op_id()
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
            keys.append(pk.ops(self.worker))
            args: list[bytes | str | int] = [limit, len(hosts), op, *hosts]
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

    async def judgement(self, reads: Collection[str], learned: Sequence[Learned],
                        claimer: str) -> tuple[dict[str, dict[bytes, bytes]], list[bool]]:
        """Store `learned` signatures and tokens, claim its probes (as `claimer`, at most
        `MAX_PROBES` a host) and read the state of the hosts of `reads`: their stored
        fields by host, and whether each claim (in order) is this claimer's. One script
        call per partition, pipelined."""
        groups: dict[int, dict[str, list[list[str]]]] = defaultdict(dict)
        order: dict[int, list[int]] = defaultdict(list)
        for host in reads:
            groups[self.queue.partition_of(host)].setdefault(host, []).append(["r", ""])
        for i, item in enumerate(learned):
            p = self.queue.partition_of(item.host)
            groups[p].setdefault(item.host, []).append([item.kind, item.value])
            if item.kind == "c":
                order[p].append(i)
        if not groups:
            return {}, []
        calls = []
        for p, by_host in groups.items():
            pk = self.queue.partitions[p]
            args: list[str | int] = [MAX_PROBES, claimer]
            for n, records in enumerate(by_host.values(), 1):
                for kind, value in records:
                    args += [kind, n, value]
            calls.append((self._judgement, [pk.judgement(h) for h in by_host], args))
        replies = await run(self.queue.client, calls)
        states: dict[str, dict[bytes, bytes]] = {}
        won = [False] * sum(1 for item in learned if item.kind == "c")
        at = {i: n for n, i in enumerate(i for i, item in enumerate(learned)
                                          if item.kind == "c")}
        for (p, by_host), (fields, claims) in zip(groups.items(), replies, strict=True):
            for host, flat in zip(by_host, fields, strict=True):
                if any(kind == "r" for kind, _ in by_host[host]):
                    states[host] = dict(zip(flat[::2], flat[1::2], strict=True))
            for i, verdict in zip(order[p], claims, strict=True):
                won[at[i]] = bool(int(verdict))
        return states, won

    async def near_duplicates(self, pages: Sequence[Page], op: str = "") -> list[bool]:
        """Add `pages`' fingerprints to their hosts' and say, in order, whether each is a
        near duplicate: one of its host's others (held, or of a page before it in
        `pages`) at most its `within` bits from it. One script call per partition,
        pipelined; `op` as `judge`'s."""
        op = op or new_op_id()
        by_host: dict[str, list[int]] = defaultdict(list)
        for i, page in enumerate(pages):
            by_host[page.host].append(i)
        groups: dict[int, list[str]] = defaultdict(list)
        for host in by_host:
            groups[self.queue.partition_of(host)].append(host)
        calls = []
        for p, hosts in groups.items():
            pk = self.queue.partitions[p]
            args: list[bytes | int] = [KEEP * _ENTRY.size]
            args += [b"".join(pages[i].entry() for i in by_host[host]) for host in hosts]
            args.append(op.encode())
            calls.append((self._fingerprints,
                          [*(pk.fingerprints(h) for h in hosts), pk.ops(self.worker)], args))
        if not calls:
            return []
        replies = await run(self.queue.client, calls)
        verdicts = [False] * len(pages)
        for hosts, reply in zip(groups.values(), replies, strict=True):
            for host, held in zip(hosts, reply, strict=True):
                window = bytes(held or b"")
                for i in by_host[host]:
                    page = pages[i]
                    verdicts[i] = near(window[-KEEP * _ENTRY.size:], page)
                    window += page.entry()
        return verdicts

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
