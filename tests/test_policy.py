"""A crawl's policy (common/policy/): one versioned, logged object in Redis that every
consumer reads and none overwrites. Real redis-server; the commands run as processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from sites import test_site
from support.clock import redis_ms, window_passed
from support.consume import consumer_args
from support.frontier import host_record
from support.routes import Handler, Site, page, serve

from common.fleet.wake import WakeChannel
from common.frontier.hosts import Frontier
from common.keys import CrawlKeys
from common.policy import (
    LOG_LEN,
    NOBODY,
    POLICY_OPTIONS,
    CrawlPolicy,
    PolicyError,
    PolicyMovedError,
    apply_policy,
    create_policy,
    ensure_policy,
    parse_value,
    read_policy,
    set_policy,
)
from common.queue import CrawlSettings, DedupMode, LeasingQueue, NewTask, RetryPolicy
from common.redis.scripts import register
from common.tasks.task import decode_entry
from common.urls.canonical import fingerprint
from consumer.config import CONSUMER_OPTIONS, ConsumerSettings, build_parser, settings_from_args
from consumer.wiring import run
from producer.cli import PRODUCER_OPTIONS
from producer.cli import main_async as producer_main

ROOT = Path(__file__).resolve().parent.parent
VALID = ("valid keys: per_host_delay, per_host_concurrency, accept_content_type, "
         "user_agent, ignore_robots, robots_ttl, max_depth, allow_domains, retry_base, "
         "retry_cap, max_retry_after, max_stalls, max_attempts, recrawl_after")
UA = "crawlq/0.1 (+https://github.com/crawlq/crawlq)"
#: The new keys' defaults, as `crawl create` and `crawl set` print them.
#: The trap keys' defaults, the last of every listing.
TRAPS = ("trap_max_url_length=1024, trap_max_segments=20, trap_repeated_segments=2, "
         "trap_max_params=12, trap_path_variants=1000, trap_page_facets=2, "
         "trap_session_ids=true, near_duplicate_distance=0, soft_404=true, "
         "drop_judged_items=false")
#: The proxy pool's keys' defaults, the last of every listing.
PROXIES = ("proxy_tiers=datacenter,residential, proxy_ban_for=1800s, proxy_tier_bans=3, "
           "proxy_tier_quiet=600s, proxy_max_failures=3, proxy_quarantine=30s, "
           "ban_status=403, ban_selector=none, ban_text=none, session_pool=0, "
           "session_max_uses=50")
#: The same as values and texts (crawl show --json).
PROXY_VALUES = {"proxy_tiers": ["datacenter", "residential"], "proxy_ban_for": 1800.0,
                "proxy_tier_bans": 3, "proxy_tier_quiet": 600.0, "proxy_max_failures": 3,
                "proxy_quarantine": 30.0, "ban_status": [403], "ban_selector": "",
                "ban_text": "", "session_pool": 0, "session_max_uses": 50}
PROXY_TEXTS = {"proxy_tiers": "datacenter,residential", "proxy_ban_for": "1800s",
               "proxy_tier_bans": "3", "proxy_tier_quiet": "600s", "proxy_max_failures": "3",
               "proxy_quarantine": "30s", "ban_status": "403", "ban_selector": "none",
               "ban_text": "none", "session_pool": "0", "session_max_uses": "50"}
PROXY_TOML = ['proxy_tiers = "datacenter,residential"', 'proxy_ban_for = "1800s"',
              "proxy_tier_bans = 3", 'proxy_tier_quiet = "600s"', "proxy_max_failures = 3",
              'proxy_quarantine = "30s"', 'ban_status = "403"', 'ban_selector = "none"',
              'ban_text = "none"', "session_pool = 0", "session_max_uses = 50"]
#: The push-back keys' defaults, then the trap keys', then the proxies'.
BACKOFF = ("backoff_on=429,503, backoff_base=1s, backoff_cap=3600s, backoff_forgive=300s, "
           "adaptive_delay=0, max_delay=30s, max_crawl_delay=300s, revisit=off, "
           "min_interval=60s, max_interval=7776000s, interval_grow=0.4, interval_shrink=0.2, "
           "conditional=true, " + TRAPS
           + ", rendering=off, politeness_key=host, group_delay=1s, group_concurrency=2, "
           + PROXIES)
REST = (f"user_agent={UA}, ignore_robots=false, robots_ttl=86400s, max_depth=none, "
        "allow_domains=@parent, retry_base=2s, retry_cap=600s, max_retry_after=3600s, "
        "max_stalls=2, max_attempts=3, recrawl_after=0s, " + BACKOFF)
#: The retry keys' defaults, likewise (and those after them).
RETRY = ("retry_base=2s, retry_cap=600s, max_retry_after=3600s, max_stalls=2, "
         "max_attempts=3, recrawl_after=0s, " + BACKOFF)


async def crawlq(redis_url: str, *args: str) -> tuple[int, str, str]:
    """``crawlq <args>`` in its own process against the test Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env |= {"PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "CRAWLQ_CLUSTER": "no"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
        *args, cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode, out.decode(), err.decode()


async def ok(redis_url: str, *args: str) -> str:
    code, out, err = await crawlq(redis_url, *args)
    assert code == 0, (args, out, err)
    return out


#: What every partition's conf holds of a policy with adaptive_delay off (policy_apply.lua).
ADAPT_OFF = {b"adapt": b"0", b"max_delay": b"30000", b"rv": b"0", b"rv_first": b"0",
             b"rv_min": b"60", b"rv_max": b"7776000", b"rv_grow": b"400", b"rv_shrink": b"200",
             b"gkey": b"", b"gdelay": b"1000", b"gconc": b"2", b"rv_cond": b"1"}


async def confs(client: aioredis.Redis, queue: LeasingQueue) -> list[dict[bytes, bytes]]:
    return [await client.hgetall(pk.conf) for pk in queue.partitions]


# -- the table ---------------------------------------------------------------------------


def test_the_policy_is_declared_once() -> None:
    """The dataclass is the table: same names, same defaults. Each option's flag, the
    consumer's or the producer's (`seeded_by`: used when that command creates the
    policy), is derived from its row (tests/test_options.py: declared once)."""
    fields = dataclasses.fields(CrawlPolicy)
    assert [f.name for f in fields] == [o.name for o in POLICY_OPTIONS]
    assert [f.default for f in fields] == [o.default for o in POLICY_OPTIONS]
    tables = {"crawlq-consumer": CONSUMER_OPTIONS, "crawlq-producer": PRODUCER_OPTIONS}
    flags = {(command, o.flag): o for command, table in tables.items() for o in table}
    seeded = [o for o in POLICY_OPTIONS if o.seeded_by != NOBODY]
    # An option no command seeds has no flag: crawlq crawl create/set alone sets it.
    assert {o.name: o.flag for o in POLICY_OPTIONS if o.seeded_by == NOBODY} == {
        "backoff_on": "", "backoff_base": "", "backoff_cap": "", "backoff_forgive": "",
        "adaptive_delay": "", "max_delay": "", "max_crawl_delay": "", "revisit": "",
        "min_interval": "", "max_interval": "", "interval_grow": "", "interval_shrink": "",
        "conditional": "", "trap_max_url_length": "", "trap_max_segments": "",
        "trap_repeated_segments": "",
        "trap_max_params": "", "trap_path_variants": "", "trap_page_facets": "",
        "trap_session_ids": "",
        "near_duplicate_distance": "", "soft_404": "", "drop_judged_items": "",
        "rendering": "", "politeness_key": "", "group_delay": "", "group_concurrency": "",
        "proxy_tiers": "", "proxy_ban_for": "", "proxy_tier_bans": "", "proxy_tier_quiet": "",
        "proxy_max_failures": "", "proxy_quarantine": "", "ban_status": "",
        "ban_selector": "", "ban_text": "", "session_pool": "", "session_max_uses": ""}
    assert CrawlPolicy().texts() == {"per_host_delay": "1s", "per_host_concurrency": "2",
                                     "accept_content_type": "*/*", "user_agent": UA,
                                     "ignore_robots": "false", "robots_ttl": "86400s",
                                     "max_depth": "none", "allow_domains": "@parent",
                                     "retry_base": "2s", "retry_cap": "600s",
                                     "max_retry_after": "3600s", "max_stalls": "2",
                                     "max_attempts": "3", "recrawl_after": "0s",
                                     "backoff_on": "429,503", "backoff_base": "1s",
                                     "backoff_cap": "3600s", "backoff_forgive": "300s",
                                     "adaptive_delay": "0", "max_delay": "30s",
                                     "max_crawl_delay": "300s", "revisit": "off",
                                     "min_interval": "60s", "max_interval": "7776000s",
                                     "interval_grow": "0.4", "interval_shrink": "0.2",
                                     "conditional": "true", "trap_max_url_length": "1024",
                                     "trap_max_segments": "20",
                                     "trap_repeated_segments": "2", "trap_max_params": "12",
                                     "trap_path_variants": "1000", "trap_page_facets": "2",
                                     "trap_session_ids": "true",
                                     "near_duplicate_distance": "0", "soft_404": "true",
                                     "drop_judged_items": "false", "rendering": "off",
                                     "politeness_key": "host", "group_delay": "1s",
                                     "group_concurrency": "2",
                                     "proxy_tiers": "datacenter,residential",
                                     "proxy_ban_for": "1800s", "proxy_tier_bans": "3",
                                     "proxy_tier_quiet": "600s", "proxy_max_failures": "3",
                                     "proxy_quarantine": "30s", "ban_status": "403",
                                     "ban_selector": "none", "ban_text": "none",
                                     "session_pool": "0", "session_max_uses": "50"}
    # Each such flag says it is a crawl policy value.
    assert all("a crawl policy value" in flags[o.seeded_by, o.flag].help for o in seeded)


def test_the_retry_keys_give_the_queue_whole_milliseconds() -> None:
    """The queue gets what the retry flags always gave it: whole milliseconds, a fraction
    cut off (1.0019s is 1001 ms), without float noise (1.005s is 1005 ms, not 1004); and
    the policy's defaults are the queue's own."""
    policy = CrawlPolicy().replace({
        name: parse_value(name, text) for name, text in (
            ("retry_base", "1.0019s"), ("retry_cap", "1.005s"), ("max_retry_after", "1.5h"),
            ("max_stalls", " 7 "))})
    assert policy.texts()["retry_base"] == "1.001s"
    assert policy.retry() == RetryPolicy(base_ms=1001, cap_ms=1005,
                                         max_retry_after_ms=5_400_000, max_stalls=7)
    assert CrawlPolicy().retry() == RetryPolicy()


# -- the commands ------------------------------------------------------------------------


async def test_create_show_set_round_trip_with_versions_and_a_log(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    before = await redis_ms(redis_client)
    out = await ok(redis_url, "crawl", "create", "--crawl", crawl_name, "per_host_delay=500ms")
    assert out == (f"crawl {crawl_name}: policy version 1 created: per_host_delay=0.5s, "
                   f"per_host_concurrency=2, accept_content_type=*/*, {REST}\n")
    code, _, err = await crawlq(redis_url, "crawl", "create", "--crawl", crawl_name)
    assert code == 2 and "already has a policy (version 1)" in err and "crawlq crawl set" in err

    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name,
                   "per_host_concurrency=3", "per_host_delay=0.5s")
    assert out == (f"crawl {crawl_name}: policy version 2 set: per_host_delay=0.5s, "
                   f"per_host_concurrency=3, accept_content_type=*/*, {REST}\n")
    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "per_host_concurrency=3")
    assert "policy version 2 unchanged" in out  # not a change: no version, no log entry

    # The keys that came with the user agent, robots and link scope, the retry keys, and
    # those that were the robots.txt cache's and the producer's flags.
    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name,
                   "user_agent= probe/2.0 (+https://example.com/probe) ", "ignore_robots=TRUE",
                   "max_depth=0", "allow_domains=Bücher.example, example.com,example.com",
                   "retry_base=500ms", "retry_cap=1m", "max_retry_after=0", "max_stalls=0",
                   "robots_ttl=1.5h", "max_attempts= 5 ", "recrawl_after=1.2s")
    assert out == (f"crawl {crawl_name}: policy version 3 set: per_host_delay=0.5s, "
                   "per_host_concurrency=3, accept_content_type=*/*, "
                   "user_agent=probe/2.0 (+https://example.com/probe), ignore_robots=true, "
                   "robots_ttl=5400s, max_depth=0, "
                   "allow_domains=xn--bcher-kva.example,example.com, "
                   "retry_base=0.5s, retry_cap=60s, max_retry_after=0s, max_stalls=0, "
                   f"max_attempts=5, recrawl_after=2s, {BACKOFF}\n")

    doc = json.loads(await ok(redis_url, "crawl", "show", "--crawl", crawl_name, "--json"))
    assert (doc["version"], doc["values"], doc["text"]) == (
        3, {"per_host_delay": 0.5, "per_host_concurrency": 3, "accept_content_type": [],
            "user_agent": "probe/2.0 (+https://example.com/probe)", "ignore_robots": True,
            "robots_ttl": 5400.0,
            "max_depth": 0, "allow_domains": ["xn--bcher-kva.example", "example.com"],
            "retry_base": 0.5, "retry_cap": 60.0, "max_retry_after": 0.0, "max_stalls": 0,
            "max_attempts": 5, "recrawl_after": 2, "backoff_on": ["429", "503"],
            "backoff_base": 1.0, "backoff_cap": 3600.0, "backoff_forgive": 300.0,
            "adaptive_delay": 0.0, "max_delay": 30.0, "max_crawl_delay": 300.0,
            "revisit": "off", "min_interval": 60, "max_interval": 7776000,
            "interval_grow": 0.4, "interval_shrink": 0.2, "conditional": True,
            "trap_max_url_length": 1024,
            "trap_max_segments": 20, "trap_repeated_segments": 2, "trap_max_params": 12,
            "trap_path_variants": 1000, "trap_page_facets": 2, "trap_session_ids": True,
            "near_duplicate_distance": 0, "soft_404": True, "drop_judged_items": False,
            "rendering": "off",
            "politeness_key": "host",
            "group_delay": 1.0, "group_concurrency": 2, **PROXY_VALUES},
        {"per_host_delay": "0.5s", "per_host_concurrency": "3", "accept_content_type": "*/*",
         "user_agent": "probe/2.0 (+https://example.com/probe)", "ignore_robots": "true",
         "robots_ttl": "5400s",
         "max_depth": "0", "allow_domains": "xn--bcher-kva.example,example.com",
         "retry_base": "0.5s", "retry_cap": "60s", "max_retry_after": "0s", "max_stalls": "0",
         "max_attempts": "5", "recrawl_after": "2s", "backoff_on": "429,503",
         "backoff_base": "1s", "backoff_cap": "3600s", "backoff_forgive": "300s",
         "adaptive_delay": "0", "max_delay": "30s", "max_crawl_delay": "300s",
         "revisit": "off", "min_interval": "60s", "max_interval": "7776000s",
         "interval_grow": "0.4", "interval_shrink": "0.2", "conditional": "true",
         "trap_max_url_length": "1024",
         "trap_max_segments": "20", "trap_repeated_segments": "2", "trap_max_params": "12",
         "trap_path_variants": "1000", "trap_page_facets": "2",
         "trap_session_ids": "true",
         "near_duplicate_distance": "0", "soft_404": "true",
                                     "drop_judged_items": "false", "rendering": "off",
         "politeness_key": "host",
         "group_delay": "1s", "group_concurrency": "2", **PROXY_TEXTS})
    third, second, first = doc["log"]
    assert first | {"version": 1, "by": "crawlq crawl create", "changes": {
        "per_host_delay": [None, "0.5s"], "per_host_concurrency": [None, "2"],
        "accept_content_type": [None, "*/*"], "user_agent": [None, UA],
        "ignore_robots": [None, "false"], "robots_ttl": [None, "86400s"],
        "max_depth": [None, "none"], "allow_domains": [None, "@parent"],
        "retry_base": [None, "2s"], "retry_cap": [None, "600s"],
        "max_retry_after": [None, "3600s"], "max_stalls": [None, "2"],
        "max_attempts": [None, "3"], "recrawl_after": [None, "0s"],
        "backoff_on": [None, "429,503"], "backoff_base": [None, "1s"],
        "backoff_cap": [None, "3600s"], "backoff_forgive": [None, "300s"],
        "adaptive_delay": [None, "0"], "max_delay": [None, "30s"],
        "max_crawl_delay": [None, "300s"], "revisit": [None, "off"], "min_interval": [None, "60s"],
        "max_interval": [None, "7776000s"], "interval_grow": [None, "0.4"],
        "interval_shrink": [None, "0.2"], "conditional": [None, "true"],
        "trap_max_url_length": [None, "1024"],
        "trap_max_segments": [None, "20"],
        "trap_repeated_segments": [None, "2"], "trap_max_params": [None, "12"],
        "trap_path_variants": [None, "1000"], "trap_page_facets": [None, "2"],
        "trap_session_ids": [None, "true"],
        "near_duplicate_distance": [None, "0"], "soft_404": [None, "true"],
        "drop_judged_items": [None, "false"], "rendering": [None, "off"],
        "politeness_key": [None, "host"],
        "group_delay": [None, "1s"], "group_concurrency": [None, "2"],
        **{k: [None, v] for k, v in PROXY_TEXTS.items()}}} == first
    assert second | {"version": 2, "by": "crawlq crawl set",
                     "changes": {"per_host_concurrency": ["2", "3"]}} == second
    assert third["changes"] == {
        "user_agent": [UA, "probe/2.0 (+https://example.com/probe)"],
        "ignore_robots": ["false", "true"], "max_depth": ["none", "0"],
        "allow_domains": ["@parent", "xn--bcher-kva.example,example.com"],
        "retry_base": ["2s", "0.5s"], "retry_cap": ["600s", "60s"],
        "max_retry_after": ["3600s", "0s"], "max_stalls": ["2", "0"],
        "robots_ttl": ["86400s", "5400s"], "max_attempts": ["3", "5"],
        "recrawl_after": ["0s", "2s"]}
    assert before <= first["at"] <= second["at"] <= await redis_ms(redis_client)

    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "ignore_robots=false",
                   "allow_domains=@parent")
    assert out.endswith("ignore_robots=false, robots_ttl=5400s, max_depth=0, "
                        "allow_domains=@parent, retry_base=0.5s, retry_cap=60s, "
                        "max_retry_after=0s, max_stalls=0, max_attempts=5, "
                        f"recrawl_after=2s, {BACKOFF}\n")
    text = await ok(redis_url, "crawl", "show", "--crawl", crawl_name)
    lines = text.splitlines()
    assert lines[0] == f"crawl {crawl_name}: policy version 4"
    assert lines[1].split()[:2] == ["per_host_delay", "0.5s"]
    assert lines[2].split()[:2] == ["per_host_concurrency", "3"]
    assert lines[3].split()[:2] == ["accept_content_type", "*/*"]
    assert lines[4].split()[:3] == ["user_agent", "probe/2.0", "(+https://example.com/probe)"]
    assert lines[5].split()[:2] == ["ignore_robots", "false"]
    assert lines[6].split()[:2] == ["robots_ttl", "5400s"]
    assert lines[7].split()[:2] == ["max_depth", "0"]
    assert lines[8].split()[:2] == ["allow_domains", "@parent"]
    assert [ln.split()[:2] for ln in lines[9:15]] == [
        ["retry_base", "0.5s"], ["retry_cap", "60s"], ["max_retry_after", "0s"],
        ["max_stalls", "0"], ["max_attempts", "5"], ["recrawl_after", "2s"]]
    assert [ln.split()[:2] for ln in lines[15:22]] == [
        ["backoff_on", "429,503"], ["backoff_base", "1s"], ["backoff_cap", "3600s"],
        ["backoff_forgive", "300s"], ["adaptive_delay", "0"], ["max_delay", "30s"],
        ["max_crawl_delay", "300s"]]
    assert [ln.split()[:2] for ln in lines[22:27]] == [
        ["revisit", "off"], ["min_interval", "60s"], ["max_interval", "7776000s"],
        ["interval_grow", "0.4"], ["interval_shrink", "0.2"]]
    assert lines[27].split()[:2] == ["conditional", "true"]
    assert [ln.split()[:2] for ln in lines[28:38]] == [
        ["trap_max_url_length", "1024"], ["trap_max_segments", "20"],
        ["trap_repeated_segments", "2"], ["trap_max_params", "12"],
        ["trap_path_variants", "1000"], ["trap_page_facets", "2"],
        ["trap_session_ids", "true"], ["near_duplicate_distance", "0"], ["soft_404", "true"],
        ["drop_judged_items", "false"]]
    assert [ln.split()[:2] for ln in lines[38:42]] == [
        ["rendering", "off"], ["politeness_key", "host"], ["group_delay", "1s"],
        ["group_concurrency", "2"]]
    end = 42 + len(PROXY_TEXTS)
    assert [ln.split()[:2] for ln in lines[42:end]] == [list(kv) for kv in PROXY_TEXTS.items()]
    lines = lines[:15] + lines[end:]
    assert lines[15] == "changes, newest first:"
    assert lines[16].endswith("v4  crawlq crawl set: allow_domains xn--bcher-kva.example,"
                              "example.com -> @parent, ignore_robots true -> false")
    assert lines[18].endswith("v2  crawlq crawl set: per_host_concurrency 2 -> 3")
    assert lines[19].endswith("v1  crawlq crawl create: accept_content_type - -> */*, "
                              "adaptive_delay - -> 0, "
                              "allow_domains - -> @parent, backoff_base - -> 1s, "
                              "backoff_cap - -> 3600s, backoff_forgive - -> 300s, "
                              "backoff_on - -> 429,503, ban_selector - -> none, "
                              "ban_status - -> 403, ban_text - -> none, conditional - -> true, "
                              "drop_judged_items - -> false, group_concurrency - -> 2, "
                              "group_delay - -> 1s, ignore_robots - -> false, "
                              "interval_grow - -> 0.4, interval_shrink - -> 0.2, "
                              "max_attempts - -> 3, max_crawl_delay - -> 300s, "
                              "max_delay - -> 30s, max_depth - -> none, "
                              "max_interval - -> 7776000s, "
                              "max_retry_after - -> 3600s, max_stalls - -> 2, "
                              "min_interval - -> 60s, near_duplicate_distance - -> 0, "
                              "per_host_concurrency - -> 2, per_host_delay - -> 0.5s, "
                              "politeness_key - -> host, "
                              + "".join(f"{k} - -> {v}, " for k, v in sorted(PROXY_TEXTS.items())
                                        if k.startswith("proxy_"))
                              + "recrawl_after - -> 0s, rendering - -> off, "
                              "retry_base - -> 2s, "
                              f"retry_cap - -> 600s, revisit - -> off, "
                              "robots_ttl - -> 86400s, session_max_uses - -> 50, "
                              "session_pool - -> 0, soft_404 - -> true, "
                              "trap_max_params - -> 12, "
                              "trap_max_segments - -> 20, trap_max_url_length - -> 1024, "
                              "trap_page_facets - -> 2, "
                              "trap_path_variants - -> 1000, "
                              "trap_repeated_segments - -> 2, trap_session_ids - -> true, "
                              f"user_agent - -> {UA}")
    # `crawl` and `crawls` are two commands.
    assert "crawl" in await ok(redis_url, "crawls")


