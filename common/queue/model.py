"""What the queue's calls take and give: tasks, leases, failures, result codes, counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from common.reasons import HANDLER_ERROR, HTTP_5XX, HTTP_408, HTTP_429
from common.revisits.previous import Observed, Revisit
from common.tasks.request import Request, request_key
from common.tasks.task import DEFAULT_MAX_ATTEMPTS, Task
from common.urls.canonical import fingerprint

#: Every counter of a partition's ``stats`` hash (plus ``outcome:<code>`` per ack outcome,
#: and in partition 0 ``links:<fate>`` per fate of the links a consumer did not follow:
#: ``common.observability.metrics.NOT_FOLLOWED``).
#: ``repaired_hosts``: hosts whose pending count was found larger than their queues
#: (a lost ``hq``/``hp`` key), set right by lease.lua or ``crawlq fsck --repair``;
#: ``lost_pending``: the entries those counts held that no queue did (tasks lost);
#: ``backoffs``: push-back incidents that raised a host's backoff (lib/backoff.lua);
#: ``group_unresolved``: lookups of a host's name that failed at enqueue under
#: politeness_key ip (the host stays ungrouped; common.hostmodel.hostip).
COUNTERS = (
    "enqueued", "duplicates", "recrawled", "leased", "renewed", "lost", "done", "failed",
    "retried", "dead", "stalled", "stale", "released", "promoted", "reclaimed", "requeued",
    "purged", "checkpoints", "repaired_hosts", "lost_pending", "backoffs",
    "group_unresolved", "replayed",
)

MALFORMED = "malformed"
#: Fail reasons that say the request got a response from the host (a page of its
#: budget) when the lease doesn't say (``Lease.responded``).
RESPONSE_REASONS = frozenset({HTTP_5XX, HTTP_408, HTTP_429, HANDLER_ERROR})


class Code(IntEnum):
    """Per-item result of a lifecycle script (mirrors ``common/lua/lib/codes.lua``)."""

    OK = 0
    RETRY = 1
    DEAD = 2
    STALE = 3
    EXPIRED = 4
    UNKNOWN = 5


CODES = tuple(Code)  # Code by value, faster than Code(value) per item


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for failed attempts, a host's backoff when it pushes back, and the stall
    limit for reclaimed leases (the crawl policy's values: `CrawlPolicy.retry`)."""

    base_ms: int = 2_000
    cap_ms: int = 600_000
    max_retry_after_ms: int = 3_600_000
    max_stalls: int = 2
    backoff_base_ms: int = 1_000
    backoff_cap_ms: int = 3_600_000
    backoff_forgive_ms: int = 300_000


@dataclass(frozen=True, slots=True)
class NewTask:
    """A request with a canonical URL, ready to enqueue; ``fp`` is the 16-byte
    fingerprint of its unique key (`from_request`; for a GET, of its URL)."""

    url: str
    fp: bytes
    priority: int = 0
    max_attempts: int = 3
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # common.tasks.headers
    revisit: Revisit | None = None  # the URL's previous visit (the frontier's recrawls; tests)
    # A request's own (common/tasks/request.py): GET, no body, ...
    method: str = "GET"
    body: bytes | None = field(default=None, repr=False)
    label: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    unique_key: str | None = None  # the user's; None: derived from method, URL and body
    session: str | None = None  # its session's name (common.proxies.sessions)
    session_version: int = 0  # the least version of it the request needs
    render: bool = False  # fetched in a browser (docs/rendering.md)
    #: Made by `from_request` of a request checked where it entered the crawl: enqueue
    #: checks its request fields no more (a NewTask built by hand has them checked there).
    checked: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def from_request(cls, request: Request, canonical_url: str, *,
                     max_attempts: int = DEFAULT_MAX_ATTEMPTS, depth: int = 0,
                     meta: dict[str, Any] | None = None,
                     headers: Mapping[str, str] | None = None,
                     key: str | None = None) -> NewTask:
        """The task of `request`, whose URL canonicalizes to `canonical_url`: its id is
        the fingerprint of the request's unique key (`key` when the caller has it, else
        computed). `headers` (a run's, a parent's) go under the request's own. The request
        is trusted: it was checked where it entered the crawl (``checked``: a route's
        follow, a spider's start, the producer's reader), and is not checked again."""
        if key is None:
            key = request_key(request.method, canonical_url, request.body,
                              request.unique_key)
        merged = dict(request.headers)
        if headers:  # the request's own win, whatever their case
            own = {name.lower() for name in merged}
            merged = {**{k: v for k, v in headers.items() if k.lower() not in own}, **merged}
        return cls(canonical_url, fingerprint(key), request.priority, max_attempts,
                   meta if meta is not None else {}, depth, merged, method=request.method,
                   body=request.body, label=request.label, data=dict(request.data),
                   unique_key=request.unique_key, session=request.session,
                   render=request.render, checked=True)


