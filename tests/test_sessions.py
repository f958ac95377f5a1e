"""Sessions (issue 47): a cookie jar kept in Redis so any consumer continues it; named by
a request, or taken from a host's pool (retired on a block and after a usage count); a
spider that logs in once; cookies off for requests without a session, and a session's
cookies in no log, record or dashboard page."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, consumer_args, enqueue, records
from support.handover import until
from support.leases import owned_by
from support.login_site import PASSWORD, SPIDER, USER, login_site
from support.routes import serve
from yarl import URL

from common.http.cookies import CookieJar, redact_set_cookie
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.keys import CrawlKeys
from common.policy import create_policy
from common.proxies.bans import NO_RULES, Blocked
from common.proxies.sessions import SessionRules, SessionUpdate, read_sessions, send_updates
from common.queue import CrawlQueue, CrawlSettings
from common.tasks.request import Request
from common.tasks.task import Task, decode_entry, encode_entry
from console.cli import main_async
from consumer.proxied import PageFetch
from consumer.sessions import SessionBook, carry

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[1]
ID = "0" * 32
NOW = 1_800_000_000_000


def test_a_jar_keeps_cookies_by_domain_path_secure_and_expiry() -> None:
    jar = CookieJar()
    page = URL("http://shop.example/a/b")
    jar.take(["sid=1; Path=/", "pref=xyzzy", "wide=2; Domain=.example; Max-Age=60; Path=/",
              "safe=3; Secure", "bad=4; Domain=other.test", "gone=5; Max-Age=0"],
             page, NOW)
    assert jar.header(URL("http://shop.example/a/c"), NOW) == "pref=xyzzy; sid=1; wide=2"
    assert jar.header(URL("http://shop.example/"), NOW) == "sid=1; wide=2"  # pref: /a
    assert jar.header(URL("http://www.example/"), NOW) == "wide=2"  # host-only sid
    assert jar.header(URL("https://shop.example/a/x"), NOW) == \
        "pref=xyzzy; safe=3; sid=1; wide=2"
    assert jar.header(URL("http://shop.example/"), NOW + 61_000) == "sid=1"  # wide expired
    again = CookieJar.from_fields({"~v": "3", **jar.changes})
    assert again.header(URL("http://shop.example/a/c"), NOW) == "pref=xyzzy; sid=1; wide=2"
    jar.changes.clear()
    jar.take(["sid=; Max-Age=0; Path=/"], page, NOW)  # the site logs it out
    assert list(jar.changes.values()) == [""]
    assert jar.header(page, NOW) == "pref=xyzzy; wide=2"
    assert repr(jar) == "CookieJar(3 cookies)" and "xyzzy" not in repr(jar.all())
    raw = ((b"Set-Cookie", b"sid=s3cret; Path=/; HttpOnly"), (b"Server", b"t"))
    assert redact_set_cookie(raw) == ((b"Set-Cookie", b"sid=***; Path=/; HttpOnly"),
                                      (b"Server", b"t"))


def test_a_tasks_session_and_the_version_it_needs_travel_in_its_entry() -> None:
    entry = encode_entry(ID, "http://a.test/", session="member", session_version=4)
    task = decode_entry(entry)
    assert (task.session, task.session_version, task.as_request().session) == (
        "member", 4, "member")
    assert decode_entry(encode_entry(ID, "http://a.test/")).session is None
    parent = Task(ID, "http://a.test/", session="member")
    [(_, urls)] = list(carry([(parent, ["http://a.test/1", Request("http://a.test/2"),
                                        Request("http://a.test/3", session="other")])]))
    assert [(r.url, r.session) for r in urls] == [  # type: ignore[union-attr]
        ("http://a.test/1", "member"), ("http://a.test/2", "member"),
        ("http://a.test/3", "other")]


async def test_session_updates_merge_field_by_field_and_pool_sessions_retire(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    rules = SessionRules(pool=2, max_uses=3)
    field_a, field_b = "c:a.test\t/\ta", "c:a.test\t/\tb"
    first = [SessionUpdate("member", "", 1, 0, cookies={field_a: "1\t-1\t"}),
             SessionUpdate("a.test@1", "a.test", 1, 0, cookies={field_a: "9\t-1\t"})]
    assert await send_updates(redis_client, crawl_name, first, rules) == [(1, "live"),
                                                                          (1, "live")]
    # Another consumer's cookie joins the first's; a use alone changes no version.
    assert await send_updates(redis_client, crawl_name, [
        SessionUpdate("member", "", 2, 0, cookies={field_b: "2\t-1\t"}),
        SessionUpdate("member", "", 5, 1)], rules) == [(2, "live"), (2, "live")]
    [member] = await read_sessions(redis_client, crawl_name, ["member"])
    assert (member.uses, member.bans, member.state) == (8, 1, "live")  # named: kept
    assert member.jar.header(URL("http://a.test/"), NOW) == "a=1; b=2"
    pool = CrawlKeys.build(crawl_name).session_pool("a.test")
    assert await redis_client.zrange(pool, 0, -1) == [b"a.test@1"]
    # A pool session is retired at its usage count: its cookies dropped, out of the pool.
    assert await send_updates(redis_client, crawl_name, [
        SessionUpdate("a.test@1", "a.test", 2, 0)], rules) == [(2, "retired")]
    [retired] = await read_sessions(redis_client, crawl_name, ["a.test@1"])
    assert (retired.state, len(retired.jar)) == ("retired", 0)
    assert await redis_client.zrange(pool, 0, -1) == []
    # A call sent again (its reply lost) counts nothing twice.
    update = SessionUpdate("x", "", 1, 0)
    args = update.args(3)
    keys = CrawlKeys.build(crawl_name)
    for _ in range(2):
        await redis_client.evalsha(  # type: ignore[misc]
            await redis_client.script_load(_source()), 3, keys.sessions, keys.session("x"),
            keys.session_pool(""), *args)
    [x] = await read_sessions(redis_client, crawl_name, ["x"])
    assert x.uses == 1


def _source() -> str:
    from common.redis.scripts import source  # noqa: PLC0415
    return source("session_update")


async def test_a_session_a_consumer_logged_in_with_is_continued_by_another(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Consumer A fetches the login form and posts it with session "member" and writes
    the session at its flush; consumer B, which never saw it, fetches a member page of
    the version A's flush wrote: logged in."""
    await CrawlQueue.open(redis_client, crawl_name, CrawlSettings())
    rules = SessionRules()
    async with login_site() as site, Fetcher(FetchSettings(allow_private=True)) as fetcher:
        book_a = SessionBook(redis_client, crawl_name, lambda: rules)
        pages_a = PageFetch(fetcher, None, book_a)
        form = await pages_a.fetch(site.base + "/login", "h", crawl=NO_RULES, route=NO_RULES,
                                   task=Task(ID, site.base + "/login", session="member"))
        token = form.body.decode().split("value='")[1].split("'")[0]
        login = Request.form(site.base + "/login", {"user": USER, "password": PASSWORD,
                                                    "csrf": token})
        await book_a.flush()  # the form's flush: its pre cookie
        account = await pages_a.fetch(
            login.url, "h", crawl=NO_RULES, route=NO_RULES, method="POST", body=login.body,
            headers=dict(login.headers),
            task=Task(ID, login.url, session="member",
                      session_version=book_a.version_of("member")))
        assert b"a class='item'" in account.body and site.logins == 1
        assert not any(v.encode() in b"".join(v for _, v in account.raw_headers)
                       for v in site.issued)  # redacted: no Set-Cookie value kept
        await book_a.flush()
        version = book_a.version_of("member")
        book_b = SessionBook(redis_client, crawl_name, lambda: rules)
        item = await PageFetch(fetcher, None, book_b).fetch(
            site.base + "/item/3", "h", crawl=NO_RULES, route=Blocked(css="form#login"),
            task=Task(ID, site.base + "/item/3", session="member", session_version=version))
        assert b"sku-3" in item.body
        plain = await fetcher.fetch(site.base + "/item/3")  # no session: no cookie
        assert b"form id='login'" in plain.body
    assert (site.logged_out, site.served) == (1, 2)


