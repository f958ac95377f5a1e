"""Prometheus metrics of a crawlq process, built on the official `prometheus-client`.

prometheus-client is the standard Python client: it does the exposition format, label
escaping, histogram buckets and content negotiation, so nothing here writes the text
format by hand. Every metric lives in a `CollectorRegistry` owned by a `Metrics`
instance (never the process-global default registry), so tests build fresh ones.

Naming follows the Prometheus conventions: one prefix (``crawlq_``), base units
(``_seconds``, ``_bytes``), ``_total`` on counters. Labels are bounded: an outcome, a
status class or a reason code, never a URL or a host. The helper methods (`task`,
`response`, `error`) fold any value that does not look like a short snake_case code
into ``other``, so a URL can never become a label value by mistake.

The two series a consumer touches on every page are cheap to feed: `response` only
tallies (folded into the counters by `publish`, which the consumer calls once per flush
and `render` calls before every scrape), and the fetch-duration histogram is a plain
custom collector (`FetchHistogram`) rather than prometheus-client's locked Histogram.

    crawlq_tasks_total{outcome}             tasks finished, by outcome
    crawlq_fetch_duration_seconds           histogram of fetch wall time
    crawlq_responses_total{status_class}    responses by 1xx..5xx, or "error" (no response)
    crawlq_errors_total{kind}               errors by reason code (FetchError.reason ...)
    crawlq_in_flight                        gauge: tasks being fetched right now
    crawlq_redis_evicting                   gauge: 1 if the Redis (any Cluster primary)
                                            evicts keys (--allow-evicting-redis), 0 if
                                            not, -1 if its policy can't be read
    crawlq_leases_renewed_total             lease extensions that succeeded
    crawlq_leases_lost_total                leases found expired or taken by another worker
    crawlq_reclaimed_total                  expired leases put back in the ready queue
    crawlq_robots_turns_total               robots.txt fetches that took a task's turn
    crawlq_late_turns_total                 late requests that took a turn of their own
    crawlq_proxy_requests_total{outcome}    requests through the proxy pool (--proxy): ok,
                                            failed (the proxy itself), banned (a block
                                            answer), gone (no proxy could reach the host)
    crawlq_response_bytes_total             response body bytes received
    crawlq_redis_errors_total               Redis commands that failed
    crawlq_sink_errors_total                result sink writes (and probes) that failed:
                                            full or read-only volume, Redis refusing the
                                            results stream
    crawlq_links_total{fate}                links handlers found: cached (skipped by the
                                            consumer's seen cache), sent (to the crawl's
                                            dedup), invalid, out_of_scope, too_deep
                                            (past the policy's max_depth), capped,
                                            and one fate per trap rule that refused it
                                            (trap_length, trap_segments, trap_repeats,
                                            trap_params, trap_facets, trap_variants:
                                            common.traps.rules), and the links of pages
                                            judged near_duplicate or soft_404 that
                                            were not followed (consumer.judgement)

The crawl's revisit schedule, read from Redis by each consumer every few seconds and
served only for a crawl with revisits on or any URL's history (`RevisitFigures`). They
are the crawl's, the same in every consumer: aggregate them with max(), not sum(). What
revisits found is ``crawlq_tasks_total{outcome=not_modified|unchanged|changed}``.

    crawlq_revisits_scheduled               gauge: URLs waiting for their next visit
    crawlq_revisits_due                     gauge: those whose next visit has come
    crawlq_revisits_total                   revisits brought back to their hosts' queues
    crawlq_revisits_late_seconds{quantile}  how late they were brought back (0.5, 0.99;
                                            a lateness bucket's bound, +Inf past a day)
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from common.reasons import NEAR_DUPLICATE, SOFT_404
from common.traps.rules import REFUSALS

if TYPE_CHECKING:
    from common.queue.model import RevisitStats

__all__ = ["FETCH_BUCKETS", "LINK_FATES", "NOT_FOLLOWED", "OUTCOMES", "STATUS_CLASSES",
           "FetchHistogram", "Metrics", "RevisitFigures", "status_class"]

NAMESPACE: Final = "crawlq"

# Outcomes of a task, pre-created at 0 so dashboards see every series from the start.
OUTCOMES: Final = (
    "ok",
    "http_4xx",
    "robots_disallowed",
    "filtered",
    "not_modified",
    "unchanged",
    "changed",
    "gone",
    "near_duplicate",
    "soft_404",
    "probe",
    "retried",
    "dead",
    "stale",
    "released",
)
# What becomes of a link a handler found (consumer.intake), pre-created at 0 too.
LINK_FATES: Final = ("cached", "sent", "invalid", "out_of_scope", "too_deep", "capped",
                     *REFUSALS, NEAR_DUPLICATE, SOFT_404)
#: The fates of links not followed: the consumers add them to the crawl's stats too
#: (``links:<fate>``), where ``crawlq stats``, ``crawlq run`` and the dashboard read them.
NOT_FOLLOWED: Final = tuple(f for f in LINK_FATES if f not in ("cached", "sent"))
STATUS_CLASSES: Final = ("1xx", "2xx", "3xx", "4xx", "5xx", "error")
# Web fetches: from a cached 10 ms to a 60 s timeout.
FETCH_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

_LABEL_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_]{0,39}$")
OTHER: Final = "other"
_K = TypeVar("_K")


def _code(value: str) -> str:
    """A label value: `value` if it is a short snake_case code, otherwise ``other``."""
    return value if _LABEL_RE.match(value) else OTHER


def _child(cache: dict[_K, Counter], key: _K, metric: Counter,
           label: Callable[[_K], str]) -> Counter:
    """`metric`'s child labelled `label(key)`, kept by raw `key` (up to 256 of them: raw
    values need not be bounded, the labels are)."""
    child = cache.get(key)
    if child is None:
        child = metric.labels(label(key))
        if len(cache) < 256:
            cache[key] = child
    return child


def status_class(status: int | None) -> str:
    """``2xx`` for 200..299 and so on; ``error`` for no response or a nonsense status."""
    if status is None or not 100 <= status <= 599:
        return "error"
    return f"{status // 100}xx"


class FetchHistogram:
    """A label-free histogram observed from one thread, registered as a custom collector.

    prometheus-client's Histogram takes two locks and walks its buckets on every
    observation (~0.7 us); a consumer observes once a page, on its event loop, which also
    serves /metrics, so plain counts and a bisect do (~0.15 us). Exposed exactly like a
    Histogram's ``_bucket``/``_count``/``_sum`` series.
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float],
                 registry: CollectorRegistry) -> None:
        self.name = f"{NAMESPACE}_{name}"
        self.documentation = documentation
        self._bounds = (*sorted(buckets), math.inf)
        self._les = ["+Inf" if b == math.inf else repr(float(b)) for b in self._bounds]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        """Count one observation (in the first bucket whose bound is >= value)."""
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> list[Metric]:
        buckets, total = [], 0
        for le, n in zip(self._les, self._counts, strict=True):
            total += n
            buckets.append((le, float(total)))
        return [HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                      sum_value=self._sum)]

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]


