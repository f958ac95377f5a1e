"""The browser fetcher: a page rendered in Chromium, every request it makes fetched by
crawlq's own guarded HTTP client.

`BrowserFetcher.fetch` takes what `Fetcher.fetch` takes (and a `Render`) and returns a
`RenderResult`, or raises FetchError, as the HTTP fetcher does:

1. The page's document is fetched by the HTTP fetcher, as any task is (its headers,
   credentials, validators, method and body, redirects followed hop by hop through the
   SSRF guard, the body cap, `on_sent` for its host's turn). A response that is not a
   2xx HTML page (a 404, a 304, JSON, a filtered type) is returned as it is: nothing
   to render.
2. A page of the pool (``common.browser.pool``) opens the document's final URL; the
   document is answered from what step 1 fetched. Every other request the page makes
   (scripts, stylesheets, XHR and fetch calls, iframes, a script's navigation) is
   intercepted (Playwright's route on the whole context; service workers blocked, so
   none escapes it) and fetched by the HTTP fetcher: the SSRF guard judges every
   address it connects to, on every redirect hop (Chromium never sees a redirect: it
   would follow it itself), the body cap holds for each response, and the crawl's
   credential headers go only to the document's own origin. Images, media and fonts
   are refused unless the route asks (`Render.images`), and so are WebSockets,
   EventSource streams, beacons and a type Chromium doesn't name; a refusal is
   counted (`RenderResult.refused`), never connected. Downloads are refused (the
   context accepts none). Chromium's own connections go to a sinkhole
   (``common.browser.chromium``).
3. Requests to the page's own host go one at a time (a render holds one of its host's
   slots: at most one of its requests is in flight there), each after `on_visit`
   (the consumer's turn-keeping: a host with a delay gives a late one a turn of its
   own). Every request goes through the proxy the document went through (`proxy`: the
   consumer's proxy pool's pick for the task's host) and with its session's cookie jar
   (`cookies`: each request sends the cookies the jar holds for its URL, as a browser
   would, and keeps what it sets; a cookie a script sets in ``document.cookie`` is the
   page's alone). A call of the page's scripts to its own host that fails as a fetch is retried
   (a timeout, a refused connection, a 5xx, 408 or 429) fails the render with that
   reason: a page whose data did not arrive is not whole, and its route would find no
   items in it and end it done.
4. The page settles (no request in flight for `Render.settle_ms`), the route's actions
   run (wait for a selector, scroll, click "load more"), and its DOM is taken:
   serialized, UTF-8, at most the body cap (else ``body_too_large``).

The whole render, from the document's fetch to the DOM, has the fetch's total timeout
(``timeout``). A browser that dies mid-page fails the task ``browser_crashed``
(retried: its attempt is counted, so a page that kills every browser ends dead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common import reasons
from common.browser.chromium import BrowserSettings
from common.browser.pool import PagePool, PageSlot
from common.browser.render import DEFAULT_RENDER, Fetched, Render, RenderResult
from common.errors import FetchError
from common.hostmodel.hostkey import host_key
from common.http.cookies import CookieJar
from common.http.fetcher import Fetcher
from common.http.results import FetchResult

if TYPE_CHECKING:
    from playwright.async_api import Request, Route

__all__ = ["BrowserFetcher", "BrowserSettings"]

log = logging.getLogger(__name__)

#: Resource types fetched whatever the route asks; images, media and fonts only when it
#: asks (`Render.images`); anything else (websocket, eventsource, ping, manifest, ...)
#: is refused.
_LOADED = frozenset({"document", "script", "stylesheet", "xhr", "fetch"})
_IMAGES = frozenset({"image", "media", "font"})
#: The JSON responses a page fetched are kept from these requests (its scripts' calls).
_CALLS = frozenset({"xhr", "fetch"})
#: The most requests one render makes: the rest are refused.
MAX_SUBREQUESTS = 300
#: Request headers Chromium sets that the HTTP client sets itself (or must not pass on).
_NOT_FORWARDED = frozenset({"host", "connection", "content-length", "transfer-encoding",
                            "keep-alive", "upgrade", "te", "accept-encoding", "user-agent",
                            "cookie", "proxy-authorization", "proxy-connection"})
#: Response headers not handed to Chromium: the body it gets is whole and decompressed.
_NOT_RETURNED = frozenset({b"content-length", b"content-encoding", b"transfer-encoding",
                           b"connection", b"keep-alive"})
_HTML = "text/html; charset=utf-8"
# Run in the page's own world (Playwright's wait_for_selector and content() inject their
# utility script into each new document first: ~30 ms a page, measured): a page that
# tampers with the DOM API spoils only its own render.
_WAIT_FOR = """([selector, ms]) => new Promise(done => {
  if (document.querySelector(selector)) return done(true);
  const seen = new MutationObserver(() => {
    if (document.querySelector(selector)) { seen.disconnect(); done(true); } });
  seen.observe(document, {childList: true, subtree: true, attributes: true});
  setTimeout(() => { seen.disconnect(); done(!!document.querySelector(selector)); }, ms);
})"""
_BUSY = "() => window.__crawlqBusy || 0"
_CONTENT = """() => {
  const d = document.doctype;
  return (d ? new XMLSerializer().serializeToString(d) : "") +
    (document.documentElement ? document.documentElement.outerHTML : "");
}"""


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme.lower()}://{rest.split('/', 1)[0].split('?', 1)[0].lower()}"


@dataclass(slots=True)
class _Job:
    """One render under way on a page slot: what its route handler needs."""

    doc: FetchResult
    render: Render
    deadline: float  # monotonic
    host: str
    origin: str
    on_visit: Callable[[], Awaitable[None]] | None
    proxy: str | None = None
    cookies: CookieJar | None = None
    served: bool = False
    inflight: int = 0
    quiet_since: float = field(default_factory=time.monotonic)
    subrequests: int = 0
    refused: int = 0
    fetched: list[Fetched] = field(default_factory=list)
    json_bytes: int = 0
    dropped_json: int = 0
    last_host_request: float = 0.0
    host_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: a call of the page's scripts to its own host that failed as a fetch is retried
    call_failed: FetchError | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class BrowserFetcher:
    """Renders pages on a pool of Chromium pages; the HTTP fetcher `http` makes every
    request (see the module's docstring). Start with `start`, end with `close`."""

    def __init__(self, http: Fetcher, settings: BrowserSettings, *,
                 total_timeout: float, max_body_bytes: int,
                 user_agent: Callable[[], str] | None = None) -> None:
        self.http = http
        self.settings = settings
        self._total = total_timeout
        self._cap = max_body_bytes
        self.pool = PagePool(settings, self._handle, user_agent=user_agent)
        #: Requests refused by the SSRF guard, in all renders (the page's own included).
        self.ssrf_refused = 0

    async def start(self) -> None:
        """Start Playwright and the first browser (ConfigError when it can't start)."""
        await self.pool.start()

    async def close(self) -> None:
        """Close every page, context and browser, and Playwright."""
        await self.pool.close()

    def page_capacity(self) -> int:
        """How many renders may start now (the pool's pages, less under memory pressure)."""
        return self.pool.capacity

    def fetch(self, url: str, *, headers: Mapping[str, str] | None = None,
              crawl_credentials: bool = False, accept: tuple[str, ...] | None = None,
              on_sent: Callable[[], Awaitable[None]] | None = None,
              conditional: Mapping[str, str] | None = None, method: str = "GET",
              body: bytes | None = None, proxy: str | None = None,
              cookies: CookieJar | None = None, render: Render | None = None,
              on_visit: Callable[[], Awaitable[None]] | None = None,
              ) -> Coroutine[Any, Any, FetchResult]:
        """Fetch `url` as `Fetcher.fetch` does, then render it as `render` says (see the
        module's docstring); `on_visit` is awaited before each later request to the
        page's own host; `proxy` and `cookies` hold for every request of the page."""
        return self._fetch(url, headers=headers, crawl_credentials=crawl_credentials,
                           accept=accept, on_sent=on_sent, conditional=conditional,
                           method=method, body=body, render=render or DEFAULT_RENDER,
                           on_visit=on_visit, proxy=proxy, cookies=cookies)

    async def _fetch(self, url: str, *, headers: Mapping[str, str] | None,
                     crawl_credentials: bool, accept: tuple[str, ...] | None,
                     on_sent: Callable[[], Awaitable[None]] | None,
                     conditional: Mapping[str, str] | None, method: str,
                     body: bytes | None, render: Render,
                     on_visit: Callable[[], Awaitable[None]] | None,
                     proxy: str | None, cookies: CookieJar | None) -> FetchResult:
        started = time.monotonic()
        deadline = started + self._total
        try:
            doc = await self.http.fetch(url, headers=headers,
                                        crawl_credentials=crawl_credentials, accept=accept,
                                        on_sent=on_sent, conditional=conditional,
                                        method=method, body=body, proxy=proxy,
                                        cookies=cookies)
        except FetchError as exc:
            if exc.reason == reasons.SSRF_BLOCKED:
                self.ssrf_refused += 1
            raise
        if doc.filtered or not 200 <= doc.status < 300 or \
                "html" not in doc.headers.get("content-type", "text/html").lower():
            return doc
        job = _Job(doc, render, deadline, host_key(doc.final_url), _origin(doc.final_url),
                   on_visit, proxy=proxy, cookies=cookies, last_host_request=started)
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                slot = await self.pool.acquire()
                try:
                    dom, final_url = await self._render(slot, job)
                finally:
                    await self._end(slot, job)
        except TimeoutError:
            raise FetchError(reasons.TIMEOUT, f"no rendered page within {self._total:g}s",
                             retryable=True) from None
        if len(dom) > self._cap:
            raise FetchError(reasons.BODY_TOO_LARGE,
                             f"rendered page is {len(dom)} bytes, over {self._cap}",
                             retryable=False)
        return RenderResult(
            url=doc.url, final_url=final_url, status=doc.status,
            headers={**doc.headers, "content-type": _HTML},
            raw_headers=((b"Content-Type", _HTML.encode()),), body=dom,
            elapsed=time.monotonic() - started, redirects=doc.redirects,
            http_version=doc.http_version, fetched=tuple(job.fetched),
            subrequests=job.subrequests, refused=job.refused, dropped_json=job.dropped_json,
            last_host_request=job.last_host_request)

    async def _render(self, slot: PageSlot, job: _Job) -> tuple[bytes, str]:
        """Open the page, settle, run the route's actions; the DOM and where it ended."""
        page = slot.page
        slot.job = job
        try:
            await page.goto(job.doc.final_url, wait_until="load", timeout=self._ms_left(job))
            job.quiet_since = max(job.quiet_since, time.monotonic())
            await self._settled(job, page)
            spec = job.render
            if spec.wait_for and not await page.evaluate(
                    _WAIT_FOR, [spec.wait_for, self._ms_left(job)]):
                raise FetchError(reasons.TIMEOUT, f"no {spec.wait_for!r} in the page within "
                                 f"{self._total:g}s", retryable=True)
            for _ in range(spec.scroll):
                await page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
                await self._settled(job, page)
            if spec.click:
                for _ in range(spec.clicks):
                    button = page.locator(spec.click).first
                    if not await button.is_visible():
                        break
                    await button.click(timeout=self._ms_left(job))
                    await self._settled(job, page)
            if job.call_failed is not None:  # its data call failed: the page is not whole
                failed = job.call_failed
                raise FetchError(failed.reason, f"a call of the page to its host failed: "
                                 f"{failed.message}", retryable=True,
                                 retry_after=failed.retry_after, status=failed.status)
            html = await page.evaluate(_CONTENT)
            return html.encode("utf-8", errors="replace"), page.url
        except FetchError:
            raise
        except Exception as exc:  # Playwright's: a crash, a closed browser, a timeout
            raise self.pool.error_of(exc, slot) from None

    async def _end(self, slot: PageSlot, job: _Job) -> None:
        slot.job = None
        for task in job.tasks:
            task.cancel()
        await self.pool.release(slot)

    def _ms_left(self, job: _Job) -> float:
        return max(1.0, (job.deadline - time.monotonic()) * 1000)

    async def _settled(self, job: _Job, page: Any) -> None:
        """Wait until none of the page's requests has been in flight for settle_ms, and
        none of its scripts' calls is under way by the page's own count (a call whose
        route event has not reached this process yet)."""
        quiet = job.render.settle_ms / 1000
        while True:
            if job.inflight == 0:
                left = job.quiet_since + quiet - time.monotonic()
                if left <= 0:
                    if not await page.evaluate(_BUSY):
                        return
                    job.quiet_since = time.monotonic()
                    left = quiet
            else:
                left = quiet
            await asyncio.sleep(min(left, 0.02))

    # -- every request a page makes ----------------------------------------------------

    def _handle(self, slot: PageSlot, route: Route) -> None:
        """The route handler of a page slot's context (sync: the work is a task the
        render's end cancels)."""
        job = slot.job
        if job is None:  # after its render (a timer's request): nobody wants it
            self.pool.later(_abort(route, "blockedbyclient"))
            return
        # Counted in flight now, as the route event arrives (before the load event that
        # followed it): the page is not settled while one of its requests is on its way.
        job.inflight += 1
        task = asyncio.ensure_future(self._served(job, route))
        job.tasks.add(task)
        task.add_done_callback(job.tasks.discard)

    async def _served(self, job: _Job, route: Route) -> None:
        try:
            await self._serve(job, route)
        finally:
            job.inflight -= 1
            job.quiet_since = time.monotonic()

    async def _serve(self, job: _Job, route: Route) -> None:
        request = route.request
        url = request.url
        if not job.served and request.is_navigation_request() and url == job.doc.final_url:
            job.served = True
            await _fulfill(route, job.doc)
            return
        kind = request.resource_type
        if (kind not in _LOADED and not (job.render.images and kind in _IMAGES)) \
                or not url.startswith(("http://", "https://")) \
                or job.subrequests >= MAX_SUBREQUESTS:
            job.refused += 1
            await _abort(route, "blockedbyclient")
            return
        job.subrequests += 1
        try:
            result = await self._sub_fetch(job, request, url)
        except FetchError as exc:
            if exc.retryable and kind in _CALLS and host_key(url) == job.host:
                job.call_failed = job.call_failed or exc
            if exc.status is not None:  # a 5xx/429/408: the page sees it as it came
                await _fulfill_status(route, exc.status)
            else:
                job.refused += exc.reason == reasons.SSRF_BLOCKED
                self.ssrf_refused += exc.reason == reasons.SSRF_BLOCKED
                await _abort(route, "blockedbyclient" if not exc.retryable else "failed")
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let one request take the render down
            log.debug("browser_subrequest_failed", extra={"error": str(exc)[:200]})
            await _abort(route, "failed")
            return
        if kind == "document" and _is_attachment(result):
            job.refused += 1
            await _abort(route, "blockedbyclient")  # a download, refused
            return
        if job.render.json and kind in _CALLS and "json" in \
                result.headers.get("content-type", "").lower():
            self._keep_json(job, result)
        await _fulfill(route, result)

    async def _sub_fetch(self, job: _Job, request: Request, url: str) -> FetchResult:
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in _NOT_FORWARDED}
        fetch = self.http.fetch(url, headers=headers,
                                crawl_credentials=_origin(url) == job.origin,
                                method=request.method if request.method in _METHODS else "GET",
                                body=request.post_data_buffer, proxy=job.proxy,
                                cookies=job.cookies)
        left = job.deadline - time.monotonic()
        if host_key(url) != job.host:
            async with asyncio.timeout(max(0.001, left)):
                return await fetch
        # The page's own host: one request at a time, each after its turn's check.
        async with job.host_lock:
            try:
                async with asyncio.timeout(max(0.001, job.deadline - time.monotonic())):
                    if job.on_visit is not None:
                        await job.on_visit()
                    job.last_host_request = time.monotonic()
                    return await fetch
            finally:
                fetch.close()  # never awaited when on_visit raised: no warning

    def _keep_json(self, job: _Job, result: FetchResult) -> None:
        size = len(result.body)
        if job.json_bytes + size > self._cap:
            job.dropped_json += 1
            return
        job.json_bytes += size
        job.fetched.append(Fetched(result.final_url, result.status, result.body))


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})


