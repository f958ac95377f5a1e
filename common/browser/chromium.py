"""Finding Chromium, and the flags it is started with.

``--browser auto`` takes the first of `CANDIDATES` on the PATH (Debian's ``chromium``
first); ``--browser PATH`` takes that file. Nothing is downloaded, ever (Playwright's own
browser builds are not used): `find_chromium` raises ConfigError saying what to install
when there is none, and the consumer exits at start.

Chromium is started headless with its own background traffic off (no component updates,
sync, field trials, safe-browsing downloads: on a closed network each of those is a
connection refused, and anywhere they are traffic nobody asked for) and with a proxy
that is a sinkhole (`Sinkhole`): every request a page makes is intercepted and fetched
by crawlq's guarded client (``common.browser.fetcher``), so the only connections
Chromium could still open itself (a preconnect hint, a request interception missed) go
to a socket of this process that accepts and closes them, counted, and never to the
address asked for; loopback is not bypassed (``<-loopback>``), and WebRTC may use no UDP
but through the proxy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import dataclass, field

from common.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["CANDIDATES", "BrowserSettings", "Sinkhole", "chromium_args", "find_chromium"]

#: What ``--browser auto`` looks for on the PATH, in order.
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
              "chrome")
#: Found by ``--browser auto``, or given: what a consumer says when there is none.
INSTALL_HINT = ("install Chromium (Debian/Ubuntu: apt-get install chromium) or give its "
                "path with --browser PATH (CRAWLQ_BROWSER)")


@dataclass(frozen=True, slots=True)
class BrowserSettings:
    """A consumer's browser: the executable (`find_chromium`) and the bounds of its page
    pool (``common.browser.pool``)."""

    executable: str
    pages: int = 4
    context_pages: int = 50
    browser_pages: int = 1000
    memory_bytes: int = 0  # 0: no bound

    def __post_init__(self) -> None:
        if self.pages < 1 or self.context_pages < 1 or self.browser_pages < 1:
            raise ConfigError("--browser-pages, --browser-recycle and --browser-restart "
                              "must be >= 1")
        if self.memory_bytes < 0:
            raise ConfigError("--browser-memory must be >= 0 (0 = no bound)")


def find_chromium(spec: str) -> str:
    """The Chromium executable `spec` names: ``auto`` (the first of `CANDIDATES` on the
    PATH) or a path. ConfigError saying what to do when there is none."""
    if spec == "auto":
        for name in CANDIDATES:
            found = shutil.which(name)
            if found:
                return found
        raise ConfigError(f"--browser auto: no Chromium on the PATH (looked for "
                          f"{', '.join(CANDIDATES)}); {INSTALL_HINT}")
    path = shutil.which(spec) or spec
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"--browser {spec!r}: no executable there; {INSTALL_HINT}")
    return path


def chromium_args(proxy_port: int) -> list[str]:
    """The flags of every Chromium this process starts (Playwright adds its own:
    headless, a fresh profile directory, automation)."""
    return [
        "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
        "--disable-background-networking", "--disable-component-update",
        "--disable-default-apps", "--disable-extensions", "--disable-dev-shm-usage",
        "--disable-domain-reliability", "--disable-client-side-phishing-detection",
        "--no-pings", "--mute-audio", "--metrics-recording-only",
        # No crash handler: crashpad's daemon leaves the process tree (it is reparented
        # to init), so the consumer's death would not take it down.
        "--disable-crash-reporter", "--disable-breakpad",
        # A spare renderer started (and a new document's one) for every navigation, and
        # pages kept for back/forward: ~half of Chromium's CPU a page (measured: ~140
        # ms of CPU a small page with them, ~73 without).
        "--disable-features=Translate,OptimizationHints,MediaRouter,"
        "InterestFeedContentSuggestions,AutofillServerCommunication,"
        "SpareRendererForSitePerProcess,BackForwardCache,RenderDocument",
        f"--proxy-server=http://127.0.0.1:{proxy_port}", "--proxy-bypass-list=<-loopback>",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]


@dataclass(slots=True)
class Sinkhole:
    """A proxy that is no proxy: a listening socket on 127.0.0.1 that closes every
    connection it accepts, and counts them (`connections`). Chromium is told to use it,
    so a connection it opens itself never reaches the address it was for."""

    server: asyncio.Server | None = None
    connections: int = 0
    #: the first bytes of the last connections (Chromium's own: update checks,
    #: preconnects), for a debug log and tests
    heads: list[bytes] = field(default_factory=list)

    async def start(self) -> int:
        """Listen on a free port of 127.0.0.1; returns it."""
        self.server = await asyncio.start_server(self._refuse, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        self.connections += 1
        head = b""
        try:  # what it was (Chromium's update checks, a preconnect): for a debug log
            head = await asyncio.wait_for(reader.read(200), 0.5)
        except (TimeoutError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
        self.heads = [*self.heads[-49:], head]
        log.debug("browser_sinkhole", extra={"head": head.decode("latin-1")})

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