class RevisitFigures:
    """The crawl's revisit schedule as last read (`stats`; None: revisits off and no
    history, then nothing is served), registered as a custom collector."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stats: RevisitStats | None = None
        registry.register(self)

    def collect(self) -> list[Metric]:
        rv = self.stats
        if rv is None:
            return []
        name = f"{NAMESPACE}_revisits"
        late = GaugeMetricFamily(f"{name}_late_seconds", "How late revisits were brought "
                                 "back after their due time (a bucket's upper bound).",
                                 labels=["quantile"])
        for q, value in (("0.5", rv.late_p50_s), ("0.99", rv.late_p99_s)):
            if value is not None:
                late.add_metric([q], value)
        return [
            GaugeMetricFamily(f"{name}_scheduled", "URLs on the crawl's revisit schedule.",
                              value=rv.scheduled),
            GaugeMetricFamily(f"{name}_due", "Scheduled URLs whose next visit has come.",
                              value=rv.due),
            CounterMetricFamily(name, "Revisits the crawl brought back to their hosts' "
                                "queues.", value=rv.revisits),
            late,
        ]

    def describe(self) -> list[Metric]:
        return []


class Metrics:
    """Every metric of one process, in its own registry.

    Metric objects are public attributes (``metrics.in_flight.inc()``); the helper
    methods cover the labelled ones and keep label values bounded.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.tasks_total = Counter(
            "tasks_total",
            "Tasks finished, by outcome.",
            ["outcome"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.fetch_duration_seconds = FetchHistogram(
            "fetch_duration_seconds",
            "Wall time of one fetch, connect to last body byte.",
            FETCH_BUCKETS,
            reg,
        )
        self.responses_total = Counter(
            "responses_total",
            "HTTP responses by status class; error when none arrived.",
            ["status_class"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.errors_total = Counter(
            "errors_total",
            "Errors by reason code.",
            ["kind"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.proxy_requests_total = Counter(
            "proxy_requests_total",
            "Requests through the proxy pool, by outcome: ok, failed (the proxy itself), "
            "banned (a block answer), gone (no proxy could reach the host).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.pushbacks_total = Counter(
            "pushbacks_total",
            "Responses that count as their host pushing back (the crawl policy's "
            "backoff_on), by reason code: each raises the host's backoff fleet-wide.",
            ["kind"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.robots_crawl_delay_capped_total = Counter(
            "robots_crawl_delay_capped_total",
            "robots.txt Crawl-delays longer than the crawl policy's max_crawl_delay, "
            "obeyed only up to it.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.soft404_probes_total = Counter(
            "soft404_probes_total",
            "Probes this consumer claimed and enqueued: requests for a path that cannot "
            "exist, which give a host's (or a directory's) soft-404 signature.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.in_flight = Gauge(
            "in_flight",
            "Tasks being fetched right now.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.redis_evicting = Gauge(
            "redis_evicting",
            "1 if the Redis's maxmemory-policy evicts keys (it deletes tasks when full), "
            "0 if noeviction, -1 if unknown; read at start-up.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.leases_renewed_total = Counter(
            "leases_renewed_total",
            "Lease extensions that succeeded.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.leases_lost_total = Counter(
            "leases_lost_total",
            "Leases that expired or were taken before the work finished.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.reclaimed_total = Counter(
            "reclaimed_total",
            "Expired leases put back in the ready queue.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.robots_turns_total = Counter(
            "robots_turns_total",
            "robots.txt fetches that took a task's turn at its host (the task waits for the next).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.late_turns_total = Counter(
            "late_turns_total",
            "Requests to a host with a delay that would have gone out late (robots.txt "
            "before its page, a page that waited for it) and took a turn of their own.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.response_bytes_total = Counter(
            "response_bytes_total",
            "Response body bytes received.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.redis_errors_total = Counter(
            "redis_errors_total",
            "Redis commands that failed.",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.sink_errors_total = Counter(
            "sink_errors_total",
            "Result sink writes and probes that failed (the tasks of a failed write are "
            "released, not acked).",
            namespace=NAMESPACE,
            registry=reg,
        )
        self.links_total = Counter(
            "links_total",
            "Links handlers found, by fate: cached (seen lately by this consumer), sent "
            "(to the crawl's dedup), invalid, out_of_scope, too_deep (past max_depth), "
            "capped (past --max-links), trap_length, trap_segments, trap_repeats, "
            "trap_params, trap_facets, trap_variants (a trap rule of the crawl's policy "
            "refused it).",
            ["fate"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.revisits = RevisitFigures(reg)
        # Labelled children by raw value: `labels()` costs a few us (lock, tuple key,
        # validation) and the consumer counts every page.
        self._tasks: dict[str, Counter] = {}
        self._responses: dict[int | None, Counter] = {}
        self._errors: dict[str, Counter] = {}
        self._pending_responses: dict[int | None, int] = {}
        self._pending_bytes = 0
        for outcome in OUTCOMES:
            self.tasks_total.labels(outcome=outcome)
        for cls in STATUS_CLASSES:
            self.responses_total.labels(status_class=cls)
        self._links = {fate: self.links_total.labels(fate=fate) for fate in LINK_FATES}

    def task(self, outcome: str, n: int = 1) -> None:
        """Count `n` tasks finished with `outcome` (an OUTCOMES entry or another code)."""
        _child(self._tasks, outcome, self.tasks_total, _code).inc(n)

    def response(self, status: int | None, nbytes: int = 0) -> None:
        """Count one response by status class (None: no response) and its body bytes
        (tallied here, in the counters from the next `publish`)."""
        pending = self._pending_responses
        pending[status] = pending.get(status, 0) + 1
        self._pending_bytes += nbytes

    def publish(self) -> None:
        """Fold the tallies of `response` into their counters."""
        pending = self._pending_responses
        for status, n in pending.items():
            _child(self._responses, status, self.responses_total, status_class).inc(n)
        pending.clear()
        if self._pending_bytes > 0:
            self.response_bytes_total.inc(self._pending_bytes)
        self._pending_bytes = 0

    def links(self, fate: str, n: int) -> None:
        """Count `n` links a handler found that met `fate` (one of LINK_FATES)."""
        self._links[fate].inc(n)

    def error(self, kind: str) -> None:
        """Count one error by reason code (``timeout``, ``dns``, ``http_500`` ...)."""
        _child(self._errors, kind, self.errors_total, _code).inc()

    def pushback(self, kind: str) -> None:
        """Count one push-back by reason code (``http_429``, ``http_5xx``, ``timeout`` ...)."""
        self.pushbacks_total.labels(_code(kind)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for a /metrics handler."""
        self.publish()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
