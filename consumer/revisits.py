"""What a fetch learned about its URL's page, and what a revisit's response means (issue 26).

A task the frontier brought back carries its URL's previous visit (`Task.revisit`):

- its validators go out as ``If-None-Match`` / ``If-Modified-Since``
  (`conditional_headers`; the fetcher sends them to the task's URL only);
- the response's outcome (`outcome_of`): a 304 is ``not_modified``; a 2xx whose digest is
  the previous one is ``unchanged``, one whose digest differs ``changed``; a 404 or 410
  ``gone`` (the page was deleted since: under a recrawl window its ack deletes the URL's
  history record, so the producer brings it back no more); anything else (a first visit,
  another 4xx, a final 3xx) is ``ok`` / ``http_4xx`` as ever;
- `observe` says what goes into the URL's history with the ack (`Lease.observed`): the
  response's validators (only when it came from the task's URL itself, not through a
  redirect: a validator is its URL's own), its digest and its freshness lifetime. A 304
  keeps the previous visit's digest and any validator it does not replace.

``not_modified`` and ``unchanged`` responses are not handed to the handler (`NOT_HANDLED`):
the page is the one already handled, so its links are known and its items are the
previous visit's (the record's ``revisit`` and ``digest`` join it to them).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from common.http.results import FetchResult, http_date
from common.reasons import Outcome
from common.revisits.previous import MAX_VALIDATOR_BYTES, Observed, Revisit
from consumer.sinks import Record

__all__ = ["GONE_STATUSES", "NOT_HANDLED", "conditional_headers", "digest", "max_age_s",
           "noted", "observe", "outcome_of"]

#: The outcomes whose page was handled at an earlier visit: no handler this time.
NOT_HANDLED = frozenset({Outcome.NOT_MODIFIED, Outcome.UNCHANGED})
#: The statuses that say a recrawled page was deleted (RFC 9110 15.5.5, 15.5.11).
GONE_STATUSES = frozenset({404, 410})
#: RFC 9111 1.2.2: a delta-seconds past 2^31 is taken as 2^31.
_MAX_DELTA_S = 2**31


def digest(body: bytes) -> str:
    """A body's digest as a URL's history keeps it: 16 hex digits of BLAKE2b-64."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def conditional_headers(revisit: Revisit | None) -> dict[str, str] | None:
    """The headers that ask for a page only if it changed since `revisit` (None: none)."""
    if revisit is None:
        return None
    headers = {}
    if revisit.etag:
        headers["If-None-Match"] = revisit.etag
    if revisit.last_modified:
        headers["If-Modified-Since"] = revisit.last_modified
    return headers or None


def observe(revisit: Revisit | None, result: FetchResult) -> Observed:
    """What `result` tells the history of the task's URL (see the module docstring)."""
    headers = result.headers
    if result.redirects:  # the validators are another URL's
        etag = last_modified = ""
    else:
        etag = _kept(headers.get("etag"))
        last_modified = _kept(headers.get("last-modified"))
    fresh = max_age_s(result.raw_headers, headers.get("date"))
    if result.status == 304 and revisit is not None:
        return Observed(etag or revisit.etag, last_modified or revisit.last_modified,
                        revisit.digest, fresh)
    return Observed(etag, last_modified, "" if result.filtered else digest(result.body), fresh)


def outcome_of(revisit: Revisit | None, result: FetchResult,
               observed: Observed | None) -> Outcome:
    """The outcome code of a response that is read (not ``filtered``); `observed` is
    None only for a first visit with the crawl's revisits off."""
    status = result.status
    outcome = Outcome.OK if status < 400 else Outcome.HTTP_4XX
    if revisit is not None:
        if status == 304:
            outcome = Outcome.NOT_MODIFIED
        elif status in GONE_STATUSES:
            outcome = Outcome.GONE
        elif 200 <= status < 300:
            same = revisit.digest and observed is not None \
                and observed.digest == revisit.digest
            outcome = Outcome.UNCHANGED if same else Outcome.CHANGED
    return outcome


def noted(record: Record, revisit: Revisit | None, observed: Observed | None) -> Record:
    """`record` with its body's digest (when one was taken) and the time of the visit it
    revisits."""
    if observed is not None:
        record.digest = observed.digest
    if revisit is not None:
        record.refers_to_s = revisit.fetched_s
    return record


def max_age_s(raw_headers: Sequence[tuple[bytes, bytes]], date: str | None,
              now: float | None = None) -> int:
    """The freshness lifetime a response declares, in seconds: ``Cache-Control: max-age``,
    else ``Expires`` minus ``Date`` (`now` without one); 0 for ``no-store`` / ``no-cache``
    or an invalid value (RFC 9111: stale); -1 when it declares none.

    ``s-maxage`` is ignored: it is for shared caches (a CDN's lifetime), and a crawler
    asks on its own behalf."""
    cache_control: list[str] = []
    expires: str | None = None
    for name, value in raw_headers:
        lower = name.lower()
        if lower == b"cache-control":
            cache_control += value.decode("latin-1").split(",")
        elif lower == b"expires" and expires is None:
            expires = value.decode("latin-1")
    max_age: str | None = None
    for directive in cache_control:
        key, _, argument = directive.strip().partition("=")
        key = key.strip().lower()
        if key in ("no-store", "no-cache"):
            return 0
        if key == "max-age" and max_age is None:
            max_age = argument.strip().strip('"')
    if max_age is not None:
        if not (max_age.isascii() and max_age.isdigit()):
            return 0
        return _MAX_DELTA_S if len(max_age) > 10 else min(_MAX_DELTA_S, int(max_age))
    if expires is None:
        return -1
    until = http_date(expires)
    if until is None:
        return 0
    start = http_date(date) if date is not None else None
    base = start if start is not None else (time.time() if now is None else now)
    return max(0, min(_MAX_DELTA_S, int(until - base)))


def _kept(value: str | None) -> str:
    """A validator as the history keeps it: "" when none or over MAX_VALIDATOR_BYTES."""
    if not value or len(value.encode("utf-8", "surrogateescape")) > MAX_VALIDATOR_BYTES:
        return ""
    return value
