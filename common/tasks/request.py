"""A request: what to fetch and how, as data (never code), so it travels through Redis.

A :class:`Request` is a URL, a method (`METHODS`), headers, an optional body, a **label**
(the route that parses its response), **data** (a JSON object handed to that route), a
priority, a **unique key**: what the crawl deduplicates it by (:meth:`Request.key`), and
a **session** (the name of a cookie jar kept in Redis; not part of its identity).
Everything in it is JSON, so any consumer of the fleet reads it the same way, in any
language (the producer takes JSON lines of requests: :func:`request_from_dict`).

A request is checked once, where it enters a crawl: a route's ``ctx.follow``
(``common.spider.context``), a spider's start requests (`Spider.start`), the producer's
reader of request lines (``producer.run``). There :func:`checked` raises
:class:`InvalidRequestError` saying which field is wrong (a bad method, data that isn't a
JSON object, a body over `MAX_BODY_BYTES`, a label that isn't a short token, a bad
header) and freezes what it took: its data and headers copied, so what the code that
made it does to its dicts afterwards can neither change nor break it. Past its entry a
request is trusted (``NewTask.from_request``); making one only normalizes its method
(upper case), so a route pays for no check twice. Its URL is judged at enqueue like any
URL (canonicalized, counted invalid with its reason).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

from common import codec
from common.errors import InvalidRequestError
from common.tasks.headers import checked_headers
from common.urls.canonical import Rejection, canonicalize
from common.urls.redact import redact_url

__all__ = ["MAX_BODY_BYTES", "MAX_DATA_BYTES", "METHODS", "Request", "body_digest",
           "check_data", "check_label", "check_method", "check_request", "check_session",
           "checked", "request_from_dict", "request_key", "shown"]

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
#: Methods without a body, deduplicated by their canonical URL alone.
BODYLESS = frozenset(("GET", "HEAD"))
#: A request body is stored in its pending task's entry, in Redis memory, for as long as
#: the task waits (base64 makes a binary one 4/3 larger; an entry holds at most 256 KiB:
#: ``common.tasks.task.MAX_TASK_BYTES``). API queries and forms are a few KB; 64 KiB leaves
#: them room and the entry room for URL, headers and data. Uploads are not crawling.
MAX_BODY_BYTES = 64 * 1024
#: A request's data, as JSON: context for its route (ids, a category), not a payload.
MAX_DATA_BYTES = 64 * 1024
MAX_UNIQUE_KEY_CHARS = 2048
_MAX_DEPTH = 32
_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")
_SESSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,63}")
_DIGEST_HEX = 32


@dataclass(frozen=True, slots=True)
class Request:
    """One request to crawl; checked where it enters a crawl (`checked`), not when made."""

    url: str
    method: str = "GET"
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # credentials
    body: bytes | None = None
    label: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    unique_key: str | None = None
    #: The session it goes with (its cookies, kept in Redis: common.proxies.sessions): the
    #: requests a route follows carry its request's; None: none (cookies off).
    session: str | None = None
    #: Fetched in a browser (a consumer started with --browser): the route gets the DOM
    #: its scripts built, and the JSON it fetched. Not part of the unique key.
    render: bool = False

    def __post_init__(self) -> None:
        # Normalization only: a request is checked where it enters a crawl (`checked`).
        if isinstance(self.method, str) and self.method != self.method.upper():
            object.__setattr__(self, "method", self.method.upper())

    @classmethod
    def json(cls, url: str, payload: Any, *, method: str = "POST", **kw: Any) -> Request:
        """A request whose body is `payload` as JSON (``Content-Type: application/json``
        unless `headers` name one)."""
        problem = _json_problem(payload, "payload", 0)
        if problem:
            raise InvalidRequestError(f"Request.json {url!r}: {problem}")
        body = codec.dumps(payload).encode()
        headers = _with_content_type(kw.pop("headers", None), "application/json")
        return cls(url, method, headers, body, **kw)

    @classmethod
    def form(cls, url: str, fields: Mapping[str, str] | Sequence[tuple[str, str]], *,
             method: str = "POST", **kw: Any) -> Request:
        """A request whose body is `fields` URL-encoded, as an HTML form posts them
        (``Content-Type: application/x-www-form-urlencoded``)."""
        body = urlencode(fields).encode()
        headers = _with_content_type(kw.pop("headers", None),
                                     "application/x-www-form-urlencoded")
        return cls(url, method, headers, body, **kw)

    def key(self) -> str:
        """The unique key the crawl deduplicates by: the user's `unique_key` when set;
        else the canonical URL for GET and HEAD (what every crawl deduplicated by before
        requests had methods), else ``"<METHOD> <canonical url> <body digest>"``.
        InvalidRequestError when the URL can't be canonicalized."""
        if self.unique_key is not None:
            return self.unique_key
        url = canonicalize(self.url)
        if isinstance(url, Rejection):
            raise InvalidRequestError(f"Request url {shown(self.url)!r}: {url.message}")
        return request_key(self.method, url, self.body)


