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
``crawlq crawl create|show|set``   a crawl's policy (``console.cli_crawl``): create it
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
                                   to ``--out`` or ``--sink`` (``console.run_spider``)
=================================  =====================================================

Exit codes: 0 done; 1 ``check`` found a problem (``run``: a timeout, a consumer failed);
2 usage error (unknown crawl, missing ``--yes``); 3 Redis unreachable or refusing; 6
``run``'s PostgreSQL sink can't be reached; 7 ``fsck`` found problems it did not repair;
8 ``run`` could fetch nothing; 9 ``run``'s routes raised and delivered no item.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
from redis.exceptions import (
    RedisError,
)

from common import codec
from common.config import (
    CLI_REDIS_WAIT_S,
    COMMON_OPTIONS,
    JSON,
    Option,
    add_options,
    duration,
)
from common.errors import BadRequestError, ConfigError, CrawlqError, MalformedTaskError
from common.exitcodes import EXIT_FAIL, EXIT_INCONSISTENT, EXIT_OK, EXIT_REDIS, EXIT_USAGE
from common.fleet.workers import read_workers
from common.keys import CRAWLS, CrawlKeys
from common.observability.logs import setup_logging
from common.queue import CrawlFormatError, CrawlQueue, CrawlSettings, migrate_crawl
from common.redis.connection import RedisClient, connect, open_redis
from common.redis.durability import EVICTION_ADVICE, ServerSettings, server_settings
from common.redis.errors import redis_error_message
from common.redis.startup import RedisGaveUpError, StartupWait
from common.runtime import run_loop
from common.tasks.task import decode_entry
from common.urls.redact import redact_url
from console.cli_crawl import add_crawl_commands
from console.cli_hosts import add_host_commands
from console.cli_proxies import add_proxy_commands
from console.cli_render import add_render_commands
from console.cli_traps import add_trap_commands
from console.crawls import crawl_keys, delete_crawl, summaries, summary
from console.dashboard.command import DASHBOARD_OPTIONS, cmd_dashboard
from console.deadletters import select_dead
from console.demo.run import DEMO_OPTIONS, run_demo
from console.fsck import fsck, report_text
from console.losses import advice
from console.run_spider import RUN_OPTIONS, run_spider

__all__ = ["EXIT_FAIL", "EXIT_INCONSISTENT", "EXIT_OK", "EXIT_REDIS", "EXIT_USAGE",
           "build_parser", "main", "main_async", "redis_error_message"]

WATCH_EVERY_S = 2.0
#: After Ctrl-C, how long ``stats --watch`` waits for a read in flight.
WATCH_STOP_GRACE_S = 1.0


class UsageError(CrawlqError):
    """The command line asked for something that can't be done as asked."""




# -- helpers ------------------------------------------------------------------------------


