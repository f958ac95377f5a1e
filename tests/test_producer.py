"""The producer end to end: real Redis, local files and a local sample site, no mocks.

The CLI runs in-process (``main_async``) where that is fast, and as a subprocess where
a real process is the point (SIGKILL mid-run, two producers at once, SIGTERM).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.clock import window_passed

from common.errors import SourceError
from common.frontier.hosts import Frontier
from common.keys import CRAWLS, CrawlKeys, PartitionKeys
from common.policy import PolicyError, create_policy, read_policy, set_policy
from common.queue import CrawlSettings, DedupMode, LeasingQueue, existing_settings, partition_keys
from common.redis.adapter import use_hiredis_packer
from common.redis.server import free_port
from common.tasks.task import decode_entry, expand_entry
from common.urls.canonical import fingerprint, task_id
from console.demo.site import sample_site
from producer.cli import main_async
from producer.lock import LockHeldError, ProducerLock
from producer.sitemaps import parse_sitemap

ROOT = Path(__file__).resolve().parent.parent


def argv(redis_url: str, crawl: str, *rest: str) -> list[str]:
    return ["--redis-url", redis_url, "--crawl", crawl, "--cluster", "no", "--progress", "off",
            *rest]


async def produce(redis_url: str, crawl: str, *rest: str, stdin: Any = None
                  ) -> tuple[int, str]:
    out = io.StringIO()
    code = await main_async(argv(redis_url, crawl, *rest), out=out, stdin=stdin)
    return code, out.getvalue()


async def produce_json(redis_url: str, crawl: str, *rest: str, stdin: Any = None
                       ) -> tuple[int, dict[str, Any]]:
    code, out = await produce(redis_url, crawl, "--json", *rest, stdin=stdin)
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # exactly one JSON object
    return code, json.loads(lines[0])


async def urls_in_redis(client: aioredis.Redis, crawl: str, partitions: int = 1) -> list[str]:
    """Every task URL stored for the crawl (all partitions), as a sorted list."""
    urls = []
    for pk in partition_keys(crawl, await existing_settings(client, crawl)):
        for host in await client.zrange(pk.queued, 0, -1):
            entries = [*await client.lrange(pk.host_queue(host.decode()), 0, -1),
                       *await client.zrange(pk.host_prio(host.decode()), 0, -1)]
            urls += [decode_entry(expand_entry(e, host.decode())).url for e in entries]
    return sorted(urls)


async def crawl_key_count(client: aioredis.Redis, crawl: str) -> int:
    n = 0
    for pattern in (f"crawlq:\\{{{crawl}\\}}:*", f"crawlq:\\{{{crawl}:*"):
        async for _ in client.scan_iter(match=pattern, count=10_000):
            n += 1
    return n


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


async def spawn(redis_url: str, crawl: str, *rest: str,
                stdin: int = asyncio.subprocess.DEVNULL) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "producer", *argv(redis_url, crawl, *rest), cwd=ROOT,
        env=subprocess_env(), stdin=stdin,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def wait_until(check: Callable[[], Awaitable[Any]], what: str,
                     within: float = 30.0) -> None:
    """Poll `check` until it is truthy; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not within {within:g}s: {what}"
        await asyncio.sleep(0.01)


def ttl_rose(client: aioredis.Redis, key: str) -> Callable[[], Awaitable[bool]]:
    """A check that is true once the key's TTL is seen higher than its lowest reading so
    far: only a PEXPIRE (a refresh) raises a TTL."""
    lowest: list[int] = []

    async def check() -> bool:
        ttl = int(await client.pttl(key))
        assert ttl > 0, "the lock expired"
        if lowest and ttl > lowest[0]:
            return True
        lowest[:] = [min([ttl, *lowest])]
        return False

    return check


async def is_gone(client: aioredis.Redis, key: str) -> bool:
    return not await client.exists(key)


def write_urls(path: Path, n: int, *, start: int = 0) -> list[str]:
    urls = [f"https://site{i % 97}.example.com/item/{i}?x={i % 7}" for i in range(start, start + n)]
    path.write_text("".join(u + "\n" for u in urls))
    return urls


# -- canonicalization and rejects ---------------------------------------------------------

