"""The failover drill's harness: a crawl by a fleet of consumer processes against a
`SentinelGroup` while its primary fails, for the drill test and for
``bench/failover_bench.py``.

`run_drill` serves a local site (``tests.sites`` in a child process: ``plan.pages`` pages
that answer 200 and ``plan.failing`` URLs that answer 500, over ``plan.hosts`` loopback
hosts), enqueues half the URLs with ``python -m producer`` before the fleet starts and
the other half while it runs, starts ``plan.consumers`` ``python -m consumer``
processes, all of them pointed at the group's Sentinel URL, and, with ``plan.steps``:

- ``kill``: once ``plan.kill_at`` of the pages are done, kill -9 the primary;
- ``split``: once the fleet leases on the new primary, SIGSTOP it until the sentinels
  have promoted another node, then SIGCONT it (it still believes it is the primary
  until the sentinels turn it into a replica: split brain);
- ``restart``: start the killed primary again as a replica (right after the split: the
  newest primary takes writes only with a replica, ``min-replicas-to-write``).

Then it waits for the crawl to drain and the group to settle, runs the producer again
over every URL (a run is idempotent: it enqueues only URLs the crawl has not seen, so
its ``enqueued`` count is the enqueues the failovers lost, and it restores them), waits
for the crawl to drain again, runs ``crawlq fsck``, checks the consumers still run,
stops them (SIGTERM) and reads everything back into a `DrillRun`: each step's times,
the sink's records, every URL's state, the counters.

How the drill accounts for writes a failover lost (replication is asynchronous, so a
killed or cut-off primary takes its last writes with it; nothing in crawlq can make
them survive, only make losing them harmless):

- an **enqueue** lost: the task and its dedup entry go together (one script), so the
  producer's re-run enqueues it again; the run's ``enqueued`` counts them;
- a **lease** lost: the task is pending again on the new primary and leased again; the
  consumer that fetched it under the lost lease wrote its result, and its ack is
  refused (stale): the task is fetched twice, the two records with two tokens and the
  same attempt number;
- an **ack** lost (or one whose outcome was unknown and was not re-sent): the new
  primary still holds the lease; it expires and the task is reclaimed and fetched
  again: two records, the second with a higher attempt number.

So a task fetched twice is explained when its earlier fetch lies in a failover's
window: from `REPLICATION_LAG_S` before the step (the most a replica's copy can lag
with ``min-replicas-max-lag``) to `ACK_GRACE_S` after the fleet leased again on the new
primary (a result fetched during the outage is acked once Redis answers again).
`DrillRun.unexplained` lists those that are not: each one a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from sites import start_site_process

from common.hostmodel.hostkey import host_key
from common.policy import create_policy, parse_assignments
from common.queue import CrawlQueue, CrawlSettings
from common.urls.canonical import canonicalize, fingerprint, task_id
from support.sentinel import HOST, MASTER, MIN_REPLICAS_MAX_LAG_S, Node, SentinelGroup

ROOT = Path(__file__).resolve().parents[2]
#: The most a replica's copy lags its primary's (``min-replicas-max-lag``): a write
#: older than this reached a replica before the failover.
REPLICATION_LAG_S = float(MIN_REPLICAS_MAX_LAG_S)
#: How long after the fleet leases again a result fetched during the outage may be acked.
ACK_GRACE_S = 3.0
SAMPLE_S = 0.025
#: URLs per enqueue call of the drill's producer runs.
BATCH = 100


@dataclass(frozen=True, slots=True)
class DrillPlan:
    """The crawl and the failures the drill puts it through."""

    pages: int = 2000  # URLs answering 200: done
    failing: int = 30  # URLs answering 500: dead after 2 attempts (http_5xx)
    hosts: int = 4
    consumers: int = 3
    concurrency: int = 6
    # Each page's answer time: the crawl (~70 pages/s at most) outlasts the producer runs'
    # and the steps' waits even where process start-ups take seconds.
    delay_ms: float = 250.0
    lease_s: float = 10.0
    partitions: int = 4
    steps: tuple[str, ...] = ("kill", "split", "restart")
    kill_at: float = 0.15  # fraction of the pages done when the primary is killed
    drain_s: float = 90.0  # the longest the crawl may take to drain, each time
    deadline_s: float = 180.0  # the longest the whole drill may take


@dataclass(slots=True)
class Step:
    """One failure the drill caused and what followed, in unix seconds."""

    name: str
    at: float
    old: str  # the node it hit
    in_flight: int = 0  # leases held on the primary just before
    detected: float | None = None  # first +odown after `at`
    promoted: float | None = None  # first +switch-master after `at`
    new: str = ""  # the node promoted
    leasing: float | None = None  # the fleet's first lease on the new primary

    def window(self) -> tuple[float, float]:
        """When a fetch whose write this step lost could have happened."""
        end = self.leasing if self.leasing is not None else self.at
        return self.at - REPLICATION_LAG_S, end + ACK_GRACE_S


@dataclass(slots=True)
class DrillRun:
    """What the drill saw (see the module docstring)."""

    plan: DrillPlan
    started: float = 0.0
    drained: float = 0.0  # when the crawl first drained (before the producer's re-run)
    finished: float = 0.0  # when it drained again, after the re-run
    restarted: float | None = None  # when the killed primary was a replica again
    steps: list[Step] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)  # task id -> URL
    partition: dict[str, int] = field(default_factory=dict)  # task id -> its partition
    failing: set[str] = field(default_factory=set)  # ids of the URLs answering 500
    states: dict[str, str] = field(default_factory=dict)  # task id -> state at the end
    counters: dict[str, int] = field(default_factory=dict)
    dead_reasons: dict[str, int] = field(default_factory=dict)
    active: int = -1  # pending + leased + waiting at the end
    records: list[dict[str, Any]] = field(default_factory=list)
    producers: list[dict[str, Any]] = field(default_factory=list)  # --json summaries
    rerun_enqueued: int = -1  # what the re-run enqueued: enqueues the failovers lost
    fsck: tuple[int, str] = (-1, "")
    alive_at_end: list[bool] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)  # consumer name -> its log's tail
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (unix s, stage)

    def timeline_text(self) -> str:
        return " / ".join(f"+{t - self.started:.1f}s {what}" for t, what in self.timeline)

    def wrong_states(self) -> dict[str, str]:
        """Task id -> state, of every URL not in the state its answer makes it (done for
        a 200, dead for a 500)."""
        return {tid: state for tid, state in self.states.items()
                if state != ("dead" if tid in self.failing else "done")}

    def token_clashes(self) -> dict[tuple[int, str], set[str]]:
        """(partition, fencing token) -> task ids, for every token the sink saw on more
        than one task: two leases that shared a token (each partition counts its own)."""
        seen: dict[tuple[int, str], set[str]] = defaultdict(set)
        for r in self.records:
            if r.get("token"):
                seen[self.partition[r["task_id"]], r["token"]].add(r["task_id"])
        return {t: ids for t, ids in seen.items() if len(ids) > 1}

    def fetches(self) -> dict[str, list[dict[str, Any]]]:
        """Task id -> its records, one per lease (token), oldest first."""
        by_task: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for r in self.records:
            by_task[r["task_id"]].setdefault(r.get("token") or str(id(r)), r)
        return {tid: sorted(leases.values(), key=lambda r: float(r["fetched_at"]))
                for tid, leases in by_task.items()}

    def duplicates(self) -> dict[str, list[dict[str, Any]]]:
        """The pages fetched under more than one lease (the 500s' retries left out)."""
        return {tid: recs for tid, recs in self.fetches().items()
                if len(recs) > 1 and tid not in self.failing}

    @property
    def fetched_twice(self) -> int:
        """Fetches beyond the first of every page."""
        return sum(len(recs) - 1 for recs in self.duplicates().values())

    def unexplained(self) -> dict[str, list[float]]:
        """Task id -> fetch times of every page fetched twice whose earlier fetch lies in
        no step's window (see the module docstring)."""
        windows = [s.window() for s in self.steps]
        out = {}
        for tid, recs in self.duplicates().items():
            times = [float(r["fetched_at"]) for r in recs]
            if not all(any(lo <= t <= hi for lo, hi in windows) for t in times[:-1]):
                out[tid] = times
        return out

    def causes(self) -> dict[str, int]:
        """How many second fetches each lost write explains: ``lease`` (the same attempt
        leased again: the first lease's grant was lost), ``ack`` (a later attempt: the
        first lease outlived its lost or unsent ack and was reclaimed)."""
        out = {"lease": 0, "ack": 0}
        for recs in self.duplicates().values():
            for earlier, later in itertools.pairwise(recs):
                out["lease" if later["attempt"] <= earlier["attempt"] else "ack"] += 1
        return out

    def lost(self) -> list[str]:
        """Ids of the pages no record shows were fetched."""
        fetched = {r["task_id"] for r in self.records}
        return sorted(tid for tid in self.urls if tid not in self.failing
                      and tid not in fetched)


# -- processes --------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["CRAWLQ_LOG_FORMAT"] = "json"
    return env


async def _run(argv: list[str], log: Path, within: float,
               feed: AsyncIterator[bytes] | None = None) -> tuple[int, str]:
    """Run a crawlq command to its end: (exit code, stdout); its stderr goes to `log`, its
    stdin is what `feed` yields (nothing without one)."""
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=ROOT, env=_env(),
            stdin=asyncio.subprocess.PIPE if feed else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=err)

    async def write() -> None:
        assert proc.stdin is not None and feed is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            async for chunk in feed:
                proc.stdin.write(chunk)
                await proc.stdin.drain()
            proc.stdin.close()

    async def ends() -> bytes:
        assert proc.stdout is not None
        writer = asyncio.create_task(write()) if feed else None
        out = await proc.stdout.read()
        await proc.wait()
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        return out

    try:
        out = await asyncio.wait_for(ends(), within)
    except TimeoutError:
        raise AssertionError(f"{argv[:2]} still ran after {within:g}s; see {log}") from None
    finally:  # timed out, or the drill failed and cancels it
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(errors="replace")


