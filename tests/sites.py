"""Local HTTP test sites on 127.0.0.1, in-process or as a subprocess.

One aiohttp application serves every test site:

``/p/<i>``
    a small HTML page. It sleeps ``delay_ms`` first (the site option, or ``?delay=<ms>``
    on the request), and links to ``/p/<i*links+1> .. /p/<i*links+links>`` that are
    below ``pages`` (``links=0``: no links), so a handler can crawl a tree of pages.
``/status/<code>``
    an empty answer with that status; ``?retry_after=<value>`` adds a Retry-After.
``/robots.txt``
    the ``robots`` option's text, or 404 when it is None.
``/_stats``
    JSON ``{"hits": {path: n}, "times": {path: [t, ...]}, "peak": n}``: requests per path
    (query left out), when each one arrived, in ``time.monotonic()`` seconds (one clock
    for every process on Linux, so a test can compare them with its own), and the most
    requests it answered at once. ``/_stats`` and ``/_reset`` themselves are not counted.

The site answers any host name: a client that uses it as its HTTP proxy (``--proxy``)
reaches it under as many names as it likes (``http://n1.site.test:<port>/p/1``), one
server behind many hosts.
``/_reset``
    forget every hit.

In-process (shares the test's event loop)::

    async with test_site(delay_ms=20) as site:
        url = site.url("/p/1")
        ...
        assert site.hits["/p/1"] == 1

As a subprocess (its own event loop, so a test that runs consumers as processes does
not slow the site down, and vice versa); the first line it prints is its port::

    python -m tests.sites --port 0 --delay-ms 20 --robots 'User-agent: *'

``start_site_process()`` runs that and returns a `SiteProcess` whose ``stats()`` reads
``/_stats``; use it as ``async with start_site_process(...) as site:``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

__all__ = [
    "Site",
    "SiteOptions",
    "SiteProcess",
    "SiteStats",
    "make_app",
    "start_site_process",
    "test_site",
]

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
_NOT_COUNTED = frozenset({"/_stats", "/_reset"})


@dataclass(frozen=True, slots=True)
class SiteOptions:
    """How a site behaves; every field is also a flag of ``python -m tests.sites``."""

    delay_ms: float = 0.0  # every /p/<i> sleeps this long (``?delay=`` overrides)
    robots: str | None = None  # robots.txt text; None answers 404
    pages: int = 1_000_000  # /p/<i> exists for i < pages (404 above)
    links: int = 0  # links per page, to i*links+1 .. i*links+links
    body_bytes: int = 0  # pad each page to at least this many bytes
    hosts: int = 1  # also listen on 127.0.0.2 .. 127.0.0.<hosts>, same port: many hosts

    def to_args(self) -> list[str]:
        args = ["--delay-ms", repr(self.delay_ms), "--pages", str(self.pages),
                "--links", str(self.links), "--body-bytes", str(self.body_bytes),
                "--hosts", str(self.hosts)]
        if self.robots is not None:
            args += ["--robots", self.robots]
        return args


@dataclass(slots=True)
class SiteStats:
    """What a site has seen: requests per path, their arrival times, and the most requests
    it answered at once (`peak`, whatever their host name: one server)."""

    hits: Counter[str] = field(default_factory=Counter)
    times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    active: int = 0
    peak: int = 0

    def record(self, path: str) -> None:
        self.hits[path] += 1
        self.times[path].append(time.monotonic())

    def clear(self) -> None:
        self.hits.clear()
        self.times.clear()
        self.peak = self.active

    def total(self, prefix: str = "/p/") -> int:
        """Requests to paths starting with `prefix`."""
        return sum(n for path, n in self.hits.items() if path.startswith(prefix))

    def to_json(self) -> dict[str, Any]:
        return {"hits": dict(self.hits), "times": {k: list(v) for k, v in self.times.items()},
                "peak": self.peak}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SiteStats:
        stats = cls()
        stats.hits.update({str(k): int(v) for k, v in doc["hits"].items()})
        for k, v in doc["times"].items():
            stats.times[str(k)] = [float(t) for t in v]
        stats.peak = int(doc.get("peak", 0))
        return stats


_PROBE = re.compile(r".*/(?=[a-z0-9]{0,15}[0-9])[a-z][a-z0-9]{15}(\.[A-Za-z0-9]{1,5}|/)?")
_OPTIONS: web.AppKey[SiteOptions] = web.AppKey("options", SiteOptions)
_STATS: web.AppKey[SiteStats] = web.AppKey("stats", SiteStats)


@web.middleware
async def _count(request: web.Request, handler: Any) -> web.StreamResponse:
    stats = request.app[_STATS]
    if request.path in _NOT_COUNTED:
        response: web.StreamResponse = await handler(request)
        return response
    if not _PROBE.fullmatch(request.path):  # a crawl's soft-404 probe (support.routes)
        stats.record(request.path)
    stats.active += 1
    stats.peak = max(stats.peak, stats.active)
    try:
        response = await handler(request)
    finally:
        stats.active -= 1
    return response


def _page_html(i: int, opts: SiteOptions) -> str:
    links = "".join(f'<a href="/p/{j}">page {j}</a>\n'
                    for j in range(i * opts.links + 1, i * opts.links + opts.links + 1)
                    if j < opts.pages)
    html = (f"<!doctype html>\n<html><head><title>page {i}</title></head>\n"
            f"<body><h1>page {i}</h1>\n{links}</body></html>\n")
    if len(html) < opts.body_bytes:
        html += "<!--" + "x" * (opts.body_bytes - len(html)) + "-->\n"
    return html


async def _page(request: web.Request) -> web.Response:
    opts = request.app[_OPTIONS]
    try:
        i = int(request.match_info["i"])
        delay_ms = float(request.query.get("delay", opts.delay_ms))
    except ValueError:
        raise web.HTTPBadRequest(text="bad page number or delay\n") from None
    if not 0 <= i < opts.pages:
        raise web.HTTPNotFound(text="no such page\n")
    if delay_ms > 0:
        await asyncio.sleep(delay_ms / 1000)
    return web.Response(text=_page_html(i, opts), content_type="text/html")


async def _status(request: web.Request) -> web.Response:
    code = int(request.match_info["code"])
    headers = {}
    if "retry_after" in request.query:
        headers["Retry-After"] = request.query["retry_after"]
    return web.Response(status=code, headers=headers)


async def _robots(request: web.Request) -> web.Response:
    robots = request.app[_OPTIONS].robots
    if robots is None:
        raise web.HTTPNotFound(text="no robots.txt\n")
    return web.Response(text=robots, content_type="text/plain")


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[_STATS].to_json())


async def _reset(request: web.Request) -> web.Response:
    request.app[_STATS].clear()
    return web.Response(text="ok\n")


def make_app(options: SiteOptions | None = None, stats: SiteStats | None = None
             ) -> web.Application:
    """The site as an aiohttp application (for callers that run it themselves)."""
    app = web.Application(middlewares=[_count])
    app[_OPTIONS] = options or SiteOptions()
    app[_STATS] = stats if stats is not None else SiteStats()
    app.router.add_get(r"/p/{i:\d+}", _page)
    app.router.add_get(r"/status/{code:\d{3}}", _status)
    app.router.add_get("/robots.txt", _robots)
    app.router.add_get("/_stats", _stats)
    app.router.add_get("/_reset", _reset)
    return app


async def _listen(app: web.Application, port: int, hosts: int = 1
                  ) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, HOST, port)
    await site.start()
    bound = int(runner.addresses[0][1])
    for i in range(2, hosts + 1):  # more loopback addresses, each a host to a crawler
        await web.TCPSite(runner, f"127.0.0.{i}", bound).start()
    return runner, bound


def host_url(port: int, path: str, host: int = 0) -> str:
    """A URL on loopback host number `host` (0 = 127.0.0.1) of a site."""
    return f"http://127.0.0.{host + 1}:{port}{path}"


@dataclass
class Site:
    """A site running in this process's event loop."""

    port: int
    options: SiteOptions
    stats_: SiteStats

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def url(self, path: str, host: int = 0) -> str:
        return host_url(self.port, path, host)

    @property
    def hits(self) -> Counter[str]:
        return self.stats_.hits

    @property
    def times(self) -> dict[str, list[float]]:
        return self.stats_.times

    async def stats(self) -> SiteStats:
        return self.stats_


