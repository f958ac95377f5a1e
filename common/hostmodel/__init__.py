"""The host model: what a host is and what Redis keeps about it, below the queue.

- `hostkey`: which host (and partition) a URL belongs to;
- `hostrec`: a host's record as Redis keeps it (its counters, its own settings: delay,
  concurrency, budget, block, robots.txt's Crawl-delay, and its push-back state);
- `hostgroup` + `hostip`: the politeness group a host is in (its registrable domain, or
  the address its name resolves to); `group_record`: a group's record as Redis keeps it;
  `enqueue_groups`: naming an enqueue's groups for the crawl's ``politeness_key``.

The queue and its scripts are built on these; steering hosts while a crawl runs is the
operator's API above the queue, `common.frontier.hosts`.
"""

from common.hostmodel.enqueue_groups import Grouper
from common.hostmodel.group_record import GroupRecord, GroupRecordError
from common.hostmodel.hostgroup import NO_GROUP, host_group
from common.hostmodel.hostip import AddressBook
from common.hostmodel.hostkey import host_key, partition_of_host
from common.hostmodel.hostrec import HostRecord, HostRecordError

__all__ = ["NO_GROUP", "AddressBook", "GroupRecord", "GroupRecordError", "Grouper",
           "HostRecord", "HostRecordError", "host_group", "host_key", "partition_of_host"]
