"""``crawlq proxies``: the crawl's proxy pool: each proxy's health, the hosts that ban
some of them or moved up a tier. URLs are shown with their credentials redacted.
``crawlq sessions``: the crawl's sessions, newest first: never a cookie's value."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from common.config import JSON, Option, add_options
from common.frontier.proxy_pool import MAX_HOSTS, PoolSummary, read_summary
from common.proxies.sessions import SessionRow, list_sessions
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from console.cli.output import at_most


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def proxies_text(found: PoolSummary) -> str:
    """One line per proxy, then one per host that bans some or is past the first tier."""
    if not found.proxies:
        return ("no proxy has reported yet (consumers report theirs once they fetch "
                "through them: crawlq-consumer --proxy [TIER=]URL)")
    width = max(len(p.shown) for p in found.proxies)
    lines = [f"tiers: {' > '.join(found.tiers)}",
             f"{'proxy':<{width}}  {'id':<12}  {'tier':<12} {'ok':>7} {'fail':>6} "
             f"{'bans':>5} {'banned by':>9} {'lat':>6}  state"]
    for p in found.proxies:
        state = (f"quarantined {_age(p.quarantined_s)} more (#{p.level})"
                 if p.state == "quarantined" else "ok")
        lat = f"{p.lat_ms}ms" if p.lat_ms >= 0 else "-"
        lines.append(f"{p.shown:<{width}}  {p.id:<12}  {p.tier:<12} {p.ok:>7} {p.fail:>6} "
                     f"{p.ban:>5} {p.banned_by:>9} {lat:>6}  {state}")
    if found.hosts:
        lines.append("")
        lines.append(f"hosts that ban proxies or moved up a tier ({found.hosts_total}):")
        hw = max(len(h.host) for h in found.hosts)
        for h in found.hosts:
            banned = ", ".join(h.banned) or "-"
            lines.append(f"{h.host:<{hw}}  tier {h.tier:<12} bans at tier {h.bans_at_tier:<3} "
                         f"banned: {banned}")
    return "\n".join(lines)


async def cmd_proxies(args: argparse.Namespace, client: RedisClient) -> int:
    """Show the crawl's proxy pool."""
    found = await read_summary(client, args.crawl, args.limit)
    if args.json:
        print(json.dumps(found.to_json()))
    else:
        print(proxies_text(found))
    return 0


def sessions_text(rows: list[SessionRow], total: int) -> str:
    """One line per session: name, pool host, state, version, uses, blocks, cookies."""
    if not rows:
        return "no session yet"
    width = max(len(r.name) for r in rows)
    lines = [f"{'session':<{width}}  {'pool host':<24} {'state':<8} {'version':>7} "
             f"{'uses':>6} {'blocks':>6} {'cookies':>7}  proxy"]
    lines += [f"{r.name:<{width}}  {r.host or '-':<24} {r.state:<8} {r.version:>7} "
              f"{r.uses:>6} {r.bans:>6} {r.cookies:>7}  {r.proxy or '-'}" for r in rows]
    if total > len(rows):
        lines.append(f"({len(rows)} of {total}, the newest)")
    return "\n".join(lines)


async def cmd_sessions(args: argparse.Namespace, client: RedisClient) -> int:
    """Show the crawl's sessions (no cookie value: cookies are credentials)."""
    await CrawlQueue.existing(client, args.crawl)
    rows, total = await list_sessions(client, args.crawl, args.limit)
    if args.json:
        print(json.dumps({"sessions": [asdict(r) for r in rows], "total": total}))
    else:
        print(sessions_text(rows, total))
    return 0


def add_proxy_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       common: tuple[Option, ...]) -> None:
    """Register ``proxies`` on the crawlq parser."""
    p = sub.add_parser("proxies", help="the crawl's proxy pool: health, bans per host, tiers",
                       description="Show each proxy of the crawl's pool (successes, "
                       "failures, bans, quarantine, response time; URLs redacted) and the "
                       "hosts that ban some of them or moved up a tier.")
    add_options(p, common)
    add_options(p, (JSON, Option("--limit", "CRAWLQ_PROXIES_LIMIT", 50,
                                 f"show at most this many hosts (1..{MAX_HOSTS})",
                                 type=at_most(MAX_HOSTS))))
    p.set_defaults(handler=cmd_proxies)
    p = sub.add_parser("sessions", help="the crawl's sessions: uses, blocks, cookies held",
                       description="Show the crawl's sessions, newest first: pool host, "
                       "state, version, uses, blocks, how many cookies (never a value).")
    add_options(p, common)
    add_options(p, (JSON, Option("--limit", "CRAWLQ_SESSIONS_LIMIT", 50,
                                 f"show at most this many sessions (1..{MAX_HOSTS})",
                                 type=at_most(MAX_HOSTS))))
    p.set_defaults(handler=cmd_sessions)
