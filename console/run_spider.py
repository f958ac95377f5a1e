"""``crawlq run path/to/spider.py``: one spider crawled end to end on this machine.

1. The spider is loaded here first, so a broken file is one line and exit 2, not a
   crash in every child.
2. Redis: ``--redis-url`` / ``REDIS_URL`` if given (the crawl goes on from its state:
   a producer run is idempotent, and the earlier runs' results in ``--output`` are
   kept), else an embedded redis-server stopped at the end (a fresh crawl each run).
3. The crawl's policy for a crawl that has none: the defaults, the spider's own values
   (``Spider(policy=...)``) and ``--set KEY=VALUE`` over them (``per_host_delay=0``: a
   local site is crawled fast).
4. The producer, as a subprocess, enqueues the spider's ``start()``; then ``--consumers``
   consumer processes run its routes with ``--exit-when-empty``, a progress line
   meanwhile.
5. Items: ``--sink postgres://...`` hands them to the consumers' PostgreSQL sink;
   otherwise the consumers write JSONL records and the items are gathered into ``--out``
   (one JSON object a line, one line a key: a task fetched twice is one item).
6. A summary; every child is stopped in ``finally``, whatever happened (Ctrl-C and
   SIGTERM included).

The same file runs on a fleet unchanged: ``crawlq-producer --spider FILE`` and
``crawlq-consumer --spider FILE``, which is all this command starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from common import codec
from common.browser.chromium import find_chromium
from common.config import (
    ALLOW_PRIVATE,
    COMMON_OPTIONS,
    REDIS_URL,
    REDIS_WAIT,
    Option,
    duration,
    redact_url,
)
from common.connection import connect
from common.errors import ConfigError
from common.names import validate_crawl_name
from common.policy import CrawlPolicy, ensure_policy, parse_assignments
from common.queue import CrawlQueue, Stats
from common.redis_server import RedisServer
from common.spider import Spider, load_spider
from common.startup import RedisGaveUpError
from console.local import (
    Children,
    SigtermCancels,
    redis_failed,
    redis_wait,
    run_producer,
    say,
    stop_started,
    watch,
)

__all__ = ["RUN_OPTIONS", "gather_items", "run_spider"]

RUN_OPTIONS = (
    replace(REDIS_URL, default="", help="Redis to use; unset: an embedded redis-server, "
            "started for the run and stopped after"),
    Option("--crawl", "CRAWLQ_RUN_CRAWL", "", "crawl name (default: the spider's name)"),
    Option("--consumers", "CRAWLQ_RUN_CONSUMERS", 2, "consumer processes", type=int),
    Option("--out", "CRAWLQ_RUN_OUT", "", "the JSON lines file the items go to, one a key "
           "(default: items.jsonl in --output)"),
    Option("--sink", "CRAWLQ_RUN_SINK", "", "the consumers' sink instead of --out, e.g. "
           "postgres://user:pass@host/db"),
    Option("--output", "CRAWLQ_RUN_OUTPUT", "./crawlq-run", "where results and logs go"),
    Option("--timeout", "CRAWLQ_RUN_TIMEOUT", 600.0, "stop the crawl after this long",
           type=duration),
    Option("--set", "CRAWLQ_RUN_SET", [], "a new crawl's policy value KEY=VALUE, as "
           "`crawlq crawl set` takes it, repeatable (e.g. per_host_delay=0 for a local "
           "site); a crawl with a policy keeps its own", append=True, field="policy"),
    ALLOW_PRIVATE,
    REDIS_WAIT,
    Option("--browser", "CRAWLQ_RUN_BROWSER", "", "the first consumer renders the render "
           "requests in this Chromium: auto (found on the PATH) or its path; default: auto "
           "when a route renders or the policy's rendering is on, else none"),
    *(o for o in COMMON_OPTIONS if o.flag in ("--log-level", "--log-format")),
)


def _spider_arg(spec: str) -> str:
    """A spider file as an absolute path, so every child finds it; a module as it is."""
    where, sep, attr = spec.partition(":")
    if where.endswith(".py") or "/" in where:
        return str(Path(where).resolve()) + sep + attr
    return spec


async def run_spider(args: argparse.Namespace) -> int:
    """Run the spider end to end; 0 when every task was settled (done or dead) in time."""
    started = time.monotonic()
    try:
        spider = load_spider(args.spider, flag="spider")
        crawl = args.crawl or spider.name
        validate_crawl_name(crawl)
        if args.out and args.sink:
            raise ConfigError("give --out or --sink, not both")
        if args.consumers < 1:
            raise ConfigError("--consumers must be >= 1")
        policy = CrawlPolicy().replace(spider.policy).replace(parse_assignments(args.set))
        browser = _browser(args.browser, spider, policy)
    except ConfigError as exc:
        print(f"crawlq run: error: {exc}", file=sys.stderr)
        return 2
    out, logs, results, items_to = await asyncio.to_thread(_prepare, args)
    children = Children()
    server: RedisServer | None = None
    sigterm = SigtermCancels()  # kill, docker stop: the run ends through its finally
    redis_url = args.redis_url
    try:
        if not redis_url:
            shutil.rmtree(out / "redis", ignore_errors=True)
            (out / "redis").mkdir()
            server = RedisServer(data_dir=out / "redis")
            await asyncio.to_thread(server.start)
            redis_url = server.url
            say(f"started an embedded redis-server at {redis_url} (stopped when the run ends)")
        wait = redis_wait(redis_url, args.redis_wait)
        await wait.step("policy", lambda: _policy(redis_url, crawl, policy))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        common = ["--redis-url", redis_url, "--crawl", crawl, "--log-level", args.log_level,
                  "--log-format", args.log_format,
                  *(["--redis-wait", f"{args.redis_wait:g}s"] if args.redis_wait else [])]
        spec = _spider_arg(args.spider)
        private = ["--allow-private"] if args.allow_private else []
        produced = await run_producer(children, [*common, "--spider", spec], env,
                                      logs / "producer.log")
        if produced is None:
            return 1
        say(f"{spider!r}: the producer enqueued {produced['enqueued']} start requests "
            f"({produced['duplicates']} seen before)")
        sink = ["--sink", args.sink] if args.sink else []
        for n in range(1, args.consumers + 1):
            rendering = ["--browser", browser] if browser and n == 1 else []
            await children.start(f"consumer-{n}", [
                sys.executable, "-m", "consumer", *common, "--spider", spec, *private, *sink,
                *rendering,
                "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1",
                "--output", str(results / f"consumer-{n}")], env, logs / f"consumer-{n}.log")
        say(f"started {args.consumers} consumers (logs in {logs})")
        client = connect(redis_url)
        try:
            queue = await wait.step("crawl", lambda: CrawlQueue.existing(client, crawl))
            ok = await watch(children, queue, total=None, timeout_s=args.timeout,
                             started=started, logs=logs)
            stats = await wait.step("stats", queue.stats)
        finally:
            await client.aclose()
        items = await asyncio.to_thread(gather_items, results, items_to) \
            if items_to is not None else None
        _summary(spider, stats, time.monotonic() - started, items=items, items_to=items_to,
                 sink=args.sink, logs=logs)
        return 0 if ok else 1
    except (RedisGaveUpError, RedisError) as exc:
        return redis_failed("crawlq run", exc, redis_url)
    except asyncio.CancelledError:
        sigterm.interrupted("the consumers and Redis")
        raise
    finally:
        await stop_started(sigterm, children, server)


def _browser(given: str, spider: Spider, policy: CrawlPolicy) -> str:
    """The first consumer's --browser: the one given, else auto when the spider renders
    (a route asks, or the policy's rendering is on); ConfigError when there is none."""
    wanted = given or ("auto" if policy.rendering != "off" or any(
        route.render is not None for route in spider.routes.values()) else "")
    if wanted:
        find_chromium(wanted)  # one clear line now, not a consumer that exits
    return wanted


def _prepare(args: argparse.Namespace) -> tuple[Path, Path, Path, Path | None]:
    """The output directory, its emptied logs and results, and the items file (None
    with --sink). With --redis-url the crawl may go on from an earlier run: its results
    are kept, so the items gathered are the whole crawl's."""
    out = Path(args.output).resolve()
    logs, results = out / "logs", out / "results"
    for old in (logs,) if args.redis_url else (logs, results):
        shutil.rmtree(old, ignore_errors=True)
    for new in (logs, results):
        new.mkdir(parents=True, exist_ok=True)
    items_to = None if args.sink else Path(args.out or out / "items.jsonl").resolve()
    return out, logs, results, items_to


async def _policy(redis_url: str, crawl: str, policy: CrawlPolicy) -> None:
    """Give a crawl without a policy the one asked for (an existing crawl keeps its own)."""
    client = connect(redis_url)
    try:
        await ensure_policy(client, crawl, policy, by="crawlq run")
    finally:
        await client.aclose()


def gather_items(results: Path, dest: Path) -> int:
    """Write the items of every JSONL record under `results` to `dest`, one line per
    key (the latest fetch's wins); returns how many."""
    found: dict[str, tuple[float, Any]] = {}
    for path in sorted(results.rglob("*.jsonl")):
        with path.open("rb") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:  # a torn last line of a killed consumer's file
                    continue
                keys = record.get("item_keys") or []
                for index, item in enumerate(record.get("items") or []):
                    key = keys[index] if index < len(keys) and keys[index] is not None \
                        else f"{record['task_id']}#{index}"
                    fetched = record.get("fetched_at") or 0.0
                    if key not in found or found[key][0] <= fetched:
                        found[key] = (fetched, item)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w") as out:
        for _, item in found.values():
            out.write(codec.dumps(item) + "\n")
    return len(found)


def _summary(spider: Spider, s: Stats, elapsed: float, *, items: int | None,
             items_to: Path | None, sink: str, logs: Path) -> None:
    dead = ", ".join(f"{r} {n}" for r, n in sorted(s.dead_reasons.items(), key=lambda x: -x[1])
                     if n) or "none"
    say()
    say(f"{spider.name} finished in {elapsed:.1f}s: {s.counters.get('enqueued', 0)} requests, "
        f"{s.done} done, {s.counters.get('retried', 0)} retried, {s.dead} dead")
    say(f"  dead by reason: {dead}")
    if s.active:
        say(f"  still unfinished: {s.pending} pending, {s.leased} leased, {s.waiting} waiting")
    if items_to is not None:
        say(f"items: {items} in {items_to}")
    else:
        say(f"items: in the consumers' sink ({redact_url(sink)})")
    say(f"logs:  {logs}")