@pytest.mark.timeout(400)  # ~45 CLI processes: each a Python start-up, slow under load
async def test_a_bad_key_or_value_exits_2_naming_it_and_writes_nothing(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    cases: list[tuple[tuple[str, ...], str]] = []
    for args, shown in (
            (("per_host_delay=2s", "per_host_dealy=3s"), "unknown policy key 'per_host_dealy' "
                                                         "(value '3s')"),
            (("per_host_concurrency=5", "per_host_delay=fast"), "per_host_delay: bad value "
                                                                "'fast'"),
            (("per_host_concurrency=-1",), "per_host_concurrency: bad value '-1'"),
            (("per_host_concurrency=2.5",), "per_host_concurrency: bad value '2.5'"),
            (("per_host_delay",), "not KEY=VALUE: 'per_host_delay'"),
            (("accept_content_type=pdf",), "accept_content_type: bad value 'pdf'"),
            (("accept_content_type=text/html,*/html",),
             "accept_content_type: bad value 'text/html,*/html'"),
            (("user_agent=",), "user_agent: bad value ''"),
            (("user_agent=/1.0 (no product)",), "user_agent: bad value '/1.0 (no product)' "
                                                "(user agent '/1.0 (no product)' has no "
                                                "product token)"),
            (("user_agent=bot/1\tx",), "user_agent: bad value 'bot/1\\tx'"),
            (("ignore_robots=maybe",), "ignore_robots: bad value 'maybe'"),
            (("ignore_robots=",), "ignore_robots: bad value '' (empty: use true or false)"),
            (("max_depth=-1",), "max_depth: bad value '-1'"),
            (("max_depth=two",), "max_depth: bad value 'two'"),
            (("allow_domains=https://example.com/",),
             "allow_domains: bad value 'https://example.com/' (invalid domain"),
            (("allow_domains=a.example,@parent",), "allow_domains: bad value "
                                                   "'a.example,@parent'"),
            (("retry_base=0",), "retry_base: bad value '0' (must be > 0, got 0)"),
            (("retry_base=0.5ms",), "retry_base: bad value '0.5ms' (must be > 0, got 0)"),
            (("retry_base=-1s",), "retry_base: bad value '-1s' (not a duration"),
            (("retry_base=11m",), "retry_cap: must be >= retry_base (660s), got 600s"),
            (("retry_cap=1s",), "retry_cap: must be >= retry_base (2s), got 1s"),
            (("retry_cap=",), "retry_cap: bad value '' (not a duration"),
            (("max_retry_after=-5s",), "max_retry_after: bad value '-5s' (not a duration"),
            (("max_stalls=-1",), "max_stalls: bad value '-1' (must be a whole number >= 0"),
            (("max_stalls=1.5",), "max_stalls: bad value '1.5' (not a whole number"),
            (("robots_ttl=0",), "robots_ttl: bad value '0' (must be > 0, got 0)"),
            (("robots_ttl=0.1ms",), "robots_ttl: bad value '0.1ms' (must be > 0, got 0)"),
            (("robots_ttl=daily",), "robots_ttl: bad value 'daily' (not a duration"),
            (("max_attempts=0",), "max_attempts: bad value '0' (must be a whole number >= 1, "
                                  "got 0)"),
            (("max_attempts=2.5",), "max_attempts: bad value '2.5' (not a whole number"),
            (("recrawl_after=-1d",), "recrawl_after: bad value '-1d' (not a duration"),
            (("recrawl_after=weekly",), "recrawl_after: bad value 'weekly' (not a duration")):
        cases.append((args, shown))
    # ~40 CLI processes: four at a time (each is mostly Python's start-up), every one refused.
    room = asyncio.Semaphore(4)

    async def create(args: tuple[str, ...]) -> tuple[int, str, str]:
        async with room:
            return await crawlq(redis_url, "crawl", "create", "--crawl", crawl_name, *args)

    runs = await asyncio.gather(*(create(args) for args, _ in cases))
    for (args, shown), (code, out, err) in zip(cases, runs, strict=True):
        assert (code, out) == (2, ""), (args, err)
        [line] = err.splitlines()
        assert shown in line and VALID in line, line
    assert await read_policy(redis_client, crawl_name) is None  # create wrote nothing

    await ok(redis_url, "crawl", "create", "--crawl", crawl_name)
    keys = CrawlKeys.build(crawl_name)
    stored = await redis_client.hgetall(keys.policy)
    code, _, err = await crawlq(redis_url, "crawl", "set", "--crawl", crawl_name,
                                "per_host_delay=0s", "per_host_concurrency=0", "robots=off")
    assert code == 2 and "unknown policy key 'robots' (value 'off')" in err and VALID in err
    assert await redis_client.hgetall(keys.policy) == stored  # the good ones too: no partial
    assert await redis_client.llen(keys.policy_log) == 1
    code, _, err = await crawlq(redis_url, "crawl", "set", "--crawl", crawl_name)
    assert code == 2  # set needs at least one KEY=VALUE (argparse)
    # retry_cap is checked against the retry_base the change leaves, not the default's.
    await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "retry_base=100ms")
    await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "retry_cap=1s")
    stored = await redis_client.hgetall(keys.policy)
    for args, shown in ((("retry_base=2s",), "retry_cap: must be >= retry_base (2s), got 1s"),
                        (("retry_cap=50ms", "max_stalls=5"),
                         "retry_cap: must be >= retry_base (0.1s), got 0.05s")):
        code, out, err = await crawlq(redis_url, "crawl", "set", "--crawl", crawl_name, *args)
        assert (code, out) == (2, "") and shown in err and VALID in err, err
    assert await redis_client.hgetall(keys.policy) == stored
    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "retry_base=2s",
                   "retry_cap=2s")
    assert out.endswith("retry_base=2s, retry_cap=2s, max_retry_after=3600s, max_stalls=2, "
                        f"max_attempts=3, recrawl_after=0s, {BACKOFF}\n")
    code, _, err = await crawlq(redis_url, "crawl", "show", "--crawl", crawl_name + "x")
    assert code == 2 and "has no policy: create it with `crawlq crawl create" in err


