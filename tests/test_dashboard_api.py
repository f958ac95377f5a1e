"""The dashboard's JSON API and security model, in process, against a real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient
from support.crawls import Crawl
from support.dashboard import AUTH, ClientFactory, error_of
from support.dashboard import DASHBOARD_TOKEN as TOKEN

from common.errors import ConfigError
from common.fleet.history import record
from common.fleet.workers import WorkerRegistry
from common.frontier.hosts import Frontier
from common.policy import set_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.redis.server import RedisServer
from common.urls.canonical import fingerprint
from console.cli import main_async
from console.dashboard.security import check_bind

#: 10 tasks: 3 done, 4 dead http_5xx, 1 dead timeout, 2 pending (the ``crawl`` fixture).
pytestmark = pytest.mark.crawl_states(host="api.example", done=3, pending=2, dead=(
    ("http_5xx", "HTTP 503", 4), ("timeout", "read timeout", 1)))


@pytest.fixture(scope="module")
def module_redis() -> Iterator[RedisServer]:
    """This module's own redis-server: /api/crawls lists the first MAX_CRAWLS crawls by
    name, and the session's Redis may hold more than that from other tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(module_redis: RedisServer) -> str:
    return module_redis.url


async def test_views(make_client: ClientFactory, crawl: Crawl,
                     redis_client: aioredis.Redis) -> None:
    client = await make_client()
    await WorkerRegistry(redis_client, crawl.name, "w-a", ttl_s=30).beat(
        in_flight=2, done=5, failed=1, state="running")

    doc = await (await client.get(f"/api/crawls/{crawl.name}")).json()
    assert doc["states"] == {"pending": 2, "leased": 0, "waiting": 0, "dead": 5, "done": 3}
    assert doc["settings"] == {"partitions": 2, "dedup": "exact"}
    assert doc["dead_reasons"] == {"http_5xx": 4, "timeout": 1}
    assert doc["outcomes"] == {"ok": 3} and doc["workers"] == 1
    assert 0 <= doc["now_ms"] - doc["created_ms"] < 60_000
    assert doc["revisits"] is None  # revisits off, no history: nothing shown

    listed = await (await client.get("/api/crawls")).json()
    [row] = [c for c in listed["crawls"] if c["crawl"] == crawl.name]
    assert row["states"] == doc["states"] and listed["total"] >= 1

    workers = await (await client.get(f"/api/crawls/{crawl.name}/workers")).json()
    [w] = workers["workers"]
    assert (w["id"], w["in_flight"], w["done"], w["stale"]) == ("w-a", 2, 5, False)

    page = await (await client.get(f"/api/crawls/{crawl.name}/dead?size=3")).json()
    assert (page["total"], page["page"], len(page["items"])) == (5, 0, 3)
    rest = await (await client.get(f"/api/crawls/{crawl.name}/dead?size=3&page=1")).json()
    ids = [d["id"] for d in page["items"] + rest["items"]]
    assert len(set(ids)) == 5
    died = [d["died_at_ms"] for d in page["items"] + rest["items"]]
    assert died == sorted(died, reverse=True)  # newest first, across both partitions
    timeouts = await (await client.get(
        f"/api/crawls/{crawl.name}/dead?reason=timeout")).json()
    assert [(d["reason"], d["error"]) for d in timeouts["items"]] == [("timeout",
                                                                      "read timeout")]
    assert timeouts["total"] == 1 and timeouts["complete"] is True
    assert timeouts["items"][0]["url"].startswith("https://api.example/")

    session = await (await client.get("/api/session")).json()
    assert session == {"actions": True}


