"""Reading a child process's JSON log lines, for the process-level tests."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


class JsonLog:
    """Mixin for a child whose stderr (``CRAWLQ_LOG_FORMAT=json``) goes to ``log_path``."""

    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (a torn last line is skipped)."""
        out = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def event(self, name: str) -> dict[str, Any] | None:
        """The first log line with this event name, if any."""
        return next((e for e in self.events() if e.get("event") == name), None)
