"""A consumer's pool of browser pages, within a memory bound.

Each page slot is a page in a browser context of its own (its cookies and storage are
its own), reused from render to render: a context is closed and made anew after
``context_pages`` renders, and the browser is retired after ``browser_pages`` (its pages
finish on it; new ones open on a fresh browser, and the old one is closed once its last
page is back), or at once when it dies (its pages in flight fail ``browser_crashed``;
the next render starts a new one). Long crawls in a browser leak (caches, detached DOM,
a renderer's heap): the recycling bounds what a page and a browser can gather.

The memory bound: every second the pool adds up the proportional set size (PSS:
shared pages counted once across the processes that share them) of this process and
every process under it (the Playwright driver, each browser and its renderers). Over
``memory_bytes`` it takes one page slot out (renders then wait for a page) and retires
the browser (at most every ten seconds); under three quarters of it for ten seconds it
gives one back, up to ``pages``. A render waits for a page while every slot is busy.

Processes: Playwright's driver is this process's child; each browser is the driver's
child, in a process group of its own. The driver closes its browsers when it exits,
and it exits when this process dies (its pipe to it closes), ``kill -9`` included; a
browser's renderers exit with it. In a container, run an init (``tini``, compose's
``init: true``) as PID 1 so that the processes this leaves behind when killed are
reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from common import reasons
from common.browser.chromium import BrowserSettings, Sinkhole, chromium_args
from common.errors import ConfigError, FetchError

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route

__all__ = ["BrowserSettings", "PagePool", "PageSlot", "tree_memory"]

log = logging.getLogger(__name__)

#: How often the pool reads its memory.
MEMORY_EVERY_S = 1.0
#: Under this share of the limit for GROW_AFTER_S, a slot taken out comes back.
GROW_BELOW = 0.75
GROW_AFTER_S = 10.0
#: Run in every document before its own scripts: counts the page's fetch() and XHR calls
#: not ended yet (window.__crawlqBusy), so a render does not take as settled a page whose
#: call is on its way to the route handler (its event can come after the load event's).
BUSY_SCRIPT = """(() => {
  let busy = 0;
  Object.defineProperty(window, "__crawlqBusy", {get: () => busy});
  const fetch0 = window.fetch;
  if (fetch0) window.fetch = function (...args) {
    busy++;
    return fetch0.apply(this, args).finally(() => { busy--; });
  };
  const send0 = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function (...args) {
    busy++;
    this.addEventListener("loadend", () => { busy--; }, {once: true});
    return send0.apply(this, args);
  };
})();"""
#: Over the memory limit, the browser is retired (restarted) at most this often.
RETIRE_EVERY_S = 10.0
#: A browser that dies this soon after it started, twice running, is not started again
#: at once: the next render waits this long (a broken install must not spin).
CRASH_WAIT_S = 2.0


@dataclass(slots=True, eq=False)
class _Browser:
    """One browser process (a generation): its pages rendered and its slots out."""

    browser: Browser
    started: float
    renders: int = 0
    out: int = 0
    retired: bool = False
    dead: bool = False
    #: set once its process is gone (closed, or died)
    gone: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True, eq=False)
class PageSlot:
    """A page in a context of its own, on one browser; `job` is the render it serves."""

    context: BrowserContext
    page: Page
    owner: _Browser
    renders: int = 0
    job: Any = None
    broken: bool = False


@dataclass(slots=True)
class PoolFigures:
    """What a pool did, for metrics and tests."""

    renders: int = 0
    contexts: int = 0
    browsers: int = 0
    crashes: int = 0
    shrinks: int = 0
    memory: int = 0  # the last reading (bytes)
    peak_memory: int = 0


def tree_memory(pid: int | None = None) -> int:
    """PSS (else RSS) in bytes of process `pid` (this one) and every process under it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            try:
                total += proc.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


