"""A done URL's history record as Python reads it (fsck, inspection, the revisit
promoter, tests): the binary form ``common/lua/lib/revisits.lua`` writes (record_encode)
in a partition's ``rv:hist:<bucket>`` HASHes, under the id's 16 bytes.

flags (1 byte: 1 estimator sums, 2 and e, 4 digest as 8 bytes, 8 Last-Modified as u32
seconds), priority and interval (varints), fetched (u32), [n, x, t[, e]] (varints of
thousandths), digest, Last-Modified, ETag and host (each as its flag says, else a varint
length and the bytes; no host in a record without entry), then the compact entry's tail
(no id, no ``v``): what brings the URL back (its revisit, or the producer's recrawl of the
known URLs past their window, ``common.queue.known``); none in a record an older crawlq
wrote for a recrawl window. Varints are unsigned LEB128, u32s little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import formatdate

_SUMS, _E, _DIGEST, _LM, _ALL = 1, 2, 4, 8, 15


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One done URL's last visit, as its history keeps it."""

    host: str  # '' in a record without entry (an older crawlq's recrawl window's)
    priority: int
    interval_s: int
    fetched_s: int
    digest: str
    etag: str
    last_modified: str
    tail: bytes  # the URL's compact entry without its id ('' in a record without entry)
    n: float = 0.0
    x: float = 0.0
    t: float = 0.0
    e: float | None = None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 1

    def varint(self) -> int:
        v = shift = 0
        while True:
            if self.at >= len(self.data) or shift > 56:
                raise ValueError("varint past the record's end")
            b = self.data[self.at]
            self.at += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                return v
            shift += 7

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("field past the record's end")
        self.at += n
        return self.data[self.at - n:self.at]

    def text(self) -> str:
        return self.take(self.varint()).decode("utf-8", "replace")

    def skip(self, flags: int, fixed: int, n: int) -> None:
        """Skip a field: `n` bytes when `flags` has the bit `fixed`, else a text."""
        self.take(n if flags & fixed else self.varint())


def history_field(tid: str) -> bytes:
    """A history record's field: the task id's 16 bytes."""
    return bytes.fromhex(tid)


def decode_record(value: bytes | None) -> HistoryRecord | None:
    """The record `value` holds; None when there is none or it is malformed (the
    scripts' record_decode reads it the same way)."""
    if not value or value[0] > _ALL:
        return None
    flags, rd = value[0], _Reader(value)
    try:
        prio, interval = rd.varint(), rd.varint()
        fetched = int.from_bytes(rd.take(4), "little")
        n = x = t = 0.0
        e: float | None = None
        if flags & _SUMS:
            n, x, t = rd.varint() / 1000, rd.varint() / 1000, rd.varint() / 1000
            if flags & _E:
                e = rd.varint() / 1000
        digest = rd.take(8).hex() if flags & _DIGEST else rd.text()
        lm = (formatdate(int.from_bytes(rd.take(4), "little"), usegmt=True) if flags & _LM
              else rd.text())
        etag, host = rd.text(), rd.text()
    except ValueError:
        return None
    return HistoryRecord(host, prio, interval, fetched, digest, etag, lm, value[rd.at:],
                         n, x, t, e)


def record_fetched(value: bytes) -> int | None:
    """When the record `value` holds was fetched (s); None when it is malformed. The
    producer's scan of the known URLs reads this of every record (a few hundred ns)."""
    if not value or value[0] > _ALL:
        return None
    at = 1
    for _ in range(2):  # priority and interval: varints, mostly one byte
        while at < len(value) and value[at] & 0x80:
            at += 1
        at += 1
    if at + 4 > len(value):
        return None
    return int.from_bytes(value[at:at + 4], "little")


def record_entry(value: bytes) -> tuple[str, int, bytes] | None:
    """The host, priority and compact entry tail of the record `value` holds: what its
    URL is queued again with (the entry: the id's 16 bytes, then the tail); None when
    it is malformed. The tail is empty in a record without entry."""
    if not value or value[0] > _ALL:
        return None
    flags, rd = value[0], _Reader(value)
    try:
        prio = rd.varint()
        rd.varint(), rd.take(4)
        for _ in range((4 if flags & _E else 3) if flags & _SUMS else 0):
            rd.varint()
        rd.skip(flags, _DIGEST, 8)
        rd.skip(flags, _LM, 4)
        rd.take(rd.varint())  # the ETag
        host = rd.text()
    except ValueError:
        return None
    return host, prio, value[rd.at:]


def record_host(value: bytes | None) -> str | None:
    """The host of the record `value` holds ('' in a record without entry); None when
    there is none or it is malformed. A promote reads only this (decode_record reads all,
    Last-Modified printed as a date included: ~4x as long)."""
    if not value or value[0] > _ALL:
        return None
    flags, rd = value[0], _Reader(value)
    try:
        rd.varint(), rd.varint(), rd.take(4)
        for _ in range((4 if flags & _E else 3) if flags & _SUMS else 0):
            rd.varint()
        rd.skip(flags, _DIGEST, 8)
        rd.skip(flags, _LM, 4)
        rd.take(rd.varint())  # the ETag
        return rd.text()
    except ValueError:
        return None
