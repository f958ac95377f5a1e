"""``crawlq``: the operator command.

Subcommands (each takes the common options: --redis-url, --crawl, --log-level, ...):

=================================  =====================================================
``crawlq stats [--json] [--watch]`` every state's count, counters, rates over the last
                                   minute, dead letters by reason, live workers
``crawlq workers [--json]``        live consumers with heartbeat age and in-flight counts
``crawlq dead ls``                 dead tasks (``--reason R``, ``--limit N``, ``--json``)
``crawlq dead show ID``            one dead task whole (``--json``)
``crawlq dead requeue``            put dead tasks back in line (``ID...``, ``--reason R``
                                   or ``--all``)
``crawlq dead purge ... --yes``    delete dead tasks for good
``crawlq crawls [--json]``         the crawls in this Redis with their sizes
``crawlq crawl create|show|set``   a crawl's policy (``console.cli.crawl``): create it
                                   (``--config FILE``, ``KEY=VALUE``), show it (``--json``,
                                   ``--toml``), change it (``KEY=VALUE ...``)
``crawlq dashboard``               the web dashboard (``--http-host``, ``--http-port``,
                                   ``--token``)
``crawlq reset --crawl C --yes``   delete every key of one crawl, nothing else
``crawlq check``                   0 if Redis answers and does not evict keys (and
                                   --http-url answers, if given), else 1; prints the
                                   server's eviction policy, persistence and replicas
``crawlq fsck [--repair] [--json]`` check a crawl's invariants (every task in one state,
                                   counts, ``due``, the revisit schedule); ``--repair``
                                   converts a crawl of layout 2 or 3 first, then fixes
                                   the counts, ``due`` and the schedule (``console.fsck``)
``crawlq demo``                    a local Redis, a sample site, a producer, two consumers
                                   (``--serve``: only the sample site, for a spider)
``crawlq run SPIDER``              a spider end to end on this machine: Redis, the producer
                                   on its start requests, consumers on its routes, items
                                   to ``--out`` or ``--sink`` (``console.run.command``)
=================================  =====================================================

Exit codes: 0 done; 1 ``check`` found a problem (``run``: a timeout, a consumer failed);
2 usage error (unknown crawl, missing ``--yes``); 3 Redis unreachable or refusing; 6
``run``'s PostgreSQL sink can't be reached; 7 ``fsck`` found problems it did not repair;
8 ``run`` could fetch nothing; 9 ``run``'s routes raised and delivered no item.

Here: the parser, the dispatch and ``main``. Each command group is a module of its own:
`stats` (stats, workers, crawls), `dead`, `crawl` (a crawl's policy, reset), `hosts`
(hosts, pause, resume), `traps`, `render`, `proxies` (proxies, sessions), `checks`
(check, fsck); `output` holds what they share. ``crawlq dashboard``, ``demo`` and
``run`` are ``console.dashboard``, ``console.demo`` and ``console.run``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from redis.exceptions import RedisError

from common.config import (
    CLI_REDIS_WAIT_S,
    COMMON_OPTIONS,
    JSON,
    Option,
    add_options,
    duration,
)
from common.errors import ConfigError
from common.exitcodes import EXIT_REDIS, EXIT_USAGE
from common.observability.logs import setup_logging
from common.redis.connection import RedisClient, connect, open_redis
from common.redis.errors import redis_error_message
from common.redis.startup import RedisGaveUpError, StartupWait
from common.runtime import run_loop
from console.cli.checks import cmd_check, cmd_fsck
from console.cli.crawl import add_crawl_commands, cmd_reset
from console.cli.dead import add_dead_commands
from console.cli.hosts import add_host_commands
from console.cli.output import YES, UsageError
from console.cli.proxies import add_proxy_commands
from console.cli.render import add_render_commands
from console.cli.stats import cmd_crawls, cmd_stats, cmd_workers
from console.cli.traps import add_trap_commands
from console.dashboard.command import DASHBOARD_OPTIONS, cmd_dashboard
from console.demo.run import DEMO_OPTIONS, run_demo
from console.run.command import RUN_OPTIONS, run_spider
from console.views.crawls import crawl_keys

__all__ = ["build_parser", "main", "main_async"]


# -- parser -------------------------------------------------------------------------------



def build_parser() -> argparse.ArgumentParser:
    """The ``crawlq`` parser; every option also reads a CRAWLQ_* variable."""
    parser = argparse.ArgumentParser(
        prog="crawlq", description="Operate crawlq crawls: stats, workers, dead letters, "
        "crawls and their policy, a web dashboard, reset, health check, and a local demo.",
        epilog="exit codes: 0 ok, 1 check failed (run: a timeout or a consumer failed), 2 "
               "usage error, 3 Redis unreachable or refused, 6 run's postgres sink "
               "unreachable, 7 fsck found problems it did not repair, 8 run fetched nothing, "
               "9 run's routes raised and delivered no item")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, *options: Option) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_options(p, COMMON_OPTIONS)
        add_options(p, options)
        return p

    p = command("stats", "counts of every state, rates, dead letters, live workers", JSON,
                Option("--watch", "CRAWLQ_WATCH", False, "redraw every 2 s until Ctrl-C",
                       flag_only_bool=True))
    p.set_defaults(handler=cmd_stats)
    command("workers", "live consumers with heartbeat age and in-flight counts",
            JSON).set_defaults(handler=cmd_workers)

    add_dead_commands(sub, COMMON_OPTIONS)
    add_host_commands(sub, command, COMMON_OPTIONS)
    add_trap_commands(sub, COMMON_OPTIONS)
    add_render_commands(sub, COMMON_OPTIONS)
    add_proxy_commands(sub, COMMON_OPTIONS)
    command("crawls", "the crawls in this Redis with their sizes",
            JSON).set_defaults(handler=cmd_crawls)
    add_crawl_commands(sub, COMMON_OPTIONS)
    command("dashboard", "serve the web dashboard (read-only unless --token is set)",
            *DASHBOARD_OPTIONS).set_defaults(handler=cmd_dashboard)
    command("reset", "delete every key of one crawl (--crawl), and nothing else",
            YES).set_defaults(handler=cmd_reset)
    command("check", "health check: exit 0 if Redis answers and does not evict keys "
            "(maxmemory-policy noeviction), and --http-url answers; else 1. Shows the "
            "server's eviction policy, persistence and replicas",
            Option("--http-url", "CRAWLQ_CHECK_HTTP_URL", None,
                   "also GET this URL, e.g. a consumer's http://127.0.0.1:9410/healthz"),
            Option("--timeout", "CRAWLQ_CHECK_TIMEOUT", 3.0, "give up after this long",
                   type=duration)).set_defaults(handler=cmd_check)

    command("fsck", "check a crawl's invariants (every task in one state, counts, due); "
            "exit 7 when problems are left", JSON,
            Option("--repair", "CRAWLQ_FSCK_REPAIR", False, "convert a crawl of layout 2 or 3, "
                   "fix the counts and due, then check again",
                   flag_only_bool=True)).set_defaults(handler=cmd_fsck)

    p = sub.add_parser("demo", help="run a local crawl end to end: Redis, a sample site, "
                       "a producer and two consumers (under a minute)",
                       description="Starts Redis (REDIS_URL, or an embedded redis-server), "
                       "a sample site, the producer and two consumers; shows progress and "
                       "a summary, then stops everything it started.")
    add_options(p, DEMO_OPTIONS)
    p.set_defaults(handler=None)
    p = sub.add_parser("run", help="run a spider end to end on this machine: Redis, the "
                       "producer on its start requests, consumers on its routes, items",
                       description="Loads the spider (path/to/spider.py, path/to/spider.py:obj "
                       "or module:obj), starts Redis (REDIS_URL, or an embedded "
                       "redis-server), the producer and --consumers consumers with --spider; "
                       "shows progress and a summary, writes the items to --out (or hands "
                       "them to --sink), then stops everything it started.")
    p.add_argument("spider", help="path/to/spider.py[:obj] or module:obj")
    add_options(p, RUN_OPTIONS)
    p.set_defaults(handler=None)
    return parser


def startup_wait(args: argparse.Namespace) -> StartupWait:
    """How long a command waits for Redis before its first call: --redis-wait, or
    CLI_REDIS_WAIT_S (a Redis restarting, a failover); silent until it gives up."""
    return StartupWait(args.redis_url, args.redis_wait or CLI_REDIS_WAIT_S)


async def _answering(args: argparse.Namespace) -> RedisClient:
    """A client of --redis-url that Redis has answered (a PING when the client did not
    ask the server anything yet)."""
    cluster = {"yes": True, "no": False}.get(args.cluster)
    client = await open_redis(args.redis_url, cluster=cluster,
                              wait_replicas=args.redis_wait_replicas,
                              wait_timeout_s=args.redis_wait_timeout)
    try:
        await client.ping()
    except BaseException:
        await client.aclose()
        raise
    return client


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return await run_demo(args, crawl_keys=crawl_keys)
    if args.command == "run":
        return await run_spider(args)
    handler: Callable[[argparse.Namespace, RedisClient], Awaitable[int]] = args.handler
    client: RedisClient | None = None
    try:
        if args.command == "check":  # a probe: its --timeout is its wait
            client = connect(args.redis_url, retries=0, socket_timeout=args.timeout)
        else:
            client = await startup_wait(args).step("connect", lambda: _answering(args))
        return await handler(args, client)
    except (UsageError, ConfigError) as exc:
        print(f"crawlq: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RedisGaveUpError as exc:
        print(f"crawlq: {exc}", file=sys.stderr)
        return EXIT_REDIS
    except RedisError as exc:
        message = redis_error_message(exc, args.redis_url)
        if message is None:
            raise
        print(f"crawlq: {message}", file=sys.stderr)
        return EXIT_REDIS
    finally:
        if client is not None:
            await client.aclose()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    try:
        args = build_parser().parse_args(argv)
        setup_logging(args.log_level, args.log_format)
    except SystemExit as exc:
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"crawlq: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return args


async def main_async(argv: Sequence[str] | None = None) -> int:
    """``main`` for a caller that already runs an event loop (the tests)."""
    args = _parse(argv)
    if isinstance(args, int):
        return args
    return await _dispatch(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``crawlq`` command; returns the exit code."""
    args = _parse(argv)
    if isinstance(args, int):
        return args
    try:
        return run_loop(_dispatch(args))
    except asyncio.CancelledError:  # the demo, ended by SIGTERM
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 130

