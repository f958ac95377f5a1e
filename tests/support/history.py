"""Reading (and, for tests of older records, writing) done URLs' history records
(``rv:hist:<bucket>``, common/revisits/record.py) the way the scripts keep them."""

from __future__ import annotations

from collections.abc import Iterable
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

from common.revisits.record import HistoryRecord, decode_record, history_field


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _text(s: str) -> bytes:
    return _varint(len(s.encode())) + s.encode()


def encode_record(r: HistoryRecord) -> bytes:
    """`r` as lib/revisits.lua's record_encode writes it."""
    flags, sums = 0, b""
    if r.n > 0:
        flags |= 1
        sums = b"".join(_varint(round(v * 1000)) for v in (r.n, r.x, r.t))
        if r.e is not None:
            flags |= 2
            sums += _varint(round(r.e * 1000))
    digest = _text(r.digest)
    if len(r.digest) == 16 and all(c in "0123456789abcdef" for c in r.digest):
        flags, digest = flags | 4, bytes.fromhex(r.digest)
    lm = _text(r.last_modified)
    try:
        at = int(parsedate_to_datetime(r.last_modified).timestamp())
    except (TypeError, ValueError):
        at = -1
    if 0 <= at < 2**32 and formatdate(at, usegmt=True) == r.last_modified:
        flags, lm = flags | 8, at.to_bytes(4, "little")
    return (bytes([flags]) + _varint(r.priority) + _varint(r.interval_s)
            + r.fetched_s.to_bytes(4, "little") + sums + digest + lm + _text(r.etag)
            + _text(r.host if r.tail else "") + r.tail)


async def raw_record(q: Any, tid: str, partition: int = 0) -> bytes | None:
    """The stored bytes of `tid`'s record in `partition`."""
    pk = q.partitions[partition]
    value = await q.client.hget(q.on.history_key(pk, tid), history_field(tid))
    return value  # type: ignore[no-any-return]


async def record_of(q: Any, tid: str, partition: int = 0) -> HistoryRecord | None:
    """`tid`'s record in `partition`, decoded (None: none or malformed)."""
    return decode_record(await raw_record(q, tid, partition))


async def write_record(q: Any, tid: str, value: bytes, partition: int = 0) -> None:
    pk = q.partitions[partition]
    await q.client.hset(q.on.history_key(pk, tid), history_field(tid), value)


async def histories(q: Any, pk: Any, tids: Iterable[str] | None = None
                    ) -> dict[str, HistoryRecord | None]:
    """Every record of partition `pk` by id (None: malformed): from each bucket that
    exists (by SCAN), or those of `tids` (every record in them, not theirs alone)."""
    if tids is None:
        pattern = pk.prefix.replace("{", "\\{").replace("}", "\\}") + "rv:hist:*"
        keys = [key async for key in q.client.scan_iter(match=pattern, count=1000)]
    else:
        keys = list({q.on.history_key(pk, tid) for tid in tids})
    out: dict[str, HistoryRecord | None] = {}
    for key in keys:
        for field, value in (await q.client.hgetall(key)).items():
            out[field.hex()] = decode_record(value)
    return out


async def history_count(q: Any) -> int:
    """The history records of every partition."""
    return sum([len(await histories(q, pk)) for pk in q.partitions])
