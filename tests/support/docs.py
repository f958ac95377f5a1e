"""The docs the tests hold to the code: README.md and the pages of docs/ (the site that
mkdocs.yml builds). A test reads the page its text lives on, by name, so text that moves
to another page fails the test that reads it instead of going unchecked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_HEADING = re.compile(r"^(#{1,6}) ")


def page(name: str) -> str:
    """The text of ``docs/<name>`` (``"policy.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """From the line ``heading`` (``"# Crawl policy"``) of `text` up to the next heading
    of its level or higher, outside code blocks."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    fence = False
    for n in range(start + 1, len(lines)):
        line = lines[n]
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := _HEADING.match(line)) and len(m[1]) <= level:
            return "\n".join(lines[start:n])
    return "\n".join(lines[start:])
