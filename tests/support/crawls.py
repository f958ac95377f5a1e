"""A crawl with tasks in every state, built through the queue's own calls: what the
``crawl`` fixture (tests/conftest.py) gives a test, shaped by a ``crawl_states`` mark of
its module or its own (``pytest.mark.crawl_states(done=3, pending=2, ...)``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from common.queue import CrawlSettings, Failure, LeasingQueue, NewTask
from common.urls.canonical import fingerprint

#: The dead letters a crawl holds by default: (reason, error, how many).
DEAD = (("http_5xx", "HTTP 503", 2), ("redirect_loop", "loop", 1))


@dataclass
class Crawl:
    name: str
    queue: LeasingQueue
    done: list[str]  # the ids acked
    dead: dict[str, list[str]]  # reason -> the ids failed for good with it


async def build_crawl(client: aioredis.Redis, name: str, *, partitions: int = 2,
                      host: str = "cli.example", done: int = 4,
                      dead: Sequence[tuple[str, str, int]] = DEAD,
                      pending: int = 5) -> Crawl:
    """A crawl of one host's pages ``https://<host>/<i>``: the first `done` leased and
    acked, the next failed for good as `dead` says, in its order, the last `pending` left
    pending (12 tasks by default: 4 done, 2 dead http_5xx, 1 redirect_loop, 5 pending)."""
    queue = await LeasingQueue.open(client, name, CrawlSettings(partitions=partitions))
    n_dead = sum(n for _, _, n in dead)
    urls = [f"https://{host}/{i}" for i in range(done + n_dead + pending)]
    assert (await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])).enqueued \
        == len(urls)
    leases = []
    while len(leases) < done + n_dead:
        leases += await queue.lease("w1", done + n_dead - len(leases), 60_000)
    if done:
        await queue.ack("w1", [(lease, "ok") for lease in leases[:done]])
    failed, at = {}, done
    for reason, error, n in dead:
        batch = leases[at:at + n]
        if batch:
            await queue.fail("w1", [Failure(lease, reason, error, permanent=True)
                                    for lease in batch])
        failed[reason] = [lease.id for lease in batch]
        at += n
    return Crawl(name, queue, [lease.id for lease in leases[:done]], failed)