async def test_the_crawl_view_carries_the_revisit_schedule(
        make_client: ClientFactory, redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    await set_policy(redis_client, crawl_name, {"revisit": "adaptive", "recrawl_after": 600,
                                                "per_host_delay": 0.0}, by="test", create=True)
    queue.configure(revisits=True)
    urls = [f"https://{h}.api.example/" for h in "abc"]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    leases = await queue.lease("w1", 3, 60_000)
    assert len(leases) == 3
    await queue.ack("w1", [(lease, "ok") for lease in leases])
    now = (await redis_client.time())[0] * 1000
    await redis_client.zadd(queue.partitions[0].rv_due, {leases[0].id: now - 2 * 86_400_000})
    assert (await queue.promote())[0] == 1  # two days late: past the last bucket
    [back] = await queue.lease("w1", 1, 60_000)
    await queue.ack("w1", [(back, "unchanged")])
    await redis_client.zadd(queue.partitions[0].rv_due, {leases[1].id: now - 5})

    client = await make_client()
    doc = await (await client.get(f"/api/crawls/{crawl_name}")).json()
    assert doc["revisits"] == {"scheduled": 3, "due": 1, "revisits": 1,
                               "late_p50_s": "+Inf", "late_p99_s": "+Inf",
                               "not_modified": 0, "unchanged": 1, "changed": 0}
    listed = await (await client.get("/api/crawls")).json()
    [row] = [c for c in listed["crawls"] if c["crawl"] == crawl_name]
    assert row["revisits"] == doc["revisits"]


async def test_history_chart_points(make_client: ClientFactory, crawl: Crawl,
                                    redis_client: aioredis.Redis) -> None:
    client = await make_client()
    empty = await (await client.get(f"/api/crawls/{crawl.name}/history")).json()
    assert empty["points"] == [] and empty["series"] == ["done", "failed", "enqueued"]
    key = crawl.queue.crawl_keys.history
    secs, _ = await redis_client.time()
    for t, done in ((secs - 20, 0), (secs - 10, 50)):
        await redis_client.lpush(key, json.dumps({"t": t, "done": done, "enqueued": 10}))
    assert await record(redis_client, crawl.name, {"done": 150, "enqueued": 10})
    # A second snapshot right after the first is skipped, whoever writes it.
    assert not await record(redis_client, crawl.name, {"done": 160})
    doc = await (await client.get(f"/api/crawls/{crawl.name}/history")).json()
    rates = [(round(p["done"]), p["enqueued"]) for p in doc["points"]]
    assert rates[0] == (5, 0) and len(rates) == 2 and 9 <= rates[1][0] <= 11
    newer = await (await client.get(
        f"/api/crawls/{crawl.name}/history?since={doc['points'][0]['t']}")).json()
    assert newer["points"] == doc["points"][1:]


async def test_bad_input_answers_4xx_json(make_client: ClientFactory,
                                          crawl: Crawl) -> None:
    client = await make_client()
    base = f"/api/crawls/{crawl.name}"
    assert "no crawl named" in await error_of(await client.get("/api/crawls/nope"), 404)
    assert "no crawl named" in await error_of(await client.get("/api/crawls/a%3Ab/dead"), 404)
    await error_of(await client.get("/api/crawls/a%7Bb/dead"), 404)
    for query, words in (("page=-1", "page must be"), ("size=100000", "size must be"),
                         ("size=0", "size must be"), ("page=x", "integer"),
                         ("reason=%3Cscript%3E", "not a dead-letter reason"),
                         ("page=500&size=500", "partitions a page must end")):
        assert words in await error_of(await client.get(f"{base}/dead?{query}"), 400), query
    assert "since" in await error_of(await client.get(f"{base}/history?since=abc"), 400)
    await error_of(await client.get("/api/nothing-here"), 404)
    post = {"headers": AUTH}
    for body, words in (({}, "exactly one"), ({"ids": ["x"]}, "not a task id"),
                        ({"reason": "a b"}, "not a dead-letter reason"),
                        ({"ids": ["a" * 32] * 1001}, "at most"),
                        ({"all": "yes"}, "true or false"), ([1], "JSON object")):
        resp = await client.post(f"{base}/dead/requeue", json=body, **post)
        assert words in await error_of(resp, 400), body
    resp = await client.post(f"{base}/dead/requeue", data="{nope",
                             headers={**AUTH, "Content-Type": "application/json"})
    assert "not valid JSON" in await error_of(resp, 400)
    resp = await client.post(f"{base}/dead/requeue", data="x" * 100_000,
                             headers={**AUTH, "Content-Type": "application/json"})
    await error_of(resp, 413)
    resp = await client.post("/api/crawls/nope/dead/requeue", json={"all": True}, **post)
    await error_of(resp, 404)


async def test_actions_need_the_token_and_the_same_origin(
        make_client: ClientFactory, crawl: Crawl) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl.name}/dead/requeue"
    body = {"reason": "http_5xx"}
    assert "needs the dashboard's token" in await error_of(
        await client.post(url, json=body), 401)
    assert "wrong token" in await error_of(
        await client.post(url, json=body, headers={"Authorization": "Bearer " + "x" * 30}),
        403)
    own = f"http://{client.host}:{client.port}"
    assert "cross-origin" in await error_of(await client.post(
        url, json=body, headers={**AUTH, "Origin": "http://evil.example"}), 403)
    assert "cross-site" in await error_of(await client.post(
        url, json=body, headers={**AUTH, "Origin": own, "Sec-Fetch-Site": "cross-site"}), 403)
    assert "JSON body" in await error_of(await client.post(
        url, data="reason=http_5xx", headers={**AUTH, "Origin": own,
                                              "Content-Type": "application/x-www-form-urlencoded"}),
        415)
    assert (await crawl.queue.stats()).dead == 5  # nothing refused above changed anything

    resp = await client.post(url, json=body, headers={**AUTH, "Origin": own,
                                                      "Sec-Fetch-Site": "same-origin"})
    assert await resp.json() == {"action": "requeue", "crawl": crawl.name,
                                 "selected": 4, "changed": 4}
    stats = await crawl.queue.stats()
    assert (stats.dead, stats.pending) == (1, 6)
    [dead] = (await (await client.get(f"/api/crawls/{crawl.name}/dead")).json())["items"]
    resp = await client.post(f"/api/crawls/{crawl.name}/dead/purge",
                             json={"ids": [dead["id"]]}, headers=AUTH)
    assert (await resp.json())["changed"] == 1
    assert (await crawl.queue.stats()).dead == 0


