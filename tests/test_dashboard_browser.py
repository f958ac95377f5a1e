"""The dashboard in headless Chromium (Debian's chromium + chromium-driver, via Selenium).

A real crawl in progress: a local site and a ``python -m consumer`` child work through
it while ``crawlq dashboard`` (another child) serves the pages. Screenshots of each page
go to ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from sites import start_site_process
from support.browser import (
    ARTIFACTS,
    CHROMEDRIVER,
    CHROMIUM,
    TOKEN,
    base,
    child,
    click,
    dashboard_argv,
    read,
    wait_for,
)
from support.frontier import host_record, put_record

from common.frontier.hosts import SORT_COLUMNS, Frontier
from common.keys import CRAWLS
from common.policy import set_policy
from common.queue import Failure, LeasingQueue, NewTask
from common.redis.server import free_port
from common.urls.canonical import fingerprint

PAGES = 200
# Each would set window.__xss if the page ever ran it.
XSS_URL = ('http://127.0.0.1:1/?q="><img/src=x/onerror="window.__xss=2">'
           '<script>window.__xss=3</script>')
# Not http(s): the lease turns it into a dead letter with reason "malformed", URL kept.
JS_URL = 'javascript:window.__xss=1//"><img/src=x/onerror=window.__xss=7>'
XSS_ERROR = '<script>window.__xss=4</script>"><img src=x onerror=window.__xss=5>'
XSS_CRAWL = "<svg/onload=window.__xss=6>"

pytest.importorskip("selenium.webdriver")
pytestmark = [
    pytest.mark.timeout(300),  # a loaded machine: each wait below is an upper bound
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver (.ci/run "
                              "installs them)"),
]


def consumer_argv(redis_url: str, crawl: str, tmp_path: Path) -> list[str]:
    return ["-m", "consumer", "--redis-url", redis_url, "--crawl", crawl,
            "--worker-id", "w-browser", "--allow-private", "--ignore-robots",
            "--output", str(tmp_path / "out"), "--http-port", "-1",
            "--concurrency", "2", "--lease", "3s", "--per-host-concurrency", "0",
            "--per-host-delay", "0"]


def card(driver: Any, state: str) -> int:
    text = driver.find_element("css selector", f'.card[data-state="{state}"] .value').text
    return int(text.replace(",", ""))


async def plant_dead(queue: LeasingQueue, items: list[tuple[str, str, str]]) -> None:
    """Dead letters with these (url, reason, error), and JS_URL's malformed one, before
    any consumer runs."""
    urls = [url for url, _, _ in items]
    await queue.enqueue([NewTask(url, fingerprint(url), priority=10) for url in urls])
    # No producer enqueues a javascript: URL: plant it as a corrupted entry would be.
    pk, host = queue.partitions[0], "127.0.0.1:1"
    await queue.client.rpush(pk.host_queue(host), fingerprint(JS_URL).hex() + JS_URL)
    await queue.client.incr(pk.pending)
    queued = (await host_record(queue.client, pk, host)).queued + 1
    await put_record(queue.client, pk, host, queued=queued)
    await queue.client.zadd(pk.queued, {host: queued})
    await queue.client.zadd(pk.due, {host: 0})
    leases: list[Any] = []
    while len(leases) < len(items):
        leases += await queue.lease("planter", len(items) - len(leases), 60_000)
    by_url = {lease.task.url: lease for lease in leases}
    await queue.fail("planter", [Failure(by_url[url], reason, error, permanent=True)
                                 for url, reason, error in items])


async def test_dashboard_pages_live(browser: Any, redis_url: str, redis_client: aioredis.Redis,
                                    crawl_name: str, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    queue = await LeasingQueue.open(redis_client, crawl_name)
    # A name no crawlq command accepts, as an older version or a hostile writer left it.
    await redis_client.sadd(CRAWLS, XSS_CRAWL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    async with start_site_process(delay_ms=100) as site:
        await plant_dead(queue, [(XSS_URL, "bad_redirect", XSS_ERROR)] + [
            (site.url(f"/p/{9000 + i}"), "http_5xx", "HTTP 503 Service Unavailable")
            for i in range(3)])
        urls = [site.url(f"/p/{i}") for i in range(PAGES)]
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
        # Links a consumer did not follow, as it counts them (consumer.flush).
        await redis_client.hincrby(queue.partitions[0].stats, "links:too_deep", 4)
        async with child(*dashboard_argv(redis_url, port), log=tmp_path / "dashboard.log"), \
                child(*consumer_argv(redis_url, crawl_name, tmp_path),
                      log=tmp_path / "consumer.log"):
            # The crawls page: every crawl, the hostile name shown as text.
            wait_for(lambda: browser.get(base + "/") or True, "the dashboard to answer", 20)
            wait_for(lambda: browser.find_elements("css selector", "a.crawl-link"),
                     "the crawls table")
            names = read(lambda: [a.text for a in browser.find_elements(
                "css selector", "a.crawl-link")])
            assert crawl_name in names and XSS_CRAWL in names
            browser.save_screenshot(str(ARTIFACTS / "dashboard-crawls.png"))

            browser.get(f"{base}/crawls/{crawl_name}")
            first = wait_for(lambda: card(browser, "done") or None, "some pages done")
            wait_for(lambda: card(browser, "done") > first, "the done count to move", 30)
            wait_for(lambda: browser.find_element(  # the worker's row, with its host
                "css selector", 'tr[data-worker="w-browser"]').find_elements(
                "css selector", "td")[1].text, "the worker row")
            assert "in flight" in read(
                lambda: browser.find_element("css selector", "#workers").text)
            wait_for(lambda: browser.find_element("css selector", "#links").is_displayed()
                     and browser.find_element("css selector", 'tr[data-fate="too_deep"]')
                     .text.split() == ["too_deep", "4"], "the links not followed")

            # The XSS dead letters: shown as text, never run. (Rows are redrawn every poll:
            # each check reads them whole, again if one was redrawn while it read.)
            def xss_shown_as_text() -> bool:
                rows = browser.find_elements("css selector", "#dead tbody tr")
                for reason, url in (("bad_redirect", XSS_URL), ("malformed", JS_URL)):
                    [row] = [r for r in rows if reason in r.text]
                    cells = row.find_elements("css selector", "td")
                    assert cells[2].get_attribute("title") == url
                    assert cells[2].text.startswith(url[:30])
                    if reason == "bad_redirect":
                        assert cells[3].get_attribute("title") == XSS_ERROR
                return True

            wait_for(xss_shown_as_text, "the hostile dead letters, as text")
            assert read(lambda: browser.find_elements(
                "css selector", "#dead img, #dead script")) == []
            assert browser.execute_script("return window.__xss") is None

            # Without the token the action is refused, and the page says why.
            wait_for(lambda: card(browser, "dead") == 5, "five dead letters")
            wait_for(lambda: browser.find_element(
                "css selector", 'tr[data-reason="http_5xx"] button.requeue').click() or True,
                "the requeue button")
            notice = wait_for(lambda: browser.find_element("css selector", "#notice").text,
                              "the refusal notice")
            assert "refused (401)" in notice and "token" in notice
            assert (await queue.stats()).dead == 5

            # With the token it goes through and the dead count moves.
            browser.find_element("css selector", "#token-form input").send_keys(TOKEN)
            browser.find_element("css selector", "#token-form button").click()
            wait_for(lambda: browser.find_element(
                "css selector", 'tr[data-reason="http_5xx"] button.requeue').is_enabled(),
                "the requeue button")
            wait_for(lambda: browser.find_element(
                "css selector", 'tr[data-reason="http_5xx"] button.requeue').click() or True,
                "a click on the requeue button")
            wait_for(lambda: "requeued" in browser.find_element("css selector", "#notice").text,
                     "the requeue notice")
            wait_for(lambda: card(browser, "dead") == 2, "the dead count to drop to 2")

            # When the consumer is through, the page shows exactly what Redis holds.
            async def finished() -> bool:
                s = await queue.stats()
                return s.done == PAGES + 3 and s.active == 0

            deadline = time.monotonic() + 40
            while not await finished():
                assert time.monotonic() < deadline, "the crawl did not finish"
                await asyncio.sleep(0.2)
            wait_for(lambda: card(browser, "done") == PAGES + 3, "the final done count")
            stats = await queue.stats()
            want = {"pending": stats.pending, "leased": stats.leased,
                    "waiting": stats.waiting, "dead": stats.dead}
            wait_for(lambda: {k: card(browser, k) for k in want} == want,
                     f"the state cards to read {want}")
            wait_for(lambda: browser.find_elements("css selector", "svg.chart path.line"),
                     "the chart's lines", 20)
            browser.save_screenshot(str(ARTIFACTS / "dashboard-crawl.png"))
            assert browser.execute_script("return window.__xss") is None

            # Revisits off and no history: no revisit panel; turned on, it shows.
            assert not read(
                lambda: browser.find_element("css selector", "#revisits").is_displayed())
            await set_policy(redis_client, crawl_name, {"revisit": "fixed"}, by="test")

            def revisit_figures() -> dict[str, str]:
                rows = browser.find_elements("css selector", "#revisits tr[data-figure]")
                return {r.get_attribute("data-figure"): r.find_elements(
                    "css selector", "td")[1].text for r in rows}

            wait_for(lambda: revisit_figures().get("scheduled") == "0",
                     "the revisit panel, scheduled 0")
            assert read(
                lambda: browser.find_element("css selector", "#revisits").is_displayed())
            assert read(revisit_figures)["late p50"] == "-"


async def until(pred: Callable[[], Any], what: str, within: float = 20) -> Any:
    """`wait_for` for an async predicate (a read of Redis)."""
    deadline = time.monotonic() + within
    while not (got := await pred()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.1)
    return got


def host_rows(driver: Any) -> dict[str, list[str]]:
    """The hosts table: host -> its cells' text (read whole; redone if redrawn meanwhile)."""
    rows = driver.find_elements("css selector", "#hosts tbody tr[data-host]")
    return {r.get_attribute("data-host"): [c.text for c in r.find_elements("css selector", "td")]
            for r in rows}