async def _produce(url: str, crawl: str, plan: DrillPlan, source: Path | AsyncIterator[bytes],
                   log: Path) -> dict[str, Any]:
    """A producer run over a file of URLs, or over stdin as `source` yields it."""
    feed = None if isinstance(source, Path) else source
    code, out = await _run(
        ["-m", "producer", "--redis-url", url, "--crawl", crawl, "--partitions",
         str(plan.partitions), "--allow-private", "--json",
         "--progress", "off", "--lock-wait", "60", "--enqueue-batch", str(BATCH),
         "-" if feed else str(source)], log, within=90, feed=feed)
    summary: dict[str, Any] = json.loads(out) if out.strip().startswith("{") else {}
    summary.setdefault("exit_code", code)
    return summary


@dataclass
class _Fleet:
    procs: list[asyncio.subprocess.Process]
    logs: list[Path]

    @classmethod
    async def start(cls, url: str, crawl: str, plan: DrillPlan, workdir: Path) -> _Fleet:
        procs, logs = [], []
        for i in range(plan.consumers):
            log = workdir / f"consumer-{i}.log"
            with log.open("wb") as out:
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "consumer", "--redis-url", url, "--crawl", crawl,
                    "--worker-id", f"drill-{i}", "--allow-private",
                    "--output", str(workdir / "out"), "--http-port", "-1",
                    "--concurrency", str(plan.concurrency), "--lease", f"{plan.lease_s}s",
                    cwd=ROOT, env=_env(),
                    stdin=asyncio.subprocess.DEVNULL, stdout=out,
                    stderr=asyncio.subprocess.STDOUT))
            logs.append(log)
        return cls(procs, logs)

    async def stop(self, within: float = 30) -> list[int | None]:
        """SIGTERM every consumer; their exit codes (None: still running after `within`
        seconds, then killed)."""
        for p in self.procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)

        async def ended(p: asyncio.subprocess.Process) -> int | None:
            try:
                return await asyncio.wait_for(p.wait(), within)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
                return None

        return list(await asyncio.gather(*[ended(p) for p in self.procs]))


