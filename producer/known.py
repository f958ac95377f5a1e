"""The producer's recrawl of the known URLs (Nutch's generate): after its inputs, a run of
a crawl that recrawls by its window (``recrawl_after`` > 0, ``revisit`` off, ``conditional``
on: each done URL's history keeps its entry) queues again every done URL whose window has
passed, from the crawl's history (`common.queue.known`), so a re-seeded link-following
crawl reaches every page it knew, each asked for conditionally, not only what its seeds'
changed pages link to. ``--no-recrawl-known`` skips it."""

from __future__ import annotations

import asyncio
import logging

from common.fleet.wake import WakeChannel
from common.policy import CrawlPolicy
from common.queue import CrawlQueue
from producer.summary import Summary

log = logging.getLogger("producer")


def recrawls_known(policy: CrawlPolicy) -> bool:
    """Whether the crawl's known URLs come back by a producer run: a recrawl window whose
    history keeps them (a revisit schedule brings its URLs back by itself)."""
    return policy.revisit == "off" and policy.recrawl_after > 0 and policy.conditional


async def recrawl_known(queue: CrawlQueue, policy: CrawlPolicy, summary: Summary,
                        stop: asyncio.Event | None = None) -> None:
    """Queue again the crawl's known URLs past its window, when its policy has them come
    back this way; what it did goes into `summary` (``known``)."""
    if not recrawls_known(policy):
        return
    known = summary.known = await queue.recrawl_known(stop=stop)
    if known.recrawled:
        await WakeChannel(queue.client, queue.crawl_keys.wake).notify()
    if known.partitions:
        log.info("recrawled_known", extra={
            "crawl": summary.crawl, "recrawled": known.recrawled, "scanned": known.scanned,
            "duplicates": known.duplicates, "no_entry": known.no_entry,
            "stopped": known.stopped})
