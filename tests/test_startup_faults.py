"""Redis away at each start-up step (issue 45), made deterministic by a relay that drops
Redis at the step's own command (tests/support/outage.py): for 3 s, every command,
process and step waits, then does its work and exits 0 without a traceback; for good,
it gives up after its --redis-wait in one line and exits 3.

The consumer (each of its steps in turn), the producer (each of its own) and `crawlq
run` (its own step and its children's) run as the real processes. Only 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis.asyncio as aioredis
from procs import JsonLog
from support.failover import script_sha
from support.outage import RedisOutage, outage_relay
from support.routes import page, serve

from common.exitcodes import EXIT_REDIS
from common.policy import CrawlPolicy, ensure_policy
from common.queue import LeasingQueue, NewTask
from common.redis.server import RedisServer, free_port
from common.urls.canonical import fingerprint

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
PAGES = 3

def cmd(*words: bytes) -> bytes:
    """How a command's words go out (RESP bulk strings): a marker no other command's
    bytes hold (a script's source names lib/memory, for one)."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


class Step(NamedTuple):
    """A start-up step as a process logs it, the command that begins it (`marker`), the
    command it comes after, which of those commands it is, and whose step it is."""

    name: str
    marker: bytes
    after: bytes | None = None
    nth: int = 1
    who: str = ""

    def arm(self, relay: RedisOutage, for_s: float) -> None:
        relay.arm(self.marker, occurrence=self.nth, after=self.after, for_s=for_s)


CONSUMER_STEPS = [
    Step("connect", cmd(b"INFO", b"cluster")),  # INFO cluster: what kind of Redis
    Step("crawl", cmd(b"EXISTS")),  # the crawl (converted, its policy) exists
    Step("server settings", cmd(b"INFO", b"memory")),  # INFO memory: eviction, persistence
    Step("policy", cmd(b"HGETALL"), cmd(b"CONFIG")),  # the policy given to the partitions
    Step("live policy", cmd(b"HGETALL"), cmd(b"CONFIG"), 2),  # the policy it works under
    # SCRIPT LOAD of every script it calls (robots_claim's is loaded nowhere before: a
    # script loaded by a NOSCRIPT reply in an earlier step is not this step's)
    Step("scripts", b"-- robots_claim.lua:"),
    Step("registry", script_sha("worker_beat")),  # itself in the worker registry
]
PRODUCER_STEPS = [
    Step("connect", cmd(b"INFO", b"cluster")),
    Step("lock", b":lock:producer\r\n"),
    Step("crawl", b":meta\r\n"),
    Step("policy", cmd(b"HGETALL")),
    Step("scripts", b"-- refresh_lock.lua:"),  # the lock's, loaded with the others
]


class Proc(JsonLog):
    def __init__(self, name: str, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.name, self.proc, self.log_path = name, proc, log_path


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
    return {**clean, "PYTHONPATH": str(ROOT), "CRAWLQ_LOG_FORMAT": "json"}


async def spawn(tmp_path: Path, name: str, *argv: str, stdout: Path | None = None) -> Proc:
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log, (stdout or Path(os.devnull)).open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, env=env(), cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=log)
    return Proc(name, proc, log_path)


def waited(child: JsonLog) -> set[str]:
    """The steps a child logged a failed try of (``redis_unreachable``)."""
    return {e["step"] for e in child.events() if e.get("event") == "redis_unreachable"}


@pytest.fixture
async def relay(redis_server: RedisServer) -> Any:
    async with outage_relay(redis_server.port) as r:
        yield r


async def crawl_of(redis_client: aioredis.Redis, crawl: str, base: str) -> LeasingQueue:
    """A crawl of PAGES pages of the site at `base`: no robots.txt, no delay."""
    await ensure_policy(redis_client, crawl, CrawlPolicy(
        per_host_delay=0, per_host_concurrency=0, ignore_robots=True), by="test")
    queue = await LeasingQueue.open(redis_client, crawl)
    urls = [f"{base}/p/{i}" for i in range(PAGES)]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    return queue


async def consumer(tmp_path: Path, relay: RedisOutage, crawl: str, wait: str) -> Proc:
    return await spawn(tmp_path, "consumer", "-m", "consumer", "--redis-url", relay.url,
                       "--crawl", crawl, "--exit-when-empty", "--empty-grace", "0",
                       "--redis-wait", wait, "--http-port", "-1", "--allow-private",
                       "--output", str(tmp_path / "out"), "--worker-id", "w-startup")


def assert_no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-3000:]


