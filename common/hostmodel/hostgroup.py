"""A host's politeness group: the registrable domain of its name (the crawl's
``politeness_key`` = ``domain``), so the hosts of one site share a limit.

The Public Suffix List comes from the ``publicsuffixlist`` package, which bundles the
list in its wheel (refreshed with each release) and never fetches it: a crawl's groups do
not depend on the network or change under a running fleet, only with the package's
version. (tldextract fetches the list on first use unless told not to and keeps a cache
file; publicsuffixlist needs neither.)
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from publicsuffixlist import PublicSuffixList

#: What a host without a group passes to enqueue.lua (an IP address, a name with no
#: registrable domain such as ``localhost``): it keeps its own limits only.
NO_GROUP = "-"



@lru_cache(maxsize=1)
def _psl() -> PublicSuffixList:
    """The list, parsed on first use (~80 ms): a process that never groups a host (a
    ``crawlq`` command) does not pay for it at start."""
    return PublicSuffixList()


def host_name(host: str) -> str:
    """The host key's name, its port left off (an IPv6 literal keeps its brackets)."""
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if ":" in host else host


@lru_cache(maxsize=65536)
def host_group(host: str) -> str:
    """The politeness group of a host key (``common.hostmodel.hostkey``): the registrable
    domain of its name (``a.blog.example.co.uk:8080`` -> ``example.co.uk``), or `NO_GROUP`
    for an IP address or a name that has none."""
    name = host_name(host)
    if name.startswith("["):
        return NO_GROUP
    try:
        ipaddress.ip_address(name)
        return NO_GROUP
    except ValueError:
        pass
    return _psl().privatesuffix(name) or NO_GROUP