@dataclass(slots=True)
class Lease:
    """A task a worker holds, with the fencing token every later call must show."""

    task: Task
    partition: int
    token: str
    deadline_ms: int
    host: str
    granted_ms: int = 0  # its host's turn (Redis ms): its request starts then
    # The host's delay when leased: with one, the request goes out at its turn.
    delay_ms: int = 0
    # The host's concurrency when leased (0: unlimited): with a limit, the host's slot is
    # given back as soon as the response is in (lease_turns' `responses_in`).
    concurrency: int = 0
    # Redis time its request went out when later than the turn allows for (0: on time):
    # the host's next turn then counts from it (ack/fail).
    sent_ms: int = 0
    # Whether its request to the host got a response (any status): then it is a page of
    # the host's budget (ack/fail settle it). None: not said; ack counts every outcome
    # but robots_disallowed, fail only the reasons of a response (RESPONSE_REASONS).
    responded: bool | None = None
    # Its response's time in ms, for a crawl whose adaptive_delay is on (-1: not sent).
    elapsed_ms: int = -1
    # What its fetch learned for the URL's history (the revisit schedule; ack sends it).
    observed: Observed | None = None
    id: str = field(init=False)  # the task's id, copied: it is read many times per task

    def __post_init__(self) -> None:
        self.id = self.task.id

    @property
    def fence(self) -> int:
        """The fencing token as a number (below 2^63: a bigint column holds it). A lease
        granted later, also by a primary promoted since, has a greater one; a sink keeps it
        with what the lease wrote, and a write under a smaller one never replaces it."""
        return int(self.token)


@dataclass(slots=True)
class LeaseBatch:
    """What one lease call got: the leases, and when to ask again.

    ``wait_s`` is how long until some host's turn comes within the call's ahead time
    (None: no host holds pending work, or one is ready now: with leases, ask again at
    once; without, a retry's due time or new work is what to wait for); ``paused``: the
    crawl is paused; ``policy_version``: the newest crawl policy version a partition's
    reply named (-1: none said).
    """

    leases: list[Lease]
    wait_s: float | None = None
    paused: bool = False
    policy_version: int = -1
    now_ms: int = 0  # Redis TIME of the last reply (0: none)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: ``reason`` is a short code, ``message`` the detail.

    ``pushback``: the host pushed back (a 429/503, or what else the crawl's policy
    counts): its backoff rises for the whole fleet (lib/backoff.lua).
    """

    lease: Lease
    reason: str
    message: str
    retry_after: float | None = None
    permanent: bool = False
    pushback: bool = False


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    enqueued: int = 0
    duplicates: int = 0
    recrawled: int = 0
    bloom_warnings: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadTask:
    id: str
    partition: int
    reason: str
    message: str
    died_at_ms: int
    attempts: int
    url: str | None
    raw: bytes | None


@dataclass(frozen=True, slots=True)
class RevisitStats:
    """What operators see of the schedule: URLs scheduled, due now, revisits queued,
    their lateness (p50/p99, s: a bucket's upper bound; None: none yet) and what the
    revisits found."""

    scheduled: int = 0
    due: int = 0
    revisits: int = 0
    late_p50_s: float | None = None
    late_p99_s: float | None = None
    not_modified: int = 0
    unchanged: int = 0
    changed: int = 0

    def to_json(self) -> dict[str, Any]:
        """As JSON: a lateness past the last bucket is ``"+Inf"`` (as Prometheus' ``le``),
        which JSON has no number for."""
        doc = {name: getattr(self, name) for name in self.__slots__}
        for name in ("late_p50_s", "late_p99_s"):
            if doc[name] == float("inf"):
                doc[name] = "+Inf"
        return doc


@dataclass(slots=True)
class Stats:
    """Counts of every state and the running counters, summed over partitions.

    ``hosts_due``: hosts holding pending work with a free slot (what KEDA scales on).
    ``parked``: the pending tasks of hosts whose page budget is spent (counted in
    ``pending``): no consumer serves them until the budget is raised.
    ``render_pending``: the pending render tasks in the render lane (counted in
    ``pending``): only a consumer with a browser leases them.
    """

    pending: int = 0
    render_pending: int = 0
    leased: int = 0
    waiting: int = 0
    dead: int = 0
    hosts_due: int = 0
    parked: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    dead_reasons: dict[str, int] = field(default_factory=dict)
    revisits: RevisitStats | None = None

    @property
    def done(self) -> int:
        return self.counters.get("done", 0)

    @property
    def active(self) -> int:
        """Tasks that still need work: pending, leased or waiting."""
        return self.pending + self.leased + self.waiting
