"""The crawl's policy in the dashboard (``common.policy``): read it, and change it like
``crawlq crawl set`` does.

===========================================  ==========================================
``GET /api/crawls/{crawl}/policy?log=20``    ``crawlq crawl show --json``'s document
                                             (``crawl, version, values, text, log``)
                                             plus ``options``: every option of
                                             `POLICY_OPTIONS`, in order, with its flag,
                                             help and default as text; ``log`` the
                                             newest changes (1..LOG_LEN)
``POST /api/crawls/{crawl}/policy/set``      ``{"values": {key: text, ...}, "version":
                                             <the version the form was loaded at>}``
===========================================  ==========================================

A write is checked whole before anything is written (every value parsed here, then
`set_policy` checks them against the policy they land on, ``retry_cap >= retry_base``
included): a bad one is a 400 with the policy module's message and changes nothing. It
is logged ``by: dashboard``. Optimistic concurrency: when the policy's version is not
the one the form was loaded at, the write is refused with a 409 that carries the
current ``version``, so two operators (or an operator and a ``crawlq crawl set``) never
silently overwrite each other: ``policy_set.lua`` compares the version in the call that
writes.

The crawl need not exist yet (``crawlq crawl create`` may come first); a crawl without
a policy is a 404 that says how to create one.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from common.errors import BadRequestError, ConfigError
from common.names import validate_crawl_name
from common.policy import (
    LOG_LEN,
    POLICY_OPTIONS,
    NoPolicyError,
    PolicyError,
    PolicyMovedError,
    legacy_conf,
    parse_value,
    read_policy,
    read_values,
    set_policy,
)
from console.dashboard.actions import json_body
from console.dashboard.api import CLIENT, int_param

log = logging.getLogger("dashboard")

#: Who the policy log says made a change from the dashboard.
BY = "dashboard"
#: Change-log entries a GET returns unless ``?log=`` says otherwise.
DEFAULT_LOG = 20


def options_json() -> list[dict[str, str]]:
    """Every policy option, in declaration order: what the dashboard's form is built from."""
    return [{"name": o.name, "flag": o.flag, "help": o.help, "default": o.show(o.default)}
            for o in POLICY_OPTIONS]


def _crawl(request: web.Request) -> str:
    name = request.match_info["crawl"]
    try:
        return validate_crawl_name(name)
    except ConfigError:
        raise web.HTTPNotFound(text=f"no crawl named {name[:100]!r} in this Redis") from None


async def _no_policy(request: web.Request, crawl: str) -> web.HTTPNotFound:
    """The 404 for a crawl without a policy (an earlier crawlq's crawl says so)."""
    create = f"`crawlq crawl create --crawl {crawl}`"
    if await legacy_conf(request.app[CLIENT], crawl) is not None:
        return web.HTTPNotFound(text=f"crawl {crawl} has no policy object yet (an earlier "
                                     f"crawlq made it): {create} adopts its partitions' "
                                     "values (so does its next consumer or producer)")
    return web.HTTPNotFound(text=f"crawl {crawl} has no policy: create it with {create}")


async def get_policy(request: web.Request) -> web.Response:
    crawl = _crawl(request)
    limit = int_param(request, "log", DEFAULT_LOG, 1, LOG_LEN)
    stored = await read_policy(request.app[CLIENT], crawl, log_limit=limit)
    if stored is None:
        raise await _no_policy(request, crawl)
    return web.json_response({**stored.to_json(crawl), "options": options_json()})


def _change(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The body's values, every one parsed (PolicyError: a 400), and its version."""
    values, version = body.get("values"), body.get("version")
    if not isinstance(values, dict) or not values:
        raise BadRequestError('values must be an object of at least one option: its text, '
                              'e.g. {"per_host_delay": "2s"}')
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRequestError("version must be the policy version the form was loaded at "
                              "(GET .../policy answers it)")
    try:
        return {str(k): parse_value(str(k), v) for k, v in values.items()}, version
    except PolicyError as exc:
        raise BadRequestError(str(exc)) from None


async def set_policy_action(request: web.Request) -> web.Response:
    crawl = _crawl(request)
    values, loaded = _change(await json_body(request))
    client = request.app[CLIENT]
    if await read_values(client, crawl) is None:  # an earlier crawlq's crawl: not adopted here
        raise await _no_policy(request, crawl)
    try:
        stored = await set_policy(client, crawl, values, by=BY, expected_version=loaded)
    except PolicyMovedError as exc:
        return web.json_response({
            "error": f"the policy changed since this form was loaded (version {loaded}, "
                     f"now {exc.version}): nothing was written; reload and try again",
            "version": exc.version}, status=409)
    except NoPolicyError as exc:
        raise web.HTTPNotFound(text=str(exc)) from None
    except PolicyError as exc:  # retry_cap against the retry_base it lands on
        raise BadRequestError(str(exc)) from None
    changed = stored.version != loaded
    log.info("dashboard_action", extra={"action": "set_policy", "crawl": crawl,
                                        "version": stored.version, "changed": changed,
                                        "keys": ",".join(values)})
    return web.json_response({"action": "set_policy", "crawl": crawl, "changed": changed,
                              "version": stored.version, "text": stored.policy.texts()})


def add_routes(app: web.Application) -> None:
    """Register the policy view and its action on `app`."""
    app.router.add_get("/api/crawls/{crawl}/policy", get_policy)
    app.router.add_post("/api/crawls/{crawl}/policy/set", set_policy_action)
