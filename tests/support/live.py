"""A consumer's live policy snapshot as a test sets it (what the fetcher, robots.txt
cache and link intake read at each use)."""

from __future__ import annotations

from typing import Any

from common.policy import CrawlPolicy
from consumer.live import LivePolicy


def snapshot(**values: Any) -> LivePolicy:
    """The snapshot of a crawl policy with these values (the others: their defaults)."""
    policy = CrawlPolicy(**values)
    return LivePolicy.of(0, policy, policy.recrawl_after)
