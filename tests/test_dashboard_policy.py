"""The crawl's policy in the dashboard (console/dashboard/policy.py, the Policy panel): read
without a token, changed with one like ``crawlq crawl set``, never over someone else's
change. Real redis-server; the API in process, the panel in headless Chromium."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.browser import ARTIFACTS, TOKEN, base, child, click, dashboard_argv, wait_for
from support.dashboard import AUTH, ClientFactory, error_of

from common.keys import CrawlKeys, PartitionKeys
from common.policy import LOG_LEN, POLICY_OPTIONS, create_policy, read_policy, set_policy
from common.queue import CrawlQueue, CrawlSettings, existing_settings, partition_keys
from common.redis.server import free_port
from console.dashboard.app import STATIC
from console.dashboard.policy import BY

NAMES = [o.name for o in POLICY_OPTIONS]


@pytest.fixture
async def crawl(redis_client: aioredis.Redis, crawl_name: str) -> str:
    """A crawl of two partitions whose policy is version 1 (per_host_delay 2s)."""
    await CrawlQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    await create_policy(redis_client, crawl_name, {"per_host_delay": 2.0}, by="test")
    return crawl_name


async def snapshot(client: aioredis.Redis, crawl: str) -> tuple[Any, ...]:
    """Everything a policy write touches: the policy, its log, each partition's conf."""
    keys = CrawlKeys.build(crawl)
    parts = partition_keys(crawl, await existing_settings(client, crawl))
    confs = [await client.hgetall(pk.conf) for pk in parts]
    return (await client.hgetall(keys.policy), await client.lrange(keys.policy_log, 0, -1),
            confs)


async def test_get_shows_version_values_options_and_log(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis) -> None:
    await set_policy(redis_client, crawl, {"max_depth": 5}, by="crawlq crawl set")
    client = await make_client(token=None)  # a read: no token needed
    resp = await client.get(f"/api/crawls/{crawl}/policy")
    assert resp.status == 200, await resp.text()
    doc = await resp.json()
    assert set(doc) == {"crawl", "version", "values", "text", "log", "options"}
    stored = await read_policy(redis_client, crawl)
    assert stored is not None
    assert (doc["crawl"], doc["version"]) == (crawl, 2)
    assert doc["text"] == stored.policy.texts()
    assert (doc["text"]["per_host_delay"], doc["text"]["max_depth"]) == ("2s", "5")
    assert doc["options"] == [{"name": o.name, "flag": o.flag, "help": o.help,
                               "default": o.show(o.default)} for o in POLICY_OPTIONS]
    assert [(e["version"], e["by"]) for e in doc["log"]] == [(2, "crawlq crawl set"),
                                                             (1, "test")]
    assert doc["log"][0]["changes"] == {"max_depth": ["none", "5"]}
    newest = await (await client.get(f"/api/crawls/{crawl}/policy?log=1")).json()
    assert [e["version"] for e in newest["log"]] == [2]
    for query in ("log=0", f"log={LOG_LEN + 1}", "log=x"):
        assert "log must be" in await error_of(
            await client.get(f"/api/crawls/{crawl}/policy?{query}"), 400), query


