"""A completion: what became of one leased task, from the runner to the flusher.

Its `CompletionKind` says which flush step sends it (consumer/flush.py's `STEPS`); an
ack's `Outcome` (common/reasons.py), what the task's attempt came to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from common.queue import Failure, Lease
from common.reasons import Outcome
from common.tasks.request import Request
from common.traps.soft404 import Signature
from consumer.sinks import Record

if TYPE_CHECKING:  # the judgement reads completions: imported at run time, it would loop
    from consumer.judgement import PageFacts


class CompletionKind(StrEnum):
    """What becomes of a leased task at the flush; each kind but DROP is the flush step
    (`STEPS`) that sends it, and its string is that step's name in logs."""

    ACK = "ack"  # done, with an outcome and maybe a record
    FAIL = "fail"  # an attempt failed: retried with backoff, or dead
    RELEASE = "release"  # back to its host's queue, no attempt counted
    DROP = "drop"  # lost (the lease went elsewhere): nothing to send


@dataclass(slots=True)
class Completion:
    """What became of one leased task (its `CompletionKind`), waiting for the flusher."""

    lease: Lease
    kind: CompletionKind
    outcome: Outcome = Outcome.OK  # an ack's: the result's and its counter's
    record: Record | None = None
    failure: Failure | None = None
    urls: Sequence[str | Request] = ()
    page: PageFacts | None = None  # a handled HTML page's facts, to be judged
    probe: Signature | None = None  # a probe's answer: its directory's soft-404 signature
    child_meta: dict[str, Any] | None = None  # its links' meta, when not its own
    cut: int = 0  # its links a judgement did not follow (fate: its outcome)
