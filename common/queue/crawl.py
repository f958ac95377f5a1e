"""A crawl: its settings (fixed at creation, stored in its ``meta`` key), opening it, and
where each host's keys live (its partition)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common import codec
from common.errors import ConfigError, CrawlConflictError
from common.hostmodel.enqueue_groups import Grouper
from common.hostmodel.hostkey import partition_of_host
from common.keys import CRAWLS, CrawlKeys, PartitionKeys
from common.redis.connection import RedisClient
from common.redis.scripts import Scripts

#: The schema version a crawl's settings carry: 4, one record per host and per lease
#: (layout 3) and compact queued entries (common/tasks/task.py compact_entry). A crawl of layout
#: 2 or 3 is converted in place (common.queue.migrate); one of an older version must be
#: re-created (its keys mean something else).
FORMAT = 4
#: The layout before 3: per-host counters in ZSETs, settings in ``hostconf``, a lease in
#: ``owners``, ``tasks`` and ``attempts``.
LAYOUT2 = 2
#: The layout before 4: full entries (``<32 hex id><url>[ <json>]``) in the host queues.
LAYOUT3 = 3
#: The layouts a consumer converts (`CrawlNeedsMigration`).
CONVERTED = (LAYOUT2, LAYOUT3)


class DedupMode(StrEnum):
    EXACT = "exact"
    BLOOM = "bloom"


class CrawlFormatError(ConfigError):
    """The crawl was created by a crawlq whose Redis layout this one does not read."""


class CrawlNeedsMigration(CrawlFormatError):
    """The crawl holds layout 2 or 3 (`layout`), which this crawlq converts but does not
    use: a consumer converts it when it opens the crawl (``LeasingQueue``), and so does
    ``crawlq fsck --repair``; everything else refuses it with this message. `settings`
    are its settings (the same fields in every layout)."""

    def __init__(self, crawl: str, settings: CrawlSettings, layout: int = LAYOUT2) -> None:
        super().__init__(
            f"crawl {crawl!r} holds layout {layout}: start a consumer of this version or "
            f"run `crawlq fsck --repair --crawl {crawl}` to convert it (stop the producers "
            "and consumers of the older crawlq first: they write the old layout)")
        self.crawl = crawl
        self.settings = settings
        self.layout = layout


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """What is fixed when a crawl is created (stored in its ``meta`` key)."""

    partitions: int = 1
    dedup: DedupMode = DedupMode.EXACT
    seen_bits: int = 16
    bloom_capacity: int = 1_000_000
    bloom_error: float = 1e-6
    bloom_layers: int = 8
    # Partition hash tags placed in equal ranges of the Cluster's slots (keys.partition_tag):
    # every crawl created since; not a choice, so never a conflict with asked settings.
    spread: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"partitions must be 1..1024, got {self.partitions}")
        if not 4 <= self.seen_bits <= 24:
            raise ConfigError(f"seen_bits must be 4..24, got {self.seen_bits}")
        if self.bloom_capacity < 1 or not 0 < self.bloom_error < 1:
            raise ConfigError("bloom capacity must be >= 1 and the error rate in (0, 1)")
        if not 1 <= self.bloom_layers <= 32:
            raise ConfigError(f"bloom_layers must be 1..32, got {self.bloom_layers}")

    def to_json(self) -> str:
        return codec.dumps({
            "format": FORMAT, "partitions": self.partitions, "dedup": self.dedup.value,
            "seen_bits": self.seen_bits, "bloom_capacity": self.bloom_capacity,
            "bloom_error": self.bloom_error, "bloom_layers": self.bloom_layers,
            "spread": self.spread,
        })

    @classmethod
    def from_json(cls, raw: str | bytes, crawl: str = "") -> CrawlSettings:
        """The stored settings; CrawlNeedsMigration for a crawl of layout 2 or 3 (to
        convert), CrawlFormatError for one an older crawlq created."""
        obj = codec.loads(raw)
        if obj.get("format") in CONVERTED:
            raise CrawlNeedsMigration(crawl, cls._fields(obj), obj["format"])
        if obj.get("format") != FORMAT:
            raise CrawlFormatError(
                f"crawl {crawl!r} was created by an older crawlq (one queue per crawl, not "
                "per host) and can't be used by this one: re-create it with "
                f"`crawlq reset --crawl {crawl} --yes` and run the producer again, or use a "
                "new --crawl name"
            )
        return cls._fields(obj)

    @classmethod
    def _fields(cls, obj: dict[str, Any]) -> CrawlSettings:
        return cls(
            partitions=int(obj["partitions"]), dedup=DedupMode(obj["dedup"]),
            seen_bits=int(obj["seen_bits"]), bloom_capacity=int(obj["bloom_capacity"]),
            bloom_error=float(obj["bloom_error"]), bloom_layers=int(obj["bloom_layers"]),
            spread=bool(obj.get("spread", False)),  # a crawl from before: tags as they were
        )


def partition_keys(crawl: str, settings: CrawlSettings) -> list[PartitionKeys]:
    """The keys of each partition of a crawl with these settings."""
    return [PartitionKeys.build(crawl, p, settings.partitions, spread=settings.spread)
            for p in range(settings.partitions)]


@dataclass(frozen=True, slots=True)
class Crawl:
    """One crawl on one Redis (or Redis Cluster) client: its keys and its scripts."""

    client: RedisClient
    name: str
    settings: CrawlSettings
    keys: CrawlKeys
    partitions: list[PartitionKeys]
    scripts: Scripts
    #: Names its enqueues' politeness groups (the key learned from its partitions).
    grouper: Grouper = field(default_factory=Grouper)

    @classmethod
    def on(cls, client: RedisClient, name: str, settings: CrawlSettings) -> Crawl:
        """A crawl whose settings are known (read or created already)."""
        return cls(client, name, settings, CrawlKeys.build(name),
                   partition_keys(name, settings), Scripts(client))

    def partition_of(self, host: str) -> int:
        """The partition that holds a host."""
        return partition_of_host(host, self.settings.partitions)

    def bucket(self, fp: bytes) -> int:
        """The bucket of a fingerprint (a task id's bytes): its first `seen_bits` bits,
        for its seen mark and its history record alike."""
        return int.from_bytes(fp[:4], "big") >> (32 - self.settings.seen_bits)

    def seen_mark(self, pk: PartitionKeys, tid: str) -> tuple[str, bytes]:
        """The exact-dedup bucket key and field of a task id (its fingerprint in hex)."""
        fp = bytes.fromhex(tid)
        return pk.seen(self.bucket(fp)), fp[2:]

    def history_key(self, pk: PartitionKeys, tid: str) -> str:
        """The ``rv:hist:<bucket>`` HASH that holds task `tid`'s history record (under
        its id's 16 bytes, `history_field`)."""
        return pk.history(self.bucket(bytes.fromhex(tid)))

    def history_buckets(self, pk: PartitionKeys) -> list[str]:
        """Every ``rv:hist:<bucket>`` key of a partition (2 ** seen_bits of them)."""
        return [pk.history(b) for b in range(1 << self.settings.seen_bits)]


async def open_settings(client: RedisClient, crawl: str,
                        settings: CrawlSettings | None = None) -> CrawlSettings:
    """A crawl's stored settings, creating it with ``settings`` if new.

    ``settings=None`` takes the stored settings (or the defaults for a new crawl);
    settings that differ from a stored crawl's raise CrawlConflictError.
    """
    keys = CrawlKeys.build(crawl)
    wanted = settings or CrawlSettings()
    if await client.hsetnx(keys.meta, "settings", wanted.to_json()):
        secs, micros = await client.time()  # the crawl's age, for operators
        await client.hsetnx(keys.meta, "created_ms", int(secs) * 1000 + micros // 1000)
    await client.sadd(CRAWLS, crawl)
    raw = await client.hget(keys.meta, "settings")
    if raw is None:
        raise ConfigError(f"crawl {crawl!r} vanished while it was opened; run again")
    stored = CrawlSettings.from_json(raw, crawl)
    if settings is not None and stored != settings:
        raise CrawlConflictError(
            f"crawl {crawl!r} exists with partitions={stored.partitions}, "
            f"dedup={stored.dedup.value}; it was asked for partitions="
            f"{settings.partitions}, dedup={settings.dedup.value}. Use the stored "
            "values, or a new --crawl name"
        )
    return stored


async def existing_settings(client: RedisClient, crawl: str) -> CrawlSettings:
    """The settings of a crawl that must exist already."""
    raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
    if raw is None:
        raise ConfigError(f"no crawl named {crawl!r} in this Redis: check --crawl")
    return CrawlSettings.from_json(raw, crawl)
