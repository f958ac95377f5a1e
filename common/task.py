"""The task model and its wire format.

A pending task is one entry in its host's queue: ``<id><url>`` (the 32 hex digits of its
fingerprint, then the canonical URL), followed by a space and a JSON object of only the
fields that differ from their defaults (``a`` max_attempts, ``p`` priority, ``m`` meta,
``d`` depth, ``h`` request headers: name -> value, checked by ``common/headers.py``,
``v`` the previous visit of a URL its revisit schedule brought back: ``common/revisit.py``).
Canonical URLs hold no space, so the first space ends the URL. Most entries are just id
and URL: a frontier's size is mostly its URLs. Headers are not part of a task's identity:
dedup is per URL, so the same URL enqueued again with other headers is a duplicate.

The fields that change while a task lives (attempt, last_error, checkpoint) are kept in
their own hashes and laid over the entry when the task is leased.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common import codec
from common.errors import MalformedTaskError
from common.headers import checked_headers
from common.revisit import Revisit

MAX_TASK_BYTES = 256 * 1024
ID_LEN = 32
DEFAULT_MAX_ATTEMPTS = 3
_HEX = frozenset("0123456789abcdef")


@dataclass(slots=True)
class Task:
    """One URL to fetch. ``id`` is the hex fingerprint of the canonical ``url``."""

    id: str
    url: str
    attempt: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    priority: int = 0
    last_error: str | None = None
    checkpoint: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    # Sent with this task's request over the crawl's own; never in a repr (credentials).
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    #: The previous visit, when the revisit schedule brought this URL back; else None.
    revisit: Revisit | None = None


def encode_entry(tid: str, url: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 priority: int = 0, meta: dict[str, Any] | None = None,
                 depth: int = 0, headers: dict[str, str] | None = None,
                 revisit: Revisit | None = None) -> str:
    """The stored entry of a pending task (the enqueue hot path: no Task built)."""
    extra: dict[str, Any] = {}
    if max_attempts != DEFAULT_MAX_ATTEMPTS:
        extra["a"] = max_attempts
    if priority:
        extra["p"] = priority
    if meta:
        extra["m"] = meta
    if depth:
        extra["d"] = depth
    if headers:
        extra["h"] = headers
    if revisit is not None:
        extra["v"] = revisit.to_field()
    if not extra:
        return tid + url
    return f"{tid}{url} {codec.dumps(extra)}"


def _int_field(extra: dict[str, Any], name: str, what: str, default: int, least: int) -> int:
    value = extra.get(name, default)
    if type(value) is not int or value < least:
        raise MalformedTaskError(f"task {what} must be an integer >= {least}, got {value!r}")
    return value


def decode_entry(
    raw: bytes | str,
    *,
    attempt: int = 0,
    last_error: str | None = None,
    checkpoint: Any = None,
) -> Task:
    """Parse and validate a stored entry; raises MalformedTaskError saying what is wrong."""
    if len(raw) > MAX_TASK_BYTES:
        raise MalformedTaskError(f"task entry is {len(raw)} bytes, over {MAX_TASK_BYTES}")
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise MalformedTaskError(f"task entry is not UTF-8: {exc}") from None
    tid, rest = text[:ID_LEN], text[ID_LEN:]
    if len(tid) != ID_LEN or not _HEX.issuperset(tid):
        raise MalformedTaskError("task entry must start with its 32-hex-digit id")
    url, _, extra_text = rest.partition(" ")
    if not url.startswith(("http://", "https://")):
        raise MalformedTaskError("task url must be an absolute http(s) URL")
    if not extra_text:
        return Task(tid, url, attempt, last_error=last_error, checkpoint=checkpoint)
    try:
        extra = codec.loads(extra_text)
    except ValueError as exc:
        raise MalformedTaskError(f"task fields are not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise MalformedTaskError(f"task fields must be a JSON object, got {extra_text[:50]!r}")
    meta = extra.get("m", {})
    if not isinstance(meta, dict):
        raise MalformedTaskError(f"task meta must be a JSON object, got {type(meta).__name__}")
    return Task(tid, url, attempt,
                max_attempts=_int_field(extra, "a", "max_attempts", DEFAULT_MAX_ATTEMPTS, 1),
                priority=_int_field(extra, "p", "priority", 0, 0),
                last_error=last_error, checkpoint=checkpoint, meta=meta,
                depth=_int_field(extra, "d", "depth", 0, 0),
                headers=_headers_field(extra),
                revisit=Revisit.from_field(extra["v"]) if "v" in extra else None)


def _headers_field(extra: dict[str, Any]) -> dict[str, str]:
    headers = extra.get("h")
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise MalformedTaskError(f"task headers must be a JSON object, "
                                 f"got {type(headers).__name__}")
    return checked_headers(headers.items(), MalformedTaskError, "task headers")


def stored_entry(value: bytes) -> bytes:
    """The entry inside a leased, waiting or dead task's stored value
    ``<host> <priority> <entry>`` (``common/keys.py``: ``tasks``)."""
    parts = value.split(b" ", 2)
    return parts[2] if len(parts) == 3 else value


def entry_url(entry: bytes | None) -> str | None:
    """The URL a stored entry holds (what follows its id, up to a space), even when the
    entry is malformed, so an operator sees what it was; None if there is none."""
    if not entry or len(entry) <= ID_LEN:
        return None
    return entry[ID_LEN:].split(b" ", 1)[0].decode(errors="replace")
