"""``crawlq demo``: a whole crawl on this machine, in under a minute, leaving nothing running.

1. Redis: ``REDIS_URL`` if given (the ``demo`` crawl is reset first), else an embedded
   redis-server (``common.redis.server.RedisServer``) that is stopped at the end.
2. The sample site (``console.demo.site``) on 127.0.0.1.
3. The producer, as a subprocess, on the site's seed list (``urls.txt``).
4. Two consumers, as subprocesses, with ``--exit-when-empty``; a progress line from
   ``CrawlQueue.stats()`` every 0.5 s while they work.
5. A summary (done / retried / dead by reason), where the results and logs are, and
   the commands to try next.

Every child is terminated in ``finally`` (SIGTERM, then SIGKILL), whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from redis.exceptions import RedisError

from common.config import COMMON_OPTIONS, REDIS_URL, REDIS_WAIT, Option, duration
from common.keys import CRAWLS
from common.names import validate_crawl_name
from common.policy import CrawlPolicy, ensure_policy
from common.queue import CrawlQueue, Stats
from common.redis.connection import RedisClient, connect
from common.redis.server import RedisServer
from common.redis.startup import RedisGaveUpError, StartupWait
from common.urls.redact import redact_url
from console.demo.site import SiteSpec, sample_site
from console.local.logs import QUIET, LogNotes
from console.local.processes import (
    Children,
    SigtermCancels,
    dir_summary,
    redis_failed,
    redis_wait,
    run_producer,
    say,
    stop_started,
    watch,
)

__all__ = ["DEMO_OPTIONS", "run_demo"]


DEMO_OPTIONS = (
    replace(REDIS_URL, default="", help="Redis to use (the demo crawl is reset first); "
            "unset: start an embedded redis-server for the demo and stop it after"),
    Option("--crawl", "CRAWLQ_DEMO_CRAWL", "demo", "crawl name of the demo",
           check=validate_crawl_name),
    Option("--output", "CRAWLQ_DEMO_OUTPUT", "./crawlq-demo", "where results, logs and the "
           "seed list go"),
    Option("--pages", "CRAWLQ_DEMO_PAGES", 2000, "pages on the sample site", type=int),
    Option("--consumers", "CRAWLQ_DEMO_CONSUMERS", 2, "consumer processes", type=int),
    Option("--timeout", "CRAWLQ_DEMO_TIMEOUT", 55.0, "stop the crawl after this long",
           type=duration),
    Option("--serve", "CRAWLQ_DEMO_SERVE", False, "only serve the sample site (its shop "
           "is what examples/demo_spider.py crawls) on 127.0.0.1 --port until Ctrl-C",
           flag_only_bool=True),
    Option("--port", "CRAWLQ_DEMO_PORT", 8000, "with --serve: the site's port (0: any free "
           "one)", type=int),
    REDIS_WAIT,
    *(o for o in COMMON_OPTIONS if o.flag in ("--log-level", "--log-format")),
)

CrawlKeysFn = Callable[[RedisClient, str], Awaitable[list[str]]]


async def _reset(redis_url: str, crawl: str, crawl_keys: CrawlKeysFn) -> list[str]:
    """Delete an earlier demo crawl's keys (a step that may run twice); the keys."""
    client = connect(redis_url)
    try:
        keys = await crawl_keys(client, crawl)
        for i in range(0, len(keys), 500):
            await client.unlink(*keys[i:i + 500])
        await client.srem(CRAWLS, crawl)
    finally:
        await client.aclose()
    return keys


async def _prepare_redis(args: argparse.Namespace, out: Path, crawl_keys: CrawlKeysFn,
                         wait: StartupWait) -> tuple[str, RedisServer | None]:
    if args.redis_url:
        keys = await wait.step("connect", lambda: _reset(args.redis_url, args.crawl,
                                                         crawl_keys))
        if keys:
            say(f"reset crawl {args.crawl} in {redact_url(args.redis_url)} "
                f"({len(keys)} keys from an earlier run)")
        return args.redis_url, None
    data = out / "redis"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    server = RedisServer(data_dir=data)
    await asyncio.to_thread(server.start)
    say(f"started an embedded redis-server at {server.url} (stopped when the demo ends)")
    return server.url, server


async def _fetch_seeds(base_url: str, dest: Path) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/urls.txt") as resp:
        resp.raise_for_status()
        body = await resp.read()
    await asyncio.to_thread(dest.write_bytes, body)


@dataclass(frozen=True, slots=True)
class _Paths:
    out: Path
    logs: Path
    results: Path
    seeds: Path

    @classmethod
    def prepare(cls, output: str) -> _Paths:
        """Resolve the output dir and empty the demo's own subdirectories in it."""
        out = Path(output).resolve()
        paths = cls(out, out / "logs", out / "results", out / "urls.txt")
        for old in (paths.logs, paths.results):
            shutil.rmtree(old, ignore_errors=True)
            old.mkdir(parents=True)
        return paths


async def serve_site(port: int) -> int:
    """Serve the sample site until the process is stopped (Ctrl-C, SIGTERM)."""
    async with sample_site(port=port) as base_url:
        say(f"serving the sample site at {base_url}/ (its shop: {base_url}/shop); "
            "Ctrl-C stops it")
        say(f"  crawl the shop: SHOP_URL={base_url} crawlq run "
            "examples/demo_spider.py --allow-private --set per_host_delay=0")
        await asyncio.Event().wait()
    return 0


