"""Every code a task can end an attempt with, and what it means: the one list.

A code is the ``outcome`` of a done task (its result line, ``crawlq_tasks_total``) or the
``reason`` of a failed attempt (``FetchError.reason``, ``Failure.reason``, the dead
letter's reason, ``crawlq_errors_total``). docs/consumer.md's "What happens to a fetch" table
lists exactly these codes; tests/test_reasons.py checks the table and the sources against
`REASONS`. Each code is a ``str`` constant, so using one costs nothing on the hot path; the
codes a done task ends with are also `Outcome`, a ``StrEnum``: mypy holds the consumer's
outcomes to it, and each prints, serialises and counts (``outcome:<code>``) as its string.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, TypeVar

__all__ = ["METRIC_OUTCOMES", "REASONS", "REVISIT_OUTCOMES", "Outcome", "Reason"]

Fate = Literal["done", "retry", "dead"]
_Code = TypeVar("_Code", bound=str)


class Outcome(StrEnum):
    """What a done task's attempt came to (the codes of fate "done" below): its result's
    ``outcome``, its ``outcome:<code>`` counter in Redis, its crawlq_tasks_total label.
    The strings are stored and on dashboards: never change one."""

    OK = "ok"
    HTTP_4XX = "http_4xx"
    ROBOTS_DISALLOWED = "robots_disallowed"
    FILTERED = "filtered"
    NOT_MODIFIED = "not_modified"
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    NEAR_DUPLICATE = "near_duplicate"
    SOFT_404 = "soft_404"
    PROBE = "probe"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Reason:
    """One code: what becomes of the task (`fate`) and a one-line meaning."""

    code: str
    fate: Fate  # done; retried with backoff (dead once out of attempts); dead at once
    meaning: str


REASONS: dict[str, Reason] = {}


def _reason(code: _Code, fate: Fate, meaning: str) -> _Code:
    REASONS[str(code)] = Reason(str(code), fate, meaning)
    return code


OK: Final = _reason(Outcome.OK, "done", "a 2xx, or a final 3xx (a 304 not to a revisit); result "
                   "written")
HTTP_4XX: Final = _reason(Outcome.HTTP_4XX, "done", "a 4xx other than 408/429; result written")
ROBOTS_DISALLOWED: Final = _reason(
    Outcome.ROBOTS_DISALLOWED, "done", "robots.txt disallows the URL for our user agent")
FILTERED: Final = _reason(
    Outcome.FILTERED, "done", "a 2xx whose Content-Type the crawl's accept_content_type does not "
    "accept: closed unread, result written without a body")
NOT_MODIFIED: Final = _reason(
    Outcome.NOT_MODIFIED, "done", "a revisit answered 304 to its validators: no body read, no "
    "handler; result written (a WARC revisit record)")
UNCHANGED: Final = _reason(
    Outcome.UNCHANGED, "done", "a revisit's 2xx whose body digest is the previous visit's: no "
    "handler, its links are known; result written (a WARC revisit record)")
CHANGED: Final = _reason(
    Outcome.CHANGED, "done", "a revisit's 2xx whose body differs from the previous visit's: "
    "handled as a new page, its links followed")
NEAR_DUPLICATE: Final = _reason(
    Outcome.NEAR_DUPLICATE, "done", "a 2xx HTML page whose text and links' fingerprint is within "
    "the crawl's near_duplicate_distance of another page of its URL's shape (a variant: "
    "another query, date, counter or token): its links to pages of its shape not followed; "
    "result written, its items unless drop_judged_items")
SOFT_404: Final = _reason(
    Outcome.SOFT_404, "done", "a 2xx page that matches what its host answered a probe for a "
    "missing path (its soft-404 signature): its links not followed; result written, its "
    "items unless drop_judged_items")
PROBE: Final = _reason(
    Outcome.PROBE, "done", "the crawl's own request for a path that cannot exist, which gives a "
    "host's soft-404 signature: no handler, no result written")
GONE: Final = _reason(
    Outcome.GONE, "done", "a recrawl (a URL with a history record) answered 404 or 410: under a "
    "recrawl window its record is deleted, so the producer brings it back no more (a seed "
    "or a link past the window still does); a revisit schedule keeps it; result written")
#: The outcomes of a revisit's response (a record's ``revisit`` field).
REVISIT_OUTCOMES: Final = frozenset({NOT_MODIFIED, UNCHANGED, CHANGED})

CONNECT_ERROR: Final = _reason(
    "connect_error", "retry", "DNS failure, connection refused or reset, proxy refused")
TIMEOUT: Final = _reason("timeout", "retry", "connect, read or total deadline passed")
HTTP_5XX: Final = _reason("http_5xx", "retry", "a 500-599 status")
HTTP_408: Final = _reason("http_408", "retry", "408 Request Timeout")
HTTP_429: Final = _reason("http_429", "retry", "429 Too Many Requests")
HTTP_ERROR: Final = _reason(
    "http_error", "retry", "a malformed response or another unexpected HTTP client error")
BLOCKED: Final = _reason(
    "blocked", "retry", "the answer is a block, not the page (the crawl's ban_status "
    "through a proxy or a session, its ban_selector or ban_text, its route's Blocked "
    "rules): never taken as data; its proxy is banned for the host and the request "
    "retried on another")
ROBOTS_UNAVAILABLE: Final = _reason(
    "robots_unavailable", "retry", "robots.txt answered 5xx/408/429, timed out or failed")
HANDLER_ERROR: Final = _reason("handler_error", "retry", "the --handler raised")
BROWSER_CRASHED: Final = _reason(
    "browser_crashed", "retry", "the browser rendering the page died (or was closed) "
    "mid-page; a fresh one renders the retry")
RENDER_ERROR: Final = _reason(
    "render_error", "retry", "the browser could not render the page or run the route's "
    "actions (a navigation it refused, an element it could not click)")
INTERNAL_ERROR: Final = _reason(
    "internal_error", "retry", "the consumer itself failed on this task (a bug: see its log)")

BAD_URL: Final = _reason(
    "bad_url", "dead",
    "the task URL can't be fetched: malformed, not http(s), no host, or a host the HTTP "
    "client refuses (a non-canonical IPv4 form such as 127.1 or 2130706433)")
BAD_REDIRECT: Final = _reason(
    "bad_redirect", "dead",
    "a Location that is empty, malformed, not http(s), has no host (http://) or a host "
    "the HTTP client refuses (127.1)")
REDIRECT_LOOP: Final = _reason(
    "redirect_loop", "dead", "a redirect to a URL already seen in the chain")
TOO_MANY_REDIRECTS: Final = _reason(
    "too_many_redirects", "dead", "more redirects than --max-redirects (5)")
BAD_STATUS: Final = _reason(
    "bad_status", "dead", "a status outside 100-599, which HTTP does not define")
BODY_TOO_LARGE: Final = _reason(
    "body_too_large", "dead",
    "body over --max-body-bytes (decompressed), or an honest Content-Length over it")
SSRF_BLOCKED: Final = _reason(
    "ssrf_blocked", "dead", "the SSRF guard refused the address, on any hop")
MALFORMED: Final = _reason(
    "malformed", "dead", "a task body that can't be decoded or fails the schema")
UNKNOWN_LABEL: Final = _reason(
    "unknown_label", "dead", "a task whose label has no route in the consumer's --spider: "
    "never fetched, never done unparsed")
NO_BROWSER: Final = _reason(
    "no_browser", "dead", "a render request leased by a consumer without --browser (the "
    "frontier leases render requests only to consumers with one: never expected)")
STALLED: Final = _reason(
    "stalled", "dead", "its lease expired more than --max-stalls times (consumer died or hung)")

# Labels of crawlq_tasks_total{outcome} that are not a code above: what the queue made of
# a completion (retried, dead, the lease lost before it landed) or a task handed back
# unfetched at shutdown (released).
METRIC_OUTCOMES: Final = frozenset({"retried", "dead", "stale", "released"})