class PagePool:
    """Page slots over one browser at a time (see the module's docstring). `handler` is
    every context's route handler, given the slot and the route."""

    def __init__(self, settings: BrowserSettings,
                 handler: Callable[[PageSlot, Route], None], *,
                 user_agent: Callable[[], str] | None = None) -> None:
        self.s = settings
        self._handler = handler
        self._user_agent = user_agent
        self._pw: Playwright | None = None
        self._current: _Browser | None = None
        self._launching: asyncio.Task[_Browser] | None = None
        self._free: list[PageSlot] = []
        self._out = 0
        self.capacity = settings.pages
        self._changed = asyncio.Condition()
        self.sinkhole = Sinkhole()
        self._proxy_port = 0
        self._watch: asyncio.Task[None] | None = None
        self._low_since = 0.0
        self._quick_deaths = 0
        self.figures = PoolFigures()
        self._closing = False
        self._background: set[asyncio.Future[None]] = set()
        self._retiring: set[_Browser] = set()  # retired, not closed yet

    async def start(self) -> None:
        """Start Playwright's driver, the sinkhole and a first browser (ConfigError with
        the reason when it can't start), and the memory watch."""
        try:
            from playwright.async_api import async_playwright  # noqa: PLC0415 - optional
        except ImportError:
            raise ConfigError("--browser needs the playwright package: pip install "
                              "'crawlq[browser]' (Chromium itself is the system's)") from None
        self._proxy_port = await self.sinkhole.start()
        try:
            self._pw = await async_playwright().start()
        except Exception as exc:
            await self.close()
            raise ConfigError(f"--browser: Playwright's driver did not start "
                              f"({str(exc).splitlines()[0][:200] if str(exc) else exc!r}); "
                              "its log above says why (a missing system library: "
                              "libatomic1 on Debian)") from None
        try:
            self._current = await self._launch()
        except Exception as exc:
            await self.close()
            raise ConfigError(f"--browser {self.s.executable}: Chromium did not start: "
                              f"{str(exc).splitlines()[0][:300]}") from None
        self._watch = asyncio.create_task(self._watch_memory())

    async def _launch(self) -> _Browser:
        assert self._pw is not None
        browser = await self._pw.chromium.launch(
            executable_path=self.s.executable, args=chromium_args(self._proxy_port),
            headless=True, handle_sigint=False, handle_sigterm=False, handle_sighup=False)
        gen = _Browser(browser, time.monotonic())
        browser.on("disconnected", lambda _: self._died(gen))
        self.figures.browsers += 1
        log.info("browser_started", extra={"version": browser.version,
                                           "executable": self.s.executable})
        return gen

    def _died(self, gen: _Browser) -> None:
        gen.gone.set()
        self._retiring.discard(gen)
        if gen.dead:
            return
        gen.dead = True
        if not gen.retired and not self._closing:
            self.figures.crashes += 1
            quick = time.monotonic() - gen.started < 10
            self._quick_deaths = self._quick_deaths + 1 if quick else 0
            log.warning("browser_died", extra={"renders": gen.renders, "pages_out": gen.out})
        self._free = [s for s in self._free if s.owner is not gen]
        if self._current is gen:
            self._current = None

    async def _browser(self) -> _Browser:
        """The current browser; a new one when there is none (one launch at a time)."""
        gen = self._current
        if gen is not None and not gen.dead and not gen.retired:
            return gen
        if self._launching is None or self._launching.done():
            self._launching = asyncio.ensure_future(self._relaunch())
        return await asyncio.shield(self._launching)

    async def _relaunch(self) -> _Browser:
        if self._quick_deaths >= 2:
            await asyncio.sleep(CRASH_WAIT_S)
        # A retired browser finishes its pages and closes before the next one starts:
        # two browsers at once would pass the memory one takes.
        for old in list(self._retiring):
            await asyncio.wait_for(old.gone.wait(), 30)
        gen = await self._launch()
        self._current = gen
        return gen

    async def acquire(self) -> PageSlot:
        """A page for one render, waiting while every slot is out; FetchError
        ``browser_crashed`` when the browser died as the page was made."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._out < self.capacity)
            self._out += 1
        try:
            while self._free:
                slot = self._free.pop()
                if not slot.owner.dead and not slot.owner.retired:
                    slot.owner.out += 1
                    return slot
                self._close_slot(slot)
            gen = await self._browser()
            gen.out += 1  # before the await: a retirement meanwhile waits for this page
            try:
                return await self._new_slot(gen)
            except BaseException as exc:
                gen.out -= 1
                if gen.retired and gen.out == 0 and not gen.dead:
                    self._close_browser(gen)
                if not isinstance(exc, Exception):
                    raise
                # Playwright's: the browser went away meanwhile
                text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                raise FetchError(reasons.BROWSER_CRASHED, text, retryable=True) from None
        except BaseException:
            async with self._changed:
                self._out -= 1
                self._changed.notify()
            raise

    async def _new_slot(self, gen: _Browser) -> PageSlot:
        ua = self._user_agent() if self._user_agent is not None else None
        context = await gen.browser.new_context(
            service_workers="block", accept_downloads=False, user_agent=ua,
            java_script_enabled=True)
        await context.add_init_script(BUSY_SCRIPT)
        slot = PageSlot(context, await context.new_page(), gen)
        await context.route("**/*", lambda route: self._handler(slot, route))
        await context.route_web_socket("**/*", _refuse_websocket)
        context.on("page", lambda page: self._close_popup(slot, page))
        self.figures.contexts += 1
        return slot

    async def release(self, slot: PageSlot) -> None:
        """A page back from a render: kept for the next, or its context closed
        (recycled, its browser retired or dead, or the page broken)."""
        gen = slot.owner
        slot.renders += 1
        gen.renders += 1
        gen.out -= 1
        self.figures.renders += 1
        if gen.renders >= self.s.browser_pages and not gen.retired:
            self._retire(gen, "restart")
        if slot.broken or gen.dead or gen.retired or slot.renders >= self.s.context_pages \
                or self._out > self.capacity:
            self._close_slot(slot)
        else:
            self._free.append(slot)
        if gen.retired and gen.out == 0 and not gen.dead:
            self._close_browser(gen)
        async with self._changed:
            self._out -= 1
            self._changed.notify()

    def _retire(self, gen: _Browser, why: str) -> None:
        """No new page on `gen`: its free pages close now, and itself once its last page
        is back (the next browser starts then)."""
        gen.retired = True
        self._retiring.add(gen)
        if self._current is gen:
            self._current = None
        log.info("browser_retired", extra={"why": why, "renders": gen.renders})
        for slot in [s for s in self._free if s.owner is gen]:
            self._free.remove(slot)
            self._close_slot(slot)
        if gen.out == 0:
            self._close_browser(gen)

    def _close_slot(self, slot: PageSlot) -> None:
        if not slot.owner.dead:
            self.later(_quietly(slot.context.close()))

    def _close_browser(self, gen: _Browser) -> None:
        gen.dead = True

        async def close() -> None:
            await _quietly(gen.browser.close())
            gen.gone.set()
            self._retiring.discard(gen)
        self.later(close())

    def later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background (kept until it ends; `close` waits for it)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _close_popup(self, slot: PageSlot, page: Page) -> None:
        """A page the page opened (window.open, target=_blank): closed."""
        if page is not slot.page:
            self.later(_quietly(page.close()))

    def error_of(self, exc: BaseException, slot: PageSlot) -> FetchError:
        """The FetchError a Playwright error in a render on `slot` stands for."""
        text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        slot.broken = True
        if slot.owner.dead or "crash" in text.lower() or "closed" in text.lower():
            return FetchError(reasons.BROWSER_CRASHED, text, retryable=True)
        if type(exc).__name__ == "TimeoutError":
            return FetchError(reasons.TIMEOUT, text, retryable=True)
        return FetchError(reasons.RENDER_ERROR, text, retryable=True)

    async def _watch_memory(self) -> None:
        """Read the process tree's memory every MEMORY_EVERY_S; shrink or grow."""
        while True:
            await asyncio.sleep(MEMORY_EVERY_S)
            used = await asyncio.to_thread(tree_memory, os.getpid())
            self.figures.memory = used
            self.figures.peak_memory = max(self.figures.peak_memory, used)
            limit = self.s.memory_bytes
            if not limit:
                continue
            if used > limit:
                self._low_since = 0.0
                await self._shrink(used)
            elif used < GROW_BELOW * limit and self.capacity < self.s.pages:
                now = time.monotonic()
                self._low_since = self._low_since or now
                if now - self._low_since >= GROW_AFTER_S:
                    self._low_since = 0.0
                    async with self._changed:
                        self.capacity += 1
                        self._changed.notify()
            else:
                self._low_since = 0.0

    async def _shrink(self, used: int) -> None:
        """Over the limit: one slot fewer (not under one) and a fresh browser."""
        self.figures.shrinks += 1
        async with self._changed:
            self.capacity = max(1, self.capacity - 1)
        log.warning("browser_memory_over", extra={"used": used, "limit": self.s.memory_bytes,
                                                  "pages": self.capacity})
        for slot in list(self._free):  # idle pages hold memory for nothing
            self._free.remove(slot)
            self._close_slot(slot)
        gen = self._current
        if gen is not None and not gen.retired \
                and time.monotonic() - gen.started >= RETIRE_EVERY_S:
            self._retire(gen, "memory")

    @property
    def proxy_connections(self) -> int:
        """Connections Chromium opened by itself (to the sinkhole): none expected."""
        return self.sinkhole.connections

    async def close(self) -> None:
        """Close every browser and the driver; nothing of this pool is left running."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        gens = {s.owner for s in self._free}
        if self._current is not None:
            gens.add(self._current)
        self._free.clear()
        for gen in gens:
            gen.retired = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(gen.browser.close(), 10)
        if self._launching is not None and not self._launching.done():
            self._launching.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=10)
        if self._pw is not None:
            with contextlib.suppress(Exception):
                await self._pw.stop()
            self._pw = None
        await self.sinkhole.close()


async def _quietly(closing: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closing, 10)


async def _refuse_websocket(ws: Any) -> None:
    """A page's WebSocket: never connected to its server, closed."""
    with contextlib.suppress(Exception):
        await ws.close(code=1008, reason="refused by crawlq")

