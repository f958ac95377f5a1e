"""What a recrawl carries between two visits of a URL (issue 26).

`Revisit` is what the frontier hands back with a task it brought back on its revisit
schedule: the previous visit's validators (sent as ``If-None-Match`` /
``If-Modified-Since``), its content digest (a 200 whose digest is equal is
``unchanged``), when it was fetched and the interval that brought it back. In a task's
entry it is the field ``v``: ``[etag, last_modified, digest, fetched_s, interval_s]``
("" / 0 = none), written by the frontier's scripts from the URL's own history, never
from another URL's.

`Observed` is what one fetch learned for the URL's history, carried by its ack: the
response's validators, its digest and the freshness lifetime it declared
(``Cache-Control: max-age`` / ``Expires``; -1 = none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import MalformedTaskError

#: A longer ETag or Last-Modified is not kept (not worth its room in the history); the
#: scripts' lib/revisits.lua holds the same bound.
MAX_VALIDATOR_BYTES = 256


@dataclass(frozen=True, slots=True)
class Revisit:
    """The previous visit of a task's URL, as its history keeps it."""

    etag: str = ""
    last_modified: str = ""
    digest: str = ""
    fetched_s: int = 0
    interval_s: int = 0

    def to_field(self) -> list[Any]:
        """The entry's ``v`` field."""
        return [self.etag, self.last_modified, self.digest, self.fetched_s, self.interval_s]

    @classmethod
    def from_field(cls, value: Any) -> Revisit:
        """Parse an entry's ``v`` field; raises MalformedTaskError saying what is wrong."""
        if not isinstance(value, list) or len(value) != 5:
            raise MalformedTaskError("task revisit (v) must be a list of 5 values: "
                                     "[etag, last_modified, digest, fetched_s, interval_s]")
        etag, last_modified, digest, fetched_s, interval_s = value
        if not all(isinstance(v, str) for v in (etag, last_modified, digest)):
            raise MalformedTaskError("task revisit etag, last_modified and digest must be "
                                     "strings")
        if not all(type(v) is int and v >= 0 for v in (fetched_s, interval_s)):
            raise MalformedTaskError("task revisit fetched_s and interval_s must be "
                                     "integers >= 0")
        return cls(etag, last_modified, digest, fetched_s, interval_s)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one fetch of a URL learned for its history (carried by the ack)."""

    etag: str = ""
    last_modified: str = ""
    digest: str = ""
    max_age_s: int = -1