def _when(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _emit(obj: Any) -> None:
    print(codec.dumps(obj), flush=True)


async def _queue(client: RedisClient, crawl: str) -> CrawlQueue:
    try:
        return await CrawlQueue.existing(client, crawl)
    except CrawlFormatError as exc:  # its message says what to do
        raise UsageError(str(exc)) from None
    except ConfigError as exc:
        raise UsageError(f"{exc} (crawlq crawls lists them)") from None


def _stats_text(doc: dict[str, Any]) -> str:
    st = doc["states"]
    lines = [f"crawl {doc['crawl']} (partitions {doc['settings']['partitions']}, "
             f"dedup {doc['settings']['dedup']})" + ("  PAUSED" if doc["paused"] else "")]
    lines += [f"  {name:<8} {st[name]:>10,}" for name in
              ("pending", "leased", "waiting", "dead", "done")]
    r = doc["rates"]
    if r is None:
        lines.append("rates: n/a (needs two history snapshots: are consumers running?)")
    else:
        shown = [f"{k[:-6]} {v:,.1f}/s" for k, v in r.items() if k.endswith("_per_s")
                 and k[:-6] in ("done", "failed", "enqueued", "leased", "dead", "retried")]
        lines.append(f"rates (last {r['window_s']:.0f}s): " + (", ".join(shown) or "n/a"))
    counters = {k: v for k, v in doc["counters"].items() if v}
    if counters:
        lines.append("counters: " + ", ".join(f"{k} {v:,}" for k, v in counters.items()))
    if doc["links"]:
        lines.append("links not followed: " + ", ".join(
            f"{k} {v:,} ({advice(k)})" if k == "too_deep" else f"{k} {v:,}"
            for k, v in sorted(doc["links"].items(), key=lambda kv: -kv[1])))
    reasons = {k: v for k, v in doc["dead_reasons"].items() if v}
    lines.append("dead letters by reason: "
                 + (", ".join(f"{k} {v:,}" for k, v in reasons.items()) or "none"))
    lines.append(f"hosts with work and a free slot: {doc['hosts_due']:,}")
    if doc.get("parked"):
        lines.append(f"parked (pending on hosts past their page budget): {doc['parked']:,}")
    if doc.get("render_pending"):
        lines.append(f"render requests pending (for consumers with --browser): "
                     f"{doc['render_pending']:,}")
    if doc["revisits"] is not None:
        lines.append(_revisits_text(doc["revisits"]))
    lines.append(f"live workers: {doc['workers']}")
    return "\n".join(lines)


def _late(seconds: float | str | None) -> str:
    if seconds is None:
        return "-"
    return "over 1d" if seconds == "+Inf" else f"<= {seconds:g}s"


def _revisits_text(rv: dict[str, Any]) -> str:
    return (f"revisits: {rv['scheduled']:,} scheduled, {rv['due']:,} due now, "
            f"{rv['revisits']:,} brought back (late p50 {_late(rv['late_p50_s'])}, p99 "
            f"{_late(rv['late_p99_s'])}); found not_modified {rv['not_modified']:,}, "
            f"unchanged {rv['unchanged']:,}, changed {rv['changed']:,}")


# -- subcommands --------------------------------------------------------------------------


def _show_stats(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    if args.json:
        _emit(doc)
        return
    text = _stats_text(doc)
    if args.watch:
        # Home, clear to the end of the screen, redraw: no scrolling, no flicker.
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        text = f"\x1b[H\x1b[J{text}\n\n{stamp}  every {WATCH_EVERY_S:g}s, Ctrl-C quits"
    print(text, flush=True)


async def cmd_stats(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await _queue(client, args.crawl)
    if args.watch:
        return await _watch_stats(args, queue)
    _show_stats(args, (await summary(queue)).to_json())
    return EXIT_OK


async def _watch_stats(args: argparse.Namespace, queue: CrawlQueue) -> int:
    """Redraw every WATCH_EVERY_S until SIGINT or SIGTERM, then exit 0.

    The signals set an event; nothing is cancelled mid-call. A cancelled task is not a
    reliable way out: Python 3.11's ``asyncio.wait_for`` (redis-py's socket writes and
    reads) swallows a cancellation that lands as its I/O completes, and the watch went on
    drawing after Ctrl-C. The handlers are the loop's own, so a SIGINT its parent ignores
    (``crawlq stats --watch &`` in a script inherits SIG_IGN) still ends it.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            reading = asyncio.ensure_future(summary(queue))
            await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                # A read in flight is given a moment to finish; one that doesn't (a Redis
                # gone silent) is cancelled when the loop closes.
                await asyncio.wait({reading}, timeout=WATCH_STOP_GRACE_S)
                return EXIT_OK
            _show_stats(args, reading.result().to_json())
            await asyncio.wait({stopped}, timeout=WATCH_EVERY_S)
            if stop.is_set():
                return EXIT_OK
    finally:
        stopped.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def cmd_workers(args: argparse.Namespace, client: RedisClient) -> int:
    live = (await read_workers(client, args.crawl)).workers
    if args.json:
        _emit([w.to_json() for w in live])
        return EXIT_OK
    if not live:
        print(f"no live workers in crawl {args.crawl}")
        return EXIT_OK
    width = max(2, *(len(w.id) for w in live))
    print(f"{'id':<{width}} {'host':<20} {'pid':>7} {'age':>7} {'in_flight':>9} {'done':>9} "
          f"{'failed':>7} {'pages/s':>8}  started")
    for w in live:
        late = "  (late)" if w.stale else ""
        print(f"{w.id:<{width}} {w.host[:20]:<20} {w.pid:>7} {w.age_ms / 1000:>6.1f}s "
              f"{w.in_flight:>9} {w.done:>9} {w.failed:>7} {w.pages_per_s:>8.1f}  "
              f"{_when(w.started_ms) if w.started_ms else '-'}{late}")
    return EXIT_OK


async def cmd_dead_ls(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await _queue(client, args.crawl)
    dead = await queue.dead_list(reason=args.reason, limit=args.limit)
    if args.json:
        _emit([{"id": d.id, "partition": d.partition, "reason": d.reason,
                "message": d.message, "died_at_ms": d.died_at_ms, "attempts": d.attempts,
                "url": d.url} for d in dead])
        return EXIT_OK
    if not dead:
        which = f" with reason {args.reason}" if args.reason else ""
        print(f"no dead tasks{which} in crawl {args.crawl}")
        return EXIT_OK
    for d in dead:
        print(f"{d.id}  {d.reason:<18} attempts {d.attempts}  {_when(d.died_at_ms)}  "
              f"{d.url or '-'}  {d.message[:120]}")
    return EXIT_OK


async def cmd_dead_show(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await _queue(client, args.crawl)
    dead = await queue.dead_get(args.id)
    if dead is None:
        raise UsageError(f"no dead task {args.id} in crawl {args.crawl} (crawlq dead ls "
                         "lists them)")
    doc: dict[str, Any] = {"id": dead.id, "partition": dead.partition, "reason": dead.reason,
                           "message": dead.message, "died_at_ms": dead.died_at_ms,
                           "attempts": dead.attempts, "url": dead.url}
    try:
        task = decode_entry(dead.raw) if dead.raw else None
    except MalformedTaskError:
        task = None
    if task is not None:
        doc.update(method=task.method, label=task.label, data=task.data, depth=task.depth)
    if args.json:
        _emit(doc)
        return EXIT_OK
    doc["died_at"] = _when(dead.died_at_ms)
    for name in ("id", "url", "method", "label", "data", "depth", "reason", "attempts",
                 "died_at", "message"):
        if doc.get(name) not in (None, {}, ""):
            value = doc[name]
            print(f"{name.replace('_', ' '):<9} "
                  f"{codec.dumps(value) if isinstance(value, dict) else value}")
    return EXIT_OK


async def _dead_targets(args: argparse.Namespace, queue: CrawlQueue) -> list[str]:
    try:
        return await select_dead(queue, ids=args.ids, reason=args.reason, every=args.all)
    except BadRequestError as exc:
        raise UsageError(str(exc)) from None


async def cmd_dead_requeue(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await _queue(client, args.crawl)
    ids = await _dead_targets(args, queue)
    moved = await queue.dead_requeue(ids)
    print(f"requeued {moved} of {len(ids)} dead tasks in crawl {args.crawl}"
          + ("" if moved == len(ids) else " (the others were not dead)"))
    return EXIT_OK


async def cmd_dead_purge(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await _queue(client, args.crawl)
    ids = await _dead_targets(args, queue)
    if not args.yes:
        print(f"would purge {len(ids)} dead tasks from crawl {args.crawl}; nothing deleted. "
              "Add --yes to delete them for good", file=sys.stderr)
        return EXIT_USAGE
    purged = await queue.dead_purge(ids)
    print(f"purged {purged} of {len(ids)} dead tasks from crawl {args.crawl}")
    return EXIT_OK


async def cmd_crawls(args: argparse.Namespace, client: RedisClient) -> int:
    found, _ = await summaries(client, limit=10**9)
    rows: list[dict[str, Any]] = [
        {"crawl": c, "settings": None, "states": None} if isinstance(c, str) else
            {**c.to_json(), "enqueued": c.stats.counters.get("enqueued", 0)} for c in found]
    if args.json:
        _emit(rows)
        return EXIT_OK
    if not rows:
        print("no crawls in this Redis")
        return EXIT_OK
    width = max(5, *(len(r["crawl"]) for r in rows))
    print(f"{'crawl':<{width}} {'parts':>5} {'dedup':<6} {'pending':>10} {'leased':>8} "
          f"{'waiting':>8} {'dead':>8} {'done':>10} {'enqueued':>10}")
    for r in rows:
        if r["states"] is None:
            print(f"{r['crawl']:<{width}} (no settings: partly deleted? crawlq reset "
                  f"--crawl {r['crawl']} --yes removes it)")
            continue
        st = r["states"]
        print(f"{r['crawl']:<{width}} {r['settings']['partitions']:>5} "
              f"{r['settings']['dedup']:<6} {st['pending']:>10,} {st['leased']:>8,} "
              f"{st['waiting']:>8,} {st['dead']:>8,} {st['done']:>10,} {r['enqueued']:>10,}")
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


async def _check_http(url: str, timeout_s: float) -> str | None:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
                s.get(url) as resp:
            if resp.status >= 300:
                return f"{url} answered HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"{url} did not answer: {type(exc).__name__}: {exc}"
    return None


def _evicting(nodes: list[ServerSettings]) -> str | None:
    """The problem of an evicting server (or Cluster primary), if any."""
    for n in nodes:
        if n.evicting:
            return f"Redis at {n.node} has maxmemory-policy {n.eviction}: {EVICTION_ADVICE}"
    return None


async def cmd_check(args: argparse.Namespace, client: RedisClient) -> int:
    problem: str | None = None
    nodes: list[ServerSettings] = []
    try:
        async with asyncio.timeout(args.timeout):
            await client.ping()
            raw = await client.hget(CrawlKeys.build(args.crawl).meta, "settings")
            if raw is not None:
                CrawlSettings.from_json(raw, args.crawl)
            nodes = await server_settings(client)
    except TimeoutError:
        problem = f"Redis at {redact_url(args.redis_url)} did not answer in {args.timeout:g}s"
    except RedisError as exc:
        problem = redis_error_message(exc, args.redis_url) or f"Redis error: {exc}"
    except (ValueError, KeyError, CrawlqError) as exc:
        problem = f"crawl {args.crawl} has unreadable settings: {exc}"
    if problem is None:
        problem = _evicting(nodes)
    if problem is None and args.http_url:
        problem = await _check_http(args.http_url, args.timeout)
    if problem is not None:
        print(f"unhealthy: {problem}")
    else:
        print(f"ok: Redis at {redact_url(args.redis_url)} answers"
              + (f", {args.http_url} answers" if args.http_url else ""))
    for n in nodes:
        print(f"redis {n.node}: {n.text()}")
    for warning in filter(None, (n.listpack_warning() for n in nodes)):
        print(f"warning: {warning}")
    return EXIT_OK if problem is None else EXIT_FAIL


async def cmd_fsck(args: argparse.Namespace, client: RedisClient) -> int:
    if args.repair:  # a crawl of layout 2 or 3 is converted first (common.queue.migrate)
        await migrate_crawl(client, args.crawl)
    queue = await _queue(client, args.crawl)
    report = await fsck(queue, fix=args.repair)
    code = EXIT_OK if report.clean else EXIT_INCONSISTENT
    if args.json:
        _emit({**report.to_json(), "exit_code": code})
    else:
        print(report_text(report), flush=True)
    return code


# -- parser -------------------------------------------------------------------------------

_YES = Option("--yes", "CRAWLQ_YES", False, "really do it", flag_only_bool=True)
_REASON = Option("--reason", "CRAWLQ_DEAD_REASON", None, "only dead tasks with this reason")


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

    dead = sub.add_parser("dead", help="list, requeue or purge dead tasks")
    dead_sub = dead.add_subparsers(dest="dead_command", metavar="ACTION", required=True)

    def dead_command(name: str, help_text: str, *options: Option) -> argparse.ArgumentParser:
        p = dead_sub.add_parser(name, help=help_text, description=help_text)
        add_options(p, COMMON_OPTIONS)
        add_options(p, options)
        return p

    p = dead_command("ls", "list dead tasks, oldest first", _REASON, JSON,
                     Option("--limit", "CRAWLQ_DEAD_LIMIT", 50, "list at most this many",
                            type=int))
    p.set_defaults(handler=cmd_dead_ls)
    p = dead_command("show", "one dead task whole: its URL, request, reason and message "
                     "(a route error's file and line)", JSON)
    p.add_argument("id", metavar="ID", help="a task id (see crawlq dead ls)")
    p.set_defaults(handler=cmd_dead_show)
    for name, help_text, handler, extra in (
        ("requeue", "put dead tasks back in line with fresh attempts", cmd_dead_requeue, ()),
        ("purge", "delete dead tasks for good (needs --yes)", cmd_dead_purge, (_YES,)),
    ):
        p = dead_command(name, help_text, _REASON, *extra,
                         Option("--all", "CRAWLQ_DEAD_ALL", False, "every dead task",
                                flag_only_bool=True))
        p.add_argument("ids", nargs="*", metavar="ID", help="task ids (see crawlq dead ls)")
        p.set_defaults(handler=handler)

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
            _YES).set_defaults(handler=cmd_reset)
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


if __name__ == "__main__":
    sys.exit(main())