async def test_read_only_without_a_token(make_client: ClientFactory,
                                         crawl: Crawl) -> None:
    client = await make_client(token=None)
    assert await (await client.get("/api/session")).json() == {"actions": False}
    resp = await client.post(f"/api/crawls/{crawl.name}/dead/requeue", json={"all": True},
                             headers=AUTH)
    assert "read-only" in await error_of(resp, 403)
    assert (await crawl.queue.stats()).dead == 5


async def test_security_headers_and_host_check(make_client: ClientFactory,
                                               crawl: Crawl) -> None:
    client = await make_client()
    for path in ("/", f"/crawls/{crawl.name}", "/static/app.js", "/api/crawls",
                 "/api/crawls/nope"):
        resp = await client.get(path)
        csp = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["X-Frame-Options"] == "DENY"
    page = await (await client.get("/")).text()
    assert "<script>" not in page and " on" not in page.split("<body>")[1].split("=")[0]
    # A DNS-rebinding page names its own host: refused on a loopback bind.
    resp = await client.get("/api/crawls", headers={"Host": "rebind.example:9420"})
    await error_of(resp, 421)
    ok = await client.get("/api/crawls", headers={"Host": "localhost:9420"})
    assert ok.status == 200, await ok.text()


def test_bind_rules() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", TOKEN)
    for host in ("0.0.0.0", "::", "10.1.2.3", "dash.internal"):
        with pytest.raises(ConfigError, match="without a token"):
            check_bind(host, None)
    with pytest.raises(ConfigError, match="at least 16"):
        check_bind("127.0.0.1", "short")


