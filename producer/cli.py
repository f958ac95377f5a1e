"""``crawlq-producer``: options, one run or a loop, the summary and the exit code.

Exit codes:

== =====================================================================================
0  the run finished (rejected lines do not fail it; neither does a SIGTERM, which ends
   the run after the batch in progress)
2  usage or configuration error (bad flag or env value, a --dedup/--partitions that
   conflicts with the existing crawl, bloom dedup with --recrawl-after or with a crawl
   policy whose recrawl_after is set)
3  Redis unreachable or refusing (connection, authentication, ACL, out of memory,
   read-only replica)
4  a source could not be read (missing input file, sitemap fetch or parse failed);
   batches read before the failure are enqueued
5  another producer holds this crawl's lock (see --lock-wait)
== =====================================================================================
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import random
import signal
import sys
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, TextIO

from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from common.config import (
    ALLOW_PRIVATE,
    COMMON_OPTIONS,
    JSON,
    POLICY_SET,
    PRODUCER_REDIS_WAIT_S,
    SPIDER,
    CommonSettings,
    Option,
    add_options,
    defaults,
    duration,
    option_values,
)
from common.errors import ConfigError, CrawlConflictError, SourceError
from common.exitcodes import EXIT_LOCKED, EXIT_OK, EXIT_REDIS, EXIT_SOURCE, EXIT_USAGE
from common.http.fetcher import Fetcher
from common.observability.logs import setup_logging
from common.policy import (
    PRODUCER,
    CrawlPolicy,
    ensure_policy,
    flag_differences,
    parse_assignments,
    read_values,
    seeded_by,
)
from common.policy.command_flags import policy_flag
from common.queue import CrawlQueue, CrawlSettings, DedupMode
from common.redis.connection import RedisClient, open_redis
from common.redis.errors import redis_error_message
from common.redis.scripts import load_registered
from common.redis.startup import RedisGaveUpError, StartupStopped, StartupWait
from common.runtime import run_loop
from common.spider import Spider, crawl_of, load_spider
from common.tasks.headers import parse_header_lines
from common.urls.redact import redact_url
from producer.known import recrawl_known
from producer.lock import LockHeldError, ProducerLock
from producer.progress import Progress
from producer.run import RejectWriter, TaskTemplate, produce
from producer.sitemaps import SitemapReader, fetch_settings
from producer.sources import STDIN, Chunk, check_files, file_chunks, stdin_chunks, url_chunks
from producer.spiders import spider_chunks
from producer.summary import Summary

__all__ = ["EXIT_LOCKED", "EXIT_OK", "EXIT_REDIS", "EXIT_SOURCE", "EXIT_USAGE",
           "PRODUCER_OPTIONS", "ProducerSettings", "build_parser", "main", "main_async",
           "run", "run_once"]

log = logging.getLogger("producer")

PROG = "crawlq-producer"


def _int_at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _task_headers(lines: list[str]) -> dict[str, str]:
    return parse_header_lines(lines, ConfigError, "--header / CRAWLQ_TASK_HEADERS")


def _dedup(value: str | None) -> DedupMode | None:
    return DedupMode(value) if value else None


def _meta_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not key=value: {text!r}")
    return key.strip(), value


#: What every task of a run gets by default, which its flags take.
_TEMPLATE = TaskTemplate()
#: The policy options this producer has flags for (the consumer's keep their defaults).
SEEDS = frozenset(o.name for o in seeded_by(PRODUCER))


PRODUCER_OPTIONS = (
    Option("--input", "CRAWLQ_INPUT", [], "a file of URLs, one per line (.gz read "
           "transparently), or - for stdin; repeatable, positional arguments work too",
           append=True, field="inputs", convert=tuple),
    Option("--url", "CRAWLQ_URL", [], "a URL to enqueue (repeatable)", append=True,
           field="urls", convert=tuple),
    SPIDER,
    Option("--sitemap", "CRAWLQ_SITEMAP", [], "a sitemap, sitemap index or robots.txt URL "
           "whose URLs to enqueue (repeatable)", append=True, field="sitemaps", convert=tuple),
    Option("--requests", "CRAWLQ_REQUESTS", [], "a file of requests, one JSON object per "
           "line (url, method, headers, body|json|form, label, data, priority, "
           "unique_key; .gz read transparently), or - for stdin; repeatable", append=True,
           convert=tuple),
    Option("--priority", "CRAWLQ_PRIORITY", _TEMPLATE.priority, "task priority: 0 is first "
           "come first served, higher is leased first", type=_int_at_least(0),
           field="template.priority"),
    policy_flag("max_attempts", PRODUCER, field="template.max_attempts"),
    Option("--meta", "CRAWLQ_META", [], "key=value stored in every task's meta "
           "(repeatable)", type=_meta_pair, append=True, field="template.meta", convert=dict),
    # Not CRAWLQ_HEADERS: that is the consumer's, and a settings file both read would
    # copy the crawl's headers into every task entry.
    Option("--header", "CRAWLQ_TASK_HEADERS", [], "'Name: value' stored on every task of "
           "this run and sent with its request over the consumer's --header, repeatable "
           "(env: one per line); credential headers are never shown", append=True,
           env_separator="\n", secret=True, field="template.headers", convert=_task_headers),
    Option("--depth", "CRAWLQ_DEPTH", _TEMPLATE.depth, "link depth recorded on the tasks",
           type=_int_at_least(0), field="template.depth"),
    Option("--dedup", "CRAWLQ_DEDUP", None, "dedup mode, fixed when the crawl is created "
           "(exact if unset)", choices=("exact", "bloom"), convert=_dedup),
    Option("--partitions", "CRAWLQ_PARTITIONS", None, "partitions, fixed when the crawl is "
           "created (1 if unset)", type=_int_at_least(1)),
    policy_flag("recrawl_after", PRODUCER, field="recrawl_after_s"),
    Option("--recrawl-known", "CRAWLQ_RECRAWL_KNOWN", True, "after the inputs, queue "
           "again every known URL past the crawl's recrawl window, from its history, when "
           "it recrawls by recrawl_after (revisit off, conditional on): a re-seeded crawl "
           "reaches every page it knew; --no-recrawl-known enqueues the inputs alone",
           flag_only_bool=True),
    Option("--sort-query", "CRAWLQ_SORT_QUERY", False, "sort query parameters by key when "
           "canonicalizing", flag_only_bool=True),
    Option("--reject-file", "CRAWLQ_REJECT_FILE", None, "write every rejected line there, "
           "one JSON object per line (credentials removed)"),
    Option("--enqueue-batch", "CRAWLQ_ENQUEUE_BATCH", 1000, "URLs per enqueue call",
           type=_int_at_least(1), field="batch_size"),
    Option("--dry-run", "CRAWLQ_DRY_RUN", False, "canonicalize and count, write nothing "
           "(Redis is not contacted)", flag_only_bool=True),
    JSON,
    Option("--every", "CRAWLQ_EVERY", 0.0, "run again this long after each run, +-10%% "
           "jitter (e.g. 1h); 0 runs once", type=duration, field="every_s"),
    Option("--lock-wait", "CRAWLQ_LOCK_WAIT", 0.0, "how long to wait for another "
           "producer of the same crawl to finish before exiting 5", type=duration,
           field="lock_wait_s"),
    ALLOW_PRIVATE,
    POLICY_SET,
    Option("--progress", "CRAWLQ_PROGRESS", "auto", "progress bar: auto (on a terminal), "
           "on, off (log lines every 5 s)", choices=("auto", "on", "off")),
)


_DEFAULT = defaults(PRODUCER_OPTIONS)


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """Everything a producer run needs, built once from flags and environment (defaults:
    `PRODUCER_OPTIONS`')."""

    common: CommonSettings
    inputs: tuple[str, ...] = _DEFAULT["inputs"]
    urls: tuple[str, ...] = _DEFAULT["urls"]
    sitemaps: tuple[str, ...] = _DEFAULT["sitemaps"]
    spider: str = _DEFAULT["spider"]
    requests: tuple[str, ...] = _DEFAULT["requests"]
    template: TaskTemplate = field(default_factory=TaskTemplate)
    dedup: DedupMode | None = _DEFAULT["dedup"]
    partitions: int | None = _DEFAULT["partitions"]
    recrawl_after_s: int = _DEFAULT["recrawl_after_s"]
    recrawl_known: bool = _DEFAULT["recrawl_known"]
    sort_query: bool = _DEFAULT["sort_query"]
    reject_file: str | None = _DEFAULT["reject_file"]
    batch_size: int = _DEFAULT["batch_size"]
    dry_run: bool = _DEFAULT["dry_run"]
    json: bool = _DEFAULT["json"]
    every_s: float = _DEFAULT["every_s"]
    lock_wait_s: float = _DEFAULT["lock_wait_s"]
    allow_private: bool = _DEFAULT["allow_private"]
    progress: str = _DEFAULT["progress"]
    policy: tuple[str, ...] = _DEFAULT["policy"]  # --set KEY=VALUE

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProducerSettings:
        """Build the settings through PRODUCER_OPTIONS (ConfigError on a bad combination)."""
        values = option_values(PRODUCER_OPTIONS, args)
        inputs = (*values.pop("inputs"), *args.files)
        if not (inputs or values["urls"] or values["sitemaps"] or values["requests"]
                or values["spider"]):
            raise ConfigError("no input: give files (or - for stdin), --url, --sitemap, "
                              "--requests or --spider")
        if (*inputs, *values["requests"]).count(STDIN) > 1:
            raise ConfigError("stdin (-) can be read only once")
        if values["every_s"] and STDIN in (*inputs, *values["requests"]):
            raise ConfigError("--every re-reads the inputs each run; stdin (-) can't be "
                              "re-read: use a file")
        if values["recrawl_after_s"] and values["dedup"] is DedupMode.BLOOM:
            raise ConfigError("--recrawl-after needs exact dedup: bloom keeps no timestamps")
        CrawlPolicy().replace(parse_assignments(values["policy"]))  # PolicyError now
        return cls(common=CommonSettings.from_args(args), inputs=inputs,
                   template=TaskTemplate(**values.pop("template")), **values)


def build_parser() -> argparse.ArgumentParser:
    """The producer's argument parser (defaults read from CRAWLQ_* variables)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Canonicalize URLs, deduplicate them and enqueue them into a crawl.",
        epilog="exit codes: 0 ran (rejected lines included), 2 usage/config error, "
               "3 Redis unreachable or refused, 4 a source could not be read, "
               "5 another producer holds the crawl's lock",
    )
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="files of URLs (.gz ok), - for stdin")
    add_options(parser, COMMON_OPTIONS)
    add_options(parser, PRODUCER_OPTIONS)
    return parser


async def open_queue(client: RedisClient, settings: ProducerSettings) -> CrawlQueue:
    """Open the crawl; --dedup/--partitions apply only when it is created.

    An explicit value that differs from an existing crawl's is a CrawlConflictError; a
    bloom crawl is not created under a policy with a recrawl window (ConfigError).
    """
    crawl = settings.common.crawl
    try:
        queue = await CrawlQueue.existing(client, crawl)
    except ConfigError:
        if settings.partitions is None and settings.dedup is None:
            return await CrawlQueue.open(client, crawl)
        wanted = CrawlSettings(partitions=settings.partitions or 1,
                               dedup=settings.dedup or DedupMode.EXACT)
        if wanted.dedup is DedupMode.BLOOM:
            found = await read_values(client, crawl)
            if found is not None and found.policy.recrawl_after:
                raise ConfigError(_bloom_under_window(crawl, found.policy)) from None
        queue = await CrawlQueue.open(client, crawl, wanted)
    stored = queue.settings
    asked = []
    if settings.partitions is not None and settings.partitions != stored.partitions:
        asked.append(f"partitions={settings.partitions}")
    if settings.dedup is not None and settings.dedup != stored.dedup:
        asked.append(f"dedup={settings.dedup.value}")
    if asked:
        raise CrawlConflictError(
            f"crawl {crawl!r} exists with partitions={stored.partitions}, "
            f"dedup={stored.dedup.value}; it was asked for {', '.join(asked)}. These are fixed "
            "when a crawl is created: drop --partitions/--dedup (and CRAWLQ_PARTITIONS/"
            "CRAWLQ_DEDUP), or use a new --crawl name")
    if stored.dedup is DedupMode.BLOOM and settings.recrawl_after_s:
        raise ConfigError(f"crawl {crawl!r} uses bloom dedup, which keeps no timestamps: "
                          "--recrawl-after needs an exact-dedup crawl")
    return queue


def _bloom_under_window(crawl: str, policy: CrawlPolicy) -> str:
    return (f"crawl {crawl!r} uses bloom dedup, which keeps no timestamps, but its policy "
            f"has recrawl_after={policy.texts()['recrawl_after']} (set before the crawl "
            f"was created): run `crawlq crawl set --crawl {crawl} recrawl_after=0`, or use "
            "an exact-dedup crawl")


def flag_policy(settings: ProducerSettings) -> CrawlPolicy:
    """The policy this producer's crawl-level flags ask for (the options whose flags are
    the consumer's at their defaults)."""
    return CrawlPolicy(max_attempts=settings.template.max_attempts,
                       recrawl_after=settings.recrawl_after_s)


async def ensure_crawl_policy(client: RedisClient, settings: ProducerSettings,
                              spider: Spider | None = None) -> CrawlPolicy:
    """The crawl's policy, which this run follows: created from this producer's flags if
    nobody (``crawlq crawl create``, a consumer) gave the crawl one; never changed when
    it exists (a flag given, by flag or env, that differs from it gets one WARNING: the
    crawl's value holds).
    A full Redis (at maxmemory) refuses the write: the run goes on with what is stored
    (or its flags), its enqueue says so."""
    crawl, wanted = settings.common.crawl, flag_policy(settings)
    if spider is not None:  # its own values
        wanted = wanted.replace(spider.policy)
    wanted = wanted.replace(parse_assignments(settings.policy))  # --set, over the spider's
    try:
        stored, created = await ensure_policy(client, crawl, wanted, by="producer",
                                              seeds=SEEDS)
    except ResponseError as exc:
        if not isinstance(exc, OutOfMemoryError) and "OOM" not in str(exc):
            raise
        log.warning("crawl_policy_not_written", extra={"error": str(exc)[:200]})
        found = await read_values(client, crawl)
        return wanted if found is None else found.policy
    if created:
        log.info("crawl_policy_created", extra={"crawl": crawl, **wanted.texts()})
    for differs in flag_differences(crawl, stored.policy, wanted, PRODUCER,
                                    given=settings.common.given):
        log.warning("crawl_policy_differs", extra=differs)
    return stored.policy


def _follow(queue: CrawlQueue, policy: CrawlPolicy) -> None:
    """Enqueue with the policy's recrawl window (a bloom crawl can't have one) and its
    render mode."""
    if policy.recrawl_after and queue.settings.dedup is DedupMode.BLOOM:
        raise ConfigError(_bloom_under_window(queue.crawl, policy))
    queue.configure(recrawl_after_s=policy.recrawl_after,
                    render_all=policy.rendering != "off", adaptive=policy.rendering == "auto")


def _sources(settings: ProducerSettings, stdin: BinaryIO | None,
             fetcher: Fetcher | None, spider: Spider | None
             ) -> list[AsyncGenerator[Chunk, None]]:
    sources: list[AsyncGenerator[Chunk, None]] = []
    if spider is not None:
        sources.append(spider_chunks(spider))
    if settings.urls:
        sources.append(url_chunks(settings.urls))
    for path in settings.inputs:
        sources.append(stdin_chunks(stdin) if path == STDIN else file_chunks(path))
    for path in settings.requests:
        sources.append(stdin_chunks(stdin, requests=True) if path == STDIN
                       else file_chunks(path, requests=True))
    if settings.sitemaps:
        assert fetcher is not None
        reader = SitemapReader(fetcher)
        sources.extend(reader.chunks(url) for url in settings.sitemaps)
    return sources


def startup_wait(settings: ProducerSettings, stop: asyncio.Event | None = None
                 ) -> StartupWait:
    """The wait of a run's start-up steps for Redis, up to --redis-wait
    (PRODUCER_REDIS_WAIT_S when 0): each failed try at DEBUG (``redis_unreachable``), so a
    run that gives up says so in one line."""
    def tried(step: str, exc: BaseException) -> None:
        log.debug("redis_unreachable", extra={"step": step, "error": str(exc)[:200]})

    return StartupWait(settings.common.redis_url,
                       settings.common.redis_wait_limit(PRODUCER_REDIS_WAIT_S),
                       on_wait=tried, stop=stop)


async def run_once(settings: ProducerSettings, client: RedisClient | None, *,
                   stop: asyncio.Event | None = None, stdin: BinaryIO | None = None,
                   progress_stream: TextIO | None = None,
                   wait: StartupWait | None = None) -> Summary:
    """One producer run; never raises for expected failures: they set exit_code and error.
    Its start-up steps (the lock, the crawl, its policy, the scripts) wait through a Redis
    outage (`wait`, else --redis-wait's); the enqueues that follow do not (exit 3: a
    producer run is idempotent, run it again)."""
    summary = Summary(settings.common.crawl, dry_run=settings.dry_run,
                      reject_file=settings.reject_file)
    wait = wait or startup_wait(settings, stop)
    try:
        check_files((*settings.inputs, *settings.requests))
        spider = load_spider(settings.spider) if settings.spider else None
        labels = None if spider is None else frozenset(
            label for label in spider.routes if label is not None)
        async with contextlib.AsyncExitStack() as stack:
            rejects = None
            if settings.reject_file:
                try:
                    # A local file opened once per run: blocking here is fine.
                    reject_stream = stack.enter_context(
                        open(settings.reject_file, "w", encoding="utf-8"))  # noqa: ASYNC230, SIM115
                except OSError as exc:
                    raise ConfigError(f"cannot write --reject-file {settings.reject_file!r}: "
                                      f"{exc.strerror}") from None
                rejects = RejectWriter(reject_stream)
            fetcher = None
            if settings.sitemaps:
                fetcher = await stack.enter_async_context(
                    Fetcher(fetch_settings(settings.allow_private)))
            queue, template, policy = None, settings.template, None
            if not settings.dry_run:
                assert client is not None
                lock = ProducerLock(client, settings.common.crawl, settings.lock_wait_s)
                await wait.step("lock", lock.acquire)
                stack.push_async_callback(lock.close)
                queue = await wait.step("crawl", lambda: open_queue(client, settings))
                policy = await wait.step("policy", lambda: ensure_crawl_policy(
                    client, settings, spider))
                await wait.step("scripts", lambda: load_registered(client))
                _follow(queue, policy)
                template = replace(template, max_attempts=policy.max_attempts)
            progress = Progress(summary, settings.progress, stream=progress_stream)
            stack.callback(progress.close)
            await produce(_sources(settings, stdin, fetcher, spider), queue=queue,
                          summary=summary, known_labels=labels,
                          template=template, batch_size=settings.batch_size,
                          sort_query=settings.sort_query, stop=stop, progress=progress,
                          rejects=rejects)
            if queue is not None and policy is not None and settings.recrawl_known \
                    and not (stop is not None and stop.is_set()):
                await recrawl_known(queue, policy, summary, stop)
    except ConfigError as exc:
        summary.exit_code, summary.error = EXIT_USAGE, str(exc)
    except LockHeldError as exc:
        summary.exit_code, summary.error = EXIT_LOCKED, str(exc)
    except SourceError as exc:
        summary.exit_code, summary.error = EXIT_SOURCE, str(exc)
    except RedisGaveUpError as exc:
        summary.exit_code, summary.error = EXIT_REDIS, str(exc)
    except StartupStopped:  # a signal while it waited for Redis: nothing was enqueued
        pass
    except RedisError as exc:
        message = redis_error_message(exc, settings.common.redis_url)
        if message is None:
            raise
        summary.exit_code, summary.error = EXIT_REDIS, message
    return summary


def _report(summary: Summary, settings: ProducerSettings, out: TextIO) -> None:
    if summary.error:
        print(f"{PROG}: {summary.error}", file=sys.stderr)
    if settings.json:
        print(summary.to_json(), file=out, flush=True)
    elif summary.exit_code == EXIT_OK or summary.read:
        print(summary.to_text(), file=out, flush=True)


def _install_stop(stop: asyncio.Event) -> list[signal.Signals]:
    """SIGTERM/SIGINT set ``stop``; returns the signals to uninstall afterwards."""
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        if stop.is_set():  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        log.info("producer_signal", extra={"signal": signame,
                                           "action": "finishing the current batch"})
        stop.set()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig.name)
            installed.append(sig)
    return installed


