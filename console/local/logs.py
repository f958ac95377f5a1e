"""The consumers' logs as ``crawlq run`` (and ``crawlq demo``) show them: each WARNING or
ERROR once, as it comes, and a consumer that failed by its last error's advice.

The children log one event a line (``common.observability.logs``: text
``<ts> <LEVEL> <logger>  <event> k=v ...``, a value with spaces JSON-quoted, or one JSON
object a line): `parse` reads either. The same warning from two consumers, or again for
another page (``url=``), is one note; a route error is one note per place in the spider
(``where=``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["QUIET", "Event", "LogNotes", "failure_line", "last_error", "parse"]

_TEXT = re.compile(r"^\S+ (?P<level>[A-Z]+) +\S+  (?P<event>\S+)(?P<rest>.*)$")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
#: Fields that tell one occurrence of an event from another (a page, a worker, a time):
#: not part of what makes a note new.
_OCCURRENCE = frozenset({"url", "worker", "id", "error", "waited_s", "rows", "records",
                         "took", "in_flight", "held", "releasing"})
#: Notes shown at most; the rest are in the logs.
MAX_NOTES = 20
#: The consumers' warnings not shown as they come (the logs have them): a slow disk
#: write is the machine's, not the crawl's.
QUIET = frozenset({"sink_slow_write"})


@dataclass(frozen=True, slots=True)
class Event:
    """One log line: its level, event name and fields."""

    level: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """``event at where: error on url k=v ... (advice)``: what a reader needs first."""
        f = self.fields
        at = f.get("where") or f.get("host") or f.get("origin") or f.get("node")
        text = self.event + (f" at {at}" if at else "")
        text += f": {f['error']}" if "error" in f else ""
        text += f" on {f['url']}" if "url" in f else ""
        rest = [f"{k}={v}" for k, v in f.items()
                if k not in ("where", "host", "origin", "node", "error", "url", "advice",
                             "exit_code") and not (k == "label" and not v)]
        return " ".join([text, *rest]) + (f" ({f['advice']})" if f.get("advice") else "")


def parse(line: str) -> Event | None:
    """The event of a text or JSON log line; None for anything else (a traceback's line)."""
    line = line.strip()
    if line.startswith("{"):
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if not isinstance(doc, dict) or "event" not in doc:
            return None
        return Event(str(doc.get("level", "")), str(doc["event"]), {
            k: v for k, v in doc.items() if k not in ("ts", "level", "logger", "event")})
    m = _TEXT.match(line)
    if m is None:
        return None
    fields: dict[str, Any] = {}
    for key, raw in _FIELD.findall(m["rest"]):
        try:
            fields[key] = json.loads(raw) if raw.startswith('"') else raw
        except ValueError:
            fields[key] = raw
    return Event(m["level"], m["event"], fields)


def _events(path: Path, offset: int = 0) -> tuple[list[Event], int]:
    """The events of `path` from byte `offset` to its last whole line, and where that ends."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    whole = data[:data.rfind(b"\n") + 1]
    found = [e for line in whole.decode("utf-8", "replace").splitlines()
             if (e := parse(line)) is not None]
    return found, offset + len(whole)


def last_error(path: Path) -> Event | None:
    """The last ERROR event of a log, or None."""
    events, _ = _events(path)
    return next((e for e in reversed(events) if e.level in ("ERROR", "CRITICAL")), None)


def failure_line(log: Path) -> str | None:
    """What a child that exited non-zero said last, in one line: its last ERROR's advice
    (or its error); None when it logged none (a crash: its log's tail says more)."""
    event = last_error(log)
    if event is None:
        return None
    said = event.fields.get("advice") or event.fields.get("error")
    return f"{event.event}: {said}" if said else event.text()


class LogNotes:
    """Follows some logs; `new` gives each WARNING or ERROR not said before, once."""

    def __init__(self, paths: dict[str, Path], *, limit: int = MAX_NOTES,
                 skip: Callable[[Event], bool] = lambda e: False) -> None:
        self.paths = paths
        self.limit = limit
        self.skip = skip
        self._offsets = dict.fromkeys(paths, 0)
        self._said: set[tuple[Any, ...]] = set()
        self.shown = 0
        self.held_back = 0

    def new(self) -> list[str]:
        """The notes that came since the last call, each once across the logs."""
        notes = []
        for name, path in self.paths.items():
            events, self._offsets[name] = _events(path, self._offsets[name])
            for event in events:
                if event.level not in ("WARNING", "ERROR", "CRITICAL") or self.skip(event):
                    continue
                key = (event.event, *sorted((k, str(v)) for k, v in event.fields.items()
                                            if k not in _OCCURRENCE and k != "advice"))
                if key in self._said:
                    continue
                self._said.add(key)
                if self.shown >= self.limit:
                    self.held_back += 1
                    continue
                self.shown += 1
                notes.append(f"{event.level.lower()}: {event.text()}")
        return notes
