"""Every ``crawlq`` subcommand against a real crawl built with CrawlQueue (real Redis)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from support.crawls import Crawl, build_crawl
from support.frontier import host_record
from support.outage import outage_relay

from common.errors import ConfigError
from common.fleet.history import rates
from common.fleet.workers import WorkerRegistry
from common.keys import CRAWLS, CrawlKeys
from common.names import CRAWL_NAME_RULE, validate_crawl_name
from common.policy import set_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.redis.server import RedisServer, free_port
from common.urls.canonical import fingerprint
from console.cli import main_async
from console.demo.site import sample_site
from consumer.__main__ import main as consumer_main
from consumer.config import build_parser as consumer_parser
from consumer.config import settings_from_args


async def crawlq(redis_url: str, *args: str) -> int:
    return await main_async([*args, "--redis-url", redis_url, "--cluster", "no"])


async def keys_of(client: aioredis.Redis, name: str) -> set[bytes]:
    """Every key of one crawl, found independently of the code under test."""
    own = re.compile(rb"^crawlq:\{" + re.escape(name.encode()) + rb"(:\d+(\.\d+)?)?\}:")
    return {k async for k in client.scan_iter(match="crawlq:*", count=10_000)
            if own.match(k)}


async def test_stats_text_and_json(redis_url: str, redis_client: aioredis.Redis, crawl: Crawl,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert f"crawl {crawl.name} (partitions 2, dedup exact)" in out
    for state, n in (("pending", 5), ("leased", 0), ("waiting", 0), ("dead", 3), ("done", 4)):
        assert f"  {state:<8} {n:>10,}" in out
    assert "rates: n/a" in out
    assert "dead letters by reason: http_5xx 2, redirect_loop 1" in out
    assert "live workers: 0" in out
    assert "revisits" not in out  # a crawl without revisits shows none

    now = time.time()
    history = CrawlKeys.build(crawl.name).history
    for t, done in ((now - 90, 0), (now - 60, 30), (now, 150)):  # LPUSH: newest ends first
        await redis_client.lpush(history, json.dumps({"t": t, "done": done, "failed": 3}))
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["states"] == {"pending": 5, "leased": 0, "waiting": 0, "dead": 3, "done": 4}
    assert doc["dead_reasons"] == {"http_5xx": 2, "redirect_loop": 1}
    assert doc["counters"]["enqueued"] == 12
    assert doc["settings"] == {"partitions": 2, "dedup": "exact"}
    assert doc["rates"] == {"window_s": 60.0, "done_per_s": 2.0, "failed_per_s": 0.0}
    assert doc["workers"] == 0
    assert doc["revisits"] is None

    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    assert "rates (last 60s): done 2.0/s, failed 0.0/s" in capsys.readouterr().out


async def test_stats_show_the_revisit_schedule(redis_url: str, redis_client: aioredis.Redis,
                                              crawl_name: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await set_policy(redis_client, crawl_name, {"revisit": "fixed", "recrawl_after": 600,
                                                "per_host_delay": 0.0}, by="test", create=True)
    queue.configure(revisits=True)
    urls = [f"https://{h}.example/p" for h in "abcdef"]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    leases = []
    while len(leases) < 6:
        leases += await queue.lease("w1", 6 - len(leases), 60_000)
    await queue.ack("w1", [(lease, "ok") for lease in leases])
    # Two come due (one of them 2 minutes ago), one of those is brought back and revisited.
    first, second = leases[0], leases[1]
    now = (await redis_client.time())[0] * 1000
    for lease, at in ((first, now - 120_000), (second, now - 5)):
        await redis_client.zadd(queue.partitions[lease.partition].rv_due, {lease.id: at})
    assert await queue.is_empty() is False
    assert (await queue.promote())[0] == 2
    back = []
    while len(back) < 2:
        back += await queue.lease("w1", 2 - len(back), 60_000)
    await queue.ack("w1", [(back[0], "not_modified"), (back[1], "changed")])
    await redis_client.zadd(queue.partitions[first.partition].rv_due, {first.id: now - 5})

    assert await crawlq(redis_url, "stats", "--crawl", crawl_name, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    revisits = doc["revisits"]
    # The one due 5 ms ago is leased within a second, or within ten on a loaded machine.
    assert revisits.pop("late_p50_s") in (1.0, 10.0)
    assert revisits == {"scheduled": 6, "due": 1, "revisits": 2, "late_p99_s": 600.0,
                        "not_modified": 1, "unchanged": 0, "changed": 1}
    assert await crawlq(redis_url, "stats", "--crawl", crawl_name) == 0
    assert ("revisits: 6 scheduled, 1 due now, 2 brought back (late p50 <= 1s, p99 <= 600s);"
            " found not_modified 1, unchanged 0, changed 1") in capsys.readouterr().out


def test_rates_edge_cases() -> None:
    assert rates([]) is None
    assert rates([{"t": 10, "done": 5}]) is None
    assert rates([{"t": 10, "done": 5}, {"t": 10, "done": 1}]) is None  # no time passed
    # Fewer than 60 s of history: the oldest snapshot is the base.
    assert rates([{"t": 30, "done": 50}, {"t": 20, "done": 10}, {"t": 10, "done": 0}]) == {
        "window_s": 20.0, "done_per_s": 2.5}


async def test_stats_of_an_unknown_crawl_is_a_usage_error(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "stats", "--crawl", "no-such-crawl") == 2
    assert "no crawl named 'no-such-crawl'" in capsys.readouterr().err


async def test_workers_lists_live_ones_with_ages_on_the_redis_clock(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl,
        capsys: pytest.CaptureFixture[str]) -> None:
    registry = WorkerRegistry(redis_client, crawl.name, "w-live", ttl_s=30)
    await registry.beat(in_flight=17, done=120, failed=3, state="running")
    keys = CrawlKeys.build(crawl.name)
    await redis_client.zadd(keys.workers, {"w-gone": 1})  # a ghost: no hash
    assert await crawlq(redis_url, "workers", "--crawl", crawl.name, "--json") == 0
    [w] = json.loads(capsys.readouterr().out)
    assert (w["id"], w["in_flight"], w["done"], w["failed"], w["state"]) == (
        "w-live", 17, 120, 3, "running")
    assert w["pid"] == os.getpid() and w["host"] == socket.gethostname()
    assert 0 <= w["heartbeat_age_s"] < 5 and w["stale"] is False
    # Readers never write: the ghost goes at the next heartbeat of any worker.
    assert await redis_client.zscore(keys.workers, "w-gone") is not None
    await registry.beat(in_flight=0, done=130, failed=3, state="running")
    assert await redis_client.zrange(keys.workers, 0, -1) == [b"w-live"]

    assert await crawlq(redis_url, "workers", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert "w-live" in out and str(os.getpid()) in out and "(late)" not in out
    assert await crawlq(redis_url, "stats", "--crawl", crawl.name) == 0
    assert "live workers: 1" in capsys.readouterr().out


async def test_dead_ls_filters_and_limits(redis_url: str, crawl: Crawl,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--json") == 0
    dead = json.loads(capsys.readouterr().out)
    assert sorted(d["id"] for d in dead) == sorted(i for ids in crawl.dead.values() for i in ids)
    assert all(d["url"].startswith("https://cli.example/") for d in dead)
    assert {d["reason"] for d in dead} == {"http_5xx", "redirect_loop"}

    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--reason",
                        "http_5xx", "--json") == 0
    assert sorted(d["id"] for d in json.loads(capsys.readouterr().out)) == sorted(
        crawl.dead["http_5xx"])
    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name, "--limit", "1",
                        "--json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 1

    assert await crawlq(redis_url, "dead", "ls", "--crawl", crawl.name) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 3 and "redirect_loop" in out and "HTTP 503" in out


async def test_dead_requeue_by_id_and_by_reason(redis_url: str, crawl: Crawl,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    q = crawl.queue
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name,
                        crawl.dead["redirect_loop"][0]) == 0
    assert "requeued 1 of 1" in capsys.readouterr().out
    assert await q.state_of(crawl.dead["redirect_loop"][0]) == "pending"

    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name,
                        "--reason", "http_5xx") == 0
    assert "requeued 2 of 2" in capsys.readouterr().out
    assert [await q.state_of(i) for i in crawl.dead["http_5xx"]] == ["pending", "pending"]
    assert (await q.stats()).dead == 0

    # Nothing chosen, two choices, or a bad id: usage errors.
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name) == 2
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name, "--all",
                        "--reason", "x") == 2
    assert await crawlq(redis_url, "dead", "requeue", "--crawl", crawl.name, "zz") == 2


async def test_dead_purge_needs_yes(redis_url: str, crawl: Crawl,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    q = crawl.queue
    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--all") == 2
    assert "would purge 3 dead tasks" in capsys.readouterr().err
    assert (await q.stats()).dead == 3

    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--reason",
                        "redirect_loop", "--yes") == 0
    assert "purged 1 of 1" in capsys.readouterr().out
    assert await q.state_of(crawl.dead["redirect_loop"][0]) == "done"  # body gone, seen mark kept
    assert await crawlq(redis_url, "dead", "purge", "--crawl", crawl.name, "--all",
                        "--yes") == 0
    assert "purged 2 of 2" in capsys.readouterr().out
    s = await q.stats()
    assert (s.dead, s.dead_reasons.get("http_5xx", 0), s.pending) == (0, 0, 5)


async def test_crawls_lists_each_with_sizes(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = await LeasingQueue.open(redis_client, crawl_name + "-b")
    await other.enqueue([NewTask("https://b.example/", fingerprint("https://b.example/"))])
    assert await crawlq(redis_url, "crawls", "--json") == 0
    rows = {r["crawl"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[crawl.name]["states"] == {"pending": 5, "leased": 0, "waiting": 0, "dead": 3,
                                          "done": 4}
    assert rows[crawl.name]["enqueued"] == 12
    assert rows[crawl_name + "-b"]["states"]["pending"] == 1
    assert await crawlq(redis_url, "crawls") == 0
    out = capsys.readouterr().out
    assert crawl.name in out and crawl_name + "-b" in out


async def test_reset_deletes_one_crawl_and_nothing_else(
        redis_url: str, redis_client: aioredis.Redis, crawl: Crawl, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Crawls whose names extend this one's ("." is a regex metacharacter; glob ones are
    # not allowed in crawl names).
    survivors = [await build_crawl(redis_client, crawl_name + "x", partitions=3),
                 await build_crawl(redis_client, crawl_name + ".b", partitions=1)]
    await redis_client.set("unrelated:key", b"1")

    before = {s.name: await keys_of(redis_client, s.name) for s in survivors}
    assert all(before.values())
    assert await keys_of(redis_client, crawl.name)

    assert await crawlq(redis_url, "reset", "--crawl", crawl.name) == 2
    assert "would delete" in capsys.readouterr().err
    assert await keys_of(redis_client, crawl.name)

    assert await crawlq(redis_url, "reset", "--crawl", crawl.name, "--yes") == 0
    assert "deleted" in capsys.readouterr().out
    assert await keys_of(redis_client, crawl.name) == set()
    assert not await redis_client.sismember(CRAWLS, crawl.name)
    for s in survivors:
        assert await keys_of(redis_client, s.name) == before[s.name]
        assert await redis_client.sismember(CRAWLS, s.name)
        assert (await s.queue.stats()).pending == 5
    assert await redis_client.get("unrelated:key") == b"1"


async def test_crawl_keys_names_each_partitions_due_key(
        redis_url: str, crawl: Crawl, capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "crawl", "keys", "--crawl", crawl.name, "--json") == 0
    assert [p["due"] for p in json.loads(capsys.readouterr().out)] == [
        pk.due for pk in crawl.queue.on.partitions]
    assert await crawlq(redis_url, "crawl", "keys", "--crawl", crawl.name) == 0
    assert capsys.readouterr().out.splitlines()[1] == \
        f"partition 1: {crawl.queue.on.partitions[1].due}"
    assert await crawlq(redis_url, "crawl", "keys", "--crawl", crawl.name + "-none") == 2


async def test_check(redis_url: str, crawl: Crawl, capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "check", "--crawl", crawl.name) == 0
    assert capsys.readouterr().out.startswith("ok: Redis at")
    closed = f"redis://127.0.0.1:{free_port()}/0"
    assert await crawlq(closed, "check", "--timeout", "2s") == 1
    out = capsys.readouterr().out
    assert out.startswith("unhealthy: cannot reach Redis at") and out.count("\n") == 1

    async with sample_site(pages=5) as base:
        assert await crawlq(redis_url, "check", "--http-url", f"{base}/page/1") == 0
        assert await crawlq(redis_url, "check", "--http-url", f"{base}/missing/0") == 1
        assert "HTTP 404" in capsys.readouterr().out
    assert await crawlq(redis_url, "check", "--http-url",
                        f"http://127.0.0.1:{free_port()}/healthz") == 1


async def test_check_shows_the_servers_durability_settings(
        redis_server: RedisServer, redis_url: str, crawl: Crawl,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert await crawlq(redis_url, "check", "--crawl", crawl.name) == 0
    ok, settings = capsys.readouterr().out.splitlines()
    assert ok.startswith("ok: Redis at")
    port = redis_server.port
    # The test server: no AOF, no snapshots (--save ""), no replicas.
    assert settings == (f"redis 127.0.0.1:{port}: eviction noeviction, AOF off (appendfsync "
                        "always), RDB off, replicas 0 (min-replicas-to-write 0), "
                        "hash-max-listpack-value 192")


@pytest.mark.integration
async def test_check_warns_of_a_listpack_value_too_low_for_the_history(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Redis's default hash-max-listpack-value (64) makes the history buckets hashtables:
    healthy still (exit 0), with a warning saying the cost and the setting."""
    with RedisServer(extra_args=("--hash-max-ziplist-value", "64")) as server:
        assert await crawlq(server.url, "check") == 0
    ok, settings, warning = capsys.readouterr().out.splitlines()
    assert ok.startswith("ok: Redis at") and settings.endswith("hash-max-listpack-value 64")
    assert warning.startswith("warning: Redis at 127.0.0.1:")
    assert "has hash-max-listpack-value 64: a done URL's history record" in warning
    assert "~188 B a done URL instead of ~132 B" in warning
    assert warning.endswith("set hash-max-listpack-value 192 (redis.conf, or CONFIG SET "
                            "hash-max-listpack-value 192)")


