"""Steering the frontier while a crawl runs: list hosts, change a host's settings, block
it, pause and resume the crawl, set the crawl's defaults (through its policy).

Every change is one script or one single-key write per partition and takes effect on
the fleet's next lease call (consumers ask at least once a second). Listing is O(page)
in Redis work per partition: each sortable column is a ZSET of host -> value kept beside
the host records (``common/keys.py``): queued, errors, next turn, delay and block. The
other columns are read from the records of the page's hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.hostmodel.hostkey import host_key
from common.hostmodel.hostrec import HostRecord
from common.keys import PartitionKeys
from common.policy import set_policy
from common.queue import CrawlQueue
from common.urls.canonical import canonicalize

#: Sortable columns and the ZSET of each (sparse ones list only hosts that have a value).
SORT_COLUMNS = ("queued", "errors", "next_allowed", "delay", "blocked_until")
MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class HostRow:
    """One host of the frontier. Times are ms of Redis TIME; concurrency 0 = no limit."""

    host: str
    partition: int
    queued: int
    in_flight: int
    done: int
    errors: int
    last_request_ms: int | None
    next_allowed_ms: int | None  # None: nothing pending (or every slot in use)
    delay_ms: int
    concurrency: int
    budget: int | None
    used: int  # pages fetched (a response came back) while it had a budget
    blocked_until_ms: int | None
    robots_delay_ms: int | None
    reserved: int = 0  # its leases holding a page of its budget (settled at their end)
    backoff_level: int = 0  # push-backs in a row, less what was forgiven (lib/backoff.lua)
    pace_ms: int = 0  # the delay its push-back taught the fleet, now (fading); in delay_ms
    pushbacks: int = 0  # push-back incidents (429/503, or what backoff_on counts)


@dataclass(frozen=True, slots=True)
class HostPage:
    """A page of hosts: ``total`` hosts in the crawl, ``now_ms`` the Redis TIME read."""

    total: int
    rows: list[HostRow]
    now_ms: int


def _column_key(pk: PartitionKeys, column: str) -> str:
    return {"queued": pk.queued, "errors": pk.errors_by_host, "next_allowed": pk.due,
            "delay": pk.delay, "blocked_until": pk.blocked}[column]


def normalize_host(text: str) -> str:
    """A host as the operator typed it (``Bücher.example``, ``a.test:8080``, a URL) in the
    form the frontier keys it by: through the same canonicalization as every URL, so a
    setting can't be written for a host no URL can have."""
    text = text.strip()
    url = text if "://" in text else f"http://{text}/"
    canonical = canonicalize(url)
    if not isinstance(canonical, str) or ("://" not in text and "/" in text):
        raise ConfigError(f"not a host: {text[:100]!r} (e.g. example.com or "
                          "example.com:8080)")
    return host_key(canonical)


