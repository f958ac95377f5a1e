"""A consumer's browser in its /metrics (prometheus-client's custom collector, read at
each scrape from the pool's figures and the fetcher's counts):

    crawlq_browser_renders_total            pages rendered (their DOM taken or failed)
    crawlq_browser_started_total            browsers started (restarts and crashes included)
    crawlq_browser_crashes_total            browsers that died while the pool used them
    crawlq_browser_contexts_total           browser contexts made (recycled every N pages)
    crawlq_browser_shrinks_total            times the pool went over its memory bound
    crawlq_browser_memory_bytes             gauge: the consumer's and its browsers' PSS
    crawlq_browser_pages                    gauge: pages it renders at once now
    crawlq_browser_ssrf_refused_total       requests of rendered pages the SSRF guard refused
    crawlq_browser_sinkhole_total           connections Chromium opened itself (to the
                                            sinkhole proxy: never to their address)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from common.browser.fetcher import BrowserFetcher

__all__ = ["BrowserCollector"]


class BrowserCollector(Collector):
    """The browser's figures, collected at each scrape."""

    def __init__(self, browser: BrowserFetcher) -> None:
        self.browser = browser

    def collect(self) -> Iterable[Metric]:
        f = self.browser.pool.figures
        for name, doc, value in (
                ("renders", "Pages rendered.", f.renders),
                ("started", "Browsers started.", f.browsers),
                ("crashes", "Browsers that died while in use.", f.crashes),
                ("contexts", "Browser contexts made.", f.contexts),
                ("shrinks", "Times the page pool went over its memory bound.", f.shrinks),
                ("ssrf_refused", "Requests of rendered pages the SSRF guard refused.",
                 self.browser.ssrf_refused),
                ("sinkhole", "Connections Chromium opened itself (to the sinkhole).",
                 self.browser.pool.proxy_connections)):
            yield CounterMetricFamily(f"crawlq_browser_{name}", doc, value=value)
        yield GaugeMetricFamily("crawlq_browser_memory_bytes",
                                "PSS of the consumer and its browsers.", value=f.memory)
        yield GaugeMetricFamily("crawlq_browser_pages", "Pages rendered at once now.",
                                value=self.browser.pool.capacity)