async def test_check_fails_on_a_redis_that_evicts_keys(
        evicting_redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """allkeys-lru deletes tasks when Redis is full: exit 1, one line saying what to set."""
    assert await crawlq(evicting_redis_url, "check") == 1
    problem, settings = capsys.readouterr().out.splitlines()
    assert problem.startswith("unhealthy: Redis at 127.0.0.1:")
    assert "has maxmemory-policy allkeys-lru: set maxmemory-policy noeviction" in problem
    assert "eviction allkeys-lru" in settings


async def test_check_says_unknown_for_settings_config_get_is_refused(
        evicting_redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The documented ACL user has INFO but no CONFIG (-@dangerous): the policy still
    reads, appendfsync, RDB and min-replicas-to-write read "unknown", no crash."""
    admin = aioredis.Redis.from_url(evicting_redis_url)
    user = f"u{os.getpid()}"
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "resetkeys", "~crawlq:*", "-@all", "+@read",
        "+@connection", "-@dangerous", "+info")
    try:
        url = evicting_redis_url.replace("redis://", f"redis://{user}:pw@")
        assert await crawlq(url, "check") == 1
        problem, settings = capsys.readouterr().out.splitlines()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
    assert "maxmemory-policy allkeys-lru" in problem
    assert settings.endswith("eviction allkeys-lru, AOF off (appendfsync unknown), RDB "
                             "unknown, replicas 0 (min-replicas-to-write unknown), "
                             "hash-max-listpack-value unknown")


async def test_unreachable_redis_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """Each command waits --redis-wait for Redis (10 s by default), then says so in one
    line: no traceback."""
    closed = f"redis://127.0.0.1:{free_port()}/0"
    # A task another test of this process left pending is destroyed when the collector
    # next runs, with an ERROR line on stderr (seen once under load): collected first.
    gc.collect()
    capsys.readouterr()
    for command in (["stats"], ["workers"], ["dead", "ls"], ["crawls"], ["hosts"],
                    ["traps"], ["crawl", "show"], ["reset", "--yes"], ["fsck"]):
        assert await crawlq(closed, *command, "--crawl", "x", "--redis-wait", "0.3s") == 3
        gc.collect()  # a task this command left pending says so now, in its stderr
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot reach Redis at" in err, (command, err)
        assert "gave up after" in err and "--redis-wait" in err


async def test_a_command_waits_for_a_redis_away_at_its_start(
        redis_server: RedisServer, crawl_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Redis gone for 2 s when the command connects: it waits, then answers."""
    async with outage_relay(redis_server.port) as relay:
        relay.arm(b"$4\r\nPING\r\n", for_s=2.0)
        assert await crawlq(relay.url, "crawls", "--json") == 0
        assert relay.fired.is_set() and relay.ended.is_set()
    assert json.loads(capsys.readouterr().out) is not None


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


async def _watch(redis_url: str, crawl: str, *, every_s: float | None = None,
                 sigint: str = "default") -> asyncio.subprocess.Process:
    """``crawlq stats --watch`` as its own process; `every_s` replaces its 2 s pause (0:
    it is always in a Redis call); `sigint` "ignored": started as a script's background
    job is, SIGINT ignored."""
    code = "import sys; import console.cli as c; import console.cli.stats as s; "
    if every_s is not None:
        code += f"s.WATCH_EVERY_S = {every_s}; "
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code + "sys.exit(c.main())",
        "stats", "--watch", "--crawl", crawl, "--redis-url", redis_url, "--cluster", "no",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=_ignore_sigint if sigint == "ignored" else None)


async def _stop_watch(proc: asyncio.subprocess.Process, sig: int, after_s: float) -> None:
    """Read frames (so the pipe never fills) until the first, wait `after_s`, send `sig`;
    the watch must exit 0 within 10 s. Start-up under load is slow (no timing asserted)."""
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readuntil(b"Ctrl-C quits"), 60)
    assert first.startswith(b"\x1b[H\x1b[J") and b"pending" in first

    async def drain() -> None:
        assert proc.stdout is not None
        while await proc.stdout.read(65536):
            pass

    reader = asyncio.ensure_future(drain())
    await asyncio.sleep(after_s)
    proc.send_signal(sig)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader
    assert proc.stderr is not None
    assert proc.returncode == 0, (await proc.stderr.read()).decode()[-2000:]