GARBAGE = [
    "",                                        # blank: skipped, not counted
    "# a comment",                             # skipped
    "   http://Example.COM:80/a/./b#frag",     # leading spaces -> http://example.com/a/b
    "javascript:alert(1)",                     # bad_scheme
    "file:///etc/passwd",                      # bad_scheme
    "ftp://ftp.example.com/x",                 # bad_scheme
    "http://user:s3cret-pw@example.com/",      # userinfo
    "http://exa\x01mple.com/",                 # control_chars
    "http://example.com/a\x7fb",               # control_chars
    "http://example.com/" + "a" * 10240,       # too_long (a 10 KB URL)
    "http://bücher.example/straße",            # IDN -> punycode host, escaped path
    "\thttps://例え.テスト/パス",                # IDN + leading tab
    "http://example.org./path",                # trailing-dot host
    "HTTP://EXAMPLE.COM/a/b",                  # another spelling of line 3: duplicate
    "http://example.com/a/b?",                 # and another
    "https://example.com/q?b=2&a=1",           # query order kept
    "http://",                                 # no_host
    "example.com/no-scheme",                   # bad_scheme
    "http://ex ample.com/",                    # invalid_host
    "http://example.com:99999/",               # invalid_port
    "   ",                                     # blank: skipped
]
GARBAGE_ACCEPTED = sorted([
    "http://example.com/a/b",
    "http://xn--bcher-kva.example/stra%C3%9Fe",
    "https://xn--r8jz45g.xn--zckzah/%E3%83%91%E3%82%B9",
    "http://example.org/path",
    "https://example.com/q?b=2&a=1",
])
GARBAGE_REJECTED = {"bad_scheme": 4, "userinfo": 1, "control_chars": 2, "too_long": 1,
                    "no_host": 1, "invalid_host": 1, "invalid_port": 1}


