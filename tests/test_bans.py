"""Ban detection by status and by content (issue 47): what a blocked answer looks like,
by the crawl's policy (ban_status, ban_selector, ban_text) and by a spider's route
(``blocked=Blocked(...)``). A blocked answer is never taken as data: its request is
retried (on another proxy when there is a pool, whose pick it bans for the host), and
it ends dead ``blocked`` after its attempts; no record, no item, no link of it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, enqueue, records
from support.forward_proxy import CAPTCHA, banning_site, proxies
from support.routes import serve

from common.http.results import FetchResult
from common.policy import PolicyError, create_policy, parse_value
from common.proxies import proxy_spec, read_pool
from common.proxies.bans import Blocked, judge

pytestmark = pytest.mark.timeout(90)


def result(status: int = 200, body: str = "<p>x</p>", ctype: str = "text/html") -> FetchResult:
    return FetchResult("http://a.test/", "http://a.test/", status, {"content-type": ctype},
                       (), body.encode(), 0.01, (), "HTTP/1.1")


def test_a_block_is_judged_by_status_through_the_pool_and_by_content_however_sent() -> None:
    crawl = Blocked(status=403, css="div.captcha", text="Access Denied")
    assert judge(result(403), crawl, elsewhere=True) == "status 403"
    assert judge(result(403), crawl, elsewhere=False) is None  # direct: the page's answer
    assert judge(result(429), crawl, Blocked(status=429), elsewhere=False) == "status 429"
    assert judge(result(body=CAPTCHA), crawl, elsewhere=False) == "selector div.captcha"
    assert judge(result(body="<h1>access denied</h1>"), crawl,
                 elsewhere=False) == "text 'Access Denied'"
    assert judge(result(body="<p>fine</p>"), crawl, Blocked(css="p"), elsewhere=False) \
        == "selector p"
    assert judge(result(404, body=CAPTCHA), crawl, elsewhere=True) is None  # not a 2xx
    # A selector reads HTML only; a text reads any body.
    assert judge(result(body=CAPTCHA, ctype="application/json"), crawl, elsewhere=True) \
        is None
    assert judge(result(body='{"e": "access denied"}', ctype="application/json"), crawl,
                 elsewhere=True) == "text 'Access Denied'"
    assert judge(result(), Blocked(), elsewhere=True) is None


def test_the_crawls_ban_rules_parse_and_refuse_what_is_not_one() -> None:
    assert parse_value("ban_status", "429, 403") == (403, 429)
    assert parse_value("ban_status", "none") == ()
    assert parse_value("ban_selector", "none") == ""
    assert parse_value("ban_selector", "form#login, .g-recaptcha") == "form#login, .g-recaptcha"
    assert parse_value("ban_text", " Access denied ") == "Access denied"
    for key, bad in (("ban_status", "99"), ("ban_status", "4O3"), ("ban_selector", "div[[")):
        with pytest.raises(PolicyError, match=key):
            parse_value(key, bad)
    with pytest.raises(argparse.ArgumentTypeError, match="not a CSS selector"):
        Blocked(css="a[")


async def crawl_site(redis_client: aioredis.Redis, redis_url: str, crawl: str, out: Path,
                     urls: list[str], *extra: str, **policy: Any) -> None:
    await create_policy(redis_client, crawl, {
        "per_host_delay": 0.0, "per_host_concurrency": 2, "retry_base": 0.05,
        "retry_cap": 0.1, "ignore_robots": True, **policy}, by="test")
    await enqueue(redis_client, crawl, urls)
    assert await consume(redis_url, crawl, out, *extra) == 0


async def test_a_captcha_page_sent_direct_is_retried_then_dead_blocked_never_data(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    async def page(request: web.Request) -> web.Response:
        if request.match_info["i"] == "1":
            return web.Response(text=CAPTCHA, content_type="text/html")
        return web.Response(text="<html><body>ok</body></html>", content_type="text/html")
    async with serve({"/p/{i}": page}) as site:
        await crawl_site(redis_client, redis_url, crawl_name, tmp_path / "out",
                         [site.url(f"/p/{i}") for i in range(4)],
                         ban_text="prove you are human")
        q = await enqueue(redis_client, crawl_name, [])
        dead = await q.dead_list(limit=10)
        assert [(d.url, d.reason, d.attempts) for d in dead] == [
            (site.url("/p/1"), "blocked", 3)]
        assert "text 'prove you are human'" in dead[0].message
        assert len(site.hits["/p/1"]) == 3  # one request an attempt, each on its own turn
    written = records(tmp_path / "out")
    assert sorted(r["url"] for r in written) == [site.url(f"/p/{i}") for i in (0, 2, 3)]
    assert (await q.stats()).counters.get("outcome:ok") == 3


async def test_a_captcha_through_one_proxy_bans_it_for_the_host_and_every_page_is_data(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """A host answers one proxy with a 200 captcha page: the crawl's ban_selector sees
    it, the proxy is banned for that host (still used for the other), every page is done
    through the others, and no record holds a captcha."""
    async with banning_site({"a.test": {"p2": "captcha"}}) as site, \
            proxies(site.base, ["p1", "p2"]) as px:
        urls = [f"http://{h}.test/p/{i}" for h in "ab" for i in range(20)]
        await crawl_site(redis_client, redis_url, crawl_name, tmp_path / "out", urls,
                         *[a for p in px.values() for a in ("--proxy", p.url)],
                         "--store-body", ban_selector="div.captcha")
        q = await enqueue(redis_client, crawl_name, [])
        stats = await q.stats()
        assert (stats.done, stats.dead) == (40, 0)
        view = await read_pool(redis_client, crawl_name, q.partitions)
    p2 = proxy_spec(px["p2"].url)
    assert set(view.bans) == {(p2.id, "a.test")}
    assert site.seen[("a.test", "p2")] <= 2 and site.seen[("b.test", "p2")] >= 5
    written = records(tmp_path / "out")
    assert len(written) == 40 and not any("captcha" in json.dumps(r) for r in written)


BLOCKED_SPIDER = '''
from crawlq import Blocked, Spider
spider = Spider("bans")

@spider.route("item", blocked=Blocked(css="div.captcha"))
async def item(response, ctx):
    ctx.emit({"url": response.url, "text": response.css("body").xpath("string()").get()})
'''


async def test_a_routes_own_rule_keeps_a_captcha_out_of_its_items(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    served = {"n": 0}

    async def page(request: web.Request) -> web.Response:
        served["n"] += 1
        if served["n"] == 1:  # the first answer is a captcha, the next the page
            return web.Response(text=CAPTCHA, content_type="text/html")
        return web.Response(text="<html><body>the page</body></html>",
                            content_type="text/html")
    spider = tmp_path / "bans.py"
    spider.write_text(BLOCKED_SPIDER)
    async with serve({"/p/{i}": page}) as site:
        await create_policy(redis_client, crawl_name, {
            "per_host_delay": 0.0, "retry_base": 0.05, "retry_cap": 0.1,
            "ignore_robots": True}, by="test")
        q = await enqueue(redis_client, crawl_name, [site.url("/p/1")], label="item")
        assert await consume(redis_url, crawl_name, tmp_path / "out",
                             "--spider", str(spider)) == 0
    written = records(tmp_path / "out")
    assert [r["items"] for r in written] == [[{"url": site.url("/p/1"), "text": "the page"}]]
    assert (await q.stats()).counters.get("retried") == 1
