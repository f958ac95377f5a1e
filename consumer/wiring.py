"""Wires the consumer together from its settings: Redis, queue, fetcher, sink, server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from common.browser.metrics import BrowserCollector
from common.errors import ConfigError
from common.exitcodes import EXIT_REDIS, EXIT_SINK
from common.http.fetcher import Fetcher
from common.keys import CrawlKeys
from common.observability.metrics import Metrics
from common.policy import (
    CONSUMER,
    CrawlPolicy,
    ensure_policy,
    flag_differences,
    read_policy,
    seeded_by,
    sync_partitions,
)
from common.queue import CrawlQueue, LeasingQueue, migrate_crawl
from common.redis.connection import RedisClient, open_redis
from common.redis.errors import REDIS_ERRORS, redis_error_message
from common.redis.startup import RedisGaveUpError, StartupStopped, StartupWait
from common.spider import Spider, crawl_of, load_spider
from common.urls.redact import redact_url
from consumer.backoff import Backoff
from consumer.config import ConsumerSettings
from consumer.flush import describe_error
from consumer.handlers import load_handler
from consumer.http_server import SideServer
from consumer.lifecycle import Consumer, prepare
from consumer.live import Live, LivePolicy
from consumer.redis_check import check_redis
from consumer.robots import RobotsCache
from consumer.sinks import SinkUnavailableError, make_sink, sink_target

if TYPE_CHECKING:
    from common.browser.fetcher import BrowserFetcher

log = logging.getLogger("consumer")


def _startup_wait(settings: ConsumerSettings, stop: asyncio.Event) -> StartupWait:
    """The wait of this consumer's start-up for Redis: each failed try a WARNING
    (``redis_unreachable``), up to --redis-wait (`redis_wait_limit_s`)."""
    def tried(step: str, exc: BaseException) -> None:
        log.warning("redis_unreachable", extra={"step": step, "error": str(exc)[:200]})

    return StartupWait(settings.common.redis_url, settings.redis_wait_limit_s,
                       on_wait=tried, stop=stop)


def _gave_up(exc: RedisGaveUpError) -> int:
    """One ERROR line (``redis_unreachable_giving_up``): the URL (password hidden), the
    step, the time waited and what to check; EXIT_REDIS."""
    log.error("redis_unreachable_giving_up", extra={
        "redis_url": redact_url(exc.url), "step": exc.step, "waited_s": round(exc.waited_s, 1),
        "error": str(exc.error)[:200], "exit_code": EXIT_REDIS, "advice": str(exc)})
    return EXIT_REDIS


def _refused(exc: RedisError, url: str) -> int:
    """Redis refused a start-up step for good (the login, an ACL, out of memory): one
    ERROR line (``redis_refused``), EXIT_REDIS; anything else is a bug, raised."""
    said = redis_error_message(exc, url)
    if said is None:
        raise exc
    log.error("redis_refused", extra={"redis_url": redact_url(url), "error": str(exc)[:200],
                                      "exit_code": EXIT_REDIS, "advice": said})
    return EXIT_REDIS


async def _wait_for_crawl(settings: ConsumerSettings, client: RedisClient,
                          stop: asyncio.Event, wait: StartupWait, spider: Spider | None
                          ) -> LeasingQueue | None:
    """Open the crawl, waiting for a producer to create it (None: stopped, or no crawl
    with --exit-when-empty) and through a Redis outage (`wait`)."""
    # The flags' values until the consumer reads the crawl's policy, before its first lease.
    policy = _flag_policy(settings, spider).retry()
    backoff = Backoff(base=0.1, cap=2.0)
    started = time.monotonic()
    announced = ensured = False
    while not stop.is_set():
        try:
            if not ensured:  # a consumer that starts first gives the crawl its policy
                # A crawl of layout 2 or 3 is converted first: the policy's write reads its
                # settings, which refuse them (common.queue.migrate).
                await migrate_crawl(client, settings.common.crawl)
                await _ensure_policy(client, settings, spider)
                ensured = True
            if await client.exists(CrawlKeys.build(settings.common.crawl).meta):
                return await LeasingQueue.existing(client, settings.common.crawl,
                                                   retry=policy)
        except REDIS_ERRORS as exc:
            wait.failed("crawl", exc)
            await wait.pause()
            continue  # no answer: whether the crawl exists is not known
        wait.answered()
        if not announced:
            log.info("waiting_for_crawl", extra={"crawl": settings.common.crawl})
            announced = True
        if settings.exit_when_empty and time.monotonic() - started > settings.empty_grace_s:
            log.warning("no_such_crawl", extra={"crawl": settings.common.crawl})
            return None
        await backoff.sleep(stop)
    return None


async def _connect(settings: ConsumerSettings) -> RedisClient:
    """A Redis client (one made without asking the server, ``--cluster no``, has not
    heard from Redis yet: the next step finds out)."""
    return await open_redis(settings.common.redis_url, cluster=settings.common.cluster_mode,
                            wait_replicas=settings.common.wait_replicas,
                            wait_timeout_s=settings.common.wait_timeout_s)


def _out_of_memory(exc: ResponseError) -> bool:
    return isinstance(exc, OutOfMemoryError) or "OOM" in str(exc)


#: The policy options this consumer has flags for (the producer's keep their defaults).
SEEDS = frozenset(o.name for o in seeded_by(CONSUMER))


def _flag_policy(settings: ConsumerSettings, spider: Spider | None = None) -> CrawlPolicy:
    """The policy this consumer's crawl-level flags ask for (the options whose flags are
    the producer's at their defaults), under its spider's own values."""
    return _flags_of(settings).replace(spider.policy if spider is not None else {})


def _flags_of(settings: ConsumerSettings) -> CrawlPolicy:
    return CrawlPolicy(per_host_delay=settings.per_host_delay_s,
                       per_host_concurrency=settings.per_host_concurrency,
                       accept_content_type=settings.accept_content_type,
                       user_agent=settings.fetch.user_agent,
                       ignore_robots=settings.ignore_robots,
                       robots_ttl=settings.robots_ttl_s,
                       max_depth=settings.max_depth,
                       allow_domains=settings.allow_domains,
                       retry_base=settings.retry_base_s,
                       retry_cap=settings.retry_cap_s,
                       max_retry_after=settings.max_retry_after_s,
                       max_stalls=settings.max_stalls)


async def _ensure_policy(client: RedisClient, settings: ConsumerSettings,
                         spider: Spider | None) -> None:
    """Create the crawl's policy from this consumer's flags if the crawl has none; never
    change one that exists: a flag given (flag or env, not a default) that differs from
    it gets one WARNING (the crawl's value wins; `crawlq crawl set` changes it). A full
    Redis (at maxmemory) refuses the write, and the consumer goes on with what is stored."""
    crawl, wanted = settings.common.crawl, _flag_policy(settings, spider)
    try:
        stored, created = await ensure_policy(
            client, crawl, wanted, by=f"consumer {settings.worker_id} (created the crawl)",
            seeds=SEEDS)
    except ResponseError as exc:
        if not _out_of_memory(exc):
            raise
        log.warning("crawl_policy_not_written", extra={"error": str(exc)[:200]})
        return
    if created:
        log.info("crawl_policy_created", extra={"crawl": crawl, **wanted.texts()})
        return
    for differs in flag_differences(crawl, stored.policy, wanted, CONSUMER,
                                    given=settings.common.given):
        log.warning("crawl_policy_differs", extra=differs)


async def _sync_policy(queue: CrawlQueue) -> None:
    """Give the crawl's partitions its policy if they hold an older version (the crawl
    was created after the policy)."""
    try:
        stored = await read_policy(queue.client, queue.crawl, log_limit=0)
        if stored is not None:
            await sync_partitions(queue.client, queue.crawl, stored)
    except ResponseError as exc:
        if not _out_of_memory(exc):
            raise
        log.warning("crawl_policy_not_written", extra={"error": str(exc)[:200]})


def _item_tables(spider: Spider | None) -> dict[str, Any]:
    """The item types a spider's routes declare, and whether some route has none: the
    tables a PostgreSQL sink prepares at start."""
    if spider is None:
        return {}
    types = [r.item_type for r in spider.routes.values()]
    return {"item_types": [t for t in types if t], "untyped": None in types}


async def _start_browser(settings: ConsumerSettings, fetcher: Fetcher, live: Live
                         ) -> BrowserFetcher | None:
    """The browser of a consumer started with --browser (None without); ConfigError
    saying why when it can't start."""
    browser_settings = settings.browser_settings
    if browser_settings is None:
        return None
    from common.browser.fetcher import BrowserFetcher  # noqa: PLC0415 - psutil only here
    browser = BrowserFetcher(fetcher, browser_settings,
                             total_timeout=settings.fetch.total_timeout,
                             max_body_bytes=settings.fetch.max_body_bytes,
                             user_agent=live.user_agent)
    await browser.start()
    return browser


