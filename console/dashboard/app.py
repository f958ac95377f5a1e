"""The dashboard's aiohttp application: pages, static files, the API, the actions and
the crawl's policy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from common.redis.connection import RedisClient
from console.dashboard import actions, api, policy
from console.dashboard.security import Guard, add_headers, middleware

STATIC = Path(__file__).parent / "static"
#: Action bodies are small JSON objects (at most MAX_IDS ids).
MAX_BODY_BYTES = 64 * 1024


def _page(name: str) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / name)
    return serve


def make_app(client: RedisClient, *, token: str | None, bind_host: str) -> web.Application:
    """The dashboard over `client`; read-only when `token` is None."""
    app = web.Application(middlewares=[middleware(Guard(token, bind_host))],
                          client_max_size=MAX_BODY_BYTES)
    app[api.CLIENT] = client
    app[api.TOKEN_SET] = token is not None
    app.on_response_prepare.append(add_headers)
    app.router.add_get("/", _page("index.html"))
    app.router.add_get("/crawls/{crawl}", _page("crawl.html"))
    app.router.add_static("/static", STATIC)
    api.add_routes(app)
    actions.add_routes(app)
    policy.add_routes(app)
    return app
