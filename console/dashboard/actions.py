"""The dashboard's actions (``POST /api/...``): the CLI's operations, through the same
queue and frontier APIs. The security middleware has already checked the token and the
origin.

==============================================  ========================================
``POST /api/crawls/{crawl}/dead/requeue``       dead letters back in line; body
                                                ``{"ids": [...]}``, ``{"reason": R}``
                                                or ``{"all": true}``
``POST /api/crawls/{crawl}/dead/purge``         delete dead letters for good (same body)
``POST /api/crawls/{crawl}/pause``              lease nothing until resumed; body ``{}``
``POST /api/crawls/{crawl}/resume``             lease again; body ``{}``
``POST /api/crawls/{crawl}/hosts/set``          a host's settings: ``{"host", "delay_s",
                                                "concurrency", "budget", "clear": [...]}``
                                                (host and at least one other)
``POST /api/crawls/{crawl}/hosts/block``        ``{"host", "seconds"}``; 0 unblocks
==============================================  ========================================

Each answers ``{"action", "crawl", ...}`` plus what the operation reports: dead-letter
operations how many tasks the body chose and how many moved (``selected``, ``changed``:
a task requeued meanwhile is not dead any more), pause and resume ``paused``, host
actions the ``host`` as keyed and its row afterwards.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web

from common.errors import BadRequestError
from common.frontier.hosts import Frontier
from common.hostmodel.hostkey import host_key
from common.queue import CrawlQueue
from common.urls.canonical import canonicalize
from console.dashboard.api import open_crawl
from console.views.deadletters import select_dead

log = logging.getLogger("dashboard")

#: The most task ids one request may name.
MAX_IDS = 1000
#: The longest host delay or block one request may set (30 days).
MAX_SECONDS = 30 * 86400
#: The largest host concurrency and budget one request may set.
MAX_CONCURRENCY = 100_000
MAX_BUDGET = 10**12
_CLEARABLE = ("delay", "concurrency", "budget")

Operation = Callable[[CrawlQueue, dict[str, Any]], Awaitable[dict[str, Any]]]


async def json_body(request: web.Request) -> dict[str, Any]:
    """An action's body: a JSON object, else BadRequestError (a 400)."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequestError("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    return body


def _dead_choice(body: dict[str, Any]) -> tuple[list[str], str | None, bool]:
    ids, reason, every = body.get("ids") or [], body.get("reason"), body.get("all", False)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequestError("ids must be a list of task ids")
    if len(ids) > MAX_IDS:
        raise BadRequestError(f"at most {MAX_IDS} ids per request, got {len(ids)}")
    if reason is not None and not isinstance(reason, str):
        raise BadRequestError("reason must be a string")
    if not isinstance(every, bool):
        raise BadRequestError("all must be true or false")
    return ids, reason, every


async def requeue_dead(queue: CrawlQueue, body: dict[str, Any]) -> dict[str, Any]:
    ids, reason, every = _dead_choice(body)
    chosen = await select_dead(queue, ids=ids, reason=reason, every=every)
    return {"selected": len(chosen), "changed": await queue.dead_requeue(chosen)}


async def purge_dead(queue: CrawlQueue, body: dict[str, Any]) -> dict[str, Any]:
    ids, reason, every = _dead_choice(body)
    chosen = await select_dead(queue, ids=ids, reason=reason, every=every)
    return {"selected": len(chosen), "changed": await queue.dead_purge(chosen)}


def _set_paused(paused: bool) -> Operation:
    async def operation(queue: CrawlQueue, body: dict[str, Any]) -> dict[str, Any]:
        await Frontier(queue).set_paused(paused)
        return {"paused": paused}
    return operation


def _host(body: dict[str, Any]) -> str:
    """The body's host as the frontier keys it: what the URL canonicalizer makes of
    ``http://<host>/``, or a 400 (a path, a scheme, a character no host name has)."""
    text = body.get("host")
    if not isinstance(text, str) or not 0 < len(text.strip()) <= 300:
        raise BadRequestError("host must be a host name, e.g. example.com or "
                              "example.com:8080")
    canonical = canonicalize(f"http://{text.strip()}/")
    if not isinstance(canonical, str) or canonical.count("/") != 3:
        raise BadRequestError(f"not a host: {text[:100]!r} (give a host name and an "
                              "optional port, e.g. example.com or example.com:8080)")
    return host_key(canonical)


def _number(body: dict[str, Any], name: str, hi: float, *, whole: bool) -> Any:
    """An optional number in 0..hi from the body (None when absent)."""
    value = body.get(name)
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or not 0 <= value <= hi:
        what = "a whole number" if whole else "a number of seconds"
        raise BadRequestError(f"{name} must be {what} in 0..{hi:g}, got {str(value)[:40]}")
    return value


async def _host_row(frontier: Frontier, host: str) -> dict[str, Any]:
    row = await frontier.host(host)
    return {"host": host, "row": None if row is None else asdict(row)}


async def set_host(queue: CrawlQueue, body: dict[str, Any]) -> dict[str, Any]:
    host = _host(body)
    clear = body.get("clear") or []
    if not isinstance(clear, list) or not all(c in _CLEARABLE for c in clear):
        raise BadRequestError(f"clear must be a list of {', '.join(_CLEARABLE)}")
    delay_s = _number(body, "delay_s", MAX_SECONDS, whole=False)
    concurrency = _number(body, "concurrency", MAX_CONCURRENCY, whole=True)
    budget = _number(body, "budget", MAX_BUDGET, whole=True)
    if delay_s is None and concurrency is None and budget is None and not clear:
        raise BadRequestError("nothing to set: give delay_s, concurrency, budget or clear")
    frontier = Frontier(queue)
    await frontier.set_host(host, delay_s=delay_s, concurrency=concurrency, budget=budget,
                            clear=tuple(clear))
    return await _host_row(frontier, host)


async def block_host(queue: CrawlQueue, body: dict[str, Any]) -> dict[str, Any]:
    host = _host(body)
    seconds = _number(body, "seconds", MAX_SECONDS, whole=False)
    if seconds is None:
        raise BadRequestError("seconds is required (0 unblocks)")
    frontier = Frontier(queue)
    await frontier.block_host(host, seconds)
    return await _host_row(frontier, host)


#: path under /api/crawls/{crawl}/ -> (action name, operation).
ACTIONS: dict[str, tuple[str, Operation]] = {
    "dead/requeue": ("requeue", requeue_dead),
    "dead/purge": ("purge", purge_dead),
    "pause": ("pause", _set_paused(True)),
    "resume": ("resume", _set_paused(False)),
    "hosts/set": ("set_host", set_host),
    "hosts/block": ("block_host", block_host),
}


def _handler(name: str, operation: Operation) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        queue = await open_crawl(request)
        result = await operation(queue, await json_body(request))
        log.info("dashboard_action", extra={
            "action": name, "crawl": queue.crawl,
            **{k: v for k, v in result.items() if k != "row"}})
        return web.json_response({"action": name, "crawl": queue.crawl, **result})
    return handle


def add_routes(app: web.Application) -> None:
    """Register every action on `app`."""
    for path, (name, operation) in ACTIONS.items():
        app.router.add_post(f"/api/crawls/{{crawl}}/{path}", _handler(name, operation))
