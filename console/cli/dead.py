"""``crawlq dead ls|show|requeue|purge``: a crawl's dead tasks, listed, shown whole, put
back in line or deleted for good (``purge`` needs ``--yes``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from common import codec
from common.config import JSON, Option, add_options
from common.errors import BadRequestError, MalformedTaskError
from common.exitcodes import EXIT_OK, EXIT_USAGE
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from common.tasks.task import decode_entry
from console.cli.output import YES, UsageError, emit, open_queue, when
from console.views.deadletters import select_dead

_REASON = Option("--reason", "CRAWLQ_DEAD_REASON", None, "only dead tasks with this reason")


async def cmd_dead_ls(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await open_queue(client, args.crawl)
    dead = await queue.dead_list(reason=args.reason, limit=args.limit)
    if args.json:
        emit([{"id": d.id, "partition": d.partition, "reason": d.reason,
                "message": d.message, "died_at_ms": d.died_at_ms, "attempts": d.attempts,
                "url": d.url} for d in dead])
        return EXIT_OK
    if not dead:
        which = f" with reason {args.reason}" if args.reason else ""
        print(f"no dead tasks{which} in crawl {args.crawl}")
        return EXIT_OK
    for d in dead:
        print(f"{d.id}  {d.reason:<18} attempts {d.attempts}  {when(d.died_at_ms)}  "
              f"{d.url or '-'}  {d.message[:120]}")
    return EXIT_OK


async def cmd_dead_show(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await open_queue(client, args.crawl)
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
        emit(doc)
        return EXIT_OK
    doc["died_at"] = when(dead.died_at_ms)
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
    queue = await open_queue(client, args.crawl)
    ids = await _dead_targets(args, queue)
    moved = await queue.dead_requeue(ids)
    print(f"requeued {moved} of {len(ids)} dead tasks in crawl {args.crawl}"
          + ("" if moved == len(ids) else " (the others were not dead)"))
    return EXIT_OK


async def cmd_dead_purge(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await open_queue(client, args.crawl)
    ids = await _dead_targets(args, queue)
    if not args.yes:
        print(f"would purge {len(ids)} dead tasks from crawl {args.crawl}; nothing deleted. "
              "Add --yes to delete them for good", file=sys.stderr)
        return EXIT_USAGE
    purged = await queue.dead_purge(ids)
    print(f"purged {purged} of {len(ids)} dead tasks from crawl {args.crawl}")
    return EXIT_OK



def add_dead_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: tuple[Option, ...]) -> None:
    """Register ``dead ls|show|requeue|purge`` on the crawlq parser."""
    dead = sub.add_parser("dead", help="list, requeue or purge dead tasks")
    dead_sub = dead.add_subparsers(dest="dead_command", metavar="ACTION", required=True)

    def dead_command(name: str, help_text: str, *options: Option) -> argparse.ArgumentParser:
        p = dead_sub.add_parser(name, help=help_text, description=help_text)
        add_options(p, common)
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
        ("purge", "delete dead tasks for good (needs --yes)", cmd_dead_purge, (YES,)),
    ):
        p = dead_command(name, help_text, _REASON, *extra,
                         Option("--all", "CRAWLQ_DEAD_ALL", False, "every dead task",
                                flag_only_bool=True))
        p.add_argument("ids", nargs="*", metavar="ID", help="task ids (see crawlq dead ls)")
        p.set_defaults(handler=handler)
