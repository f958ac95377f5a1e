"""The browser fetcher on its own (common/browser): a page built by its scripts comes back
as its DOM with the JSON it fetched, and every request a page makes goes through crawlq's
guarded HTTP client: a script's fetch of a loopback canary, a private address or the
metadata address connects to none of them; images, WebSockets and downloads are refused;
the body cap and the total timeout hold; the crawl's credentials stay on the page's
origin. Page actions (wait, scroll, click "load more") run before the DOM is taken.

The sites listen on 127.0.0.2 (and 127.0.0.3 for another origin), which the fetcher's
SSRF guard lets through by --allow-network alone; the canaries listen on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web
from support.chromium import (
    ALLOW,
    ALLOW_OTHER,
    CHROMIUM,
    OTHER_HOST,
    SITE_HOST,
    needs_chromium,
)
from support.routes import serve
from yarl import URL

from common.browser.chromium import BrowserSettings, find_chromium
from common.browser.fetcher import BrowserFetcher
from common.browser.render import Render, RenderResult
from common.errors import ConfigError, FetchError
from common.http.cookies import CookieJar
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.spider import Response
from console.demo.jsshop import ShopSpec, js_shop, product_of

pytestmark = [needs_chromium, pytest.mark.timeout(90)]

CAP = 256 * 1024
TOTAL = 8.0
SECRET = "Bearer crawl-secret"

#: Addresses a test's process connected to (sys.audit "socket.connect"): the private and
#: the metadata address must never be among them. Installed once (a hook stays).
CONNECTS: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and len(args) > 1 and isinstance(args[1], tuple):
        host = str(args[1][0])
        if host.startswith(("10.", "169.254.")):
            CONNECTS.append(host)


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    http = Fetcher(FetchSettings(allow_networks=(ALLOW, ALLOW_OTHER), total_timeout=TOTAL,
                                 max_body_bytes=CAP, headers=(("Authorization", SECRET),)))
    await http.start()
    assert CHROMIUM is not None
    fetcher = BrowserFetcher(http, BrowserSettings(CHROMIUM, pages=2), total_timeout=TOTAL,
                             max_body_bytes=CAP)
    await fetcher.start()
    try:
        yield fetcher
    finally:
        await fetcher.close()
        await http.close()


@pytest.fixture
def canary() -> Iterator[list[str]]:
    """Requests that reached a loopback canary (the list of their paths)."""
    hits: list[str] = []
    yield hits


def html(body: str) -> web.Response:
    return web.Response(text=f"<!doctype html><html><body>{body}</body></html>",
                        content_type="text/html")


async def test_a_page_built_by_its_script_comes_back_as_its_dom_with_its_json(
        browser: Any) -> None:
    spec = ShopSpec(categories=1, products=4, page_size=10)
    async with js_shop(spec, host=SITE_HOST) as base:
        plain = await browser.http.fetch(f"{base}/js/0/item/2")
        assert Response(plain).css(".sku").get() is None  # over HTTP: the empty shell
        result = await browser.fetch(f"{base}/js/0/item/2", render=Render(wait_for=".sku"))
    assert isinstance(result, RenderResult)
    page = Response(result)
    assert page.rendered and page.css(".sku::text").get() == "c0-p2"
    assert page.css(".name::text").get() == product_of(0, 2)["name"]
    assert [f.json() for f in page.fetched] == [product_of(0, 2)]
    assert page.fetched[0].url == f"{base}/api/0/item/2"
    assert result.headers["content-type"] == "text/html; charset=utf-8"
    assert result.final_url == f"{base}/js/0/item/2" and result.status == 200


async def test_a_script_reaches_no_canary_no_private_and_no_metadata_address(
        browser: Any) -> None:
    """The page's own fetch() calls, an iframe, an image and a redirect all aim at a
    canary on 127.0.0.1 (the guard refuses loopback but 127.0.0.2), a private address and
    the metadata address: not one connection reaches them, and the page still renders."""
    hits: list[str] = []

    async def canary_page(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="canary")

    async with serve({"/{tail:.*}": canary_page}) as canary:
        async def page(request: web.Request) -> web.Response:
            targets = [canary.url("/fetch"), "http://10.255.255.1/private",
                       "http://169.254.169.254/latest/meta-data/",
                       f"http://[::ffff:127.0.0.1]:{canary.base.rsplit(':', 1)[1]}/mapped",
                       f"{request.url.origin()}/hop"]
            calls = "".join(f"fetch({t!r}).catch(() => 0);" for t in targets)
            return html(f'<p id="done">ok</p><iframe src="{canary.url("/frame")}"></iframe>'
                        f'<img src="{canary.url("/img.png")}">'
                        f'<script src="{canary.url("/script.js")}"></script>'
                        f'<link rel="stylesheet" href="{canary.url("/style.css")}">'
                        f'<link rel="preconnect" href="{canary.base}">'
                        f"<script>{calls} new Image().src = {canary.url('/beacon')!r};"
                        f"</script>")

        async def hop(request: web.Request) -> web.Response:
            raise web.HTTPFound(canary.url("/redirected"))

        async with serve({"/page": page, "/hop": hop}, host=SITE_HOST) as site:
            before = browser.ssrf_refused
            result = await browser.fetch(site.url("/page"), render=Render(settle_ms=200))
            await asyncio.sleep(0.3)
            assert b'id="done"' in result.body
            assert hits == []
            assert CONNECTS == []
            # fetches, the iframe, the script, the stylesheet, the redirect's hop
            assert browser.ssrf_refused - before >= 7
            assert result.refused >= 5
            assert not [h for h in browser.pool.sinkhole.heads
                        if canary.base.split("//")[1].encode() in h or b"169.254" in h
                        or b"10.255" in h]
            assert sorted(p for p in site.paths) == ["/hop", "/page"]


async def test_images_media_and_fonts_load_only_when_the_route_asks(browser: Any) -> None:
    async def page(request: web.Request) -> web.Response:
        return html('<img src="/a.png"><video src="/v.mp4"></video>'
                    '<style>@font-face{font-family:f;src:url(/f.woff)} p{font-family:f}</style>'
                    '<p>text</p><link rel="stylesheet" href="/s.css">')

    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=b"x", content_type="application/octet-stream")

    async def css(request: web.Request) -> web.Response:
        return web.Response(text="p{color:red}", content_type="text/css")

    async with serve({"/page": page, "/s.css": css, "/{f}": blob}, host=SITE_HOST) as site:
        await browser.fetch(site.url("/page"))
        assert sorted(site.paths) == ["/page", "/s.css"]
        site.paths.clear()
        await browser.fetch(site.url("/page"), render=Render(images=True, settle_ms=200))
        assert "/a.png" in site.paths and "/s.css" in site.paths


async def test_a_websocket_and_a_download_are_refused(browser: Any) -> None:
    sockets: list[str] = []

    async def ws(request: web.Request) -> web.StreamResponse:
        sockets.append(request.path)
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        await socket.close()
        return socket

    async def page(request: web.Request) -> web.Response:
        host = request.host
        return html(f'<p id="p">p</p><iframe src="/file.zip"></iframe>'
                    f"<script>try {{ new WebSocket('ws://{host}/ws') }} catch (e) {{}}"
                    f"</script>")

    async def attachment(request: web.Request) -> web.Response:
        return web.Response(body=b"PK" + b"\0" * 100, content_type="application/zip",
                            headers={"Content-Disposition": 'attachment; filename="f.zip"'})

    async with serve({"/page": page, "/ws": ws, "/file.zip": attachment},
                     host=SITE_HOST) as site:
        result = await browser.fetch(site.url("/page"), render=Render(settle_ms=200))
        assert b'id="p"' in result.body and sockets == []
        assert result.refused >= 1  # the download
        # A task whose own URL is a download is not rendered: returned as fetched.
        zipped = await browser.fetch(site.url("/file.zip"))
        assert not isinstance(zipped, RenderResult) and zipped.body.startswith(b"PK")


async def test_the_body_cap_holds_for_a_subrequest_and_for_the_dom(browser: Any) -> None:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (CAP + 1), content_type="application/json")

    async def page(request: web.Request) -> web.Response:
        return html('<p id="p"></p><script>fetch("/big").then(r => r.text()).then('
                    't => document.getElementById("p").textContent = t.length)'
                    '.catch(() => document.getElementById("p").textContent = "refused")'
                    "</script>")

    async def grows(request: web.Request) -> web.Response:
        return html(f"<script>document.body.append('y'.repeat({CAP + 10}))</script>")

    async with serve({"/page": page, "/big": big, "/grows": grows}, host=SITE_HOST) as site:
        result = await browser.fetch(site.url("/page"), render=Render(wait_for="#p:not(:empty)"))
        assert Response(result).css("#p::text").get() == "refused"
        with pytest.raises(FetchError) as err:
            await browser.fetch(site.url("/grows"))
    assert err.value.reason == "body_too_large" and not err.value.retryable


async def test_the_total_timeout_holds_for_a_page_that_never_settles(browser: Any) -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(60)
        return web.Response(text="late")

    async def page(request: web.Request) -> web.Response:
        return html('<script>fetch("/hang")</script><p class="never-here"></p>')

    async with serve({"/page": page, "/hang": hang}, host=SITE_HOST) as site:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(FetchError) as err:
            await browser.fetch(site.url("/page"), render=Render(wait_for="#nothing"))
        took = loop.time() - started
    assert err.value.reason == "timeout" and err.value.retryable
    assert TOTAL - 0.5 < took < TOTAL + 3


async def test_the_crawls_credentials_go_to_the_pages_origin_only(browser: Any) -> None:
    async def api(request: web.Request) -> web.Response:
        return web.json_response({"auth": request.headers.get("Authorization")},
                                 headers={"Access-Control-Allow-Origin": "*",
                                          "Access-Control-Allow-Headers": "*"})

    async with serve({"/api": api}, host=OTHER_HOST) as other:
        async def page(request: web.Request) -> web.Response:
            return html(f'<script>fetch("/api"); fetch({other.url("/api")!r})</script>')

        async with serve({"/page": page, "/api": api}, host=SITE_HOST) as site:
            result = await browser.fetch(site.url("/page"), headers=None,
                                         crawl_credentials=True,
                                         render=Render(settle_ms=200))
    auth = {f.url.split("/")[2].split(":")[0]: f.json()["auth"] for f in result.fetched}
    assert auth == {SITE_HOST: SECRET, OTHER_HOST: None}
    assert site.seen[0].headers.get("Authorization") == SECRET  # the page itself


async def test_a_sessions_jar_goes_with_every_request_of_its_page(browser: Any) -> None:
    """A request with a session: each request of its page sends the jar's cookies for its
    URL (the page's own host's, none to another), and what an answer sets joins the jar;
    Chromium's own Cookie header is never passed on."""
    async def api(request: web.Request) -> web.Response:
        return web.json_response({"cookie": request.headers.get("Cookie")},
                                 headers={"Access-Control-Allow-Origin": "*",
                                          "Set-Cookie": "seen=1; Path=/"})

    async with serve({"/api": api}, host=OTHER_HOST) as other:
        async def page(request: web.Request) -> web.Response:
            return html('<script>document.cookie = "script=1";'
                        f'fetch("/api").then(() => fetch({other.url("/api")!r}))</script>')

        async with serve({"/page": page, "/api": api}, host=SITE_HOST) as site:
            jar = CookieJar()
            jar.take(["sid=abc; Path=/"], URL(site.url("/")))
            result = await browser.fetch(site.url("/page"), cookies=jar,
                                         render=Render(settle_ms=200))
    sent = {f.url.split("/")[2].split(":")[0]: f.json()["cookie"] for f in result.fetched}
    assert sent == {SITE_HOST: "sid=abc", OTHER_HOST: None}
    assert site.seen[0].headers.get("Cookie") == "sid=abc"  # the page itself
    assert sorted((c.name, c.domain) for c in jar.all()) == sorted([
        ("seen", OTHER_HOST), ("seen", SITE_HOST), ("sid", SITE_HOST)])