def shown(url: str) -> str:
    """A request's URL as a message shows it: cut to 200 characters, userinfo hidden."""
    return redact_url(url[:200])


def request_key(method: str, canonical_url: str, body: bytes | None,
                unique_key: str | None = None) -> str:
    """The unique key of a request whose URL is already canonical (see `Request.key`)."""
    if unique_key is not None:
        return unique_key
    if method in BODYLESS:
        return canonical_url
    return f"{method} {canonical_url} {body_digest(body)}"


def body_digest(body: bytes | None) -> str:
    """The first 128 bits of a body's SHA-256, in hex (no body: the empty body's)."""
    return hashlib.sha256(body or b"").hexdigest()[:_DIGEST_HEX]


def checked(request: Request) -> Request:
    """`request` checked (InvalidRequestError naming its first bad field) and frozen: a
    copy whose data (a JSON round trip of what was checked) and headers are its own, so
    what its maker does to its dicts later can't make it invalid. What a request's entry
    into a crawl calls, once; past it the request is trusted."""
    data = _checked_data_json(request)
    return replace(request, data=codec.loads(data) if data else {},
                   headers=dict(request.headers))


def check_request(request: Request) -> None:
    """Raise InvalidRequestError naming the first bad field of `request` (`checked`
    without the copy)."""
    _checked_data_json(request)


def _checked_data_json(request: Request) -> str | None:
    """Check every field of `request` (InvalidRequestError naming the first bad one);
    its data as JSON (None: none)."""
    if not isinstance(request.url, str) or not request.url:
        raise InvalidRequestError(f"Request url must be a non-empty string, "
                                  f"got {request.url!r}")
    where = f"Request {shown(request.url)!r}"
    check_method(request.method, where)
    body = request.body
    if body is not None:
        if not isinstance(body, bytes):
            raise InvalidRequestError(f"{where}: body must be bytes (or use Request.json "
                                      f"/ Request.form), got {type(body).__name__}")
        if len(body) > MAX_BODY_BYTES:
            raise InvalidRequestError(f"{where}: body is {len(body)} bytes, over the "
                                      f"{MAX_BODY_BYTES} a request may carry")
        if request.method in BODYLESS:
            raise InvalidRequestError(f"{where}: a {request.method} carries no body; "
                                      "use POST (or PUT, PATCH) to send one")
    check_label(request.label, where)
    check_session(request.session, where)
    data = _data_json(request.data, where)
    if not isinstance(request.render, bool):
        raise InvalidRequestError(f"{where}: render must be true or false, "
                                  f"got {request.render!r}")
    if type(request.priority) is not int or request.priority < 0:
        raise InvalidRequestError(f"{where}: priority must be an integer >= 0, "
                                  f"got {request.priority!r}")
    key = request.unique_key
    if key is not None and (not isinstance(key, str) or not key
                            or len(key) > MAX_UNIQUE_KEY_CHARS):
        raise InvalidRequestError(f"{where}: unique_key must be a non-empty string of at "
                                  f"most {MAX_UNIQUE_KEY_CHARS} characters")
    if not isinstance(request.headers, Mapping):
        raise InvalidRequestError(f"{where}: headers must map names to values")
    if request.headers:
        checked_headers(request.headers.items(), InvalidRequestError, f"{where} headers")
    return data


def check_method(method: object, where: str) -> None:
    """InvalidRequestError unless `method` is one of `METHODS`."""
    if method not in METHODS:
        raise InvalidRequestError(f"{where}: method {str(method)[:20]!r} is not one of "
                                  f"{', '.join(METHODS)}")


def check_label(label: object, where: str) -> None:
    """InvalidRequestError unless `label` is None or a short token (letters, digits,
    ``_.:-``, at most 64): it names a route, and is shown in logs and counts."""
    if label is not None and (not isinstance(label, str) or not _LABEL.fullmatch(label)):
        raise InvalidRequestError(f"{where}: label {str(label)[:70]!r} is not a route name "
                                  "(1-64 letters, digits, '_', '.', ':', '-')")


def check_session(name: object, where: str) -> None:
    """InvalidRequestError unless `name` is None or a session name (1-64 letters,
    digits, ``_.:@-``)."""
    if name is not None and (not isinstance(name, str) or not _SESSION.fullmatch(name)):
        raise InvalidRequestError(f"{where}: session {str(name)[:70]!r} is not a session "
                                  "name (1-64 letters, digits, '_', '.', ':', '@', '-')")


