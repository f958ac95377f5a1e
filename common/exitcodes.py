"""The exit codes of every crawlq command, in one place (the tables of docs/producer.md and
docs/consumer.md list them)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # ran (rejected input lines don't fail a run)
EXIT_FAIL: Final = 1  # a check failed (crawlq check)
EXIT_USAGE: Final = 2  # usage or configuration error
EXIT_REDIS: Final = 3  # Redis unreachable or refusing (auth, ACL, out of memory)
EXIT_SOURCE: Final = 4  # a source could not be read (producer)
EXIT_LOCKED: Final = 5  # another producer of this crawl is running
EXIT_SINK: Final = 6  # the result sink kept failing for --sink-retry-for (consumer)
EXIT_INCONSISTENT: Final = 7  # crawlq fsck found problems it did not repair
EXIT_NOTHING_FETCHED: Final = 8  # crawlq run: every request ended without a page
EXIT_ROUTES_FAILED: Final = 9  # crawlq run: routes raised and no item was delivered
