"""Steering politeness groups while a crawl runs (the crawl's politeness_key at domain or ip):
list the groups, change one group's delay or concurrency (``group_set.lua``).

A group is a registrable domain (``common.hostmodel.hostgroup``) or an address
(``common.hostmodel.hostip``); its record lives in its
partition's ``groups`` HASH (``common.hostmodel.group_record``). Politeness groups need a
one-partition crawl (``common.policy``), so a group is found in partition 0.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, cast

from common.codec import text as _text
from common.errors import ConfigError
from common.hostmodel.group_record import GroupRecord
from common.queue import CrawlQueue
from common.redis.scripts import register


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One politeness group. Times are ms of Redis TIME; concurrency 0 = no limit."""

    group: str
    in_flight: int
    delay_ms: int  # its own, else the crawl's group_delay
    concurrency: int  # its own, else the crawl's group_concurrency
    own_delay: bool
    own_concurrency: bool
    last_request_ms: int | None
    blocked_until_ms: int | None
    parked: int  # its hosts out of `due` while its slots are all taken


@dataclass(frozen=True, slots=True)
class GroupPage:
    """The groups (by most in flight, then name) and whether the crawl keeps them now."""

    key: str  # the crawl's politeness_key as its partitions hold it ('host': no groups)
    rows: list[GroupRow]


def _group(text: str) -> str:
    group = text.strip().lower().rstrip(".")
    if not group or any(c.isspace() for c in group):
        raise ConfigError(f"not a group (a registrable domain such as example.com, or an "
                          f"address such as 192.0.2.7): {text[:100]!r}")
    try:  # an address as groups name it (::1, not [::1])
        return ipaddress.ip_address(group.strip("[]")).compressed
    except ValueError:
        return group


async def _rows(queue: CrawlQueue, records: list[tuple[str, GroupRecord]]) -> GroupPage:
    pk = queue.partitions[0]
    async with queue.client.pipeline(transaction=False) as pipe:
        pipe.hmget(pk.conf, "gkey", "gdelay", "gconc")
        for name, _ in records:
            pipe.zlexcount(pk.parked, f"[{name} ", f"({name}!")
        replies = await pipe.execute()
    gkey, gdelay, gconc = replies[0]
    default_delay, default_conc = int(gdelay or 0), int(gconc or 0)
    rows = [GroupRow(name, r.inflight, default_delay if r.delay is None else r.delay,
                     default_conc if r.conc is None else r.conc, r.delay is not None,
                     r.conc is not None, r.last or None, r.blocked or None, int(n))
            for (name, r), n in zip(records, replies[1:], strict=True)]
    return GroupPage(_text(gkey) if gkey else "host", rows)


async def groups(queue: CrawlQueue, *, limit: int = 50) -> GroupPage:
    """The crawl's groups, those with the most requests in flight first (at most
    `limit`; every group record is read, no host's)."""
    if limit < 1:
        raise ConfigError("limit must be >= 1")
    raw = await queue.client.hgetall(queue.partitions[0].groups)
    records = sorted(((_text(name), GroupRecord.decode(cast(bytes, value)))
                      for name, value in raw.items()),
                     key=lambda x: (-x[1].inflight, x[0]))[:limit]
    return await _rows(queue, records)


async def set_group(queue: CrawlQueue, group: str, *, delay_s: float | None = None,
                    concurrency: int | None = None, clear: tuple[str, ...] = ()
                    ) -> GroupRow:
    """Change a group's own delay or concurrency (``clear``: back to the crawl's
    group_delay / group_concurrency); returns its row after the change."""
    group = _group(group)
    pairs: list[Any] = []
    if delay_s is not None:
        if delay_s < 0:
            raise ConfigError("a group's delay must be >= 0")
        pairs += ["delay", int(delay_s * 1000)]
    if concurrency is not None:
        if concurrency < 0:
            raise ConfigError("a group's concurrency must be >= 0 (0 = no limit)")
        pairs += ["concurrency", concurrency]
    for name in clear:
        if name not in ("delay", "concurrency"):
            raise ConfigError(f"can't clear {name!r}: delay or concurrency")
        pairs += [name, -1]
    if not pairs:
        raise ConfigError("nothing to change: give --delay, --concurrency or --clear")
    pk = queue.partitions[0]
    await register(queue.client, "group_set")(keys=[*pk.host_state, *pk.group_state],
                                              args=[group, *pairs])
    record = GroupRecord.decode(cast(bytes | None, await queue.client.hget(pk.groups, group)))
    return (await _rows(queue, [(group, record)])).rows[0]