async def run(settings: ConsumerSettings) -> int:
    """Run one consumer until it is stopped; returns the exit code."""
    metrics = Metrics()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    consumer: Consumer | None = None

    def on_signal() -> None:
        stop.set()
        if consumer is not None:
            consumer.request_stop()

    async def ready_problem() -> str | None:
        if consumer is None:
            return "draining" if stop.is_set() else "starting: waiting for Redis and the crawl"
        return await consumer.ready_problem()

    try:
        handler = load_handler(settings.handler) if settings.handler else None
        spider = load_spider(settings.spider) if settings.spider else None
        if spider is not None:  # --crawl defaults to the spider's name
            settings = replace(settings, common=replace(settings.common, crawl=crawl_of(
                spider, settings.common.crawl, given="--crawl" in settings.common.given)))
        if spider is not None and handler is not None and spider.knows(None):
            raise ConfigError(f"--handler {settings.handler} and the --spider's default "
                              "route both parse requests without a label: drop one")
        async with contextlib.AsyncExitStack() as stack:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
                stack.callback(loop.remove_signal_handler, sig)
            # The side server comes first: /healthz must answer even while Redis is down.
            if settings.http_port >= 0:
                server = SideServer(settings.http_host, settings.http_port, metrics,
                                    ready_problem)
                port = await server.start(
                    any_port_if_taken="--http-port" not in settings.common.given)
                stack.push_async_callback(server.stop)
                log.info("http_listening", extra={"host": settings.http_host, "port": port})
            # Each start-up step waits through a Redis outage, up to --redis-wait.
            wait = _startup_wait(settings, stop)
            client = await wait.step("connect", lambda: _connect(settings))
            stack.push_async_callback(client.aclose)
            queue = await _wait_for_crawl(settings, client, stop, wait, spider)
            if queue is None:
                return 0
            refused = await wait.step("server settings", lambda: check_redis(
                client, metrics, allow_evicting=settings.allow_evicting_redis))
            if refused is not None:
                return refused
            sink = make_sink(settings.sink, output_dir=settings.output,
                             worker=settings.worker_id, crawl=settings.common.crawl,
                             redis=client, rotate_bytes=settings.rotate_bytes,
                             gzip=settings.gzip, store_body=settings.store_body,
                             stream_maxlen=settings.stream_maxlen,
                             stream_key=CrawlKeys.build(settings.common.crawl).results,
                             **_item_tables(spider))
            await wait.step("policy", lambda: _sync_policy(queue))
            try:
                await sink.open()
            except OSError as exc:  # e.g. --output on a read-only volume, a database down
                kind, target = sink_target(sink)
                log.error("sink_failed", extra={
                    "sink": kind, "target": target, "error": describe_error(exc),
                    "exit_code": EXIT_SINK,
                    "advice": f"{exc}; then restart" if isinstance(exc, SinkUnavailableError)
                    else f"the {kind} sink ({target}) can't be opened; fix the volume "
                         "(permissions, read-only mount, space), then restart"})
                return EXIT_SINK
            # One policy snapshot: the consumer reads the crawl's policy into it, the
            # fetcher and robots.txt cache read their user agent (and TTL) at each use.
            live = Live(LivePolicy.of_flags(settings))
            fetcher = await stack.enter_async_context(
                Fetcher(settings.fetch, user_agent=live.user_agent))
            browser = await _start_browser(settings, fetcher, live)
            if browser is not None:
                stack.push_async_callback(browser.close)
                metrics.registry.register(BrowserCollector(browser))
            # Always made: whether robots.txt is obeyed is the crawl policy's, live.
            robots = RobotsCache(client, settings.common.crawl, fetcher, policy=live)
            stack.push_async_callback(robots.close)
            consumer = Consumer(settings, queue, fetcher, sink, metrics, live=live,
                                robots=robots, handler=handler, spider=spider,
                                browser=browser)
            await prepare(consumer, wait)
            if stop.is_set():
                consumer.request_stop()
            return await consumer.run()
    except ConfigError as exc:
        log.error("config_error", extra={"error": str(exc)})
        return 2
    except StartupStopped:
        return 0
    except RedisGaveUpError as exc:
        return _gave_up(exc)
    except RedisError as exc:  # refused for good at start-up: waiting won't change it
        return _refused(exc, settings.common.redis_url)