async def test_a_spider_logs_in_once_and_gets_every_members_page(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spider = tmp_path / "members.py"
    spider.write_text(SPIDER)
    async with login_site(items=25) as site:
        monkeypatch.setenv("LOGIN_SITE", site.base)
        await create_policy(redis_client, crawl_name, {
            "per_host_delay": 0.0, "per_host_concurrency": 4, "max_depth": 50,
            "retry_base": 0.05, "retry_cap": 0.1, "ignore_robots": True}, by="test")
        q = await CrawlQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([_task(r) for r in _start(site.base)])
        assert await consume(redis_url, crawl_name, tmp_path / "out", "--spider",
                             str(spider), "--store-body") == 0
    items = {i["sku"]: i for r in records(tmp_path / "out") for i in r["items"]}
    assert sorted(items) == sorted(f"sku-{i}" for i in range(25))
    assert (site.logins, site.logged_out) == (1, 0)
    text = "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert site.issued and not any(v in text for v in site.issued)
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        assert await main_async(["sessions", "--redis-url", redis_url, "--crawl",
                                 crawl_name]) == 0
    [row] = listing.getvalue().splitlines()[1:]
    assert row.split()[:7] == ["member", "-", "live", row.split()[3], row.split()[4], "0",
                               "2"] and not any(v in listing.getvalue() for v in site.issued)


def _start(base: str) -> list[Request]:
    return [Request(base + "/login", label="login", session="member")]


def _task(request: Request) -> Any:
    from common.queue import NewTask  # noqa: PLC0415
    from common.urls.canonical import canonicalize  # noqa: PLC0415
    url = canonicalize(request.url)
    assert isinstance(url, str)
    return NewTask.from_request(request, url)


async def test_a_hosts_pool_gives_its_requests_cookies_and_retires_sessions(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """A site that ties its pages to a cookie issued with the first visit: with a pool of
    2 sessions of 4 uses, each request after a session's first carries its cookie, and a
    session answered with a block is retired; without a pool no cookie is ever sent."""
    visitors: dict[str, int] = {}
    cookieless: list[str] = []

    async def page(request: web.Request) -> web.Response:
        visitor = request.cookies.get("visitor")
        if visitor is None:
            cookieless.append(request.path)
            resp = web.Response(text="<html><body>welcome</body></html>",
                                content_type="text/html")
            resp.set_cookie("visitor", f"v{len(visitors)}", path="/")
            visitors[f"v{len(visitors)}"] = 0
            return resp
        visitors[visitor] += 1
        if visitor == "v1" and visitors[visitor] == 2:  # this one is caught: a captcha
            return web.Response(text="<div class='captcha'>x</div>", content_type="text/html")
        return web.Response(text=f"<html><body>{visitor}</body></html>",
                            content_type="text/html")
    async with serve({"/p/{i}": page}) as site:
        await create_policy(redis_client, crawl_name, {
            "per_host_delay": 0.0, "per_host_concurrency": 1, "retry_base": 0.05,
            "retry_cap": 0.1, "ignore_robots": True, "session_pool": 2,
            "session_max_uses": 4, "ban_selector": "div.captcha"}, by="test")
        q = await enqueue(redis_client, crawl_name, [site.url(f"/p/{i}") for i in range(16)])
        assert await consume(redis_url, crawl_name, tmp_path / "out") == 0
        assert (await q.stats()).done == 16
        sessions = await redis_client.zrange(CrawlKeys.build(crawl_name).sessions, 0, -1)
        with_pool = len(cookieless), len(visitors), len(sessions)
        cookieless.clear()
        visitors.clear()
        crawl2 = crawl_name + "-nopool"  # no pool, no session: cookies off
        await create_policy(redis_client, crawl2, {
            "per_host_delay": 0.0, "ignore_robots": True}, by="test")
        await enqueue(redis_client, crawl2, [site.url(f"/p/{i}") for i in range(6)])
        assert await consume(redis_url, crawl2, tmp_path / "out2") == 0
        assert len(cookieless) == len(visitors) == 6
    # 16 requests: the first of each session is cookieless; 4 uses a session, one retired
    # early by its block: 5 or 6 sessions, whose first requests were the only cookieless.
    cookieless_n, visitors_n, sessions_n = with_pool
    assert cookieless_n == visitors_n == sessions_n and 5 <= sessions_n <= 6, with_pool


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")
           and k != "REDIS_URL"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_three_consumers_one_killed_mid_crawl_get_every_members_page_logged_in_once(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        make_client: Any) -> None:
    """The issue's login: a spider logs in once (session "member"), three consumer
    processes share the session through Redis, one is kill -9'd while it holds leases,
    and every item behind the login is gathered once by key; no cookie value the site
    issued is in any consumer's log, any record or any dashboard page."""
    spider = tmp_path / "members.py"
    spider.write_text(SPIDER)
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0.0, "per_host_concurrency": 3, "max_depth": 50,
        "retry_base": 0.1, "retry_cap": 0.2, "ignore_robots": True}, by="test")
    procs: dict[str, asyncio.subprocess.Process] = {}
    out = tmp_path / "out"

    async def consumer(name: str, base: str) -> None:
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs[name] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "consumer", *consumer_args(redis_url, crawl_name,
                                                                 out / name),
                "--worker-id", name, "--spider", str(spider), "--lease", "2",
                "--concurrency", "3", "--log-level", "DEBUG", "--store-body",
                env=child_env(LOGIN_SITE=base), cwd=tmp_path,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT)

    try:
        async with login_site(items=80, delay_s=0.05) as site:
            q = await CrawlQueue.open(redis_client, crawl_name, CrawlSettings())
            await q.enqueue([_task(r) for r in _start(site.base)])
            for name in ("w-doomed", "w-one", "w-two"):
                await consumer(name, site.base)

            async def under_way() -> bool:
                return (await q.stats()).done >= 20
            await until(under_way, 60, "20 tasks done")
            doomed = procs["w-doomed"]

            async def caught_holding_leases() -> bool:
                assert doomed.returncode is None, "the crawl ended before the kill"
                doomed.send_signal(signal.SIGSTOP)
                if await owned_by(q, "w-doomed"):
                    return True
                doomed.send_signal(signal.SIGCONT)
                return False
            await until(caught_holding_leases, 60, "the doomed consumer to hold leases")
            doomed.kill()
            await doomed.wait()
            for name in ("w-one", "w-two"):
                assert await asyncio.wait_for(procs[name].wait(), 90) == 0, \
                    (tmp_path / f"{name}.log").read_text()[-3000:]
            client = await make_client()
            pages = [await (await client.get(f"/api/crawls/{crawl_name}{view}")).text()
                     for view in ("", "/sessions", "/proxies", "/dead", "/workers",
                                  "/hosts", "/history", "/policy")]
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stats = await q.stats()
    assert (stats.dead, stats.active) == (0, 0)
    assert stats.counters.get("reclaimed", 0) >= 1  # the killed one held leases
    items = {i["sku"] for r in records_in(out) for i in r["items"]}
    assert items == {f"sku-{i}" for i in range(80)}
    assert site.logins == 1 and site.logged_out == 0
    sessions = json.loads(pages[1])["sessions"]
    assert [(s["name"], s["cookies"]) for s in sessions] == [("member", 2)]
    logs = "".join((tmp_path / f"{n}.log").read_text(errors="replace") for n in procs)
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    for value in site.issued:
        assert value not in logs and value not in written
        assert not any(value in page for page in pages)


def records_in(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(out.rglob("*.jsonl"))
            for line in path.read_text().splitlines() if line]


async def test_requests_waiting_for_one_session_share_one_read_and_one_jar(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    await send_updates(redis_client, crawl_name, [
        SessionUpdate("member", "", 1, 0, cookies={"c:a.test\t/\tsid": "1\t-1\t"})],
        SessionRules())
    book = SessionBook(redis_client, crawl_name, SessionRules)
    task = Task(ID, "http://a.test/", session="member", session_version=1)
    first, second = await asyncio.gather(book.for_task(task, "a.test"),
                                         book.for_task(task, "a.test"))
    assert first is second and first is not None
    jar = first.record.jar
    jar.take(["pref=2; Path=/"], URL("http://a.test/"), NOW)  # learned here, not flushed
    await send_updates(redis_client, crawl_name, [  # another consumer's login
        SessionUpdate("member", "", 1, 0, cookies={"c:a.test\t/\tsid": "9\t-1\t"})],
        SessionRules())
    await book.for_task(Task(ID, "http://a.test/", session="member", session_version=2),
                        "a.test")
    assert first.record.jar is jar  # fetches under way keep writing to the one flushed
    assert jar.header(URL("http://a.test/"), NOW) == "sid=9; pref=2"
