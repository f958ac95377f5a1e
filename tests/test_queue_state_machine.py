"""A stateful property test of the host-fair frontier: random interleavings against a
Python model.

Hypothesis drives enqueue (several hosts, priorities), lease (per-host concurrency,
changed by ``Frontier.set_host`` while the crawl runs; delay 0), responses in (a lease
call naming leases whose response is in: their hosts' slots come back before the ack),
renew, ack, fail (retry, dead, a host pushing back), release, checkpoint, expiry, reclaim,
promote, dead-letter requeue and purge, stale calls (a worker acting with a lease it
lost), by several workers, and a host's queue key lost behind the crawl's back (its
counts then hold entries no queue does, until a lease finds the queue short and sets
them right). The model predicts every result code and which ids each lease returns, in
order; after every step the invariant reads the raw partition keys and checks that each
id is in exactly the place the model says (one host queue, at its position, or leased,
waiting, dead, done), that ``pending`` == the entries in the host queues == the sum of
the host records' queued counts (and of their copy, ``h:queued``), that each record's
inflight counts its host's leases whose response is not in, that each lease record names
its holder, attempt, host and priority, that ``due`` holds exactly the hosts with pending
work and a free slot (at their next turn), and that the counters add up; at the end of a
run, that fsck finds nothing wrong. `WithRevisits` runs the same with the crawl's
revisits on (see its docstring).

Time is the Redis clock. Retries and cool-downs are either due at once or a minute
away, so a lease never depends on when it runs. A lease's validity is judged against
Redis TIME read just before and just after a step; a step whose outcome would hinge on
a deadline falling inside it first sleeps past that deadline, so expectations are exact
(only a step slowed past MARGIN_MS by a loaded machine leaves a deadline in doubt, and
then either outcome is accepted and followed). Every draw is made before the state is
looked at, so a failing run replays with the same data however the clock moved. For the
same reason no rule has a precondition: Hypothesis draws the rule of a step among those
whose preconditions hold, so a precondition on state the clock moves (a lease that
expired before its ack or not) changes the draws of one run from those of another with
the same choices, which Hypothesis reports as FlakyStrategyDefinition.

A failure is reported with its whole run of steps, unshrunk (see ``_run``).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter, deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    PRECONDITIONS_MARKER,
    RULE_MARKER,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from support.frontier import host_record
from support.history import histories

from common.frontier.hosts import Frontier
from common.hostmodel.hostrec import HostRecord
from common.keys import HASHTABLE_FIELD
from common.policy import set_policy
from common.queue import (
    Code,
    CrawlSettings,
    Failure,
    Lease,
    LeasingQueue,
    NewTask,
    RetryPolicy,
)
from common.revisits.previous import Observed
from common.tasks.task import decode_entry, expand_entry, queued_id, stored_entry
from common.urls.canonical import fingerprint, task_id
from console.fsck import check

T = TypeVar("T")

WORKERS = ("w0", "w1", "w2")
# Two hosts in each partition of a two-partition crawl.
HOSTS = ("a.sm.test", "b.sm.test", "c.sm.test", "e.sm.test")
URLS = [f"http://{HOSTS[i % len(HOSTS)]}/{i}" for i in range(32)]
SHORT_MS = 150
MARGIN_MS = 40  # steps are started this far from any deadline (see settle)
MAX_STALLS = 1
LONG_MS = 60_000  # a retry or cool-down this long never comes within a run
#: A host's first push-back blocks it for this long (backoff_base, 10% jitter off: the
#: machine's jitter is 0), or its Retry-After when longer. Its backoff is forgiven within
#: a second of quiet, so a host unblocked by an operator starts again at level 1, with no
#: pace left: a push-back's block is all a run sees of it.
PUSHBACK_MS = LONG_MS * 9 // 10
DEFAULT_CONCURRENCY = 3
UNLIMITED = 10**9
HUNGRY_MS = 2000  # lease.lua: how long an empty lease call keeps its worker hungry


# The draws of the lease and act rules (a subclass that extends them draws the same).
LEASE_DRAWS: dict[str, Any] = {
    "worker": st.sampled_from(WORKERS), "n": st.integers(1, 6),
    "lease_ms": st.sampled_from([SHORT_MS, SHORT_MS, 30_000])}
ACT_DRAWS: dict[str, Any] = {
    "op": st.sampled_from(["ack", "ack", "fail", "fail", "fail", "release", "checkpoint",
                           "renew"]),
    "picks": st.lists(st.integers(0, 63), min_size=1, max_size=4),
    "stale": st.sampled_from([False, False, True]), "worker": st.sampled_from(WORKERS),
    "outcome": st.sampled_from(["ok", "http_404"]),
    "permanent": st.sampled_from([False, False, True]),
    "retry_after": st.sampled_from([None, None, 0.0, 7_200.0]),
    "pushback": st.sampled_from([False, False, False, True]),
    "lease_ms": st.sampled_from([SHORT_MS, 30_000])}


def priority_of(i: int) -> int:
    return (i % 3) if i % 5 == 0 else 0


def attempts_of(i: int) -> int:
    return 1 + i % 4


@dataclass
class Model:
    """What the test expects of one task id."""

    id: str
    host: str
    partition: int
    priority: int
    max_attempts: int
    url: str
    state: str = "pending"  # pending, leased, waiting, dead, done, purged, lost
    attempts: int = 0
    stalls: int = 0
    token: str = ""
    worker: str = ""
    deadline: int = 0
    due: int = 0
    reason: str = ""
    fetched: bool = False  # leased, its response in: its host's slot given back


@dataclass
class HostModel:
    """What the test expects of one host: its queues, setting and turn."""

    name: str
    partition: int
    hq: deque[str] = field(default_factory=deque)
    hp: set[str] = field(default_factory=set)
    concurrency: int | None = None  # None: the crawl's default
    last: int = 0  # ms of its last lease
    blocked: int = 0  # ms it is blocked until (a push-back)
    pushbacks: int = 0  # its push-back incidents (its record's count)
    seen: bool = False  # ever queued (h:queued has it)
    lost: int = 0  # entries its counts hold that its queue key lost (lose_queue)


class QueueMachine(RuleBasedStateMachine):
    """One crawl, three workers and a model; ``url``/``crawl``/``partitions`` set by _run."""

    url: ClassVar[str] = ""
    crawl: ClassVar[str] = ""
    partitions: ClassVar[int] = 1
    _serial: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.client = aioredis.Redis.from_url(self.url)
        crawl = f"{self.crawl}-{next(self._serial)}"
        self.q: LeasingQueue = self.run(LeasingQueue.open(
            self.client, crawl, CrawlSettings(partitions=self.partitions),
            retry=RetryPolicy(base_ms=0, max_stalls=MAX_STALLS, max_retry_after_ms=LONG_MS,
                               backoff_base_ms=LONG_MS, backoff_cap_ms=LONG_MS,
                               backoff_forgive_ms=1_000),
            jitter=lambda: 0.0))
        self.frontier = Frontier(self.q)
        self.run(self.frontier.set_defaults(delay_s=0, concurrency=DEFAULT_CONCURRENCY))
        self.tasks: dict[str, Model] = {}
        self.hosts = {h: HostModel(h, self.q.partition_of(h)) for h in HOSTS}
        self.pool: list[tuple[str, Lease]] = []  # every lease a worker was given
        self.counters: Counter[str] = Counter()
        # (partition, worker) -> Redis ms of its last lease call there that got nothing
        self.hungry: dict[tuple[int, str], int] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            # At the end of a run that did not fail (an invariant's reads, of varying
            # length, between steps would move when leases expire, and so the draws).
            if sys.exc_info()[0] is None:
                self.fsck_finds_nothing()
        finally:
            self.run(self.client.aclose())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    # -- clock -------------------------------------------------------------------------

    async def _now(self) -> int:
        sec, usec = await self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def now(self) -> int:
        return self.run(self._now())

    def settle(self, instants: Iterable[int]) -> int:
        """Redis now, after sleeping past any instant less than MARGIN_MS ahead.

        A step that then finishes within MARGIN_MS of that now (almost all do) sees no
        deadline fall inside it, so its outcome is exact; an overrun (a loaded machine)
        makes the instants inside it ambiguous, and the step accepts either outcome.
        """
        marks = list(instants)
        while True:
            now = self.now()
            near = [t for t in marks if now < t <= now + MARGIN_MS]
            if not near:
                return now
            self.run(asyncio.sleep((max(near) - now + 2) / 1000))

    # -- model helpers -------------------------------------------------------------------

    def allowed(self, worker: str, lease: Lease, lo: int, hi: int) -> set[Code]:
        """The codes a holder-only call may return, run between Redis times lo and hi."""
        t = self.tasks[lease.id]
        if t.state != "leased":
            return {Code.UNKNOWN}
        if t.token != lease.token or t.worker != worker:
            return {Code.STALE}
        if t.deadline > hi:
            return {Code.OK}
        return {Code.EXPIRED} if t.deadline <= lo else {Code.OK, Code.EXPIRED}

    def holds(self, lease: Lease) -> bool:
        t = self.tasks[lease.id]
        return t.state == "leased" and t.token == lease.token

    def fsck_finds_nothing(self) -> None:
        """fsck reads a state the model says is right as clean: unless a queue key is
        lost (then its counts are wrong until a lease finds the queue short), and but for
        the histories of URLs lost with a queue (never revisited: fsck's repair schedules
        them)."""
        if any(h.lost for h in self.hosts.values()):
            return
        lost = {t.id for t in self.in_state("lost")}
        assert [p.message for p in self.run(check(self.q)).problems
                if not (p.kind == "history_unscheduled" and p.id in lost)] == []

    def in_state(self, state: str) -> list[Model]:
        return [t for t in self.tasks.values() if t.state == state]

    def concurrency(self, h: HostModel) -> int:
        c = DEFAULT_CONCURRENCY if h.concurrency is None else h.concurrency
        return c or UNLIMITED

    def inflight(self, h: HostModel) -> int:
        return sum(1 for t in self.tasks.values()
                   if t.state == "leased" and t.host == h.name and not t.fetched)

    def due(self, p: int) -> dict[str, int]:
        """The hosts of partition p that `due` must hold, with their next turn (delay 0)."""
        return {h.name: max(h.last, h.blocked) for h in self.hosts.values()
                if h.partition == p and (h.hq or h.hp or h.lost)
                and self.inflight(h) < self.concurrency(h)}

    def push_all(self, ts: list[Model], front: bool) -> None:
        """Put tasks back in their hosts' queues in this order: at the head (front, the
        first at the very head) or the tail; priority tasks into the host's ZSET."""
        for t in reversed(ts) if front else ts:
            t.state = "pending"
            h = self.hosts[t.host]
            h.seen = True
            if t.priority > 0:
                h.hp.add(t.id)
            elif front:
                h.hq.appendleft(t.id)
            else:
                h.hq.append(t.id)

    def to_dead(self, t: Model, reason: str) -> None:
        t.state, t.reason = "dead", reason
        self.counters["dead"] += 1

    def pop_host(self, h: HostModel, take: int) -> list[str]:
        """A host's next `take` ids: priority first (then by id, the ZSET's order), then
        its FIFO."""
        ids = sorted(h.hp, key=lambda i: (-self.tasks[i].priority, i))[:take]
        h.hp -= set(ids)
        while len(ids) < take and h.hq:
            ids.append(h.hq.popleft())
        return ids

    def lease_partition(self, p: int, n: int, now: int, worker: str) -> list[str]:
        """What lease.lua pops in partition p: hosts whose turn has come, priority work
        first, then the longest-waiting (then by name); each gives its free slots, or no
        more than its fair share while other workers are hungry. Only the candidates the
        partition's previous reply named, when it named any, unless they give nothing."""
        others = sum(1 for (q, w), at in self.hungry.items()
                     if q == p and w != worker and at >= now - HUNGRY_MS)
        due = self.due(p)
        ready = [self.hosts[name] for name, at in due.items() if at <= now]
        ready.sort(key=lambda h: (-max((self.tasks[i].priority for i in h.hp), default=0),
                                  due[h.name], h.name))
        named = set(self.q.leases._candidates[p])
        popped: list[str] = []
        for hosts in ([h for h in ready if h.name in named] if named else [], ready):
            for h in hosts:
                if len(popped) >= n:
                    break
                free = self.concurrency(h) - self.inflight(h)
                take = min(n - len(popped), free)
                if others and self.concurrency(h) < UNLIMITED:
                    take = min(take, -(-self.concurrency(h) // (others + 1)))
                ids = self.pop_host(h, take)
                if len(ids) < take and h.lost:  # lease.lua finds the queue short
                    self.counters["repaired_hosts"] += 1
                    self.counters["lost_pending"] += h.lost
                    h.lost = 0
                popped += ids
            if popped:
                break
        return popped

    def promote_partition(self, p: int, now: int) -> int:
        """Retries of partition p due by `now` join their hosts' tails, in due order."""
        due = sorted((t for t in self.in_state("waiting") if t.partition == p
                      and t.due <= now), key=lambda t: (t.due, t.id))
        self.push_all(due, front=False)
        self.counters["promoted"] += len(due)
        return len(due)

    def reaper_promotes(self, p: int, now: int) -> int:
        """What the reaper's promote moves in partition p by `now`: its due retries."""
        return self.promote_partition(p, now)

    def wait(self, t: Model, before: int, after: int, delay: int) -> None:
        """The task waits in `delayed`: check its due time and adopt the exact value."""
        pk = self.q.partitions[t.partition]
        due = self.run(self.client.zscore(pk.delayed, t.id))
        assert due is not None and before + delay <= due <= after + delay, (due, before, delay)
        t.state, t.due = "waiting", int(due)

    def gone_from(self, structure: str, t: Model) -> bool:
        """Whether the id has left a partition ZSET (``leases`` or ``delayed``)."""
        key = getattr(self.q.partitions[t.partition], structure)
        return self.run(self.client.zscore(key, t.id)) is None

    @staticmethod
    def pick(items: list[T], picks: list[int]) -> list[T]:
        """Items chosen by drawn indices (drawn before the state is known, so every run
        of an example draws the same data however the clock moved)."""
        return [items[i % len(items)] for i in picks] if items else []

    # -- rules -----------------------------------------------------------------------------

    @initialize(first=st.lists(st.integers(0, len(URLS) - 1), min_size=4, max_size=12),
                worker=st.sampled_from(WORKERS), n=st.integers(1, 5))
    def start(self, first: list[int], worker: str, n: int) -> None:
        """Every run starts with work in line and some of it leased, briefly."""
        self.enqueue(first)
        self.lease(worker, n, SHORT_MS)

    @rule(batch=st.lists(st.integers(0, len(URLS) - 1), min_size=1, max_size=8))
    def enqueue(self, batch: list[int]) -> None:
        new = [NewTask(URLS[i], fingerprint(URLS[i]), priority=priority_of(i),
                       max_attempts=attempts_of(i)) for i in batch]
        res = self.run(self.q.enqueue(new))
        fresh: list[Model] = []
        for nt in new:
            tid = task_id(nt.fp)
            if tid in self.tasks:
                continue
            host = nt.url.split("/")[2]
            t = Model(tid, host, self.hosts[host].partition, nt.priority, nt.max_attempts,
                      nt.url)
            self.tasks[tid] = t
            fresh.append(t)
        self.push_all(fresh, front=False)
        assert (res.enqueued, res.duplicates, res.recrawled) == (
            len(fresh), len(batch) - len(fresh), 0)
        self.counters["enqueued"] += len(fresh)
        self.counters["duplicates"] += len(batch) - len(fresh)

    @rule(host=st.sampled_from(HOSTS),
          change=st.sampled_from(["0", "1", "1", "2", "clear", "unblock", "unblock"]))
    def set_host(self, host: str, change: str) -> None:
        """An operator changes a host's concurrency (0: no limit), or unblocks it."""
        h = self.hosts[host]
        if change == "unblock":
            self.run(self.frontier.block_host(host, 0))
            h.blocked = 0
        elif change == "clear":
            self.run(self.frontier.set_host(host, clear=("concurrency",)))
            h.concurrency = None
        else:
            self.run(self.frontier.set_host(host, concurrency=int(change)))
            h.concurrency = int(change)

    @rule(**LEASE_DRAWS)
    def lease(self, worker: str, n: int, lease_ms: int) -> None:
        # lease() skips a partition it found empty for up to a second (a local-clock
        # optimisation tested in test_queue.py); the model looks at every partition.
        self.q.leases._idle_until = [0.0] * self.partitions
        start = self.q.leases._next_partition
        before = self.settle(at + HUNGRY_MS for at in self.hungry.values())
        expected: list[str] = []
        asked: dict[int, bool] = {}  # partition -> whether its call leased anything
        for step in range(self.partitions):
            if len(expected) >= n:
                break
            p = (start + step) % self.partitions
            got = self.lease_partition(p, n - len(expected), before, worker)
            asked[p] = bool(got)
            expected += got
            # A retry due now is put back in its host's queue on the way (after this
            # partition's lease: not leased by this call).
            self.promote_partition(p, before)
        leases = self.run(self.q.lease(worker, n, lease_ms))
        after = self.now()
        assert [x.id for x in leases] == expected
        for p, fed in asked.items():  # an empty call marks its worker hungry, a lease not
            at = self.run(self.client.zscore(self.q.partitions[p].hungry, worker))
            if fed and at is None:
                self.hungry.pop((p, worker), None)
            elif fed:  # lease.lua forgets a mark still counted (HUNGRY_MS); an older one
                # stays, counted by nobody, until a new worker's mark trims it
                prev = self.hungry.get((p, worker))
                assert prev == int(at) and prev < after - HUNGRY_MS, (prev, at, after)
            else:
                assert at is not None and before <= at <= after
                self.hungry[p, worker] = int(at)
        self.counters["leased"] += len(leases)
        for x in leases:
            t = self.tasks[x.id]
            t.attempts += 1
            assert before + lease_ms <= x.deadline_ms <= after + lease_ms
            assert (x.host, x.partition) == (t.host, t.partition)
            assert (x.task.url, x.task.priority, x.task.max_attempts, x.task.attempt) == (
                t.url, t.priority, t.max_attempts, t.attempts)
            t.state, t.token, t.worker, t.deadline = "leased", x.token, worker, x.deadline_ms
            t.fetched = False
            self.hosts[t.host].last = x.deadline_ms - lease_ms  # the script's Redis TIME
            self.pool.append((worker, x))
        del self.pool[:-40]

    @rule(picks=st.lists(st.integers(0, 39), min_size=1, max_size=4),
          worker=st.sampled_from(WORKERS))
    def responses_in(self, picks: list[int], worker: str) -> None:
        """A worker says responses are in (a lease call of 0 tasks): the hosts of the
        leases it still holds get their slots back, once; any other lease is left as is.
        Leases whose deadline is too close to call are not named."""
        before = self.now()
        named = [x for w, x in self.pick(self.pool, picks) if w == worker
                 and not (before <= self.tasks[x.id].deadline <= before + 1000)]
        if not named:
            return
        self.q.leases._idle_until = [0.0] * self.partitions
        for p in dict.fromkeys(x.partition for x in named):
            self.promote_partition(p, before)
        self.run(self.q.lease_turns(worker, 0, 30_000, responses_in=list(named)))
        for x in named:
            t = self.tasks[x.id]
            if self.holds(x) and t.worker == worker and t.deadline > before:
                t.fetched = True

    def renew(self, chosen: list[tuple[str, Lease]], worker: str, lease_ms: int) -> None:
        # One lease per task id: lost leases are reported by id, so two leases of one
        # task in one call (a lost one and its successor) can't be told apart.
        unique = list({x.id: x for _, x in chosen}.values())
        now = self.settle(self.tasks[x.id].deadline for x in unique)
        old = {x.id: x.deadline_ms for x in unique}
        lost = dict((x.id, c) for x, c in self.run(self.q.renew(worker, unique, lease_ms)))
        after = self.now()
        for x in unique:
            code = lost.get(x.id, Code.OK)
            assert code in self.allowed(worker, x, now, after), (code, x)
            if code == Code.OK:
                assert now + lease_ms <= x.deadline_ms <= after + lease_ms
                self.tasks[x.id].deadline = x.deadline_ms
            else:
                assert x.deadline_ms == old[x.id]
        self.counters["renewed"] += len(unique) - len(lost)
        self.counters["lost"] += len(lost)

    @rule(**ACT_DRAWS)
    def act(self, *, op: str, picks: list[int], stale: bool, worker: str, outcome: str,
            permanent: bool, retry_after: float | None, pushback: bool,
            lease_ms: int) -> None:
        """Workers act on leases: the holder on ones it holds (or held till they expired),
        or (stale) any worker with any lease ever given, mostly lost ones, all refused
        but the holder's own."""
        if stale:
            chosen = self.pick([x for x in self.pool if not self.holds(x[1])] or self.pool,
                               picks)
        else:
            chosen = self.pick([x for x in self.pool if self.holds(x[1])], picks)
            worker = chosen[0][0] if chosen else worker
        leases = [x for _, x in chosen]
        if not leases:
            return
        if op == "renew":
            self.renew(chosen, worker, lease_ms)
            return
        if op == "checkpoint":
            leases = leases[:1]
        now = self.settle(self.tasks[x.id].deadline for x in leases)
        q = self.q
        if op == "ack":
            codes = self.run(q.ack(worker, [(x, outcome) for x in leases]))
        elif op == "release":
            codes = self.run(q.release(worker, leases))
        elif op == "checkpoint":
            codes = [self.run(q.checkpoint(worker, leases[0], {"n": len(self.pool)}))]
        else:
            replies = self.run(q.fail(worker, [
                Failure(x, "e", "boom", retry_after=retry_after, permanent=permanent,
                        pushback=pushback) for x in leases]))
            codes = [Code.OK if c in (Code.RETRY, Code.DEAD) else c for c, _ in replies]
        after = self.now()
        released: list[Model] = []
        cooled: set[str] = set()
        for i, (x, code) in enumerate(zip(leases, codes, strict=True)):
            assert code in self.allowed(worker, x, now, after), (op, code, x)
            t = self.tasks[x.id]
            if code != Code.OK:
                self.counters["stale"] += 1
            elif op == "ack":
                t.state = "done"
                self.counters["done"] += 1
                self.counters[f"outcome:{outcome}"] += 1
            elif op == "release":
                t.attempts -= 1
                t.state = "released"  # back in its queue below, in call order
                released.append(t)
                self.counters["released"] += 1
            elif op == "checkpoint":
                self.counters["checkpoints"] += 1
            else:
                self.counters["failed"] += 1
                if pushback:
                    cooled.add(t.host)
                if permanent or t.attempts >= t.max_attempts:
                    assert replies[i] == (Code.DEAD, -1)
                    self.to_dead(t, "e")
                else:
                    delay_ms = 0 if retry_after in (None, 0.0) else LONG_MS
                    assert replies[i] == (Code.RETRY, delay_ms)
                    self.wait(t, now, after, delay_ms)
                    self.counters["retried"] += 1
        self.push_all(released, front=True)
        ra = -1 if retry_after is None else min(int(retry_after * 1000), LONG_MS)
        for host in cooled:  # blocked for the whole fleet: adopt the exact time
            h = self.hosts[host]
            pk = self.q.partitions[h.partition]
            until = int(self.run(self.client.zscore(pk.blocked, host)) or 0)
            record = self.run(host_record(self.client, pk, host))
            assert record.blocked == until
            if h.blocked <= now:  # an incident: level 1 (forgiven), its block from now
                block = max(ra, PUSHBACK_MS)
                assert now + block <= until <= after + block
                assert record.level == 1
                h.pushbacks += 1
                self.counters["backoffs"] += 1
            else:  # sent before the block: only a longer Retry-After stretches it
                assert until == h.blocked or now + ra <= until <= after + ra
            assert record.pushbacks == h.pushbacks
            h.blocked = until

    @rule(host=st.sampled_from(HOSTS), go=st.integers(0, 3))
    def lose_queue(self, host: str, go: int) -> None:
        """A host's FIFO key is lost behind the crawl's back (deleted, evicted, an older
        snapshot restored; kept rare): its tasks are gone, its counts still hold them."""
        h = self.hosts[host]
        if go or not h.hq:
            return
        pk = self.q.partitions[h.partition]
        self.run(self.client.delete(pk.host_queue(host)))
        for tid in h.hq:
            self.tasks[tid].state = "lost"
        h.lost += len(h.hq)
        h.hq.clear()

    @rule(go=st.integers(0, 1))
    def expire(self, go: int) -> None:
        """Let the earliest live lease run out (kept rare: it sleeps)."""
        if go:
            return
        now = self.now()
        live = [t.deadline for t in self.in_state("leased") if t.deadline > now]
        if live and min(live) - now <= SHORT_MS:
            self.run(asyncio.sleep((min(live) - now + 5) / 1000))

    @rule(op=st.sampled_from(["reclaim", "reclaim", "promote", "requeue", "requeue",
                              "purge"]),
          picks=st.lists(st.integers(0, 63), min_size=1, max_size=3), one_dead=st.booleans())
    def housekeeping(self, op: str, picks: list[int], one_dead: bool) -> None:
        """The reaper's reclaim and promote, and an operator's dead-letter requeue/purge."""
        if op == "reclaim":
            self.reclaim()
        elif op == "promote":
            self.promote()
        else:
            self.dead_letters(op, picks, one_dead)

    def reclaim(self) -> None:
        leased = self.in_state("leased")
        now = self.settle(t.deadline for t in leased)
        result = self.run(self.q.reclaim(limit=2))
        after = self.now()
        reclaimed = died = 0
        for p in range(self.partitions):
            due = sorted((t for t in leased if t.partition == p and (
                t.deadline <= now or (t.deadline <= after and self.gone_from("leases", t)))),
                key=lambda t: (t.deadline, t.id))
            for page in range(0, len(due), 2):  # each page goes to the head, in order
                back: list[Model] = []
                for t in due[page:page + 2]:
                    t.stalls += 1
                    if t.stalls > MAX_STALLS:
                        self.to_dead(t, "stalled")
                        self.counters["stalled"] += 1
                        died += 1
                    else:
                        back.append(t)
                self.push_all(back, front=True)
                reclaimed += len(back)
        assert result == (reclaimed, died)
        self.counters["reclaimed"] += reclaimed

    def promote(self) -> None:
        waiting = self.in_state("waiting")
        now = self.now()
        moved, next_due = self.run(self.q.promote(limit=2))
        after = self.now()
        assert moved == sum(self.reaper_promotes(p, now) for p in range(self.partitions))
        later = [t.due for t in waiting if t.state == "waiting"]
        if later:
            assert min(later) - after <= next_due <= min(later) - now
        else:
            assert next_due == -1

    def dead_letters(self, op: str, picks: list[int], one_dead: bool) -> None:
        ids = self.pick(sorted(self.tasks), picks)
        if one_dead:
            ids += [t.id for t in self.in_state("dead")][:3]
        wanted = list(dict.fromkeys(ids))
        chosen = [self.tasks[i] for i in wanted if self.tasks[i].state == "dead"]
        if op == "requeue":
            for t in chosen:
                t.attempts = t.stalls = 0
            self.push_all(chosen, front=False)
            assert self.run(self.q.dead_requeue(ids)) == len(chosen)
            self.counters["requeued"] += len(chosen)
        else:
            for t in chosen:
                t.state = "purged"
            assert self.run(self.q.dead_purge(ids)) == len(chosen)
            self.counters["purged"] += len(chosen)

    # -- the invariant -------------------------------------------------------------------

    async def _snapshot(self) -> list[list[Any]]:
        async with self.client.pipeline(transaction=False) as pipe:
            for p, pk in enumerate(self.q.partitions):
                pipe.get(pk.pending)
                pipe.zrange(pk.queued, 0, -1, withscores=True)
                pipe.hgetall(pk.hosts)
                pipe.zrange(pk.due, 0, -1, withscores=True)
                pipe.zrange(pk.prio_hosts, 0, -1, withscores=True)
                pipe.zrange(pk.leases, 0, -1, withscores=True)
                pipe.zrange(pk.delayed, 0, -1, withscores=True)
                pipe.zrange(pk.dead, 0, -1)
                pipe.hgetall(pk.tasks)
                pipe.hgetall(pk.leased)
                pipe.hgetall(pk.attempts)
                pipe.hgetall(pk.stalls)
                pipe.hgetall(pk.dead_reasons)
                for h in self.hosts.values():
                    if h.partition == p:
                        pipe.lrange(pk.host_queue(h.name), 0, -1)
                        pipe.zrange(pk.host_prio(h.name), 0, -1, withscores=True)
            replies = await pipe.execute()
        out, i = [], 0
        for p in range(self.partitions):
            width = 13 + 2 * sum(1 for h in self.hosts.values() if h.partition == p)
            out.append(replies[i:i + width])
            i += width
        return out

    @invariant()
    def redis_matches_the_model(self) -> None:
        snapshot = self.run(self._snapshot())
        seen: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for p, parts in enumerate(snapshot):
            (pending, queued, raw_records, due, prio_hosts, leases, delayed, dead, bodies,
             leased, attempts, stalls, why, *queues) = parts
            records = {k.decode(): HostRecord.decode(v) for k, v in raw_records.items()}
            hosts = [h for h in self.hosts.values() if h.partition == p]
            entries = 0
            for h, hq, hp in zip(hosts, queues[::2], queues[1::2], strict=True):
                assert [queued_id(e) for e in hq] == list(h.hq), h.name
                assert {queued_id(e): -s for e, s in hp} == {
                    i: self.tasks[i].priority for i in h.hp}, h.name
                entries += len(hq) + len(hp)
                seen.update(queued_id(e) for e in hq)
                seen.update(queued_id(e) for e, _ in hp)
            # pending == entries in the host queues == sum of the records' queued, per host
            # exact, and h:queued their copy. (Entries of a lost queue stay counted until a
            # lease finds it short.)
            lost = sum(h.lost for h in hosts)
            counted = {h.name: len(h.hq) + len(h.hp) + h.lost for h in hosts if h.seen}
            assert set(records) <= {h.name for h in hosts}
            assert {h: r.queued for h, r in records.items() if h in counted} == counted
            assert all(r.queued == 0 for h, r in records.items() if h not in counted)
            assert int(pending or 0) == entries + lost == sum(counted.values())
            assert {k.decode(): int(s) for k, s in queued} == counted
            # Each record's inflight == its host's leases whose response is not in; no
            # budget, so no page reserved.
            assert {h: r.inflight for h, r in records.items() if r.inflight} == {
                h.name: n for h in hosts if (n := self.inflight(h))}
            assert all(r.reserved == 0 for r in records.values())
            # `due` == the hosts with pending work and a free slot, at their next turn.
            assert {k.decode(): int(s) for k, s in due} == self.due(p)
            assert {k.decode(): int(s) for k, s in prio_hosts} == {
                h.name: -max(self.tasks[i].priority for i in h.hp) for h in hosts if h.hp}
            mine = {i: t for i, t in self.tasks.items() if t.partition == p}
            assert {i.decode(): int(s) for i, s in leases} == {
                t.id: t.deadline for t in mine.values() if t.state == "leased"}
            assert {i.decode(): int(s) for i, s in delayed} == {
                t.id: t.due for t in mine.values() if t.state == "waiting"}
            assert {i.decode() for i in dead} == {
                t.id for t in mine.values() if t.state == "dead"}
            live = {i for i, t in mine.items() if t.state not in ("done", "purged")}
            # `tasks` holds the waiting and dead ones only, with host and priority.
            assert {k.decode(): v.decode().split(" ", 2)[:2] for k, v in bodies.items()} == {
                t.id: [t.host, str(t.priority)] for t in mine.values()
                if t.state in ("waiting", "dead")}
            marker = HASHTABLE_FIELD.encode()
            leased.pop(marker, None)
            attempts.pop(marker, None)
            # A leased task's one record: its holder (marked f once its response is in),
            # its attempt, host, priority and entry.
            assert {k.decode(): v.decode().split(" ", 4)[:4] for k, v in leased.items()} == {
                t.id: [f"{'f' if t.fetched else ''}{t.token}:{t.worker}", str(t.attempts),
                       t.host, str(t.priority)]
                for t in mine.values() if t.state == "leased"}
            assert all(v.split(b" ", 4)[4][:32].decode() == k.decode()
                       for k, v in leased.items())
            # `attempts` holds the attempts of the tasks that are not leased.
            got_attempts = {k.decode(): int(v) for k, v in attempts.items()}
            got_stalls = {k.decode(): int(v) for k, v in stalls.items()}
            assert set(got_attempts) <= live and set(got_stalls) <= live
            for i in live:
                leased_now = mine[i].state == "leased"
                assert got_attempts.get(i, 0) == (0 if leased_now else mine[i].attempts), i
                assert i not in got_attempts or not leased_now, i
                assert got_stalls.get(i, 0) == mine[i].stalls, i
            for structure in (leases, delayed):
                seen.update(i.decode() for i, _ in structure)
            seen.update(i.decode() for i in dead)
            reasons.update({k.decode(): int(v) for k, v in why.items()})
        # Every live id is in exactly one place; done and purged ids in none.
        assert seen == Counter(i for i, t in self.tasks.items()
                               if t.state not in ("done", "purged", "lost"))
        assert reasons == Counter(t.reason for t in self.in_state("dead"))

        stats = self.run(self.q.stats())
        c = stats.counters
        states = Counter(t.state for t in self.tasks.values())
        lost = sum(h.lost for h in self.hosts.values())
        assert (stats.pending, stats.leased, stats.waiting, stats.dead) == (
            states["pending"] + lost, states["leased"], states["waiting"], states["dead"])
        assert stats.hosts_due == sum(len(self.due(p)) for p in range(self.partitions))
        # A revisit is done once more without an enqueue.
        assert c.get("enqueued", 0) + c.get("revisits", 0) == (
            stats.pending + stats.leased + stats.waiting + stats.dead + c.get("done", 0)
            + c.get("purged", 0) + c.get("lost_pending", 0))
        assert c == {k: v for k, v in self.counters.items() if v}


#: A machine's runs sleep on the real clock: ~1 minute alone, more than pytest's 120 s
#: with two busy cores beside the suite (a timeout inside a run's teardown then reads as
#: a flaky failure, and the connections it left warn in the next test).
SLOW = pytest.mark.timeout(360)


def _run(machine: type[QueueMachine], url: str, crawl: str, partitions: int,
         examples: int = 25) -> None:
    machine.url, machine.crawl, machine.partitions = url, crawl, partitions
    # No shrink phase: steps sleep on the real clock, so shrinking a failure takes
    # minutes (past pytest's timeout, which Hypothesis would count as one more failure).
    # A failure is reported at once with its whole run of at most 40 steps, and replayed
    # first on the next run from the example database.
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=40, deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))


