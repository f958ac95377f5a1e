"""The result record, the Sink protocol, and the rotating-file machinery file sinks share.

Contract of every sink: when `write()` returns, the records have reached the sink
(written and flushed to the OS for files, XADD acknowledged for streams). The consumer
acks tasks only after that, so delivery is at-least-once: a write that fails or is
cancelled half-way may leave some of its records behind, and they are written again
when the tasks are retried.

File sinks (`RotatingFileSink`) do all file work of a batch (encoding, compression,
write, flush, rotation) in one call. A small batch is written on the event loop: handing
it to a thread and back (through the GIL) costs more CPU than the work itself (measured:
~10 us per record at the consumer's usual 32-record batches, a quarter of its own
overhead). A large batch, and every batch once one write on the loop was slow (a slow
or network disk), goes through `asyncio.to_thread`, so a stalled disk can't stall the
heartbeats. A `threading.Lock` keeps those calls in order even when a caller is
cancelled while its thread still runs, so two batches never interleave in a file.
Files are created lazily on the first batch (no empty files), named
``<crawl>-<worker>-<seq>.<ext>`` with ``seq`` counting up from the highest one already
in the directory, and closed once they pass `rotate_bytes`, so a file may exceed it by
one batch. If a write fails (disk full), the file is closed and
the next batch starts a new one rather than appending after a torn write.

`probe()` tells whether the directory takes writes again after a failure (the consumer
calls it while its sink fails and it has no results to try with): it writes and syncs
`PROBE_BYTES` to a hidden file, ``.<crawl>-<worker>-probe``, then removes it.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from common.errors import ConfigError
from common.tasks.pgtarget import is_postgres_url

__all__ = ["DEFAULT_ROTATE_BYTES", "PROBE_BYTES", "NamedSink", "ProbingSink", "Record",
           "RotatingFileSink", "Sink", "SinkUnavailableError", "is_postgres_url", "safe_name"]

log = logging.getLogger("consumer.sinks")

DEFAULT_ROTATE_BYTES = 256 * 1024 * 1024
#: A batch whose bodies add up to at most this is written on the event loop.
INLINE_WRITE_BYTES = 1024 * 1024
#: A write on the loop that took longer sends every later batch through a thread.
SLOW_WRITE_S = 0.05
#: What a probe writes: a typical batch of results without bodies.
PROBE_BYTES = 64 * 1024
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._\-]+")


@dataclass(slots=True)
class Record:
    """What a consumer learned about one task, handed to a sink."""

    task_id: str
    url: str
    final_url: str
    status: int | None  # None: no HTTP response (robots_disallowed, network error ...)
    outcome: str
    headers: dict[str, str]  # bounded subset, lowercase names
    raw_headers: Sequence[tuple[builtins.bytes, builtins.bytes]]  # as received (for WARC)
    body: builtins.bytes | None  # decoded body (Content-/Transfer-Encoding removed)
    bytes: int  # body size in bytes
    elapsed: float  # seconds
    attempt: int
    fetched_at: float  # unix seconds
    worker: str
    http_version: str = "1.1"
    items: list[Any] = field(default_factory=list)  # what a user handler returned
    depth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    digest: str = ""  # the body's BLAKE2b-64 in hex (consumer.revisits.digest); "": none
    refers_to_s: int = 0  # a revisit's: when its URL's previous visit was fetched (0: none)
    unique_key: str = ""  # its request's unique key, the base of its items' keys ("": url)
    fence: int = 0  # the fencing token of the lease that wrote it (keyed sinks keep it)

    def __post_init__(self) -> None:
        if not self.unique_key:
            self.unique_key = self.url


class SinkUnavailableError(ConnectionError):
    """A sink that can't be used now: its message says why and what to do."""


@runtime_checkable
class Sink(Protocol):
    """Where results go. `write` returns only once the records have reached the sink."""

    async def open(self) -> None: ...

    async def write(self, records: Sequence[Record]) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ProbingSink(Protocol):
    """A sink that can tell, without results to write, whether it takes writes again."""

    async def probe(self) -> None:
        """Return if a write would succeed now; raise what a write would raise."""


@runtime_checkable
class NamedSink(Protocol):
    """A sink that says what it is and where it writes (no password), for operators."""

    kind: str
    where: str





def safe_name(value: str) -> str:
    """`value` made safe as part of a file name (``host:1/2`` -> ``host_1_2``)."""
    return _UNSAFE_RE.sub("_", value).strip("._") or "_"