async def test_cli_refuses_a_public_bind_without_token(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = await main_async(["dashboard", "--redis-url", redis_url, "--cluster", "no",
                             "--http-host", "0.0.0.0"])
    assert code == 2
    assert "refusing to listen on 0.0.0.0 without a token" in capsys.readouterr().err


async def many_hosts(client: aioredis.Redis, name: str) -> LeasingQueue:
    """Three hosts over two partitions: a.test 5 queued, b.test 3, c.test:8080 1; one task
    of a.test leased and acked."""
    queue = await LeasingQueue.open(client, name, CrawlSettings(partitions=2))
    urls = ([f"https://a.test/{i}" for i in range(6)] + [f"https://b.test/{i}" for i in range(3)]
            + ["https://c.test:8080/"])
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    await Frontier(queue).set_host("b.test", concurrency=0)  # let a.test go first below
    await Frontier(queue).block_host("b.test", 60)
    await Frontier(queue).block_host("c.test:8080", 60)
    [lease] = await queue.lease("w1", 1, 60_000)
    await queue.ack("w1", [(lease, "ok")])
    return queue


HostsApi = tuple[LeasingQueue, TestClient[Any, Any], str]


@pytest.fixture
async def hosts_api(make_client: ClientFactory, redis_client: aioredis.Redis,
                    crawl_name: str) -> HostsApi:
    """`many_hosts`, a dashboard with a token, and the crawl's /hosts path."""
    queue = await many_hosts(redis_client, crawl_name)
    return queue, await make_client(), f"/api/crawls/{queue.crawl}/hosts"


async def test_hosts_view_sorts_and_pages(hosts_api: HostsApi) -> None:
    _, client, base = hosts_api
    doc = await (await client.get(base)).json()
    assert (doc["total"], doc["page"], doc["size"], doc["sort"], doc["desc"]) == (
        3, 0, 50, "queued", True)
    assert doc["last_page"] == 9  # 1,000 entries read at most, over 2 partitions
    # In flight, done and last request are shown (from the host records), not sortable.
    assert [(h["host"], h["queued"], h["in_flight"], h["done"]) for h in doc["hosts"]] == [
        ("a.test", 5, 0, 1), ("b.test", 3, 0, 0), ("c.test:8080", 1, 0, 0)]
    a, b, c = doc["hosts"]
    assert a["last_request_ms"] <= doc["now_ms"] and a["blocked_until_ms"] is None
    assert b["last_request_ms"] is c["last_request_ms"] is None
    assert b["blocked_until_ms"] > doc["now_ms"] + 50_000 and b["concurrency"] == 0
    asc = await (await client.get(f"{base}?desc=0&size=2")).json()
    assert [h["host"] for h in asc["hosts"]] == ["c.test:8080", "b.test"]
    nxt = await (await client.get(f"{base}?desc=false&size=2&page=1")).json()
    assert [h["host"] for h in nxt["hosts"]] == ["a.test"] and nxt["total"] == 3
    blocked = await (await client.get(f"{base}?sort=blocked_until&desc=0")).json()
    assert {h["host"] for h in blocked["hosts"]} == {"b.test", "c.test:8080"}  # sparse
    far = await (await client.get(f"{base}?page=9")).json()  # the deepest page
    assert far["hosts"] == [] and far["total"] == 3


async def test_hosts_view_refuses_bad_input(hosts_api: HostsApi,
                                            make_client: ClientFactory) -> None:
    _, client, base = hosts_api
    shown = "it is shown, but only queued, errors, next_allowed, delay, blocked_until are indexed"
    for query, words in (("sort=host", "unknown sort column"),
                         ("sort=%3Cscript%3E", "unknown sort column"),
                         ("sort=in_flight", f"hosts can't be sorted by in_flight: {shown}"),
                         ("sort=done", f"hosts can't be sorted by done: {shown}"),
                         ("sort=last_request", f"hosts can't be sorted by last_request: {shown}"),
                         ("page=-1", "page must be"), ("size=100000", "size must be"),
                         ("size=0", "size must be"), ("page=x", "integer"),
                         ("page=10&size=200", "deeper than the dashboard reads"),
                         ("desc=maybe", "desc must")):
        assert words in await error_of(await client.get(f"{base}?{query}"), 400), query
    await error_of(await client.get("/api/crawls/nope/hosts"), 404)


async def test_pause_and_resume(make_client: ClientFactory, crawl: Crawl) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl.name}"
    assert "token" in await error_of(await client.post(f"{url}/pause", json={}), 401)
    assert (await (await client.get(url)).json())["paused"] is False
    resp = await client.post(f"{url}/pause", json={}, headers=AUTH)
    assert await resp.json() == {"action": "pause", "crawl": crawl.name, "paused": True}
    assert await Frontier(crawl.queue).is_paused()
    assert await crawl.queue.lease("w1", 10, 60_000) == []  # 2 pending, none leased
    assert (await (await client.get(url)).json())["paused"] is True
    listed = await (await client.get("/api/crawls")).json()
    assert [c["paused"] for c in listed["crawls"] if c["crawl"] == crawl.name] == [True]
    resp = await client.post(f"{url}/resume", json={}, headers=AUTH)
    assert (await resp.json())["paused"] is False and not await Frontier(crawl.queue).is_paused()
    # A fresh queue object: `crawl.queue` remembers for up to a second that nothing was ready.
    again = await LeasingQueue.existing(crawl.queue.client, crawl.name)
    assert len(await again.lease("w1", 10, 60_000)) == 2


