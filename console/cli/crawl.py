"""``crawlq crawl create|show|keys|set``: a crawl's policy, the one place its fleet-wide values
live (``common.policy``).

Values are ``KEY=VALUE`` words in the flags' syntax (``per_host_delay=1s``,
``per_host_concurrency=2``, ``ignore_robots=true``, ``allow_domains=a.example,b.example``),
or a flat TOML file (``create --config``, what ``show --toml`` prints). Every value is
checked before anything is written: a bad one exits 2 naming the key, the value and the
valid keys, and changes nothing.

``crawlq reset --crawl C --yes``: every key of one crawl deleted, and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.config import Option, add_options
from common.errors import ConfigError
from common.exitcodes import EXIT_OK, EXIT_USAGE
from common.keys import CRAWLS
from common.policy import (
    POLICY_OPTIONS,
    VALID_KEYS,
    NoPolicyError,
    StoredPolicy,
    create_policy,
    legacy_conf,
    parse_assignments,
    parse_toml,
    read_policy,
    set_policy,
    to_toml,
)
from common.queue import existing_settings, partition_keys
from common.redis.connection import RedisClient
from console.cli.output import when
from console.views.crawls import crawl_keys, delete_crawl

Command = Callable[..., argparse.ArgumentParser]
#: Log entries ``crawl show`` lists in its text form.
SHOWN_LOG = 5


def _change_text(entry: dict[str, Any]) -> str:
    changes = ", ".join(f"{k} {'-' if old is None else old} -> {new}"
                        for k, (old, new) in sorted(entry.get("changes", {}).items()))
    return (f"  {when(entry.get('at', 0))}  v{entry.get('version')}  "
            f"{entry.get('by', '?')}: {changes}")


def policy_text(crawl: str, stored: StoredPolicy) -> str:
    """``crawlq crawl show``'s text form: version, values, the newest changes."""
    texts = stored.policy.texts()
    width = max(len(o.name) for o in POLICY_OPTIONS)
    lines = [f"crawl {crawl}: policy version {stored.version}"]
    lines += [f"  {o.name:<{width}}  {texts[o.name]:<8} {o.help}" for o in POLICY_OPTIONS]
    lines.append("changes, newest first:" if stored.log else "no changes logged")
    lines += [_change_text(e) for e in stored.log[:SHOWN_LOG]]
    return "\n".join(lines)


def _summary(crawl: str, stored: StoredPolicy, what: str) -> str:
    values = ", ".join(f"{k}={v}" for k, v in stored.policy.texts().items())
    return f"crawl {crawl}: policy version {stored.version} {what}: {values}"


async def cmd_crawl_create(args: argparse.Namespace, client: RedisClient) -> int:
    """Create the crawl's policy from --config and KEY=VALUE words (over the defaults)."""
    values: dict[str, Any] = {}
    if args.config:
        try:
            # A small local file read once per command: blocking here is fine.
            text = Path(args.config).read_text(encoding="utf-8")  # noqa: ASYNC240
        except OSError as exc:
            raise ConfigError(f"cannot read --config {args.config}: {exc.strerror}") from None
        values |= parse_toml(text, f"--config {args.config}")
    values |= parse_assignments(args.assignments)
    stored = await create_policy(client, args.crawl, values, by="crawlq crawl create")
    print(_summary(args.crawl, stored, "created"))
    return EXIT_OK


async def cmd_crawl_show(args: argparse.Namespace, client: RedisClient) -> int:
    """Print the crawl's policy: text (with the newest changes), --json or --toml."""
    stored = await read_policy(client, args.crawl, log_limit=SHOWN_LOG if not args.json
                               else 50)
    if stored is None:
        legacy = await legacy_conf(client, args.crawl)
        if legacy is None:
            raise NoPolicyError(f"crawl {args.crawl} has no policy: create it with "
                                f"`crawlq crawl create --crawl {args.crawl}`")
        values = ", ".join(f"{k}={v}" for k, v in legacy.texts().items())
        raise NoPolicyError(
            f"crawl {args.crawl} has no policy object: an earlier crawlq made it, and its "
            f"partitions hold {values}. `crawlq crawl create --crawl {args.crawl}` adopts "
            "them (so does the next consumer or producer); nothing changes for the crawl")
    if args.json:
        print(json.dumps(stored.to_json(args.crawl)))
    elif args.toml:
        print(to_toml(stored.policy, args.crawl, stored.version), end="")
    else:
        print(policy_text(args.crawl, stored))
    return EXIT_OK


