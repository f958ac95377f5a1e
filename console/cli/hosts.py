"""``crawlq hosts``, ``crawlq pause`` and ``crawlq resume``: steer a running crawl's frontier.

Every change is written to Redis and taken up by the fleet's next lease call (within a
second), without restarting anyone.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict

from common.config import JSON, Option, add_options, duration
from common.frontier.groups import GroupPage, groups, set_group
from common.frontier.hosts import SORT_COLUMNS, Frontier, HostPage
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from console.views.hosts import sort_refusal

Command = Callable[..., argparse.ArgumentParser]


def _sort_column(text: str) -> str:
    if text not in SORT_COLUMNS:
        raise argparse.ArgumentTypeError(sort_refusal(text))
    return text


def _in(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    delta = (ms - now_ms) / 1000
    return "now" if delta <= 0 else f"in {delta:.1f}s"


def hosts_text(page: HostPage, offset: int) -> str:
    """The hosts table as the terminal shows it."""
    if not page.rows:
        return f"no hosts at offset {offset} ({page.total} in all)"
    width = max(4, *(len(r.host) for r in page.rows))
    lines = [f"{'host':<{width}} {'queued':>8} {'flight':>6} {'done':>8} {'errors':>6} "
             f"{'next':>9} {'delay':>7} {'conc':>4} {'budget':>11} {'level':>5} "
             f"{'pushbk':>6} blocked"]
    for r in page.rows:
        budget = "-" if r.budget is None else f"{r.used}/{r.budget}"
        conc = "-" if r.concurrency == 0 else str(r.concurrency)
        lines.append(
            f"{r.host:<{width}} {r.queued:>8,} {r.in_flight:>6} {r.done:>8,} {r.errors:>6} "
            f"{_in(r.next_allowed_ms, page.now_ms):>9} {r.delay_ms / 1000:>6.1f}s {conc:>4} "
            f"{budget:>11} {r.backoff_level:>5} {r.pushbacks:>6} "
            f"{_in(r.blocked_until_ms, page.now_ms)}")
    lines.append(f"hosts {offset + 1}-{offset + len(page.rows)} of {page.total}")
    return "\n".join(lines)


def groups_text(page: GroupPage, now_ms: int) -> str:
    """The politeness groups table as the terminal shows it ("*": the group's own)."""
    head = f"politeness_key {page.key}" + ("" if page.key != "host" else
                                            ": groups keep no limit now")
    if not page.rows:
        return f"{head}; no groups"
    width = max(5, *(len(r.group) for r in page.rows))
    lines = [head, f"{'group':<{width}} {'flight':>6} {'delay':>8} {'conc':>5} "
                   f"{'parked':>6} {'last':>9} blocked"]
    for r in page.rows:
        delay = f"{r.delay_ms / 1000:.1f}s" + ("*" if r.own_delay else "")
        conc = ("-" if r.concurrency == 0 else str(r.concurrency)) + (
            "*" if r.own_concurrency else "")
        last = "-" if r.last_request_ms is None else \
            f"{(now_ms - r.last_request_ms) / 1000:.1f}s ago"
        lines.append(f"{r.group:<{width}} {r.in_flight:>6} {delay:>8} {conc:>5} "
                     f"{r.parked:>6} {last:>9} {_in(r.blocked_until_ms, now_ms)}")
    return "\n".join(lines)


async def _frontier(client: RedisClient, crawl: str) -> Frontier:
    return Frontier(await CrawlQueue.existing(client, crawl))


async def cmd_hosts(args: argparse.Namespace, client: RedisClient) -> int:
    """List hosts, sorted and paged (with --groups, the politeness groups)."""
    frontier = await _frontier(client, args.crawl)
    if args.groups:
        page_g = await groups(frontier.queue, limit=args.limit)
        seconds, micros = await client.time()
        if args.json:
            print(json.dumps({"politeness_key": page_g.key,
                              "groups": [asdict(r) for r in page_g.rows]}))
        else:
            print(groups_text(page_g, int(seconds) * 1000 + int(micros) // 1000))
        return 0
    page = await frontier.hosts(sort=args.sort, desc=not args.asc, offset=args.offset,
                                limit=args.limit)
    if args.json:
        print(json.dumps({"total": page.total, "now_ms": page.now_ms,
                          "hosts": [asdict(r) for r in page.rows]}))
    else:
        print(hosts_text(page, args.offset))
    return 0


async def cmd_hosts_set(args: argparse.Namespace, client: RedisClient) -> int:
    """Change one host's delay, concurrency or budget."""
    frontier = await _frontier(client, args.crawl)
    host = await frontier.set_host(args.host, delay_s=args.delay, concurrency=args.concurrency,
                                   budget=args.budget, clear=tuple(args.clear))
    row = await frontier.host(host)
    print(f"host {host}: " + ("set" if row is None else
                              f"delay {row.delay_ms / 1000:g}s, concurrency "
                              f"{row.concurrency or 'unlimited'}, budget "
                              f"{'none' if row.budget is None else row.budget}"))
    return 0


async def cmd_hosts_group_set(args: argparse.Namespace, client: RedisClient) -> int:
    """Change one politeness group's delay or concurrency."""
    frontier = await _frontier(client, args.crawl)
    row = await set_group(frontier.queue, args.group, delay_s=args.delay,
                          concurrency=args.concurrency, clear=tuple(args.clear))
    print(f"group {row.group}: delay {row.delay_ms / 1000:g}s, concurrency "
          f"{row.concurrency or 'unlimited'}")
    return 0


async def cmd_hosts_block(args: argparse.Namespace, client: RedisClient) -> int:
    """Send one host nothing for a while."""
    frontier = await _frontier(client, args.crawl)
    host = await frontier.block_host(args.host, args.for_)
    print(f"host {host}: " + (f"blocked for {args.for_:g}s" if args.for_ else "unblocked"))
    return 0


async def cmd_pause(args: argparse.Namespace, client: RedisClient) -> int:
    """Pause or resume the crawl (``args.paused``)."""
    frontier = await _frontier(client, args.crawl)
    await frontier.set_paused(args.paused)
    print(f"crawl {args.crawl} {'paused: consumers lease nothing' if args.paused else 'resumed'}")
    return 0


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_host_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                      command: Command, common: tuple[Option, ...]) -> None:
    """Register ``hosts [set|block]``, ``pause`` and ``resume`` on the crawlq parser."""
    hosts = sub.add_parser("hosts", help="list the crawl's hosts; change or block one",
                           description="List the crawl's hosts (sorted, paged), or "
                           "change one host's settings while the crawl runs.")
    add_options(hosts, common)
    add_options(hosts, (
        JSON,
        Option("--sort", "CRAWLQ_HOSTS_SORT", "queued",
               f"column to sort by: {', '.join(SORT_COLUMNS)} (in flight, done and last "
               "request are shown, not sortable)", type=_sort_column),
        Option("--asc", "CRAWLQ_HOSTS_ASC", False, "smallest first", flag_only_bool=True),
        Option("--offset", "CRAWLQ_HOSTS_OFFSET", 0, "skip this many hosts",
               type=_non_negative_int),
        Option("--limit", "CRAWLQ_HOSTS_LIMIT", 50, "show at most this many (1..1000)",
               type=int),
        Option("--groups", "CRAWLQ_HOSTS_GROUPS", False, "list the politeness groups "
               "(politeness_key domain or ip) instead, most in flight first",
               flag_only_bool=True),
    ))
    hosts.set_defaults(handler=cmd_hosts)
    hosts_sub = hosts.add_subparsers(dest="hosts_command", metavar="ACTION")
    p = hosts_sub.add_parser("set", help="change one host's delay, concurrency or budget",
                             description="Change one host's settings; they override the "
                             "crawl's defaults (the consumers' flags) until cleared.")
    add_options(p, common)
    p.add_argument("host", help="the host (example.com, example.com:8080, or a URL)")
    p.add_argument("--delay", type=duration, default=None,
                   help="least time between requests to it (e.g. 2s)")
    p.add_argument("--concurrency", type=_non_negative_int, default=None,
                   help="most requests in flight to it (0 = no limit)")
    p.add_argument("--budget", type=_non_negative_int, default=None,
                   help="most pages to fetch from it (pages that got a response); the rest "
                        "wait, parked, until the budget is raised or cleared")
    p.add_argument("--clear", action="append", default=[],
                   choices=("delay", "concurrency", "budget"),
                   help="back to the crawl's default (repeatable)")
    p.set_defaults(handler=cmd_hosts_set)
    p = hosts_sub.add_parser("group-set", help="change one politeness group's delay or "
                             "concurrency", description="Change one politeness group's "
                             "settings (politeness_key domain or ip); they override the "
                             "crawl's group_delay and group_concurrency until cleared.")
    add_options(p, common)
    p.add_argument("group", help="the group: a registrable domain (example.com), or "
                   "an address under politeness_key ip (192.0.2.7)")
    p.add_argument("--delay", type=duration, default=None,
                   help="least time between requests to its hosts (e.g. 2s)")
    p.add_argument("--concurrency", type=_non_negative_int, default=None,
                   help="most requests in flight to its hosts (0 = no limit)")
    p.add_argument("--clear", action="append", default=[], choices=("delay", "concurrency"),
                   help="back to the crawl's default (repeatable)")
    p.set_defaults(handler=cmd_hosts_group_set)
    p = hosts_sub.add_parser("block", help="send one host nothing for a while",
                             description="Block one host for the whole fleet (--for 0 "
                                         "unblocks).")
    add_options(p, common)
    p.add_argument("host", help="the host (example.com, example.com:8080, or a URL)")
    p.add_argument("--for", dest="for_", type=duration, required=True,
                   help="how long, e.g. 10m; 0 unblocks")
    p.set_defaults(handler=cmd_hosts_block)
    command("pause", "pause the crawl: consumers stay up and lease nothing").set_defaults(
        handler=cmd_pause, paused=True)
    command("resume", "resume a paused crawl").set_defaults(handler=cmd_pause, paused=False)
