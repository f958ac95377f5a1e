"""A page's fetch through the proxy pool: the pool's pick for its host, another pick at
once when the proxy itself failed (the host never saw the request), and a block answer
turned into a ban and a ``blocked`` failure, never a page.

`PoolFetch.fetch` returns the page's FetchResult or raises FetchError (``blocked`` for a
block: the task is retried later, through the fail script, so its next request takes a
turn of its own and goes through another proxy; the last proxy's failure when each one
tried failed), or `NoProxy` when no proxy may reach the host now and none was tried (the
lease is handed back unfetched and the host blocked for the fleet until one may: the
pool's ``gone``). So a pool whose proxies all died spends a task's attempts only at the
pace of their quarantines' probes, and one that hosts banned spends none.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from common import reasons
from common.errors import FetchError
from common.http.fetcher import Fetcher, FetchResult
from common.proxies import ProxySpec
from consumer.proxypool import ProxyPool

__all__ = ["BLOCK_STATUSES", "MAX_PROXY_TRIES", "NoProxy", "PoolFetch"]

#: Proxies tried for one request when each fails in turn, before its failure is its own.
MAX_PROXY_TRIES = 3
#: The statuses that mean a host refused the proxy, not the page.
BLOCK_STATUSES = frozenset({403})


class NoProxy(Exception):
    """No proxy of the pool may reach the host for `wait_ms`."""

    def __init__(self, host: str, wait_ms: int) -> None:
        super().__init__(f"no proxy may reach {host} for {wait_ms} ms")
        self.wait_ms = wait_ms


class PoolFetch:
    """Fetches a task's URL through the pool's pick for its host."""

    def __init__(self, fetcher: Fetcher, pool: ProxyPool) -> None:
        self.fetcher = fetcher
        self.pool = pool

    async def fetch(self, url: str, host: str, *,
                    on_sent: Callable[[], Awaitable[None]] | None = None,
                    headers: Mapping[str, str] | None = None, **kw: Any) -> FetchResult:
        """Fetch `url` (of `host`) as `Fetcher.fetch` does, through the pool."""
        pool = self.pool
        failed: FetchError | None = None
        for tried in range(1, MAX_PROXY_TRIES + 1):
            spec = pool.pick(host)
            if spec is None:
                if failed is not None:  # this request's proxies failed: its attempt did
                    raise failed
                raise NoProxy(host, pool.gone(host))
            started = time.monotonic()
            try:
                result = await self.fetcher.fetch(url, proxy=spec.url or "", on_sent=on_sent,
                                                  headers=headers, **kw)
            except FetchError as exc:
                if not exc.proxy_failed:
                    raise
                pool.failed(spec)
                if tried == MAX_PROXY_TRIES:
                    raise
                failed = exc
                continue
            if self.blocked(spec, result):
                pool.banned(spec, host)
                raise FetchError(reasons.BLOCKED, f"HTTP {result.status} through proxy "
                                 f"{spec.shown}: the host refused it", retryable=True,
                                 status=result.status)
            pool.succeeded(spec, time.monotonic() - started)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def blocked(spec: ProxySpec, result: FetchResult) -> bool:
        """Whether `result` is the host refusing the proxy rather than the page."""
        return result.status in BLOCK_STATUSES