HOSTS = 4
HOST_PAGES = 400
XSS_HOST = '<img src=x onerror="window.__xss=8">'


async def test_hosts_panel_pause_and_host_settings(
        browser: Any, redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    queue = await LeasingQueue.open(redis_client, crawl_name)
    frontier = Frontier(queue)
    port = free_port()
    # ~50 s of crawl (2 at a time, 250 ms a page): the checks and the pause below come
    # before its end even when a loaded machine draws each page in seconds.
    async with start_site_process(delay_ms=250, hosts=HOSTS) as site:
        hosts = [f"127.0.0.{i + 1}:{site.port}" for i in range(HOSTS)]
        urls = [site.url(f"/p/{i}", host=i % HOSTS) for i in range(HOST_PAGES)]
        await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
        # A host name no URL can have, as a hostile writer could leave it in the state.
        await redis_client.zadd(queue.partitions[0].queued, {XSS_HOST: 0})
        async with child(*dashboard_argv(redis_url, port),
                         log=tmp_path / "dashboard.log"), \
                child(*consumer_argv(redis_url, crawl_name, tmp_path),
                      log=tmp_path / "consumer.log"):
            wait_for(lambda: browser.get(f"{base(port)}/crawls/{crawl_name}") or True,
                     "the dashboard to answer")

            # The table fills while the crawl runs: a row per host, pages done on them.
            def filling() -> bool:
                rows = host_rows(browser)
                return set(hosts) <= set(rows) and sum(int(rows[h][3]) for h in hosts) > 0
            wait_for(filling, "the hosts table to fill", 60)
            # Read again until no refresh redraws the table under the read (stale rows).
            rows = wait_for(lambda: host_rows(browser), "the hosts table")
            assert rows[XSS_HOST][0] == XSS_HOST  # the hostile name, as text
            assert read(lambda: browser.find_elements(
                "css selector", "#hosts img, #hosts script")) == []
            assert (await queue.stats()).pending > 0, "the crawl ended before the checks"

            # The sortable headers are the API's sort columns; in flight and done are
            # shown (the done cells above), as plain headers.
            # Read in one go, again if a refresh redrew the table under the read.
            def headers() -> tuple[list[str], set[str]]:
                sorts = [h.get_attribute("data-sort") for h in browser.find_elements(
                    "css selector", "#hosts th button.sort")]
                plain = {h.text for h in browser.find_elements("css selector", "#hosts thead th")
                         if not h.find_elements("css selector", "button")}
                return sorts, plain
            sorts, plain = wait_for(headers, "the hosts table's headers")
            assert sorts == list(SORT_COLUMNS)
            assert {"in flight", "done"} <= plain
            # Sorting by a column header: delay, most first; hosts without their own
            # delay aren't listed.
            await frontier.set_host(hosts[0], delay_s=0.01)
            await frontier.set_host(hosts[2], delay_s=0.02)
            click(browser, '#hosts th button.sort[data-sort="delay"]')
            wait_for(lambda: list(host_rows(browser)) == [hosts[2], hosts[0]],
                     "the table sorted by delay")
            click(browser, '#hosts th button.sort[data-sort="queued"]')

            # Pause, with the token: the consumer ends what it holds, then nothing moves.
            browser.find_element("css selector", "#token-form input").send_keys(TOKEN)
            browser.find_element("css selector", "#token-form button").click()
            wait_for(lambda: browser.find_element("css selector", "#summary button.pause")
                     .is_enabled(), "the pause button")
            click(browser, "#summary button.pause")
            wait_for(lambda: browser.find_element("css selector", "#paused").text == "paused",
                     "the paused badge")
            assert await frontier.is_paused()
            await until(lambda: _leased_none(queue), "the held leases to end")
            stats = await queue.stats()
            assert stats.pending > 0, "the crawl ended before the pause"
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:  # ~2 s with nothing leased or done
                now = await queue.stats()
                assert (now.done, now.leased) == (stats.done, 0), "work went on while paused"
                await asyncio.sleep(0.1)

            # A host's delay, set from its row's form while paused.
            target = hosts[1]
            click(browser, f'#hosts tr[data-host="{target}"] button.pick')
            assert read(lambda: browser.find_element(
                "css selector", '#hosts input[name="host"]').get_attribute("value")) == target
            browser.find_element("css selector", '#hosts input[name="delay_s"]').send_keys(
                "0.05")
            click(browser, "#hosts button.set-host")
            wait_for(lambda: f"host {target}: set" in browser.find_element(
                "css selector", "#notice").text, "the set notice")
            row = await frontier.host(target)
            assert row is not None and row.delay_ms == 50
            wait_for(lambda: host_rows(browser)[target][6] == "0.05s",
                     "the new delay in the table")

            # Resume: the crawl goes on and finishes.
            click(browser, "#summary button.resume")
            wait_for(lambda: browser.find_element("css selector", "#paused").text == "",
                     "the paused badge to go")
            assert not await frontier.is_paused()
            await until(lambda: _done_more_than(queue, stats.done), "progress after resume")
            wait_for(lambda: browser.find_elements("css selector", "svg.chart path.line"),
                     "the chart's lines", 30)
            browser.save_screenshot(str(ARTIFACTS / "dashboard-hosts.png"))  # mid-crawl
            await until(lambda: _done_more_than(queue, HOST_PAGES - 1), "the crawl to finish",
                        150)
            assert browser.execute_script("return window.__xss") is None


async def _leased_none(queue: LeasingQueue) -> bool:
    return (await queue.stats()).leased == 0


async def _done_more_than(queue: LeasingQueue, n: int) -> bool:
    return (await queue.stats()).done > n