@pytest.mark.parametrize(("sig", "sigint"), [(signal.SIGINT, "default"),
                                             (signal.SIGINT, "ignored"),
                                             (signal.SIGTERM, "default")],
                         ids=["ctrl-c", "ctrl-c-background-job", "sigterm"])
async def test_stats_watch_redraws_until_ctrl_c(redis_url: str, crawl: Crawl, sig: int,
                                                sigint: str) -> None:
    """Ctrl-C (or SIGTERM) ends the watch with exit 0, also when the watch was started
    with SIGINT ignored, as a shell script's background job is."""
    await _stop_watch(await _watch(redis_url, crawl.name, sigint=sigint), sig, 0)


async def test_stats_watch_stops_on_ctrl_c_in_the_middle_of_a_read(
        redis_url: str, crawl: Crawl) -> None:
    """With no pause between frames each Ctrl-C lands in a Redis call. Cancelling the
    call was how the watch stopped, and Python 3.11's wait_for (under redis-py) swallowed
    a cancellation now and then: the watch kept drawing. Four at once, at random times."""
    rng = random.Random()
    watches = [await _watch(redis_url, crawl.name, every_s=0) for _ in range(4)]
    await asyncio.gather(*(_stop_watch(w, signal.SIGINT, rng.uniform(0.05, 0.5))
                           for w in watches))


