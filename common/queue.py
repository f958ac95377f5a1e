"""The async Python API over the lifecycle scripts: one crawl's queue.

A task is in exactly one state: pending (``ready``/``prio``), leased (``leases``),
waiting (``delayed``: a retry or a politeness deferral), dead (``dead``), or done (its
body deleted; only its seen mark remains). Every transition is one Lua script in
``common/lua``; this module builds their KEYS and ARGV, routes each task to its
partition and sends one call per partition per batch, pipelined.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, ResponseError

from common import codec
from common.connection import RedisClient
from common.errors import ConfigError, CrawlConflictError, MalformedTaskError
from common.keys import CRAWLS, CrawlKeys, PartitionKeys
from common.scripts import Scripts
from common.task import Task, decode_task, encode_fields
from common.urls import partition_of, task_id

T = TypeVar("T")

#: Every counter of a partition's ``stats`` hash (plus ``outcome:<code>`` per ack outcome).
COUNTERS = (
    "enqueued", "duplicates", "recrawled", "leased", "orphans", "renewed", "lost", "done",
    "failed", "retried", "dead", "stalled", "stale", "released", "deferred", "promoted",
    "reclaimed", "requeued", "purged", "checkpoints",
)

MALFORMED = "malformed"


class Code(IntEnum):
    """Per-item result of a lifecycle script (mirrors ``common/lua/lib.lua``)."""

    OK = 0
    RETRY = 1
    DEAD = 2
    STALE = 3
    EXPIRED = 4
    UNKNOWN = 5


_CODES = tuple(Code)  # Code by value, faster than Code(value) per item


class DedupMode(StrEnum):
    EXACT = "exact"
    BLOOM = "bloom"


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """What is fixed when a crawl is created (stored in its ``meta`` key)."""

    partitions: int = 1
    dedup: DedupMode = DedupMode.EXACT
    seen_bits: int = 16
    bloom_capacity: int = 1_000_000
    bloom_error: float = 1e-6
    bloom_layers: int = 8

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
            "partitions": self.partitions, "dedup": self.dedup.value,
            "seen_bits": self.seen_bits, "bloom_capacity": self.bloom_capacity,
            "bloom_error": self.bloom_error, "bloom_layers": self.bloom_layers,
        })

    @classmethod
    def from_json(cls, raw: str | bytes) -> CrawlSettings:
        obj = codec.loads(raw)
        return cls(
            partitions=int(obj["partitions"]), dedup=DedupMode(obj["dedup"]),
            seen_bits=int(obj["seen_bits"]), bloom_capacity=int(obj["bloom_capacity"]),
            bloom_error=float(obj["bloom_error"]), bloom_layers=int(obj["bloom_layers"]),
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for failed attempts and the stall limit for reclaimed leases."""

    base_ms: int = 2_000
    cap_ms: int = 600_000
    max_retry_after_ms: int = 3_600_000
    max_stalls: int = 2


@dataclass(frozen=True, slots=True)
class NewTask:
    """A canonical URL ready to enqueue; ``fp`` is its 16-byte fingerprint."""

    url: str
    fp: bytes
    priority: int = 0
    max_attempts: int = 3
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0


