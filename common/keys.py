"""The Redis key schema: every key crawlq writes is built here, and only here.

All keys of one partition share the hash tag ``{<crawl>:<partition>}``, so every
lifecycle script touches a single Redis Cluster slot. Crawl-wide keys use the tag
``{<crawl>}``. Task data lives in fields of the hashes below, never in per-task keys.

Partition keys (``crawlq:{<crawl>:<p>}:<name>``):

=============  ======  ==========================================  ===================
name           type    holds                                       written by
=============  ======  ==========================================  ===================
ready          LIST    ids of pending tasks with priority 0, FIFO   enqueue, release,
                       (leased from the head)                      reclaim, promote,
                                                                   requeue, lease
prio           ZSET    ids of pending tasks with priority > 0,     same as ready
                       score = -priority (highest first)
tasks          HASH    id -> task JSON (url, meta, depth, ...)     enqueue; deleted by
                                                                   ack and purge
prios          HASH    id -> priority, only for priority > 0       enqueue, ack, purge
attempts       HASH    id -> attempts so far (counted at lease)    lease, release,
                                                                   defer, ack, requeue
leases         ZSET    id -> lease deadline, ms of Redis TIME      lease, renew, ack,
                                                                   fail, release,
                                                                   defer, reclaim
owners         HASH    id -> "<fencing token>:<worker>"            same as leases
seq            STRING  fencing-token counter                       lease
delayed        ZSET    id -> due time, ms of Redis TIME (retries   fail, defer, promote
                       and politeness deferrals)
dead           ZSET    id -> time of death, ms                     fail, reclaim,
                                                                   requeue, purge
errors         HASH    id -> "<reason> <message>" (last error)     fail, reclaim, ack
dead_reasons   HASH    reason -> number of dead tasks with it      fail, reclaim,
                                                                   requeue, purge
checkpoints    HASH    id -> opaque JSON a handler saved           checkpoint, ack,
                                                                   purge
stalls         HASH    id -> times reclaimed from a dead consumer  reclaim, ack,
                                                                   requeue, purge
stats          HASH    counter name -> running total (see          every script
                       ``common.queue.COUNTERS``)
seen:<bucket>  HASH    exact dedup: fingerprint[2:] -> last        enqueue
                       enqueue time, s of Redis TIME; 2**bits
                       small hashes so Redis keeps them compact
bloom:<layer>  STRING  bloom dedup: the bits of one filter layer   enqueue_bloom
bloom          HASH    bloom dedup: layers, count:<layer>          enqueue_bloom
lock:reap      STRING  SET NX PX guard: one reaper per interval    reaper (Python)
=============  ======  ==========================================  ===================

``owners`` and ``attempts`` also hold one field that is not a task id,
`HASHTABLE_FIELD` (128 ``~``), written by lease: a field that long makes Redis store the
hash as a hashtable for good. Their size follows the tasks in flight, a few hundred
fields, where Redis would otherwise keep a listpack (up to 512 short fields) and scan
it for every field read or written (measured ~4 us per field at 256 fields, ~25x a
hashtable). Tools that list these hashes skip it.

Crawl keys (``crawlq:{<crawl>}:<name>``): ``meta`` HASH (``settings``: partitions, dedup
mode and parameters, fixed at creation; ``created_ms``: when, ms of Redis TIME),
``lock:producer`` STRING (one producer run at a time), ``results`` STREAM (the
redis-stream sink), ``workers`` ZSET (worker id -> last heartbeat, ms of Redis TIME) and
``worker:<id>`` HASH (id, host, pid, state, started_ms, heartbeat_ms, interval_ms,
in_flight, done, failed, pages_per_s; times in ms of Redis TIME; expires unless
refreshed; ``common.workers``), ``history`` LIST (newest first, at most 720 JSON
snapshots ``{"t": unix s of Redis TIME, "done": n, ...}`` of the summed counters, about
one per 5 s fleet-wide: an hour, for rates and the dashboard's chart;
``common.history``), ``hosts`` HASH (politeness: host -> next allowed request start, ms
of Redis TIME; written by host_acquire/host_release) and ``slots:<host>`` ZSET (a host's
live fetch slots: token -> expiry ms).

Robots (``crawlq:{<crawl>}:robots:<origin>``, origin ``scheme://host[:port]``): STRING,
JSON ``{"status", "body", "fetched_at"}`` of that origin's robots.txt (``"error"`` set
after a failed fetch), EX the robots TTL (60 s after a failure); ``<key>:lock`` STRING is
its SET NX PX guard so one consumer of the fleet fetches it (``consumer.robots``).

Global: ``crawlq:crawls`` SET of crawl names.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "crawlq"
CRAWLS = f"{PREFIX}:crawls"
#: The non-task field of ``owners`` and ``attempts`` (mirrors ``lib.lua``).
HASHTABLE_FIELD = "~" * 128

# Names of the fixed per-partition keys, in the order PartitionKeys declares them.
_PARTITION_NAMES = (
    "ready", "prio", "tasks", "prios", "attempts", "leases", "owners", "seq", "delayed",
    "dead", "errors", "dead_reasons", "checkpoints", "stalls", "stats", "bloom",
    "lock:reap",
)


def _check_crawl(crawl: str) -> str:
    if not crawl or any(c in crawl for c in "{}: \t\r\n"):
        raise ValueError(
            f"invalid crawl name {crawl!r}: use letters, digits, '-', '_' or '.'"
        )
    return crawl


def crawl_key(crawl: str, name: str) -> str:
    """A crawl-wide key, tagged ``{<crawl>}``."""
    return f"{PREFIX}:{{{_check_crawl(crawl)}}}:{name}"


def partition_prefix(crawl: str, partition: int) -> str:
    """The prefix shared by every key of one partition."""
    return f"{PREFIX}:{{{_check_crawl(crawl)}:{partition}}}:"


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """Every key of one partition (see the module docstring for types and owners)."""

    crawl: str
    partition: int
    ready: str
    prio: str
    tasks: str
    prios: str
    attempts: str
    leases: str
    owners: str
    seq: str
    delayed: str
    dead: str
    errors: str
    dead_reasons: str
    checkpoints: str
    stalls: str
    stats: str
    bloom: str
    reap_lock: str

    @classmethod
    def build(cls, crawl: str, partition: int) -> PartitionKeys:
        prefix = partition_prefix(crawl, partition)
        return cls(crawl, partition, *(prefix + name for name in _PARTITION_NAMES))

    def seen(self, bucket: int) -> str:
        """One exact-dedup bucket hash (called per URL: the prefix is taken from ready)."""
        return f"{self.ready[:-5]}seen:{bucket:x}"

    def bloom_layer(self, layer: int) -> str:
        """The bit string of one bloom filter layer."""
        return f"{partition_prefix(self.crawl, self.partition)}bloom:{layer}"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this partition."""
        return partition_prefix(self.crawl, self.partition).replace("{", "\\{").replace(
            "}", "\\}") + "*"


@dataclass(frozen=True, slots=True)
class CrawlKeys:
    """The crawl-wide keys."""

    crawl: str
    meta: str
    producer_lock: str
    results: str
    workers: str
    history: str

    @classmethod
    def build(cls, crawl: str) -> CrawlKeys:
        return cls(crawl, crawl_key(crawl, "meta"), crawl_key(crawl, "lock:producer"),
                   crawl_key(crawl, "results"), crawl_key(crawl, "workers"),
                   crawl_key(crawl, "history"))

    def robots(self, origin: str) -> str:
        """One origin's cached robots.txt; `origin` is ``scheme://host[:port]``."""
        return crawl_key(self.crawl, f"robots:{origin}")

    def worker(self, worker_id: str) -> str:
        return crawl_key(self.crawl, f"worker:{worker_id}")

    @property
    def hosts(self) -> str:
        return crawl_key(self.crawl, "hosts")

    def slots(self, host: str) -> str:
        return crawl_key(self.crawl, f"slots:{host}")