class OnePartition(QueueMachine):
    pass


class WithRevisits(QueueMachine):
    """The same crawl with revisits on (fixed, an hour): every ack writes its URL's
    history (with the validators its lease observed: unique per lease) and next visit; a
    rule passes the time of some done URLs' next visits and runs the reaper's promote,
    which brings them back to their hosts' tails before the due retries. Checked: every
    done URL is scheduled exactly once and nothing else is; each history is its URL's
    last ack's; a revisit leased carries its own URL's validators; a purge forgets its
    history; and nothing is lost (the base invariant: each live id in one place)."""

    def __init__(self) -> None:
        super().__init__()
        self.run(set_policy(self.client, self.q.crawl, {"revisit": "fixed",
                                                        "recrawl_after": 3600}, by="sm"))
        self.q.configure(revisits=True)
        self.etag: dict[str, str] = {}  # id -> the validator its history holds
        self.carries: dict[str, str] = {}  # id -> the validator its queued revisit carries
        self.next_at: dict[str, int] = {}  # id -> its next visit (a done URL's)

    @rule(**LEASE_DRAWS)
    def lease(self, worker: str, n: int, lease_ms: int) -> None:
        given = {id(x) for _, x in self.pool}
        super().lease(worker, n, lease_ms)
        for _, x in self.pool:
            if id(x) in given:
                continue
            # A revisit carries the validators of its own URL's last visit, and only then.
            got = x.task.revisit.etag if x.task.revisit is not None else None
            assert got == self.carries.get(x.id), (x.id, got)
            x.observed = Observed(f'"{x.id[:6]}.{x.partition}.{x.token}"', "", "", -1)

    # Acks more often than the base machine: each one schedules a revisit.
    @rule(**{**ACT_DRAWS, "op": st.sampled_from(["ack", "ack", "ack", "fail", "fail",
                                                 "release", "renew"])})
    def act(self, **kw: Any) -> None:
        held = {t.id: t.token for t in self.in_state("leased")}
        super().act(**kw)
        for tid, token in held.items():
            if self.tasks[tid].state == "done":  # acked: its history and next visit
                [lease] = [x for _, x in self.pool if x.id == tid and x.token == token]
                assert lease.observed is not None
                self.etag[tid] = lease.observed.etag
                self.next_at[tid] = self.run(self._next_visit(tid))

    async def _next_visit(self, tid: str) -> int:
        pk = self.q.partitions[self.tasks[tid].partition]
        at = await self.client.zscore(pk.rv_due, tid)
        assert at is not None and 3_599_000 <= at - await self._now() <= 3_600_000, at
        return int(at)

    @rule(picks=st.lists(st.integers(0, 63), min_size=1, max_size=4), **LEASE_DRAWS)
    def revisits_due(self, picks: list[int], worker: str, n: int, lease_ms: int) -> None:
        """The next visits of some done URLs come (their scores passed; none while no URL
        is done: see the module's docstring on preconditions), the reaper's promote runs,
        and a worker leases."""
        chosen = list(dict.fromkeys(self.pick(sorted(self.next_at), picks)))
        now = self.now()
        for tid in chosen:
            pk = self.q.partitions[self.tasks[tid].partition]
            self.run(self.client.zadd(pk.rv_due, {tid: now - 5}))
            self.next_at[tid] = now - 5
        before = self.counters["revisits"]
        self.promote()
        # Each revisit brought back counts its lateness in a bucket (by the Redis clock:
        # adopted, once their number is checked).
        late = {k: v for k, v in self.run(self.q.stats()).counters.items()
                if k.startswith("rv_late:")}
        mine = {k: v for k, v in self.counters.items() if k.startswith("rv_late:")}
        assert sum(late.values()) - sum(mine.values()) == self.counters["revisits"] - before
        self.counters.update({k: v - mine.get(k, 0) for k, v in late.items()})
        self.lease(worker, n, lease_ms)

    def reaper_promotes(self, p: int, now: int) -> int:
        """Due revisits first, in due order (then by id), each to its host's tail; then
        the due retries."""
        due = sorted((tid for tid, at in self.next_at.items()
                      if at <= now and self.tasks[tid].partition == p),
                     key=lambda tid: (self.next_at[tid], tid))
        for tid in due:  # a new visit: fresh attempts
            del self.next_at[tid]
            self.carries[tid] = self.etag[tid]
            self.tasks[tid].attempts = self.tasks[tid].stalls = 0
        self.push_all([self.tasks[tid] for tid in due], front=False)
        self.counters["revisits"] += len(due)
        return len(due) + self.promote_partition(p, now)

    def dead_letters(self, op: str, picks: list[int], one_dead: bool) -> None:
        super().dead_letters(op, picks, one_dead)
        for t in self.in_state("purged"):  # a purge forgets the URL's history
            self.etag.pop(t.id, None)

    @invariant()
    def every_done_url_is_scheduled_once_with_its_own_history(self) -> None:
        for p, pk in enumerate(self.q.partitions):
            due = self.run(self.client.zrange(pk.rv_due, 0, -1, withscores=True))
            hist = self.run(histories(self.q, pk, self.tasks))  # the buckets of every id
            mine = {tid for tid, t in self.tasks.items() if t.partition == p}
            assert {m.decode(): int(s) for m, s in due} == {
                tid: at for tid, at in self.next_at.items() if tid in mine}
            assert set(self.next_at) == {t.id for t in self.in_state("done")}
            etags = {}
            for k, record in hist.items():
                assert record is not None, k
                etags[k] = record.etag
            assert etags == {tid: e for tid, e in self.etag.items() if tid in mine}
            # Every entry brought back (queued, leased, waiting, dead) carries its own
            # URL's validators, and no other entry carries any.
            entries = [stored_entry(v) for v in self.run(self.client.hvals(pk.tasks))]
            entries += [v.split(b" ", 4)[4] for k, v in
                        self.run(self.client.hgetall(pk.leased)).items()
                        if k != HASHTABLE_FIELD.encode()]
            for h in self.hosts.values():
                if h.partition == p:
                    entries += [expand_entry(e, h.name) for e in [
                        *self.run(self.client.lrange(pk.host_queue(h.name), 0, -1)),
                        *self.run(self.client.zrange(pk.host_prio(h.name), 0, -1))]]
            for entry in entries:
                task = decode_entry(entry)
                got = task.revisit.etag if task.revisit is not None else None
                assert got == self.carries.get(task.id), (task.id, got)


class TwoPartitions(QueueMachine):
    pass


def test_no_rule_of_the_machines_has_a_precondition() -> None:
    """Which rules a step may draw must not hang on the clock (the module's docstring)."""
    for machine in (OnePartition, TwoPartitions, WithRevisits):
        for name in dir(machine):
            f = getattr(machine, name)
            marked = getattr(f, RULE_MARKER, None)
            if marked is not None:  # @precondition above @rule, or below it
                assert not marked.preconditions, f"{machine.__name__}.{name}"
                assert not getattr(f, PRECONDITIONS_MARKER, ()), f"{machine.__name__}.{name}"


@SLOW
def test_queue_state_machine_one_partition(redis_url: str, crawl_name: str) -> None:
    _run(OnePartition, redis_url, crawl_name, 1)


@SLOW
def test_queue_state_machine_two_partitions(redis_url: str, crawl_name: str) -> None:
    _run(TwoPartitions, redis_url, crawl_name, 2)


@SLOW
def test_queue_state_machine_with_revisits(redis_url: str, crawl_name: str) -> None:
    _run(WithRevisits, redis_url, crawl_name, 2, examples=40)
