"""``crawlq run path/to/spider.py``: one spider crawled end to end on this machine.

1. The spider is loaded here first, so a broken file is one line and exit 2, not a
   crash in every child. A ``--sink postgres://`` is tried too: a database refused is
   one line (exit 2: login, database; 6: not reachable).
2. Redis: ``--redis-url`` / ``REDIS_URL`` if given, else an embedded redis-server stopped
   at the end. The run owns its crawl (``console.run.ownership``): a crawl of the spider's name
   left by an earlier run is reset first (said), unless ``--resume``; one that consumers
   are working on is refused (exit 2).
3. The crawl's policy: the defaults, the spider's own values (``Spider(policy=...)``)
   and ``--set KEY=VALUE`` over them (``per_host_delay=0``: a local site is crawled fast).
4. The producer, as a subprocess, enqueues the spider's ``start()``; then ``--consumers``
   consumer processes run its routes with ``--exit-when-empty``, a progress line
   meanwhile, and each warning or error of theirs once, as it comes (a route's error
   with its file and line, a host the SSRF guard refused).
5. Items: ``--sink postgres://...`` hands them to the consumers' PostgreSQL sink (the
   tables counted at the end); otherwise the consumers write JSONL records and this
   run's items are gathered into ``--out`` (one JSON object a line, one line a key), each
   item type's into a file of its own beside it.
6. A summary: what was done, what was not delivered by reason and what to change, the
   first route errors, the items by type and where they went; the exit code says
   whether anything came of it (0; 1 a timeout or a consumer failed; 8 nothing could be
   fetched; 9 routes raised and no item was delivered). Every child is stopped in
   ``finally``, whatever happened (Ctrl-C and SIGTERM included).

The same file runs on a fleet unchanged: ``crawlq-producer --spider FILE`` and
``crawlq-consumer --spider FILE``, which is all this command starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from redis.exceptions import RedisError

from common.browser.chromium import find_chromium
from common.config import (
    ALLOW_PRIVATE,
    COMMON_OPTIONS,
    POLICY_SET,
    REDIS_URL,
    REDIS_WAIT,
    Option,
    duration,
)
from common.errors import ConfigError
from common.names import validate_crawl_name
from common.policy import CrawlPolicy, ensure_policy, parse_assignments
from common.queue import CrawlQueue, Stats
from common.redis.connection import connect
from common.redis.server import RedisServer
from common.redis.startup import RedisGaveUpError
from common.spider import Spider, load_spider
from common.tasks.pgtarget import PostgresTarget, is_postgres_url
from common.urls.redact import redact_url
from console.local.logs import QUIET, LogNotes
from console.local.processes import (
    Children,
    SigtermCancels,
    redis_failed,
    redis_wait,
    run_producer,
    say,
    stop_started,
    watch,
)
from console.run.ownership import (
    ItemFile,
    elapsed_since,
    gather_items,
    items_line,
    own_crawl,
    pg_check,
    pg_rows,
    report,
    run_exit,
    spider_tables,
)
from console.views.losses import OWN, outcomes

__all__ = ["RUN_OPTIONS", "gather_items", "run_spider"]

RUN_OPTIONS = (
    replace(REDIS_URL, default="", help="Redis to use; unset: an embedded redis-server, "
            "started for the run and stopped after"),
    Option("--crawl", "CRAWLQ_RUN_CRAWL", "", "crawl name (default: the spider's name)"),
    Option("--consumers", "CRAWLQ_RUN_CONSUMERS", 2, "consumer processes", type=int),
    Option("--out", "CRAWLQ_RUN_OUT", "", "the JSON lines file this run's items go to, one "
           "a key, each item type's beside it (items.review.jsonl) (default: items.jsonl in "
           "--output)"),
    Option("--sink", "CRAWLQ_RUN_SINK", "", "the consumers' sink instead of --out, e.g. "
           "postgres://user@host/db (the password from PGPASSWORD or ~/.pgpass)"),
    Option("--output", "CRAWLQ_RUN_OUTPUT", "./crawlq-run", "where results and logs go"),
    Option("--timeout", "CRAWLQ_RUN_TIMEOUT", 600.0, "stop the crawl after this long",
           type=duration),
    Option("--resume", "CRAWLQ_RUN_RESUME", False, "go on with the spider's crawl (on "
           "--redis-url) and its results in --output, instead of starting it afresh",
           flag_only_bool=True),
    replace(POLICY_SET, env="CRAWLQ_RUN_SET"),
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
        if args.resume and not args.redis_url:
            raise ConfigError("--resume goes on with a crawl in your Redis: give "
                              "--redis-url (the embedded one starts empty each run)")
        postgres = is_postgres_url(args.sink)
        policy = CrawlPolicy().replace(spider.policy).replace(parse_assignments(args.set))
        problem = await pg_check(args.sink) if postgres else None
        browser = _browser(args.browser, spider, policy)
    except ConfigError as exc:
        print(f"crawlq run: error: {exc}", file=sys.stderr)
        return 2
    if problem is not None:
        print(f"crawlq run: {problem[1]}", file=sys.stderr)
        return problem[0]
    try:
        out, logs, results, items_to = await asyncio.to_thread(_prepare, args, crawl)
    except OSError as exc:  # a read-only --output, an --out in no directory
        print(f"crawlq run: error: can't write {exc.filename}: {exc.strerror}; give an "
              "--output (or --out) where you can write", file=sys.stderr)
        return 2
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
        said = await wait.step("policy", lambda: _policy(
            redis_url, crawl, policy, resume=args.resume, embedded=server is not None))
        if said:
            say(said)
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
        notes = LogNotes({n: logs / f"{n}.log" for n in children.procs if n != "producer"},
                         skip=lambda e: e.event in QUIET)
        client = connect(redis_url)
        try:
            queue = await wait.step("crawl", lambda: CrawlQueue.existing(client, crawl))
            ok = await watch(children, queue, total=None, timeout_s=args.timeout,
                             started=started, logs=logs, notes=notes.new)
            stats = await wait.step("stats", queue.stats)
            codes = {p.returncode for n, p in children.procs.items() if n != "producer"}
            if not ok and len(codes) == 1 and not stats.done + stats.dead:
                return codes.pop() or 1  # none could start: said in one line by watch
            lines = await wait.step("report", lambda: report(queue, stats))
        finally:
            await client.aclose()
        if items_to is not None:
            items: list[ItemFile] | str = await asyncio.to_thread(gather_items, results,
                                                                  items_to)
        elif postgres:
            target = PostgresTarget.parse(args.sink)
            items = await pg_rows(args.sink, spider_tables(target, spider),
                                  elapsed_since(started))
        else:  # a sink of another kind: its records are where the consumers put them
            items = f"in the consumers' {args.sink} sink ({results})"
        code, why = run_exit(stats, None if isinstance(items, str)
                             else sum(f.count for f in items))
        _summary(spider, stats, time.monotonic() - started, lines=lines, items=items,
                 rows=items_to is None, logs=logs, held_back=notes.held_back)
        if not ok:
            return 1
        if code:
            say(f"exit {code}: {why}")
        return code
    except ConfigError as exc:  # the crawl is in use by consumers: not this run's
        print(f"crawlq run: error: {exc}", file=sys.stderr)
        return 2
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


def _prepare(args: argparse.Namespace, crawl: str) -> tuple[Path, Path, Path, Path | None]:
    """The output directory, its emptied logs, this crawl's results directory (emptied:
    no earlier run's items are carried over, unless --resume goes on with the crawl) and
    the items file (None with --sink)."""
    out = Path(args.output).resolve()
    logs, results = out / "logs", out / "results"
    for old in (logs,) if args.resume else (logs, results):
        shutil.rmtree(old, ignore_errors=True)
    for new in (logs, results / crawl):
        new.mkdir(parents=True, exist_ok=True)
    items_to = None if args.sink else Path(args.out or out / "items.jsonl").resolve()
    if items_to is not None:  # writable, before anything starts
        items_to.parent.mkdir(parents=True, exist_ok=True)
        items_to.open("a").close()
    return out, logs, results / crawl, items_to


async def _policy(redis_url: str, crawl: str, policy: CrawlPolicy, *, resume: bool,
                  embedded: bool) -> str:
    """Make the crawl this run's (reset, or kept with --resume: `own_crawl`) and give it the
    policy asked for if it has none; what was done to an earlier crawl, to say."""
    client = connect(redis_url)
    try:
        said = "" if embedded else await own_crawl(client, crawl, resume=resume,
                                                     where=redact_url(redis_url))
        await ensure_policy(client, crawl, policy, by="crawlq run")
    finally:
        await client.aclose()
    return said


def _summary(spider: Spider, s: Stats, elapsed: float, *, lines: list[str],
             items: list[ItemFile] | str, rows: bool, logs: Path, held_back: int) -> None:
    done = ", ".join(f"{k} {v}" for k, v in outcomes(s.counters).items() if k not in OWN) \
        or "none"
    probes = sum(s.counters.get(f"outcome:{k}", 0) for k in OWN)  # crawlq's, not the spider's
    say()
    say(f"{spider.name} finished in {elapsed:.1f}s: {s.counters.get('enqueued', 0) - probes} "
        f"requests, {s.done - probes} done, {s.counters.get('retried', 0)} retried, {s.dead} dead"
        + (f" (and {probes} soft-404 probe{'s' * (probes > 1)} of crawlq's own)" if probes
           else ""))
    say(f"  done by outcome: {done}")
    for line in lines:
        say(line)
    if s.active:
        say(f"  still unfinished: {s.pending} pending, {s.leased} leased, {s.waiting} waiting")
    say(items_line(items, rows=rows))
    say(f"logs:  {logs}" + (f" ({held_back} more warnings there)" if held_back else ""))