async def run_demo(args: argparse.Namespace, *, crawl_keys: CrawlKeysFn) -> int:
    """Run the demo; returns 0 when every task was settled (done or dead) in time."""
    if args.serve:
        return await serve_site(args.port)
    started = time.monotonic()
    paths = await asyncio.to_thread(_Paths.prepare, args.output)
    children = Children()
    server: RedisServer | None = None
    sigterm = SigtermCancels()  # kill, docker stop: the demo ends through its finally
    redis_url = args.redis_url
    try:
        wait = redis_wait(redis_url, args.redis_wait)
        redis_url, server = await _prepare_redis(args, paths.out, crawl_keys, wait)
        wait.url = redis_url
        spec = SiteSpec(pages=args.pages)
        async with sample_site(spec=spec) as base_url:
            say(f"sample site: {base_url}/ ({spec.pages} pages, some slow, failing, "
                "redirecting or disallowed by robots.txt)")
            await _fetch_seeds(base_url, paths.seeds)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "REDIS_URL": redis_url,
                   "CRAWLQ_CRAWL": args.crawl}
            common = ["--redis-url", redis_url, "--crawl", args.crawl,
                      "--log-level", args.log_level, "--log-format", args.log_format]
            await wait.step("policy", lambda: _policy(redis_url, args.crawl))
            produced = await run_producer(
                children, [*common, "--max-attempts", "3", str(paths.seeds)], env,
                paths.logs / "producer.log")
            if produced is None:
                return 1
            say(f"producer: read {produced['read']}, invalid {produced['invalid']}, "
                f"enqueued {produced['enqueued']} (see {paths.logs / 'producer.log'})")
            for n in range(1, args.consumers + 1):
                await children.start(f"consumer-{n}", [
                    sys.executable, "-m", "consumer", *common, "--exit-when-empty",
                    "--allow-private", "--per-host-delay", "0", "--per-host-concurrency", "32",
                    "--retry-base", "0.5", "--empty-grace", "0",
                    "--output", str(paths.results / f"consumer-{n}"), "--http-port", "0",
                ], env, paths.logs / f"consumer-{n}.log")
            say(f"started {args.consumers} consumers (logs in {paths.logs})")
            notes = LogNotes({n: paths.logs / f"{n}.log" for n in children.procs
                              if n != "producer"}, skip=lambda e: e.event in QUIET)
            client = connect(redis_url)
            try:
                queue = await wait.step("crawl", lambda: CrawlQueue.existing(client, args.crawl))
                ok = await watch(children, queue, total=int(produced["enqueued"]),
                                 timeout_s=args.timeout, started=started, logs=paths.logs,
                                 notes=notes.new)
                stats = await wait.step("stats", queue.stats)
            finally:
                await client.aclose()
        _summary(stats, time.monotonic() - started, paths, crawl=args.crawl,
                 embedded=server is not None)
        return 0 if ok else 1
    except (RedisGaveUpError, RedisError) as exc:
        return redis_failed("crawlq demo", exc, redis_url)
    except asyncio.CancelledError:
        sigterm.interrupted("the consumers, the site and Redis")
        raise
    finally:
        await stop_started(sigterm, children, server)


async def _policy(redis_url: str, crawl: str) -> None:
    """The demo crawls its own local site fast: its policy says so before the producer
    would give the crawl the defaults (1 s a host)."""
    client = connect(redis_url)
    try:
        await ensure_policy(client, crawl, CrawlPolicy(
            per_host_delay=0, per_host_concurrency=32, retry_base=0.5), by="crawlq demo")
    finally:
        await client.aclose()


def _summary(s: Stats, elapsed: float, paths: _Paths, *, crawl: str, embedded: bool) -> None:
    dead = ", ".join(f"{r} {n}" for r, n in sorted(s.dead_reasons.items(), key=lambda x: -x[1])
                     if n) or "none"
    outcomes = {k.partition(":")[2]: v for k, v in s.counters.items()
                if k.startswith("outcome:") and v}
    say()
    say(f"demo finished in {elapsed:.1f}s: {s.counters.get('enqueued', 0)} URLs enqueued, "
        f"{s.done} done, {s.counters.get('retried', 0)} retried, {s.dead} dead")
    if outcomes:
        say("  done by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    say(f"  dead by reason: {dead}")
    if s.active:
        say(f"  still unfinished: {s.pending} pending, {s.leased} leased, "
            f"{s.waiting} waiting")
    say(f"results: {paths.results} ({dir_summary(paths.results)})")
    say(f"logs:    {paths.logs}")
    say(f"seeds:   {paths.seeds}")
    say()
    if embedded:
        say("The embedded Redis has been stopped. To explore a crawl afterwards, run the "
             "demo against your own Redis (REDIS_URL=redis://localhost:6379/0 crawlq demo), "
             "then try:")
    else:
        say("Try next:")
    for cmd in (f"crawlq stats --crawl {crawl}", f"crawlq dead ls --crawl {crawl}",
                f"crawlq dead requeue --crawl {crawl} --reason http_5xx",
                f"crawlq workers --crawl {crawl}", "crawlq crawls",
                f"crawlq reset --crawl {crawl} --yes"):
        say(f"  {cmd}")
