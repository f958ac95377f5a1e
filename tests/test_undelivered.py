"""What a crawl did not deliver is counted where the user looks: links past max_depth
(and every other link fate not followed) in ``crawlq stats``, its ``--json`` and the
dashboard's API, not only in a consumer's Prometheus counter; the report of losses is
generic over the codes (a new outcome or link fate shows up unchanged); and a route's
error names the spider's line, logged once per place, a few new ones a minute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, enqueue
from support.dashboard import ClientFactory
from support.routes import serve

from common.errors import InvalidRequestError
from common.policy import create_policy
from common.queue import Lease, Stats
from common.tasks.request import Request, check_request
from common.tasks.task import Task
from console.cli import main_async
from console.local.processes import progress_line
from console.views.losses import Loss, advice, losses
from consumer.notices import RouteErrors


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
        "outcome:soft_404": 1, "outcome:gone": 1, "outcome:probe": 3,
        "links:too_deep": 7, "links:trap_calendar": 4, "links:soft_404": 3, "done": 13},
        dead_reasons={"robots_unavailable": 2, "ssrf_blocked": 1, "stalled": 0})
    found = losses(stats, {"robots_unavailable": "http://a.test/robots.txt: connect_error"})
    # Probes are crawlq's own; a judged page's items were written: its links are the loss.
    assert [(x.kind, x.code, x.count) for x in found] == [
        ("links", "too_deep", 7), ("links", "trap_calendar", 4), ("links", "soft_404", 3),
        ("pages", "gone", 1),
        ("dead", "robots_unavailable", 2), ("dead", "ssrf_blocked", 1)]
    assert found[2].advice.endswith("links not followed; soft_404=false judges none")
    assert "404 or 410" in found[3].advice
    dropped = losses(stats, items_dropped=True)  # drop_judged_items=true
    assert [(x.kind, x.code, x.count) for x in dropped if x.kind == "pages"] == [
        ("pages", "near_duplicate", 2), ("pages", "gone", 1), ("pages", "soft_404", 1)]
    assert dropped[3].advice.endswith("; their items dropped (drop_judged_items=false "
                                      "keeps them)")
    assert not dropped[4].items_dropped and "items" not in dropped[4].advice  # gone
    assert found[4].text() == ("dead robots_unavailable 2 [http://a.test/robots.txt: "
                               "connect_error]: " + advice("robots_unavailable"))
    assert "crawler-trap rule" in found[1].advice  # a rule added elsewhere
    assert Loss("pages", "never_heard_of", 1).text() == "pages never_heard_of 1"
    assert "--allow-private" in advice("ssrf_blocked")


def test_the_progress_line_leaves_crawlqs_own_probes_apart() -> None:
    s = Stats(pending=1, counters={"enqueued": 6, "done": 4, "outcome:ok": 3, "outcome:probe": 1})
    assert progress_line(1.0, s).startswith("[  1.0s] done 3/5  pending 1")
    assert progress_line(1.0, s, total=5).startswith("[  1.0s] done 3/5 ")


def _lease(url: str = "http://shop.test/p/1") -> Lease:
    return Lease(Task(id="0" * 32, url=url, label="product"), 0, "1:w", 0, "shop.test")


def _route(value: object) -> float:
    return float(value)  # type: ignore[arg-type]  # raises on None: the spider's line


def test_a_route_error_is_placed_at_its_spiders_line_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    errors = RouteErrors({__file__})
    said = []
    for url in ("http://shop.test/p/1", "http://shop.test/p/2"):
        try:
            _route(None)
        except TypeError as exc:
            said.append(errors.failed(_lease(url), exc))
    line = _route.__code__.co_firstlineno + 1
    assert said[0] == said[1] == (
        f"tests/test_undelivered.py:{line} in _route: TypeError: float() argument must be "
        "a string or a real number, not 'NoneType'")
    [logged] = [r for r in caplog.records if r.getMessage() == "route_error"]
    assert (logged.where, logged.url) == (f"tests/test_undelivered.py:{line} in _route",
                                          "http://shop.test/p/1")
    try:  # raised by crawlq itself, on what the route returned: no place of the spider's
        check_request(Request("http://shop.test/", data={"when": {1}}))
    except InvalidRequestError as exc:
        exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None  # as
        # the runner's call of it has it: no frame of this file (the spider's) on the way
        assert errors.failed(_lease(), exc).startswith("InvalidRequestError: Request ")


def test_new_route_errors_are_logged_ten_a_minute_then_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    errors = RouteErrors(clock=lambda: now[0])
    for n in range(12):
        try:
            exec(compile("\n" * n + "raise KeyError(n)", f"spider_{n}.py", "exec"))
        except KeyError as exc:
            errors.failed(_lease(), exc)
    assert sum(r.getMessage() == "route_error" for r in caplog.records) == 10
    now[0] = 61.0
    try:
        raise ValueError("later")
    except ValueError as exc:
        errors.failed(_lease(), exc)
    [held] = [r for r in caplog.records if r.getMessage() == "route_errors_not_shown"]
    assert held.errors == 2
    assert sum(r.getMessage() == "route_error" for r in caplog.records) == 11
