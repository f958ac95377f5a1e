"""The run summary: counted while the pipeline runs, printed as text or one JSON object.

JSON schema (``--json``; one object on stdout, every key always present)::

    crawl              str    the crawl name
    read               int    URL and request lines read (blank lines and # comments not
                              counted)
    invalid            int    lines rejected (by the canonicalizer, or as requests)
    invalid_by_reason  {str: int}  rejects per reason code (empty, bad_scheme, ...; a
                              request's bad_json, bad_request)
    duplicates         int    valid URLs already seen in the crawl (or earlier in the input)
    enqueued           int    tasks created from the inputs (recrawled ones included)
    recrawled          int    of those, URLs seen before and enqueued again (recrawl_after)
    recrawled_known    int    known URLs past the recrawl window queued again from the
                              crawl's history (not in enqueued; producer/known.py)
    known_scanned      int    history records read for them (0: none was due, not read)
    known_due_in_s     int | null   when none was due: seconds until the first comes due
    elapsed_s          float  wall time of the run
    urls_per_s         float  read / elapsed_s
    dry_run            bool   nothing was written
    exit_code          int    the process exit code (0, 2, 3, 4, 5)
    error              str | null   why the run failed, when exit_code != 0
    notice             str | null   why nothing was enqueued, when that happened
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from common import codec
from common.queue import KnownRecrawl

__all__ = ["MAX_SHOWN_REJECTS", "Reject", "Summary"]

MAX_SHOWN_REJECTS = 5


@dataclass(frozen=True, slots=True)
class Reject:
    """One rejected line: where it was, why, and a message that never holds credentials."""

    origin: str
    line: int
    reason: str
    message: str


@dataclass(slots=True)
class Summary:
    """Counts of one producer run."""

    crawl: str
    dry_run: bool = False
    read: int = 0
    invalid_by_reason: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    enqueued: int = 0
    recrawled: int = 0
    elapsed_s: float = 0.0
    exit_code: int = 0
    error: str | None = None
    first_rejects: list[Reject] = field(default_factory=list)
    reject_file: str | None = None
    #: The known URLs brought back past the recrawl window (None: the crawl has none so).
    known: KnownRecrawl | None = None

    @property
    def invalid(self) -> int:
        return sum(self.invalid_by_reason.values())

    @property
    def valid(self) -> int:
        return self.read - self.invalid

    @property
    def urls_per_s(self) -> float:
        return self.read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def notice(self) -> str | None:
        """Why nothing was enqueued, said plainly; None when something was (or on error)."""
        if self.enqueued or self.dry_run or self.exit_code or (
                self.known is not None and self.known.recrawled):
            return None
        if self.read == 0:
            return "nothing enqueued: the input held no URLs"
        if self.valid == 0:
            return f"nothing enqueued: all {self.read} lines were rejected as invalid"
        if self.duplicates == self.valid and self.known is not None:
            due = self.known.next_due_s
            return (f"nothing enqueued: all {self.duplicates} URLs were already seen in crawl "
                    f"{self.crawl} and no known URL is past its recrawl window"
                    + (f" (the first comes due in {_duration(due)})" if due else ""))
        if self.duplicates == self.valid:
            return (f"nothing enqueued: all {self.duplicates} URLs were already seen in crawl "
                    f"{self.crawl}; use `crawlq crawl set --crawl {self.crawl} "
                    "recrawl_after=DURATION` to fetch the done ones again, or a new --crawl "
                    "name")
        return None  # pragma: no cover - valid URLs are either enqueued or duplicates

    def to_dict(self) -> dict[str, Any]:
        return {
            "crawl": self.crawl,
            "read": self.read,
            "invalid": self.invalid,
            "invalid_by_reason": dict(sorted(self.invalid_by_reason.items())),
            "duplicates": self.duplicates,
            "enqueued": self.enqueued,
            "recrawled": self.recrawled,
            "recrawled_known": self.known.recrawled if self.known else 0,
            "known_scanned": self.known.scanned if self.known else 0,
            "known_due_in_s": self.known.next_due_s if self.known else None,
            "elapsed_s": round(self.elapsed_s, 3),
            "urls_per_s": round(self.urls_per_s, 1),
            "dry_run": self.dry_run,
            "exit_code": self.exit_code,
            "error": self.error,
            "notice": self.notice,
        }

    @staticmethod
    def _known_line(k: KnownRecrawl) -> str:
        if not k.partitions:
            return ("  known URLs: none past the recrawl window yet"
                    + (f" (the first comes due in {_duration(k.next_due_s)})"
                       if k.next_due_s else ""))
        line = (f"  known URLs: recrawled {k.recrawled} past the recrawl window, of "
                f"{k.scanned} in the crawl's history, in {k.elapsed_s:.1f}s")
        if k.duplicates:
            line += f"; already queued: {k.duplicates}"
        if k.no_entry:
            line += (f"; {k.no_entry} past it kept no entry (done by a crawlq before 43: "
                     "only their seeds or links bring them back)")
        if k.stopped:
            line += " (stopped early: the next run goes on)"
        return line

    def to_json(self) -> str:
        return codec.dumps(self.to_dict())

    def to_text(self) -> str:
        """The human summary, a few lines."""
        head = "dry run (nothing written)" if self.dry_run else f"crawl {self.crawl}"
        lines = [
            f"{head}: read {self.read}, invalid {self.invalid}, duplicates {self.duplicates}, "
            f"enqueued {self.enqueued}"
            + (f" (recrawled {self.recrawled})" if self.recrawled else "")
            + f" in {self.elapsed_s:.1f}s ({self.urls_per_s:,.0f} URLs/s)",
        ]
        if self.dry_run:
            lines.append(f"  {self.valid} valid URLs would be offered to the crawl "
                         "(dedup not checked in a dry run)")
        if self.invalid_by_reason:
            reasons = ", ".join(f"{r} {n}" for r, n in self.invalid_by_reason.most_common())
            lines.append(f"  invalid by reason: {reasons}")
            for r in self.first_rejects:
                lines.append(f"    {r.origin}:{r.line}: {r.reason}: {r.message}")
            more = self.invalid - len(self.first_rejects)
            if self.reject_file:
                lines.append(f"    every reject is in {self.reject_file}")
            elif more:
                lines.append(f"    ... and {more} more (--reject-file PATH writes them all)")
        if self.known is not None:
            lines.append(self._known_line(self.known))
        if self.notice:
            lines.append(self.notice)
        if self.error:
            lines.append(f"error: {self.error}")
        return "\n".join(lines)


def _duration(seconds: int) -> str:
    """`seconds` as the flags write a duration, largest units first (1d2h, 5m30s)."""
    out, left = "", max(0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out + (f"{left}s" if left or not out else "")
