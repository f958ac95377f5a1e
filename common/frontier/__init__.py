"""The frontier's operator API: steering hosts while a crawl runs.

- `hosts`: `Frontier` (list hosts, set one, pause, resume), a layer above the queue;
- `groups`: the politeness groups as the operator reads and sets them;
- `proxy_pool`: the proxy pool as an operator reads it (``crawlq proxies``, the
  dashboard), with the crawl's policy's proxy rules.

What a host is (its key, its settings as Redis keeps them) is the host model below the
queue, `common.hostmodel`; the crawl's policy is `common.policy`. The lease itself is
``common/lua/lease.lua`` (its reply's layout is read in `common.queue`), the host state
its scripts share ``common/lua/lib/hosts.lua``.
"""

from common.frontier.groups import GroupPage, set_group
from common.frontier.hosts import SORT_COLUMNS, Frontier, HostPage
from common.frontier.proxy_pool import PoolSummary, read_summary

__all__ = ["SORT_COLUMNS", "Frontier", "GroupPage", "HostPage", "PoolSummary", "read_summary",
           "set_group"]
