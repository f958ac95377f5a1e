"""A page's fetch: with its session's cookies (and headers) when it has one
(``consumer.sessions``), through the proxy pool's pick for its host when the consumer has
proxies (its session's proxy first), and judged against what a blocked answer looks like
(``common.proxies.bans``: the crawl's rules and its route's) before anything takes it as data. A
session's request counts as one of its uses; a block also bans it (a pool session is
retired). The ``Set-Cookie`` values of a session's response are redacted in its record.

`PageFetch.fetch` returns the page's FetchResult or raises FetchError: ``blocked`` for a
block (its proxy, if any, banned for the host; the task is retried later, through the
fail script, so its next request takes a turn of its own and goes through another
proxy; dead ``blocked`` after its attempts), the last proxy's failure when each one
tried failed (another pick is tried at once, up to `MAX_PROXY_TRIES`: the host never saw
the request), or the fetch's own; or `NoProxy` when no proxy may reach the host now and
none was tried (the lease is handed back unfetched and the host blocked for the fleet
until one may: the pool's ``gone``). So a pool whose proxies all died spends a task's
attempts only at the pace of their quarantines' probes, and one that hosts banned spends
none.

A render request's fetch is the browser's (`via`, ``consumer.fetch_choice``): the same
proxy pick, session jar and block rules hold for it, and the browser fetcher sends the
page and every request of its scripts through that proxy, with that jar
(``common.browser.fetcher``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import reasons
from common.errors import FetchError
from common.http.cookies import redact_set_cookie
from common.http.fetcher import Fetcher
from common.http.results import FetchResult
from common.proxies import ProxySpec
from common.proxies.bans import Blocked, judge
from common.tasks.task import Task
from consumer.proxypool import ProxyPool
from consumer.sessions import Session, SessionBook

__all__ = ["MAX_PROXY_TRIES", "NoProxy", "PageFetch"]

#: Proxies tried for one request when each fails in turn, before its failure is its own.
MAX_PROXY_TRIES = 3


class NoProxy(Exception):
    """No proxy of the pool may reach the host for `wait_ms`."""

    def __init__(self, host: str, wait_ms: int) -> None:
        super().__init__(f"no proxy may reach {host} for {wait_ms} ms")
        self.wait_ms = wait_ms


def _blocked(why: str, result: FetchResult, via: ProxySpec | None) -> FetchError:
    where = f" through proxy {via.shown}" if via is not None and via.url else ""
    return FetchError(reasons.BLOCKED, f"a block, not the page ({why}){where}",
                      retryable=True, status=result.status)


class PageFetch:
    """Fetches a task's URL, with its session if it has one, through the pool's pick for
    its host if there is a pool."""

    def __init__(self, fetcher: Fetcher, pool: ProxyPool | None,
                 sessions: SessionBook | None = None) -> None:
        self.fetcher = fetcher
        self.pool = pool
        self.sessions = sessions

    async def fetch(self, url: str, host: str, *, crawl: Blocked, route: Blocked,
                    task: Task | None = None,
                    via: Callable[..., Awaitable[FetchResult]] | None = None,
                    **kw: Any) -> FetchResult:
        """Fetch `url` (of `host`; of `task`, whose session it goes with) as
        `Fetcher.fetch` does, or through `via` (called as `Fetcher.fetch`: the browser's
        for a render request); `crawl` and `route`: what a blocked answer looks like."""
        fetch = via or self.fetcher.fetch
        session = None
        if self.sessions is not None and task is not None:
            session = await self.sessions.for_task(task, host)
            if session is not None:
                own = session.record.headers
                kw["cookies"] = session.record.jar
                kw["headers"] = {**own, **(kw.get("headers") or {})} if own else \
                    kw.get("headers")
        if self.pool is not None:
            result = await self._pooled(self.pool, url, host, (crawl, route, session), kw,
                                        fetch=fetch)
        else:
            try:
                result = await fetch(url, **kw)
            except FetchError as exc:
                if session is not None and exc.status is not None:
                    self._used(session, False, None)
                raise
            why = judge(result, crawl, route, elsewhere=session is not None) \
                if crawl or route else None
            if session is not None:
                self._used(session, why is not None, None)
            if why is not None:
                raise _blocked(why, result, None)
        if session is not None:  # its cookies are credentials: never in a record
            result.raw_headers = redact_set_cookie(result.raw_headers)
        return result

    def _used(self, session: Session, banned: bool, via: ProxySpec | None) -> None:
        assert self.sessions is not None
        self.sessions.used(session, banned=banned,
                           proxy=via.id if via is not None and via.url else "")

    async def _pooled(self, pool: ProxyPool, url: str, host: str,
                      rules: tuple[Blocked, Blocked, Session | None],
                      kw: dict[str, Any], *,
                      fetch: Callable[..., Awaitable[FetchResult]]) -> FetchResult:
        crawl, route, session = rules
        failed: FetchError | None = None
        prefer = session.record.proxy if session is not None else ""
        for tried in range(1, MAX_PROXY_TRIES + 1):
            spec = pool.pick(host, prefer=prefer)
            if spec is None:
                if failed is not None:  # this request's proxies failed: its attempt did
                    raise failed
                raise NoProxy(host, pool.gone(host))
            started = time.monotonic()
            try:
                result = await fetch(url, proxy=spec.url or "", **kw)
            except FetchError as exc:
                if not exc.proxy_failed:
                    if session is not None and exc.status is not None:
                        self._used(session, False, spec)
                    raise
                pool.failed(spec)
                if tried == MAX_PROXY_TRIES:
                    raise
                failed, prefer = exc, ""
                continue
            why = judge(result, crawl, route, elsewhere=True)
            if session is not None:
                self._used(session, why is not None, spec)
            if why is not None:
                pool.banned(spec, host)
                raise _blocked(why, result, spec)
            pool.succeeded(spec, time.monotonic() - started)
            return result
        raise AssertionError("unreachable")  # pragma: no cover
