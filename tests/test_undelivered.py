"""What a crawl did not deliver is counted where the user looks: links past max_depth
(and every other link fate not followed) in ``crawlq stats``, its ``--json`` and the
dashboard's API, not only in a consumer's Prometheus counter; and the report of losses
is generic over the codes (a new outcome or link fate shows up unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, enqueue
from support.dashboard import ClientFactory
from support.routes import serve

from common.policy import create_policy
from common.queue import Stats
from console.cli import main_async
from console.losses import Loss, advice, losses


async def chain(request: web.Request) -> web.Response:
    """Page i links to page i + 1 and to another host."""
    i = int(request.match_info["i"])
    return web.Response(text=f'<a href="/p/{i + 1}">next</a><a href="http://else.test/">x</a>',
                        content_type="text/html")


async def test_links_past_max_depth_are_counted_in_stats_and_the_dashboard(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, *, tmp_path: Path,
        make_client: ClientFactory, capsys: pytest.CaptureFixture[str]) -> None:
    await create_policy(redis_client, crawl_name, {
        "max_depth": 2, "ignore_robots": True, "per_host_delay": 0.0}, by="test")
    async with serve({"/p/{i}": chain}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/p/0")])
        assert await consume(redis_url, crawl_name, tmp_path, "--handler",
                             "consumer.handlers:links") == 0
    assert site.paths == ["/p/0", "/p/1", "/p/2"]  # depth 0, 1, 2
    capsys.readouterr()
    assert await main_async(["stats", "--redis-url", redis_url, "--crawl", crawl_name]) == 0
    text = capsys.readouterr().out
    assert "links not followed: out_of_scope 2, too_deep 2 (past the crawl's max_depth" \
        in text, text
    assert await main_async(["stats", "--redis-url", redis_url, "--crawl", crawl_name,
                             "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["links"] == {"out_of_scope": 2, "too_deep": 2}
    api = await (await (await make_client()).get(f"/api/crawls/{crawl_name}")).json()
    assert api["links"] == {"out_of_scope": 2, "too_deep": 2}


def test_losses_are_generic_over_the_codes() -> None:
    stats = Stats(dead=3, counters={
        "outcome:ok": 5, "outcome:changed": 1, "outcome:near_duplicate": 2,
        "outcome:soft_404": 1, "links:too_deep": 7, "links:trap_calendar": 4, "done": 9},
        dead_reasons={"robots_unavailable": 2, "ssrf_blocked": 1, "gone": 0})
    found = losses(stats, {"robots_unavailable": "http://a.test/robots.txt: connect_error"})
    assert [(x.kind, x.code, x.count) for x in found] == [
        ("links", "too_deep", 7), ("links", "trap_calendar", 4),
        ("pages", "near_duplicate", 2), ("pages", "soft_404", 1),
        ("dead", "robots_unavailable", 2), ("dead", "ssrf_blocked", 1)]
    assert found[4].text() == ("dead robots_unavailable 2 [http://a.test/robots.txt: "
                               "connect_error]: " + advice("robots_unavailable"))
    assert "crawler-trap rule" in found[1].advice  # a rule added elsewhere
    assert Loss("pages", "never_heard_of", 1).text() == "pages never_heard_of 1"
    assert "--allow-private" in advice("ssrf_blocked")