# -- the consumer ------------------------------------------------------------------------


@pytest.mark.parametrize("step", CONSUMER_STEPS, ids=[s.name for s in CONSUMER_STEPS])
async def test_a_consumer_waits_through_redis_gone_at_each_start_up_step(
        relay: RedisOutage, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        step: Step) -> None:
    async with serve({"/p/{i}": page}) as site:
        queue = await crawl_of(redis_client, crawl_name, site.base)
        step.arm(relay, 3.0)
        c = await consumer(tmp_path, relay, crawl_name, "30s")
        code = await c.wait(60)
    assert_no_traceback(c.log_text())
    assert code == 0, c.log_text()[-3000:]
    assert relay.fired.is_set() and relay.ended.is_set(), relay.seen
    assert waited(c) == {step.name}, (waited(c), relay.seen)
    stats = await queue.stats()
    assert stats.done == PAGES, stats


@pytest.mark.parametrize("step", CONSUMER_STEPS, ids=[s.name for s in CONSUMER_STEPS])
async def test_a_consumer_gives_up_on_redis_gone_for_good_in_one_line(
        relay: RedisOutage, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        step: Step) -> None:
    await crawl_of(redis_client, crawl_name, "http://127.0.0.1:9")
    step.arm(relay, 0)
    c = await consumer(tmp_path, relay, crawl_name, "1s")
    assert await c.wait(60) == EXIT_REDIS, c.log_text()[-3000:]
    assert_no_traceback(c.log_text())
    errors = [e for e in c.events() if e.get("level") in ("ERROR", "CRITICAL")]
    assert [e["event"] for e in errors] == ["redis_unreachable_giving_up"], errors
    [gave_up] = errors
    assert gave_up["step"] == step.name and gave_up["exit_code"] == EXIT_REDIS
    assert "--redis-wait" in gave_up["advice"] and 1 <= gave_up["waited_s"] < 6


# -- the producer ------------------------------------------------------------------------


async def producer(tmp_path: Path, relay: RedisOutage, crawl: str, wait: str, urls: Path,
                   *flags: str) -> tuple[Proc, Path]:
    out = tmp_path / "producer.out"
    p = await spawn(tmp_path, "producer", "-m", "producer", "--redis-url", relay.url,
                    "--crawl", crawl, "--json", "--progress", "off", "--redis-wait", wait,
                    *flags, str(urls), stdout=out)
    return p, out


@pytest.mark.parametrize("step", PRODUCER_STEPS, ids=[s.name for s in PRODUCER_STEPS])
async def test_a_producer_waits_through_redis_gone_at_each_start_up_step(
        relay: RedisOutage, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        step: Step) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"http://h{i}.test/p\n" for i in range(20)))
    step.arm(relay, 3.0)
    p, out = await producer(tmp_path, relay, crawl_name, "30s", urls, "--log-level", "DEBUG")
    code = await p.wait(60)
    assert_no_traceback(p.log_text())
    assert code == 0, p.log_text()[-3000:]
    assert relay.fired.is_set() and relay.ended.is_set(), relay.seen
    assert waited(p) == {step.name}, (waited(p), relay.seen)
    assert json.loads(out.read_text().splitlines()[-1])["enqueued"] == 20
    assert (await (await LeasingQueue.existing(redis_client, crawl_name)).stats()).pending == 20


@pytest.mark.parametrize("step", PRODUCER_STEPS, ids=[s.name for s in PRODUCER_STEPS])
async def test_a_producer_gives_up_on_redis_gone_for_good_in_one_line(
        relay: RedisOutage, crawl_name: str, tmp_path: Path, step: Step) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("http://h.test/p\n")
    step.arm(relay, 0)
    p, out = await producer(tmp_path, relay, crawl_name, "1s", urls, "--log-format", "text",
                            "--log-level", "WARNING")
    assert await p.wait(60) == EXIT_REDIS, p.log_text()[-3000:]
    lines = p.log_text().strip().splitlines()
    assert len(lines) == 1, p.log_text()
    assert "gave up after" in lines[0] and "--redis-wait" in lines[0], lines
    assert json.loads(out.read_text().splitlines()[-1])["exit_code"] == EXIT_REDIS


