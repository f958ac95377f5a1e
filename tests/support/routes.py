"""A local aiohttp site built from a test's own routes, on 127.0.0.1 in the test's event
loop (``async with serve({"/p/{i}": page}) as site``), and handlers for it.

``tests/sites.py`` is the other kind: one fixed application driven by options, in-process
or as a subprocess (``python -m tests.sites``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Seen:
    """A request as the site got it."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str]


#: The path of a crawl's soft-404 probe (common.traps.soft404.probe_url): a made-up name of 16
#: lowercase letters and digits, a letter first and a digit among them, as a file with
#: the extension of the page it is shaped after, or a directory.
PROBE = re.compile(r".*/(?=[a-z0-9]{0,15}[0-9])[a-z][a-z0-9]{15}(\.[A-Za-z0-9]{1,5}|/)?")


def is_probe(path: str) -> bool:
    """Whether a request's path is a soft-404 probe's (``PROBE``)."""
    return PROBE.fullmatch(path) is not None


@dataclass
class Site:
    """A local test site; records every request's path and time, and what it was
    (``seen``: method, body, headers), but a soft-404 probe's (``probes``: their paths),
    which the crawl makes of its own accord."""

    base: str = ""
    hits: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    paths: list[str] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base + path


@contextlib.asynccontextmanager
async def serve(routes: dict[str, Handler], robots: str | None = None, *,
                host: str = "127.0.0.1") -> AsyncIterator[Site]:
    site = Site()

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_probe(request.path):
            site.probes.append(request.path)
            return await handler(request)
        site.hits[request.path].append(time.monotonic())
        site.paths.append(request.raw_path)
        site.seen.append(Seen(request.method, request.raw_path, await request.read(),
                              dict(request.headers)))
        return await handler(request)

    app = web.Application(middlewares=[record], handler_args={"max_field_size": 16384})
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)  # any method: requests have them
    if robots is not None:
        async def robots_txt(request: web.Request) -> web.Response:
            return web.Response(text=robots)
        app.router.add_get("/robots.txt", robots_txt)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           shutdown_timeout=1.0)
    await runner.setup()
    tcp = web.TCPSite(runner, host, 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    site.base = f"http://{host}:{port}"
    try:
        yield site
    finally:
        await runner.cleanup()


async def page(request: web.Request) -> web.Response:
    i = request.match_info.get("i", "0")
    return web.Response(text=f"<html><body>page {i}</body></html>", content_type="text/html")


def hanging(asked: asyncio.Event, text: str, *, once: bool = False) -> Handler:
    """A handler that sets `asked` and hangs for 30 s (with `once`, only the first time)."""
    async def handler(request: web.Request) -> web.Response:
        if not (once and asked.is_set()):
            asked.set()
            await asyncio.sleep(30)
        return web.Response(text=text)
    return handler
