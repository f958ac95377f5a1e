"""Shared fixtures: a real redis-server per session, a unique crawl name per test; the
suite's two tiers (tests/support/tiers.py: ``-m unit`` runs the tests that start no process)."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, settings
from support import tiers
from support.browser import chromium
from support.crawls import Crawl, build_crawl
from support.dashboard import DASHBOARD_TOKEN
from support.postgres import PostgresServer, find_bindir

from common.redis.server import RedisServer
from console.dashboard.app import make_app

_counter = itertools.count()

# Hypothesis' 200 ms deadline and its too-slow health check time the machine, not the
# code: under two cores' load an example of test_urls took longer and failed the suite.
settings.register_profile("crawlq", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("crawlq")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(tiers, "crawlq-tiers")  # -m unit: tests/support/tiers.py
    config.addinivalue_line("markers", "crawl_states(**shape): the crawl fixture's tasks "
                            "(tests/support/crawls.py build_crawl's keywords)")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session, on a free port, no persistence."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def evicting_redis_url() -> Iterator[str]:
    """A redis-server that evicts keys when full (maxmemory-policy allkeys-lru): the
    setting crawlq check and a consumer's start-up must refuse."""
    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        yield server.url


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def crawl_name(request: pytest.FixtureRequest) -> str:
    """A crawl name unique to this test, so tests share one server without FLUSHALL."""
    # Test ids of parametrized tests hold "[", spaces, ...: not in a crawl name.
    test = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:40]
    return f"t{os.getpid()}-{next(_counter)}-{test}"


@pytest.fixture
async def crawl(request: pytest.FixtureRequest, redis_client: aioredis.Redis,
                crawl_name: str) -> Crawl:
    """This test's crawl with tasks done, dead and pending, shaped by a ``crawl_states``
    mark (tests/support/crawls.py)."""
    mark = request.node.get_closest_marker("crawl_states")
    return await build_crawl(redis_client, crawl_name, **(mark.kwargs if mark else {}))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Selenium, one per module (skipped where it is missing)."""
    with chromium() as driver:
        yield driver


@pytest.fixture
async def make_client(redis_url: str) -> AsyncIterator[Callable[..., Any]]:
    """make_client(token=..., bind_host=...) -> a TestClient of a fresh dashboard."""
    clients: list[TestClient[Any, Any]] = []
    redis = aioredis.Redis.from_url(redis_url)

    async def make(token: str | None = DASHBOARD_TOKEN, bind_host: str = "127.0.0.1"
                   ) -> TestClient[Any, Any]:
        client = TestClient(TestServer(make_app(redis, token=token, bind_host=bind_host),
                                       host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
    await redis.aclose()


def _postgres_bindir() -> Path:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and postgres are not installed (apt: postgresql)")
    return bindir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real postgres for the session (Debian's binaries; skipped where they are missing)."""
    with PostgresServer(_postgres_bindir()) as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A postgres of this test's own, to take down and bring back."""
    with PostgresServer(_postgres_bindir()) as server:
        yield server


@pytest.fixture
async def postgres_url(postgres_server: PostgresServer, crawl_name: str) -> str:
    """A URL of a fresh database of its own for this test."""
    database = crawl_name.lower().replace("-", "_").replace(".", "_")[:60]
    conn = await asyncpg.connect(postgres_server.url())
    try:
        await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
    return postgres_server.url(database)