async def test_host_settings_and_block(hosts_api: HostsApi) -> None:
    queue, client, url = hosts_api
    frontier = Frontier(queue)
    body = {"host": "A.Test", "delay_s": 2.5, "concurrency": 3, "budget": 40}
    assert "token" in await error_of(await client.post(f"{url}/set", json=body), 401)
    assert (await frontier.host("a.test")).delay_ms != 2500  # type: ignore[union-attr]
    doc = await (await client.post(f"{url}/set", json=body, headers=AUTH)).json()
    assert (doc["action"], doc["host"]) == ("set_host", "a.test")
    row = await frontier.host("a.test")
    assert row is not None and (row.delay_ms, row.concurrency, row.budget) == (2500, 3, 40)
    assert doc["row"]["delay_ms"] == 2500
    await client.post(f"{url}/set", json={"host": "a.test", "clear": ["budget", "delay"]},
                      headers=AUTH)
    row = await frontier.host("a.test")
    assert row is not None and (row.budget, row.concurrency) == (None, 3) and row.delay_ms < 2500

    doc = await (await client.post(f"{url}/block", json={"host": "a.test", "seconds": 120},
                                   headers=AUTH)).json()
    assert doc["row"]["blocked_until_ms"] > 0
    row = await frontier.host("a.test")
    assert row is not None and row.blocked_until_ms is not None
    await client.post(f"{url}/block", json={"host": "a.test", "seconds": 0}, headers=AUTH)
    row = await frontier.host("a.test")
    assert row is not None and row.blocked_until_ms is None


async def test_host_actions_refuse_bad_input(hosts_api: HostsApi,
                                             make_client: ClientFactory) -> None:
    queue, client, url = hosts_api
    for body, words in (({"host": "a.test", "delay_s": -1}, "delay_s must be"),
                        ({"host": "a.test", "delay_s": "2s"}, "delay_s must be"),
                        ({"host": "a.test", "delay_s": True}, "delay_s must be"),
                        ({"host": "a.test", "delay_s": 1e300}, "delay_s must be"),
                        ({"host": "a.test", "concurrency": 1.5}, "concurrency must be"),
                        ({"host": "a.test", "budget": -3}, "budget must be"),
                        ({"host": "a.test", "clear": ["host"]}, "clear must be"),
                        ({"host": "a.test"}, "nothing to set"),
                        ({"delay_s": 1}, "host must be"),
                        ({"host": "", "delay_s": 1}, "host must be"),
                        ({"host": ["a.test"], "delay_s": 1}, "host must be"),
                        ({"host": "<script>", "delay_s": 1}, "not a host"),
                        ({"host": "a b", "delay_s": 1}, "not a host"),
                        ({"host": "a.test/path", "delay_s": 1}, "not a host"),
                        ({"host": "http://a.test/", "delay_s": 1}, "not a host"),
                        ({"host": "a.test:0", "delay_s": 1}, "not a host"),
                        ({"host": "user@a.test", "delay_s": 1}, "not a host")):
        resp = await client.post(f"{url}/set", json=body, headers=AUTH)
        assert words in await error_of(resp, 400), body
    for body, words in (({"host": "a.test"}, "seconds is required"),
                        ({"host": "a.test", "seconds": -5}, "seconds must be"),
                        ({"host": "a.%74est", "seconds": 5}, "not a host")):
        resp = await client.post(f"{url}/block", json=body, headers=AUTH)
        assert words in await error_of(resp, 400), body
    for path in ("set", "block"):  # read-only refuses before looking at the body
        resp = await (await make_client(token=None)).post(f"{url}/{path}", json={}, headers=AUTH)
        assert "read-only" in await error_of(resp, 403)
    row = await Frontier(queue).host("a.test")
    assert row is not None and row.budget is None and row.blocked_until_ms is None


async def test_groups_view_lists_the_politeness_groups(
        make_client: ClientFactory, redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {"politeness_key": "domain",
                                                "group_concurrency": 1}, by="t", create=True)
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in
                         ("https://a.site.test/", "https://b.site.test/")])
    assert len(await queue.lease("w1", 5, 60_000)) == 1
    client = await make_client()
    doc = await (await client.get(f"/api/crawls/{crawl_name}/groups?size=5")).json()
    assert doc["politeness_key"] == "domain" and doc["size"] == 5
    [row] = doc["groups"]
    assert (row["group"], row["in_flight"], row["concurrency"], row["own_concurrency"],
            row["parked"]) == ("site.test", 1, 1, False, 1)
    assert (await client.get(f"/api/crawls/{crawl_name}/groups?size=0")).status == 400
