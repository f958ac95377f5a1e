"""The consumer's side HTTP server: /healthz, /readyz and /metrics.

``/healthz`` answers from the event loop alone (a Redis outage is not fixed by
restarting workers); ``/readyz`` checks Redis and turns 503 while draining or while the
result sink refuses writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from common.metrics import Metrics

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

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()
