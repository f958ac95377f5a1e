"""JSON encoding for everything crawlq stores or prints: the one place ujson is called."""

from __future__ import annotations

from typing import Any

import ujson


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept; raises TypeError/OverflowError on what JSON can't hold."""
    return ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False)


def loads(data: str | bytes) -> Any:
    """Parse JSON; raises ValueError on invalid input."""
    return ujson.loads(data)
