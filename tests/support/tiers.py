"""The suite's two tiers, a pytest plugin (tests/conftest.py registers it):
``python -m pytest -m unit`` runs the tests that start no process (no redis-server,
sentinel, postgres, Chromium, no crawlq command as a child; a local site served in the
test's own process is fine), ``-m integration`` the others; no ``-m`` runs both.

A test's tier comes from the fixtures it uses, so test files rarely say it: a test that
uses one of ``SERVER_FIXTURES`` (itself or through another fixture) is ``integration``,
as is one marked ``@pytest.mark.integration`` (it starts a server or a child in its own
body) or ``slow`` (an end-to-end run); every other test is ``unit``. The guard keeps
that true: a ``unit`` test that starts a process while it is set up or runs fails with
``TierError``, and so does a fixture that starts one without being listed here, whichever
test set it up first. A test that needs a server can't land in the fast tier: it fails,
saying how to place it (tests/test_tiers.py shows each case).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

UNIT, INTEGRATION = "unit", "integration"

#: Fixtures that start a process, as ``name`` (tests/conftest.py) or ``file::name``.
SERVER_FIXTURES = frozenset({
    "redis_server", "evicting_redis_url", "postgres_server", "own_postgres",
    "browser",  # chromedriver and Chromium
    "test_browser_fetcher.py::browser",  # a Playwright Chromium
    "test_acl.py::acl_server",  # a redis-server per installed binary
    "test_cluster.py::cluster",  # a Redis Cluster of three primaries
    "test_consumer_process.py::spawn",  # consumer processes
    "test_dashboard_api.py::module_redis",
    "test_dashboard_cost.py::big_server",
    "test_failover.py::pair",  # a primary and its replica
    "test_failover_drill.py::group",  # a Sentinel group
    "test_postgres_sink.py::consumers",
    "test_redis_faults.py::servers", "test_redis_faults.py::fleet",
    "test_sink_failures.py::small_disk",  # mount(8) of a tmpfs
})


class TierError(Exception):
    """A test or fixture started a process where its tier says it starts none."""


def fixture_key(name: str, fixturedef: Any) -> str:
    """How SERVER_FIXTURES names a fixture: by name if a conftest.py defines it, else as
    ``file::name`` (two test files may each have a ``servers`` of their own)."""
    source = Path(fixturedef.func.__code__.co_filename).name
    return name if source == "conftest.py" else f"{source}::{name}"


def server_fixtures_of(item: pytest.Item) -> list[str]:
    """The fixtures of SERVER_FIXTURES `item` uses, itself or through other fixtures, or
    that a fixture it uses overrides (a test file's own ``browser``): a test counted
    integration for one it does not reach only runs in the slower tier."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [key for name in info.names_closure
            for fixturedef in info.name2fixturedefs.get(name, ())
            if (key := fixture_key(name, fixturedef)) in SERVER_FIXTURES]


def tier_of(item: pytest.Item) -> str:
    marked = any(item.get_closest_marker(m) is not None for m in (INTEGRATION, "slow"))
    return INTEGRATION if marked or server_fixtures_of(item) else UNIT


class _Spawns:
    """Counts the processes this process starts, and notes the first one while a unit
    test is watched: every way a test starts one goes through subprocess.Popen, os.fork,
    os.posix_spawn(p), os.system or _posixsubprocess.fork_exec (multiprocessing). The
    start goes ahead (refusing it would leave a library half-built, its garbage failing
    later tests): the test fails once its phase is over."""

    def __init__(self) -> None:
        self.count = 0
        self.watching = False
        self.first: str | None = None  # the first process a watched unit test started
        self.fixtures: list[list[int]] = []  # per fixture being set up: its nested ones' count

    def seen(self, what: str) -> None:
        self.count += 1
        if self.watching and self.first is None:
            self.first = what[:160]

    def install(self) -> None:
        def wrap(owner: Any, name: str) -> None:
            original = getattr(owner, name)

            def spawning(*args: Any, **kwargs: Any) -> Any:
                shown = args[1] if owner is subprocess.Popen else args[:1]
                self.seen(f"{name}: {shown!r}")
                return original(*args, **kwargs)
            setattr(owner, name, spawning)

        wrap(subprocess.Popen, "_execute_child")
        for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
            wrap(os, name)
        wrap(_posixsubprocess, "fork_exec")


SPAWNS = _Spawns()


@contextmanager
def _watched(item: pytest.Item) -> Iterator[None]:
    """A unit test that starts a process while it is set up or runs fails with TierError
    (whatever else it raised comes with it, as the error it happened in)."""
    if tier_of(item) != UNIT:
        yield
        return
    SPAWNS.watching, SPAWNS.first = True, None
    try:
        yield
    finally:
        SPAWNS.watching = False
        first, SPAWNS.first = SPAWNS.first, None
        if first is not None:
            raise TierError(f"unit test {item.nodeid} started a process ({first}): a unit "
                            "test starts none. Give it the server fixture it needs or mark "
                            "it @pytest.mark.integration; a fixture that starts one goes "
                            "into SERVER_FIXTURES (tests/support/tiers.py)")


@contextmanager
def _fixture_checked(fixturedef: Any) -> Iterator[None]:
    """A fixture whose own setup starts a process (not counting fixtures it sets up on
    the way) must be one of SERVER_FIXTURES: else the tests using it count as unit."""
    nested = [0]
    SPAWNS.fixtures.append(nested)
    started = SPAWNS.count
    try:
        yield
    finally:
        SPAWNS.fixtures.pop()
        total = SPAWNS.count - started
        if SPAWNS.fixtures:
            SPAWNS.fixtures[-1][0] += total
    key = fixture_key(fixturedef.argname, fixturedef)
    if total > nested[0] and key not in SERVER_FIXTURES:
        raise TierError(f"fixture {key} started a process: add it to SERVER_FIXTURES "
                        "(tests/support/tiers.py), so the tests using it are integration")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{UNIT}: starts no process (no server): the fast tier")
    config.addinivalue_line("markers", f"{INTEGRATION}: needs a server or a child process")
    SPAWNS.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every collected test its tier's marker (what ``-m unit`` selects on)."""
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any) -> Iterator[Any]:
    with _fixture_checked(fixturedef):
        return (yield)
