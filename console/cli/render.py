"""``crawlq render``: how a rendering=auto crawl fetches each host's routes (rendered, over
HTTP, or still probed), and an operator's decision for one (docs/rendering.md)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from common.config import JSON, Option, add_options
from common.hostmodel.hostkey import host_key
from common.queue import CrawlQueue
from common.queue.rendermodes import MODES, PROBES, Pair, RenderModes
from common.redis.connection import RedisClient


def render_text(pairs: list[Pair]) -> str:
    """One line per (host, route) pair: its mode, and its probes while probed."""
    if not pairs:
        return "no host's route probed or decided yet (the crawl's render is not auto, " \
               "or nothing rendered yet)"
    width = max(4, *(len(p.host) for p in pairs))
    lines = [f"{'host':<{width}} {'route':<16} mode"]
    for p in pairs:
        probes = f" ({p.same} of {p.probes} probes gave the same; {PROBES} decide)" \
            if p.mode == "probing" else ""
        lines.append(f"{p.host:<{width}} {p.label or '(default)':<16} {p.mode}{probes}")
    return "\n".join(lines)


async def _modes(client: RedisClient, crawl: str) -> RenderModes:
    await CrawlQueue.existing(client, crawl)  # the crawl exists, of this layout
    return RenderModes(client, crawl)


async def cmd_render(args: argparse.Namespace, client: RedisClient) -> int:
    """List each host's routes and how they are fetched."""
    pairs = await (await _modes(client, args.crawl)).pairs()
    if args.json:
        print(json.dumps({"pairs": [asdict(p) for p in pairs]}))
    else:
        print(render_text(pairs))
    return 0


async def cmd_render_set(args: argparse.Namespace, client: RedisClient) -> int:
    """Decide how one host's route is fetched (auto: the probes decide again)."""
    host = host_key(args.host) if "://" in args.host else args.host.lower()
    await (await _modes(client, args.crawl)).set_mode(host, args.route, args.mode)
    print(f"host {host} route {args.route or '(default)'}: {args.mode}")
    return 0


def add_render_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                        common: tuple[Option, ...]) -> None:
    """Register ``render`` and ``render set`` on the crawlq parser."""
    p = sub.add_parser("render", help="how a rendering=auto crawl fetches each host's routes",
                       description="List each (host, route) pair of a crawl whose policy "
                       "says rendering=auto: rendered, over HTTP, or still probed.")
    add_options(p, common)
    add_options(p, (JSON,))
    p.set_defaults(handler=cmd_render)
    render_sub = p.add_subparsers(dest="render_command", metavar="ACTION")
    s = render_sub.add_parser("set", help="decide how one host's route is fetched",
                              description="Fetch one host's route over HTTP or rendered "
                              "for good, or hand it back to the probes (auto).")
    add_options(s, common)
    s.add_argument("host", help="the host (example.com, example.com:8080, or a URL)")
    s.add_argument("--route", default=None, help="the route's label (none: the default "
                   "route)")
    s.add_argument("--mode", required=True, choices=MODES)
    s.set_defaults(handler=cmd_render_set)
