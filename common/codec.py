"""Encoding of what crawlq stores or prints: JSON (the one place ujson is called), and a
Redis reply's bytes as text."""

from __future__ import annotations

from typing import Any

import ujson


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept; raises TypeError/OverflowError on what JSON can't hold."""
    return ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False)


def loads(data: str | bytes) -> Any:
    """Parse JSON; raises ValueError on invalid input."""
    return ujson.loads(data)


def text(value: bytes | str) -> str:
    """A Redis reply's bytes as text (a decoding client's str as it is)."""
    return value.decode() if isinstance(value, bytes) else value
