"""The async Python API over the lifecycle scripts: one crawl's queue, a host-fair frontier.

A task is in exactly one state: pending (an entry in its host's queue, ``hq:<host>`` or
``hp:<host>``), leased (``leases``), waiting to retry (``delayed``), dead (``dead``), or
done (its body deleted; only its seen mark remains). Every transition is one Lua script
in ``common/lua``; this module builds their KEYS and ARGV, routes each task to the
partition of its host and sends one call per partition per batch, pipelined.

A lease serves hosts whose turn has come (see ``common/lua/lease.lua``): the scripts are
given every key they touch, so a lease first reads which hosts are at the head of the
line and passes their queues' keys; the script decides on Redis TIME which of them are
ready, so a stale read costs a smaller batch, never a wrong one.
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
from common.codec import text as _text
from common.connection import RedisClient
from common.errors import ConfigError, CrawlConflictError, MalformedTaskError
from common.hostmodel.hostconf import HostConf
from common.hostmodel.hostkey import host_key, partition_of_host
from common.keys import CRAWLS, CrawlKeys, PartitionKeys
from common.reasons import HANDLER_ERROR, HTTP_5XX, HTTP_408, HTTP_429, ROBOTS_DISALLOWED
from common.revisit import Observed, Revisit
from common.schedule import MARKS_OBSERVED, observed_arg, promote_revisits
from common.scripts import Scripts, locate_in
from common.task import Task, decode_entry, encode_entry, entry_url, stored_entry
from common.urls import task_id

T = TypeVar("T")

#: Every counter of a partition's ``stats`` hash (plus ``outcome:<code>`` per ack outcome).
#: ``repaired_hosts``: hosts whose pending count was found larger than their queues
#: (a lost ``hq``/``hp`` key), set right by lease.lua or ``crawlq fsck --repair``;
#: ``lost_pending``: the entries those counts held that no queue did (tasks lost);
#: ``backoffs``: push-back incidents that raised a host's backoff (lib/backoff.lua).
COUNTERS = (
    "enqueued", "duplicates", "recrawled", "leased", "renewed", "lost", "done", "failed",
    "retried", "dead", "stalled", "stale", "released", "promoted", "reclaimed", "requeued",
    "purged", "checkpoints", "repaired_hosts", "lost_pending", "backoffs",
)

MALFORMED = "malformed"
#: Fail reasons that say the request got a response from the host (a page of its
#: budget) when the lease doesn't say (``Lease.responded``).
RESPONSE_REASONS = frozenset({HTTP_5XX, HTTP_408, HTTP_429, HANDLER_ERROR})
#: The schema version a crawl's settings carry; a crawl of another version must be
#: re-created (its keys mean something else).
FORMAT = 2
#: How long a lease call waits at most before asking again when nothing is ready, so a
#: `crawlq resume`, a host setting or new work is seen within about a second.
MAX_IDLE_WAIT_S = 1.0
#: The most candidate hosts one lease call reads (a call that leaves ready hosts unread
#: is followed at once by another).
CANDIDATE_HOSTS = 128
#: How long a partition with no host ready (every host busy, or nothing pending) is
#: skipped: its next turn is unknown.
UNKNOWN_WAIT_S = 0.05


class Code(IntEnum):
    """Per-item result of a lifecycle script (mirrors ``common/lua/lib/codes.lua``)."""

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
            "format": FORMAT, "partitions": self.partitions, "dedup": self.dedup.value,
            "seen_bits": self.seen_bits, "bloom_capacity": self.bloom_capacity,
            "bloom_error": self.bloom_error, "bloom_layers": self.bloom_layers,
        })

    @classmethod
    def from_json(cls, raw: str | bytes, crawl: str = "") -> CrawlSettings:
        """The stored settings; CrawlFormatError for a crawl an older crawlq created."""
        obj = codec.loads(raw)
        if obj.get("format") != FORMAT:
            raise CrawlFormatError(
                f"crawl {crawl!r} was created by an older crawlq (one queue per crawl, not "
                "per host) and can't be used by this one: re-create it with "
                f"`crawlq reset --crawl {crawl} --yes` and run the producer again, or use a "
                "new --crawl name"
            )
        return cls(
            partitions=int(obj["partitions"]), dedup=DedupMode(obj["dedup"]),
            seen_bits=int(obj["seen_bits"]), bloom_capacity=int(obj["bloom_capacity"]),
            bloom_error=float(obj["bloom_error"]), bloom_layers=int(obj["bloom_layers"]),
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for failed attempts, a host's backoff when it pushes back, and the stall
    limit for reclaimed leases (the crawl policy's values: `CrawlPolicy.retry`)."""

    base_ms: int = 2_000
    cap_ms: int = 600_000
    max_retry_after_ms: int = 3_600_000
    max_stalls: int = 2
    backoff_base_ms: int = 1_000
    backoff_cap_ms: int = 3_600_000
    backoff_forgive_ms: int = 300_000


