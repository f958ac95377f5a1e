"""Local HTTP forward proxies in front of one local site, and a site that bans proxies.

A `ForwardProxy` takes absolute-form requests (``GET http://a.test/p/1``) on 127.0.0.1,
sends each to the one upstream site whatever its host name (the host kept in ``Host``),
tagged ``X-Via-Proxy: <its name>`` (the address a real site would see), and counts them
per host. `kill` closes it (connections refused: a proxy that died), `revive` opens it
again on the same port. A proxy URL may carry credentials the proxy checks
(``Proxy-Authorization``, 407 otherwise).

`banning_site` serves ``/p/<i>`` pages that link nowhere, except to the proxies each
host bans: 403, or a 200 captcha page (`CAPTCHA`).
"""

from __future__ import annotations

import base64
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

CAPTCHA = "<html><body><div class='captcha'>Please prove you are human</div></body></html>"


@dataclass
class ForwardProxy:
    """One forward proxy to `upstream` (``127.0.0.1:<port>``)."""

    name: str
    upstream: str
    auth: tuple[str, str] | None = None
    port: int = 0
    hits: Counter[str] = field(default_factory=Counter)  # host -> requests forwarded
    refused: int = 0  # requests without the right Proxy-Authorization
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        who = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"http://{who}127.0.0.1:{self.port}"

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            if request.headers.get("Proxy-Authorization") != f"Basic {token}":
                self.refused += 1
                return web.Response(status=407)
        self.hits[request.host] += 1
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("proxy-authorization", "proxy-connection")}
        headers["X-Via-Proxy"] = self.name
        async with self._session.request(
                request.method, f"http://{self.upstream}{request.rel_url}", headers=headers,
                data=await request.read(), allow_redirects=False) as resp:
            out = web.Response(status=resp.status, body=await resp.read())
            for k, v in resp.headers.items():
                if k.lower() in ("content-type", "location", "retry-after", "set-cookie"):
                    out.headers.add(k, v)
            return out

    async def start(self) -> ForwardProxy:
        if self._runner is not None:  # running already
            return self
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def kill(self) -> None:
        """Close it: connections to it are refused from now on."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def revive(self) -> None:
        await self.start()

    async def close(self) -> None:
        await self.kill()
        if self._session is not None:
            await self._session.close()
            self._session = None


@contextlib.asynccontextmanager
async def proxies(upstream: str, names: list[str], *,
                  auth: Mapping[str, tuple[str, str]] | None = None
                  ) -> AsyncIterator[dict[str, ForwardProxy]]:
    """Started proxies by name, in front of `upstream`."""
    made = {n: ForwardProxy(n, upstream, (auth or {}).get(n)) for n in names}
    try:
        for p in made.values():
            await p.start()
        yield made
    finally:
        for p in made.values():
            await p.close()


@dataclass
class BanningSite:
    """Which proxies each host bans, and how: ``bans[host][proxy] = "403" | "captcha"``;
    `seen` counts (host, proxy) requests."""

    bans: dict[str, dict[str, str]] = field(default_factory=dict)
    seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    base: str = ""

    async def page(self, request: web.Request) -> web.Response:
        host = request.host.split(":")[0]
        via = request.headers.get("X-Via-Proxy", "direct")
        self.seen[(host, via)] += 1
        how = self.bans.get(host, {}).get(via)
        if how == "403":
            return web.Response(status=403, text="banned")
        if how == "captcha":
            return web.Response(text=CAPTCHA, content_type="text/html")
        i = request.match_info.get("i", "0")
        return web.Response(text=f"<html><body><p class='item'>{host} {i}</p></body></html>",
                            content_type="text/html")


@contextlib.asynccontextmanager
async def banning_site(bans: dict[str, dict[str, str]]) -> AsyncIterator[BanningSite]:
    site = BanningSite(bans)
    app = web.Application()
    app.router.add_get("/p/{i}", site.page)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    site.base = f"127.0.0.1:{tcp._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield site
    finally:
        await runner.cleanup()