async def test_show_toml_round_trips_into_create_config(
        redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    await ok(redis_url, "crawl", "create", "--crawl", crawl_name, "per_host_delay=2.25s",
             "per_host_concurrency=0", "accept_content_type=Text/HTML, image/*",
             'user_agent=probe/2.0 ("quoted" \\ +https://example.com)', "ignore_robots=true",
             "robots_ttl=6h", "max_depth=7", "allow_domains=a.example,Bücher.example",
             "retry_base=250ms", "retry_cap=1.5m", "max_retry_after=0s", "max_stalls=0",
             "max_attempts=7", "recrawl_after=7d", "backoff_on=timeout,503,5xx",
             "backoff_base=2s", "backoff_cap=1m", "backoff_forgive=90s",
             "near_duplicate_distance=off")
    toml = await ok(redis_url, "crawl", "show", "--crawl", crawl_name, "--toml")
    assert toml.splitlines()[1:] == [
        'per_host_delay = "2.25s"', "per_host_concurrency = 0",
        'accept_content_type = "text/html,image/*"',
        'user_agent = "probe/2.0 (\\"quoted\\" \\\\ +https://example.com)"',
        "ignore_robots = true", 'robots_ttl = "21600s"', "max_depth = 7",
        'allow_domains = "a.example,xn--bcher-kva.example"', 'retry_base = "0.25s"',
        'retry_cap = "90s"', 'max_retry_after = "0s"', "max_stalls = 0", "max_attempts = 7",
        'recrawl_after = "604800s"', 'backoff_on = "503,5xx,timeout"',
        'backoff_base = "2s"', 'backoff_cap = "60s"', 'backoff_forgive = "90s"',
        "adaptive_delay = 0", 'max_delay = "30s"', 'max_crawl_delay = "300s"',
        'revisit = "off"', 'min_interval = "60s"', 'max_interval = "7776000s"',
        "interval_grow = 0.4", "interval_shrink = 0.2", "conditional = true",
        "trap_max_url_length = 1024",
        "trap_max_segments = 20", "trap_repeated_segments = 2", "trap_max_params = 12",
        "trap_path_variants = 1000", "trap_page_facets = 2", "trap_session_ids = true",
        'near_duplicate_distance = "off"', "soft_404 = true", "drop_judged_items = false",
        'rendering = "off"',
        'politeness_key = "host"',
        'group_delay = "1s"', "group_concurrency = 2", *PROXY_TOML]
    path = tmp_path / "crawl.toml"
    path.write_text(toml)
    await ok(redis_url, "crawl", "create", "--crawl", crawl_name + "-copy", "--config",
             str(path))
    assert await ok(redis_url, "crawl", "show", "--crawl", crawl_name + "-copy",
                    "--toml") == toml.replace(crawl_name, crawl_name + "-copy")
    # KEY=VALUE goes over the file; a bad key in the file is a usage error.
    out = await ok(redis_url, "crawl", "create", "--crawl", crawl_name + "-more", "--config",
                   str(path), "per_host_concurrency=5")
    assert "per_host_delay=2.25s, per_host_concurrency=5" in out
    path.write_text('per_host_delay = "1s"\nbudget = 3\n')
    code, _, err = await crawlq(redis_url, "crawl", "create", "--crawl", crawl_name + "-bad",
                                "--config", str(path))
    assert code == 2 and "unknown policy key 'budget' (value 3)" in err
    # A TOML number is a duration in seconds; a TOML boolean is for ignore_robots only.
    path.write_text("retry_base = 3\nretry_cap = 4.5\nrobots_ttl = 60\nrecrawl_after = 1.2\n")
    out = await ok(redis_url, "crawl", "create", "--crawl", crawl_name + "-num", "--config",
                   str(path))
    assert "robots_ttl=60s" in out and "retry_base=3s, retry_cap=4.5s" in out
    assert f"recrawl_after=2s, {BACKOFF}\n" in out  # whole seconds, rounded up
    for line, shown in (("max_depth = true", "max_depth: bad value True"),
                        ("max_attempts = 0", "max_attempts: bad value 0 (must be a whole "
                                             "number >= 1"),
                        ("robots_ttl = 0", "robots_ttl: bad value 0 (must be > 0"),
                        ('recrawl_after = "soon"', "recrawl_after: bad value 'soon'"),
                        ('ignore_robots = "maybe"', "ignore_robots: bad value 'maybe'"),
                        ("max_stalls = 1.5", "max_stalls: bad value 1.5"),
                        ("retry_base = 0", "retry_base: bad value 0 (must be > 0"),
                        ('retry_base = "1m"\nretry_cap = "30s"',
                         "retry_cap: must be >= retry_base (60s), got 30s")):
        path.write_text(line + "\n")
        code, _, err = await crawlq(redis_url, "crawl", "create", "--crawl",
                                    crawl_name + "-bad", "--config", str(path))
        assert code == 2 and shown in err, err


async def test_a_change_made_against_an_old_version_is_refused_where_it_is_written(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """With the version a change was made against (the dashboard's form), a policy that
    moved since refuses it in policy_set.lua itself, the call that would write, so no
    read-then-write window lets two operators overwrite each other."""
    await create_policy(redis_client, crawl_name, {}, by="test")
    await set_policy(redis_client, crawl_name, {"max_depth": 7}, by="crawlq crawl set")
    before = await read_policy(redis_client, crawl_name)
    with pytest.raises(PolicyMovedError, match="at version 2, not 1") as caught:
        await set_policy(redis_client, crawl_name, {"max_depth": 4}, by="dashboard",
                         expected_version=1)
    assert caught.value.version == 2
    assert await read_policy(redis_client, crawl_name) == before
    keys = CrawlKeys.build(crawl_name)
    script = register(redis_client, "policy_set")
    assert await script(keys=[keys.policy, keys.policy_log],
                        args=["set", "dashboard", LOG_LEN, 1, "max_depth", "4"]) == [4, 2]
    assert await read_policy(redis_client, crawl_name) == before
    stored = await set_policy(redis_client, crawl_name, {"max_depth": 4}, by="dashboard",
                              expected_version=2)
    assert (stored.version, stored.policy.max_depth) == (3, 4)


async def test_robots_ttl_max_attempts_and_recrawl_after_through_the_python_api(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """set_policy takes the values as parsed, checks them the same (PolicyError naming the
    key, nothing written), and refuses a recrawl window on a bloom crawl, as `crawl set`
    and `crawl create` do (exit 2, saying why)."""
    await create_policy(redis_client, crawl_name, {}, by="test")
    stored = await set_policy(redis_client, crawl_name, {
        "robots_ttl": 90.5, "max_attempts": 1, "recrawl_after": 604800}, by="test")
    assert (stored.version, stored.policy.texts()["robots_ttl"], stored.policy.max_attempts,
            stored.policy.texts()["recrawl_after"]) == (2, "90.5s", 1, "604800s")
    for values, shown in (({"robots_ttl": 0.0}, "robots_ttl: must be > 0"),
                          ({"max_attempts": 0}, "max_attempts: must be a whole number >= 1"),
                          ({"max_attempts": True}, "max_attempts: must be a whole number"),
                          ({"recrawl_after": -1}, "recrawl_after: must be a whole number >= 0"),
                          ({"recrawl_after": 1.5}, "recrawl_after: must be a whole number")):
        with pytest.raises(PolicyError, match=shown):
            await set_policy(redis_client, crawl_name, values, by="test")
    assert (await read_policy(redis_client, crawl_name) or stored).version == 2

    bloom = crawl_name + "-bloom"
    await LeasingQueue.open(redis_client, bloom, CrawlSettings(dedup=DedupMode.BLOOM))
    code, out, err = await crawlq(redis_url, "crawl", "create", "--crawl", bloom,
                                  "recrawl_after=1d")
    assert (code, out) == (2, "")
    assert (f"recrawl_after: crawl {bloom} uses bloom dedup, which keeps no timestamps, so "
            "it can't enqueue a URL again (got 86400s)") in err and VALID in err
    assert await read_policy(redis_client, bloom) is None
    await ok(redis_url, "crawl", "create", "--crawl", bloom, "recrawl_after=0s")
    code, _, err = await crawlq(redis_url, "crawl", "set", "--crawl", bloom,
                                "max_attempts=4", "recrawl_after=7d")
    assert code == 2 and "uses bloom dedup" in err and "(got 604800s)" in err
    await ok(redis_url, "crawl", "set", "--crawl", bloom, "max_attempts=4", "recrawl_after=0")


async def test_the_log_is_capped_newest_first(redis_client: aioredis.Redis,
                                              crawl_name: str) -> None:
    await create_policy(redis_client, crawl_name, {}, by="test")
    for i in range(LOG_LEN + 5):
        await set_policy(redis_client, crawl_name, {"per_host_concurrency": i % 7 + 3},
                         by=f"test {i}")
    log = CrawlKeys.build(crawl_name).policy_log
    assert await redis_client.llen(log) == LOG_LEN
    entries = [json.loads(e) for e in await redis_client.lrange(log, 0, -1)]
    versions = [e["version"] for e in entries]
    assert versions == list(range(LOG_LEN + 6, 6, -1))
    assert entries[0]["by"] == f"test {LOG_LEN + 4}"


# -- who creates it, and what the frontier sees -------------------------------------------


async def test_hosts_show_the_policy_before_any_consumer_starts(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    await ok(redis_url, "crawl", "create", "--crawl", crawl_name, "per_host_delay=3s",
             "per_host_concurrency=4")
    assert await producer_main(["--redis-url", redis_url, "--crawl", crawl_name, "--cluster",
                                "no", "--partitions", "2", "--progress", "off", "--url",
                                "http://a.test/1", "--url", "http://b.test/1"]) == 0
    doc = json.loads(await ok(redis_url, "hosts", "--crawl", crawl_name, "--json"))
    assert {(h["host"], h["delay_ms"], h["concurrency"]) for h in doc["hosts"]} == {
        ("a.test", 3000, 4), ("b.test", 3000, 4)}
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 1  # the producer changed nothing

    # Without `crawl create`, the producer gives the crawl the defaults.
    other = crawl_name + "-p"
    assert await producer_main(["--redis-url", redis_url, "--crawl", other, "--cluster", "no",
                                "--progress", "off", "--url", "http://a.test/1"]) == 0
    doc = json.loads(await ok(redis_url, "hosts", "--crawl", other, "--json"))
    assert [(h["delay_ms"], h["concurrency"]) for h in doc["hosts"]] == [(1000, 2)]
    stored = await read_policy(redis_client, other)
    assert stored is not None and [e["by"] for e in stored.log] == ["producer"]


async def test_set_defaults_is_a_policy_change(redis_client: aioredis.Redis,
                                               crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await Frontier(q).set_defaults(delay_s=0.25, concurrency=0)
    await Frontier(q).set_defaults(delay_s=0.25, concurrency=1)
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 2
    assert [e["by"] for e in stored.log] == ["api", "api"]
    assert await confs(redis_client, q) == [
        {b"delay": b"250", b"concurrency": b"1", b"policy_version": b"2", **ADAPT_OFF}] * 2


def consumer_settings(redis_url: str, crawl: str, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args(
        consumer_args(redis_url, crawl, out, *extra)))


async def test_restarting_a_consumer_leaves_the_policy_as_it_was(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A consumer whose flags (0 / no limit) differ from the crawl's policy changes
    nothing: not the policy, not a partition's conf; it says so once per flag it was
    given (not for --max-retry-after, left at its default: 3600s against the crawl's 60s)."""
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0.05, "per_host_concurrency": 1, "user_agent": "crawl/1.0",
        "ignore_robots": True, "max_depth": 2, "allow_domains": ("a.test",),
        "retry_base": 0.2, "retry_cap": 30, "max_retry_after": 60, "max_stalls": 1}, by="test")
    await q.enqueue([NewTask(u, fingerprint(u)) for u in ("http://a.test/", "http://b.test/")])
    policy_before = await redis_client.hgetall(CrawlKeys.build(crawl_name).policy)
    confs_before = await confs(redis_client, q)
    assert confs_before == [{b"delay": b"50", b"concurrency": b"1",
                             b"policy_version": b"1", **ADAPT_OFF}] * 2
    caplog.set_level(logging.INFO, logger="consumer")
    for run_no in range(2):  # a start, and a restart
        caplog.clear()
        settings = consumer_settings(redis_url, crawl_name, tmp_path / f"r{run_no}",
                                     "--worker-id", f"w{run_no}", "--user-agent", "flag/9.9",
                                     "--max-depth", "5", "--allow-domains", "B.test",
                                     "--retry-cap", "1m", "--max-stalls", "1")
        assert await asyncio.wait_for(run(settings), 60) == 0
        assert await redis_client.hgetall(CrawlKeys.build(crawl_name).policy) == policy_before
        assert await confs(redis_client, q) == confs_before
        warned = {(r.flag, r.flag_value, r.crawl_value): r for r in caplog.records  # type: ignore[attr-defined]
                  if r.getMessage() == "crawl_policy_differs"}
        assert set(warned) == {("--per-host-delay", "0s", "0.05s"),
                               ("--per-host-concurrency", "0", "1"),
                               ("--user-agent", "flag/9.9", "crawl/1.0"),
                               ("--max-depth", "5", "2"),
                               ("--allow-domains", "b.test", "a.test"),
                               ("--retry-base", "0.05s", "0.2s"),  # consumer_args'
                               ("--retry-cap", "60s", "30s")}  # robots, stalls: same
        assert all(r.levelno == logging.WARNING for r in warned.values())
        assert f"crawlq crawl set --crawl {crawl_name} per_host_delay=0s" in warned[
            ("--per-host-delay", "0s", "0.05s")].advice  # type: ignore[attr-defined]
        assert f"crawlq crawl set --crawl {crawl_name} allow_domains=b.test" in warned[
            ("--allow-domains", "b.test", "a.test")].advice  # type: ignore[attr-defined]
        assert f"crawlq crawl set --crawl {crawl_name} retry_cap=60s" in warned[
            ("--retry-cap", "60s", "30s")].advice  # type: ignore[attr-defined]
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 1 and len(stored.log) == 1


@pytest.mark.parametrize("given", ["nothing", "flag", "env"])
async def test_a_consumer_warns_only_for_the_policy_flags_it_was_given(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path, *,
        given: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value of the crawl's policy differs from the consumer's defaults: started
    with no policy flag it says nothing; given --per-host-delay 3s (the flag, or
    CRAWLQ_PER_HOST_DELAY) it warns for that flag only."""
    await LeasingQueue.open(redis_client, crawl_name)
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0.05, "per_host_concurrency": 1, "accept_content_type": ("text/*",),
        "user_agent": "crawl/1.0", "ignore_robots": True, "robots_ttl": 60, "max_depth": 2,
        "allow_domains": ("a.test",), "retry_base": 0.2, "retry_cap": 30,
        "max_retry_after": 60, "max_stalls": 1}, by="test")
    for name in (o.env for o in CONSUMER_OPTIONS):  # nothing given by this environment
        monkeypatch.delenv(name, raising=False)
    args = ["--redis-url", redis_url, "--crawl", crawl_name, "--output", str(tmp_path),
            "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1"]
    if given == "flag":
        args += ["--per-host-delay", "3s"]
    elif given == "env":
        monkeypatch.setenv("CRAWLQ_PER_HOST_DELAY", "3s")
    caplog.set_level(logging.INFO, logger="consumer")
    settings = settings_from_args(build_parser().parse_args(args))
    assert await asyncio.wait_for(run(settings), 60) == 0
    warned = [(r.flag, r.flag_value, r.crawl_value)  # type: ignore[attr-defined]
              for r in caplog.records if r.getMessage() == "crawl_policy_differs"]
    assert warned == ([] if given == "nothing" else [("--per-host-delay", "3s", "0.05s")])
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 1 and stored.policy.per_host_delay == 0.05


async def test_the_first_consumer_creates_the_policy_from_its_flags(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name)
    settings = consumer_settings(redis_url, crawl_name, tmp_path, "--worker-id", "first",
                                 "--per-host-delay", "0.1s", "--per-host-concurrency", "3",
                                 "--user-agent", "first/1.0 (+https://example.com)",
                                 "--max-depth", "1", "--allow-domains", "Bücher.example,a.example",
                                 "--allow-domains", "b.example", "--retry-cap", "30s",
                                 "--max-retry-after", "1m", "--max-stalls", "0",
                                 "--robots-ttl", "6h")
    assert await asyncio.wait_for(run(settings), 60) == 0
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.policy == CrawlPolicy(
        0.1, 3, user_agent="first/1.0 (+https://example.com)", ignore_robots=True,
        robots_ttl=21600, max_depth=1,
        allow_domains=("xn--bcher-kva.example", "a.example", "b.example"),
        retry_base=0.05, retry_cap=30, max_retry_after=60, max_stalls=0)
    assert [e["by"] for e in stored.log] == ["consumer first (created the crawl)"]
    assert await confs(redis_client, q) == [
        {b"delay": b"100", b"concurrency": b"3", b"policy_version": b"1", **ADAPT_OFF}]


async def test_a_mixed_fleet_keeps_the_crawls_delay(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path) -> None:
    """Two consumers, one started with --per-host-delay 0, the other 2s: the crawl's
    policy (0.3 s, one at a time) holds at the server. (Before the policy, each consumer
    wrote its flags as the crawl's defaults at start, and the `0` one turned the delay
    off for everyone.)"""
    delay = 0.3
    await create_policy(redis_client, crawl_name,
                        {"per_host_delay": delay, "per_host_concurrency": 1}, by="test")
    async with serve({"/p/{i}": page}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name)
        await q.enqueue([NewTask(u, fingerprint(u)) for u in
                         (site.url(f"/p/{i}") for i in range(4))])
        fleet = [consumer_settings(redis_url, crawl_name, tmp_path / "a", "--worker-id", "a"),
                 consumer_settings(redis_url, crawl_name, tmp_path / "b", "--worker-id", "b",
                                   "--per-host-delay", "2s", "--per-host-concurrency", "4")]
        assert await asyncio.wait_for(asyncio.gather(*(run(s) for s in fleet)), 60) == [0, 0]
        starts = sorted(t for path, ts in site.hits.items() if path.startswith("/p/")
                        for t in ts)
    assert len(starts) == 4
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= delay - 0.03, gaps
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.policy == CrawlPolicy(delay, 1)


async def test_lowering_the_delay_moves_a_scheduled_turn_earlier(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name)
    await create_policy(redis_client, crawl_name, {"per_host_delay": 5}, by="test")
    await q.enqueue([NewTask(u, fingerprint(u)) for u in
                     ("http://a.test/1", "http://a.test/2", "http://a.test/3")])
    [lease] = await q.lease("w", 10, 60_000)  # a.test's turn now; its next in 5 s
    pk = q.partitions[0]
    last = (await host_record(redis_client, pk, "a.test")).last
    assert last and await redis_client.zscore(pk.due, "a.test") == last + 5000
    await set_policy(redis_client, crawl_name, {"per_host_delay": 0.2}, by="test")
    assert await redis_client.zscore(pk.due, "a.test") == last + 200
    await set_policy(redis_client, crawl_name, {"per_host_delay": 1}, by="test")
    assert await redis_client.zscore(pk.due, "a.test") == last + 1000
    # Concurrency 1 with one request in flight: no free slot, the host leaves `due`;
    # back to 2, it comes back at its turn.
    await set_policy(redis_client, crawl_name, {"per_host_concurrency": 1}, by="test")
    assert await redis_client.zscore(pk.due, "a.test") is None
    await set_policy(redis_client, crawl_name, {"per_host_concurrency": 2}, by="test")
    assert await redis_client.zscore(pk.due, "a.test") == last + 1000
    assert (await redis_client.hgetall(pk.conf))[b"policy_version"] == b"5"
    del lease


async def test_an_older_version_never_overwrites_a_newer_one(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name)
    await create_policy(redis_client, crawl_name, {"per_host_delay": 2}, by="test")
    await set_policy(redis_client, crawl_name, {"per_host_delay": 3}, by="test")
    await apply_policy(redis_client, crawl_name, 1, CrawlPolicy(per_host_delay=2))
    assert await redis_client.hmget(q.partitions[0].conf, "delay", "policy_version") == [
        b"3000", b"2"]


async def test_a_crawl_made_without_a_policy_is_adopted(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The previous crawlq wrote the consumers' flags into every partition's conf and
    kept no policy: show says so, and the first ensure adopts partition 0's values."""
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    for pk in q.partitions:  # as the old Frontier.set_defaults wrote them
        await redis_client.hset(pk.conf, mapping={"delay": 700, "concurrency": 3})
    code, _, err = await crawlq(redis_url, "crawl", "show", "--crawl", crawl_name)
    assert code == 2 and "has no policy object: an earlier crawlq made it" in err
    assert "per_host_delay=0.7s, per_host_concurrency=3" in err

    stored, created = await ensure_policy(redis_client, crawl_name, CrawlPolicy(0, 0),
                                          by="consumer w (created the crawl)")
    assert not created and stored.policy == CrawlPolicy(0.7, 3)
    assert [(e["by"], e["version"]) for e in stored.log] == [("migration", 1)]
    assert await confs(redis_client, q) == [
        {b"delay": b"700", b"concurrency": b"3", b"policy_version": b"1", **ADAPT_OFF}] * 2

    # `crawl create` on such a crawl: adopted first, then its values, each logged.
    other = crawl_name + "-c"
    q2 = await LeasingQueue.open(redis_client, other)
    await redis_client.hset(q2.partitions[0].conf, mapping={"delay": 700, "concurrency": 3})
    await ok(redis_url, "crawl", "create", "--crawl", other, "per_host_delay=1s")
    doc = json.loads(await ok(redis_url, "crawl", "show", "--crawl", other, "--json"))
    assert [(e["by"], e["changes"]) for e in doc["log"]] == [
        ("crawlq crawl create", {"per_host_delay": ["0.7s", "1s"]}),
        ("migration", {"per_host_delay": [None, "0.7s"], "per_host_concurrency": [None, "3"],
                       "accept_content_type": [None, "*/*"], "user_agent": [None, UA],
                       "ignore_robots": [None, "false"], "robots_ttl": [None, "86400s"],
                       "max_depth": [None, "none"], "allow_domains": [None, "@parent"],
                       "retry_base": [None, "2s"], "retry_cap": [None, "600s"],
                       "max_retry_after": [None, "3600s"], "max_stalls": [None, "2"],
                       "max_attempts": [None, "3"], "recrawl_after": [None, "0s"],
                       "backoff_on": [None, "429,503"], "backoff_base": [None, "1s"],
                       "backoff_cap": [None, "3600s"], "backoff_forgive": [None, "300s"],
                       "adaptive_delay": [None, "0"], "max_delay": [None, "30s"],
                       "max_crawl_delay": [None, "300s"], "revisit": [None, "off"],
                       "min_interval": [None, "60s"], "max_interval": [None, "7776000s"],
                       "interval_grow": [None, "0.4"], "interval_shrink": [None, "0.2"],
                       "conditional": [None, "true"], "trap_max_url_length": [None, "1024"],
                       "trap_max_segments": [None, "20"],
                       "trap_repeated_segments": [None, "2"], "trap_max_params": [None, "12"],
                       "trap_path_variants": [None, "1000"], "trap_page_facets": [None, "2"],
                       "trap_session_ids": [None, "true"],
                       "near_duplicate_distance": [None, "0"], "soft_404": [None, "true"],
                       "drop_judged_items": [None, "false"], "rendering": [None, "off"],
                       "politeness_key": [None, "host"], "group_delay": [None, "1s"],
                       "group_concurrency": [None, "2"],
                       **{k: [None, v] for k, v in PROXY_TEXTS.items()}})]


async def test_a_policy_without_the_newer_keys_takes_them_from_the_first_consumer(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A policy an earlier crawlq made holds only the keys it knew: the first consumer
    (or producer) adds the others, from its flags; the values it holds stay."""
    await create_policy(redis_client, crawl_name, {"per_host_delay": 0.5}, by="test")
    newer = ("user_agent", "ignore_robots", "robots_ttl", "max_depth", "allow_domains",
             "retry_base", "retry_cap", "max_retry_after", "max_stalls", "max_attempts",
             "recrawl_after")
    await redis_client.hdel(CrawlKeys.build(crawl_name).policy, *newer)
    wanted = CrawlPolicy(per_host_delay=2, user_agent="mine/1", ignore_robots=True,
                         robots_ttl=60, max_depth=1, retry_base=0.25, retry_cap=5,
                         max_retry_after=0, max_stalls=4, max_attempts=6, recrawl_after=3600)
    stored, created = await ensure_policy(redis_client, crawl_name, wanted, by="consumer w")
    assert not created
    assert stored.policy == CrawlPolicy(per_host_delay=0.5, user_agent="mine/1",
                                        ignore_robots=True, robots_ttl=60, max_depth=1,
                                        retry_base=0.25, retry_cap=5, max_retry_after=0,
                                        max_stalls=4, max_attempts=6, recrawl_after=3600)
    assert stored.version == 2
    assert (stored.log[0]["by"], set(stored.log[0]["changes"])) == ("consumer w", set(newer))
    again, _ = await ensure_policy(redis_client, crawl_name, CrawlPolicy(), by="producer")
    assert (again.version, again.policy) == (2, stored.policy)


async def test_each_command_adds_only_the_missing_keys_its_flags_seed(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path) -> None:
    """A consumer adds robots_ttl (and the other keys of its flags) to a policy an
    earlier crawlq made, not max_attempts and recrawl_after, which are the producer's
    flags: so the producer of an upgraded crawl keeps its --recrawl-after and
    --max-attempts (the next run adds them, then stamps its tasks with them); until then
    they read as their defaults."""
    await create_policy(redis_client, crawl_name, {}, by="test")
    keys = CrawlKeys.build(crawl_name)
    await redis_client.hdel(keys.policy, "robots_ttl", "max_attempts", "recrawl_after")
    assert await read_policy(redis_client, crawl_name) is not None
    settings = consumer_settings(redis_url, crawl_name, tmp_path, "--worker-id", "c",
                                 "--robots-ttl", "2h")
    assert await asyncio.wait_for(run(settings), 60) == 0  # no crawl: it gives up
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 2
    assert stored.log[0]["changes"] == {"robots_ttl": [None, "7200s"]}
    assert (stored.policy.max_attempts, stored.policy.recrawl_after) == (3, 0)  # defaults

    assert await producer_main(["--redis-url", redis_url, "--crawl", crawl_name, "--cluster",
                                "no", "--progress", "off", "--url", "https://a.test/1",
                                "--max-attempts", "6", "--recrawl-after", "1d"]) == 0
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.version == 3
    assert (stored.log[0]["by"], stored.log[0]["changes"]) == (
        "producer", {"max_attempts": [None, "6"], "recrawl_after": [None, "86400s"]})
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    await Frontier(queue).set_defaults(delay_s=0, concurrency=0)
    [lease] = await queue.lease("w", 1, 60_000)
    assert lease.task.max_attempts == 6


async def test_accept_content_type_is_set_shown_and_normalized(
        redis_url: str, crawl_name: str) -> None:
    await ok(redis_url, "crawl", "create", "--crawl", crawl_name)
    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name,
                   "accept_content_type=Text/HTML, application/xhtml+xml")
    assert "version 2 set" in out and \
        "accept_content_type=text/html,application/xhtml+xml" in out
    text = await ok(redis_url, "crawl", "show", "--crawl", crawl_name)
    assert [ln.split()[:2] for ln in text.splitlines()[1:4]][2] == [
        "accept_content_type", "text/html,application/xhtml+xml"]
    code, out, err = await crawlq(redis_url, "crawl", "set", "--crawl", crawl_name,
                                  "accept_content_type=pdf")
    assert (code, out) == (2, "") and "accept_content_type: bad value 'pdf'" in err
    out = await ok(redis_url, "crawl", "set", "--crawl", crawl_name, "accept_content_type=*/*")
    assert "version 3 set" in out and "accept_content_type=*/*" in out


# -- applied live by running consumers ---------------------------------------------------


@contextlib.asynccontextmanager
async def running(settings: ConsumerSettings) -> AsyncIterator[None]:
    """A consumer running in this process until the block ends (then SIGTERM: it drains)."""
    consumer = asyncio.create_task(run(settings))
    await asyncio.sleep(0.05)  # its signal handlers are in place
    try:
        yield
    finally:
        if not consumer.done():
            os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(consumer, 10) == 0


def live_settings(redis_url: str, crawl: str, out: Path, *extra: str) -> ConsumerSettings:
    """A consumer that keeps running when the crawl is empty; heartbeats every second."""
    args = [a for a in consumer_args(redis_url, crawl, out, "--lease", "3s", "--grace", "1s",
                                     *extra) if a != "--exit-when-empty"]
    return settings_from_args(build_parser().parse_args(args))


async def until(what: str, check: Callable[[], Awaitable[bool]], limit_s: float = 5.0
                ) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {limit_s}s: {what}"
        await asyncio.sleep(0.01)


async def changed(redis_client: aioredis.Redis, crawl: str, caplog: pytest.LogCaptureFixture,
                  **values: object) -> None:
    """Change the policy; the running consumer applies the new version within a second."""
    stored = await set_policy(redis_client, crawl, values, by="test")

    async def applied() -> bool:
        return any(r.getMessage() == "crawl_policy_applied"
                   and getattr(r, "version", None) == stored.version for r in caplog.records)
    await until(f"policy version {stored.version} applied", applied, limit_s=1.0)


class Probe:
    """Enqueues a site's pages for a running consumer and sees what became of them."""

    def __init__(self, queue: LeasingQueue, site: Site,
                 seen: list[tuple[str, str]] | None = None) -> None:
        self.queue, self.site, self.seen = queue, site, seen if seen is not None else []
        self.wake = WakeChannel(queue.client, queue.crawl_keys.wake)

    async def enqueue(self, path: str) -> None:
        url = self.site.url(path)
        await self.queue.enqueue([NewTask(url, fingerprint(url))])
        await self.wake.notify()

    def agents(self, path: str) -> list[str]:
        """The User-Agent of each request to `path`."""
        return [agent for p, agent in self.seen if p == path]

    async def fetched(self, path: str) -> str:
        """Enqueue `path` and wait for its request: its User-Agent."""
        await self.enqueue(path)

        async def asked() -> bool:
            return bool(self.agents(path) or self.site.hits.get(path))
        await until(f"{path} fetched", asked)
        return (self.agents(path) or [""])[0]

    async def disallowed(self, path: str) -> None:
        """Enqueue `path` and wait until it ends robots_disallowed, never requested."""
        before = await self.outcomes("robots_disallowed")
        await self.enqueue(path)

        async def ended() -> bool:
            return await self.outcomes("robots_disallowed") > before
        await until(f"{path} disallowed", ended)
        assert not self.agents(path)

    async def outcomes(self, outcome: str) -> int:
        return (await self.queue.stats()).counters.get(f"outcome:{outcome}", 0)


ROBOTS_BY_AGENT = "User-agent: *\nDisallow: /private/\n\nUser-agent: second\nDisallow: /secret/\n"


async def test_a_running_consumer_takes_a_new_user_agent_and_robots_rule(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """user_agent and ignore_robots apply without a restart: the requests after a change
    carry the new User-Agent, the cached robots.txt is judged for its product token, and
    robots.txt is ignored, then obeyed again. The consumer's own flags (robots off,
    another agent) lose to the crawl's values throughout."""
    caplog.set_level(logging.INFO, logger="consumer")
    seen: list[tuple[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("User-Agent", "")))
        if request.path == "/robots.txt":
            return web.Response(text=ROBOTS_BY_AGENT)
        return web.Response(text="<html><body>ok</body></html>", content_type="text/html")

    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "user_agent": "first/1.0"}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)
    routes: dict[str, Handler] = {
        path: answer for path in ("/robots.txt", "/p/{i}", "/private/{i}", "/secret/{i}")}
    async with serve(routes) as site, running(live_settings(
            redis_url, crawl_name, tmp_path, "--user-agent", "flag/9.9")):
        probe = Probe(queue, site, seen)
        assert await probe.fetched("/p/1") == "first/1.0"
        assert probe.agents("/robots.txt") == ["first/1.0"]
        await probe.disallowed("/private/1")  # group *
        assert await probe.fetched("/secret/1") == "first/1.0"

        await changed(redis_client, crawl_name, caplog, user_agent="second/2.0")
        assert await probe.fetched("/p/2") == "second/2.0"
        await probe.disallowed("/secret/2")  # the cached robots.txt, group second
        assert await probe.fetched("/private/2") == "second/2.0"
        assert probe.agents("/robots.txt") == ["first/1.0"]  # not fetched again

        await changed(redis_client, crawl_name, caplog, ignore_robots=True)
        assert await probe.fetched("/secret/3") == "second/2.0"
        await changed(redis_client, crawl_name, caplog, ignore_robots=False)
        await probe.disallowed("/secret/4")
    assert "flag/9.9" not in {agent for _, agent in seen}


async def test_a_running_consumer_takes_a_new_link_depth_and_domains(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """max_depth and allow_domains apply to the pages finished after a change: a seed's
    links (depth 1) are dropped under max_depth 0, enqueued under 1, and those to another
    host once allow_domains names it. The consumer's own flags lose to the crawl's."""
    caplog.set_level(logging.INFO, logger="consumer")

    async def seed(request: web.Request) -> web.Response:
        i, port = request.match_info["i"], request.url.port
        return web.Response(text=f'<a href="/child/{i}">same host</a> '
                                 f'<a href="http://localhost:{port}/other/{i}">other</a>',
                            content_type="text/html")

    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "ignore_robots": True,
        "max_depth": 0}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)

    def done(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await queue.stats()).done >= n
        return check

    routes: dict[str, Handler] = {"/seed/{i}": seed, "/child/{i}": page, "/other/{i}": page}
    async with serve(routes) as site, running(live_settings(
            redis_url, crawl_name, tmp_path, "--handler", "consumer.handlers:links",
            "--max-depth", "3", "--allow-domains", "localhost")):
        probe = Probe(queue, site)
        await probe.enqueue("/seed/1")
        await until("seed 1 done", done(1))
        stats = await queue.stats()
        assert (stats.done, stats.pending, stats.leased, stats.waiting) == (1, 0, 0, 0)

        await changed(redis_client, crawl_name, caplog, max_depth=1)
        await probe.enqueue("/seed/2")
        await until("seed 2 and its child done", done(3))
        assert "/child/2" in site.hits and "/other/2" not in site.hits  # the page's host
        assert "/child/1" not in site.hits

        await changed(redis_client, crawl_name, caplog,
                      allow_domains=("127.0.0.1", "localhost"))
        await probe.enqueue("/seed/3")
        await until("seed 3 and both its links done", done(6))
        assert "/child/3" in site.hits and "/other/3" in site.hits


async def test_a_running_consumer_takes_a_new_retry_base(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A task that fails (a 500 with Retry-After: 0, so its delay is the backoff itself,
    without jitter) waits retry_base before its first retry: the crawl's 1 h, not the
    consumer's --retry-base 0.05s; after a change to 1.5 s, the next failure waits 1.5 s.
    Due times are judged on Redis TIME."""
    caplog.set_level(logging.INFO, logger="consumer")
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "ignore_robots": True,
        "retry_base": 3600, "retry_cap": 7200}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)
    delayed = queue.partitions[0].delayed
    wake = WakeChannel(redis_client, queue.crawl_keys.wake)

    async def due_after_failing(url: str) -> tuple[int, int, float]:
        """Enqueue `url`; when its failure is recorded: Redis TIME before, after, and
        its due time."""
        member = fingerprint(url).hex()
        before = await redis_ms(redis_client)
        await queue.enqueue([NewTask(url, fingerprint(url))])
        await wake.notify()

        async def waiting() -> bool:
            return await redis_client.zscore(delayed, member) is not None
        await until(f"{url} failed and waiting", waiting)
        due = await redis_client.zscore(delayed, member)
        assert due is not None
        return before, await redis_ms(redis_client), due

    async with test_site() as site, running(live_settings(redis_url, crawl_name, tmp_path)):
        before, after, due = await due_after_failing(site.url("/status/500?retry_after=0"))
        assert before + 3_600_000 <= due <= after + 3_600_000

        await changed(redis_client, crawl_name, caplog, retry_base=1.5)
        before, after, due = await due_after_failing(
            site.url("/status/500?retry_after=0&again=1"))
        assert before + 1_500 <= due <= after + 1_500
        assert site.hits["/status/500"] == 2


async def test_a_running_consumer_stamps_links_with_the_crawls_attempts_and_window(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The links of the pages finished after a change get the crawl's new max_attempts
    (not their parent's: the seeds have 9) and follow its new recrawl window, without a
    restart: a failing link dies after 2 attempts, then after 1; a done link linked
    again is fetched again only once recrawl_after lets it."""
    caplog.set_level(logging.INFO, logger="consumer")

    async def seed(request: web.Request) -> web.Response:
        i = request.match_info["i"]
        return web.Response(text=f'<a href="/fail/{i}">x</a> <a href="/child">y</a>',
                            content_type="text/html")

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, headers={"Retry-After": "0"})

    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "ignore_robots": True,
        "max_depth": 1, "retry_base": 0.05, "retry_cap": 0.05, "max_attempts": 2}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)
    wake = WakeChannel(redis_client, queue.crawl_keys.wake)

    async def crawled(site: Site, i: int) -> None:
        """Enqueue seed `i` (9 attempts); wait until its failing link is dead."""
        url = site.url(f"/seed/{i}")
        await queue.enqueue([NewTask(url, fingerprint(url), max_attempts=9)])
        await wake.notify()

        async def dead() -> bool:
            return len(await queue.dead_list()) >= i
        await until(f"/fail/{i} dead", dead)

    async def attempts_of(path: str) -> tuple[int, int]:
        """A dead link's attempts, and the max_attempts its task was stamped with."""
        [dead] = [d for d in await queue.dead_list() if d.url and d.url.endswith(path)]
        assert dead.raw is not None
        return dead.attempts, decode_entry(dead.raw).max_attempts

    routes: dict[str, Handler] = {"/seed/{i}": seed, "/fail/{i}": fail, "/child": page}
    async with serve(routes) as site, running(live_settings(
            redis_url, crawl_name, tmp_path, "--handler", "consumer.handlers:links")):
        await crawled(site, 1)
        assert await attempts_of("/fail/1") == (2, 2)
        assert len(site.hits["/child"]) == 1

        await changed(redis_client, crawl_name, caplog, max_attempts=1)
        await window_passed(redis_client, 1)
        await crawled(site, 2)
        assert await attempts_of("/fail/2") == (1, 1)
        assert len(site.hits["/child"]) == 1  # done, no window: not fetched again

        await changed(redis_client, crawl_name, caplog, recrawl_after=1)
        await crawled(site, 3)

        async def fetched_again() -> bool:
            return len(site.hits["/child"]) == 2
        await until("/child fetched again", fetched_again)
    assert len(site.hits["/fail/1"]) == 2 and len(site.hits["/fail/3"]) == 1


async def test_a_running_consumer_takes_a_new_robots_ttl(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """robots_ttl applies to the robots.txt fetched after a change, without a restart:
    the fleet's copy expires after the crawl's TTL (not the consumer's --robots-ttl), and
    after a change to 1 s, an origin's robots.txt is fetched again a second later; the
    copy held before the change keeps its expiry."""
    caplog.set_level(logging.INFO, logger="consumer")
    robots: list[str] = []  # the host of each robots.txt request

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/robots.txt":
            robots.append(request.host.rpartition(":")[0])
            return web.Response(text="User-agent: *\nDisallow: /private/\n")
        return web.Response(text="<html><body>ok</body></html>", content_type="text/html")

    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)
    keys = CrawlKeys.build(crawl_name)
    routes: dict[str, Handler] = {"/robots.txt": answer, "/p/{i}": answer}
    async with serve(routes) as site, running(live_settings(
            redis_url, crawl_name, tmp_path, "--robots-ttl", "5h")):
        probe = Probe(queue, site)
        other = Probe(queue, Site(site.base.replace("127.0.0.1", "localhost"), site.hits))
        await probe.fetched("/p/1")
        assert robots == ["127.0.0.1"]
        ttl = await redis_client.pttl(keys.robots(site.base))
        assert 5 * 3_600_000 < ttl <= 86_400_000  # the crawl's 1d, not the flag's 5h

        await changed(redis_client, crawl_name, caplog, robots_ttl=1)
        await other.fetched("/p/2")
        assert robots == ["127.0.0.1", "localhost"]
        assert 0 < await redis_client.pttl(keys.robots(other.site.base)) <= 1000
        await asyncio.sleep(1.1)
        await other.fetched("/p/3")
        await probe.fetched("/p/4")  # fetched before the change: still cached
        assert robots == ["127.0.0.1", "localhost", "localhost"]


async def test_a_consumer_of_a_bloom_crawl_enqueues_links_without_the_window(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A policy given recrawl_after before its crawl existed, and a crawl then made with
    bloom dedup (the Python API; the producer refuses it): a consumer enqueues its links
    without a window, and says so."""
    caplog.set_level(logging.INFO, logger="consumer")

    async def seed(request: web.Request) -> web.Response:
        return web.Response(text='<a href="/child/1">x</a>', content_type="text/html")

    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "ignore_robots": True,
        "recrawl_after": 3600}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name,
                                  CrawlSettings(dedup=DedupMode.BLOOM))
    async with serve({"/seed": seed, "/child/{i}": page}) as site:
        await queue.enqueue([NewTask(site.url("/seed"), fingerprint(site.url("/seed")))])
        settings = consumer_settings(redis_url, crawl_name, tmp_path, "--handler",
                                     "consumer.handlers:links")
        assert await asyncio.wait_for(run(settings), 60) == 0
    stats = await queue.stats()
    probes = stats.counters.get("outcome:probe", 0)  # the crawl's soft-404 probe of the host
    assert (stats.done - probes, stats.dead) == (2, 0) and site.hits["/child/1"]
    [warned] = [r for r in caplog.records if r.getMessage() == "crawl_policy_not_applied"]
    assert (warned.levelno, warned.key, warned.value) == (  # type: ignore[attr-defined]
        logging.WARNING, "recrawl_after", "3600s")
