"""The crawl's proxy pool, fleet-wide (docs/proxies.md).

``spec``: a proxy as a consumer knows it (URL, tier, id, shown form); ``rules``: the
crawl policy's proxy options; ``health``: the pool as Redis holds it, read in one round
trip; ``reports``: a consumer's outcomes, sent with its flush (``proxy_report.lua``,
``proxy_bans.lua``); ``bans``: what a blocked answer looks like (a page that is a
site's refusal, which moves a host's proxy tier); ``sessions``: sessions kept in Redis, a
cookie jar and the proxy it goes through. The operator's summary of the pool is
``common.frontier.proxy_pool`` (it reads the crawl's policy, a layer above).
"""

from common.proxies.bans import NO_RULES, Blocked, check_selector, judge, statuses
from common.proxies.health import HostTier, PoolView, ProxyHealth, effective_tier, read_pool
from common.proxies.reports import Report, ReportCalls, send_report
from common.proxies.rules import ProxyRules
from common.proxies.sessions import (
    SessionRecord,
    SessionRow,
    SessionRules,
    SessionUpdate,
    list_sessions,
    read_sessions,
    read_versions,
    send_updates,
)
from common.proxies.spec import DEFAULT_TIER, DIRECT, DIRECT_ID, ProxySpec, proxy_spec

__all__ = ["DEFAULT_TIER", "DIRECT", "DIRECT_ID", "NO_RULES", "Blocked", "HostTier",
           "PoolView", "ProxyHealth", "ProxyRules", "ProxySpec", "Report", "ReportCalls",
           "SessionRecord", "SessionRow", "SessionRules", "SessionUpdate", "check_selector",
           "effective_tier", "judge", "list_sessions", "proxy_spec", "read_pool",
           "read_sessions", "read_versions", "send_report", "send_updates", "statuses"]
