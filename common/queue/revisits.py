"""The revisit schedule's Python side (issue 26): what an ack sends of a fetch's
`Observed`, bringing due revisits back (``revisit.lua``) and what operators see of it.

The schedule itself lives in each partition (``rv:hist:<bucket>``, ``rv:due``:
common/keys.py) and is written by the scripts alone: ack.lua writes a done URL's history
and next visit (lib/revisits.lua), revisit.lua puts the due ones back in their hosts'
queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from common.codec import text as _text
from common.queue.calls import host_args
from common.queue.crawl import Crawl
from common.queue.model import RevisitStats
from common.revisits.previous import MAX_VALIDATOR_BYTES, Observed
from common.revisits.record import history_field, record_host

if TYPE_CHECKING:
    from common.keys import PartitionKeys

#: ack.lua's ARGV[2] when each item also carries what its fetch observed.
MARKS_OBSERVED = 2
#: The upper bounds (s) of revisit.lua's lateness buckets (stats ``rv_late:<bound>``),
#: then ``inf``.
LATE_BOUNDS = (1, 10, 60, 600, 3600, 21600, 86400)
_NONE = Observed()


def _validator(value: str) -> str:
    return value if len(value.encode()) <= MAX_VALIDATOR_BYTES else ""


def observed_arg(observed: Observed | None) -> str:
    """One ack item's ``observed`` value: ``<max_age_s> <digest|-> <#etag> <#lm>
    <etag><lm>`` (lengths in bytes, as Lua counts them); None: nothing observed."""
    o = observed or _NONE
    etag, lm = _validator(o.etag), _validator(o.last_modified)
    digest = "".join(o.digest.split()) or "-"
    return (f"{max(o.max_age_s, -1)} {digest} {len(etag.encode())} {len(lm.encode())} "
            f"{etag}{lm}")


async def promote_revisits(crawl: Crawl, pk: PartitionKeys, limit: int) -> tuple[int, int]:
    """Move one partition's due revisits into their hosts' queues (``revisit.lua``), a
    batch of `limit` at a time; returns (moved, ms to the next due one or -1)."""
    client, moved = crawl.client, 0
    while True:
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros // 1000
        raw = cast(list[bytes], await client.zrangebyscore(pk.rv_due, "-inf", now_ms,
                                                             start=0, num=limit))
        ids = [_text(m) for m in raw]
        hist_keys = [crawl.history_key(pk, tid) for tid in ids]
        values = await crawl.scripts.history_get(
            keys=hist_keys, args=[history_field(tid) for tid in ids]) if ids else []
        found = [record_host(v) for v in values]
        hosts = list(dict.fromkeys(h for h in found if h))
        host_keys, host_head = host_args(pk, hosts)
        r = await crawl.scripts.revisit(
            keys=[*pk.host_state, pk.rv_due, pk.stats, pk.pending, pk.prio_hosts,
                  *host_keys, *hist_keys], args=[*host_head, *ids])
        moved += int(r[0])
        if len(ids) < limit or int(r[0]) == 0:
            return moved, int(r[1])


def late_quantile(counters: Mapping[str, int], q: float) -> float | None:
    """The q-quantile of the lateness buckets in `counters` (a bucket's upper bound, s;
    ``inf`` past the last), or None when no revisit was counted."""
    bounds = [*(float(b) for b in LATE_BOUNDS), float("inf")]
    counts = [counters.get(f"rv_late:{b}", 0) for b in (*LATE_BOUNDS, "inf")]
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for bound, n in zip(bounds, counts, strict=True):
        seen += n
        if seen >= q * total:
            return bound
    return bounds[-1]


def revisit_stats(counters: Mapping[str, int], scheduled: int, due: int) -> RevisitStats:
    """The schedule's numbers: `scheduled` and `due` URLs (ZCARD and ZCOUNT up to now of
    ``rv:due``) with what `counters` (the partitions' summed stats) say of its revisits."""
    return RevisitStats(
        scheduled=scheduled, due=due, revisits=counters.get("revisits", 0),
        late_p50_s=late_quantile(counters, 0.5), late_p99_s=late_quantile(counters, 0.99),
        not_modified=counters.get("outcome:not_modified", 0),
        unchanged=counters.get("outcome:unchanged", 0),
        changed=counters.get("outcome:changed", 0))
