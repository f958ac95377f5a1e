"""The dashboard's actions (``POST /api/...``): the CLI's operations, through the same
queue API. The security middleware has already checked the token and the origin.

==============================================  ========================================
``POST /api/crawls/{crawl}/dead/requeue``       dead letters back in line; body
                                                ``{"ids": [...]}``, ``{"reason": R}``
                                                or ``{"all": true}``
``POST /api/crawls/{crawl}/dead/purge``         delete dead letters for good (same body)
==============================================  ========================================

Each answers ``{"action", "crawl", "selected", "changed"}``: how many tasks the body
chose and how many the operation moved (a task requeued meanwhile is not dead any more).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from common.dashboard.api import open_crawl
from common.deadletters import select_dead
from common.errors import BadRequestError
from common.queue import CrawlQueue

log = logging.getLogger("dashboard")

#: The most task ids one request may name.
MAX_IDS = 1000

Operation = Callable[[CrawlQueue, dict[str, Any]], Awaitable[tuple[int, int]]]


async def _body(request: web.Request) -> dict[str, Any]:
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


async def requeue_dead(queue: CrawlQueue, body: dict[str, Any]) -> tuple[int, int]:
    ids, reason, every = _dead_choice(body)
    chosen = await select_dead(queue, ids=ids, reason=reason, every=every)
    return len(chosen), await queue.dead_requeue(chosen)


async def purge_dead(queue: CrawlQueue, body: dict[str, Any]) -> tuple[int, int]:
    ids, reason, every = _dead_choice(body)
    chosen = await select_dead(queue, ids=ids, reason=reason, every=every)
    return len(chosen), await queue.dead_purge(chosen)


#: path under /api/crawls/{crawl}/ -> (action name, operation).
ACTIONS: dict[str, tuple[str, Operation]] = {
    "dead/requeue": ("requeue", requeue_dead),
    "dead/purge": ("purge", purge_dead),
}


def _handler(name: str, operation: Operation) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        queue = await open_crawl(request)
        selected, changed = await operation(queue, await _body(request))
        log.info("dashboard_action", extra={"action": name, "crawl": queue.crawl,
                                            "selected": selected, "changed": changed})
        return web.json_response({"action": name, "crawl": queue.crawl,
                                  "selected": selected, "changed": changed})
    return handle


def add_routes(app: web.Application) -> None:
    """Register every action on `app`."""
    for path, (name, operation) in ACTIONS.items():
        app.router.add_post(f"/api/crawls/{{crawl}}/{path}", _handler(name, operation))