def check_data(data: object, where: str) -> None:
    """InvalidRequestError unless `data` is a JSON object (str keys; str, int, finite
    float, bool, None, list and object values) of at most `MAX_DATA_BYTES` as JSON."""
    _data_json(data, where)


def _data_json(data: object, where: str) -> str | None:
    """`check_data`; `data` as JSON (None: empty)."""
    if not isinstance(data, Mapping):
        raise InvalidRequestError(f"{where}: data must be a JSON object (a dict), "
                                  f"got {type(data).__name__}")
    if not data:
        return None
    problem = _json_problem(data, "data", 0)
    if problem:
        raise InvalidRequestError(f"{where}: {problem}")
    encoded = codec.dumps(data)
    size = len(encoded.encode())
    if size > MAX_DATA_BYTES:
        raise InvalidRequestError(f"{where}: data is {size} bytes as JSON, over the "
                                  f"{MAX_DATA_BYTES} a request may carry")
    return encoded


def _json_problem(value: Any, path: str, depth: int) -> str | None:
    """What keeps `value` from surviving a JSON round trip unchanged, or None."""
    if depth > _MAX_DEPTH:
        return f"{path} is nested deeper than {_MAX_DEPTH} levels"
    kind = type(value)
    if value is None or kind in (str, int, bool):
        return None
    if kind is float:
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON can't hold"
    if isinstance(value, Mapping):
        for k, v in value.items():
            if type(k) is not str:
                return f"{path} has the key {k!r}: JSON object keys are strings"
            problem = _json_problem(v, f"{path}[{k!r}]", depth + 1)
            if problem:
                return problem
        return None
    if kind is list:
        for i, v in enumerate(value):
            problem = _json_problem(v, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    return (f"{path} is a {kind.__name__}, not JSON (use str, int, float, bool, None, "
            "list or dict)")


def _with_content_type(headers: Mapping[str, str] | None, ctype: str) -> dict[str, str]:
    out = dict(headers or {})
    if not any(name.lower() == "content-type" for name in out):
        out["Content-Type"] = ctype
    return out


_FIELDS = frozenset(("url", "method", "headers", "body", "json", "form", "label", "data",
                     "priority", "unique_key", "session", "render"))


def request_from_dict(obj: Any) -> Request:
    """A Request from its JSON form: the Request fields, with the body given as one of
    ``body`` (a string, sent as UTF-8), ``body_base64``, ``json`` (any JSON value, sent
    as JSON) or ``form`` (an object of strings, URL-encoded). InvalidRequestError
    saying what is wrong with its form otherwise; its fields are checked where it enters
    a crawl (`checked`: the producer's reader)."""
    if not isinstance(obj, dict):
        raise InvalidRequestError(f"a request must be a JSON object, got "
                                  f"{type(obj).__name__}")
    unknown = set(obj) - _FIELDS - {"body_base64"}
    if unknown:
        raise InvalidRequestError(f"a request has unknown fields {', '.join(sorted(unknown))} "
                                  f"(known: {', '.join(sorted(_FIELDS | {'body_base64'}))})")
    bodies = [name for name in ("body", "body_base64", "json", "form") if name in obj]
    if len(bodies) > 1:
        raise InvalidRequestError(f"a request gives its body twice: {', '.join(bodies)}; "
                                  "give one")
    url = obj.get("url")
    if not isinstance(url, str):
        raise InvalidRequestError("a request needs a \"url\" string")
    kw = {name: obj[name] for name in ("label", "priority", "unique_key", "session",
                                       "render")
          if name in obj}
    kw["data"] = obj.get("data") if obj.get("data") is not None else {}
    kw["headers"] = obj.get("headers") or {}
    method = obj.get("method")
    if method is not None and not isinstance(method, str):
        raise InvalidRequestError(f"Request {shown(url)!r}: method must be a string")
    if "json" in obj:
        return Request.json(url, obj["json"], method=method or "POST", **kw)
    if "form" in obj:
        form = obj["form"]
        if not isinstance(form, dict) or not all(isinstance(v, str) for v in form.values()):
            raise InvalidRequestError(f"Request {shown(url)!r}: form must be an object of "
                                      "strings")
        return Request.form(url, form, method=method or "POST", **kw)
    body: bytes | None = None
    if "body" in obj:
        if not isinstance(obj["body"], str):
            raise InvalidRequestError(f"Request {shown(url)!r}: body must be a string "
                                      "(or use body_base64, json or form)")
        body = obj["body"].encode()
    elif "body_base64" in obj:
        try:
            body = base64.b64decode(obj["body_base64"], validate=True)
        except (ValueError, TypeError):
            raise InvalidRequestError(f"Request {shown(url)!r}: body_base64 is not "
                                      "base64") from None
    return Request(url, method or ("POST" if body is not None else "GET"), body=body, **kw)