async def cmd_crawl_keys(args: argparse.Namespace, client: RedisClient) -> int:
    """Print each partition's hash tag and its ready-hosts ZSET (what a KEDA trigger
    reads): text, or --json."""
    parts = partition_keys(args.crawl, await existing_settings(client, args.crawl))
    if args.json:
        print(json.dumps([{"partition": pk.partition, "prefix": pk.prefix, "due": pk.due}
                          for pk in parts]))
    else:
        for pk in parts:
            print(f"partition {pk.partition}: {pk.due}")
    return EXIT_OK


async def cmd_crawl_set(args: argparse.Namespace, client: RedisClient) -> int:
    """Change some of the crawl's policy values; all checked first."""
    values = parse_assignments(args.assignments)
    before = await read_policy(client, args.crawl, log_limit=0)
    stored = await set_policy(client, args.crawl, values, by="crawlq crawl set")
    what = "unchanged" if before is not None and before.version == stored.version else "set"
    print(_summary(args.crawl, stored, what))
    return EXIT_OK


async def cmd_reset(args: argparse.Namespace, client: RedisClient) -> int:
    keys = await crawl_keys(client, args.crawl)
    known = await client.sismember(CRAWLS, args.crawl)
    if not keys and not known:
        print(f"no keys of crawl {args.crawl} in this Redis; nothing to do")
        return EXIT_OK
    if not args.yes:
        print(f"would delete {len(keys)} keys of crawl {args.crawl} (and nothing else); "
              "nothing deleted. Add --yes to do it", file=sys.stderr)
        return EXIT_USAGE
    deleted = await delete_crawl(client, args.crawl)
    print(f"deleted {deleted} keys of crawl {args.crawl}")
    return EXIT_OK


def add_crawl_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       common: tuple[Option, ...]) -> None:
    """Register ``crawl create|show|set`` on the crawlq parser."""
    keys_help = (f"KEY=VALUE in the flags' syntax; keys: {VALID_KEYS} "
                 "(e.g. per_host_delay=1s per_host_concurrency=2 ignore_robots=false "
                 "'user_agent=mybot/1.0 (+https://example.com/bot)')")
    crawl = sub.add_parser(
        "crawl", help="a crawl's policy: create, show or set it",
        description="A crawl's policy: the values the whole fleet shares (today the "
        "per-host delay and concurrency defaults, the content types read, the user agent, "
        "robots.txt on or off and how long it is cached, the link depth and domains "
        "followed, the retry backoff, stall and attempt limits, the recrawl window), "
        "versioned and logged in Redis.")
    crawl_sub = crawl.add_subparsers(dest="crawl_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        p = crawl_sub.add_parser(name, help=help_text, description=help_text)
        add_options(p, common)
        return p

    p = action("create", "create the crawl's policy (fails if it has one): the defaults, "
               "a --config TOML file over them, KEY=VALUE words over that")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="flat TOML: key = value lines (what crawl show --toml prints)")
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help=keys_help)
    p.set_defaults(handler=cmd_crawl_create)
    p = action("show", "the crawl's policy: version, values and its newest changes")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON document")
    fmt.add_argument("--toml", action="store_true",
                     help="flat TOML that crawl create --config reads back")
    p.set_defaults(handler=cmd_crawl_show)
    p = action("keys", "each partition's ready-hosts key (KEDA's redis trigger reads one "
               "per partition)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(handler=cmd_crawl_keys)
    p = action("set", "change the crawl's policy (a new version, logged); the fleet takes "
               "it on its next lease call, scheduled turns move to match")
    p.add_argument("assignments", nargs="+", metavar="KEY=VALUE", help=keys_help)
    p.set_defaults(handler=cmd_crawl_set)

