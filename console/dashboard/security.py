"""The dashboard's security model, in one place.

- Read-only unless a token is configured; every action is a POST that must carry it
  (``Authorization: Bearer <token>``, compared in constant time), come from this
  dashboard's own origin (``Origin`` / ``Sec-Fetch-Site``) and be JSON (a cross-site
  form can send neither the header nor a JSON body).
- It will not listen on a non-loopback address without a token (`check_bind`).
- On loopback it answers only to loopback ``Host`` names, so a DNS-rebinding page
  can't read it through the operator's browser.
- Every response carries a strict Content-Security-Policy (scripts only from
  ``/static``, no inline script, no framing) and ``X-Content-Type-Options: nosniff``;
  the pages build the DOM with text nodes only, so crawled strings are always text.
- Errors are JSON ``{"error": "..."}`` with a 4xx (or 503 when Redis fails), never a
  traceback.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from redis.exceptions import RedisError

from common.errors import BadRequestError, ConfigError
from common.redis.errors import redis_error_message

log = logging.getLogger("dashboard")

MIN_TOKEN_LEN = 16
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or ``localhost``) only listens on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_bind(host: str, token: str | None) -> None:
    """Refuse a short token, and a non-loopback address without a token (ConfigError)."""
    if token is not None and len(token) < MIN_TOKEN_LEN:
        raise ConfigError(f"the dashboard token must be at least {MIN_TOKEN_LEN} characters "
                          "(e.g. openssl rand -hex 32)")
    if token is None and not is_loopback(host):
        raise ConfigError(f"refusing to listen on {host} without a token: anyone who reaches "
                          "it could read the crawl. Set --token / CRAWLQ_DASHBOARD_TOKEN "
                          "(e.g. openssl rand -hex 32), or use --http-host 127.0.0.1")


def error(status: int, message: str) -> web.Response:
    """A JSON error answer."""
    return web.json_response({"error": message}, status=status)


@dataclass(frozen=True, slots=True)
class Guard:
    """What the middleware enforces: the token (None: read-only) and the bind address."""

    token: str | None
    bind_host: str

    def host_allowed(self, request: web.Request) -> bool:
        if not is_loopback(self.bind_host):
            return True
        name = (request.url.host or "").strip("[]").lower()
        return name in _LOOPBACK_NAMES

    def refuse_action(self, request: web.Request) -> web.Response | None:
        """Why a POST is refused, or None when it may go ahead."""
        origin = request.headers.get("Origin")
        own = f"{request.scheme}://{request.host}"
        if origin is not None and origin != own:
            return error(403, f"cross-origin request refused (Origin {origin[:100]})")
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return error(403, f"cross-site request refused (Sec-Fetch-Site {site[:40]})")
        if self.token is None:
            return error(403, "this dashboard is read-only: start it with --token "
                              "(CRAWLQ_DASHBOARD_TOKEN) to allow actions")
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer ") or not given[7:].strip():
            return error(401, "this action needs the dashboard's token: enter it in the "
                              "token field (API: Authorization: Bearer <token>)")
        if not hmac.compare_digest(given[7:].strip().encode(), self.token.encode()):
            return error(403, "wrong token: the action was refused")
        if request.content_type != "application/json":
            return error(415, "actions take a JSON body (Content-Type: application/json)")
        return None


def _redis_message(exc: RedisError) -> str:
    return redis_error_message(exc, "the dashboard's --redis-url") or "Redis failed"


def middleware(guard: Guard) -> Middleware:
    """Host check, action checks, and every error turned into a JSON answer."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not guard.host_allowed(request):
            return error(421, "this dashboard answers only to localhost / 127.0.0.1")
        if request.method == "POST" and (refusal := guard.refuse_action(request)):
            return refusal
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error(exc.status, exc.text or exc.reason or "error")
        except BadRequestError as exc:
            return error(400, str(exc))
        except RedisError as exc:
            log.warning("dashboard_redis_error", extra={"error": str(exc)[:200]})
            return error(503, _redis_message(exc))
        except Exception:
            log.exception("dashboard_error", extra={"path": request.path})
            return error(500, "internal error; the dashboard's log has the details")

    return guarded


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the security headers on every answer, static files too."""
    response.headers.update(_HEADERS)
