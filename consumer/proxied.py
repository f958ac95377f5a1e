"""A page's fetch: through the proxy pool's pick for its host when the consumer has
proxies, and judged against what a blocked answer looks like (``common.bans``: the crawl's
rules and its route's) before anything takes it as data.

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
"""

from __future__ import annotations

import time
from typing import Any

from common import reasons
from common.bans import Blocked, judge
from common.errors import FetchError
from common.http.fetcher import Fetcher, FetchResult
from common.proxies import ProxySpec
from consumer.proxypool import ProxyPool

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
    """Fetches a task's URL, through the pool's pick for its host if there is a pool."""

    def __init__(self, fetcher: Fetcher, pool: ProxyPool | None) -> None:
        self.fetcher = fetcher
        self.pool = pool

    async def fetch(self, url: str, host: str, *, crawl: Blocked, route: Blocked,
                    **kw: Any) -> FetchResult:
        """Fetch `url` (of `host`) as `Fetcher.fetch` does; `crawl` and `route`: what a
        blocked answer looks like."""
        if self.pool is None:
            result = await self.fetcher.fetch(url, **kw)
            if crawl or route:
                why = judge(result, crawl, route, elsewhere=False)
                if why is not None:
                    raise _blocked(why, result, None)
            return result
        return await self._pooled(self.pool, url, host, (crawl, route), kw)

    async def _pooled(self, pool: ProxyPool, url: str, host: str,
                      rules: tuple[Blocked, Blocked], kw: dict[str, Any]) -> FetchResult:
        crawl, route = rules
        failed: FetchError | None = None
        for tried in range(1, MAX_PROXY_TRIES + 1):
            spec = pool.pick(host)
            if spec is None:
                if failed is not None:  # this request's proxies failed: its attempt did
                    raise failed
                raise NoProxy(host, pool.gone(host))
            started = time.monotonic()
            try:
                result = await self.fetcher.fetch(url, proxy=spec.url or "", **kw)
            except FetchError as exc:
                if not exc.proxy_failed:
                    raise
                pool.failed(spec)
                if tried == MAX_PROXY_TRIES:
                    raise
                failed = exc
                continue
            why = judge(result, crawl, route, elsewhere=True)
            if why is not None:
                pool.banned(spec, host)
                raise _blocked(why, result, spec)
            pool.succeeded(spec, time.monotonic() - started)
            return result
        raise AssertionError("unreachable")  # pragma: no cover