class Frontier:
    """The operator's view of one crawl's hosts (the CLI and the dashboard use it)."""

    def __init__(self, queue: CrawlQueue) -> None:
        self.queue = queue
        self.client = queue.client

    def _pk(self, host: str) -> PartitionKeys:
        return self.queue.partitions[self.queue.partition_of(host)]

    async def hosts(self, *, sort: str = "queued", desc: bool = True, offset: int = 0,
                    limit: int = 50) -> HostPage:
        """One page of hosts sorted by a column (see SORT_COLUMNS)."""
        if sort not in SORT_COLUMNS:
            raise ConfigError(f"unknown sort column {sort!r}: one of {', '.join(SORT_COLUMNS)}")
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise ConfigError(f"offset must be >= 0 and limit 1..{MAX_PAGE}")
        parts = self.queue.partitions
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            for pk in parts:
                pipe.zcard(pk.queued)
                pipe.zrange(_column_key(pk, sort), 0, offset + limit - 1, desc=desc,
                            withscores=True)
            replies = await pipe.execute()
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        total = sum(int(n) for n in replies[1::2])
        merged: list[tuple[float, str, int]] = []
        for p, ranked in enumerate(replies[2::2]):
            merged += [(score, m.decode(), p) for m, score in ranked]
        merged.sort(key=lambda x: (-x[0] if desc else x[0], x[1]))
        page = merged[offset:offset + limit]
        rows = await self._rows([(host, p) for _, host, p in page], now_ms)
        return HostPage(total, rows, now_ms)

    async def host(self, host: str) -> HostRow | None:
        """One host's row, or None if the crawl never queued it."""
        host = normalize_host(host)
        seconds, micros = await self.client.time()
        rows = await self._rows([(host, self.queue.partition_of(host))],
                                int(seconds) * 1000 + int(micros) // 1000)
        return rows[0] if rows and rows[0].queued + rows[0].done + rows[0].in_flight else None

    async def _rows(self, hosts: list[tuple[str, int]], now_ms: int) -> list[HostRow]:
        """The rows of `hosts` at `now_ms` (Redis TIME): per partition, their records,
        errors and turns, and the crawl's defaults."""
        if not hosts:
            return []
        by_partition: dict[int, list[str]] = {}
        for host, p in hosts:
            by_partition.setdefault(p, []).append(host)
        async with self.client.pipeline(transaction=False) as pipe:
            for p, names in by_partition.items():
                pk = self.queue.partitions[p]
                pipe.hmget(pk.hosts, names)
                pipe.zmscore(pk.errors_by_host, names)
                pipe.zmscore(pk.due, names)
                pipe.hmget(pk.conf, "delay", "concurrency", "adapt", "max_delay")
            replies = await pipe.execute()
        found: dict[tuple[str, int], HostRow] = {}
        for i, (p, names) in enumerate(by_partition.items()):
            records, errors, due, defaults = replies[4 * i:4 * i + 4]
            default_delay, default_conc, adapt, max_delay = (int(v) if v else 0
                                                             for v in defaults)
            for j, host in enumerate(names):
                c = HostRecord.decode(records[j])
                own_delay = default_delay if c.delay is None else c.delay
                pace = c.pace_at(now_ms)
                found[(host, p)] = HostRow(
                    host=host, partition=p, queued=c.queued, in_flight=c.inflight,
                    done=c.done, errors=int(errors[j] or 0),
                    last_request_ms=c.last or None,
                    next_allowed_ms=None if due[j] is None else int(due[j]),
                    delay_ms=max(own_delay, c.robots or 0, pace,
                                 c.adaptive_ms(adapt, max_delay)),
                    concurrency=default_conc if c.conc is None else c.conc,
                    budget=c.budget, used=c.used,
                    blocked_until_ms=c.blocked or None, robots_delay_ms=c.robots,
                    reserved=c.reserved, backoff_level=c.level, pace_ms=pace,
                    pushbacks=c.pushbacks)
        return [found[h] for h in hosts]

    async def _host_set(self, host: str, *pairs: Any) -> None:
        pk = self._pk(host)
        await self.queue.scripts.host_set(
            keys=[*pk.host_state, pk.delay, pk.blocked, pk.budget], args=[host, *pairs])

    async def set_host(self, host: str, *, delay_s: float | None = None,
                       concurrency: int | None = None, budget: int | None = None,
                       clear: tuple[str, ...] = ()) -> str:
        """Change a host's delay, concurrency or page budget (``clear``: back to the
        crawl's default / no budget); returns the host as keyed.

        A budget counts pages whose request got a response; a host whose budget is
        spent is not served and its tasks wait, parked, until the budget is raised."""
        host = normalize_host(host)
        pairs: list[Any] = []
        if delay_s is not None:
            if delay_s < 0:
                raise ConfigError("a host's delay must be >= 0")
            pairs += ["delay", int(delay_s * 1000)]
        if concurrency is not None:
            if concurrency < 0:
                raise ConfigError("a host's concurrency must be >= 0 (0 = no limit)")
            pairs += ["concurrency", concurrency]
        if budget is not None:
            if budget < 0:
                raise ConfigError("a host's budget must be >= 0 pages")
            pairs += ["budget", budget]
        for name in clear:
            if name not in ("delay", "concurrency", "budget"):
                raise ConfigError(f"can't clear {name!r}: delay, concurrency or budget")
            pairs += [name, -1]
        if not pairs:
            raise ConfigError("nothing to set: give --delay, --concurrency, --budget or --clear")
        await self._host_set(host, *pairs)
        return host

    async def block_host(self, host: str, seconds: float) -> str:
        """Send a host nothing for `seconds` (0 unblocks); returns the host as keyed."""
        if seconds < 0:
            raise ConfigError("block for must be >= 0 seconds")
        host = normalize_host(host)
        await self._host_set(host, "block", int(seconds * 1000))
        return host

    async def set_robots_delay(self, host: str, seconds: float | None) -> None:
        """Record a host's robots.txt Crawl-delay (None: it has none)."""
        await self._host_set(host, "robots_delay",
                             -1 if seconds is None else int(seconds * 1000))

    async def set_paused(self, paused: bool) -> None:
        """Pause (lease nothing) or resume the whole crawl."""
        async with self.client.pipeline(transaction=False) as pipe:
            for pk in self.queue.partitions:
                pipe.hset(pk.conf, "paused", "1" if paused else "0")
            await pipe.execute()

    async def is_paused(self) -> bool:
        """Whether the crawl is paused."""
        return await self.client.hget(self.queue.partitions[0].conf, "paused") == b"1"

    async def set_defaults(self, *, delay_s: float, concurrency: int) -> None:
        """Set the crawl's default per-host delay and concurrency (0 = no limit) through
        its policy (``common.policy``, logged ``by: api``; created if the crawl has none),
        the one place they are written: every partition gets them, and scheduled turns
        move to match."""
        if delay_s < 0 or concurrency < 0:
            raise ConfigError("the default delay and concurrency must be >= 0")
        await set_policy(self.client, self.queue.crawl,
                         {"per_host_delay": delay_s, "per_host_concurrency": concurrency},
                         by="api", create=True)