@dataclass(slots=True)
class Lease:
    """A task a worker holds, with the fencing token every later call must show."""

    task: Task
    partition: int
    token: str
    deadline_ms: int
    id: str = field(init=False)  # the task's id, copied: it is read many times per task

    def __post_init__(self) -> None:
        self.id = self.task.id


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: ``reason`` is a short code, ``message`` the detail."""

    lease: Lease
    reason: str
    message: str
    retry_after: float | None = None
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    enqueued: int = 0
    duplicates: int = 0
    recrawled: int = 0
    bloom_warnings: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadTask:
    id: str
    partition: int
    reason: str
    message: str
    died_at_ms: int
    attempts: int
    url: str | None
    raw: bytes | None


@dataclass(slots=True)
class Stats:
    """Counts of every state and the running counters, summed over partitions."""

    pending: int = 0
    leased: int = 0
    waiting: int = 0
    dead: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    dead_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.counters.get("done", 0)

    @property
    def active(self) -> int:
        """Tasks that still need work: pending, leased or waiting."""
        return self.pending + self.leased + self.waiting


def _chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class CrawlQueue:
    """One crawl's queue on one Redis (or Redis Cluster) client."""

    def __init__(
        self,
        client: RedisClient,
        crawl: str,
        settings: CrawlSettings,
        *,
        policy: RetryPolicy | None = None,
        recrawl_after_s: int = 0,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.client = client
        self.crawl = crawl
        self.settings = settings
        self.policy = policy or RetryPolicy()
        self.recrawl_after_s = recrawl_after_s
        self._jitter = jitter
        self.crawl_keys = CrawlKeys.build(crawl)
        self.partitions = [PartitionKeys.build(crawl, p) for p in range(settings.partitions)]
        self.scripts = Scripts(client)
        self._next_partition = random.randrange(settings.partitions)
        self._empty_until = [0.0] * settings.partitions
        self._empty_streak = [0] * settings.partitions

    # -- creation ---------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        client: RedisClient,
        crawl: str,
        settings: CrawlSettings | None = None,
        **kwargs: Any,
    ) -> CrawlQueue:
        """Open a crawl, creating it with ``settings`` if new.

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
        stored = CrawlSettings.from_json(raw)
        if settings is not None and stored != settings:
            raise CrawlConflictError(
                f"crawl {crawl!r} exists with partitions={stored.partitions}, "
                f"dedup={stored.dedup.value}; it was asked for partitions="
                f"{settings.partitions}, dedup={settings.dedup.value}. Use the stored "
                "values, or a new --crawl name"
            )
        return cls(client, crawl, stored, **kwargs)

    @classmethod
    async def existing(cls, client: RedisClient, crawl: str, **kwargs: Any) -> CrawlQueue:
        """Open a crawl that must exist already."""
        raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
        if raw is None:
            raise ConfigError(f"no crawl named {crawl!r} in this Redis: check --crawl")
        return cls(client, crawl, CrawlSettings.from_json(raw), **kwargs)

    # -- routing ----------------------------------------------------------------------

    def partition_of_id(self, tid: str) -> int:
        """The partition of a task id (the hex fingerprint)."""
        return partition_of(bytes.fromhex(tid), self.settings.partitions)

    async def _run(self, calls: list[tuple[Any, list[Any], list[Any]]]) -> list[Any]:
        """Run script calls: pipelined on one node, concurrently across a cluster.

        A cluster client sends each call to the shard of its partition's hash tag, so
        partitions on different shards are served in parallel.
        """
        if len(calls) == 1:
            script, keys, args = calls[0]
            return [await script(keys=keys, args=args)]
        if isinstance(self.client, aioredis.RedisCluster):
            return list(await asyncio.gather(
                *(script(keys=keys, args=args) for script, keys, args in calls)))
        async with self.client.pipeline(transaction=False) as pipe:
            for script, keys, args in calls:
                await script(keys=keys, args=args, client=pipe)
            result: list[Any] = await pipe.execute()
            return result

    # -- enqueue ----------------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask], *, now: float | None = None
                      ) -> EnqueueResult:
        """Dedup and enqueue a batch; one script call per partition, pipelined.

        ``now`` (unix seconds, default the local clock) is only recorded as the tasks'
        ``enqueued_at``; the seen time and every deadline come from Redis TIME.
        """
        now = time.time() if now is None else now
        by_partition: dict[int, list[NewTask]] = defaultdict(list)
        for t in tasks:
            if t.priority < 0 or t.max_attempts < 1 or t.depth < 0:
                raise ConfigError("priority and depth must be >= 0, max_attempts >= 1")
            by_partition[partition_of(t.fp, self.settings.partitions)].append(t)
        calls = [self._enqueue_call(self.partitions[p], batch, now)
                 for p, batch in by_partition.items()]
        if not calls:
            return EnqueueResult()
        results = await self._run(calls)
        warnings = tuple(int(r[3]) for r in results if len(r) > 3 and int(r[3]) >= 0)
        return EnqueueResult(
            enqueued=sum(int(r[0]) for r in results),
            duplicates=sum(int(r[1]) for r in results),
            recrawled=sum(int(r[2]) for r in results),
            bloom_warnings=warnings,
        )

    def _enqueue_call(
        self, pk: PartitionKeys, batch: Sequence[NewTask], now: float
    ) -> tuple[Any, list[Any], list[Any]]:
        head = [pk.ready, pk.prio, pk.tasks, pk.prios, pk.stats]
        args: list[Any]
        if self.settings.dedup is DedupMode.BLOOM:
            if self.recrawl_after_s:
                raise ConfigError("recrawl_after needs exact dedup: bloom keeps no timestamps")
            keys = [*head, pk.bloom,
                    *(pk.bloom_layer(i) for i in range(self.settings.bloom_layers))]
            args = [self.settings.bloom_capacity, repr(self.settings.bloom_error)]
            for t in batch:
                tid = task_id(t.fp)
                args += [tid, int.from_bytes(t.fp[8:12], "big"),
                         int.from_bytes(t.fp[12:16], "big") | 1, t.priority,
                         self._body(tid, t, now)]
            return self.scripts.enqueue_bloom, keys, args
        shift = 32 - self.settings.seen_bits
        keys = head
        args = [self.recrawl_after_s]
        for t in batch:
            tid = task_id(t.fp)
            keys.append(pk.seen(int.from_bytes(t.fp[:4], "big") >> shift))
            args += [tid, t.fp[2:], t.priority, self._body(tid, t, now)]
        return self.scripts.enqueue, keys, args

    @staticmethod
    def _body(tid: str, t: NewTask, now: float) -> str:
        return encode_fields(tid, t.url, max_attempts=t.max_attempts, priority=t.priority,
                             enqueued_at=now, meta=t.meta, depth=t.depth)

    # -- lease ------------------------------------------------------------------------

    async def lease(self, worker: str, n: int, lease_ms: int) -> list[Lease]:
        """Lease up to n tasks, taking partitions in turn so none starves.

        A partition found empty is skipped for a short, growing while, so an idle
        partition of a large crawl costs almost no round trips.

        A body that can't be decoded is dead-lettered as ``malformed`` (raw bytes kept)
        and not returned.
        """
        leases: list[Lease] = []
        malformed: list[Failure] = []
        count = len(self.partitions)
        now = time.monotonic()
        for step in range(count):
            if len(leases) >= n:
                break
            p = (self._next_partition + step) % count
            if now < self._empty_until[p]:
                continue  # found empty a moment ago: costs nothing until it expires
            pk = self.partitions[p]
            reply = await self.scripts.lease(
                keys=[pk.ready, pk.prio, pk.tasks, pk.attempts, pk.leases, pk.owners, pk.seq,
                      pk.stats, pk.checkpoints, pk.errors],
                args=[worker, n - len(leases), lease_ms],
            )
            before = len(leases) + len(malformed)
            self._parse_lease(reply, p, leases, malformed)
            if count > 1:
                self._note_empty(p, now, empty=len(leases) + len(malformed) == before)
        self._next_partition = (self._next_partition + 1) % count
        if malformed:
            await self.fail(worker, malformed)
        return leases

    def _note_empty(self, p: int, now: float, *, empty: bool) -> None:
        """Back off from an empty partition: 50 ms, doubling to 1 s while it stays empty."""
        if not empty:
            self._empty_streak[p] = 0
            self._empty_until[p] = 0.0
            return
        self._empty_streak[p] = min(self._empty_streak[p] + 1, 5)
        self._empty_until[p] = now + 0.05 * 2 ** (self._empty_streak[p] - 1)

    @staticmethod
    def _parse_lease(
        reply: list[Any], partition: int, leases: list[Lease], malformed: list[Failure]
    ) -> None:
        deadline = int(reply[1])
        for i in range(2, len(reply), 6):
            tid, token, attempt, body, cp, err = reply[i:i + 6]
            tid, token = _text(tid), _text(token)
            try:
                checkpoint = codec.loads(cp) if cp else None
                task = decode_task(body, attempt=int(attempt),
                                   last_error=_text(err) if err else None,
                                   checkpoint=checkpoint)
                if task.id != tid:
                    raise MalformedTaskError(f"task body id {task.id!r} is not its key {tid!r}")
            except (MalformedTaskError, ValueError) as exc:
                stub = Task(id=tid, url="", attempt=int(attempt))
                malformed.append(Failure(Lease(stub, partition, token, deadline),
                                         MALFORMED, str(exc), permanent=True))
                continue
            leases.append(Lease(task, partition, token, deadline))

    # -- transitions on held leases --------------------------------------------------

    def _by_partition(self, items: Iterable[T], lease_of: Callable[[T], Lease]
                      ) -> dict[int, list[T]]:
        groups: dict[int, list[T]] = defaultdict(list)
        for item in items:
            groups[lease_of(item).partition].append(item)
        return groups

    async def renew(
        self, worker: str, leases: Sequence[Lease], lease_ms: int
    ) -> list[tuple[Lease, Code]]:
        """Extend held leases; returns the ones lost, with why. Updates deadlines."""
        groups = self._by_partition(leases, lambda x: x)
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker, lease_ms]
            for lease in group:
                args += [lease.id, lease.token]
            calls.append((self.scripts.renew, [pk.leases, pk.owners, pk.stats], args))
        if not calls:
            return []
        lost: list[tuple[Lease, Code]] = []
        for group, reply in zip(groups.values(), await self._run(calls), strict=True):
            deadline = int(reply[0])
            lost_codes = {_text(reply[i]): Code(int(reply[i + 1]))
                          for i in range(1, len(reply), 2)}
            for lease in group:
                code = lost_codes.get(lease.id)
                if code is None:
                    lease.deadline_ms = deadline
                else:
                    lost.append((lease, code))
        return lost

    async def ack(self, worker: str, items: Sequence[tuple[Lease, str]]) -> list[Code]:
        """Mark tasks done with an outcome code; returns a code per item, in order."""
        groups = self._by_partition(items, lambda x: x[0])
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker]
            for lease, outcome in group:
                args.extend((lease.id, lease.token, outcome))
            calls.append((self.scripts.ack, [pk.leases, pk.owners, pk.tasks, pk.attempts,
                                             pk.checkpoints, pk.errors, pk.stalls, pk.prios,
                                             pk.stats], args))
        return self._in_order(items, groups, await self._run(calls) if calls else [],
                              lambda reply, i: _CODES[int(reply[i])])

    async def fail(self, worker: str, failures: Sequence[Failure]) -> list[tuple[Code, int]]:
        """Record failed attempts; returns (RETRY with delay ms | DEAD | refusal, -1)."""
        pol = self.policy
        groups = self._by_partition(failures, lambda f: f.lease)
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker, pol.base_ms, pol.cap_ms, pol.max_retry_after_ms]
            for f in group:
                reason = "".join(f.reason.split()) or "error"
                retry_after = -1 if f.retry_after is None else max(0, int(f.retry_after * 1000))
                args += [f.lease.id, f.lease.token, f.lease.task.max_attempts, reason,
                         f.message[:1000], retry_after, int(f.permanent),
                         repr(self._jitter())]
            calls.append((self.scripts.fail, [pk.leases, pk.owners, pk.attempts, pk.delayed,
                                              pk.dead, pk.errors, pk.dead_reasons, pk.stats],
                          args))
        return self._in_order(failures, groups, await self._run(calls) if calls else [],
                              lambda reply, i: (Code(int(reply[2 * i])),
                                                int(reply[2 * i + 1])))

    async def release(self, worker: str, leases: Sequence[Lease]) -> list[Code]:
        """Hand leases back to the head of the line without counting an attempt."""
        groups = self._by_partition(leases, lambda x: x)
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker]
            for lease in group:
                args += [lease.id, lease.token]
            calls.append((self.scripts.release, [pk.leases, pk.owners, pk.attempts, pk.ready,
                                                 pk.prio, pk.prios, pk.stats], args))
        return self._in_order(leases, groups, await self._run(calls) if calls else [],
                              lambda reply, i: _CODES[int(reply[i])])

    async def defer(self, worker: str, items: Sequence[tuple[Lease, int]]) -> list[Code]:
        """Put leased tasks back to wait delay_ms, without counting an attempt."""
        groups = self._by_partition(items, lambda x: x[0])
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker]
            for lease, delay_ms in group:
                args += [lease.id, lease.token, max(0, int(delay_ms))]
            calls.append((self.scripts.defer, [pk.leases, pk.owners, pk.attempts, pk.delayed,
                                               pk.stats], args))
        return self._in_order(items, groups, await self._run(calls) if calls else [],
                              lambda reply, i: _CODES[int(reply[i])])

    async def checkpoint(self, worker: str, lease: Lease, value: Any) -> Code:
        """Save a checkpoint for a held lease (a lost lease can't)."""
        pk = self.partitions[lease.partition]
        code = await self.scripts.checkpoint(
            keys=[pk.leases, pk.owners, pk.checkpoints, pk.stats],
            args=[worker, lease.id, lease.token, codec.dumps(value)],
        )
        if code == Code.OK:
            lease.task.checkpoint = value
        return Code(int(code))

    @staticmethod
    def _in_order(items: Sequence[T], groups: dict[int, list[T]], replies: list[Any],
                  parse: Callable[[Any, int], Any]) -> list[Any]:
        """Map per-partition replies back to the callers' item order.

        An item passed twice gets one result per occurrence, in order (a group keeps
        its items' order, and the same item always lands in the same group).
        """
        if len(groups) == 1:  # one partition (the default): already in the callers' order
            (reply,) = replies
            return [parse(reply, i) for i in range(len(items))]
        by_item: dict[int, list[Any]] = defaultdict(list)
        for group, reply in zip(groups.values(), replies, strict=True):
            for i, item in enumerate(group):
                by_item[id(item)].append(parse(reply, i))
        return [by_item[id(item)].pop(0) for item in items]

    # -- housekeeping ------------------------------------------------------------------

    async def reclaim(self, limit: int = 1000) -> tuple[int, int]:
        """Take back expired leases in every partition; returns (reclaimed, dead)."""
        reclaimed = died = 0
        for pk in self.partitions:
            while True:
                r = await self.scripts.reclaim(
                    keys=[pk.leases, pk.owners, pk.stalls, pk.ready, pk.prio, pk.prios,
                          pk.dead, pk.errors, pk.dead_reasons, pk.stats],
                    args=[limit, self.policy.max_stalls],
                )
                reclaimed += int(r[0])
                died += int(r[1])
                if not int(r[2]):
                    break
        return reclaimed, died

    async def promote(self, limit: int = 1000) -> tuple[int, int]:
        """Move due retries/deferrals to ready; returns (moved, ms to the next due or -1)."""
        moved, next_due = 0, -1
        for pk in self.partitions:
            while True:
                r = await self.scripts.promote(
                    keys=[pk.delayed, pk.ready, pk.prio, pk.prios, pk.stats], args=[limit])
                moved += int(r[0])
                if int(r[0]) < limit:
                    wait = int(r[1])
                    if wait >= 0 and (next_due < 0 or wait < next_due):
                        next_due = wait
                    break
        return moved, next_due

    async def reap(self, guard_ms: int) -> tuple[int, int, int] | None:
        """Reclaim and promote, at most once per guard_ms across the fleet.

        Returns (reclaimed, dead, promoted), or None when another worker holds the guard.
        """
        try:
            if not await self.client.set(self.partitions[0].reap_lock, b"1", nx=True,
                                         px=guard_ms):
                return None
        except ResponseError as exc:
            # At maxmemory the guard can't be written; the scripts are safe to run from
            # every worker at once (they only free or move memory), so reap unguarded.
            if not isinstance(exc, OutOfMemoryError) and "maxmemory" not in str(exc):
                raise
        reclaimed, died = await self.reclaim()
        promoted, _ = await self.promote()
        return reclaimed, died, promoted

    # -- dead letters -----------------------------------------------------------------

    async def dead_list(self, *, reason: str | None = None, limit: int = 50,
                        page: int = 500) -> list[DeadTask]:
        """Dead tasks, oldest first, optionally only those with one reason."""
        found: list[DeadTask] = []
        for p, pk in enumerate(self.partitions):
            start = 0
            while len(found) < limit:
                ids = cast(list[tuple[bytes, float]], await self.client.zrange(
                    pk.dead, start, start + page - 1, withscores=True))
                if not ids:
                    break
                start += page
                members = [m for m, _ in ids]
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.hmget(pk.errors, members)
                    pipe.hmget(pk.tasks, members)
                    pipe.hmget(pk.attempts, members)
                    errs, bodies, attempts = await pipe.execute()
                for (member, score), err, body, att in zip(ids, errs, bodies, attempts,
                                                           strict=True):
                    why, _, message = (err or b"unknown ").decode().partition(" ")
                    if reason is not None and why != reason:
                        continue
                    url = None
                    if body:
                        try:
                            url = str(codec.loads(body).get("url"))
                        except (ValueError, AttributeError):
                            url = None
                    found.append(DeadTask(_text(member), p, why, message, int(score),
                                          int(att or 0), url, body))
                    if len(found) >= limit:
                        break
        return found

    async def _dead_op(self, script_name: str, ids: Sequence[str]) -> int:
        groups: dict[int, list[str]] = defaultdict(list)
        for tid in ids:
            groups[self.partition_of_id(tid)].append(tid)
        done = 0
        for p, group in groups.items():
            pk = self.partitions[p]
            if script_name == "requeue":
                script = self.scripts.requeue
                keys = [pk.dead, pk.errors, pk.attempts, pk.stalls, pk.dead_reasons, pk.ready,
                        pk.prio, pk.prios, pk.stats]
            else:
                script = self.scripts.purge
                keys = [pk.dead, pk.errors, pk.dead_reasons, pk.tasks, pk.attempts, pk.stalls,
                        pk.checkpoints, pk.prios, pk.stats]
            for chunk in _chunks(group, 500):
                codes = await script(keys=keys, args=list(chunk))
                done += sum(1 for c in codes if int(c) == Code.OK)
        return done

    async def dead_requeue(self, ids: Sequence[str]) -> int:
        """Put dead tasks back in line with fresh attempts; returns how many moved."""
        return await self._dead_op("requeue", ids)

    async def dead_purge(self, ids: Sequence[str]) -> int:
        """Delete dead tasks for good; returns how many were deleted."""
        return await self._dead_op("purge", ids)

    async def dead_ids(self, reason: str | None = None) -> list[str]:
        """Every dead id (optionally of one reason), paged through each partition."""
        return [d.id for d in await self.dead_list(reason=reason, limit=10**12)]

    # -- observation ------------------------------------------------------------------

    async def stats(self) -> Stats:
        """Every state's count and every counter, summed over the partitions."""
        async with self.client.pipeline(transaction=False) as pipe:
            for pk in self.partitions:
                pipe.llen(pk.ready)
                pipe.zcard(pk.prio)
                pipe.zcard(pk.leases)
                pipe.zcard(pk.delayed)
                pipe.zcard(pk.dead)
                pipe.hgetall(pk.stats)
                pipe.hgetall(pk.dead_reasons)
            replies = await pipe.execute()
        s = Stats()
        for i in range(0, len(replies), 7):
            ready, prio, leased, waiting, dead, counters, reasons = replies[i:i + 7]
            s.pending += ready + prio
            s.leased += leased
            s.waiting += waiting
            s.dead += dead
            for k, v in counters.items():
                s.counters[_text(k)] = s.counters.get(_text(k), 0) + int(v)
            for k, v in reasons.items():
                s.dead_reasons[_text(k)] = s.dead_reasons.get(_text(k), 0) + int(v)
        return s

    async def state_of(self, tid: str) -> str:
        """The state of one task id: pending, leased, waiting, dead, done or unknown."""
        pk = self.partitions[self.partition_of_id(tid)]
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.lpos(pk.ready, tid)
            pipe.zscore(pk.prio, tid)
            pipe.zscore(pk.leases, tid)
            pipe.zscore(pk.delayed, tid)
            pipe.zscore(pk.dead, tid)
            pipe.hexists(pk.tasks, tid)
            ready, prio, leased, waiting, dead, live = await pipe.execute()
        if ready is not None or prio is not None:
            return "pending"
        for name, value in (("leased", leased), ("waiting", waiting), ("dead", dead)):
            if value is not None:
                return name
        return "unknown" if live else "done"
