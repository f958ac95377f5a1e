"""The task model and its wire format.

A task body is a JSON object stored in the partition's ``tasks`` hash. The fields that
change while a task lives (attempt, last_error, checkpoint) are kept in their own
hashes and laid over the body when the task is leased.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common import codec
from common.errors import MalformedTaskError

MAX_TASK_BYTES = 256 * 1024


@dataclass(slots=True)
class Task:
    """One URL to fetch. ``id`` is the hex fingerprint of the canonical ``url``."""

    id: str
    url: str
    attempt: int = 0
    max_attempts: int = 3
    priority: int = 0
    enqueued_at: float = 0.0
    last_error: str | None = None
    checkpoint: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0


def encode_task(task: Task) -> str:
    """The stored body: every field but the ones kept in their own hashes."""
    return encode_fields(task.id, task.url, max_attempts=task.max_attempts,
                         priority=task.priority, enqueued_at=task.enqueued_at,
                         meta=task.meta, depth=task.depth)


def encode_fields(tid: str, url: str, *, max_attempts: int, priority: int,
                  enqueued_at: float, meta: dict[str, Any], depth: int) -> str:
    """The stored body from its fields (the enqueue hot path: no Task built)."""
    return codec.dumps({"id": tid, "url": url, "max_attempts": max_attempts,
                        "priority": priority, "enqueued_at": enqueued_at, "meta": meta,
                        "depth": depth})


def _field(obj: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = obj.get(name, default)
    if kind is int and isinstance(value, bool):
        raise MalformedTaskError(f"task field {name!r} must be an integer, got a boolean")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise MalformedTaskError(
            f"task field {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def decode_task(
    raw: bytes | str,
    *,
    attempt: int = 0,
    last_error: str | None = None,
    checkpoint: Any = None,
) -> Task:
    """Parse and validate a stored body; raises MalformedTaskError saying what is wrong."""
    if len(raw) > MAX_TASK_BYTES:
        raise MalformedTaskError(f"task body is {len(raw)} bytes, over {MAX_TASK_BYTES}")
    try:
        obj = codec.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedTaskError(f"task body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedTaskError(f"task body must be a JSON object, got {type(obj).__name__}")
    # Fast path (every lease decodes its tasks): a body as encode_fields writes it, every
    # field present with its exact type (`type(x) is int` also rules out booleans).
    tid, url, max_attempts = obj.get("id"), obj.get("url"), obj.get("max_attempts")
    priority, enqueued_at = obj.get("priority"), obj.get("enqueued_at")
    meta, depth = obj.get("meta"), obj.get("depth")
    if (type(tid) is str and type(url) is str and type(max_attempts) is int
            and type(priority) is int and type(enqueued_at) is float and type(meta) is dict
            and type(depth) is int):
        task = Task(tid, url, attempt, max_attempts, priority, enqueued_at, last_error,
                    checkpoint, meta, depth)
    else:
        task = _decode_slow(obj, attempt, last_error, checkpoint)
    if task.max_attempts < 1 or task.priority < 0 or task.depth < 0:
        raise MalformedTaskError("task max_attempts must be >= 1, priority and depth >= 0")
    if not task.url.startswith(("http://", "https://")):
        raise MalformedTaskError("task url must be an absolute http(s) URL")
    return task


def _decode_slow(obj: dict[str, Any], attempt: int, last_error: str | None,
                 checkpoint: Any) -> Task:
    """Any other valid body: defaults for missing fields, ints accepted as floats."""
    return Task(
        id=_field(obj, "id", str),
        url=_field(obj, "url", str),
        attempt=attempt,
        max_attempts=_field(obj, "max_attempts", int, 3),
        priority=_field(obj, "priority", int, 0),
        enqueued_at=_field(obj, "enqueued_at", float, 0.0),
        last_error=last_error,
        checkpoint=checkpoint,
        meta=_field(obj, "meta", dict, {}),
        depth=_field(obj, "depth", int, 0),
    )