# -- crawlq run ----------------------------------------------------------------------------

TINY_SPIDER = '''
import os
from crawlq import Spider

BASE = os.environ["TINY_BASE"]
spider = Spider("tiny", start=[BASE + "/p/0"], item_key="n")


@spider.route()
async def page(response, ctx):
    n = int(response.url.rpartition("/")[2])
    ctx.emit({"n": n})
    if n + 1 < 4:
        ctx.follow(BASE + f"/p/{n + 1}")
'''

#: `crawlq run`'s own step (its crawl's policy), then its children's: the producer's
#: lock, the consumer's server settings and its scripts.
RUN_STEPS = [
    Step("policy", cmd(b"HGETALL"), who="crawlq run"),
    Step("lock", b":lock:producer\r\n", who="producer"),
    Step("server settings", cmd(b"INFO", b"memory"), who="consumer-1"),
    Step("scripts", b"-- robots_claim.lua:", who="consumer-1"),
]


@pytest.mark.parametrize("step", RUN_STEPS, ids=[f"{s.who}-{s.name}" for s in RUN_STEPS])
async def test_crawlq_run_waits_through_redis_gone_at_its_and_its_childrens_start_up(
        relay: RedisOutage, crawl_name: str, tmp_path: Path, step: Step) -> None:
    spider = tmp_path / "tiny.py"
    spider.write_text(TINY_SPIDER)
    items = tmp_path / "items.jsonl"
    async with serve({"/p/{i}": page}) as site:
        step.arm(relay, 3.0)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
            "run", str(spider), "--allow-private", "--crawl", crawl_name, "--consumers", "1",
            "--set", "per_host_delay=0",
            "--output", str(tmp_path / "run"), "--out", str(items), "--timeout", "60",
            "--redis-wait", "30s",
            env={**env(), "REDIS_URL": relay.url, "TINY_BASE": site.base,
                 "CRAWLQ_LOG_FORMAT": "json"}, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 100)
    logs = {p.stem: p.read_text() for p in (tmp_path / "run" / "logs").glob("*.log")}
    text = stdout.decode() + stderr.decode()
    assert_no_traceback(text, *logs.values())
    assert proc.returncode == 0, (text, logs)
    assert relay.fired.is_set() and relay.ended.is_set(), relay.seen
    if step.who == "crawlq run":
        assert "waiting for Redis at" in stdout.decode(), text
    elif step.who.startswith("consumer"):
        steps = {json.loads(line).get("step") for line in logs[step.who].splitlines()
                 if '"redis_unreachable"' in line}
        assert steps == {step.name}, (steps, " | ".join(relay.seen), logs[step.who][-2000:])
    assert sorted(json.loads(line)["n"] for line in items.read_text().splitlines()) == [
        0, 1, 2, 3]


@pytest.mark.integration
@pytest.mark.parametrize("argv", [
    ["run", str(ROOT / "examples" / "demo_spider.py"), "--redis-wait", "1s"],
    ["demo"],  # its default wait: 10 s (the command its own summary suggests)
], ids=["run", "demo"])
async def test_crawlq_run_and_demo_with_redis_unreachable_say_so_in_one_line(
        tmp_path: Path, argv: list[str]) -> None:
    closed = f"redis://crawler:s3cr3t@127.0.0.1:{free_port()}/0"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
        *argv, "--output", str(tmp_path / "out"), env={**env(), "REDIS_URL": closed},
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    out, err = stdout.decode(), stderr.decode()
    assert proc.returncode == EXIT_REDIS, (out, err)
    assert_no_traceback(out, err)
    [line] = err.strip().splitlines()
    assert f"cannot reach Redis at redis://***@127.0.0.1:{closed.rsplit(':', 1)[1]}" in line
    assert "gave up after" in line and "s3cr3t" not in out + err
    assert "waiting for Redis at" in out
