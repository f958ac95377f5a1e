"""Keyed items: what a spider extracts, delivered to a sink as records of their own.

An item's key names the row it becomes, so a task fetched twice (at-least-once) writes the
same rows again instead of new ones. The key is the item's declared key fields joined,
or, when the spider declares none, the request's unique key and the item's index on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import codec
from common.errors import MalformedTaskError
from common.task import Task

#: Separates the parts of a composite key (a unit separator: never in a URL or a number).
KEY_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class Item:
    """One extracted record: ``key`` identifies its row, ``data`` is a JSON object."""

    key: str
    data: Mapping[str, Any]


def unique_key_of(task: Task) -> str:
    """The unique key of the request `task` is (``Task.key``): what the crawl deduplicated
    it by, so an item keyed by it names one row per request."""
    return task.key()


def item_key(data: Mapping[str, Any], *, unique_key: str, index: int,
             key_fields: Sequence[str] = ()) -> str:
    """The key of ``data``: its ``key_fields`` joined, or ``<unique_key>#<index>``.

    Raises MalformedTaskError naming the field when a declared key field is missing.
    """
    if not key_fields:
        return f"{unique_key}#{index}"
    parts = []
    for name in key_fields:
        if name not in data or data[name] is None:
            raise MalformedTaskError(f"item has no key field {name!r} (its key fields: "
                                     f"{', '.join(key_fields)}); set it or change the key")
        value = data[name]
        parts.append(value if isinstance(value, str) else codec.dumps(value))
    return KEY_SEP.join(parts)
