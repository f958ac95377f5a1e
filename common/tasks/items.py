"""Keyed items: what a spider extracts, delivered to a sink as records of their own.

An item's key names the row it becomes, so a task fetched twice (at-least-once) writes the
same rows again instead of new ones. The key is the item's declared key fields joined,
or, when the spider declares none, the request's unique key and the item's index on it.
An item's type (its route's ``item_type``) names the table, or the file, its rows go to:
each type keeps its own rows and keys, as a data team keeps one table per kind of record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import codec
from common.errors import MalformedTaskError
from common.tasks.task import Task

#: Separates the parts of a composite key (a unit separator: never in a URL or a number).
KEY_SEP = "\x1f"


#: What an item type may be: a table's name and a file's part alike (lower case).
ITEM_TYPE_RULE = "1-63 of a-z, 0-9 and _, starting with a letter"
_ITEM_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def check_item_type(value: str | None) -> str | None:
    """`value` if it is an item type (or None); ValueError saying the rule otherwise."""
    if value is not None and not (isinstance(value, str) and _ITEM_TYPE.match(value)):
        raise ValueError(f"item_type {value!r} must be {ITEM_TYPE_RULE} (it names a table "
                         "and a file)")
    return value


@dataclass(frozen=True, slots=True)
class Item:
    """One extracted record: ``key`` identifies its row ("": the sink keys it by its
    request's unique key and its index), ``data`` is a JSON object, ``type`` names the
    table (or file) it goes to ("": the sink's own)."""

    key: str
    data: Mapping[str, Any]
    type: str = ""

    def __post_init__(self) -> None:
        if self.type:  # it names a table and a file: never a path
            check_item_type(self.type)


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
