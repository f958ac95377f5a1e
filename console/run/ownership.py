"""What ``crawlq run`` does around its crawl: the crawl made its own at the start, the
items gathered by type at the end, and what it says and exits with.

A run owns its run: on a Redis of the user's own (``REDIS_URL``), the spider's crawl is
reset at the start (said, with what it held), unless ``--resume``, or unless consumers are
working on it (then the run refuses: give another ``--crawl``). The results of earlier
runs in ``--output`` are not carried over, so ``--out`` holds exactly this run's crawl's
items, one line a key, and an item of a type (a route's ``item_type``) goes to a file of
its own beside it (``items.jsonl`` -> ``items.review.jsonl``). With ``--sink postgres://``
the tables are counted instead.

The exit code says whether anything came of it (`run_exit`): 8 when nothing could be
fetched (every request ended without a response: the site down, refused by the SSRF
guard or robots.txt), 9 when routes raised and not one item was delivered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import codec
from common.errors import ConfigError
from common.exitcodes import EXIT_NOTHING_FETCHED, EXIT_OK, EXIT_ROUTES_FAILED
from common.fleet.workers import read_workers
from common.keys import CrawlKeys
from common.policy import read_values
from common.queue import CrawlQueue, Stats
from common.reasons import HANDLER_ERROR, ROBOTS_DISALLOWED
from common.redis.connection import RedisClient
from common.spider import Spider
from common.tasks.pgtarget import PostgresTarget, sink_problem
from common.traps.book import TrapBook
from console.views.crawls import delete_crawl
from console.views.losses import OWN, losses, outcomes

__all__ = ["ItemFile", "gather_items", "own_crawl", "pg_check", "pg_rows", "report",
           "run_exit", "type_path"]

#: Distinct route errors the summary shows, of the first dead letters it reads.
SHOWN_ERRORS = 3
ERRORS_READ = 200


async def own_crawl(client: RedisClient, crawl: str, *, resume: bool, where: str) -> str:
    """Make `crawl` this run's: reset it (what it held said), or keep it with `resume`.
    ConfigError when consumers are working on it (a fleet's crawl is not reset)."""
    keys = CrawlKeys.build(crawl)
    if not await client.exists(keys.meta):
        return ""
    live = [w for w in (await read_workers(client, crawl)).workers if not w.stale]
    if live:
        raise ConfigError(f"crawl {crawl!r} in {where} has {len(live)} live consumers "
                          f"(crawlq workers --crawl {crawl}): crawlq run won't reset a crawl "
                          "in use; give --crawl another name")
    s = await (await CrawlQueue.existing(client, crawl)).stats()
    held = (f"{s.done} done, {s.pending + s.leased + s.waiting} to do, {s.dead} dead "
            "from an earlier run")
    if resume:
        return f"going on with crawl {crawl} in {where} ({held}; --resume)"
    await delete_crawl(client, crawl)
    return (f"reset crawl {crawl} in {where} ({held}): each run starts its crawl afresh; "
            "--resume goes on with it instead")


@dataclass(frozen=True, slots=True)
class ItemFile:
    """The items of one type ("": none) a run gathered: how many and where."""

    type: str
    count: int
    path: str


def type_path(dest: Path, item_type: str) -> Path:
    """The file of `item_type`'s items beside `dest`: ``items.jsonl`` -> ``items.review.jsonl``
    (`dest` itself for items without a type)."""
    if not item_type:
        return dest
    return dest.with_name(f"{dest.stem}.{item_type}{dest.suffix or '.jsonl'}")


def gather_items(results: Path, dest: Path) -> list[ItemFile]:
    """Write the items of every JSONL record under `results` to `dest` (and each type's to
    its own file, `type_path`), one line per key of its type (the latest fetch's wins).
    `dest` is written whatever it gets: it never keeps an earlier run's items."""
    found: dict[str, dict[str, tuple[float, Any]]] = {"": {}}
    for path in sorted(results.rglob("*.jsonl")):
        with path.open("rb") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:  # a torn last line of a killed consumer's file
                    continue
                keys = record.get("item_keys") or []
                types = record.get("item_types") or []
                for index, item in enumerate(record.get("items") or []):
                    key = keys[index] if index < len(keys) and keys[index] is not None \
                        else f"{record['task_id']}#{index}"
                    kind = (types[index] if index < len(types) else None) or ""
                    fetched = record.get("fetched_at") or 0.0
                    held = found.setdefault(kind, {})
                    if key not in held or held[key][0] <= fetched:
                        held[key] = (fetched, item)
    dest.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, items in sorted(found.items()):
        path = type_path(dest, kind)
        with path.open("w") as out:
            for _, item in items.values():
                out.write(codec.dumps(item) + "\n")
        written.append(ItemFile(kind, len(items), str(path)))
    return written


def spider_tables(target: PostgresTarget, spider: Spider) -> list[str]:
    """The tables a spider's items go to: each route's type's, and the sink's own for
    the routes without one."""
    types = [route.item_type or "" for route in spider.routes.values()]
    return sorted({target.table_for(t) for t in types}) or [target.table]


async def pg_check(url: str) -> tuple[int, str] | None:
    """Whether the PostgreSQL sink can be reached and logged into now: None, or (exit code,
    the one line saying why not and what to do)."""
    import asyncpg  # noqa: PLC0415 - only for a postgres sink

    target = PostgresTarget.parse(url)
    try:
        conn = await asyncpg.connect(target.dsn, timeout=min(target.timeout_s, 10.0))
    except Exception as exc:
        problem = sink_problem(exc, target)
        return problem.exit_code, problem.message
    await conn.close()
    return None


async def pg_rows(url: str, tables: Sequence[str], since: float) -> list[ItemFile] | str:
    """Each table's rows written or updated since unix time `since` (all its rows when
    it keeps no crawled_at), or why they can't be counted."""
    import asyncpg  # noqa: PLC0415 - only for a postgres sink

    target = PostgresTarget.parse(url)
    crawled = target.columns.get("crawled_at", "")
    counted = []
    try:
        conn = await asyncpg.connect(target.dsn, timeout=min(target.timeout_s, 10.0))
        try:
            for table in tables:
                if await conn.fetchval("SELECT to_regclass($1)",
                                       target.table_sql(table)) is None:
                    counted.append(ItemFile(table, 0, f"table {table} (not made)"))
                    continue
                where = f" WHERE {crawled} >= to_timestamp($1)" if crawled else ""
                args = [since] if crawled else []
                n = await conn.fetchval(f"SELECT count(*) FROM {target.table_sql(table)}"
                                        f"{where}", *args)
                counted.append(ItemFile(table, int(n), f"table {table}"))
        finally:
            await conn.close()
    except Exception as exc:
        return f"in the sink, not counted: {sink_problem(exc, target).message}"
    return counted


def run_exit(stats: Stats, items: int | None) -> tuple[int, str]:
    """The run's exit code and why (0: ""): `EXIT_NOTHING_FETCHED` when no task ended
    with a response (its page done, or its route raising on it), `EXIT_ROUTES_FAILED`
    when routes raised and no item was delivered (`items` None: not known, then when no
    route ran to its end)."""
    done = outcomes(stats.counters)
    fetched = sum(n for code, n in done.items() if code != ROBOTS_DISALLOWED and code not in OWN)
    raised = stats.dead_reasons.get(HANDLER_ERROR, 0)
    if not fetched and not raised and (stats.dead or done):
        return EXIT_NOTHING_FETCHED, ("nothing could be fetched: every request ended "
                                      "without a page (see the reasons above)")
    if raised and (not items if items is not None else not done.get("ok")):
        return EXIT_ROUTES_FAILED, (f"routes raised on {raised} tasks and no item was "
                                    "delivered: fix the spider (the route errors above)")
    return EXIT_OK, ""


async def report(queue: CrawlQueue, stats: Stats) -> list[str]:
    """The summary's lines of what was not delivered and why, the route errors, and the
    hosts with trap tallies."""
    causes: dict[str, str] = {}
    for reason in stats.dead_reasons:
        if reason != HANDLER_ERROR and stats.dead_reasons[reason]:
            first = await queue.dead_list(reason=reason, limit=1)
            if first:
                causes[reason] = first[0].message[:200]
    lines = []
    stored = await read_values(queue.client, queue.crawl)
    lost = losses(stats, causes, items_dropped=stored is not None
                  and stored.policy.drop_judged_items)
    if lost:
        lines.append("  not delivered, by reason (and what to change):")
        lines += [f"    {loss.text()}" for loss in lost]
    if stats.dead_reasons.get(HANDLER_ERROR):
        by_error: dict[str, list[str]] = {}
        for dead in await queue.dead_list(reason=HANDLER_ERROR, limit=ERRORS_READ):
            by_error.setdefault(dead.message, []).append(dead.url or "?")
        lines.append(f"  route errors ({stats.dead_reasons[HANDLER_ERROR]} tasks dead of "
                     "them; crawlq dead ls --reason handler_error lists them):")
        lines += [f"    {error} ({len(urls)}{'+' if len(urls) == ERRORS_READ else ''} tasks, "
                  f"e.g. {urls[0]})" for error, urls in list(by_error.items())[:SHOWN_ERRORS]]
    traps = await TrapBook(queue).hosts(limit=3)
    if traps:
        lines.append("  trap tallies by host (crawlq traps): " + "; ".join(
            f"{row.host} {row.total} ({_counts(row.reasons)})" for row in traps))
    return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def items_line(files: Sequence[ItemFile] | str, *, rows: bool) -> str:
    """``items: 225 in items.jsonl`` or, by type, ``items: product 75 in ...; review 150
    in ...`` (the untyped file when it holds some, or is all there is); ``rows`` of
    tables alike."""
    if isinstance(files, str):
        return f"items: {files}"
    shown = [f for f in files if f.count] or list(files)
    unit = " rows" if rows else ""
    return "items: " + "; ".join(
        (f"{f.type} " if f.type and not rows else "") + f"{f.count}{unit} in {f.path}"
        for f in shown)


def elapsed_since(started: float) -> float:
    """Unix time of a monotonic `started` (what a table's crawled_at is compared with)."""
    return time.time() - (time.monotonic() - started)
