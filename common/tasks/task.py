"""The task model and its wire format.

A pending task is one entry in its host's queue: ``<id><url>`` (the 32 hex digits of its
fingerprint, then the canonical URL), followed by a space and a JSON object of only the
fields that differ from their defaults (``a`` max_attempts, ``p`` priority, ``m`` meta,
``d`` depth, ``h`` request headers: name -> value, checked by
``common/tasks/headers.py``, ``v`` the previous visit of a URL its revisit schedule brought
back: ``common/revisits/previous.py``;
``r`` 1 when it is rendered in a browser, always the object's first field, so the frontier
tells a render entry by its bytes (``lib/render.lua``);
and a request's (``common/tasks/request.py``): ``M`` its method when not GET, ``b`` its body
when it is UTF-8 text, else ``B`` its body in base64, ``l`` its label, ``u`` its data,
``k`` its unique key when the user set one, ``s`` its session and ``S`` the least
version of the session it needs).
Canonical URLs hold no space, so the first space ends the URL. Most entries are just id
and URL: a frontier's size is mostly its URLs, and a GET with no label and no data is
stored as it always was. The id is the fingerprint of the request's unique key
(`common.tasks.request.request_key`): for a GET or HEAD the canonical URL, so dedup is per URL
and headers are not part of a task's identity; for other methods the method and a digest
of the body join it (two bodies POSTed to one URL are two tasks).

In its host's queue (``hq``/``hp``, layout 4) an entry is kept compact (`compact_entry`):
the id's 16 bytes, then ``/<path>`` for ``https://<host>/<path>``, ``:/<path>`` for
``http://<host>/<path>``, or the whole URL when its authority is not the host's key, then
the JSON as above. Its 17th byte is never a hex digit, so a full entry is told apart;
leasing expands it (``lib/queues.lua`` ``entry_expand``, `expand_entry` here): the lease
record, ``tasks`` and a lease's reply hold full entries.

The fields that change while a task lives (attempt, last_error, checkpoint) are kept in
their own hashes and laid over the entry when the task is leased.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from common import codec
from common.errors import InvalidRequestError, MalformedTaskError
from common.revisits.previous import Revisit
from common.tasks.headers import checked_headers
from common.tasks.request import Request, check_label, check_method, check_session, request_key

MAX_TASK_BYTES = 256 * 1024
ID_LEN = 32
#: A compact entry's id: the fingerprint's 16 bytes.
BIN_ID_LEN = 16
DEFAULT_MAX_ATTEMPTS = 3
_HEX = frozenset("0123456789abcdef")
_HEX_BYTES = frozenset(b"0123456789abcdef")


def is_task_id(tid: str) -> bool:
    """Whether `tid` is a task id: 32 lowercase hex digits."""
    return len(tid) == ID_LEN and _HEX.issuperset(tid)


@dataclass(slots=True)
class Task:
    """One request to fetch. ``id`` is the hex fingerprint of its unique key (`key`)."""

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
    method: str = "GET"
    body: bytes | None = field(default=None, repr=False)
    #: The route that parses its response (None: the default route).
    label: str | None = None
    #: The user's data for its route (a JSON object), apart from the crawl's ``meta``.
    data: dict[str, Any] = field(default_factory=dict)
    #: The unique key its enqueuer set (None: derived, see `key`).
    unique_key: str | None = None
    #: Its session (common.proxies.sessions), and the least version of it its request needs:
    #: the one its parent's flush wrote (a consumer holding an older one reads it again).
    session: str | None = None
    session_version: int = 0
    #: Fetched in a browser (docs/rendering.md).
    render: bool = False

    def key(self) -> str:
        """Its unique key: what the crawl deduplicated it by (``id`` is its fingerprint)."""
        return request_key(self.method, self.url, self.body, self.unique_key)

    def as_request(self) -> Request:
        """The request this task fetches (its URL canonical, its headers the ones stored
        with it): what a route is handed as ``ctx.request``."""
        return Request(self.url, self.method, self.headers, self.body, self.label, self.data,
                       self.priority, self.unique_key, self.session, self.render)


def encode_entry(tid: str, url: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 priority: int = 0, meta: dict[str, Any] | None = None,
                 depth: int = 0, headers: dict[str, str] | None = None,
                 revisit: Revisit | None = None, method: str = "GET",
                 body: bytes | None = None, label: str | None = None,
                 data: dict[str, Any] | None = None, unique_key: str | None = None,
                 session: str | None = None, session_version: int = 0,
                 render: bool = False) -> str:
    """The stored entry of a pending task (the enqueue hot path: no Task built)."""
    extra: dict[str, Any] = {}
    if render:  # first: lib/render.lua tells a render entry by ` {"r":1`
        extra["r"] = 1
    if method != "GET":
        extra["M"] = method
    if body is not None:
        try:  # a JSON or form body is text: stored as it reads, not 4/3 larger
            extra["b"] = body.decode()
        except UnicodeDecodeError:
            extra["B"] = base64.b64encode(body).decode()
    if label is not None:
        extra["l"] = label
    if data:
        extra["u"] = data
    if unique_key is not None:
        extra["k"] = unique_key
    if session is not None:
        extra["s"] = session
        if session_version:
            extra["S"] = session_version
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
    if not is_task_id(tid):
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
    meta = _object_field(extra, "m", "meta")
    return Task(tid, url, attempt,
                max_attempts=_int_field(extra, "a", "max_attempts", DEFAULT_MAX_ATTEMPTS, 1),
                priority=_int_field(extra, "p", "priority", 0, 0),
                last_error=last_error, checkpoint=checkpoint, meta=meta,
                depth=_int_field(extra, "d", "depth", 0, 0),
                headers=_headers_field(extra),
                revisit=Revisit.from_field(extra["v"]) if "v" in extra else None,
                method=_method_field(extra), body=_body_field(extra),
                label=_label_field(extra), data=_object_field(extra, "u", "data"),
                unique_key=_unique_key_field(extra), session=_session_field(extra),
                session_version=_int_field(extra, "S", "session version", 0, 0),
                render=extra.get("r") == 1)


def _method_field(extra: dict[str, Any]) -> str:
    method = extra.get("M", "GET")
    try:
        check_method(method, "task")
    except InvalidRequestError as exc:
        raise MalformedTaskError(str(exc)) from None
    return method  # type: ignore[no-any-return]


def _body_field(extra: dict[str, Any]) -> bytes | None:
    if "b" in extra:
        text = extra["b"]
        if not isinstance(text, str):
            raise MalformedTaskError(f"task body must be a string, got {type(text).__name__}")
        return text.encode()
    if "B" in extra:
        try:
            return base64.b64decode(extra["B"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise MalformedTaskError("task body (B) is not base64") from None
    return None


def _label_field(extra: dict[str, Any]) -> str | None:
    label = extra.get("l")
    try:
        check_label(label, "task")
    except InvalidRequestError as exc:
        raise MalformedTaskError(str(exc)) from None
    return label


def _session_field(extra: dict[str, Any]) -> str | None:
    name = extra.get("s")
    try:
        check_session(name, "task")
    except InvalidRequestError as exc:
        raise MalformedTaskError(str(exc)) from None
    return name


def _object_field(extra: dict[str, Any], name: str, what: str) -> dict[str, Any]:
    value = extra.get(name, {})
    if not isinstance(value, dict):
        raise MalformedTaskError(f"task {what} must be a JSON object, "
                                 f"got {type(value).__name__}")
    return value


def _unique_key_field(extra: dict[str, Any]) -> str | None:
    key = extra.get("k")
    if key is not None and (not isinstance(key, str) or not key):
        raise MalformedTaskError("task unique key must be a non-empty string")
    return key


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


def _hex_at(raw: bytes, at: int) -> bool:
    return len(raw) > at and raw[at] in _HEX_BYTES



def compact_entry(entry: str, host: str) -> bytes:
    """The compact form of full entry `entry` in the queue of `host` (its host key): what
    enqueue sends and the queues hold. One without a hex id and then ``http`` stays as
    it is (the lease dead-letters it as malformed)."""
    tid, rest = entry[:ID_LEN], entry[ID_LEN:]
    if not rest.startswith("http") or not is_task_id(tid):
        return entry.encode()
    return bytes.fromhex(tid) + compact_tail(rest, host).encode()


def compact_tail(rest: str, host: str) -> str:
    """What follows the id in a compact entry of `host`'s queue, from what follows it in
    a full one (its URL, then its JSON: ``encode_entry("", ...)``). Enqueue's hot path:
    the id's bytes are the fingerprint it has."""
    n = len(host)
    if rest[8 + n:9 + n] == "/" and rest.startswith("https://") and rest.startswith(host, 8):
        return rest[8 + n:]
    if rest[7 + n:8 + n] == "/" and rest.startswith("http://") and rest.startswith(host, 7):
        return ":" + rest[7 + n:]
    return rest


def expand_entry(raw: bytes, host: str) -> bytes:
    """The full entry of queued entry `raw` of `host`'s queue (a full one as it is);
    MalformedTaskError for one that is neither form."""
    if _hex_at(raw, BIN_ID_LEN):
        return raw
    head, tail = raw[:BIN_ID_LEN].hex().encode(), raw[BIN_ID_LEN:]
    if tail.startswith(b"/"):
        return head + b"https://" + host.encode() + tail
    if tail.startswith(b":/"):
        return head + b"http://" + host.encode() + tail[1:]
    if tail.startswith(b"http"):
        return head + tail
    raise MalformedTaskError("task entry must start with its id, then its URL")


def queued_id(raw: bytes) -> str:
    """The hex id of a queued entry, compact or full (of a malformed one, its head)."""
    if _hex_at(raw, BIN_ID_LEN):
        return raw[:ID_LEN].decode(errors="replace")
    return raw[:BIN_ID_LEN].hex()