@contextlib.asynccontextmanager
async def test_site(options: SiteOptions | None = None, **kwargs: Any) -> AsyncIterator[Site]:
    """Serve a site on a free port of 127.0.0.1 in this loop; kwargs are SiteOptions."""
    opts = options or SiteOptions(**kwargs)
    stats = SiteStats()
    runner, port = await _listen(make_app(opts, stats), 0, opts.hosts)
    try:
        yield Site(port, opts, stats)
    finally:
        await runner.cleanup()


test_site.__test__ = False  # type: ignore[attr-defined]  # not a test when imported


@dataclass
class SiteProcess:
    """A site served by ``python -m tests.sites`` in a child process."""

    port: int
    options: SiteOptions
    process: asyncio.subprocess.Process

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def url(self, path: str, host: int = 0) -> str:
        return host_url(self.port, path, host)

    async def stats(self) -> SiteStats:
        """What the site has seen so far (one request to its /_stats)."""
        async with aiohttp.ClientSession() as session, session.get(
                self.url("/_stats"), timeout=aiohttp.ClientTimeout(total=10)) as resp:
            resp.raise_for_status()
            return SiteStats.from_json(await resp.json())

    async def reset(self) -> None:
        async with aiohttp.ClientSession() as session, session.get(
                self.url("/_reset"), timeout=aiohttp.ClientTimeout(total=10)) as resp:
            resp.raise_for_status()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; idempotent."""
        proc = self.process
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def start_site_process(options: SiteOptions | None = None, **kwargs: Any
                             ) -> AsyncIterator[SiteProcess]:
    """Run a site in a child process (kwargs are SiteOptions); stopped on exit."""
    opts = options or SiteOptions(**kwargs)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.sites", "--port", "0", *opts.to_args(),
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    site = SiteProcess(0, opts, proc)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        if not line.strip().isdigit():
            raise RuntimeError(f"test site did not print its port (got {line!r})")
        site.port = int(line)
        yield site
    finally:
        await site.stop()


# -- python -m tests.sites -------------------------------------------------------------


def _parse(argv: list[str] | None) -> tuple[int, SiteOptions]:
    p = argparse.ArgumentParser(prog="python -m tests.sites", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0, help="0 = any free port (printed first)")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--robots", default=None, help="robots.txt text (\\n for newlines)")
    p.add_argument("--pages", type=int, default=1_000_000)
    p.add_argument("--links", type=int, default=0)
    p.add_argument("--body-bytes", type=int, default=0)
    p.add_argument("--hosts", type=int, default=1, help="listen on 127.0.0.1..127.0.0.<n>")
    a = p.parse_args(argv)
    robots = None if a.robots is None else a.robots.replace("\\n", "\n")
    return a.port, SiteOptions(delay_ms=a.delay_ms, robots=robots, pages=a.pages,
                               links=a.links, body_bytes=a.body_bytes, hosts=a.hosts)


async def _serve(port: int, opts: SiteOptions) -> None:
    runner, bound = await _listen(make_app(opts), port, opts.hosts)
    print(bound, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    port, opts = _parse(argv)
    asyncio.run(_serve(port, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
