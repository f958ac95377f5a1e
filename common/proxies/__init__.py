"""The crawl's proxy pool, fleet-wide (docs/proxies.md).

``spec``: a proxy as a consumer knows it (URL, tier, id, shown form); ``rules``: the
crawl policy's proxy options; ``health``: the pool as Redis holds it, read in one round
trip; ``reports``: a consumer's outcomes, sent with its flush (``proxy_report.lua``,
``proxy_bans.lua``).
"""

from common.proxies.health import HostTier, PoolView, ProxyHealth, effective_tier, read_pool
from common.proxies.reports import Report, ReportCalls, send_report
from common.proxies.rules import ProxyRules
from common.proxies.spec import DEFAULT_TIER, DIRECT, DIRECT_ID, ProxySpec, proxy_spec

__all__ = ["DEFAULT_TIER", "DIRECT", "DIRECT_ID", "HostTier", "PoolView", "ProxyHealth",
           "ProxyRules", "ProxySpec", "Report", "ReportCalls", "effective_tier",
           "proxy_spec", "read_pool", "send_report"]
