"""A stateful property test of the queue: random interleavings against a Python model.

Hypothesis drives enqueue, lease, renew, ack, fail, release, defer, checkpoint,
expiry, reclaim, promote, requeue, purge, planted malformed bodies and stale calls
(a worker acting with a lease it lost) by several workers. The model predicts every
result code and which ids each lease returns; after every step the invariant reads
the raw partition keys and checks that each id is in exactly the structure the model
says, with the model's scores, owners and attempts, and that the counters add up.

Time is the Redis clock. A lease's validity and a retry's due time are judged against
Redis TIME read just before and just after a step; a step whose outcome would hinge on
a deadline falling inside it first sleeps past that deadline, so expectations are exact
(only a step slowed past MARGIN_MS by a loaded machine leaves a deadline in doubt, and
then either outcome is accepted and followed). Every draw is made before the state is
looked at, so a failing run replays with the same data however the clock moved.

A failure is reported with its whole run of steps, unshrunk (see ``_run``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import redis.asyncio as aioredis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from common.keys import HASHTABLE_FIELD
from common.queue import (
    MALFORMED,
    Code,
    CrawlQueue,
    CrawlSettings,
    Failure,
    Lease,
    NewTask,
    RetryPolicy,
)
from common.urls import fingerprint, task_id

T = TypeVar("T")

WORKERS = ("w0", "w1", "w2")
URLS = [f"http://sm.test/{i}" for i in range(30)]
BAD_URLS = [f"http://sm.test/bad/{i}" for i in range(2)]
BAD_BODIES = [b"\xff{not json", b'{"id": 1, "url": "http://sm.test/"}', b"[]",
              b'{"id": "0", "url": "http://sm.test/x"}']
SHORT_MS = 150
MARGIN_MS = 40  # steps are started this far from any deadline (see settle)
MAX_STALLS = 1
MAX_RETRY_AFTER_MS = 20_000


def priority_of(i: int) -> int:
    return (i % 3) if i % 4 == 0 else 0


def attempts_of(i: int) -> int:
    return 1 + i % 3


@dataclass
class Model:
    """What the test expects of one task id."""

    id: str
    partition: int
    priority: int
    max_attempts: int
    url: str
    malformed: bool = False
    state: str = "pending"  # pending, leased, waiting, dead, done, purged
    attempts: int = 0
    stalls: int = 0
    token: str = ""
    worker: str = ""
    deadline: int = 0
    due: int = 0
    reason: str = ""


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
        self.q: CrawlQueue = self.run(CrawlQueue.open(
            self.client, crawl, CrawlSettings(partitions=self.partitions),
            policy=RetryPolicy(max_stalls=MAX_STALLS, max_retry_after_ms=MAX_RETRY_AFTER_MS),
            jitter=lambda: 0.0))
        self.tasks: dict[str, Model] = {}
        self.ready: list[deque[str]] = [deque() for _ in range(self.partitions)]
        self.prio: list[set[str]] = [set() for _ in range(self.partitions)]
        self.pool: list[tuple[str, Lease]] = []  # every lease a worker was given
        self.counters: Counter[str] = Counter()
        self.planted = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
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

    def in_state(self, state: str) -> list[Model]:
        return [t for t in self.tasks.values() if t.state == state]

    def push(self, t: Model, front: bool) -> None:
        t.state = "pending"
        if t.priority > 0:
            self.prio[t.partition].add(t.id)
        elif front:
            self.ready[t.partition].appendleft(t.id)
        else:
            self.ready[t.partition].append(t.id)

    def to_dead(self, t: Model, reason: str) -> None:
        t.state, t.reason = "dead", reason
        self.counters["dead"] += 1

    def pop(self, p: int, n: int) -> list[str]:
        ids = sorted(self.prio[p], key=lambda i: (-self.tasks[i].priority, i))[:n]
        self.prio[p] -= set(ids)
        while len(ids) < n and self.ready[p]:
            ids.append(self.ready[p].popleft())
        return ids

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
        enqueued = 0
        for nt in new:
            tid = task_id(nt.fp)
            if tid in self.tasks:
                continue
            t = Model(tid, self.q.partition_of_id(tid), nt.priority, nt.max_attempts, nt.url)
            self.tasks[tid] = t
            self.push(t, front=False)
            enqueued += 1
        assert (res.enqueued, res.duplicates, res.recrawled) == (
            enqueued, len(batch) - enqueued, 0)
        self.counters["enqueued"] += enqueued
        self.counters["duplicates"] += len(batch) - enqueued

    @precondition(lambda self: self.planted < len(BAD_URLS))
    @rule(body=st.sampled_from(BAD_BODIES))
    def plant_malformed(self, body: bytes) -> None:
        url = BAD_URLS[self.planted]
        tid = task_id(fingerprint(url))
        t = Model(tid, self.q.partition_of_id(tid), 0, 3, url, malformed=True)
        pk = self.q.partitions[t.partition]
        self.run(self.client.hset(pk.tasks, tid, body))
        self.run(self.client.rpush(pk.ready, tid))
        self.tasks[tid] = t
        self.push(t, front=False)
        self.planted += 1

    @rule(worker=st.sampled_from(WORKERS), n=st.integers(1, 5),
          lease_ms=st.sampled_from([SHORT_MS, SHORT_MS, 30_000]))
    def lease(self, worker: str, n: int, lease_ms: int) -> None:
        # lease() skips a partition it found empty for up to a second (a local-clock
        # optimisation tested in test_queue.py); the model looks at every partition.
        self.q._empty_until = [0.0] * self.partitions
        start = self.q._next_partition
        expected: list[str] = []
        popped: list[str] = []
        for step in range(self.partitions):
            if len(expected) >= n:
                break
            ids = self.pop((start + step) % self.partitions, n - len(expected))
            popped += ids
            expected += [i for i in ids if not self.tasks[i].malformed]
        before = self.now()
        leases = self.run(self.q.lease(worker, n, lease_ms))
        after = self.now()
        assert [x.id for x in leases] == expected
        self.counters["leased"] += len(popped)
        for i in popped:
            t = self.tasks[i]
            t.attempts += 1
            if t.malformed:  # dead-lettered by lease() itself
                self.to_dead(t, MALFORMED)
                self.counters["failed"] += 1
        for x in leases:
            t = self.tasks[x.id]
            assert before + lease_ms <= x.deadline_ms <= after + lease_ms
            assert (x.task.url, x.task.priority, x.task.max_attempts, x.task.attempt) == (
                t.url, t.priority, t.max_attempts, t.attempts)
            t.state, t.token, t.worker, t.deadline = "leased", x.token, worker, x.deadline_ms
            self.pool.append((worker, x))
        del self.pool[:-40]

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

    @rule(op=st.sampled_from(["ack", "fail", "release", "defer", "checkpoint", "renew"]),
          picks=st.lists(st.integers(0, 63), min_size=1, max_size=4),
          stale=st.booleans(), worker=st.sampled_from(WORKERS),
          outcome=st.sampled_from(["ok", "http_404"]),
          delay=st.sampled_from([0, 100, 10_000]), permanent=st.booleans(),
          retry_after=st.sampled_from([None, 0.0, 15.0, 7_200.0]),
          lease_ms=st.sampled_from([SHORT_MS, 30_000]))
    def act(self, *, op: str, picks: list[int], stale: bool, worker: str, outcome: str,
            delay: int, permanent: bool, retry_after: float | None, lease_ms: int) -> None:
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
        elif op == "defer":
            codes = self.run(q.defer(worker, [(x, delay) for x in leases]))
        elif op == "checkpoint":
            codes = [self.run(q.checkpoint(worker, leases[0], {"n": len(self.pool)}))]
        else:
            replies = self.run(q.fail(worker, [
                Failure(x, "e", "boom", retry_after=retry_after, permanent=permanent)
                for x in leases]))
            codes = [Code.OK if c in (Code.RETRY, Code.DEAD) else c for c, _ in replies]
        after = self.now()
        for i, (x, code) in enumerate(zip(leases, codes, strict=True)):
            assert code in self.allowed(worker, x, now, after), (op, code, x)
            t = self.tasks[x.id]
            if code != Code.OK:
                self.counters["stale"] += 1
            elif op == "ack":
                t.state = "done"
                self.counters["done"] += 1
            elif op == "release":
                t.attempts -= 1
                self.push(t, front=True)
                self.counters["released"] += 1
            elif op == "defer":
                t.attempts -= 1
                self.wait(t, now, after, delay)
                self.counters["deferred"] += 1
            elif op == "checkpoint":
                self.counters["checkpoints"] += 1
            else:
                self.counters["failed"] += 1
                if permanent or t.attempts >= t.max_attempts:
                    assert replies[i] == (Code.DEAD, -1)
                    self.to_dead(t, "e")
                else:
                    delay_ms = (0 if retry_after is None
                                else min(int(retry_after * 1000), MAX_RETRY_AFTER_MS))
                    assert replies[i] == (Code.RETRY, delay_ms)
                    self.wait(t, now, after, delay_ms)
                    self.counters["retried"] += 1

    @rule(go=st.integers(0, 1))
    def expire(self, go: int) -> None:
        """Let the earliest live lease run out (kept rare: it sleeps)."""
        if go:
            return
        now = self.now()
        live = [t.deadline for t in self.in_state("leased") if t.deadline > now]
        if live and min(live) - now <= SHORT_MS:
            self.run(asyncio.sleep((min(live) - now + 5) / 1000))

    @rule(op=st.sampled_from(["reclaim", "reclaim", "promote", "requeue", "purge"]),
          picks=st.lists(st.integers(0, 63), min_size=1, max_size=2), one_dead=st.booleans())
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
        due = [t for t in leased if t.deadline <= now
               or (t.deadline <= after and self.gone_from("leases", t))]
        reclaimed = died = 0
        for t in sorted(due, key=lambda t: (t.deadline, t.id)):
            t.stalls += 1
            if t.stalls > MAX_STALLS:
                self.to_dead(t, "stalled")
                self.counters["stalled"] += 1
                died += 1
            else:
                self.push(t, front=True)
                reclaimed += 1
        assert result == (reclaimed, died)
        self.counters["reclaimed"] += reclaimed

    def promote(self) -> None:
        waiting = self.in_state("waiting")
        now = self.settle(t.due for t in waiting)
        moved, next_due = self.run(self.q.promote(limit=2))
        after = self.now()
        due = [t for t in waiting
               if t.due <= now or (t.due <= after and self.gone_from("delayed", t))]
        for t in sorted(due, key=lambda t: (t.due, t.id)):
            self.push(t, front=False)
            self.counters["promoted"] += 1
        assert moved == len(due)
        later = [t.due for t in waiting if t not in due]
        if later:
            assert min(later) - after <= next_due <= min(later) - now
        else:
            assert next_due == -1

    def dead_letters(self, op: str, picks: list[int], one_dead: bool) -> None:
        ids = self.pick(sorted(self.tasks), picks)
        if one_dead:
            ids += [t.id for t in self.in_state("dead")][:1]
        expected = 0
        if op == "requeue":
            groups: dict[int, list[str]] = {}
            for i in ids:
                groups.setdefault(self.q.partition_of_id(i), []).append(i)
            for group in groups.values():
                for i in group:
                    t = self.tasks[i]
                    if t.state == "dead":
                        t.attempts = t.stalls = 0
                        self.push(t, front=False)
                        expected += 1
            assert self.run(self.q.dead_requeue(ids)) == expected
            self.counters["requeued"] += expected
        else:
            for i in ids:
                if self.tasks[i].state == "dead":
                    self.tasks[i].state = "purged"
                    expected += 1
            assert self.run(self.q.dead_purge(ids)) == expected
            self.counters["purged"] += expected

    # -- the invariant -------------------------------------------------------------------

    async def _snapshot(self) -> list[list[Any]]:
        async with self.client.pipeline(transaction=False) as pipe:
            for pk in self.q.partitions:
                pipe.lrange(pk.ready, 0, -1)
                pipe.zrange(pk.prio, 0, -1, withscores=True)
                pipe.zrange(pk.leases, 0, -1, withscores=True)
                pipe.zrange(pk.delayed, 0, -1, withscores=True)
                pipe.zrange(pk.dead, 0, -1)
                pipe.hkeys(pk.tasks)
                pipe.hgetall(pk.owners)
                pipe.hgetall(pk.attempts)
                pipe.hgetall(pk.stalls)
                pipe.hgetall(pk.dead_reasons)
            replies = await pipe.execute()
        return [replies[i:i + 10] for i in range(0, len(replies), 10)]

    @invariant()
    def redis_matches_the_model(self) -> None:
        snapshot = self.run(self._snapshot())
        seen: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for p, parts in enumerate(snapshot):
            ready, prio, leases, delayed, dead, bodies, owners, attempts, stalls, why = parts
            ready = [i.decode() for i in ready]
            assert ready == list(self.ready[p])
            assert {i.decode(): -s for i, s in prio} == {
                i: self.tasks[i].priority for i in self.prio[p]}
            assert {i.decode(): int(s) for i, s in leases} == {
                t.id: t.deadline for t in self.in_state("leased") if t.partition == p}
            assert {i.decode(): int(s) for i, s in delayed} == {
                t.id: t.due for t in self.in_state("waiting") if t.partition == p}
            assert {i.decode() for i in dead} == {
                t.id for t in self.in_state("dead") if t.partition == p}
            mine = {i: t for i, t in self.tasks.items() if t.partition == p}
            live = {i for i, t in mine.items() if t.state not in ("done", "purged")}
            assert {i.decode() for i in bodies} == live  # done/purged: no body left
            # From the first lease on, both hold the one field that keeps them hashtables.
            marker = HASHTABLE_FIELD.encode()
            assert (marker in owners) == (marker in attempts)
            if any(t.state == "leased" for t in mine.values()):
                assert owners[marker] == b"1"
            owners.pop(marker, None)
            attempts.pop(marker, None)
            assert {k.decode(): v.decode() for k, v in owners.items()} == {
                t.id: f"{t.token}:{t.worker}" for t in mine.values() if t.state == "leased"}
            got_attempts = {k.decode(): int(v) for k, v in attempts.items()}
            got_stalls = {k.decode(): int(v) for k, v in stalls.items()}
            assert set(got_attempts) <= live and set(got_stalls) <= live
            for i in live:
                assert got_attempts.get(i, 0) == mine[i].attempts, i
                assert got_stalls.get(i, 0) == mine[i].stalls, i
            for structure in (ready, [i for i, _ in prio], [i for i, _ in leases],
                              [i for i, _ in delayed], dead):
                seen.update(i if isinstance(i, str) else i.decode() for i in structure)
            reasons.update({k.decode(): int(v) for k, v in why.items()})
        # Every live id is in exactly one structure; done and purged ids in none.
        assert seen == Counter(i for i, t in self.tasks.items()
                               if t.state not in ("done", "purged"))
        assert reasons == Counter(t.reason for t in self.in_state("dead"))

        stats = self.run(self.q.stats())
        c = stats.counters
        states = Counter(t.state for t in self.tasks.values())
        assert (stats.pending, stats.leased, stats.waiting, stats.dead) == (
            states["pending"], states["leased"], states["waiting"], states["dead"])
        assert c.get("enqueued", 0) + self.planted == (
            stats.pending + stats.leased + stats.waiting + stats.dead + c.get("done", 0)
            + c.get("purged", 0))
        assert {k: v for k, v in c.items() if not k.startswith("outcome:")} == {
            k: v for k, v in self.counters.items() if v}
        assert sum(v for k, v in c.items() if k.startswith("outcome:")) == c.get("done", 0)


def _run(machine: type[QueueMachine], url: str, crawl: str, partitions: int) -> None:
    machine.url, machine.crawl, machine.partitions = url, crawl, partitions
    # No shrink phase: steps sleep on the real clock, so shrinking a failure takes
    # minutes (past pytest's timeout, which Hypothesis would count as one more failure).
    # A failure is reported at once with its whole run of at most 30 steps, and replayed
    # first on the next run from the example database.
    run_state_machine_as_test(machine, settings=settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))


class OnePartition(QueueMachine):
    pass


class TwoPartitions(QueueMachine):
    pass


def test_queue_state_machine_one_partition(redis_url: str, crawl_name: str) -> None:
    _run(OnePartition, redis_url, crawl_name, 1)


def test_queue_state_machine_two_partitions(redis_url: str, crawl_name: str) -> None:
    _run(TwoPartitions, redis_url, crawl_name, 2)

