"""What a consumer tells its operator once, not per page: a route's error, with the file
and line of the spider where it was raised, and a host the SSRF guard or robots.txt
refused.

A route that raises on some pages fails each of their tasks (``handler_error``); the
failure's message says where (``spider.py:42 in product: ValueError: ...``), so the dead
letter shows it (``crawlq dead ls``). The log gets one ERROR line per distinct error (its
type, file and line), with the first page it was raised on, and at most
`NEW_ERRORS_PER_WINDOW` such lines a `WINDOW_S`: past that, one line per window says how
many more were not shown. No traceback: the file, line and function are what a spider's
author needs, and the same error on a thousand pages is one line.

A start request the SSRF guard refuses (a local site without ``--allow-private``) or
robots.txt disallows, or whose robots.txt could not be had, is one WARNING per host and
reason, saying what to do: otherwise the crawl ends with nothing done and nothing said.
"""

from __future__ import annotations

import logging
import os
import sysconfig
import time
import traceback
from collections.abc import Callable, Collection

from common.errors import FetchError
from common.queue import Lease
from common.reasons import ROBOTS_DISALLOWED, ROBOTS_UNAVAILABLE, SSRF_BLOCKED
from common.spider import returned_by

__all__ = ["HostNotices", "RouteErrors", "where_raised"]

log = logging.getLogger("consumer")

WINDOW_S = 60.0
NEW_ERRORS_PER_WINDOW = 10
#: Distinct errors (and hosts per reason) remembered; past it, nothing more is said.
REMEMBERED = 10_000
_MESSAGE_CHARS = 300
#: crawlq's own packages, Python's library and the installed packages: a frame in them
#: is not where a route's author looks (nor is generated code: "<string>").
_NOT_USERS = (*(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + p + os.sep
                for p in ("common", "consumer")),
              *{os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "purelib",
                                                                     "platlib")}, "<")


def _shown(path: str) -> str:
    """`path` relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def where_raised(exc: BaseException, files: Collection[str] = ()) -> tuple[str, int, str]:
    """(file, line, function) where `exc` was raised in user code: for what a route
    returned (a bad Request found after it returned), the route's ``def``; else the
    innermost frame in one of `files` (a spider's), else the innermost outside crawlq's
    own packages and Python's and the installed ones'; ("", 0, "") when crawlq raised it
    itself."""
    origin = returned_by(exc)
    if origin is not None:  # the route's frame is gone: its def's line
        return _shown(origin[0]), origin[1], origin[2]
    frames = traceback.extract_tb(exc.__traceback__)
    chosen = next((f for f in reversed(frames) if f.filename in files), None) \
        or next((f for f in reversed(frames) if not f.filename.startswith(_NOT_USERS)), None)
    if chosen is None:
        return "", 0, ""
    return _shown(chosen.filename), chosen.lineno or 0, chosen.name


class RouteErrors:
    """Route errors: each failure's message with where it was raised, and one log line per
    distinct error, rate-limited. `files`: the files the spider's routes are defined in."""

    def __init__(self, files: Collection[str] = (), *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.files = frozenset(files)
        self._clock = clock
        self.seen: dict[tuple[str, str, int], int] = {}  # (type, file, line) -> times
        self._window = clock()
        self._new_in_window = 0
        self._not_shown = 0

    def failed(self, lease: Lease, exc: BaseException) -> str:
        """The failure message of `lease`'s route raising `exc` (logged if it is new)."""
        file, line, function = where_raised(exc, self.files)
        error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:_MESSAGE_CHARS]
        where = f"{file}:{line} in {function}" if file else ""
        key = (type(exc).__name__, file, line)
        times = self.seen.get(key)
        if times is not None:
            self.seen[key] = times + 1
        elif len(self.seen) < REMEMBERED:
            self.seen[key] = 1
            self._say(error, where, lease)
        return f"{where}: {error}" if where else error

    def _say(self, error: str, where: str, lease: Lease) -> None:
        now = self._clock()
        if now - self._window >= WINDOW_S:
            if self._not_shown:
                log.warning("route_errors_not_shown", extra={
                    "errors": self._not_shown, "window_s": WINDOW_S,
                    "advice": "crawlq dead ls --reason handler_error lists their tasks"})
            self._window, self._new_in_window, self._not_shown = now, 0, 0
        if self._new_in_window >= NEW_ERRORS_PER_WINDOW:
            self._not_shown += 1
            return
        self._new_in_window += 1
        log.error("route_error", extra={
            "error": error, "where": where or "?", "label": lease.task.label or "",
            "url": lease.task.url[:300],
            "advice": "the route raised: its task is retried, then dead (handler_error); "
                      "fix the spider"})


_ADVICE = {
    SSRF_BLOCKED: "the SSRF guard refuses loopback, private and link-local addresses: "
                  "--allow-private for a local site (or --allow-network CIDR)",
    ROBOTS_DISALLOWED: "robots.txt disallows it for the crawl's user_agent "
                       "(ignore_robots=true only for a site you own)",
    ROBOTS_UNAVAILABLE: "its robots.txt could not be fetched, so its pages wait and are "
                        "retried, then dead: is the site up at that address?",
}


class HostNotices:
    """One WARNING per host and reason for pages the crawl could not have at all."""

    def __init__(self) -> None:
        self._told: set[tuple[str, str]] = set()

    def refused(self, lease: Lease, reason: str, exc: FetchError | None = None) -> None:
        """`lease`'s page ended `reason`; said once for its host if it is one of the
        refusals an operator must hear of."""
        advice = _ADVICE.get(reason)
        key = (reason, lease.host)
        if advice is None or key in self._told or len(self._told) >= REMEMBERED:
            return
        self._told.add(key)
        log.warning(reason, extra={"host": lease.host, "url": lease.task.url[:300],
                                   **({"error": exc.message[:300]} if exc else {}),
                                   "advice": advice})
