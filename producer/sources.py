"""Line sources: files (``.gz`` too), stdin and ``--url`` values, streamed in chunks.

A source yields :class:`Chunk` objects: a few thousand raw lines with the name of the
source and the line number of the first one, so rejects can point at ``file:line``.
Files are read in 1 MiB blocks and split on newlines, so memory stays constant
whatever the input size, and a line longer than :data:`MAX_LINE_BYTES` is cut (it is
rejected as too long later) instead of being held whole.

A source of requests (``--requests``: one JSON object per line, the fields of
``common.tasks.request.request_from_dict``) yields chunks marked ``requests``; its lines may be
up to :data:`MAX_REQUEST_LINE_BYTES` long (a request carries a body and data). A chunk of
requests may also hold :class:`~common.tasks.request.Request` objects themselves (made in
Python: a spider's seeds).

Blank lines and ``#`` comments are kept in the chunk; the pipeline skips them, which
keeps line numbers right. A UTF-8 byte-order mark at the start of a source (Windows
editors write one) is dropped.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import sys
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from common.errors import SourceError
from common.tasks.request import Request

__all__ = ["BLOCK_BYTES", "MAX_LINE_BYTES", "MAX_REQUEST_LINE_BYTES", "STDIN", "Chunk",
           "LineSplitter", "check_files", "file_chunks", "stdin_chunks", "url_chunks"]

BLOCK_BYTES = 1 << 20
#: Longer lines are cut to this many bytes (a URL is at most 2 KiB; this only bounds memory).
MAX_LINE_BYTES = 64 * 1024
#: The same for a line of a request: a body (64 KiB, its JSON escapes) and data (64 KiB).
MAX_REQUEST_LINE_BYTES = 512 * 1024
STDIN = "-"
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive raw lines of one source; ``first_line`` is 1-based. With
    ``requests``, each line is a request: a JSON object (checked when it is read) or a
    Request (a spider's start request, checked where it entered: ``Spider.start``)."""

    origin: str
    first_line: int
    lines: Sequence[str | Request]
    requests: bool = False


def check_files(paths: Sequence[str]) -> None:
    """Fail fast, before any work, if an input file is missing or unreadable."""
    for path in paths:
        if path == STDIN:
            continue
        p = Path(path)
        if not p.is_file():
            raise SourceError(f"input file {path!r} does not exist or is not a file; "
                              "check the path")
        if not os.access(p, os.R_OK):
            raise SourceError(f"input file {path!r} is not readable; check its permissions")


class LineSplitter:
    """Turns byte blocks into decoded lines with bounded memory.

    Invalid UTF-8 is kept as surrogate escapes, so such a line is rejected by the
    canonicalizer rather than silently rewritten. A line over MAX_LINE_BYTES is cut
    there and the rest of it dropped.
    """

    __slots__ = ("_at_start", "_carry", "_max_line", "_skipping")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._max_line = max_line
        self._carry = b""
        self._skipping = False  # inside an overlong line, dropping bytes up to its newline
        self._at_start = True  # a byte-order mark may still come

    def feed(self, block: bytes) -> list[str]:
        if self._at_start:
            block, self._carry = self._carry + block, b""
            if len(block) < len(_BOM) and _BOM.startswith(block):
                self._carry = block  # a read cut the BOM (or the source is that short)
                return []
            self._at_start = False
            block = block.removeprefix(_BOM)
        if self._skipping:
            nl = block.find(b"\n")
            if nl < 0:
                return []
            block = block[nl + 1:]
            self._skipping = False
        buf = self._carry + block if self._carry else block
        complete, sep, rest = buf.rpartition(b"\n")
        lines = complete.decode("utf-8", "surrogateescape").split("\n") if sep else []
        if len(rest) > self._max_line:
            lines.append(rest[:self._max_line].decode("utf-8", "surrogateescape"))
            rest = b""
            self._skipping = True
        self._carry = rest
        return lines

    def finish(self) -> list[str]:
        carry, self._carry = self._carry, b""
        return [carry.decode("utf-8", "surrogateescape")] if carry else []


def _open(path: str) -> BinaryIO:
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"  # gzip magic, whatever the file is called
        if gzipped:
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as exc:
        raise SourceError(f"could not open input file {path!r}: {exc.strerror}") from None


async def _chunks(origin: str, blocks: AsyncIterator[bytes], requests: bool
                  ) -> AsyncGenerator[Chunk, None]:
    splitter = LineSplitter(MAX_REQUEST_LINE_BYTES if requests else MAX_LINE_BYTES)
    line = 1
    async for block in blocks:
        lines = splitter.feed(block)
        if lines:
            yield Chunk(origin, line, lines, requests)
            line += len(lines)
    tail = splitter.finish()
    if tail:
        yield Chunk(origin, line, tail, requests)


async def file_chunks(path: str, *, requests: bool = False) -> AsyncGenerator[Chunk, None]:
    """The lines of a file (gzip-compressed or not), in chunks; with `requests`, lines
    of JSON requests."""
    stream = _open(path)

    async def blocks() -> AsyncIterator[bytes]:
        try:
            while True:
                try:
                    block = stream.read(BLOCK_BYTES)
                except (OSError, EOFError, zlib.error) as exc:
                    raise SourceError(f"could not read {path!r}: {exc}") from None
                if not block:
                    return
                yield block
                await asyncio.sleep(0)  # let the lock refresher and signal handlers run
        finally:
            stream.close()

    async for chunk in _chunks(path, blocks(), requests):
        yield chunk


async def stdin_chunks(stream: BinaryIO | None = None, *, requests: bool = False
                       ) -> AsyncGenerator[Chunk, None]:
    """The lines of stdin, in chunks; reads in a thread so a slow pipe never blocks the
    loop. With `requests`, lines of JSON requests."""
    src = stream if stream is not None else sys.stdin.buffer
    read1 = getattr(src, "read1", src.read)

    async def blocks() -> AsyncIterator[bytes]:
        while True:
            try:
                block = await asyncio.to_thread(read1, BLOCK_BYTES)
            except OSError as exc:
                raise SourceError(f"could not read stdin: {exc}") from None
            if not block:
                return
            yield block

    async for chunk in _chunks(STDIN, blocks(), requests):
        yield chunk


async def url_chunks(urls: Sequence[str]) -> AsyncGenerator[Chunk, None]:
    """The ``--url`` values as one source."""
    if urls:
        yield Chunk("--url", 1, list(urls))