async def test_garbage_input_is_normalized_or_rejected_by_reason(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    src = tmp_path / "garbage.txt"
    src.write_text("\n".join(GARBAGE) + "\n", encoding="utf-8")
    rejects = tmp_path / "rejects.jsonl"
    code, s = await produce_json(redis_url, crawl_name, "--reject-file", str(rejects), str(src))
    assert code == 0
    assert s["read"] == len(GARBAGE) - 3  # two blank lines and a comment are skipped
    assert s["invalid_by_reason"] == GARBAGE_REJECTED
    assert s["invalid"] == sum(GARBAGE_REJECTED.values())
    assert s["enqueued"] == len(GARBAGE_ACCEPTED)
    assert s["duplicates"] == 2
    assert await urls_in_redis(redis_client, crawl_name) == GARBAGE_ACCEPTED

    lines = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert len(lines) == s["invalid"]
    assert {x["reason"] for x in lines} == set(GARBAGE_REJECTED)
    assert lines[0] == {"origin": str(src), "line": 4, "reason": "bad_scheme",
                        "message": "scheme 'javascript' is not http or https",
                        "url": "javascript:alert(1)"}
    assert "s3cret-pw" not in rejects.read_text()  # credentials never written
    assert max(len(x["url"]) for x in lines) <= 2048


async def test_text_summary_shows_first_rejects_without_credentials(
        tmp_path: Path, redis_url: str, crawl_name: str) -> None:
    src = tmp_path / "garbage.txt"
    src.write_text("\n".join(GARBAGE) + "\n", encoding="utf-8")
    code, out = await produce(redis_url, crawl_name, str(src))
    assert code == 0
    assert f"crawl {crawl_name}: read 18, invalid 11, duplicates 2, enqueued 5" in out
    assert "invalid by reason: bad_scheme 4" in out
    assert f"{src}:4: bad_scheme: scheme 'javascript' is not http or https" in out
    assert out.count(f"{src}:") == 5  # the first five
    assert "s3cret-pw" not in out


async def test_spellings_of_one_url_make_one_task(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    spellings = ["http://a.example/x", "HTTP://A.EXAMPLE:80/x#top", "http://a.example/./x",
                 "http://a.example/y/../x", "  http://A.example/%78  "]
    code, s = await produce_json(redis_url, crawl_name,
                                 *(arg for u in spellings for arg in ("--url", u)))
    assert code == 0
    assert (s["enqueued"], s["duplicates"], s["invalid"]) == (1, 4, 0)
    assert await urls_in_redis(redis_client, crawl_name) == ["http://a.example/x"]


# -- idempotency ----------------------------------------------------------------------------


async def test_rerun_enqueues_nothing_and_says_so(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    src = tmp_path / "urls.txt"
    write_urls(src, 2500)
    code, s = await produce_json(redis_url, crawl_name, str(src))
    assert (code, s["enqueued"], s["duplicates"]) == (0, 2500, 0)
    assert s["notice"] is None

    code, out = await produce(redis_url, crawl_name, str(src))
    assert code == 0
    assert "duplicates 2500, enqueued 0" in out
    assert (f"nothing enqueued: all 2500 URLs were already seen in crawl {crawl_name}; use "
            f"`crawlq crawl set --crawl {crawl_name} recrawl_after=DURATION` to fetch the "
            "done ones again, or a new --crawl name") in out
    code, s = await produce_json(redis_url, crawl_name, str(src))
    assert (code, s["enqueued"], s["duplicates"]) == (0, 0, 2500)
    assert s["notice"].startswith("nothing enqueued: all 2500 URLs were already seen")
    stats = await (await LeasingQueue.existing(redis_client, crawl_name)).stats()
    assert stats.pending == 2500


async def test_recrawl_after_reenqueues_done_urls_only(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The window is the crawl policy's recrawl_after: the first run's --recrawl-after
    seeds it (that run creates the policy); a later run's flag does not change it, a
    `crawl set` does."""
    urls = [f"https://r.example/{i}" for i in range(5)]
    flags = [arg for u in urls for arg in ("--url", u)]
    code, s = await produce_json(redis_url, crawl_name, "--recrawl-after", "1s", *flags)
    assert s["enqueued"] == 5
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.policy.recrawl_after == 1
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    # The producer gave the crawl the default politeness (1 s, 2 a host): lease freely here.
    await Frontier(queue).set_defaults(delay_s=0, concurrency=0)
    leases = await queue.lease("w1", 3, 60_000)
    assert len(leases) == 3
    await queue.ack("w1", [(lease, "ok") for lease in leases])
    done = sorted(lease.task.url for lease in leases)

    await window_passed(redis_client, 1)  # past a 1 s window (seen marks: whole seconds)
    code, s = await produce_json(redis_url, crawl_name, *flags)  # the crawl's 1s, not 0
    assert code == 0
    # Done ones come back; the two still pending are not enqueued twice.
    assert (s["enqueued"], s["recrawled"], s["duplicates"]) == (3, 3, 2)
    leases = await queue.lease("w1", 10, 60_000)
    assert sorted(lease.task.url for lease in leases) == sorted(
        set(done) | (set(urls) - set(done)))
    await queue.ack("w1", [(lease, "ok") for lease in leases])

    await set_policy(redis_client, crawl_name, {"recrawl_after": 0}, by="test")
    await window_passed(redis_client, 1)
    code, s = await produce_json(redis_url, crawl_name, "--recrawl-after", "1s", *flags)
    assert (code, s["enqueued"], s["duplicates"]) == (0, 0, 5)  # no window: all seen
    await set_policy(redis_client, crawl_name, {"recrawl_after": 1}, by="test")
    code, s = await produce_json(redis_url, crawl_name, *flags)
    assert (code, s["enqueued"], s["recrawled"]) == (0, 5, 5)


async def test_the_producer_seeds_the_policy_then_follows_it(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The run that creates the crawl's policy seeds max_attempts and recrawl_after from
    its flags (logged `producer`); a later run with other flags stamps its tasks with
    the crawl's max_attempts and uses its window, and says so, one WARNING per flag it
    was given (--recrawl-after, left at its default, asks for nothing)."""
    caplog.set_level(logging.INFO, logger="producer")
    code, _ = await produce_json(redis_url, crawl_name, "--url", "https://s.example/1",
                                 "--max-attempts", "7", "--recrawl-after", "2h")
    assert code == 0
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 1
    assert (stored.policy.max_attempts, stored.policy.recrawl_after) == (7, 7200)
    assert [e["by"] for e in stored.log] == ["producer"]
    assert not [r for r in caplog.records if r.getMessage() == "crawl_policy_differs"]

    caplog.clear()
    code, _ = await produce_json(redis_url, crawl_name, "--url", "https://s.example/2",
                                 "--max-attempts", "2")
    assert code == 0
    warned = {(r.flag, r.flag_value, r.crawl_value): r.advice  # type: ignore[attr-defined]
              for r in caplog.records if r.getMessage() == "crawl_policy_differs"}
    assert set(warned) == {("--max-attempts", "2", "7")}
    assert (f"crawlq crawl set --crawl {crawl_name} max_attempts=2"
            in warned["--max-attempts", "2", "7"])
    assert all(r.levelno == logging.WARNING for r in caplog.records
               if r.getMessage() == "crawl_policy_differs")
    await set_policy(redis_client, crawl_name, {"max_attempts": 4}, by="test")
    code, _ = await produce_json(redis_url, crawl_name, "--url", "https://s.example/3",
                                 "--max-attempts", "2")
    assert code == 0
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    await Frontier(queue).set_defaults(delay_s=0, concurrency=0)
    leases = await queue.lease("w", 10, 60_000)
    assert sorted((lease.task.url, lease.task.max_attempts) for lease in leases) == [
        ("https://s.example/1", 7), ("https://s.example/2", 7), ("https://s.example/3", 4)]
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and [e["by"] for e in stored.log] == ["api", "test", "producer"]


@pytest.mark.parametrize("given", ["nothing", "flag", "env"])
async def test_the_producer_warns_only_for_the_policy_flags_it_was_given(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, *, given: str,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both of the crawl's values differ from the producer's defaults: a run given
    neither flag says nothing; one given --recrawl-after (flag or env) says so for it."""
    await create_policy(redis_client, crawl_name, {"max_attempts": 7, "recrawl_after": 7200},
                        by="test")
    rest = ["--url", "https://s.example/1"]
    if given == "flag":
        rest += ["--recrawl-after", "1h"]
    elif given == "env":
        monkeypatch.setenv("CRAWLQ_RECRAWL_AFTER", "1h")
    caplog.set_level(logging.INFO, logger="producer")
    code, _ = await produce_json(redis_url, crawl_name, *rest)
    assert code == 0
    warned = [(r.flag, r.flag_value, r.crawl_value)  # type: ignore[attr-defined]
              for r in caplog.records if r.getMessage() == "crawl_policy_differs"]
    assert warned == ([] if given == "nothing" else [("--recrawl-after", "3600s", "7200s")])
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and (stored.version, stored.policy.recrawl_after) == (1, 7200)


async def test_the_producer_flags_take_the_policys_rules(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-attempts and --recrawl-after are written and checked as the policy's values
    are: a bad one exits 2 naming the flag (or its variable), and writes nothing."""
    for args, shown in ((("--max-attempts", "0"), "--max-attempts: must be a whole number "
                                                 ">= 1, got 0"),
                        (("--max-attempts", "two"), "not a whole number: 'two'"),
                        (("--recrawl-after", "soon"), "not a duration: 'soon'")):
        code, out = await produce(redis_url, crawl_name, "--url", "https://s.example/", *args)
        assert (code, out) == (2, ""), args
        assert shown in capsys.readouterr().err
    monkeypatch.setenv("CRAWLQ_MAX_ATTEMPTS", "0")
    code, out = await produce(redis_url, crawl_name, "--url", "https://s.example/")
    assert (code, out) == (2, "")
    assert "CRAWLQ_MAX_ATTEMPTS: must be a whole number >= 1, got 0" in capsys.readouterr().err
    assert await read_policy(redis_client, crawl_name) is None


async def test_killed_mid_run_then_rerun_enqueues_exactly_the_missing_urls(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    src = tmp_path / "big.txt"
    urls = write_urls(src, 100_000)
    proc = await spawn(redis_url, crawl_name, "--enqueue-batch", "500", str(src))
    stats_key = PartitionKeys.build(crawl_name, 0).stats
    landed = 0
    for _ in range(1000):
        landed = int(await redis_client.hget(stats_key, "enqueued") or 0)
        if landed >= 5000 or proc.returncode is not None:
            break
        await asyncio.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the producer finished before it was killed"
    first = int(await redis_client.hget(stats_key, "enqueued") or 0)
    assert 5000 <= first < len(urls)
    # Its lock stays until the TTL runs out (<= 30 s); skip the wait for the test.
    lock = CrawlKeys.build(crawl_name).producer_lock
    assert 0 < await redis_client.pttl(lock) <= 30_000
    await redis_client.delete(lock)

    code, s = await produce_json(redis_url, crawl_name, str(src))
    assert code == 0
    assert s["enqueued"] == len(urls) - first
    assert s["duplicates"] == first
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    assert {await queue.state_of(task_id(fingerprint(u)), u) for u in urls[:20]} == {"pending"}
    assert int(await redis_client.get(PartitionKeys.build(crawl_name, 0).pending)) == len(urls)


async def test_concurrent_producers_one_runs_one_waits_one_exits_5(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    src = tmp_path / "urls.txt"
    urls = write_urls(src, 60_000)
    lock = CrawlKeys.build(crawl_name).producer_lock
    # The first run reads stdin, so it holds the lock until we close its input: it can't
    # finish before the others start, however slowly they start.
    first = await spawn(redis_url, crawl_name, "--json", "-", stdin=asyncio.subprocess.PIPE)
    assert first.stdin is not None
    first.stdin.write(src.read_bytes())
    await first.stdin.drain()
    await wait_until(lambda: redis_client.exists(lock), "the first producer takes the lock")
    waiter = await spawn(redis_url, crawl_name, "--json", "--lock-wait", "60s", str(src))
    refused = await spawn(redis_url, crawl_name, "--json", str(src))
    out_r, err_r = await refused.communicate()
    assert waiter.stderr is not None
    err_w = b""
    while b"producer_lock_wait" not in err_w:  # the waiter found the lock held, and waits
        line = await waiter.stderr.readline()
        assert line, f"the waiter ended without waiting for the lock: {err_w.decode()}"
        err_w += line
    first.stdin.close()
    out_w, _ = await waiter.communicate()
    out_f, _ = await first.communicate()
    assert first.returncode == 0
    assert waiter.returncode == 0
    assert refused.returncode == 5
    assert (f"another producer is running for crawl {crawl_name} (lock held, expires in"
            in err_r.decode())
    assert "retry later or pass --lock-wait" in err_r.decode()
    r = json.loads(out_r)
    assert (r["exit_code"], r["enqueued"], r["read"]) == (5, 0, 0)
    f, w = json.loads(out_f), json.loads(out_w)
    assert f["enqueued"] + w["enqueued"] == len(urls)
    assert w["enqueued"] == 0 and w["duplicates"] == len(urls)  # it ran after the first
    assert len(await urls_in_redis(redis_client, crawl_name)) == len(urls)
    assert not await redis_client.exists(lock)  # released at exit


# -- sources --------------------------------------------------------------------------------


async def test_sitemap_index_with_gzipped_children(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    async with sample_site(pages=1200) as base:
        code, s = await produce_json(redis_url, crawl_name, "--allow-private",
                                     "--sitemap", f"{base}/sitemap.xml")
        assert code == 0, s
        assert (s["read"], s["enqueued"], s["invalid"]) == (1200, 1200, 0)
        urls = await urls_in_redis(redis_client, crawl_name)
        assert urls == sorted(f"{base}/page/{i}" for i in range(1200))

        # Through robots.txt's Sitemap: line, the same URLs: all seen already.
        code, s = await produce_json(redis_url, crawl_name, "--allow-private",
                                     "--sitemap", f"{base}/robots.txt")
        assert (code, s["read"], s["duplicates"]) == (0, 1200, 1200)

        # Without --allow-private the SSRF guard refuses 127.0.0.1: a source error.
        code, s = await produce_json(redis_url, crawl_name, "--sitemap", f"{base}/sitemap.xml")
        assert code == 4
        assert "ssrf_blocked" in s["error"]

        code, s = await produce_json(redis_url, crawl_name, "--allow-private",
                                     "--sitemap", f"{base}/nope.xml")
        assert code == 4
        assert "HTTP 404" in s["error"]


async def test_gzip_file_and_stdin(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    urls = [f"https://gz.example/{i}" for i in range(3000)]
    gz = tmp_path / "urls.txt.gz"
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(urls))  # no final newline: the last line still counts
    code, s = await produce_json(redis_url, crawl_name, str(gz))
    assert (code, s["read"], s["enqueued"]) == (0, 3000, 3000)

    more = [f"https://stdin.example/{i}" for i in range(100)]
    stdin = io.BytesIO(("\r\n".join(more + urls[:10]) + "\r\n").encode())
    code, s = await produce_json(redis_url, crawl_name, "-", stdin=stdin)
    assert (code, s["read"], s["enqueued"], s["duplicates"]) == (0, 110, 100, 10)
    assert len(await urls_in_redis(redis_client, crawl_name)) == 3100


class TwoBytesAtATime(io.BytesIO):
    """A pipe that delivers two bytes per read, so a byte-order mark arrives cut."""

    def read1(self, size: int = -1) -> bytes:
        return super().read1(2)


async def test_a_utf8_byte_order_mark_does_not_cost_the_first_url(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    def with_bom(name: str) -> tuple[list[str], bytes]:
        urls = [f"https://bom.example/{name}/{i}" for i in range(3)]
        return urls, b"\xef\xbb\xbf" + "\r\n".join(urls).encode() + b"\r\n"

    urls, data = with_bom("plain")
    (tmp_path / "plain.txt").write_bytes(data)
    gz_urls, gz_data = with_bom("gz")
    (tmp_path / "urls.txt.gz").write_bytes(gzip.compress(gz_data))
    stdin_urls, stdin_data = with_bom("stdin")
    for args, stdin in (([str(tmp_path / "plain.txt")], None),
                        ([str(tmp_path / "urls.txt.gz")], None),
                        (["-"], TwoBytesAtATime(stdin_data))):
        code, s = await produce_json(redis_url, crawl_name, *args, stdin=stdin)
        assert (code, s["read"], s["invalid"], s["enqueued"]) == (0, 3, 0, 3), args
    assert await urls_in_redis(redis_client, crawl_name) == sorted(urls + gz_urls + stdin_urls)


async def test_dry_run_writes_nothing(
        tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    src = tmp_path / "garbage.txt"
    src.write_text("\n".join(GARBAGE) + "\n", encoding="utf-8")
    code, s = await produce_json(redis_url, crawl_name, "--dry-run", str(src))
    assert code == 0
    assert s["dry_run"] is True
    assert (s["read"], s["invalid"], s["enqueued"]) == (18, 11, 0)
    assert await crawl_key_count(redis_client, crawl_name) == 0
    assert not await redis_client.sismember(CRAWLS, crawl_name)


async def test_meta_priority_depth_and_attempts_reach_the_tasks(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    code, _ = await produce_json(redis_url, crawl_name, "--url", "https://m.example/",
                                 "--priority", "5", "--max-attempts", "7", "--depth", "2",
                                 "--meta", "source=test", "--meta", "team=crawl")
    assert code == 0
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    [lease] = await queue.lease("w", 1, 60_000)
    t = lease.task
    assert (t.url, t.priority, t.max_attempts, t.depth) == ("https://m.example/", 5, 7, 2)
    assert t.meta == {"source": "test", "team": "crawl"}


# -- errors and exit codes -------------------------------------------------------------------


async def test_json_summary_schema(redis_url: str, crawl_name: str) -> None:
    code, s = await produce_json(redis_url, crawl_name, "--url", "https://j.example/",
                                 "--url", "ftp://j.example/")
    assert code == 0
    types = {"crawl": str, "read": int, "invalid": int, "invalid_by_reason": dict,
             "duplicates": int, "enqueued": int, "recrawled": int,
             "recrawled_known": int, "known_scanned": int, "known_due_in_s": type(None),
             "elapsed_s": float, "urls_per_s": float, "dry_run": bool, "exit_code": int,
             "error": type(None), "notice": type(None)}
    assert set(s) == set(types)
    for key, kind in types.items():
        assert isinstance(s[key], kind), (key, s[key])
    assert s["invalid_by_reason"] == {"bad_scheme": 1}
    assert (s["crawl"], s["read"], s["enqueued"]) == (crawl_name, 2, 1)


async def test_exit_3_when_redis_is_unreachable(tmp_path: Path, crawl_name: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, s = await produce_json(url, crawl_name, "--url", "https://x.example/",
                                 "--redis-wait", "0.5s")
    assert code == 3
    assert s["exit_code"] == 3
    assert "cannot reach Redis at" in s["error"]
    assert "cannot reach Redis at" in capsys.readouterr().err
    code, s = await produce_json(f"redis://user:hunter2@127.0.0.1:{free_port()}/0",
                                 crawl_name, "--url", "https://x.example/",
                                 "--redis-wait", "0.5s")
    assert code == 3
    assert "hunter2" not in s["error"]


async def test_exit_4_when_a_file_is_missing(tmp_path: Path, redis_url: str,
                                             redis_client: aioredis.Redis,
                                             crawl_name: str) -> None:
    code, s = await produce_json(redis_url, crawl_name, str(tmp_path / "nope.txt"))
    assert code == 4
    assert "does not exist" in s["error"]
    assert await crawl_key_count(redis_client, crawl_name) == 0


async def test_exit_2_on_usage_and_conflicting_crawl_settings(
        redis_url: str, crawl_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (await produce(redis_url, crawl_name))[0] == 2  # no input at all
    assert (await produce(redis_url, crawl_name, "--priority", "-1", "--url", "x"))[0] == 2
    code, s = await produce_json(redis_url, crawl_name, "--partitions", "4",
                                 "--url", "https://p.example/")
    assert (code, s["enqueued"]) == (0, 1)
    code, s = await produce_json(redis_url, crawl_name, "--partitions", "4",
                                 "--url", "https://p.example/2")
    assert (code, s["enqueued"]) == (0, 1)  # same value: fine
    code, s = await produce_json(redis_url, crawl_name, "--url", "https://p.example/3")
    assert (code, s["enqueued"]) == (0, 1)  # unset: the stored value is used
    code, s = await produce_json(redis_url, crawl_name, "--partitions", "8",
                                 "--url", "https://p.example/4")
    assert code == 2
    assert "exists with partitions=4" in s["error"] and "partitions=8" in s["error"]
    code, s = await produce_json(redis_url, crawl_name, "--dedup", "bloom",
                                 "--url", "https://p.example/4")
    assert code == 2 and "dedup=bloom" in s["error"]


async def test_bloom_crawl(redis_url: str, redis_client: aioredis.Redis,
                           crawl_name: str) -> None:
    flags = [a for i in range(50) for a in ("--url", f"https://b.example/{i}")]
    code, s = await produce_json(redis_url, crawl_name, "--dedup", "bloom", *flags)
    assert (code, s["enqueued"]) == (0, 50)
    code, s = await produce_json(redis_url, crawl_name, *flags)
    assert (code, s["enqueued"], s["duplicates"]) == (0, 0, 50)
    code, s = await produce_json(redis_url, crawl_name, "--recrawl-after", "1d", *flags)
    assert code == 2 and "bloom" in s["error"]


async def test_a_bloom_crawl_never_runs_with_a_recrawl_window(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A policy can be given recrawl_after before its crawl exists (nothing says its dedup
    yet): the producer then neither creates a bloom crawl under it nor runs one, and
    says how to fix it; the policy refuses the window once the crawl is bloom."""
    await create_policy(redis_client, crawl_name, {"recrawl_after": 86400}, by="test")
    code, s = await produce_json(redis_url, crawl_name, "--dedup", "bloom",
                                 "--url", "https://b.example/1")
    assert code == 2 and s["enqueued"] == 0
    assert (f"crawl {crawl_name!r} uses bloom dedup, which keeps no timestamps, but its "
            "policy has recrawl_after=86400s") in s["error"]
    assert f"crawlq crawl set --crawl {crawl_name} recrawl_after=0" in s["error"]
    assert not await redis_client.exists(CrawlKeys.build(crawl_name).meta)  # not created

    await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(dedup=DedupMode.BLOOM))
    code, s = await produce_json(redis_url, crawl_name, "--url", "https://b.example/1")
    assert code == 2 and s["enqueued"] == 0 and "recrawl_after=86400s" in s["error"]
    with pytest.raises(PolicyError, match=r"recrawl_after: crawl .* uses bloom dedup"):
        await set_policy(redis_client, crawl_name, {"recrawl_after": 60}, by="test")
    await set_policy(redis_client, crawl_name, {"recrawl_after": 0}, by="test")
    code, s = await produce_json(redis_url, crawl_name, "--url", "https://b.example/1")
    assert (code, s["enqueued"]) == (0, 1)


async def test_every_loops_until_sigterm_then_exits_0(
        tmp_path: Path, redis_url: str, crawl_name: str) -> None:
    src = tmp_path / "urls.txt"
    write_urls(src, 100)
    proc = await spawn(redis_url, crawl_name, "--json", "--every", "0.3s", str(src))
    assert proc.stdout is not None
    runs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 20)) for _ in range(2)]
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0
    assert runs[0]["enqueued"] == 100
    assert (runs[1]["enqueued"], runs[1]["duplicates"]) == (0, 100)


def test_hiredis_packer_writes_the_same_bytes_as_redis_py() -> None:
    client = aioredis.Redis()
    plain = client.connection_pool.connection_class()
    assert use_hiredis_packer(client)
    fast = client.connection_pool.connection_class()
    commands: list[tuple[Any, ...]] = [
        ("EVALSHA", "a" * 40, 2, "k1", "k2", 0, b"\x00\xff\x10", 3, '{"u":"é"}', 1.5, 1e-06),
        ("CONFIG GET", "maxmemory"),  # a two-word command name is split
        ("SET", memoryview(b"key"), bytearray(b"value")),
        ("PING",),
    ]
    for cmd in commands:
        assert b"".join(fast.pack_command(*cmd)) == b"".join(plain.pack_command(*cmd))
    assert b"".join(fast.pack_commands(commands)) == b"".join(plain.pack_commands(commands))


async def test_lock_is_refreshed_while_held_and_only_its_owner_deletes_it(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    key = CrawlKeys.build(crawl_name).producer_lock
    lock = ProducerLock(redis_client, crawl_name, ttl_ms=5_000, refresh_s=0.05)
    async with lock:
        await wait_until(ttl_rose(redis_client, key), "the lock is refreshed")
        assert await redis_client.get(key) == lock._token.encode()
        with pytest.raises(LockHeldError, match="another producer is running"):
            await ProducerLock(redis_client, crawl_name).acquire()
    assert not await redis_client.exists(key)

    # A run that lost its lock (expired, taken by another) must not delete the new one.
    stale = ProducerLock(redis_client, crawl_name, ttl_ms=100, refresh_s=60)
    await stale.acquire()
    await wait_until(lambda: is_gone(redis_client, key), "the stale lock expires")
    newer = ProducerLock(redis_client, crawl_name, wait_s=1)
    await newer.acquire()
    await stale.release()
    assert await redis_client.exists(key)
    await newer.release()
    assert not await redis_client.exists(key)


def test_sitemap_parser_reads_only_page_locs_and_refuses_what_is_not_a_sitemap() -> None:
    xml = (b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
           b' xmlns:image="http://www.google.com/schemas/sitemap-image/1.1"><url>'
           b"<loc> https://a.example/1 </loc><image:image><image:loc>https://a.example/i.png"
           b"</image:loc></image:image></url><url><loc>https://a.example/2</loc></url></urlset>")
    expected = [("url", "https://a.example/1"), ("url", "https://a.example/2")]
    assert list(parse_sitemap(xml, "s")) == expected
    assert list(parse_sitemap(gzip.compress(xml), "s")) == expected
    # Entities are not expanded (no billion laughs), so the loc is empty and skipped.
    bomb = (b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
            b"<urlset><url><loc>&b;</loc></url></urlset>")
    assert list(parse_sitemap(bomb, "s")) == []
    with pytest.raises(SourceError, match="is not a sitemap: its root element is <html>"):
        list(parse_sitemap(b"<html><body/></html>", "s"))
    with pytest.raises(SourceError, match="not well-formed XML"):
        list(parse_sitemap(b"<urlset><url><loc>x</loc>", "s"))
    huge = gzip.compress(b"<urlset>" + b"<url><loc>https://h.example/</loc></url>" * 50_000
                         + b"</urlset>")  # 2 MB inflated from a few KB
    with pytest.raises(SourceError, match="over 1000000 bytes uncompressed"):
        list(parse_sitemap(huge, "s", cap=1_000_000))