async def run(settings: ProducerSettings, *, out: TextIO | None = None,
              stdin: BinaryIO | None = None) -> int:
    """Run once (or every ``every_s``) and return the exit code."""
    out = out if out is not None else sys.stdout
    stop = asyncio.Event()
    installed = _install_stop(stop)
    client: RedisClient | None = None
    wait = startup_wait(settings, stop)
    try:
        if not settings.dry_run:
            try:
                client = await wait.step("connect", lambda: open_redis(
                    settings.common.redis_url, cluster=settings.common.cluster_mode,
                    wait_replicas=settings.common.wait_replicas,
                    wait_timeout_s=settings.common.wait_timeout_s))
            except ConfigError as exc:  # a setting the server's kind refuses
                _report(Summary(settings.common.crawl, dry_run=settings.dry_run,
                                exit_code=EXIT_USAGE, error=str(exc)), settings, out)
                return EXIT_USAGE
            except StartupStopped:
                return EXIT_OK
            except (RedisError, RedisGaveUpError) as exc:
                failed = Summary(settings.common.crawl, dry_run=settings.dry_run,
                                 exit_code=EXIT_REDIS, error=str(exc) if isinstance(
                                     exc, RedisGaveUpError) else redis_error_message(
                                     exc, settings.common.redis_url) or f"Redis error: {exc}")
                _report(failed, settings, out)
                return EXIT_REDIS
        while True:
            summary = await run_once(settings, client, stop=stop, stdin=stdin, wait=wait)
            _report(summary, settings, out)
            if not settings.every_s or stop.is_set():
                return summary.exit_code
            if summary.exit_code == EXIT_USAGE:
                return EXIT_USAGE  # it won't fix itself by waiting
            delay = settings.every_s * random.uniform(0.9, 1.1)
            log.info("producer_sleeping", extra={"crawl": settings.common.crawl,
                                                 "next_run_in_s": round(delay, 1)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return EXIT_OK
    finally:
        loop = asyncio.get_running_loop()
        for sig in installed:
            loop.remove_signal_handler(sig)
        if client is not None:
            await client.aclose()


def _parse(argv: Sequence[str] | None) -> ProducerSettings | int:
    try:
        args = build_parser().parse_args(argv)
        settings = ProducerSettings.from_args(args)
        setup_logging(settings.common.log_level, settings.common.log_format)
        if settings.spider:  # --crawl defaults to the spider's name
            settings = replace(settings, common=replace(settings.common, crawl=crawl_of(
                load_spider(settings.spider), settings.common.crawl,
                given="--crawl" in settings.common.given)))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    log.debug("producer_settings", extra={"redis_url": redact_url(settings.common.redis_url),
                                          "crawl": settings.common.crawl})
    return settings


async def main_async(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
                     stdin: BinaryIO | None = None) -> int:
    """``main`` for a caller that already runs an event loop (tests, the demo)."""
    settings = _parse(argv)
    if isinstance(settings, int):
        return settings
    return await run(settings, out=out, stdin=stdin)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``crawlq-producer`` / ``python -m producer``; returns the exit code."""
    settings = _parse(argv)
    if isinstance(settings, int):
        return settings
    # The pipeline allocates a few short-lived objects per URL and makes no cycles: a
    # young-generation collection every 700 allocations would cost more than it frees.
    gc.set_threshold(100_000, 50, 100)
    gc.freeze()  # and the objects of the imports never need scanning again
    try:
        return run_loop(run(settings))
    except KeyboardInterrupt:
        return 130