def _records(out: Path) -> list[dict[str, Any]]:
    """Every JSONL record under `out` (a torn last line is skipped)."""
    found = []
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


# -- watching the group ----------------------------------------------------------------


class _Monitor:
    """Samples, every `SAMPLE_S`, the ``leased`` counter of each node (its replicated
    copy, on a replica): when the fleet leases again after a promotion."""

    def __init__(self, group: SentinelGroup, crawl_keys: list[str]) -> None:
        self.group = group
        self.stats_keys = crawl_keys
        self.samples: list[tuple[float, str, bool, int]] = []  # (unix s, node, primary?, leased)
        self._clients: dict[int, aioredis.Redis] = {}
        self._task: asyncio.Task[None] | None = None
        self.error = ""

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for c in self._clients.values():
            await c.aclose()

    async def _loop(self) -> None:
        while True:
            for node in list(self.group.nodes):
                if node.paused or not node.alive:
                    continue
                c = self._clients.get(node.port)
                if c is None:
                    c = self._clients[node.port] = aioredis.Redis(
                        host=HOST, port=node.port, socket_timeout=0.5,
                        socket_connect_timeout=0.5)
                try:
                    role = await c.execute_command("ROLE")  # type: ignore[no-untyped-call]
                    values = [await c.hget(k, "leased") for k in self.stats_keys]
                    self.samples.append((time.time(), node.name, role[0] in (b"master", "master"),
                                         sum(int(v or 0) for v in values)))
                except Exception as exc:  # a node failing over: next round
                    self.error = f"{node.name}: {exc}"
            await asyncio.sleep(SAMPLE_S)

    def describe(self) -> str:
        """The last sample of each node, for a failure message."""
        last = {name: (round(at, 2), primary, leased)
                for at, name, primary, leased in self.samples}
        return (f"monitor: {len(self.samples)} samples, last per node {last}, now "
                f"{time.time():.2f}, last error {self.error!r}, running "
                f"{self._task is not None and not self._task.done()}")

    def leasing_after(self, node: str, since: float) -> float | None:
        """The first sample after `since` where `node` is a primary and its leased counter
        is past what it held before: its last sample before `since`, or as a replica
        (what it had of the old primary's)."""
        base = 0
        for at, name, primary, leased in self.samples:
            if name != node:
                continue
            if at < since or not primary:
                base = leased
            elif leased > base:
                return at
        return None


