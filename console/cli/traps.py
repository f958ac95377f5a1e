"""``crawlq traps``: the hosts that had crawler traps, and what each trap cost.

A host's tallies (``common.traps.book``): its links each trap rule refused (``trap_*``)
and its pages that were near duplicates of another of its pages (``near_duplicate``:
each one a request spent in a trap, its links not followed).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from common.config import JSON, Option, add_options
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from common.traps.book import TrapBook, TrapRow
from console.cli.output import at_most

#: Most hosts one listing shows.
MAX_HOSTS = 1000


def traps_text(rows: list[TrapRow]) -> str:
    """One line per host: its tallies' sum, then each reason's count."""
    if not rows:
        return "no host had a trap"
    width = max(len(r.host) for r in rows)
    return "\n".join(f"{r.host:<{width}} {r.total:>8}  " +
                     ", ".join(f"{reason} {n}" for reason, n in r.reasons.items())
                     for r in rows)


async def cmd_traps(args: argparse.Namespace, client: RedisClient) -> int:
    """List the hosts with the most trap tallies."""
    rows = await TrapBook(await CrawlQueue.existing(client, args.crawl)).hosts(args.limit)
    if args.json:
        print(json.dumps({"hosts": [asdict(r) for r in rows]}))
    else:
        print(traps_text(rows))
    return 0


def add_trap_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: tuple[Option, ...]) -> None:
    """Register ``traps`` on the crawlq parser."""
    p = sub.add_parser("traps", help="the hosts that had crawler traps, and what it cost",
                       description="List the hosts with the most trap tallies: links "
                       "refused by each trap rule, pages that were near duplicates.")
    add_options(p, common)
    add_options(p, (JSON, Option("--limit", "CRAWLQ_TRAPS_LIMIT", 20,
                                 f"show at most this many hosts (1..{MAX_HOSTS})",
                                 type=at_most(MAX_HOSTS))))
    p.set_defaults(handler=cmd_traps)
