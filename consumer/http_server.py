"""The consumer's side HTTP server: /healthz, /readyz and /metrics.

``/healthz`` answers from the event loop alone (a Redis outage is not fixed by
restarting workers); ``/readyz`` checks Redis and turns 503 while draining or while the
result sink refuses writes. Its default port taken (a second consumer on one machine),
it takes a free one and logs it; a port asked for and taken is one line and exit 2.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from common.errors import ConfigError
from common.observability.metrics import Metrics

log = logging.getLogger("consumer")

ReadyCheck = Callable[[], Awaitable[str | None]]
_READY: web.AppKey[ReadyCheck] = web.AppKey("ready", ReadyCheck)  # type: ignore[arg-type]
_METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    problem = await request.app[_READY]()
    if problem:
        return web.Response(status=503, text=f"not ready: {problem}\n")
    return web.Response(text="ready\n")


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[_METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


class SideServer:
    """Runs the side server in the consumer's own loop (AppRunner + TCPSite)."""

    def __init__(self, host: str, port: int, metrics: Metrics, ready: ReadyCheck) -> None:
        self.host = host
        self.port = port
        app = web.Application()
        app[_READY] = ready
        app[_METRICS] = metrics
        app.router.add_get("/healthz", _healthz)
        app.router.add_get("/readyz", _readyz)
        app.router.add_get("/metrics", _metrics)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self, *, any_port_if_taken: bool = False) -> int:
        """Start listening; returns the bound port (useful with port 0). A port in use
        is a ConfigError saying what to do, unless `any_port_if_taken` (the port is the
        default, not one asked for): then a free port is taken and logged."""
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not any_port_if_taken:
                await self._runner.cleanup()
                taken = "is in use (another consumer on this machine?)" \
                    if exc.errno == errno.EADDRINUSE else f"can't be used ({exc.strerror})"
                raise ConfigError(
                    f"--http-port {self.port} on {self.host} {taken}: give each consumer "
                    "its own --http-port (0: any free port, -1: no /metrics, /healthz, "
                    "/readyz)") from None
            await web.TCPSite(self._runner, self.host, 0).start()
            log.warning("http_port_taken", extra={
                "port": self.port, "took": int(self._runner.addresses[0][1]),
                "advice": "another process holds the default port: this consumer's "
                          "/metrics, /healthz and /readyz are on the port it took; "
                          "--http-port sets one"})
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()
