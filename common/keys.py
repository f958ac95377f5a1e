"""The Redis key schema: every key crawlq writes is built here, and only here.

All keys of one partition share the hash tag ``{<crawl>:<partition>}`` (``.<n>`` after it
in a crawl that spreads its slots: `partition_tag`), so every lifecycle script touches a
single Redis Cluster slot. Crawl-wide keys use the tag
``{<crawl>}``. Task data lives in fields of the hashes below, never in per-task keys.

Partition keys (``crawlq:{<crawl>:<p>}:<name>``). A partition holds whole hosts (a URL is
routed by its host key, ``common.hostmodel.hostkey.host_key``), so a host's queue, its politeness
state and its URLs' dedup entries live under one hash tag, on one Cluster shard.

The frontier (what is pending, per host). Layout 4 (``common.queue.crawl.FORMAT``): one
record per host and one per lease, compact entries in the host queues; a crawl of layout
2 is converted by ``common/lua/migrate.lua``, then one of layout 3 by
``common/lua/compact_queues.lua`` (``common.queue.migrate``).

=============  ======  ==========================================  ===================
name           type    holds                                       written by
=============  ======  ==========================================  ===================
hosts          HASH    host -> its record: 18 little-endian        every script that
                       doubles (``common.hostmodel.hostrec``,      changes a host,
                       ``lib/hosts.lua``): queued, inflight        through the host
                       (leases whose response is not in), last     ledger
                       request start (ms), done, its settings
                       (delay, concurrency, budget, used,
                       blocked until, robots delay, reserved;
                       -1 = unset) and push-back state
hq:<host>      LIST    the host's pending entries, priority 0,     enqueue, release,
                       FIFO; an entry is compact: the id's 16      reclaim, promote,
                       bytes, then ``/<path>`` (https of the       requeue, revisit,
                       host), ``:/<path>`` (http) or the whole     lease
                       URL, then `` <json>`` if any
                       (``common.tasks.task.compact_entry``)
hp:<host>      ZSET    the host's pending entries with priority    same as hq
                       > 0, score = -priority (highest first)
due            ZSET    host -> when its next request may start,    the host ledger's
                       ms of Redis TIME: exactly the hosts with    flush (lib/hosts.lua:
                       pending work, a free slot and budget left   the due rule)
                       (the due rule; KEDA reads its ZCARD)
prio_hosts     ZSET    host -> -(highest pending priority)         enqueue, lease, ...
h:queued       ZSET    host -> pending tasks: the index            the host ledger's
                       ``crawlq hosts`` sorts by, a copy of the    flush, when a count
                       records' counts (every host seen)           changed
h:errors       ZSET    host -> failed attempts (a sort index)      fail, reclaim
h:delay        ZSET    host -> its delay when not the default, ms  host_set
h:blocked      ZSET    host -> blocked until, ms (cool-downs,      fail, host_set
                       ``crawlq hosts block``)
h:budget       ZSET    host -> its page budget (hosts with one)    host_set
op:<worker>    STRING  "<op id> <reply>" of the worker's last      lease
                       lease call that granted leases, PX 60 s:
                       a call sent again after its reply was lost
                       gets the same leases (docs/failover.md)
ops:<worker>   STRING  the worker's last 16 calls of ack, fail,    ack, fail, traps,
                       traps and fingerprints by operation id,     fingerprints
                       with what each kept, PX 60 s: a call sent   (lib/once.lua)
                       again changes nothing more
                       (docs/failover.md)
hungry         ZSET    worker -> when its lease call last came     lease
                       back empty, ms of Redis TIME: while one
                       is recent, the other workers take only
                       their fair share of a host's slots
conf           HASH    the crawl's politeness, copied from its     policy_apply,
                       policy (delay ms, concurrency,              pause/resume,
                       policy_version: the policy version they     ack
                       came from; rv_*: revisits, rv_cond: the
                       policy's conditional), and ``paused``;
                       learned revisits' rv_price and rv_demand
                       (ack); rv_urls: the partition's history     (ack, purge, the
                       records (``rv:hist:<b>``); rc_oldest: the   conversion); the
                       oldest fetch time (s) a record the          producer
                       producer's last scan of the known URLs      (rc_oldest)
                       did not bring back could have
                       (``common.queue.known``)
pending        STRING  pending tasks in this partition             enqueue, lease, ...
g:of           HASH    host -> its politeness group (its           enqueue (politeness_key
                       registrable domain, or its name's address   domain or ip), policy
                       under ip), while the crawl's                apply's backfill
                       politeness_key is not host
groups         HASH    group -> its record: 5 little-endian        the host ledger's
                       doubles (``common.hostmodel.group_record``,     flush (lib/groups.lua)
                       ``lib/groups.lua``): last request start
                       (ms), inflight, its delay and concurrency
                       (-1 = the crawl's), blocked until (ms)
g:parked       ZSET    "<group> <host>", score 0: hosts out of     the host ledger's
                       ``due`` while their group's slots are all   flush
                       taken, back when one comes free
rq:<host>      LIST    the host's render entries (their JSON's     lease (moves them
                       first field r=1), compact: only a           from hq/hp),
                       consumer with a browser leases them         lease_render
                       (``lib/render.lua``)
r:due          ZSET    host -> when lease_render looks at its      lease, lease_render
                       render queue again, ms: exactly the hosts
                       with render entries
r:pending      STRING  render entries pending (also in             lease, lease_render
                       ``pending``)
rop:<worker>   STRING  as ``op:<worker>``, of lease_render         lease_render
=============  ======  ==========================================  ===================

Crawler traps (``common.traps.book``; the crawl's ``trap_*`` and
``near_duplicate_distance`` policy):

=============  ======  ==========================================  ===================
tr:<host>      HASH    reason -> links of the host a trap rule     traps
                       refused (``trap_*``), pages it found to be
                       near duplicates (``near_duplicate``)
h:traps        ZSET    host -> the sum of its ``tr:<host>``: the   traps
                       index ``crawlq traps`` sorts by
tv:<host>      HASH    8-byte hash of a path -> the 4-byte hashes  traps
                       of the query strings its links had, at
                       most ``trap_path_variants``
nd:<host>      STRING  the host's newest page fingerprints, at     fingerprints
                       most 256, each 24 bytes: the 64-bit
                       SimHashes of its text and of its links, 4
                       bytes of its URL's fingerprint and 4 of its
                       URL's shape (``common.urls.shape``)
jd:<host>      HASH    s:<dir> -> the soft-404 signature of a      judgement
                       directory (``common.traps.soft404``, JSON);
                       p:<dir> -> who claimed its probe; n ->
                       probes claimed; t:<rule> -> 1, a session
                       token learned (``q:<name>`` a query
                       parameter, ``p:<i>`` path segment i)
=============  ======  ==========================================  ===================

The proxy pool (``common.proxies``, docs/proxies.md): what the hosts of the partition did
to the crawl's proxies.

=============  ======  ==========================================  ===================
px:ban         ZSET    "<proxy id> <host>" -> the proxy is banned  proxy_bans
                       by the host until then, ms of Redis TIME
                       (other hosts keep it)
px:tier        HASH    host -> "<tier> <since ms> <bans>": the     proxy_bans
                       proxy tier a host escalated to, when it
                       was last banned there (a quiet period
                       after it takes it a tier down), its bans
                       at that tier; a host at the cheapest tier
                       without bans has none
px:op:<w>      STRING "<op id> <reply>" of worker w's last         proxy_bans
                       proxy_bans call, PX 60 s (a call sent
                       again gets the same reply)
=============  ======  ==========================================  ===================

Everything else a task needs, once it has left its host queue:

=============  ======  ==========================================  ===================
leased         HASH    id -> "<owner> <attempt> <host> <priority>  lease; deleted by
                       <entry>" of a leased task, owner            ack, fail, release,
                       "[f][b][g]<fencing token>:<worker>" (f:     reclaim
                       its response is in, its host's slot given
                       back; b: it holds a page of its host's
                       budget; g: a slot of its host's group):
                       the one record of a lease
leases         ZSET    id -> lease deadline, ms of Redis TIME      lease, renew, ack,
                                                                   fail, release,
                                                                   reclaim
tasks          HASH    id -> "<host> <priority> <entry>" of a      fail, reclaim;
                       waiting or dead task                        promote, requeue,
                                                                   purge delete
attempts       HASH    id -> attempts so far, of a task that is    release, reclaim,
                       not leased (pending again, waiting,         fail; lease takes it
                       dead); a lease holds its own                into the lease record
seq            STRING  fencing-token counter: the last token       lease
                       granted; a grant starts past it and past
                       Redis TIME in us (docs/failover.md)
delayed        ZSET    id -> due time of a retry, ms of Redis TIME fail, promote
dead           ZSET    id -> time of death, ms                     fail, reclaim,
                                                                   requeue, purge
errors         HASH    id -> "<reason> <message>" (last error)     fail, reclaim, ack
dead_reasons   HASH    reason -> number of dead tasks with it      fail, reclaim,
                                                                   requeue, purge
checkpoints    HASH    id -> opaque JSON a handler saved           checkpoint, ack,
                                                                   purge
stalls         HASH    id -> times reclaimed from a dead consumer  reclaim, ack,
                                                                   requeue, purge
stats          HASH    counter name -> running total (see          every script
                       ``common.queue.COUNTERS``)
seen:<bucket>  HASH    exact dedup: fingerprint[2:] -> last        enqueue
                       enqueue time, s of Redis TIME; 2**bits
                       small hashes so Redis keeps them compact
bloom:<layer>  STRING  bloom dedup: the bits of one filter layer   enqueue_bloom
bloom          HASH    bloom dedup: layers, count:<layer>          enqueue_bloom
lock:reap      STRING  SET NX PX guard: one reaper per interval    reaper (Python)
=============  ======  ==========================================  ===================

The revisit schedule (the crawl's ``revisit`` policy on; ``common/lua/lib/revisits.lua``),
and the URLs' history of a crawl that recrawls by its window alone (``recrawl_after`` > 0,
``revisit`` off, ``conditional`` on: records of interval 0 with their entry, which the
producer brings them back with past the window, no ``rv:due``):

=============  ======  ==========================================  ===================
rv:hist:<b>    HASH    id's 16 bytes -> a done URL's last visit,   ack (reads: revisit,
                       binary (``lib/revisits.lua``                enqueue, the
                                                                   producer); purge
                       record_encode): flags, priority, interval,
                       fetched s, estimator sums, digest's 8
                       bytes, Last-Modified as s, ETag, host, its
                       compact entry without id and ``v``; bucket
                       b as ``seen:<bucket>``'s (2**seen_bits
                       small hashes: listpacks while records fit
                       ``hash-max-listpack-value``, docs/
                       capacity.md)
rv:due         ZSET    id -> its next visit, ms of Redis TIME      ack; revisit moves
                       (a URL in it is done, waiting for it)       the due ones out
=============  ======  ==========================================  ===================

A pending task is one list entry and nothing else (its id, URL and only the fields that
differ from the defaults), so a frontier of millions of URLs stays small; its body moves
to its lease record (``leased``) when it is leased, and to ``tasks`` while it waits or is
dead.

``leased`` also holds one field that is not a task id, `HASHTABLE_FIELD` (1024 ``~``),
written by lease: a field longer than ``hash-max-listpack-value`` makes Redis store the
hash as a hashtable for good (1024: longer than any sane setting; the 128 of layouts
before 4 is not, once the setting is raised for the history records).
Its size follows the tasks in flight, a few hundred fields, where Redis would otherwise
keep a listpack while the records are short (up to 512 fields of up to 64 bytes: a short
URL's) and scan it for every field read or written (measured ~4 us per field at 256
fields, ~25x a hashtable). Tools that list it skip it.

Crawl keys (``crawlq:{<crawl>}:<name>``): ``meta`` HASH (``settings``: partitions, dedup
mode and parameters, fixed at creation, and ``format``, the schema version; ``created_ms``:
when, ms of Redis TIME), ``lock:producer`` STRING (one producer run at a time),
``lock:migrate`` STRING (one conversion of a layout-2 crawl at a time,
``common.queue.migrate``), ``results``
STREAM (the redis-stream sink), ``workers`` ZSET (worker id -> last heartbeat, ms of Redis
TIME) and ``worker:<id>`` HASH (id, host, pid, state, started_ms, heartbeat_ms,
interval_ms, in_flight, done, failed, pages_per_s; times in ms of Redis TIME; expires
unless refreshed; ``common.fleet.workers``), ``history`` LIST (newest first, at most 720 JSON
snapshots ``{"t": unix s of Redis TIME, "done": n, ...}`` of the summed counters, about
one per 5 s fleet-wide: an hour, for rates and the dashboard's chart; ``common.fleet.history``),
``policy`` HASH (the crawl's policy, ``common.policy``: ``version``, bumped by every
change, and one field per policy option, its value as text in the flag's syntax, e.g.
``per_host_delay`` ``1s``; written only by ``policy_set.lua``) and ``policy:log`` LIST
(newest first, at most 200 JSON ``{"at": ms of Redis TIME, "version", "changes": {key:
[old, new]}, "by"}``, one per change of the policy; ``policy_set.lua``), ``render:modes``
HASH ("<host> <route label>" -> how a rendering=auto crawl fetches that pair's pages:
``p<probes>,<same>`` while probed, ``h`` HTTP, ``r`` rendered, ``H``/``R`` an operator's;
``render_vote.lua``, ``crawlq render set``; ``common.queue.rendermodes``).

The proxy pool's crawl keys: ``px`` HASH (proxy id -> its health record, "<tier> <ok>
<fail> <ban> <streak> <level> <until ms> <lat ms> <seen ms> <shown>": successes,
failures, bans, failures in a row, quarantine level and end, response time, last report,
its URL with credentials redacted; ``common.proxies.health``, ``proxy_report.lua``) and
``px:op:<worker>`` STRING (the worker's last report's op id and reply, PX 60 s).

Sessions (``common.proxies.sessions``, docs/proxies.md): ``se`` ZSET (session name -> its last
change, ms of Redis TIME), ``se:<name>`` HASH (one session: ``~v`` its version, bumped
by every change of its cookies, state, proxy or headers; ``~uses``, ``~bans``, ``~state``
live or retired, ``~proxy`` its proxy's id, ``~host`` its pool's host ('' for a named
session), ``~h`` its headers as JSON, ``~made`` when it was made, ``~op`` its last
update's op id; and one field a cookie, ``c:<domain>\t<path>\t<name>`` ->
``<value>\t<expires ms>\t<flags>``: credentials, readable by whoever reads the crawl's
keys) and ``sp:<host>`` ZSET (the live sessions of a host's pool -> when made), all
written by ``session_update.lua``.

Robots (``crawlq:{<crawl>}:robots:<origin>``, origin ``scheme://host[:port]``): STRING,
JSON ``{"status", "body", "fetched_at"}`` of that origin's robots.txt (``"error"`` set
after a failed fetch), EX the robots TTL (60 s after a failure); ``<key>:lock`` STRING is
its SET NX PX guard so one consumer of the fleet fetches it (``consumer.robots``).

Global: ``crawlq:crawls`` SET of crawl names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from common.names import validate_crawl_name

PREFIX = "crawlq"
CRAWLS = f"{PREFIX}:crawls"
#: The non-task field of ``leased`` (mirrors ``lib/memory.lua``): longer than any sane
#: ``hash-max-listpack-value`` (the deployments raise it to 192 for the history records).
HASHTABLE_FIELD = "~" * 1024
#: The field of layouts before 4 (128 ``~``: a listpack value once the setting is raised);
#: the conversion to layout 4 replaces it.
LEGACY_HASHTABLE_FIELD = "~" * 128

# Names of the fixed per-partition keys, in the order PartitionKeys declares them.
_PARTITION_NAMES = (
    "hosts", "due", "h:queued", "conf", "prio_hosts",
    "h:errors", "h:delay", "h:blocked", "h:budget", "pending", "tasks", "attempts", "leases",
    "leased", "seq", "delayed", "dead", "errors", "dead_reasons", "checkpoints", "stalls",
    "stats", "bloom", "lock:reap", "hungry", "rv:due", "g:of", "groups",
    "g:parked", "px:ban", "px:tier", "r:due", "r:pending",
)


def _check_crawl(crawl: str) -> str:
    return validate_crawl_name(crawl)


def crawl_key(crawl: str, name: str) -> str:
    """A crawl-wide key, tagged ``{<crawl>}``."""
    return f"{PREFIX}:{{{_check_crawl(crawl)}}}:{name}"


@lru_cache(maxsize=4096)
def partition_tag(crawl: str, partition: int, partitions: int = 1, *,
                  spread: bool = False) -> str:
    """The hash tag of one partition's keys: ``<crawl>:<p>``, or with `spread` (every crawl
    created since crawls spread their slots) ``<crawl>:<p>.<n>`` with the least n >= 0
    (``.0`` left off) that puts the partition's Cluster slot in the p-th of `partitions`
    equal ranges of the 16384 slots. A cluster made with equal slot ranges per primary
    (``redis-cli --cluster create``'s) then holds equally many partitions on each primary
    when `partitions` is a multiple of the primaries, instead of wherever CRC16 threw them
    (8 partitions on 3 primaries: 4, 3 and 1 happened)."""
    base = f"{_check_crawl(crawl)}:{partition}"
    if not spread or partitions <= 1:
        return base
    low, high = partition * SLOTS // partitions, (partition + 1) * SLOTS // partitions
    n = 0
    while True:
        tag = f"{base}.{n}" if n else base
        if low <= key_slot(tag.encode()) < high:
            return tag
        n += 1


def partition_prefix(crawl: str, partition: int, partitions: int = 1, *,
                     spread: bool = False) -> str:
    """The prefix shared by every key of one partition (see `partition_tag`)."""
    return f"{PREFIX}:{{{partition_tag(crawl, partition, partitions, spread=spread)}}}:"


#: The partition keys of layout 2 that layout 3 dropped, in ``common/lua/migrate.lua``'s
#: KEYS order: ``h:inflight``, ``h:last``, ``h:done`` (ZSETs, host -> leases whose
#: response is not in, last request start in ms, tasks done), ``hostconf`` (HASH, host ->
#: "delay,conc,budget,used,blocked,robots,reserved[,level,pace,pb_at,pb_done,fade,
#: pushbacks,lat]", '' = unset) and ``owners`` (HASH, id -> "[f][b]<token>:<worker>").
#: Their content now lives in the ``hosts`` and ``leased`` records; only the migration
#: reads them (and deletes them): no script of layout 3 may write one.
LAYOUT2_NAMES = ("h:inflight", "h:last", "h:done", "hostconf", "owners")


def layout3_history_key(pk: PartitionKeys) -> str:
    """Layout 3's one ``rv:hist`` HASH of a partition (id -> a text history record):
    only the conversion to layout 4 reads it (and empties it)."""
    return pk.prefix + "rv:hist"


def layout2_keys(crawl: str, partition: int) -> list[str]:
    """One partition's layout-2 keys (`LAYOUT2_NAMES`, in that order)."""
    prefix = partition_prefix(crawl, partition)
    return [prefix + name for name in LAYOUT2_NAMES]


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """Every key of one partition (see the module docstring for types and owners)."""

    crawl: str
    partition: int
    hosts: str
    due: str
    queued: str
    conf: str
    prio_hosts: str
    errors_by_host: str
    delay: str
    blocked: str
    budget: str
    pending: str
    tasks: str
    attempts: str
    leases: str
    leased: str
    seq: str
    delayed: str
    dead: str
    errors: str
    dead_reasons: str
    checkpoints: str
    stalls: str
    stats: str
    bloom: str
    reap_lock: str
    hungry: str
    rv_due: str
    group_of: str
    groups: str
    parked: str
    proxy_bans: str
    proxy_tiers: str
    render_due: str
    render_pending: str
    prefix: str

    @classmethod
    def build(cls, crawl: str, partition: int, partitions: int = 1, *,
              spread: bool = False) -> PartitionKeys:
        prefix = partition_prefix(crawl, partition, partitions, spread=spread)
        names = [prefix + name for name in _PARTITION_NAMES]
        return cls(crawl, partition, *names, prefix)  # type: ignore[call-arg]

    @property
    def host_state(self) -> list[str]:
        """The four keys every host-changing script takes first, in this order
        (lib/hosts.lua's host_keys)."""
        return [self.hosts, self.due, self.queued, self.conf]

    @property
    def group_state(self) -> list[str]:
        """The three keys of the politeness groups (lib/groups.lua's group_keys): host ->
        group, group records, parked hosts."""
        return [self.group_of, self.groups, self.parked]

    @property
    def lease_state(self) -> list[str]:
        """The two keys of the leases (lib/leases.lua's lease_keys): records, deadlines."""
        return [self.leased, self.leases]

    def seen(self, bucket: int) -> str:
        """One exact-dedup bucket hash (called per URL)."""
        return f"{self.prefix}seen:{bucket:x}"

    def history(self, bucket: int) -> str:
        """One bucket hash of the done URLs' history records (as `seen`'s buckets)."""
        return f"{self.prefix}rv:hist:{bucket:x}"

    def host_queue(self, host: str) -> str:
        """A host's FIFO of pending entries (priority 0)."""
        return f"{self.prefix}hq:{host}"

    def host_prio(self, host: str) -> str:
        """A host's pending entries with a priority, highest first."""
        return f"{self.prefix}hp:{host}"

    def render_queue(self, host: str) -> str:
        """A host's render entries (lib/render.lua), FIFO."""
        return f"{self.prefix}rq:{host}"

    def render_op(self, worker: str) -> str:
        """The reply of `worker`'s last lease_render.lua call that granted leases."""
        return f"{self.prefix}rop:{worker}"

    def lease_op(self, worker: str) -> str:
        """The reply of `worker`'s last lease call that granted leases, kept for a call
        sent again (lease.lua)."""
        return f"{self.prefix}op:{worker}"

    def ops(self, worker: str) -> str:
        """`worker`'s last calls by operation id, for a call sent again (lib/once.lua)."""
        return f"{self.prefix}ops:{worker}"
    def proxy_op(self, worker: str) -> str:
        """The reply of `worker`'s last proxy_bans.lua call, kept for a call sent again."""
        return f"{self.prefix}px:op:{worker}"

    def bloom_layer(self, layer: int) -> str:
        """The bit string of one bloom filter layer."""
        return f"{self.prefix}bloom:{layer}"

    def traps(self, host: str) -> str:
        """A host's trap tallies: reason -> links refused or pages not followed."""
        return f"{self.prefix}tr:{host}"

    @property
    def trap_index(self) -> str:
        """host -> all its trap tallies, the index ``crawlq traps`` sorts by."""
        return f"{self.prefix}h:traps"

    def variants(self, host: str) -> str:
        """A host's query variants: path hash -> the 4-byte hashes of its queries."""
        return f"{self.prefix}tv:{host}"

    def fingerprints(self, host: str) -> str:
        """A host's newest page fingerprints, 24 bytes each (``common.traps.book``)."""
        return f"{self.prefix}nd:{host}"

    def judgement(self, host: str) -> str:
        """What the fleet learned of a host's pages: soft-404 signatures per directory,
        probes claimed, session tokens (``common.traps.book``)."""
        return f"{self.prefix}jd:{host}"

    def pattern(self) -> str:
        """A SCAN pattern matching every key of this partition."""
        return partition_prefix(self.crawl, self.partition).replace("{", "\\{").replace(
            "}", "\\}") + "*"


@dataclass(frozen=True, slots=True)
class CrawlKeys:
    """The crawl-wide keys."""

    crawl: str
    meta: str
    producer_lock: str
    results: str
    workers: str
    history: str
    wake: str  # a pub/sub channel, not a key (common.fleet.wake)
    policy: str
    policy_log: str
    migrate_lock: str  # the SET NX PX guard of a conversion from layout 2
    proxies: str  # the proxy pool's health records (common.proxies)
    sessions: str  # the sessions' index (common.proxies.sessions)
    #: HASH "<host> <route label>" -> render mode of a rendering=auto crawl (render_vote.lua)
    render_modes: str

    @classmethod
    def build(cls, crawl: str) -> CrawlKeys:
        return cls(crawl, crawl_key(crawl, "meta"), crawl_key(crawl, "lock:producer"),
                   crawl_key(crawl, "results"), crawl_key(crawl, "workers"),
                   crawl_key(crawl, "history"), crawl_key(crawl, "wake"),
                   crawl_key(crawl, "policy"), crawl_key(crawl, "policy:log"),
                   crawl_key(crawl, "lock:migrate"), crawl_key(crawl, "px"),
                   crawl_key(crawl, "se"), crawl_key(crawl, "render:modes"))

    def proxy_op(self, worker: str) -> str:
        """The reply of `worker`'s last proxy_report.lua call, kept for a call sent again."""
        return crawl_key(self.crawl, f"px:op:{worker}")

    def session(self, name: str) -> str:
        """One session's record: its cookies, version, uses, state (common.proxies.sessions)."""
        return crawl_key(self.crawl, f"se:{name}")

    def session_pool(self, host: str) -> str:
        """The live sessions of `host`'s pool."""
        return crawl_key(self.crawl, f"sp:{host}")

    def robots(self, origin: str) -> str:
        """One origin's cached robots.txt; `origin` is ``scheme://host[:port]``."""
        return crawl_key(self.crawl, f"robots:{origin}")

    def worker(self, worker_id: str) -> str:
        return crawl_key(self.crawl, f"worker:{worker_id}")
