"""Progress while a run lasts: a tqdm bar on a terminal, a log line every few seconds otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Never, TextIO

from tqdm import tqdm

from producer.summary import Summary

__all__ = ["LOG_EVERY_S", "Progress"]

log = logging.getLogger("producer")

LOG_EVERY_S = 5.0


class Progress:
    """Updated once per batch; ``mode`` is auto (bar on a TTY), on or off (logs only)."""

    def __init__(self, summary: Summary, mode: str = "auto", *,
                 stream: TextIO | None = None, log_every_s: float = LOG_EVERY_S) -> None:
        self._summary = summary
        self._stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar: tqdm[Never] | None = None
        if mode == "on" or (mode == "auto" and tty):
            self._bar = tqdm(file=self._stream, unit=" URLs", unit_scale=True,
                             dynamic_ncols=True, mininterval=0.5, leave=False)
        self._log_every_s = log_every_s
        self._started = time.monotonic()
        self._next_log = self._started + log_every_s
        self._shown = 0

    def update(self) -> None:
        s = self._summary
        if self._bar is not None:
            self._bar.update(s.read - self._shown)
            self._shown = s.read
            self._bar.set_postfix(enqueued=s.enqueued, dup=s.duplicates, invalid=s.invalid,
                                  refresh=False)
            return
        now = time.monotonic()
        if now >= self._next_log:
            self._next_log = now + self._log_every_s
            elapsed = now - self._started
            log.info("producer_progress", extra={
                "crawl": s.crawl, "read": s.read, "enqueued": s.enqueued,
                "duplicates": s.duplicates, "invalid": s.invalid,
                "urls_per_s": round(s.read / elapsed) if elapsed > 0 else 0})

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
