"""The async Python API over the lifecycle scripts: one crawl's queue, a host-fair frontier.

A task is in exactly one state: pending (an entry in its host's queue, ``hq:<host>`` or
``hp:<host>``), leased (``leases``), waiting to retry (``delayed``), dead (``dead``), or
done (its body deleted; only its seen mark remains). Every transition is one Lua script
in ``common/lua``; this package builds their KEYS and ARGV, routes each task to the
partition of its host and sends one call per partition per batch, pipelined.

One module per job: ``crawl`` (settings, opening, partitions), ``calls`` (sending
calls), ``enqueue``, ``lease_client`` (one consumer's `LeaseClient`) with ``lease_reply``
(lease.lua's reply layout, declared once), ``transitions`` (ack, fail, release, renew,
checkpoint), ``housekeeping`` (reclaim, promote, reap), ``deadletters``, ``inspection``
(stats, is_empty, state_of), ``migrate`` (converting a crawl of layout 2), ``known``
(the known URLs past the recrawl window queued again); ``facade``'s
`CrawlQueue` and `LeasingQueue` put them in one object.
"""

from common.queue.crawl import (
    FORMAT,
    Crawl,
    CrawlFormatError,
    CrawlNeedsMigration,
    CrawlSettings,
    DedupMode,
    existing_settings,
    partition_keys,
)
from common.queue.enqueue import check_new_task
from common.queue.facade import CrawlQueue, LeasingQueue
from common.queue.known import KnownRecrawl
from common.queue.lease_client import (
    CANDIDATE_HOSTS,
    MAX_IDLE_WAIT_S,
    UNKNOWN_WAIT_S,
    LeaseClient,
)
from common.queue.lease_reply import LeaseReply
from common.queue.migrate import migrate_crawl
from common.queue.model import (
    COUNTERS,
    MALFORMED,
    RESPONSE_REASONS,
    Code,
    DeadTask,
    EnqueueResult,
    Failure,
    Lease,
    LeaseBatch,
    NewTask,
    RetryPolicy,
    RevisitStats,
    Stats,
)

__all__ = [
    "CANDIDATE_HOSTS", "COUNTERS", "FORMAT", "MALFORMED", "MAX_IDLE_WAIT_S",
    "RESPONSE_REASONS", "UNKNOWN_WAIT_S", "Code", "Crawl", "CrawlFormatError",
    "CrawlNeedsMigration", "CrawlQueue", "CrawlSettings", "DeadTask", "DedupMode",
    "EnqueueResult", "Failure", "KnownRecrawl", "Lease", "LeaseBatch", "LeaseClient", "LeaseReply",
    "LeasingQueue", "NewTask", "RetryPolicy", "RevisitStats", "Stats", "check_new_task",
    "existing_settings", "migrate_crawl", "partition_keys",
]