class RotatingFileSink(abc.ABC):
    """A sink writing size-rotated files ``<crawl>-<worker>-<seq><suffix>`` in a directory.

    Subclasses implement the blocking `_start_file`, `_encode_and_write` and
    `_end_file`; this class runs them once per batch, on the loop or in a worker thread
    (see the module docstring).
    """

    suffix: str = ""

    def __init__(
        self,
        *,
        output_dir: Path,
        crawl: str,
        worker: str,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
    ) -> None:
        if rotate_bytes <= 0:
            raise ConfigError(f"rotate_bytes must be positive, got {rotate_bytes}")
        self.output_dir = Path(output_dir)
        self.crawl = crawl
        self.worker = worker
        self.rotate_bytes = rotate_bytes
        self._prefix = f"{safe_name(crawl)}-{safe_name(worker)}-"
        self._next_seq = 0
        self._fh: BinaryIO | None = None
        self._path: Path | None = None
        self._file_records = 0
        self._opened = False
        self._closed = False  # close() was called (checked on the loop)
        self._finished = False  # the last file is closed (checked under the lock)
        self._lock = threading.Lock()  # never waited for on the loop
        self._inline = True  # small batches are written on the loop (until one is slow)
        self.files: list[Path] = []  # every file this sink created, in order

    # -- async API ---------------------------------------------------------------

    async def open(self) -> None:
        """Create the output directory and find the next free sequence number."""
        if self._closed:
            raise RuntimeError("sink is closed")
        if not self._opened:
            await asyncio.to_thread(self._open_sync)

    async def write(self, records: Sequence[Record]) -> None:
        """Encode and append `records`, flushed to the OS when this returns."""
        if self._closed:
            raise RuntimeError("sink is closed")
        if not records:
            return
        if not self._opened:
            await self.open()
        batch = list(records)
        if (self._inline and not self._lock.locked()
                and sum(r.bytes for r in batch) <= INLINE_WRITE_BYTES):
            started = time.monotonic()
            self._write_sync(batch)
            took = time.monotonic() - started
            if took > SLOW_WRITE_S:
                self._inline = False
                log.warning("sink_slow_write", extra={"seconds": round(took, 3),
                                                      "records": len(batch)})
            return
        await asyncio.to_thread(self._write_sync, batch)

    async def probe(self) -> None:
        """Write, sync and remove a hidden file of PROBE_BYTES in the output directory:
        returns if that worked (space, permissions and a writable volume again)."""
        if self._closed:
            raise RuntimeError("sink is closed")
        await asyncio.to_thread(self._probe_sync)

    async def close(self) -> None:
        """Flush and close the current file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._close_sync)

    # -- blocking work, run in a thread --------------------------------------------

    def _open_sync(self) -> None:
        with self._lock:
            if self._opened:
                return
            self.output_dir.mkdir(parents=True, exist_ok=True)
            pattern = re.compile(re.escape(self._prefix) + r"(\d+)" + re.escape(self.suffix) + "$")
            seqs = [
                int(m.group(1)) for p in self.output_dir.iterdir() if (m := pattern.match(p.name))
            ]
            self._next_seq = max(seqs, default=-1) + 1
            self._opened = True

    def _write_sync(self, records: list[Record]) -> None:
        with self._lock:
            if self._finished:
                raise RuntimeError("sink is closed")
            if self._fh is None:
                self._new_file()
            fh = self._fh
            assert fh is not None
            try:
                self._encode_and_write(fh, records)
                fh.flush()
            except BaseException:
                # Don't append after a torn write: start a fresh file next time.
                self._finish_file(reason="write_failed")
                raise
            self._file_records += len(records)
            if fh.tell() >= self.rotate_bytes:
                self._finish_file(reason="rotated")

    def _probe_sync(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / f".{self._prefix}probe"
        try:
            with path.open("wb") as fh:
                fh.write(bytes(PROBE_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            path.unlink(missing_ok=True)

    def _close_sync(self) -> None:
        with self._lock:
            self._finished = True
            self._finish_file(reason="closed")

    def _new_file(self) -> None:
        while True:
            path = self.output_dir / f"{self._prefix}{self._next_seq:05d}{self.suffix}"
            self._next_seq += 1
            try:
                fh = path.open("xb")  # exclusive: never clobber another process's file
            except FileExistsError:
                continue
            break
        self._fh, self._path, self._file_records = fh, path, 0
        self.files.append(path)
        try:
            self._start_file(fh, path)
            fh.flush()
        except BaseException:
            self._finish_file(reason="write_failed")
            raise
        log.info("sink_file_opened", extra={"path": str(path)})

    def _finish_file(self, *, reason: str) -> None:
        fh, path = self._fh, self._path
        if fh is None:
            return
        self._fh = self._path = None
        size = 0
        try:
            try:
                self._end_file(fh)
                fh.flush()
                size = fh.tell()
            finally:
                fh.close()
        except OSError:
            if reason != "write_failed":
                raise
        log.info(
            "sink_file_closed",
            extra={
                "path": str(path),
                "reason": reason,
                "records": self._file_records,
                "size_bytes": size,
            },
        )

    # -- format hooks -------------------------------------------------------------

    def _start_file(self, fh: BinaryIO, path: Path) -> None:  # noqa: B027 - optional hook
        """Write a file header (the WARC warcinfo record). Default: nothing."""

    @abc.abstractmethod
    def _encode_and_write(self, fh: BinaryIO, records: list[Record]) -> None:
        """Encode `records` and write them to `fh` (flushed by the caller)."""

    def _end_file(self, fh: BinaryIO) -> None:  # noqa: B027 - optional hook
        """Write a file trailer. Default: nothing."""
