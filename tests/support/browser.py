"""The dashboard in headless Chromium, as the browser tests drive it: the browser
(Debian's chromium + chromium-driver, via Selenium), ``crawlq dashboard`` and other
commands as child processes, and waits on a page that redraws itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Screenshots of the pages the tests saw (git-ignored).
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "browser-test-token-0123456789"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driver; skips the test where Selenium, chromium or chromedriver
    is missing."""
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1500", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@contextlib.asynccontextmanager
async def child(*argv: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=ROOT, env=_child_env(), stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=asyncio.subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def dashboard_argv(redis_url: str, port: int) -> list[str]:
    return ["-c", "import sys; from console.cli import main; sys.exit(main(sys.argv[1:]))",
            "dashboard", "--redis-url", redis_url, "--cluster", "no",
            "--http-port", str(port), "--token", TOKEN]


def wait_for(pred: Callable[[], Any], what: str, within: float = 45) -> Any:
    """Poll `pred` until it returns something truthy; fail after `within` seconds (a
    loaded machine draws the page in seconds, not in the tenths it takes alone)."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(Exception):
            got = pred()
            if got:
                return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        time.sleep(0.1)


def read(get: Callable[[], Any], tries: int = 50) -> Any:
    """`get()`, read again when the panel it reads was redrawn under it (a stale element);
    unlike `wait_for`, any value counts, a falsy one too."""
    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415
    for _ in range(tries - 1):
        with contextlib.suppress(StaleElementReferenceException):
            return get()
        time.sleep(0.05)
    return get()


def click(driver: Any, selector: str) -> None:
    """Click an element of a panel that every refresh redraws."""
    wait_for(lambda: driver.find_element("css selector", selector).click() or True,
             f"a click on {selector}")


def base(port: int) -> str:
    return f"http://127.0.0.1:{port}"