# -- crawl names ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["default", "news", "a", "A1", "0", "news-2026.06_x",
                                  "x" * 64])
def test_valid_crawl_names(name: str) -> None:
    assert validate_crawl_name(name) == name
    assert CrawlKeys.build(name).meta == f"crawlq:{{{name}}}:meta"


@pytest.mark.parametrize("name", ["", "bad name", "bad:name", "a*", "a{b}", "a?", "[a]",
                                  "-a", ".a", "_a", "x" * 65, "ä", "a/b", "a\n", "a\\b"])
def test_invalid_crawl_names(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid crawl name") as info:
        validate_crawl_name(name)
    assert CRAWL_NAME_RULE in str(info.value)
    with pytest.raises(ConfigError):  # the key schema applies the same rule
        CrawlKeys.build(name)


_CRAWLQ = ("-c", "import sys; from console.cli import main; sys.exit(main())")
# Each command that takes a crawl name: its argv, and the env variable of that name.
_COMMANDS = {
    "crawlq-producer": (("-m", "producer", "--url", "https://a.example/"), "CRAWLQ_CRAWL"),
    "crawlq-producer --dry-run": (("-m", "producer", "--dry-run", "--url",
                                   "https://a.example/"), "CRAWLQ_CRAWL"),
    "crawlq-consumer": (("-m", "consumer", "--http-port", "-1"), "CRAWLQ_CRAWL"),
    "crawlq stats": ((*_CRAWLQ, "stats"), "CRAWLQ_CRAWL"),
    "crawlq reset": ((*_CRAWLQ, "reset", "--yes"), "CRAWLQ_CRAWL"),
    "crawlq demo": ((*_CRAWLQ, "demo"), "CRAWLQ_DEMO_CRAWL"),
}


async def _run(argv: tuple[str, ...], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("redis_up", [True, False], ids=["redis_up", "redis_down"])
@pytest.mark.parametrize("command", sorted(_COMMANDS))
async def test_invalid_crawl_name_exits_2_before_any_connection(
        command: str, redis_up: bool, redis_url: str) -> None:
    """By flag and by env variable: one line saying the rule, exit 2, no traceback.

    With Redis down (a port nothing listens on) it is still 2, not 3, and the consumer
    does not wait for Redis: the name is checked before any connection.
    """
    url = redis_url if redis_up else f"redis://127.0.0.1:{free_port()}/0"
    argv, env_name = _COMMANDS[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env |= {"PYTHONPATH": str(ROOT), "REDIS_URL": url, "CRAWLQ_CLUSTER": "no"}
    runs = [_run((*argv, "--crawl", "bad name"), env),
            _run((*argv, "--crawl", "a*"), env),
            _run(argv, {**env, env_name: "bad:name"})]
    for (code, out, err), shown in zip(await asyncio.gather(*runs),
                                       ["'bad name'", "'a*'", "'bad:name'"], strict=True):
        assert code == 2, (out, err)
        assert "Traceback" not in err
        [line] = err.splitlines()
        assert f"invalid crawl name {shown}" in line and CRAWL_NAME_RULE in line
        assert ("--crawl" if shown != "'bad:name'" else env_name) in line


def test_crawl_name_rule_is_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        consumer_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert " ".join(CRAWL_NAME_RULE.split()) in help_text


# -- --allow-domains -----------------------------------------------------------------------


def test_allow_domains_are_compared_in_their_canonical_form(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = consumer_parser().parse_args(["--allow-domains", "Bücher.example.",
                                         "--allow-domains", "EXAMPLE.com"])
    assert settings_from_args(args).allow_domains == ("xn--bcher-kva.example", "example.com")
    monkeypatch.setenv("CRAWLQ_ALLOW_DOMAINS", "☃.net, .Example.org")
    assert settings_from_args(consumer_parser().parse_args([])).allow_domains == (
        "xn--n3h.net", "example.org")
    monkeypatch.delenv("CRAWLQ_ALLOW_DOMAINS")
    with pytest.raises(ConfigError, match=re.escape("invalid domain 'a..b'")):
        settings_from_args(consumer_parser().parse_args(["--allow-domains", "a..b"]))
    # The consumer exits 2 on it, before any connection.
    assert consumer_main(["--allow-domains", "https://example.com/", "--http-port", "-1",
                          "--redis-url", f"redis://127.0.0.1:{free_port()}/0"]) == 2
    assert "invalid domain 'https://example.com/'" in capsys.readouterr().err


# -- hosts, pause, resume: run as the command -----------------------------------------------

def _command_env(redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    return env | {"PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "CRAWLQ_CLUSTER": "no"}


async def _crawlq_command(redis_url: str, *args: str) -> str:
    """``crawlq <args>`` in its own process against the test Redis; its stdout (exit 0)."""
    code, out, err = await _run((*_CRAWLQ, *args), _command_env(redis_url))
    assert code == 0, (args, out, err)
    assert "Traceback" not in err
    return out


async def test_pause_and_resume_as_commands(redis_url: str, redis_client: aioredis.Redis,
                                            crawl: Crawl) -> None:
    out = await _crawlq_command(redis_url, "pause", "--crawl", crawl.name)
    assert out == f"crawl {crawl.name} paused: consumers lease nothing\n"
    assert [await redis_client.hget(pk.conf, "paused") for pk in crawl.queue.partitions] \
        == [b"1", b"1"]
    paused = await crawl.queue.lease_turns("w2", 10, 60_000)
    assert paused.paused and paused.leases == []
    assert "PAUSED" in await _crawlq_command(redis_url, "stats", "--crawl", crawl.name)

    out = await _crawlq_command(redis_url, "resume", "--crawl", crawl.name)
    assert out == f"crawl {crawl.name} resumed\n"
    assert [await redis_client.hget(pk.conf, "paused") for pk in crawl.queue.partitions] \
        == [b"0", b"0"]
    deadline = time.monotonic() + 10  # the host's delay may hold its next turn back
    while not (resumed := await crawl.queue.lease_turns("w2", 10, 60_000)).leases:
        assert not resumed.paused and time.monotonic() < deadline
        await asyncio.sleep(min(resumed.wait_s, 0.1))
    assert not resumed.paused


async def test_hosts_list_set_and_block_as_commands(redis_url: str,
                                                    redis_client: aioredis.Redis,
                                                    crawl: Crawl) -> None:
    q = crawl.queue
    urls = [f"http://other.example:8080/{i}" for i in range(7)]
    await q.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    pk = q.partitions[q.partition_of("cli.example")]

    # The table, biggest queue first: other.example:8080 (7 queued), then cli.example
    # (5 queued, 4 done, 3 failed attempts).
    out = await _crawlq_command(redis_url, "hosts", "--crawl", crawl.name)
    lines = out.splitlines()
    assert lines[0].split() == ["host", "queued", "flight", "done", "errors", "next",
                                "delay", "conc", "budget", "level", "pushbk", "blocked"]
    assert lines[1].split()[:5] == ["other.example:8080", "7", "0", "0", "0"]
    assert lines[2].split()[:5] == ["cli.example", "5", "0", "4", "3"]
    assert lines[-1] == "hosts 1-2 of 2"
    doc = json.loads(await _crawlq_command(redis_url, "hosts", "--crawl", crawl.name,
                                           "--json", "--sort", "errors", "--limit", "1"))
    assert doc["total"] == 2
    [row] = doc["hosts"]
    assert (row["host"], row["queued"], row["in_flight"], row["done"], row["errors"],
            row["budget"]) == ("cli.example", 5, 0, 4, 3, None)
    assert row["last_request_ms"] is not None
    # In flight, done and last request are shown, but no index sorts them: refused by name.
    for column in ("in_flight", "done", "last_request"):
        code, out, err = await _run((*_CRAWLQ, "hosts", "--crawl", crawl.name, "--sort",
                                     column), _command_env(redis_url))
        assert (code, out) == (2, ""), err
        assert "Traceback" not in err
        assert f"hosts can't be sorted by {column}: it is shown, but only queued, errors, " \
               "next_allowed, delay, blocked_until are indexed" in err

    # set: the host's settings in its record, its delay in h:delay.
    out = await _crawlq_command(redis_url, "hosts", "set", "https://CLI.example/x",
                                "--crawl", crawl.name, "--delay", "2.5s",
                                "--concurrency", "3", "--budget", "100")
    assert out == "host cli.example: delay 2.5s, concurrency 3, budget 100\n"
    record = await host_record(redis_client, pk, "cli.example")
    assert (record.delay, record.conc, record.budget) == (2500, 3, 100)
    assert await redis_client.zscore(pk.delay, "cli.example") == 2500
    row = json.loads(await _crawlq_command(redis_url, "hosts", "--crawl", crawl.name,
                                           "--json", "--sort", "delay", "--limit", "1"))
    assert row["hosts"][0] | {"host": "cli.example", "delay_ms": 2500, "concurrency": 3,
                              "budget": 100} == row["hosts"][0]
    out = await _crawlq_command(redis_url, "hosts", "set", "cli.example", "--crawl",
                                crawl.name, "--clear", "delay", "--clear", "budget")
    assert out == "host cli.example: delay 0s, concurrency 3, budget none\n"
    record = await host_record(redis_client, pk, "cli.example")
    assert (record.delay, record.conc, record.budget) == (None, 3, None)
    assert await redis_client.zscore(pk.delay, "cli.example") is None

    # block: h:blocked holds the end (Redis clock), the host's turn waits for it, and a
    # lease serves only the other host; --for 0 unblocks.
    now_ms = int((await redis_client.time())[0]) * 1000
    out = await _crawlq_command(redis_url, "hosts", "block", "cli.example", "--crawl",
                                crawl.name, "--for", "10m")
    assert out == "host cli.example: blocked for 600s\n"
    until = await redis_client.zscore(pk.blocked, "cli.example")
    assert until is not None and now_ms + 599_000 <= until <= now_ms + 610_000
    assert (await redis_client.zscore(pk.due, "cli.example") or 0) >= until
    leased = await q.lease("w2", 20, 60_000)
    assert {lease.task.url.split("/")[2] for lease in leased} == {"other.example:8080"}
    await q.release("w2", leased)
    out = await _crawlq_command(redis_url, "hosts", "block", "cli.example", "--crawl",
                                crawl.name, "--for", "0")
    assert out == "host cli.example: unblocked\n"
    assert await redis_client.zscore(pk.blocked, "cli.example") is None
    leased = await q.lease("w2", 20, 60_000)
    assert "cli.example" in {lease.task.url.split("/")[2] for lease in leased}