def _loop_time(monotonic_at: float) -> float:
    """A `time.monotonic` instant on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


def _is_attachment(result: FetchResult) -> bool:
    for name, value in result.raw_headers:
        if name.lower() == b"content-disposition" and value.lower().startswith(b"attachment"):
            return True
    return False


def _headers_of(result: FetchResult) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in result.raw_headers:
        key = name.lower()
        if key in _NOT_RETURNED:
            continue
        text = key.decode("latin-1")
        decoded = value.decode("latin-1")
        out[text] = f"{out[text]}\n{decoded}" if text in out else decoded
    if "content-type" not in out and "content-type" in result.headers:
        out["content-type"] = result.headers["content-type"]
    return out


async def _fulfill(route: Route, result: FetchResult) -> None:
    try:
        await route.fulfill(status=result.status, headers=_headers_of(result),
                            body=result.body)
    except Exception as exc:  # the page went away meanwhile
        log.debug("browser_fulfill_failed", extra={"error": str(exc)[:200]})


async def _fulfill_status(route: Route, status: int) -> None:
    try:
        await route.fulfill(status=status, body=b"")
    except Exception as exc:
        log.debug("browser_fulfill_failed", extra={"error": str(exc)[:200]})


async def _abort(route: Route, code: str) -> None:
    try:
        await route.abort(code)
    except Exception as exc:
        log.debug("browser_abort_failed", extra={"error": str(exc)[:200]})