async def _until(pred: Callable[[], Awaitable[bool]], within: float,
                 what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(Exception):  # Redis in the middle of a failover
            if await pred():
                return
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {within:g}s waiting for {said}")
        await asyncio.sleep(0.1)


async def _held_leases(group: SentinelGroup, queue: CrawlQueue) -> int:
    """Leases held on the current primary, read directly from it."""
    node = await asyncio.to_thread(group.primary)
    async with aioredis.Redis(host=HOST, port=node.port, socket_timeout=2) as c:
        return sum([await c.zcard(pk.leases) for pk in queue.partitions])


_BACKGROUND: set[asyncio.Task[Any]] = set()


async def _within(coro: Any, seconds: float) -> None:
    """Await `coro` for up to `seconds`; past that it goes on in the background."""
    task = asyncio.ensure_future(coro)
    await asyncio.wait({task}, timeout=seconds)
    if not task.done():
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


def _first(events: list[Any], after: float) -> Any:
    return next((e for e in events if e.at >= after), None)


# -- the drill ----------------------------------------------------------------------------


async def run_drill(group: SentinelGroup, workdir: Path, plan: DrillPlan | None = None,
                    crawl: str = "drill", say: Callable[[str], None] = lambda _: None
                    ) -> DrillRun:
    """Run the drill on a started group (see the module docstring); `say` hears each
    stage as it begins."""
    plan = plan or DrillPlan()
    async with start_site_process(delay_ms=plan.delay_ms, hosts=plan.hosts) as site:
        drill = _Drill(group, workdir, plan, crawl, say)
        await drill.prepare(site.url)
        try:
            async with asyncio.timeout(plan.deadline_s):
                await drill.run()
        except TimeoutError:
            raise AssertionError(f"the drill took longer than {plan.deadline_s:g}s\ntimeline: "
                                 f"{drill.result.timeline_text()}") from None
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ntimeline: {drill.result.timeline_text()}") from exc
    return drill.result


class _Drill:
    """One run of the drill: its crawl, fleet and steps (see the module docstring)."""

    def __init__(self, group: SentinelGroup, workdir: Path, plan: DrillPlan, crawl: str,
                 say: Callable[[str], None]) -> None:
        self.group, self.workdir, self.plan, self.crawl, self._say = (
            group, workdir, plan, crawl, say)
        self.result = DrillRun(plan, started=time.time())
        self.files: dict[str, Path] = {}
        self.second: list[str] = []  # the URLs the second producer run reads from stdin
        self.fed = 0  # how many of them it was given before the kill
        self.promoted = asyncio.Event()  # the rest goes in once a new primary is named
        self.producer_log = workdir / "producer.log"

    async def prepare(self, url_of: Callable[..., str]) -> None:
        """The URL files (first half, second half, all) and the crawl's policy."""
        plan, run = self.plan, self.result
        good = [url_of(f"/p/{i}", host=i % plan.hosts) for i in range(plan.pages)]
        bad = [url_of(f"/status/500?n={i}", host=i % plan.hosts) for i in range(plan.failing)]
        every = good + bad
        for raw in every:
            url = canonicalize(raw)
            assert isinstance(url, str), url
            tid = task_id(fingerprint(url))
            run.urls[tid] = url
            if raw in bad:
                run.failing.add(tid)
        # Two thirds first: the fleet still has work when the second run is under way.
        half = len(every) * 2 // 3
        for name, urls in (("first", every[:half]), ("all", every)):
            self.files[name] = self.workdir / f"urls-{name}.txt"
            self.files[name].write_text("".join(u + "\n" for u in urls))
        self.second = every[half:]

    def say(self, stage: str) -> None:
        self.result.timeline.append((time.time(), stage))
        self._say(stage)

    async def produce(self, which: str) -> dict[str, Any]:
        self.say(f"producer: {which} URLs")
        source = self.feed() if which == "second" else self.files[which]
        summary = await _produce(self.group.url, self.crawl, self.plan, source,
                                 self.producer_log)
        self.result.producers.append(summary)
        return summary

    async def feed(self) -> AsyncIterator[bytes]:
        """The second run's stdin: half its URLs (whole batches), the rest once the
        Sentinels name a new primary: the run is under way across the failover, its
        connections to the dead primary, and must find the new one. (While no primary
        is named, a producer stops with exit 3 by design and its re-run restores what
        it did not enqueue; here it must not need to.)"""
        urls = self.second
        cut = len(urls) // 2 // BATCH * BATCH
        for i in range(0, len(urls), BATCH):
            if i == cut:
                self.fed = cut
                await self.promoted.wait()
            yield "".join(u + "\n" for u in urls[i:i + BATCH]).encode()
            await asyncio.sleep(0.02)

    async def run(self) -> None:
        group, run = self.group, self.result
        sentinel = Sentinel([(HOST, s.port) for s in group.sentinels],  # type: ignore[no-untyped-call]
                            socket_timeout=1.0)
        client = sentinel.master_for(MASTER, socket_timeout=2.0)
        # The fleet's politeness is the crawl's policy (in Redis), not the consumers'
        # flags: none, and two attempts. Created here, so the processes start together.
        await create_policy(client, self.crawl, parse_assignments(
            ["per_host_delay=0s", "per_host_concurrency=0", "ignore_robots=true",
             "retry_base=0.1s", "max_attempts=2"]), by="failover drill")
        self.queue = queue = await CrawlQueue.open(
            client, self.crawl, CrawlSettings(partitions=self.plan.partitions))
        run.partition = {tid: queue.partition_of(host_key(url))
                         for tid, url in run.urls.items()}
        self.monitor = _Monitor(group, [pk.stats for pk in queue.partitions])
        self.monitor.start()
        self.say("consumers: starting")
        first = asyncio.create_task(self.produce("first"))
        fleet = await _Fleet.start(group.url, self.crawl, self.plan, self.workdir)
        try:
            await first
            await self.steps()
            await self.finish()
        finally:
            self.say("stopping")
            run.alive_at_end = [p.returncode is None for p in fleet.procs]
            run.exit_codes = await fleet.stop()
            self.say("consumers stopped")
            # Closing a client can wait on a socket's close (seen: minutes, under load),
            # and a close cancelled by wait_for's timeout was still waited for (the drill
            # then overran its deadline after "consumers stopped"): each is left to end
            # in the background after its time, not cancelled.
            await _within(self.monitor.stop(), 10)
            self.say("monitor stopped")
            for c in (client, *sentinel.sentinels):
                await _within(c.aclose(), 5)
            self.say("clients closed")
            for i, log in enumerate(fleet.logs):
                run.logs[f"consumer-{i}"] = log.read_text(errors="replace")[-4000:]
        for step in run.steps:
            _fill_in(step, group, self.monitor)
        run.records = _records(self.workdir / "out")

    async def until_done(self, fraction: float) -> None:
        async def reached() -> bool:
            return (await self.queue.stats()).done >= fraction * self.plan.pages

        await _until(reached, self.plan.drain_s, f"{fraction:.0%} of the pages done")

    async def steps(self) -> None:
        """The second producer run and the failures, each once its share of the crawl is
        done; then wait until the fleet leases again."""
        plan = self.plan
        # The second part is enqueued across the kill: some of its writes may be lost.
        # (After the first run: one producer run at a time holds the crawl's lock.)
        second = asyncio.create_task(self.produce("second"))
        await self.until_done(plan.kill_at)
        first = int(self.result.producers[0].get("enqueued", 0))

        async def fed() -> bool:
            stats = await self.queue.stats()
            return second.done() or (self.fed > 0 and stats.leased > 0 and stats.counters.get(
                "enqueued", 0) >= first + self.fed)

        try:
            await _until(fed, 60, "the second producer run's first half")
            self.say("second producer run under way")
            killed = None
            if "kill" in plan.steps:
                killed = await self.kill()
            else:
                self.promoted.set()
            # The run ends before the split: a producer hit by NOREPLICAS inside an enqueue
            # pipeline ends with a traceback (the error code is not read through
            # redis-py's "Command # 1 ... of pipeline caused error" wrapper).
            await second
            if "split" in plan.steps:  # as soon as the fleet works on the new primary
                await self.split()
            if "restart" in plan.steps and killed is not None:
                await asyncio.to_thread(self.group.restart_as_replica, killed)
                self.result.restarted = time.time()
                self.say(f"{killed.name} restarted as a replica")
            if self.result.steps:
                last = self.result.steps[-1]
                await _until(lambda: _leasing(self.monitor, last), 60,
                             lambda: f"the fleet to lease again on {last.new}; "
                                     f"{self.monitor.describe()}")
            await second
        finally:
            if not second.done():
                second.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await second

    async def split(self) -> None:
        """SIGSTOP the primary until the Sentinels name another, then SIGCONT it."""
        group = self.group
        primary = await asyncio.to_thread(group.primary)
        step = Step("split", 0.0, primary.name, await _held_leases(group, self.queue))
        stats = await self.queue.stats()
        assert stats.pending > 0, f"the crawl is leased to its end already: {stats}"
        step.at = time.time()
        await asyncio.to_thread(group.pause, primary)
        self.result.steps.append(step)
        self.say(f"paused {primary.name}")
        try:
            step.new = (await asyncio.to_thread(group.wait_failover, primary)).name
            self.say(f"{step.new} promoted")
        finally:
            await asyncio.to_thread(group.resume, primary)
            self.say(f"continued {primary.name}")

    async def kill(self) -> Node:
        """kill -9 the primary, let the second producer run go on, wait for the failover
        and for the fleet to lease again."""
        step = Step("kill", 0.0, "", await _held_leases(self.group, self.queue))
        step.at = time.time()
        killed = await asyncio.to_thread(self.group.kill_primary)
        step.old = killed.name
        self.result.steps.append(step)
        self.say(f"killed {killed.name}")
        step.new = (await asyncio.to_thread(self.group.wait_failover, killed)).name
        self.promoted.set()
        self.say(f"{step.new} promoted")
        await _until(lambda: _leasing(self.monitor, step), 60,
                     lambda: f"the fleet to lease again on {step.new}; {self.monitor.describe()}")
        self.say(f"the fleet leases on {step.new}")
        return killed

    async def finish(self) -> None:
        """Drain, settle, the producer's re-run, drain again, fsck, the final states."""
        run, queue = self.result, self.queue

        async def drained() -> bool:
            stats = await queue.stats()
            return stats.active == 0 and stats.done > 0

        self.say("waiting for the crawl to drain")
        await _until(drained, self.plan.drain_s, "the crawl to drain")
        run.drained = time.time()
        self.say("waiting for the group to settle")
        await asyncio.to_thread(self.group.wait_settled)
        rerun = await self.produce("all")
        run.rerun_enqueued = int(rerun.get("enqueued", -1))
        await _until(drained, self.plan.drain_s, "the crawl to drain after the re-run")
        self.say("fsck")
        run.fsck = await _run(["-m", "console.cli", "fsck", "--redis-url", self.group.url,
                               "--crawl", self.crawl], self.workdir / "fsck.log", within=60)
        self.say(f"fsck exited {run.fsck[0]}")
        stats = await queue.stats()
        run.counters, run.dead_reasons, run.active = (
            stats.counters, stats.dead_reasons, stats.active)
        room = asyncio.Semaphore(8)  # the client's pool: a few connections at a time

        async def state(tid: str) -> None:
            async with room:
                run.states[tid] = await queue.state_of(tid, run.urls[tid])

        self.say("reading every URL's state")
        await asyncio.gather(*[state(tid) for tid in run.urls])
        self.say("done")
        run.finished = time.time()


async def _leasing(monitor: _Monitor, step: Step) -> bool:
    return bool(step.new) and monitor.leasing_after(step.new, step.at) is not None


def _fill_in(step: Step, group: SentinelGroup, monitor: _Monitor) -> None:
    """Sentinel's times from its logs (the first sentinel's events about the node the step
    hit); the fleet's first lease after the promotion."""
    port = str(group.nodes[int(step.old[1:])].port)
    odown = _first([e for e in group.sentinel_events("+odown")
                    if e.text.split()[3:4] == [port]], step.at)
    switch = _first([e for e in group.sentinel_events("+switch-master")
                     if e.text.split()[2:3] == [port]], step.at)
    step.detected = odown.at if odown else None
    step.promoted = switch.at if switch else None
    if step.new:
        step.leasing = monitor.leasing_after(step.new, step.promoted or step.at)
