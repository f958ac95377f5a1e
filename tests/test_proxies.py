"""The proxy pool, fleet-wide (issue 47): bans per host, quarantine with backoff, tiers
escalated and de-escalated per host, picks from a local snapshot, reports with the flush;
`crawlq proxies` and the dashboard show them redacted.

The scripts are driven through `common.proxies` on a real Redis; the consumer-level
tests run real consumers through local forward proxies (tests/support/forward_proxy.py)
in front of one site that answers many host names and bans some proxies per host."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.consume import consume, enqueue
from support.forward_proxy import ForwardProxy, banning_site, proxies

from common.keys import CrawlKeys
from common.policy import CrawlPolicy, create_policy
from common.proxies import (
    DIRECT,
    HostTier,
    PoolView,
    ProxyHealth,
    ProxyRules,
    ProxySpec,
    Report,
    ReportCalls,
    proxy_spec,
    read_pool,
    send_report,
)
from common.queue import CrawlQueue, CrawlSettings, LeasingQueue
from console.cli import main_async
from consumer.proxypool import ProxyPool

pytestmark = pytest.mark.timeout(90)

SECRET = "s3cr3t-pw"


def spec(name: str, tier: str = "datacenter") -> ProxySpec:
    return ProxySpec.of(f"http://user:{SECRET}@{name}.proxy.test:8000", tier)


async def calls_for(client: aioredis.Redis, crawl: str, worker: str = "w") -> ReportCalls:
    q = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=2))
    return ReportCalls(client, crawl, q.partitions, q.partition_of, worker)


def pool_of(calls: ReportCalls, specs: list[ProxySpec], rules: ProxyRules) -> ProxyPool:
    return ProxyPool(specs, calls, lambda: rules)


# -- the scripts --------------------------------------------------------------------------

async def test_failures_in_a_row_quarantine_a_proxy_for_twice_as_long_each_time(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    calls = await calls_for(redis_client, crawl_name)
    rules = ProxyRules(max_failures=2, quarantine_ms=400)
    p = spec("a")

    async def report(*outcomes: str) -> int:
        r = Report()
        for o in outcomes:
            r.succeeded(p, 0.01) if o == "ok" else r.failed(p)
        until, _ = await send_report(calls, r, rules)
        return until[p.id]

    assert await report("fail") == 0
    assert await report("fail", "ok") == 0  # its last outcome a success: no streak
    assert await report("ok", "fail") == 0  # one failure after its last success
    first = await report("fail")  # two in a row, the fleet's reports added up
    view = await read_pool(redis_client, crawl_name, calls.partitions)
    health = view.proxies[p.id]
    assert 350 <= first - view.now_ms <= 400 and health.level == 1
    assert await report("fail", "fail", "fail") == first  # reported while it lasts: no more
    assert (await read_pool(redis_client, crawl_name, calls.partitions)).proxies[p.id].fail == 7
    await asyncio.sleep(0.45)
    second = await report("fail", "fail")
    now = (await read_pool(redis_client, crawl_name, calls.partitions)).now_ms
    assert 750 <= second - now <= 800  # twice the first
    await asyncio.sleep(0.85)
    assert await report("fail", "ok") == 0
    health = (await read_pool(redis_client, crawl_name, calls.partitions)).proxies[p.id]
    assert (health.level, health.streak, health.ok, health.fail) == (0, 0, 3, 10)
    assert SECRET not in health.shown and health.shown == "http://***@a.proxy.test:8000"


async def test_a_report_sent_again_counts_nothing_twice(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    calls = await calls_for(redis_client, crawl_name)
    keys = CrawlKeys.build(crawl_name)
    p = spec("a")
    args = ["op-1", 1000, 32000, 3, *[p.id, p.tier, p.shown, 2, 1, 1, 0, 20]]
    first = await calls.report(keys=[keys.proxies, keys.proxy_op("w")], args=args)
    again = await calls.report(keys=[keys.proxies, keys.proxy_op("w")], args=args)
    assert first == again
    health = (await read_pool(redis_client, crawl_name, calls.partitions)).proxies[p.id]
    assert (health.ok, health.fail) == (2, 1)


async def test_a_ban_is_the_hosts_alone_and_escalates_it_a_tier_then_quiet_brings_it_back(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    calls = await calls_for(redis_client, crawl_name)
    rules = ProxyRules(tiers=("direct", "datacenter", "residential"), ban_ms=60_000,
                       tier_bans=2, quiet_ms=500)
    d1, d2 = spec("d1"), spec("d2")
    r = Report()
    r.banned(DIRECT, "a.test", exhausted=True)  # the only member of its tier
    _, tiers = await send_report(calls, r, rules)
    assert tiers == {"a.test": "datacenter"}
    r = Report()
    r.banned(d1, "a.test", exhausted=False)
    r.banned(d1, "b.test", exhausted=False)  # above b's tier: a pick escalated it there
    r.banned(DIRECT, "b.test", exhausted=True)  # below its tier now: not counted there
    _, tiers = await send_report(calls, r, rules)
    assert tiers == {"a.test": "datacenter", "b.test": "datacenter"}
    view = await read_pool(redis_client, crawl_name, calls.partitions)
    assert view.tiers["b.test"].bans == 1
    r = Report()
    r.banned(d2, "a.test", exhausted=False)  # a second ban at its tier
    _, tiers = await send_report(calls, r, rules)
    assert tiers == {"a.test": "residential"}
    view = await read_pool(redis_client, crawl_name, calls.partitions)
    assert set(view.bans) == {("direct", "a.test"), (d1.id, "a.test"), (d1.id, "b.test"),
                              ("direct", "b.test"), (d2.id, "a.test")}
    pool = pool_of(calls, [d1, d2, spec("r1", "residential")], rules)
    await pool.refresh()
    assert pool.tier_of("a.test", rules.tiers, rules, view.now_ms) == 2
    await asyncio.sleep(0.6)  # one quiet period: a tier down
    await pool.refresh()
    assert pool.tier_of("a.test", rules.tiers, rules, pool.now_ms()) == 1
    r = Report()
    r.gone("a.test", 0)  # the record is rewritten as of now
    _, tiers = await send_report(calls, r, rules)
    assert tiers == {"a.test": "datacenter"}


async def test_a_host_no_proxy_reaches_is_blocked_for_the_fleet_and_never_shortened(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await enqueue(redis_client, crawl_name, ["http://a.test/1"])
    calls = ReportCalls(redis_client, crawl_name, q.partitions, q.partition_of, "w")
    r = Report()
    r.gone("a.test", 60_000)
    await send_report(calls, r, ProxyRules())
    r = Report()
    r.gone("a.test", 1_000)
    await send_report(calls, r, ProxyRules())
    pk = q.partitions[q.partition_of("a.test")]
    until = await redis_client.zscore(pk.blocked, "a.test")
    secs, _ = await redis_client.time()
    assert until is not None and 59_000 < until - int(secs) * 1000 <= 61_000
    assert await q.lease("w", 5, 10_000) == []  # nobody leases its tasks meanwhile


# -- picks ----------------------------------------------------------------------------------

def view_of(**kw: Any) -> PoolView:
    return PoolView(now_ms=10_000_000, **kw)


async def test_picks_skip_what_a_host_banned_and_what_is_quarantined_tier_by_tier(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    calls = await calls_for(redis_client, crawl_name)
    rules = ProxyRules(tiers=("direct", "datacenter", "residential"))
    d1, d2, r1 = spec("d1"), spec("d2"), spec("r1", "residential")
    pool = pool_of(calls, [d1, d2, r1], rules)
    now = 10_000_000
    pool.view = view_of(bans={("direct", "a.test"): now + 5000, (d1.id, "a.test"): now + 5000},
                        proxies={d2.id: ProxyHealth(d2.id, "datacenter", 0, 3, 0, 0, 1,
                                                    now + 5000, -1, now, d2.shown)})
    assert pool.pick("b.test") is DIRECT  # the cheapest tier first
    assert pool.pick("a.test") is r1  # direct and d1 banned by a, d2 quarantined
    pool.view.tiers["c.test"] = HostTier("datacenter", now, 0)
    assert {pool.pick("c.test") for _ in range(4)} == {d1}  # its tier; d2 quarantined
    pool.view.bans[(r1.id, "a.test")] = now + 5000
    assert pool.pick("a.test") is None
    assert 4900 <= pool.wait_ms("a.test") <= 5000
    pool.view.tiers["d.test"] = HostTier("residential", now, 0)
    pool.view.bans[(r1.id, "d.test")] = now + 5000
    assert pool.pick("d.test") is d1  # none left at or above its tier: a cheaper one


async def test_a_consumer_stops_picking_a_proxy_at_once_when_it_fails_or_is_banned(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    calls = await calls_for(redis_client, crawl_name)
    rules = ProxyRules(max_failures=2)
    d1, d2 = spec("d1"), spec("d2")
    pool = pool_of(calls, [d1, d2], rules)
    pool.banned(d1, "a.test")
    assert {pool.pick("a.test") for _ in range(4)} == {d2}
    assert {pool.pick("b.test") for _ in range(4)} == {d1, d2}  # other hosts keep it
    pool.failed(d2)
    pool.failed(d2)
    assert {pool.pick("b.test") for _ in range(4)} == {d1}
    assert pool.pick("a.test") is None  # d1 banned by a, d2 quarantined
    assert pool.report.urgent()
    await pool.flush()
    fresh = pool_of(calls, [d1, d2], rules)  # another consumer, from the fleet's record
    await fresh.refresh()
    assert {fresh.pick("a.test") for _ in range(4)} == {None}
    assert {fresh.pick("b.test") for _ in range(4)} == {d1}


def test_a_proxy_flag_names_its_tier_and_never_echoes_its_url() -> None:
    assert proxy_spec("http://u:p@h:1").tier == "datacenter"
    s = proxy_spec(f"residential=http://u:{SECRET}=x@h:1")
    assert (s.tier, s.url, s.shown) == ("residential", f"http://u:{SECRET}=x@h:1",
                                         "http://***@h:1")
    assert SECRET not in repr(s)
    assert proxy_spec(f"http://u:{SECRET}@h:1").id == proxy_spec("http://u:other@h:1").id


# -- consumers through local proxies --------------------------------------------------------

async def crawl_through(redis_client: aioredis.Redis, redis_url: str, crawl: str,
                        tmp_path: Path, px: dict[str, ForwardProxy], *, urls: list[str],
                        **policy: Any) -> LeasingQueue:
    await create_policy(redis_client, crawl, {
        "per_host_delay": 0.0, "per_host_concurrency": 2, "retry_base": 0.05,
        "retry_cap": 0.1, "ignore_robots": True, **policy}, by="test")
    q = await enqueue(redis_client, crawl, urls)
    assert await consume(redis_url, crawl, tmp_path / "out", *[
        a for p in px.values() for a in ("--proxy", p.url)]) == 0
    return q


async def test_a_proxy_a_host_bans_is_not_used_for_it_by_the_fleet_but_for_the_others(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with banning_site({"a.test": {"p2": "403"}}) as site, \
            proxies(site.base, ["p1", "p2", "p3"], auth={"p2": ("u", SECRET)}) as px:
        urls = [f"http://{h}.test/p/{i}" for h in "ab" for i in range(30)]
        q = await crawl_through(redis_client, redis_url, crawl_name, tmp_path, px, urls=urls)
        stats = await q.stats()
        assert (stats.done, stats.dead) == (60, 0)
        # At most the requests in flight to a.test (its concurrency) when the first ban
        # came back went through p2.
        assert site.seen[("a.test", "p2")] <= 2
        assert site.seen[("b.test", "p2")] >= 5  # the others keep it
        # Another consumer, later: the fleet's record keeps p2 from a.test from the start.
        before = site.seen[("a.test", "p2")]
        await enqueue(redis_client, crawl_name, [f"http://a.test/p/{i}" for i in range(30, 60)])
        assert await consume(redis_url, crawl_name, tmp_path / "out2", *[
            a for p in px.values() for a in ("--proxy", p.url)]) == 0
        assert site.seen[("a.test", "p2")] == before
        assert (await q.stats()).done == 90
        out = await cli_out(redis_url, crawl_name)
        doc = await cli_out(redis_url, crawl_name, "--json")
    assert SECRET not in out and SECRET not in doc
    found = json.loads(doc)
    by_id = {p["id"]: p for p in found["proxies"]}
    p2 = proxy_spec(px["p2"].url)
    assert by_id[p2.id]["banned_by"] == 1 and by_id[p2.id]["shown"] == p2.shown
    assert [(h["host"], h["banned"]) for h in found["hosts"]] == [("a.test", [p2.id])]
    assert p2.shown in out and "a.test" in out


async def test_a_dead_proxy_costs_a_few_requests_and_is_tried_again_after_its_quarantine(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async with banning_site({}) as site, proxies(site.base, ["p1", "p2"]) as px:
        await px["p2"].kill()
        urls = [f"http://{h}.test/p/{i}" for h in "abc" for i in range(20)]
        q = await crawl_through(redis_client, redis_url, crawl_name, tmp_path, px, urls=urls,
                                proxy_quarantine=0.5)
        assert (await q.stats()).done == 60
        view = await read_pool(redis_client, crawl_name, q.partitions)
        dead = view.proxies[proxy_spec(px["p2"].url).id]
        # The requests in flight through it when it failed, no more: each went on at once
        # through p1 (its host never saw it).
        assert 3 <= dead.fail <= 8 and dead.ok == 0
        assert sum(site.seen.values()) == 60
        await asyncio.sleep(0.6)
        await px["p2"].revive()
        await enqueue(redis_client, crawl_name, [f"http://d.test/p/{i}" for i in range(20)])
        assert await consume(redis_url, crawl_name, tmp_path / "out2", *[
            a for p in px.values() for a in ("--proxy", p.url)]) == 0
        assert px["p2"].hits["d.test"] >= 5  # back in use


async def cli_out(redis_url: str, crawl: str, *extra: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert await main_async(["proxies", "--redis-url", redis_url, "--crawl", crawl,
                                 *extra]) == 0
    return out.getvalue()


async def test_the_dashboard_shows_the_pool_redacted(
        redis_client: aioredis.Redis, crawl_name: str, make_client: Any) -> None:
    calls = await calls_for(redis_client, crawl_name)
    r = Report()
    r.succeeded(spec("a"), 0.05)
    r.banned(spec("a"), "x.test", exhausted=False)
    await send_report(calls, r, CrawlPolicy().proxy_rules())
    client = await make_client()
    resp = await client.get(f"/api/crawls/{crawl_name}/proxies")
    text = await resp.text()
    assert resp.status == 200 and SECRET not in text
    doc = json.loads(text)
    assert [p["shown"] for p in doc["proxies"]] == ["http://***@a.proxy.test:8000"]
    assert doc["hosts"][0]["host"] == "x.test"
