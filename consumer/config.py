"""The consumer's settings: every option a flag and a ``CRAWLQ_*`` environment variable."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.browser.chromium import BrowserSettings, find_chromium
from common.config import (
    ALLOW_PRIVATE,
    COMMON_OPTIONS,
    SPIDER,
    CommonSettings,
    Option,
    add_options,
    defaults,
    duration,
    option_values,
    size,
)
from common.errors import ConfigError
from common.http.results import FetchSettings
from common.names import WORKER_ID_RULE, validate_worker_id, worker_id_part
from common.policy import CONSUMER
from common.policy.command_flags import policy_flag
from common.proxies.spec import DEFAULT_TIER, ProxySpec, proxy_spec
from common.tasks.headers import parse_header_lines
from consumer.sinks import SINK_KINDS, sink_kind


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP network: {text!r} (try 10.0.0.0/8)"
                                         ) from None


def _headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple(parse_header_lines(lines, ConfigError, "--header / CRAWLQ_HEADERS").items())


def _proxy_specs(texts: list[str]) -> tuple[ProxySpec, ...]:
    """``--proxy`` values as the pool's proxies (ConfigError never echoes a URL: it may
    hold a password)."""
    specs = []
    for i, text in enumerate(texts):
        try:
            specs.append(proxy_spec(text))
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--proxy #{i + 1}: {exc}") from None
    if len({spec.id for spec in specs}) < len(specs):
        raise ConfigError("--proxy: a proxy is given twice (same scheme, user, host and port)")
    return tuple(specs)


def _worker_id(text: str) -> str:
    return text or default_worker_id()


def _worker_id_ok(text: str) -> None:
    if text:  # empty: the default, host-pid-random
        validate_worker_id(text)


def _browser_ok(text: str) -> None:
    if text:  # empty: no browser
        find_chromium(text)


#: --redis-wait 0: how long Redis may stay unreachable at start-up, per mode. A service
#: outlives a Redis restart or a slow rollout; a batch job must fail, not hang.
SERVICE_REDIS_WAIT_S = 15 * 60.0
BATCH_REDIS_WAIT_S = 30.0

#: The fetcher's own defaults, which its flags take.
_FETCH = FetchSettings()


CONSUMER_OPTIONS = (
    Option("--concurrency", "CRAWLQ_CONCURRENCY", 64, "fetches in flight in this process",
           type=int),
    Option("--lease", "CRAWLQ_LEASE", 60.0,
           "lease length; a dead consumer's tasks come back after this (e.g. 60s)",
           type=duration, field="lease_s"),
    Option("--lease-batch", "CRAWLQ_LEASE_BATCH", 0,
           "tasks per lease/ack round trip (0 = derived from --concurrency)", type=int,
           field="batch_size"),
    policy_flag("per_host_concurrency", CONSUMER),
    policy_flag("per_host_delay", CONSUMER, field="per_host_delay_s"),
    policy_flag("accept_content_type", CONSUMER),
    Option("--timeout", "CRAWLQ_TIMEOUT", _FETCH.total_timeout, "total time for one fetch, "
           "redirects and body included", type=duration, field="fetch.total_timeout"),
    Option("--connect-timeout", "CRAWLQ_CONNECT_TIMEOUT", _FETCH.connect_timeout,
           "TCP+TLS connect timeout", type=duration, field="fetch.connect_timeout"),
    Option("--read-timeout", "CRAWLQ_READ_TIMEOUT", _FETCH.sock_read_timeout,
           "longest silence while reading", type=duration, field="fetch.sock_read_timeout"),
    Option("--max-body-bytes", "CRAWLQ_MAX_BODY_BYTES", _FETCH.max_body_bytes,
           "body cap, counted on decompressed bytes (e.g. 10MiB)", type=size,
           field="fetch.max_body_bytes"),
    policy_flag("user_agent", CONSUMER, field="fetch.user_agent"),
    Option("--header", "CRAWLQ_HEADERS", [], "'Name: value' sent on every request of the "
           "crawl, repeatable (env: one per line); credential headers are never shown, "
           "never sent to robots.txt, dropped on a redirect to another origin",
           append=True, env_separator="\n", secret=True, field="fetch.headers", convert=_headers),
    Option("--proxy", "CRAWLQ_PROXIES", [], "HTTP(S) proxy URL of the crawl's proxy pool, "
           "[TIER=]URL (e.g. residential=http://user:pass@gate:8000; no tier: "
           f"{DEFAULT_TIER}), repeatable (env: comma separated); each request goes through "
           "the pool's pick for its host (docs/proxies.md)", append=True, secret=True,
           field="proxies", convert=_proxy_specs),
    replace(ALLOW_PRIVATE, field="fetch.allow_private"),
    Option("--allow-network", "CRAWLQ_ALLOW_NETWORKS", [],
           "a network the SSRF guard lets through, repeatable (e.g. 10.1.0.0/16)",
           type=_network, append=True, field="fetch.allow_networks", convert=tuple),
    policy_flag("ignore_robots", CONSUMER),
    policy_flag("robots_ttl", CONSUMER, field="robots_ttl_s"),
    Option("--sink", "CRAWLQ_SINK", "jsonl", f"where results go: {', '.join(SINK_KINDS)}, "
           "or postgres://user@host:5432/db[?table=...] (items upserted by key; the password "
           "from PGPASSWORD)",
           check=sink_kind),
    Option("--output", "CRAWLQ_OUTPUT", Path("crawlq-output"),
           "directory for jsonl/warc files", type=Path),
    Option("--rotate-size", "CRAWLQ_ROTATE_SIZE", 256 * 2**20,
           "start a new result file past this size", type=size, field="rotate_bytes"),
    Option("--gzip", "CRAWLQ_GZIP", False, "gzip jsonl files", flag_only_bool=True),
    Option("--store-body", "CRAWLQ_STORE_BODY", False, "store response bodies in jsonl "
           "and stream results (WARC always does)", flag_only_bool=True),
    Option("--stream-maxlen", "CRAWLQ_STREAM_MAXLEN", 1_000_000,
           "approximate cap of the redis-stream sink", type=int),
    Option("--sink-retry-for", "CRAWLQ_SINK_RETRY_FOR", 60.0, "when the sink refuses "
           "writes (disk full, read-only, Redis refusing the stream): stop leasing, release "
           "the unwritten tasks, retry this long, then exit 6", type=duration,
           field="sink_retry_for_s"),
    Option("--handler", "CRAWLQ_HANDLER", "", "async handler module:function, given each "
           "response; may return items and new URLs (e.g. consumer.handlers:links)"),
    SPIDER,
    policy_flag("max_depth", CONSUMER),
    Option("--max-links", "CRAWLQ_MAX_LINKS", 10_000, "most links taken from one page; "
           "the rest are dropped and counted (crawlq_links_total{fate=\"capped\"})",
           type=int),
    Option("--link-cache", "CRAWLQ_LINK_CACHE", 50_000, "discovered URLs this consumer "
           "remembers having sent to the crawl's dedup, so links repeated on every page "
           "skip it (0 = off; ~200 bytes each)", type=int),
    policy_flag("allow_domains", CONSUMER, repeatable=True),
    Option("--http-host", "CRAWLQ_HTTP_HOST", "127.0.0.1",
           "address of /healthz, /readyz and /metrics"),
    Option("--http-port", "CRAWLQ_HTTP_PORT", 9410,
           "port of /healthz, /readyz and /metrics (0 = any free port, -1 = off)", type=int),
    Option("--grace", "CRAWLQ_GRACE", 20.0, "on SIGTERM, how long in-flight fetches may "
           "finish before the rest is released", type=duration, field="grace_s"),
    Option("--exit-when-empty", "CRAWLQ_EXIT_WHEN_EMPTY", False,
           "exit 0 once nothing is pending, leased or waiting in the whole crawl",
           flag_only_bool=True),
    Option("--empty-grace", "CRAWLQ_EMPTY_GRACE", 5.0, "with --exit-when-empty: keep "
           "waiting this long after start for a producer", type=duration, field="empty_grace_s"),
    policy_flag("retry_base", CONSUMER, field="retry_base_s"),
    policy_flag("retry_cap", CONSUMER, field="retry_cap_s"),
    policy_flag("max_retry_after", CONSUMER, field="max_retry_after_s"),
    policy_flag("max_stalls", CONSUMER),
    Option("--worker-id", "CRAWLQ_WORKER_ID", "", "this consumer's id (default "
           f"host-pid-random); {WORKER_ID_RULE}", check=_worker_id_ok, convert=_worker_id),
    Option("--allow-evicting-redis", "CRAWLQ_ALLOW_EVICTING_REDIS", False, "run on a Redis "
           "whose maxmemory-policy is not noeviction (it deletes tasks when full), with a "
           "warning; without it the consumer exits 2", flag_only_bool=True),
    Option("--browser", "CRAWLQ_BROWSER", "", "render the crawl's render requests in this "
           "Chromium: auto (the first of chromium, chromium-browser, google-chrome on the "
           "PATH) or its path; none (the default): this consumer leases no render request. "
           "Nothing is downloaded: without a Chromium the consumer exits at start saying "
           "so", check=_browser_ok),
    Option("--browser-pages", "CRAWLQ_BROWSER_PAGES", 4, "with --browser: pages rendered "
           "at once", type=int),
    Option("--browser-recycle", "CRAWLQ_BROWSER_RECYCLE", 50, "with --browser: a page's "
           "browser context is closed and made anew after this many renders", type=int),
    Option("--browser-restart", "CRAWLQ_BROWSER_RESTART", 1000, "with --browser: the "
           "browser is restarted after this many renders", type=int),
    Option("--browser-memory", "CRAWLQ_BROWSER_MEMORY", 0, "with --browser: memory (PSS) "
           "of this consumer and its browsers past which it renders fewer pages at once "
           "and restarts its browser (e.g. 2GiB; 0 = no bound)", type=size),
    Option("--gc-threshold", "CRAWLQ_GC_THRESHOLD", 10_000,
           "Python GC generation-0 threshold (0 = Python's default, 700)", type=int),
)


def default_worker_id() -> str:
    """host-pid-random: unique even when replicas share a hostname (host networking).

    A host name outside the worker id rule (`WORKER_ID_RULE`) has those characters
    replaced, so the default id is always valid."""
    host = worker_id_part(socket.gethostname()[:32]) or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


_DEFAULT = defaults(CONSUMER_OPTIONS)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Everything the consumer needs, built once in main() (defaults: `CONSUMER_OPTIONS`')."""

    common: CommonSettings = field(default_factory=CommonSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    concurrency: int = _DEFAULT["concurrency"]
    lease_s: float = _DEFAULT["lease_s"]
    batch_size: int = _DEFAULT["batch_size"]
    per_host_concurrency: int = _DEFAULT["per_host_concurrency"]
    per_host_delay_s: float = _DEFAULT["per_host_delay_s"]
    accept_content_type: tuple[str, ...] = _DEFAULT["accept_content_type"]
    ignore_robots: bool = _DEFAULT["ignore_robots"]
    robots_ttl_s: float = _DEFAULT["robots_ttl_s"]
    sink: str = _DEFAULT["sink"]
    output: Path = _DEFAULT["output"]
    rotate_bytes: int = _DEFAULT["rotate_bytes"]
    gzip: bool = _DEFAULT["gzip"]
    store_body: bool = _DEFAULT["store_body"]
    stream_maxlen: int = _DEFAULT["stream_maxlen"]
    sink_retry_for_s: float = _DEFAULT["sink_retry_for_s"]
    handler: str = _DEFAULT["handler"]
    spider: str = _DEFAULT["spider"]
    max_depth: int = _DEFAULT["max_depth"]
    max_links: int = _DEFAULT["max_links"]
    link_cache: int = _DEFAULT["link_cache"]
    allow_domains: tuple[str, ...] = _DEFAULT["allow_domains"]
    proxies: tuple[ProxySpec, ...] = _DEFAULT["proxies"]  # the pool's (FetchSettings' URLs)
    http_host: str = _DEFAULT["http_host"]
    http_port: int = _DEFAULT["http_port"]
    grace_s: float = _DEFAULT["grace_s"]
    exit_when_empty: bool = _DEFAULT["exit_when_empty"]
    empty_grace_s: float = _DEFAULT["empty_grace_s"]
    retry_base_s: float = _DEFAULT["retry_base_s"]
    retry_cap_s: float = _DEFAULT["retry_cap_s"]
    max_retry_after_s: float = _DEFAULT["max_retry_after_s"]
    max_stalls: int = _DEFAULT["max_stalls"]
    worker_id: str = field(default_factory=default_worker_id)
    allow_evicting_redis: bool = _DEFAULT["allow_evicting_redis"]
    browser: str = _DEFAULT["browser"]
    browser_pages: int = _DEFAULT["browser_pages"]
    browser_recycle: int = _DEFAULT["browser_recycle"]
    browser_restart: int = _DEFAULT["browser_restart"]
    browser_memory: int = _DEFAULT["browser_memory"]
    gc_threshold: int = _DEFAULT["gc_threshold"]

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError("--concurrency must be >= 1")
        if self.lease_s < 1:
            raise ConfigError("--lease must be at least 1s (heartbeats renew at a third)")
        if self.sink_retry_for_s < 0:
            raise ConfigError("--sink-retry-for must be >= 0")
        if self.per_host_concurrency < 0 or self.per_host_delay_s < 0:
            raise ConfigError("--per-host-concurrency and --per-host-delay must be >= 0")
        if min(self.max_stalls, self.batch_size, self.gc_threshold,
               self.max_links, self.link_cache) < 0 or self.max_depth < -1:
            raise ConfigError("--max-depth (or none), --max-stalls, --lease-batch, "
                              "--gc-threshold, --max-links and --link-cache must be >= 0")
        if self.retry_cap_s < self.retry_base_s:
            raise ConfigError(f"--retry-cap ({self.retry_cap_s:g}s) must be >= --retry-base "
                              f"({self.retry_base_s:g}s)")

    @property
    def browser_settings(self) -> BrowserSettings | None:
        """The browser this consumer renders with (None: no --browser); ConfigError when
        --browser names no Chromium."""
        if not self.browser:
            return None
        return BrowserSettings(find_chromium(self.browser), self.browser_pages,
                               self.browser_recycle, self.browser_restart,
                               self.browser_memory)

    @property
    def lease_ms(self) -> int:
        return int(self.lease_s * 1000)

    @property
    def redis_wait_limit_s(self) -> float:
        """How long Redis may go unanswered at start-up: --redis-wait (a common option),
        or its mode's."""
        return self.common.redis_wait_limit(
            BATCH_REDIS_WAIT_S if self.exit_when_empty else SERVICE_REDIS_WAIT_S)

    @property
    def lease_batch(self) -> int:
        """Tasks per lease call: enough to keep every fetch slot busy, no more."""
        return self.batch_size or max(8, min(500, self.concurrency * 2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crawlq-consumer",
        description="Lease URLs from a crawlq queue, fetch them politely, write results.",
    )
    add_options(parser, (*COMMON_OPTIONS, *CONSUMER_OPTIONS))
    return parser


def settings_from_args(args: argparse.Namespace) -> ConsumerSettings:
    """Build the settings from parsed arguments, through CONSUMER_OPTIONS (ConfigError on a
    bad combination)."""
    values = option_values(CONSUMER_OPTIONS, args)
    # No pool limits (FetchSettings' defaults): the crawl's policy, through the lease, is
    # the only per-host limit, and --concurrency bounds this process's fetches. The
    # fetcher holds the proxies' URLs too (checked there, scrubbed from its messages).
    fetch = FetchSettings(**values.pop("fetch"),
                          proxies=tuple(p.url for p in values["proxies"] if p.url))
    return ConsumerSettings(common=CommonSettings.from_args(args), fetch=fetch, **values)
