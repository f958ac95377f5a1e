"""A crawl's history: snapshots of its summed counters, for rates and charts.

The consumers write it (`record`, from the reaper, about every `HISTORY_EVERY_S`
fleet-wide); ``crawlq stats`` reads the last minute for its rates and the dashboard the
last hour for its chart (`read`, `rates`, `series`). The LIST ``history`` holds at most
`HISTORY_LEN` JSON snapshots ``{"t": unix s of Redis TIME, "<counter>": n, ...}``,
newest first: one hour at one snapshot every five seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from common import codec
from common.keys import CrawlKeys
from common.redis.connection import RedisClient
from common.redis.scripts import register

HISTORY_EVERY_S = 5.0
HISTORY_LEN = 720
#: What `history_push.lua` needs between two snapshots: a little under the cadence, so
#: two consumers taking turns don't skip every other one.
MIN_GAP_MS = int(HISTORY_EVERY_S * 800)
RATE_WINDOW_S = 60.0
#: The first LRANGE of a read that stops at a time: 16 snapshots, about 80 s.
_FIRST_CHUNK = 16

Snapshot = dict[str, Any]


async def record(client: RedisClient, crawl: str, counters: dict[str, int]) -> bool:
    """Push one snapshot of `counters`, stamped with Redis TIME; False if one is too recent."""
    script = register(client, "history_push")
    pushed = await script(keys=[CrawlKeys.build(crawl).history],
                          args=[codec.dumps(counters), MIN_GAP_MS, HISTORY_LEN])
    return bool(pushed)


def _decode(raw: Iterable[bytes | str]) -> list[Snapshot]:
    found = []
    for item in raw:
        try:
            snap = codec.loads(item)
        except ValueError:
            continue
        if isinstance(snap, dict) and isinstance(snap.get("t"), int | float):
            found.append(snap)
    return found


async def read(client: RedisClient, crawl: str, *, back_to: float | None = None
               ) -> list[Snapshot]:
    """Snapshots, newest first: all of them, or only back to the first one at or before
    `back_to` (unix s; that one included, as the base of a rate).

    A read back to a recent time takes one short LRANGE, then doubles its chunk: the
    cost follows how far back it reads, not the length of the list.
    """
    key = CrawlKeys.build(crawl).history
    if back_to is None:
        return _decode(await client.lrange(key, 0, HISTORY_LEN - 1))
    found: list[Snapshot] = []
    start, size = 0, _FIRST_CHUNK
    while start < HISTORY_LEN:
        raw = await client.lrange(key, start, min(start + size, HISTORY_LEN) - 1)
        for snap in _decode(raw):
            found.append(snap)
            if float(snap["t"]) <= back_to:
                return found
        if len(raw) < size:
            break
        start, size = start + size, size * 2
    return found


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rates(history: Sequence[Snapshot], window_s: float = RATE_WINDOW_S) -> dict[str, Any] | None:
    """Per-second rates from snapshots (newest first), over about `window_s`.

    Compares the newest snapshot with the newest one at least `window_s` older (or the
    oldest one there is). None when there are fewer than two usable snapshots.
    """
    if len(history) < 2:
        return None
    newest = history[0]
    t1 = float(newest.get("t", 0))
    older = [h for h in history[1:] if float(h.get("t", 0)) < t1]
    if not older:
        return None
    base = next((h for h in older if t1 - float(h["t"]) >= window_s), older[-1])
    span = t1 - float(base["t"])
    out: dict[str, Any] = {"window_s": round(span, 1)}
    for key, value in newest.items():
        if key == "t" or not _number(value):
            continue
        before = base.get(key, 0)
        if _number(before):
            out[f"{key}_per_s"] = round((value - before) / span, 2)
    return out


def series(history: Sequence[Snapshot], names: Sequence[str]) -> list[dict[str, float]]:
    """Per-second rates of `names` between consecutive snapshots, oldest first.

    Each point is ``{"t": end of the interval, name: rate, ...}``; a counter that went
    down (a reset crawl) counts as 0 for that interval.
    """
    ordered = sorted(history, key=lambda h: float(h["t"]))
    points = []
    for before, after in pairwise(ordered):
        span = float(after["t"]) - float(before["t"])
        if span <= 0:
            continue
        point = {"t": float(after["t"])}
        for name in names:
            a, b = after.get(name, 0), before.get(name, 0)
            delta = a - b if _number(a) and _number(b) else 0
            point[name] = round(max(0, delta) / span, 3)
        points.append(point)
    return points
