"""A local site whose pages are for members only, and the spider that logs in to it.

``GET /login`` sets a ``pre`` cookie and serves a form whose hidden ``csrf`` must match
it (a hash of it); ``POST /login`` with the right user, password and csrf sets the
``sid`` cookie and redirects (302) to ``/account?page=0``. ``/account?page=<k>`` lists
items k*10 .. k*10+9 (``a.item``) and the next page (``a.next``); ``/item/<i>`` is an
item. Without a valid ``sid`` both redirect to ``/login``: a spider that lost its
session gets the login form, which its routes' ``blocked`` rule refuses as data. The
site counts logins, member pages served, and requests that came logged out; it
remembers every cookie value it issued, so a test can look for them where they must
never be (logs, records, the dashboard).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from support.routes import is_probe

USER, PASSWORD = "ann", "pw-of-ann"
PER_PAGE = 10
SPIDER = '''
import os
from crawlq import Blocked, Request, Spider

BASE = os.environ.get("LOGIN_SITE", "http://127.0.0.1:9")
LOGGED_OUT = Blocked(css="form#login")
spider = Spider("members", start=[Request(BASE + "/login", label="login", session="member")],
                item_key="sku", policy={"max_depth": 50})


@spider.route("login")
async def login(response, ctx):
    token = response.css("input[name=csrf]::attr(value)").get()
    ctx.follow(Request.form(BASE + "/login", {"user": "ann", "password": "pw-of-ann",
                                              "csrf": token}, label="account"))


@spider.route("account", blocked=LOGGED_OUT)
async def account(response, ctx):
    ctx.follow(css="a.item", label="item")
    ctx.follow(css="a.next", label="account")


@spider.route("item", blocked=LOGGED_OUT)
async def item(response, ctx):
    ctx.emit({"sku": response.css(".sku::text").get(), "name": response.css("h1::text").get()})
'''


def _csrf(pre: str) -> str:
    """The form's token for a ``pre`` cookie (not the cookie itself: a page's body may be
    a record's, a cookie's value never is)."""
    return hashlib.sha256(pre.encode()).hexdigest()[:24]


@dataclass
class LoginSite:
    items: int = 30
    delay_s: float = 0.0  # each member page sleeps this long
    base: str = ""
    logins: int = 0
    served: int = 0  # member pages served logged in
    logged_out: int = 0  # member pages asked for without a valid sid
    issued: list[str] = field(default_factory=list)  # every cookie value it set
    _pre: set[str] = field(default_factory=set)
    _sids: set[str] = field(default_factory=set)

    def _set(self, resp: web.StreamResponse, name: str) -> str:
        value = secrets.token_hex(16)
        self.issued.append(value)
        resp.set_cookie(name, value, path="/", httponly=True)
        return value

    async def login_form(self, request: web.Request) -> web.Response:
        resp = web.Response(content_type="text/html")
        pre = self._set(resp, "pre")
        self._pre.add(pre)
        resp.text = ("<html><body><form id='login' method='post' action='/login'>"
                     f"<input name='csrf' type='hidden' value='{_csrf(pre)}'>"
                     "<input name='user'><input name='password' type='password'></form>"
                     "</body></html>")
        return resp

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        pre = request.cookies.get("pre")
        if (form.get("user"), form.get("password")) != (USER, PASSWORD) or \
                pre not in self._pre or form.get("csrf") != _csrf(pre):
            return web.Response(status=403, text="bad login")
        self.logins += 1
        resp = web.HTTPFound("/account?page=0")
        self._sids.add(self._set(resp, "sid"))
        raise resp

    async def _member(self, request: web.Request) -> bool:
        if request.cookies.get("sid") not in self._sids:
            # a crawl's soft-404 probe asks for a made-up member page without a session
            self.logged_out += not is_probe(request.path)
            raise web.HTTPFound("/login")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.served += 1
        return True

    async def account(self, request: web.Request) -> web.Response:
        await self._member(request)
        page = int(request.query.get("page", "0"))
        first = page * PER_PAGE
        links = "".join(f"<a class='item' href='/item/{i}'>{i}</a>"
                        for i in range(first, min(first + PER_PAGE, self.items)))
        if first + PER_PAGE < self.items:
            links += f"<a class='next' href='/account?page={page + 1}'>next</a>"
        return web.Response(text=f"<html><body>{links}</body></html>",
                            content_type="text/html")

    async def item(self, request: web.Request) -> web.Response:
        await self._member(request)
        i = request.match_info["i"]
        return web.Response(text=f"<html><body><h1>item {i}</h1><p class='sku'>sku-{i}</p>"
                            "</body></html>", content_type="text/html")


@contextlib.asynccontextmanager
async def login_site(items: int = 30, delay_s: float = 0.0) -> AsyncIterator[LoginSite]:
    site = LoginSite(items, delay_s)
    app = web.Application()
    app.router.add_get("/login", site.login_form)
    app.router.add_post("/login", site.login)
    app.router.add_get("/account", site.account)
    app.router.add_get("/item/{i}", site.item)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    site.base = f"http://127.0.0.1:{tcp._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield site
    finally:
        await runner.cleanup()
