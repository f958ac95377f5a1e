"""Each Lua script's header lists its KEYS; the Python side must pass exactly those keys,
in that order. A recording client captures every script call of a real run of the queue
API, and each key is named the way common/keys.py names it."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from common import scripts
from common.frontier import Frontier
from common.history import record
from common.keys import CrawlKeys
from common.locks import TokenLocks
from common.queue import CrawlQueue, CrawlSettings, DedupMode, Failure, NewTask, RetryPolicy
from common.urls import fingerprint
from common.workers import WorkerRegistry

LUA = Path(scripts.__file__).parent / "lua"
FIXED = re.compile(r"^-- KEYS\[(\d+)\]\s+(\S+)")
RANGE = re.compile(r"^-- KEYS\[(\d+)\.\.(\d+)\]\s+host state: ([^(]+)\(lib\.lua\)")
TAIL = re.compile(r"^-- KEYS\[(\d+)[^\]]*\.\.\]")
CYCLE = re.compile(r"^-- KEYS\[(\d+)\(i-1\)\+(\d+)\]\s+(\S+)")
OTHERS = ("worker_beat", "history_push", "release_lock", "refresh_lock")
SOURCES = {scripts.source(name): name for name in (*scripts.NAMES, *OTHERS)}


def header(name: str) -> tuple[dict[int, str], int | None, dict[int, str]]:
    """The fixed KEYS of a script's header (index -> name), where its variable tail of
    keys starts (None: no tail), and a repeating group (position in group -> name)."""
    fixed: dict[int, str] = {}
    cycle: dict[int, str] = {}
    tail = None
    for line in (LUA / f"{name}.lua").read_text().splitlines():
        if m := CYCLE.match(line):
            cycle[int(m.group(2))] = m.group(3)
        elif m := RANGE.match(line):
            names = [n.strip() for n in m.group(3).split(",")]
            assert int(m.group(2)) - int(m.group(1)) + 1 == len(names), line
            fixed.update({int(m.group(1)) + i: n for i, n in enumerate(names)})
        elif m := FIXED.match(line):
            fixed[int(m.group(1))] = m.group(2)
        elif (m := TAIL.match(line)) and tail is None:
            tail = int(m.group(1))
    return fixed, tail, cycle


def key_name(key: str) -> str:
    """A key as the headers name it: the part after the hash tag, the per-host and
    per-item parts as placeholders."""
    name = key.split("}:", 1)[1]
    if name.startswith("lock:") or name.endswith(":lock"):
        return "lock"
    for prefix, shown in (("hq:", "hq:<h>"), ("hp:", "hp:<h>"), ("seen:", "seen"),
                          ("bloom:", "bloom:<L>"), ("worker:", "worker:<id>")):
        if name.startswith(prefix):
            return shown
    return name


def test_key_name_reads_the_schema() -> None:
    assert key_name("crawlq:{c:0}:h:queued") == "h:queued"
    assert key_name("crawlq:{c:0}:hq:a.test:8080") == "hq:<h>"
    assert key_name("crawlq:{c}:history") == "history"
    assert key_name("crawlq:{c}:robots:https://a.test:lock") == "lock"


async def test_headers_match_the_keys_passed(redis_client: aioredis.Redis,
                                             crawl_name: str) -> None:
    calls: dict[str, list[list[str]]] = defaultdict(list)
    real = redis_client.register_script

    def recording(source: str) -> Any:
        script = real(source)
        name = SOURCES[source]

        def call(keys: Any = None, args: Any = None, client: Any = None) -> Any:
            calls[name].append([k.decode() if isinstance(k, bytes) else k for k in keys or ()])
            return script(keys=keys, args=args, client=client)
        return call

    redis_client.register_script = recording  # type: ignore[method-assign]
    await exercise(redis_client, crawl_name)
    missing = {*scripts.NAMES, *OTHERS} - set(calls)
    assert not missing, f"scripts this test did not run: {missing}"
    wrong: list[str] = []
    for name, runs in calls.items():
        fixed, tail, cycle = header(name)
        assert fixed or cycle, f"{name}.lua lists no KEYS in its header"
        for keys in runs:
            if cycle:
                got_cycle = [key_name(k) for k in keys]
                want = [cycle[i % len(cycle) + 1] for i in range(len(keys))]
                if got_cycle != want or len(keys) % len(cycle):
                    wrong.append(f"{name}.lua: header {want}, Python passes {got_cycle}")
                continue
            for index, expected in fixed.items():
                got = key_name(keys[index - 1]) if index <= len(keys) else "(missing)"
                if got != expected:
                    wrong.append(f"{name}.lua KEYS[{index}]: header {expected!r}, "
                                 f"Python passes {got!r}")
            last = max(fixed)
            if tail is None and len(keys) != last:
                wrong.append(f"{name}.lua: header lists {last} keys, Python passes {len(keys)}")
            extra = [key_name(k) for k in keys[last:]]
            for i in range(0, len(extra) - 1, 2):
                if extra[i] == "hq:<h>" and extra[i + 1] != "hp:<h>":
                    wrong.append(f"{name}.lua: hq:<h> without its hp:<h> at {last + i + 1}")
    assert wrong == []


async def exercise(client: aioredis.Redis, crawl: str) -> None:
    """Every script at least once, through the Python API."""
    def tasks(*urls: str, **kw: Any) -> list[NewTask]:
        return [NewTask(u, fingerprint(u), **kw) for u in urls]

    q = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=2),
                              policy=RetryPolicy(base_ms=10))
    await q.enqueue(tasks("http://a.test/1", "http://a.test/2", "http://b.test/1",
                          "http://c.test/1", "http://d.test/1"))
    await q.enqueue(tasks("http://a.test/p", priority=3))
    front = Frontier(q)
    await front.set_host("b.test", concurrency=1)
    leases = await q.lease("w", 10, 60_000)
    assert len(leases) >= 4
    await q.ack("w", [(leases[0], "ok")])
    await q.fail("w", [Failure(leases[1], "http_429", "slow", retry_after=0, cooldown=0.001)])
    await q.fail("w", [Failure(leases[2], "gone", "x", permanent=True)])
    await q.release("w", [leases[3]])
    await q.renew("w", leases[4:], 60_000)
    if len(leases) > 5:
        await q.checkpoint("w", leases[5], {"page": 1})
    short = await q.lease("w", 2, 1)
    await asyncio.sleep(0.01)
    await q.reclaim()
    await asyncio.sleep(0.05)  # the retry's backoff
    await q.promote()
    dead = await q.dead_ids()
    await q.dead_requeue(dead)
    await q.lease("w", 10, 60_000)
    del short
    await q.is_empty()
    bloom = await CrawlQueue.open(client, crawl + "b", CrawlSettings(dedup=DedupMode.BLOOM))
    await bloom.enqueue(tasks("http://e.test/1"))
    [e] = await bloom.lease("w", 1, 60_000)
    await bloom.fail("w", [Failure(e, "gone", "x", permanent=True)])
    await bloom.dead_purge(await bloom.dead_ids())
    await WorkerRegistry(client, crawl, "w", ttl_s=60).beat(in_flight=0, done=0, failed=0,
                                                             state="running")
    await record(client, crawl, {"done": 1})
    locks = TokenLocks(client)
    lock = CrawlKeys.build(crawl).producer_lock
    await locks.refresh(lock, "token", 1000)
    await locks.release(lock, "token")