class CrawlFormatError(ConfigError):
    """The crawl was created by a crawlq whose Redis layout this one does not read."""


@dataclass(frozen=True, slots=True)
class NewTask:
    """A canonical URL ready to enqueue; ``fp`` is its 16-byte fingerprint."""

    url: str
    fp: bytes
    priority: int = 0
    max_attempts: int = 3
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # checked: common.headers
    revisit: Revisit | None = None  # the URL's previous visit (the frontier's recrawls; tests)


@dataclass(slots=True)
class Lease:
    """A task a worker holds, with the fencing token every later call must show."""

    task: Task
    partition: int
    token: str
    deadline_ms: int
    host: str
    granted_ms: int = 0  # Redis time of the lease: its host's turn
    # The host's delay when leased: with one, the request goes out at its turn.
    delay_ms: int = 0
    # The host's concurrency when leased (0: unlimited): with a limit, the host's slot is
    # given back as soon as the response is in (lease_turns' `fetched`).
    concurrency: int = 0
    # Redis time its request went out when later than the turn allows for (0: on time):
    # the host's next turn then counts from it (ack/fail).
    sent_ms: int = 0
    # Whether its request to the host got a response (any status): then it is a page of
    # the host's budget (ack/fail settle it). None: not said; ack counts every outcome
    # but robots_disallowed, fail only the reasons of a response (RESPONSE_REASONS).
    responded: bool | None = None
    # Its response's time in ms, for a crawl whose adaptive_delay is on (-1: not sent).
    elapsed_ms: int = -1
    # What its fetch learned for the URL's history (the revisit schedule; ack sends it).
    observed: Observed | None = None
    id: str = field(init=False)  # the task's id, copied: it is read many times per task

    def __post_init__(self) -> None:
        self.id = self.task.id


