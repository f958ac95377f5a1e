"""The read side of the dashboard's JSON API (``GET /api/...``); the pages are one client.

Each view is a few pipelined reads through the ``common`` modules that own the data,
whatever the crawl's size: no KEYS, no scan of all tasks.

=======================================  ===============================================
``GET /api/session``                     ``{"actions": bool}``: whether a token is set
``GET /api/crawls``                      every crawl's summary (``crawls``, ``total``)
``GET /api/crawls/{crawl}``              one crawl: settings, age, states, counters,
                                         outcomes, links not followed by fate,
                                         rates, dead reasons, workers
``GET /api/crawls/{crawl}/history``      per-second done / failed / enqueued over the
                                         last hour; ``?since=<unix s>``: newer points only
``GET /api/crawls/{crawl}/workers``      live workers (id, host, pid, heartbeat age,
                                         stale, in flight, done, failed, pages/s)
``GET /api/crawls/{crawl}/hosts``        a page of the frontier's hosts, sorted by a
                                         column: ``?sort=queued&desc=1&page=0&size=50``;
                                         queued, errors, next_allowed, delay or
                                         blocked_until (in flight, done and last request
                                         are in the rows, not sortable); pages reach the
                                         first MAX_HOSTS_READ / partitions hosts of a
                                         sort, from either end
``GET /api/crawls/{crawl}/groups``       the politeness groups (politeness_key domain/ip),
                                         most in flight first: ``?size=50``
``GET /api/crawls/{crawl}/dead``         a page of dead letters, newest first:
                                         ``?page=0&size=50&reason=R``
``GET /api/crawls/{crawl}/proxies``      the proxy pool: each proxy's health (URLs
                                         redacted), the hosts that ban some or moved
                                         up a tier: ``?size=50``
``GET /api/crawls/{crawl}/sessions``     the sessions, newest first (no cookie value):
                                         ``?size=50``
=======================================  ===============================================
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from aiohttp import web

from common.errors import BadRequestError, ConfigError
from common.fleet import history
from common.fleet.workers import read_workers
from common.frontier.groups import groups
from common.frontier.hosts import SORT_COLUMNS, Frontier
from common.frontier.proxy_pool import MAX_HOSTS as MAX_PROXY_HOSTS
from common.frontier.proxy_pool import read_summary
from common.proxies.sessions import list_sessions
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from console.views.crawls import MAX_CRAWLS, summaries, summary
from console.views.deadletters import MAX_PAGE_SIZE, DeadPage, dead_page
from console.views.hosts import sort_refusal

CLIENT: web.AppKey[RedisClient] = web.AppKey("client", object)  # type: ignore[arg-type]
TOKEN_SET: web.AppKey[bool] = web.AppKey("token_set", bool)
#: The chart's span and series.
CHART_S = 3600.0
CHART_SERIES = ("done", "failed", "enqueued")
#: The most hosts one page may hold.
MAX_HOSTS_PAGE = 200
#: The most sort-ZSET entries one hosts page may read over all partitions: a page reads
#: the first (page + 1) x size hosts of every partition's ZSET and merges them, so deep
#: pages cost Redis in proportion to their depth (~1 us an entry).
MAX_HOSTS_READ = 1000
_BOOLS = {"1": True, "true": True, "0": False, "false": False}


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within lo..hi, else BadRequestError (a 400)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequestError(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise BadRequestError(f"{name} must be {lo}..{hi}, got {value}")
    return value


async def open_crawl(request: web.Request) -> CrawlQueue:
    """The crawl named in the path, or a 404 that says so."""
    name = request.match_info["crawl"]
    try:
        return await CrawlQueue.existing(request.app[CLIENT], name)
    except (ConfigError, ValueError):
        raise web.HTTPNotFound(text=f"no crawl named {name[:100]!r} in this Redis") from None


async def get_session(request: web.Request) -> web.Response:
    return web.json_response({"actions": request.app[TOKEN_SET]})


async def get_crawls(request: web.Request) -> web.Response:
    found, total = await summaries(request.app[CLIENT], MAX_CRAWLS)
    return web.json_response({
        "crawls": [{"crawl": c, "broken": True} if isinstance(c, str) else c.to_json()
                   for c in found],
        "total": total})


async def get_crawl(request: web.Request) -> web.Response:
    return web.json_response((await summary(await open_crawl(request))).to_json())


async def get_history(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    since = request.query.get("since") or ""
    try:
        back_to = float(since) if since else math.nan
    except ValueError:
        raise BadRequestError(f"since must be unix seconds, got {since[:40]!r}") from None
    if not math.isfinite(back_to):
        secs, _ = await queue.client.time()
        back_to = int(secs) - CHART_S
    snaps = await history.read(queue.client, queue.crawl, back_to=back_to)
    points = [p for p in history.series(snaps, CHART_SERIES) if p["t"] > back_to]
    return web.json_response({"series": list(CHART_SERIES), "span_s": CHART_S,
                              "points": points})


async def get_workers(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    found = await read_workers(queue.client, queue.crawl)
    return web.json_response({"now_ms": found.now_ms, "total": found.total,
                              "workers": [w.to_json() for w in found.workers]})


def _dead_json(page: DeadPage) -> dict[str, Any]:
    return {
        "items": [{"id": d.id, "url": d.url, "reason": d.reason, "error": d.message,
                   "attempts": d.attempts, "died_at_ms": d.died_at_ms,
                   "partition": d.partition} for d in page.items],
        "page": page.offset // page.size, "size": page.size, "total": page.total,
        "reason": page.reason, "searched": page.searched, "complete": page.complete,
    }


async def get_dead(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    size = int_param(request, "size", 50, 1, MAX_PAGE_SIZE)
    page = int_param(request, "page", 0, 0, 10**9)
    reason = request.query.get("reason") or None
    found = await dead_page(queue, reason=reason, offset=page * size, size=size)
    return web.json_response(_dead_json(found))


async def get_hosts(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    sort = request.query.get("sort") or "queued"
    if sort not in SORT_COLUMNS:
        raise BadRequestError(sort_refusal(sort))
    desc = _BOOLS.get((request.query.get("desc") or "1").lower())
    if desc is None:
        raise BadRequestError("desc must be 1 or 0 (true or false)")
    size = int_param(request, "size", 50, 1, MAX_HOSTS_PAGE)
    last_page = max(0, MAX_HOSTS_READ // (size * queue.settings.partitions) - 1)
    page = int_param(request, "page", 0, 0, 10**9)
    if page > last_page:
        raise BadRequestError(
            f"page {page} is deeper than the dashboard reads ({last_page} at size {size}): "
            "sort the other way (desc=0) for the other end, or use crawlq hosts --offset")
    found = await Frontier(queue).hosts(sort=sort, desc=desc, offset=page * size, limit=size)
    return web.json_response({"total": found.total, "now_ms": found.now_ms, "page": page,
                              "size": size, "last_page": last_page, "sort": sort,
                              "desc": desc, "hosts": [asdict(r) for r in found.rows]})


async def get_groups(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    size = int_param(request, "size", 50, 1, MAX_HOSTS_PAGE)
    found = await groups(queue, limit=size)
    return web.json_response({"politeness_key": found.key, "size": size,
                              "groups": [asdict(r) for r in found.rows]})


async def get_proxies(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    size = int_param(request, "size", 50, 1, MAX_PROXY_HOSTS)
    found = await read_summary(queue.client, queue.crawl, size)
    return web.json_response(found.to_json())


async def get_sessions(request: web.Request) -> web.Response:
    queue = await open_crawl(request)
    size = int_param(request, "size", 50, 1, MAX_PROXY_HOSTS)
    rows, total = await list_sessions(queue.client, queue.crawl, size)
    return web.json_response({"sessions": [asdict(r) for r in rows], "total": total})


def add_routes(app: web.Application) -> None:
    """Register the read API on `app`."""
    app.router.add_get("/api/session", get_session)
    app.router.add_get("/api/crawls", get_crawls)
    app.router.add_get("/api/crawls/{crawl}", get_crawl)
    app.router.add_get("/api/crawls/{crawl}/history", get_history)
    app.router.add_get("/api/crawls/{crawl}/workers", get_workers)
    app.router.add_get("/api/crawls/{crawl}/hosts", get_hosts)
    app.router.add_get("/api/crawls/{crawl}/groups", get_groups)
    app.router.add_get("/api/crawls/{crawl}/dead", get_dead)
    app.router.add_get("/api/crawls/{crawl}/proxies", get_proxies)
    app.router.add_get("/api/crawls/{crawl}/sessions", get_sessions)
