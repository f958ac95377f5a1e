"""What the ``crawlq`` commands share: their usage error, how they print JSON and
times, and the crawl's queue opened with a usable error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from common import codec
from common.config import Option
from common.errors import ConfigError, CrawlqError
from common.queue import CrawlFormatError, CrawlQueue
from common.redis.connection import RedisClient

#: A destructive command's confirmation (``reset``, ``dead purge``).
YES = Option("--yes", "CRAWLQ_YES", False, "really do it", flag_only_bool=True)


class UsageError(CrawlqError):
    """The command line asked for something that can't be done as asked."""


def at_most(most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to `most` (how many rows to show)."""
    def limit(text: str) -> int:
        value = int(text)
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"must be 1..{most}, got {value}")
        return value
    return limit


def when(ms: float) -> str:
    """`ms` since the epoch as an ISO 8601 UTC time to the second."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def emit(obj: Any) -> None:
    """Print `obj` as one JSON document."""
    print(codec.dumps(obj), flush=True)


async def open_queue(client: RedisClient, crawl: str) -> CrawlQueue:
    """The crawl's queue; a crawl of an old layout or none at all is a UsageError."""
    try:
        return await CrawlQueue.existing(client, crawl)
    except CrawlFormatError as exc:  # its message says what to do
        raise UsageError(str(exc)) from None
    except ConfigError as exc:
        raise UsageError(f"{exc} (crawlq crawls lists them)") from None
