"""The code's shape: no class in the consumer or the queue package grows past what one
reader holds in mind (issue 25: the consumer had become an 800-line unnamed state
machine). A class that needs more is two jobs: split it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The packages held to the limit, and the limit (lines of a class statement, its
#: docstring and comments included).
HELD = ("consumer", "common/queue")
MAX_CLASS_LINES = 300


def long_classes(source: str, limit: int = MAX_CLASS_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each class in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_a_long_class_is_found() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert long_classes(f"class Big:\n{body}\n") == [("Big", MAX_CLASS_LINES + 1)]
    assert long_classes("class Small:\n    x = 1\n") == []


def test_no_class_of_the_consumer_or_the_queue_is_over_the_limit() -> None:
    files = sorted(p for held in HELD for p in (ROOT / held).rglob("*.py"))
    assert any(p.parent.name == "queue" for p in files), "common/queue/ is a package"
    over = {str(p.relative_to(ROOT)): found for p in files
            if (found := long_classes(p.read_text(encoding="utf-8")))}
    assert over == {}