@dataclass(slots=True)
class LeaseBatch:
    """What one lease call got: the leases, and when to ask again if there were none.

    ``wait_s`` is how long until some host's turn comes (None: no host holds pending
    work; then a retry's due time or new work is what to wait for); ``paused``: the
    crawl is paused; ``policy_version``: the newest crawl policy version a partition's
    reply named (-1: none said).
    """

    leases: list[Lease]
    wait_s: float | None = None
    paused: bool = False
    policy_version: int = -1


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: ``reason`` is a short code, ``message`` the detail.

    ``pushback``: the host pushed back (a 429/503, or what else the crawl's policy
    counts): its backoff rises for the whole fleet (lib/backoff.lua).
    """

    lease: Lease
    reason: str
    message: str
    retry_after: float | None = None
    permanent: bool = False
    pushback: bool = False


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
    """Counts of every state and the running counters, summed over partitions.

    ``hosts_due``: hosts holding pending work with a free slot (what KEDA scales on).
    ``parked``: the pending tasks of hosts whose page budget is spent (counted in
    ``pending``): no consumer serves them until the budget is raised.
    """

    pending: int = 0
    leased: int = 0
    waiting: int = 0
    dead: int = 0
    hosts_due: int = 0
    parked: int = 0
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


#: lease.lua's reply: {now, deadline, wait, retry, paused, next hosts, policy version}
#: before the tasks.
_LEASE_HEAD = 7
# per lease: id, token, attempt, entry, checkpoint, error, host, delay, concurrency
_LEASE_FIELDS = 9
_NEXT_HOSTS = 5
_POLICY_VERSION = 6


def _candidates_for(n: int) -> int:
    """Candidate hosts for a lease of n. Bounded: each is read in the script, and a host
    without a delay can give many."""
    return min(2 * n, CANDIDATE_HOSTS) + 8


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
        #: The crawl's revisits are on (its policy): each ack sends what its fetch observed.
        self.revisits = False
        self._jitter = jitter
        self.crawl_keys = CrawlKeys.build(crawl)
        self.partitions = [PartitionKeys.build(crawl, p) for p in range(settings.partitions)]
        self.scripts = Scripts(client)
        self._next_partition = random.randrange(settings.partitions)
        self._idle_until = [0.0] * settings.partitions  # monotonic: nothing ready before
        self._candidates: list[list[str]] = [[] for _ in range(settings.partitions)]

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
        stored = CrawlSettings.from_json(raw, crawl)
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
        return cls(client, crawl, CrawlSettings.from_json(raw, crawl), **kwargs)

    # -- routing ----------------------------------------------------------------------

    def partition_of(self, host: str) -> int:
        """The partition that holds a host."""
        return partition_of_host(host, self.settings.partitions)

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
            try:
                result: list[Any] = await pipe.execute()
            except ResponseError as exc:
                locate_in(exc, (script for script, _, _ in calls))
                raise
            return result

    @staticmethod
    def _host_args(pk: PartitionKeys, hosts: Sequence[str]) -> tuple[list[str], list[Any]]:
        """The per-host KEYS (hq, hp of each) and the ARGV head (count, hosts) of a script
        that takes hosts."""
        keys: list[str] = []
        for host in hosts:
            keys += [pk.host_queue(host), pk.host_prio(host)]
        return keys, [len(hosts), *hosts]

    # -- enqueue ----------------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> EnqueueResult:
        """Dedup and enqueue a batch into its hosts' queues; one script call per
        partition, pipelined. MalformedTaskError for a URL without an http(s) host."""
        by_partition: dict[int, dict[str, list[NewTask]]] = defaultdict(
            lambda: defaultdict(list))
        for t in tasks:
            if t.priority < 0 or t.max_attempts < 1 or t.depth < 0:
                raise ConfigError("priority and depth must be >= 0, max_attempts >= 1")
            if " " in t.url:  # an entry's URL ends at its first space (common.task)
                raise MalformedTaskError(f"URL is not canonical (it holds a space): "
                                         f"{t.url[:200]!r}; canonicalize it first")
            host = host_key(t.url)
            by_partition[self.partition_of(host)][host].append(t)
        calls = [self._enqueue_call(self.partitions[p], hosts)
                 for p, hosts in by_partition.items()]
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

    def _enqueue_call(self, pk: PartitionKeys, by_host: dict[str, list[NewTask]]
                      ) -> tuple[Any, list[Any], list[Any]]:
        host_keys, host_head = self._host_args(pk, list(by_host))
        head = [*pk.host_state, pk.tasks, pk.stats, pk.pending, pk.prio_hosts]
        args: list[Any]
        if self.settings.dedup is DedupMode.BLOOM:
            if self.recrawl_after_s:
                raise ConfigError("recrawl_after needs exact dedup: bloom keeps no timestamps")
            layers = self.settings.bloom_layers
            keys = [*head, pk.bloom, *(pk.bloom_layer(i) for i in range(layers)),
                    *host_keys]
            args = [self.settings.bloom_capacity, repr(self.settings.bloom_error), layers,
                    *host_head]
            for h, batch in enumerate(by_host.values(), 1):
                for t in batch:
                    tid = task_id(t.fp)
                    args += [tid, int.from_bytes(t.fp[8:12], "big"),
                             int.from_bytes(t.fp[12:16], "big") | 1, t.priority, h,
                             self._entry(tid, t)]
            return self.scripts.enqueue_bloom, keys, args
        shift = 32 - self.settings.seen_bits
        keys = [*head, *host_keys]
        args = [self.recrawl_after_s, *host_head]
        for h, batch in enumerate(by_host.values(), 1):
            for t in batch:
                tid = task_id(t.fp)
                keys.append(pk.seen(int.from_bytes(t.fp[:4], "big") >> shift))
                args += [tid, t.fp[2:], t.priority, h, self._entry(tid, t)]
        keys.append(pk.rv_hist)
        return self.scripts.enqueue, keys, args

    @staticmethod
    def _entry(tid: str, t: NewTask) -> str:
        return encode_entry(tid, t.url, max_attempts=t.max_attempts, priority=t.priority,
                            meta=t.meta, depth=t.depth, headers=t.headers, revisit=t.revisit)

    # -- lease ------------------------------------------------------------------------

    async def lease(self, worker: str, n: int, lease_ms: int) -> list[Lease]:
        """Lease up to n tasks from hosts whose turn has come (see `lease_turns`)."""
        return (await self.lease_turns(worker, n, lease_ms)).leases

    async def lease_turns(self, worker: str, n: int, lease_ms: int,
                          fetched: list[Lease] | None = None,
                          held: Callable[[str], int] | None = None) -> LeaseBatch:
        """Lease up to n tasks from hosts whose turn has come, taking partitions in turn
        so none starves; with none, say how long until a host's turn comes.

        `fetched`: leases of `worker` whose response is in; their hosts get their slots
        back in the same calls, before the leasing (n may be 0 to only do that). The
        list is emptied. `held(host)`: how many of a host's slots `worker`'s leases take
        now; with it, a host's slots are shared with the consumers whose lease calls came
        back empty (lease.lua's fair share), else this worker may take them all.

        A partition with nothing ready is skipped until its next turn (at most
        MAX_IDLE_WAIT_S; UNKNOWN_WAIT_S when no host is due), so an idle partition costs
        almost no round trips. A retry that
        is due is put back in its host's queue on the way. A body that can't be decoded
        is dead-lettered as ``malformed`` (raw bytes kept) and not returned.
        """
        batch = LeaseBatch([])
        malformed: list[Failure] = []
        count = len(self.partitions)
        now = time.monotonic()
        waits: list[float] = []
        responses_in: dict[int, list[Lease]] = defaultdict(list)
        for lease in fetched or ():
            responses_in[lease.partition].append(lease)
        if fetched:
            fetched.clear()
        for step in range(count):
            p = (self._next_partition + step) % count
            mine = responses_in.pop(p, [])
            if len(batch.leases) >= n and not mine:
                continue
            if now < self._idle_until[p] and not mine:
                waits.append(self._idle_until[p] - now)
                continue
            got = False
            while True:  # again while a full page of candidate hosts gave tasks
                reply, full = await self._lease_partition(
                    p, worker, max(0, n - len(batch.leases)), lease_ms, fetched=mine,
                    held=held)
                mine = []
                wait_ms, retry_ms, paused = int(reply[2]), int(reply[3]), int(reply[4]) == 1
                batch.paused = batch.paused or paused
                batch.policy_version = max(batch.policy_version, int(reply[_POLICY_VERSION]))
                if retry_ms == 0:
                    await self._promote_partition(self.partitions[p], 1000)
                    wait_ms = 0
                before = len(batch.leases) + len(malformed)
                self._parse_lease(reply, p, batch.leases, malformed)
                got_now = len(batch.leases) + len(malformed) > before
                got = got or got_now
                if not (got_now and full and len(batch.leases) < n):
                    break
            for_ms = [w for w in (wait_ms, retry_ms) if w >= 0]
            if paused or for_ms:
                wait = MAX_IDLE_WAIT_S if paused else min(min(for_ms) / 1000,
                                                          MAX_IDLE_WAIT_S)
                if not got:
                    waits.append(wait)
            else:
                # No host with a free slot holds work here: a slot may free at any time
                # (another consumer's ack), so look again soon, and let the caller back off.
                wait = UNKNOWN_WAIT_S
            if count > 1:
                self._idle_until[p] = 0.0 if got else now + wait
        self._next_partition = (self._next_partition + 1) % count
        if malformed:
            await self.fail(worker, malformed)
        if not batch.leases and waits:
            batch.wait_s = min(waits)
        return batch

    async def _lease_partition(self, p: int, worker: str, n: int, lease_ms: int, *,
                               fetched: Sequence[Lease] = (),
                               held: Callable[[str], int] | None = None
                               ) -> tuple[Any, bool]:
        """One lease call; and whether more ready hosts may wait.

        The script is given candidate hosts and checks them again: a call costs what is
        ready, not what is queued. The candidates are the ones the partition's previous
        reply named (or the hosts of `fetched`), so a steady crawl leases in one round
        trip; with none, a call on no hosts names them (and how long until a host's turn
        or a retry: with none ready, that call is all), and a second call leases.
        """
        pk = self.partitions[p]
        k = _candidates_for(n)
        # A call's work grows with the hosts it reads: no more than its n may use (a call
        # that only gives slots back reads none).
        hosts, self._candidates[p] = (self._candidates[p][:k] if n else []), []
        if not hosts and fetched and n:  # their hosts are the likely ones to have work
            hosts = list(dict.fromkeys(lease.host for lease in fetched))
        reply = await self._lease_script(pk, worker, n, lease_ms, hosts=hosts,
                                         fetched=fetched, held=held)
        if len(reply) == _LEASE_HEAD and self._candidates[p] and n > 0:
            hosts = self._candidates[p]  # none given, others may
            reply = await self._lease_script(pk, worker, n, lease_ms, hosts=hosts,
                                             held=held)
        return reply, len(hosts) >= k

    async def _lease_script(self, pk: PartitionKeys, worker: str, n: int, lease_ms: int, *,
                            hosts: list[str], fetched: Sequence[Lease] = (),
                            held: Callable[[str], int] | None = None) -> Any:
        """lease.lua on these candidate hosts (and the leases whose response is in);
        keeps the hosts it names for the next call."""
        host_keys, host_head = self._host_args(pk, hosts)
        args: list[Any] = [worker, n, lease_ms, _candidates_for(n), self.crawl_keys.wake,
                           *host_head, ",".join(str(held(h)) for h in hosts) if held else ""]
        for lease in fetched:
            args += [lease.id, lease.token]
        reply = await self.scripts.lease(
            keys=[*pk.host_state, pk.tasks, pk.attempts, pk.leases, pk.owners, pk.seq,
                  pk.stats, pk.checkpoints, pk.errors, pk.pending, pk.prio_hosts, pk.delayed,
                  pk.dead, pk.dead_reasons, pk.hungry, *host_keys],
            args=args,
        )
        self._candidates[pk.partition] = list(dict.fromkeys(
            _text(h) for h in reply[_NEXT_HOSTS]))
        return reply

    @staticmethod
    def _parse_lease(
        reply: list[Any], partition: int, leases: list[Lease], malformed: list[Failure]
    ) -> None:
        granted, deadline = int(reply[0]), int(reply[1])
        for i in range(_LEASE_HEAD, len(reply), _LEASE_FIELDS):
            tid, token, attempt, entry, cp, err, host, delay, conc = reply[i:i + _LEASE_FIELDS]
            tid, token, host = _text(tid), _text(token), _text(host)
            try:
                checkpoint = codec.loads(cp) if cp else None
                task = decode_entry(entry, attempt=int(attempt),
                                    last_error=_text(err) if err else None,
                                    checkpoint=checkpoint)
            except (MalformedTaskError, ValueError) as exc:
                stub = Task(id=tid, url="", attempt=int(attempt))
                malformed.append(Failure(Lease(stub, partition, token, deadline, host),
                                         MALFORMED, str(exc), permanent=True))
                continue
            leases.append(Lease(task, partition, token, deadline, host, granted,
                                delay_ms=int(delay), concurrency=int(conc)))

    # -- transitions on held leases --------------------------------------------------

    def _by_partition(self, items: Iterable[T], lease_of: Callable[[T], Lease]
                      ) -> dict[int, list[T]]:
        groups: dict[int, list[T]] = defaultdict(list)
        for item in items:
            groups[lease_of(item).partition].append(item)
        return groups

    def woken(self) -> None:
        """Another process says work may be ready: ask every partition on the next call."""
        self._slots_freed(range(len(self.partitions)))

    def _slots_freed(self, partitions: Iterable[int]) -> None:
        """A lease ended here: its partition may have a host ready again at once."""
        for p in partitions:
            self._idle_until[p] = 0.0

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
        self._slots_freed(groups)
        calls = []
        marks = self.settings.dedup is DedupMode.EXACT
        for p, group in groups.items():
            pk = self.partitions[p]
            keys = [*pk.host_state, pk.leases, pk.owners, pk.tasks, pk.attempts,
                    pk.checkpoints, pk.errors, pk.stalls, pk.stats, pk.done]
            mode = (MARKS_OBSERVED if self.revisits else 1) if marks else 0
            args: list[Any] = [worker, mode]
            for lease, outcome in group:
                responded = (outcome != ROBOTS_DISALLOWED if lease.responded is None
                             else lease.responded)
                args.extend((lease.id, lease.token, outcome, lease.sent_ms, int(responded),
                             lease.elapsed_ms))
                if marks:
                    bucket, seen_field = self._seen_mark(pk, lease.id)
                    keys.append(bucket)
                    args.append(seen_field)
                if mode == MARKS_OBSERVED:
                    args.append(observed_arg(lease.observed))
            if mode == MARKS_OBSERVED:
                keys += [pk.rv_hist, pk.rv_due]
            calls.append((self.scripts.ack, keys, args))
        return self._in_order(items, groups, await self._run(calls) if calls else [],
                              lambda reply, i: _CODES[int(reply[i])])

    async def fail(self, worker: str, failures: Sequence[Failure]) -> list[tuple[Code, int]]:
        """Record failed attempts; returns (RETRY with delay ms | DEAD | refusal, -1)."""
        pol = self.policy
        groups = self._by_partition(failures, lambda f: f.lease)
        self._slots_freed(groups)
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            args: list[Any] = [worker, pol.base_ms, pol.cap_ms, pol.max_retry_after_ms,
                               pol.backoff_base_ms, pol.backoff_cap_ms,
                               pol.backoff_forgive_ms]
            for f in group:
                reason = "".join(f.reason.split()) or "error"
                retry_after = -1 if f.retry_after is None else max(0, int(f.retry_after * 1000))
                responded = (f.reason in RESPONSE_REASONS if f.lease.responded is None
                             else f.lease.responded)
                args += [f.lease.id, f.lease.token, f.lease.task.max_attempts, reason,
                         f.message[:1000], retry_after, int(f.permanent),
                         repr(self._jitter()), int(f.pushback),
                         f.lease.sent_ms, int(responded)]
            calls.append((self.scripts.fail, [*pk.host_state, pk.leases, pk.owners,
                                              pk.attempts, pk.delayed, pk.dead, pk.errors,
                                              pk.dead_reasons, pk.stats, pk.tasks,
                                              pk.errors_by_host, pk.blocked, pk.done],
                          args))
        return self._in_order(failures, groups, await self._run(calls) if calls else [],
                              lambda reply, i: (Code(int(reply[2 * i])),
                                                int(reply[2 * i + 1])))

    async def release(self, worker: str, leases: Sequence[Lease], *,
                      restart_turn: bool = False) -> list[Code]:
        """Hand leases back to the head of their hosts' queues without counting an attempt;
        `restart_turn`: their hosts were just asked (robots.txt), so their next turn is a
        full delay from now."""
        groups = self._by_partition(leases, lambda x: x)
        self._slots_freed(groups)
        calls = []
        for p, group in groups.items():
            pk = self.partitions[p]
            host_keys, host_head = self._host_args(
                pk, list(dict.fromkeys(lease.host for lease in group)))
            args: list[Any] = [worker, *host_head, int(restart_turn)]
            for lease in group:
                args += [lease.id, lease.token]
            calls.append((self.scripts.release, [*pk.host_state, pk.leases, pk.owners,
                                                 pk.attempts, pk.tasks, pk.stats, pk.pending,
                                                 pk.prio_hosts, *host_keys], args))
        return self._in_order(leases, groups, await self._run(calls) if calls else [],
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

    async def _due_ids(self, pk: PartitionKeys, zset: str, limit: int
                       ) -> tuple[list[str], list[str]]:
        """Ids in `zset` (leases or delayed) whose score has passed on Redis TIME, and
        their hosts (from their task values): the candidates a script then re-checks."""
        seconds, micros = await self.client.time()
        now_ms = seconds * 1000 + micros // 1000
        raw = cast(list[bytes], await self.client.zrangebyscore(zset, "-inf", now_ms, start=0,
                                                                  num=limit))
        ids = [_text(m) for m in raw]
        if not ids:
            return [], []
        values = cast(list[bytes | None], await self.client.hmget(pk.tasks, ids))
        hosts = [v.split(b" ", 1)[0].decode() if v else "" for v in values]
        return ids, hosts

    async def reclaim(self, limit: int = 1000) -> tuple[int, int]:
        """Take back expired leases in every partition; returns (reclaimed, dead)."""
        reclaimed = died = 0
        for pk in self.partitions:
            while True:
                ids, hosts = await self._due_ids(pk, pk.leases, limit)
                if not ids:
                    break
                host_keys, host_head = self._host_args(pk, list(dict.fromkeys(
                    h for h in hosts if h)))
                r = await self.scripts.reclaim(
                    keys=[*pk.host_state, pk.leases, pk.owners, pk.stalls, pk.tasks, pk.dead,
                          pk.errors, pk.dead_reasons, pk.stats, pk.pending, pk.prio_hosts,
                          pk.errors_by_host, *host_keys],
                    args=[self.policy.max_stalls, *host_head, *ids],
                )
                reclaimed += int(r[0])
                died += int(r[1])
                if len(ids) < limit or int(r[0]) + int(r[1]) == 0:
                    break
        return reclaimed, died

    async def _promote_partition(self, pk: PartitionKeys, limit: int) -> tuple[int, int]:
        moved = 0
        while True:
            ids, hosts = await self._due_ids(pk, pk.delayed, limit)
            host_keys, host_head = self._host_args(pk, list(dict.fromkeys(
                h for h in hosts if h)))
            r = await self.scripts.promote(
                keys=[*pk.host_state, pk.delayed, pk.tasks, pk.stats, pk.pending,
                      pk.prio_hosts, *host_keys],
                args=[*host_head, *ids])
            moved += int(r[0])
            if len(ids) < limit or int(r[0]) == 0:
                return moved, int(r[1])

    async def promote(self, limit: int = 1000) -> tuple[int, int]:
        """Put due retries and due revisits (common/schedule.py) back in their hosts'
        queues; returns (moved, ms to the next due retry or -1)."""
        moved, next_due = 0, -1
        for pk in self.partitions:
            moved += (await promote_revisits(self.client, self.scripts.revisit, pk,
                                             self._host_args, limit))[0]
            n, wait = await self._promote_partition(pk, limit)
            moved += n
            if wait >= 0 and (next_due < 0 or wait < next_due):
                next_due = wait
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
                    errs, values, attempts = await pipe.execute()
                for (member, score), err, value, att in zip(ids, errs, values, attempts,
                                                            strict=True):
                    why, _, message = (err or b"unknown ").decode().partition(" ")
                    if reason is not None and why != reason:
                        continue
                    raw = stored_entry(value) if value else None
                    found.append(DeadTask(_text(member), p, why, message, int(score),
                                          int(att or 0), entry_url(raw), raw))
                    if len(found) >= limit:
                        break
        return found

    async def _dead_op(self, requeue: bool, ids: Sequence[str]) -> int:
        """Requeue or purge dead ids, in whichever partition holds each."""
        done = 0
        wanted = list(dict.fromkeys(ids))
        for pk in self.partitions:
            for chunk in _chunks(wanted, 500):
                values = cast(list[bytes | None], await self.client.hmget(pk.tasks, list(chunk)))
                here = [(tid, v.split(b" ", 1)[0].decode()) for tid, v in zip(chunk, values,
                                                                            strict=True) if v]
                if not here:
                    continue
                if requeue:
                    host_keys, host_head = self._host_args(pk, list(dict.fromkeys(
                        h for _, h in here)))
                    codes = await self.scripts.requeue(
                        keys=[*pk.host_state, pk.dead, pk.errors, pk.attempts, pk.stalls,
                              pk.dead_reasons, pk.tasks, pk.stats, pk.pending,
                              pk.prio_hosts, *host_keys],
                        args=[*host_head, *(tid for tid, _ in here)])
                else:
                    marks = self.settings.dedup is DedupMode.EXACT
                    keys = [pk.dead, pk.errors, pk.dead_reasons, pk.tasks, pk.attempts,
                            pk.stalls, pk.checkpoints, pk.stats]
                    args: list[Any] = [int(marks)]
                    for tid, _ in here:
                        args.append(tid)
                        if marks:
                            bucket, seen_field = self._seen_mark(pk, tid)
                            keys.append(bucket)
                            args.append(seen_field)
                    codes = await self.scripts.purge(keys=keys, args=args)
                done += sum(1 for c in codes if int(c) == Code.OK)
        return done

    async def dead_requeue(self, ids: Sequence[str]) -> int:
        """Put dead tasks back in their hosts' queues with fresh attempts; returns how
        many moved."""
        return await self._dead_op(True, ids)

    async def dead_purge(self, ids: Sequence[str]) -> int:
        """Delete dead tasks for good; returns how many were deleted."""
        return await self._dead_op(False, ids)

    async def dead_ids(self, reason: str | None = None) -> list[str]:
        """Every dead id (optionally of one reason), paged through each partition."""
        return [d.id for d in await self.dead_list(reason=reason, limit=10**12)]

    # -- observation ------------------------------------------------------------------

    async def stats(self) -> Stats:
        """Every state's count and every counter, summed over the partitions."""
        async with self.client.pipeline(transaction=False) as pipe:
            for pk in self.partitions:
                pipe.get(pk.pending)
                pipe.zcard(pk.leases)
                pipe.zcard(pk.delayed)
                pipe.zcard(pk.dead)
                pipe.zcard(pk.due)
                pipe.hgetall(pk.stats)
                pipe.hgetall(pk.dead_reasons)
                pipe.zrange(pk.budget, 0, -1)
            replies = await pipe.execute()
        s = Stats()
        budgeted: list[tuple[PartitionKeys, list[str]]] = []
        for i in range(0, len(replies), 8):
            pending, leased, waiting, dead, due, counters, reasons, hosts = replies[i:i + 8]
            if hosts:
                budgeted.append((self.partitions[i // 8], [_text(h) for h in hosts]))
            s.pending += int(pending or 0)
            s.leased += leased
            s.waiting += waiting
            s.dead += dead
            s.hosts_due += due
            for k, v in counters.items():
                s.counters[_text(k)] = s.counters.get(_text(k), 0) + int(v)
            for k, v in reasons.items():
                s.dead_reasons[_text(k)] = s.dead_reasons.get(_text(k), 0) + int(v)
        if budgeted:
            s.parked = await self._parked(budgeted)
        return s

    async def _parked(self, budgeted: list[tuple[PartitionKeys, list[str]]]) -> int:
        """The pending tasks of the hosts (those with a budget, per partition) whose
        budget is spent by pages used and held (lib/hosts.lua's budget_left)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for pk, hosts in budgeted:
                pipe.hmget(pk.hostconf, hosts)
                pipe.zmscore(pk.queued, hosts)
            replies = await pipe.execute()
        parked = 0
        for confs, queued in zip(replies[::2], replies[1::2], strict=True):
            for conf, n in zip(confs, queued, strict=True):
                if HostConf.decode(conf).budget_spent:
                    parked += int(n or 0)
        return parked

    async def is_empty(self) -> bool:
        """Whether nothing is pending (but tasks parked by a spent budget), leased or
        waiting in the whole crawl, read atomically
        (one script over every partition on one Redis; per partition on a cluster, where a
        task never moves between partitions and children are enqueued before their
        parent's ack, so a crawl read empty partition by partition twice in a row is
        empty)."""
        def keys(pk: PartitionKeys) -> list[str]:
            return [pk.pending, pk.leases, pk.delayed, pk.due]

        if not isinstance(self.client, aioredis.RedisCluster):
            every = [k for pk in self.partitions for k in keys(pk)]
            return int(await self.scripts.is_empty(keys=every, args=[])) == 1
        for _ in range(2):
            for pk in self.partitions:
                if int(await self.scripts.is_empty(keys=keys(pk), args=[])) == 0:
                    return False
        return True

    async def state_of(self, tid: str, url: str | None = None) -> str:
        """The state of one task: pending, leased, waiting, dead, done or unknown.

        Looks for a pending entry in its host's queue (every host's without `url`):
        O(pending), for tests and tools, never on a hot path.
        """
        hosts: list[tuple[PartitionKeys, str]] = []
        parts = self.partitions
        if url is not None:
            parts = [parts[self.partition_of(host_key(url))]]
            hosts = [(parts[0], host_key(url))]
        for pk in parts:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zscore(pk.leases, tid)
                pipe.zscore(pk.delayed, tid)
                pipe.zscore(pk.dead, tid)
                pipe.zrangebyscore(pk.queued, 1, "+inf")
                leased, waiting, dead, queued = await pipe.execute()
            for name, value in (("leased", leased), ("waiting", waiting), ("dead", dead)):
                if value is not None:
                    return name
            if url is None:
                hosts += [(pk, _text(h)) for h in queued]
        prefix = tid.encode()
        for pk, host in hosts:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.lrange(pk.host_queue(host), 0, -1)
                pipe.zrange(pk.host_prio(host), 0, -1)
                entries, prio = await pipe.execute()
            if any(e.startswith(prefix) for e in (*entries, *prio)):
                return "pending"
        fp = bytes.fromhex(tid)
        for pk in parts:
            if await self._seen(pk, fp):
                return "done"
        return "unknown"

    def _seen_mark(self, pk: PartitionKeys, tid: str) -> tuple[str, bytes]:
        """The exact-dedup bucket key and field of a task id (its fingerprint in hex)."""
        fp = bytes.fromhex(tid)
        bucket = pk.seen(int.from_bytes(fp[:4], "big") >> (32 - self.settings.seen_bits))
        return bucket, fp[2:]

    async def _seen(self, pk: PartitionKeys, fp: bytes) -> bool:
        if self.settings.dedup is DedupMode.BLOOM:
            return True  # a bloom crawl can't tell a done URL from one never enqueued
        return bool(await self.client.hexists(*self._seen_mark(pk, fp.hex())))