def test_the_form_comes_from_the_declaration() -> None:
    """The page holds no list of options of its own: it builds the form from the API's
    list, which is POLICY_OPTIONS (the test above checks the API against it). Names as
    whole words: the revisit schedule's panel says "revisits", not the option."""
    for page in sorted(STATIC.glob("*.js")) + sorted(STATIC.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        assert not [n for n in NAMES if re.search(rf"\b{re.escape(n)}\b", text)], page.name


async def test_form_options_are_policy_options_in_order(make_client: ClientFactory,
                                                        crawl: str) -> None:
    doc = await (await (await make_client()).get(f"/api/crawls/{crawl}/policy")).json()
    assert [o["name"] for o in doc["options"]] == NAMES
    assert list(doc["text"]) == NAMES


async def test_a_write_sets_the_policy_bumps_the_version_and_logs_it(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl}/policy/set"
    body = {"values": {"per_host_delay": "500ms", "max_depth": "5",
                       "user_agent": "newsbot/2.0 (+https://example.com/bot)"}, "version": 1}
    resp = await client.post(url, json=body, headers=AUTH)
    assert resp.status == 200, await resp.text()
    doc = await resp.json()
    assert (doc["action"], doc["crawl"], doc["changed"], doc["version"]) == (
        "set_policy", crawl, True, 2)
    stored = await read_policy(redis_client, crawl)
    assert stored is not None and stored.version == 2 and doc["text"] == stored.policy.texts()
    assert (stored.policy.per_host_delay, stored.policy.max_depth) == (0.5, 5)
    assert stored.policy.user_agent == "newsbot/2.0 (+https://example.com/bot)"
    assert stored.log[0]["by"] == BY == "dashboard" and stored.log[0]["version"] == 2
    assert stored.log[0]["changes"] == {
        "per_host_delay": ["2s", "0.5s"], "max_depth": ["none", "5"],
        "user_agent": [POLICY_OPTIONS[NAMES.index("user_agent")].default,
                       "newsbot/2.0 (+https://example.com/bot)"]}
    # The fleet's politeness, given to every partition.
    for pk in partition_keys(crawl, await existing_settings(redis_client, crawl)):
        conf = await redis_client.hgetall(pk.conf)
        assert (conf[b"delay"], conf[b"policy_version"]) == (b"500", b"2")

    # The same values again: no change, no new version, no log entry.
    before = await snapshot(redis_client, crawl)
    again = await (await client.post(url, json={**body, "version": 2}, headers=AUTH)).json()
    assert (again["changed"], again["version"]) == (False, 2)
    assert await snapshot(redis_client, crawl) == before


async def test_refused_without_the_token_and_nothing_written(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl}/policy/set"
    body = {"values": {"per_host_delay": "5s"}, "version": 1}
    before = await snapshot(redis_client, crawl)
    assert "needs the dashboard's token" in await error_of(await client.post(url, json=body),
                                                           401)
    assert "wrong token" in await error_of(await client.post(
        url, json=body, headers={"Authorization": "Bearer " + "x" * 30}), 403)
    assert "cross-origin" in await error_of(await client.post(
        url, json=body, headers={**AUTH, "Origin": "http://evil.example"}), 403)
    assert "JSON body" in await error_of(await client.post(
        url, data="values=x", headers={**AUTH,
                                       "Content-Type": "application/x-www-form-urlencoded"}),
        415)
    read_only = await make_client(token=None)
    assert "read-only" in await error_of(await read_only.post(url, json=body, headers=AUTH),
                                         403)
    assert await snapshot(redis_client, crawl) == before


@pytest.mark.parametrize(("values", "words"), [
    ({"per_hots_delay": "5s"}, "unknown policy key 'per_hots_delay'"),
    ({"per_host_delay": "fast"}, "per_host_delay: bad value 'fast'"),
    ({"per_host_delay": "5s", "max_depth": "-1"}, "max_depth: bad value '-1'"),
    ({"max_depth": "4", "per_host_concurrency": "two"}, "per_host_concurrency: bad value"),
    ({"retry_cap": "1s"}, "retry_cap: must be >= retry_base (2s)"),
    ({"max_depth": "4", "retry_base": "700s"}, "retry_cap: must be >= retry_base (700s)"),
    ({"user_agent": ""}, "user_agent"),
    ({"allow_domains": ["a.example"]}, "allow_domains: bad value"),
    ({}, "values must be an object"),
    ([["per_host_delay", "5s"]], "values must be an object"),
])
async def test_a_bad_value_is_a_400_and_nothing_written(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis,
        values: Any, words: str) -> None:
    client = await make_client()
    before = await snapshot(redis_client, crawl)
    resp = await client.post(f"/api/crawls/{crawl}/policy/set",
                             json={"values": values, "version": 1}, headers=AUTH)
    message = await error_of(resp, 400)
    assert words in message, message
    if values and isinstance(values, dict):
        assert "valid keys: per_host_delay, per_host_concurrency" in message
    assert await snapshot(redis_client, crawl) == before


@pytest.mark.parametrize("body", [
    {"values": {"max_depth": "4"}},
    {"values": {"max_depth": "4"}, "version": "1"},
    {"values": {"max_depth": "4"}, "version": True},
    {"values": {"max_depth": "4"}, "version": -1},
])
async def test_the_version_is_required(make_client: ClientFactory, crawl: str,
                                       redis_client: aioredis.Redis, body: Any) -> None:
    client = await make_client()
    before = await snapshot(redis_client, crawl)
    resp = await client.post(f"/api/crawls/{crawl}/policy/set", json=body, headers=AUTH)
    assert "version must be" in await error_of(resp, 400)
    assert await snapshot(redis_client, crawl) == before


async def test_a_stale_version_is_a_409_and_nothing_written(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl}/policy/set"
    # The form was loaded at version 1; then someone ran crawlq crawl set.
    await set_policy(redis_client, crawl, {"max_depth": 7}, by="crawlq crawl set")
    before = await snapshot(redis_client, crawl)
    resp = await client.post(url, json={"values": {"max_depth": "4"}, "version": 1},
                             headers=AUTH)
    assert resp.status == 409, await resp.text()
    doc = await resp.json()
    assert doc["version"] == 2 and "changed since this form was loaded" in doc["error"]
    assert await snapshot(redis_client, crawl) == before
    # Loaded again at version 2, it goes through.
    resp = await client.post(url, json={"values": {"max_depth": "4"}, "version": 2},
                             headers=AUTH)
    assert (await resp.json())["version"] == 3


async def test_two_operators_at_one_version_one_wins(
        make_client: ClientFactory, crawl: str, redis_client: aioredis.Redis) -> None:
    client = await make_client()
    url = f"/api/crawls/{crawl}/policy/set"
    answers = await asyncio.gather(*(
        client.post(url, json={"values": {"max_depth": str(depth)}, "version": 1},
                    headers=AUTH) for depth in (4, 6)))
    assert sorted(r.status for r in answers) == [200, 409]
    stored = await read_policy(redis_client, crawl)
    assert stored is not None and stored.version == 2
    assert [e["by"] for e in stored.log] == ["dashboard", "test"]


async def test_no_policy_is_a_404_that_says_create(
        make_client: ClientFactory, redis_client: aioredis.Redis, crawl_name: str) -> None:
    client = await make_client()
    await CrawlQueue.open(redis_client, crawl_name)
    base = f"/api/crawls/{crawl_name}/policy"
    message = await error_of(await client.get(base), 404)
    assert f"create it with `crawlq crawl create --crawl {crawl_name}`" in message
    resp = await client.post(f"{base}/set", json={"values": {"max_depth": "4"}, "version": 0},
                             headers=AUTH)
    assert "crawlq crawl create" in await error_of(resp, 404)
    # An earlier crawlq's crawl (values in its partitions' conf): said so, not adopted here.
    await redis_client.hset(PartitionKeys.build(crawl_name, 0).conf, "delay", "3000")
    assert "adopts its partitions' values" in await error_of(await client.get(base), 404)
    resp = await client.post(f"{base}/set", json={"values": {"max_depth": "4"}, "version": 0},
                             headers=AUTH)
    await error_of(resp, 404)
    assert await redis_client.exists(CrawlKeys.build(crawl_name).policy) == 0
    assert "no crawl named" in await error_of(await client.get("/api/crawls/a%3Ab/policy"), 404)


# -- the Policy panel in headless Chromium ------------------------------------------------


@pytest.mark.timeout(60)
async def test_policy_panel_renders_the_options_and_saves(
        browser: Any, redis_url: str, redis_client: aioredis.Redis, crawl: str,
        tmp_path: Path) -> None:
    port = free_port()
    find = browser.find_element
    async with child(*dashboard_argv(redis_url, port), log=tmp_path / "dash.log"):
        wait_for(lambda: browser.get(f"{base(port)}/crawls/{crawl}") or True,
                 "the dashboard to answer")
        inputs = wait_for(lambda: browser.find_elements(
            "css selector", "#policy form.policy-form input"), "the policy form")
        assert [i.get_attribute("name") for i in inputs] == NAMES
        stored = await read_policy(redis_client, crawl)
        assert stored is not None
        texts = stored.policy.texts()
        assert [i.get_attribute("value") for i in inputs] == [texts[n] for n in NAMES]
        assert [i.get_attribute("placeholder") for i in inputs] == [
            o.show(o.default) for o in POLICY_OPTIONS]
        hint = find("css selector", "#policy-help-max_depth").text
        assert POLICY_OPTIONS[NAMES.index("max_depth")].help in hint
        assert "version 1" in find("css selector", "#policy .meta").text

        # A bad value: refused, said in the panel, nothing written.
        find("css selector", "#token-form input").send_keys(TOKEN)
        find("css selector", "#token-form button").click()
        field = find("css selector", '#policy input[name="per_host_delay"]')
        field.clear()
        field.send_keys("fast")
        click(browser, "#policy button.save-policy")
        wait_for(lambda: "refused (400): per_host_delay: bad value 'fast'" in find(
            "css selector", "#policy .status").text, "the inline error")
        assert (await read_policy(redis_client, crawl, log_limit=0)).version == 1  # type: ignore[union-attr]

        # A good one: saved by the dashboard, the form and the log show it.
        field = find("css selector", '#policy input[name="per_host_delay"]')
        field.clear()
        field.send_keys("3s")
        click(browser, "#policy button.save-policy")
        wait_for(lambda: "saved: version 2" in find("css selector", "#policy .status").text,
                 "the saved message")
        stored = await read_policy(redis_client, crawl)
        assert stored is not None and stored.policy.per_host_delay == 3.0
        assert stored.log[0]["by"] == "dashboard"
        wait_for(lambda: "dashboard" in find(
            "css selector", '#policy .log tr[data-version="2"]').text, "the change in the log")
        wait_for(lambda: "version 2" in find("css selector", "#policy .meta").text,
                 "the form reloaded at version 2")
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard-policy.png"))
