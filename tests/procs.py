"""Child processes of the process-level tests: their JSON log lines and their exit, and
what of a process group still runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest


def group_members(pgid: int) -> list[str]:
    """``pid name`` of every live (not zombie) process in process group `pgid`; matched by
    group, not command line, which redis-server rewrites."""
    found = []
    for proc in psutil.process_iter(["name", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except (ProcessLookupError, psutil.Error):
            continue
    return found


class JsonLog:
    """Mixin for a child process `proc` whose stderr (``CRAWLQ_LOG_FORMAT=json``) goes to
    ``log_path``."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path

    async def wait(self, within: float) -> int:
        """The exit code; fail the test if the process still runs after `within` s."""
        try:
            return await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            pytest.fail(f"{self.name} still running after {within:g}s:\n"
                        f"{self.log_text()[-3000:]}")

    async def kill(self) -> None:
        """SIGKILL the process if it still runs (woken first, were it SIGSTOPped) and
        reap it, waiting 10 s at most."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 10)

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
