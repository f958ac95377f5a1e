"""What one refresh of each dashboard view costs Redis on a big crawl (issue 11).

One crawl of 1,000,000 queued tasks over 10,000 hosts, enqueued through the real
`CrawlQueue.enqueue` (its Lua script, dedup included) on a redis-server of its own, with
tasks in flight, done and dead, three workers and a full hour of history. For each JSON
view the pages read, Redis's own accounting (``CONFIG RESETSTAT``, then ``INFO
commandstats`` after one request) must show under 5 ms of command time, a bounded
number of commands, and no KEYS or SCAN.

The load is most of this module's time (~25 s on 2 cores: ~15 us a task of Redis CPU
in the enqueue script, ~20 us of Python in `enqueue`, side by side): URLs are short,
grouped by host as seed lists are (a batch touches 100 hosts), three batches are in
flight so Python prepares one while Redis runs another, and the crawl has one partition
(one script call per batch, packed by hiredis; a pipeline packs far slower).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from common.fleet.workers import WorkerRegistry
from common.keys import CrawlKeys
from common.queue import CrawlSettings, Failure, LeasingQueue, NewTask
from common.redis.connection import connect
from common.redis.server import RedisServer
from common.urls.canonical import fingerprint
from console.dashboard.api import MAX_HOSTS_READ
from console.dashboard.app import make_app

TASKS, HOSTS = 1_000_000, 10_000
BATCH_HOSTS = 100
IN_FLIGHT = 3
CRAWL, PARTITIONS = "big", 1
MAX_REDIS_US = 5000
#: Commands that would mean a view reads the keyspace or the crawl, not a page of it.
FORBIDDEN = {"keys", "scan", "sscan", "hscan", "zscan"}
HOSTS_SIZE = 50
#: view -> (path, most commands one refresh may send).
VIEWS = {
    "crawls": ("/api/crawls", 40),
    "summary": (f"/api/crawls/{CRAWL}", 40),
    "history": (f"/api/crawls/{CRAWL}/history", 10),
    "hosts": (f"/api/crawls/{CRAWL}/hosts?size={HOSTS_SIZE}", 8 * HOSTS_SIZE + 10),
    "hosts-deepest-page": (f"/api/crawls/{CRAWL}/hosts?sort=next_allowed&desc=0&size="
                           f"{HOSTS_SIZE}&page={MAX_HOSTS_READ // HOSTS_SIZE // PARTITIONS - 1}",
                           8 * HOSTS_SIZE + 10),
    "workers": (f"/api/crawls/{CRAWL}/workers", 10),
    "dead": (f"/api/crawls/{CRAWL}/dead?size=50", 4 * 50 + 10),
    "dead-by-reason": (f"/api/crawls/{CRAWL}/dead?size=50&reason=http_5xx", 4 * 50 + 20),
    "proxies": (f"/api/crawls/{CRAWL}/proxies", 10),
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def big_server() -> Iterator[RedisServer]:
    """A redis-server of its own: its statistics are this module's alone, and the 1M
    tasks go with it."""
    with RedisServer() as server:
        yield server


async def _load(queue: LeasingQueue) -> int:
    per_host = TASKS // HOSTS
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def batch(first_host: int) -> int:
        async with gate:
            tasks = []
            for h in range(first_host, first_host + BATCH_HOSTS):
                for i in range(per_host):
                    url = f"http://h{h}.t/{i}"
                    tasks.append(NewTask(url, fingerprint(url)))
            done = await queue.enqueue(tasks)
            # A batch sent again after a lost reply (a loaded machine's timeout: its first
            # run queued it) finds its URLs seen: duplicates, not lost.
            return done.enqueued + done.duplicates

    return sum(await asyncio.gather(*(batch(h) for h in range(0, HOSTS, BATCH_HOSTS))))


async def _activity(client: aioredis.Redis, queue: LeasingQueue) -> None:
    """Leases, acks, dead letters, workers and an hour of history, as a running crawl has."""
    leases: list[Any] = []
    while len(leases) < 300:
        got = await queue.lease("w-0", 300 - len(leases), 600_000)
        assert got, "nothing to lease"
        leases += got
    await queue.ack("w-0", [(lease, "ok") for lease in leases[:100]])
    await queue.fail("w-0", [Failure(lease, "http_5xx" if i % 3 else "timeout", "HTTP 503",
                                     permanent=True)
                             for i, lease in enumerate(leases[100:250])])
    for w in range(3):
        await WorkerRegistry(client, CRAWL, f"w-{w}", ttl_s=600).beat(
            in_flight=50, done=100, failed=50, state="running")
    secs, _ = await client.time()
    snaps = [json.dumps({"t": int(secs) - 5 * i, "done": 10**6 - 500 * i, "enqueued": TASKS})
             for i in range(720)]
    await client.rpush(CrawlKeys.build(CRAWL).history, *snaps)  # newest first


@pytest.fixture(scope="module")
async def dashboard(big_server: RedisServer) -> AsyncIterator[TestClient[Any, Any]]:
    client = connect(big_server.url)
    queue = await LeasingQueue.open(client, CRAWL, CrawlSettings(partitions=PARTITIONS))
    # Counted in the crawl, not from the replies: a batch whose reply a loaded machine
    # timed out is sent again (common/redis/resend.py) and then answers "duplicates".
    await _load(queue)
    assert (await queue.stats()).pending == TASKS
    await _activity(client, queue)
    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.dead) == (TASKS - 300, 50, 150)
    view = connect(big_server.url)
    test_client = TestClient(TestServer(make_app(view, token=None, bind_host="127.0.0.1"),
                                        host="127.0.0.1"))
    await test_client.start_server()
    for path, _ in VIEWS.values():  # connections open, nothing first-time left to cost
        assert (await test_client.get(path)).status == 200, path
    yield test_client
    await test_client.close()
    await view.aclose()
    await client.aclose()


async def _cost(admin: aioredis.Redis, client: TestClient[Any, Any], path: str
                ) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) of one GET of `path`, from Redis's own accounting."""
    await admin.config_resetstat()
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    await resp.read()
    info = await admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(s["calls"]), int(s["usec"]))
            for name, s in info.items()
            if name.removeprefix("cmdstat_") not in ("config", "info")}


@pytest.mark.parametrize("view", list(VIEWS))
async def test_one_refresh_is_cheap_for_redis(view: str, big_server: RedisServer,
                                              dashboard: TestClient[Any, Any]) -> None:
    path, most_calls = VIEWS[view]
    admin = aioredis.Redis.from_url(big_server.url)
    try:
        cost = await _cost(admin, dashboard, path)
    finally:
        await admin.aclose()
    calls = sum(c for c, _ in cost.values())
    usec = sum(u for _, u in cost.values())
    print(f"{view}: {calls} commands, {usec} us of Redis time: {cost}")
    assert not FORBIDDEN & set(cost), cost
    assert 0 < calls <= most_calls, cost
    assert usec < MAX_REDIS_US, cost