@pytest.mark.parametrize("how", ["more", "scroll"])
async def test_page_actions_load_more_and_scroll_before_the_dom(browser: Any,
                                                                how: str) -> None:
    spec = ShopSpec(categories=1, products=23, page_size=5)
    render = Render(click="button.more") if how == "more" else Render(scroll=8)
    async with js_shop(spec, host=SITE_HOST) as base:
        once = Response(await browser.fetch(f"{base}/js/0/{how}",
                                            render=Render(wait_for="li.product")))
        result = Response(await browser.fetch(f"{base}/js/0/{how}", render=render))
    assert len(once.css("li.product")) == 5
    assert len(result.css("li.product")) == 23
    assert len(result.fetched) == 5  # the five calls, each kept


def test_browser_auto_finds_chromium_and_a_missing_one_is_one_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_chromium("auto") == CHROMIUM
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"--browser auto: no Chromium on the PATH .*"
                                          r"apt-get install chromium"):
        find_chromium("auto")
    with pytest.raises(ConfigError, match="no executable there"):
        find_chromium("/opt/no/chrome")


async def test_a_page_whose_own_data_call_failed_is_retried_not_taken_empty(
        browser: Any) -> None:
    """Its route would find no items in it and end it done: the render fails with the
    call's reason (retryable) instead. A call to another host failing (an ad, a tracker)
    does not."""
    async def down(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async with serve({"/api": down}, host=OTHER_HOST) as other:
        async def page(request: web.Request) -> web.Response:
            where = request.query["api"]
            return html(f'<ul id="l"></ul><script>fetch({where!r}).catch(() => 0)</script>')

        async with serve({"/page": page, "/api": down}, host=SITE_HOST) as site:
            with pytest.raises(FetchError) as err:
                await browser.fetch(site.url("/page?api=/api"))
            result = await browser.fetch(site.url(f"/page?api={other.url('/api')}"))
    assert err.value.reason == "http_5xx" and err.value.retryable and err.value.status == 503
    assert b'<ul id="l"></ul>' in result.body
