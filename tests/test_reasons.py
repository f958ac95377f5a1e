"""The "What happens to a fetch" table (docs/consumer.md), `common.reasons` and the code agree."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from support.docs import page

from common.reasons import METRIC_OUTCOMES, REASONS, Outcome

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("common", "consumer", "producer")
CODE = re.compile(r"`([a-z][a-z0-9_]*)`")

# Where a reason or outcome code is passed: call name -> (position, keyword) of the code.
_CODE_ARGS = {"FetchError": (0, "reason"), "Failure": (1, "reason"), "Completion": (2, "outcome")}
_CODE_ATTRS = frozenset({"reason", "outcome"})


def docs_table() -> dict[str, str]:
    """Each code in the outcome column of the docs' table -> that cell's first word."""
    text = page("consumer.md")
    start = text.index("**What happens to a fetch:**")
    rows = text[start:].split("\n\n", 2)[1].splitlines()
    assert rows[0] == "| what | outcome |", rows[0]
    found: dict[str, str] = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 2, row
        fate = re.split(r"[\s:,]", cells[1], maxsplit=1)[0]
        for code in CODE.findall(cells[1]):
            if not code.startswith("-"):
                assert code not in found, f"{code} is in the docs' table twice"
                found[code] = fate
    return found


def _strings(node: ast.expr) -> Iterator[str]:
    """The string constants `node` can evaluate to (through if-else, sets, tuples)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.Set | ast.Tuple | ast.List):
        for elt in node.elts:
            yield from _strings(elt)
    elif isinstance(node, ast.Call) and _name(node.func) == "frozenset" and node.args:
        yield from _strings(node.args[0])


def _is_code_ref(node: ast.expr) -> bool:
    """`outcome`, `x.outcome` or `x.reason` (a bare `reason` is also why a sink closed a file)."""
    if isinstance(node, ast.Name):
        return node.id == "outcome"
    return isinstance(node, ast.Attribute) and node.attr in _CODE_ATTRS


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def codes_in_python(source: str) -> Iterator[tuple[int, str]]:
    """(line, code) for every string literal used as a reason or outcome in `source`:
    passed to FetchError/Failure/Completion or `metrics.error`/`metrics.task`, assigned to a name
    `outcome` (or an attribute `reason`/`outcome`), or compared with one."""
    for node in ast.walk(ast.parse(source)):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call):
            called = _name(node.func)
            if called in _CODE_ARGS:
                pos, keyword = _CODE_ARGS[called]
                values += node.args[pos:pos + 1]
                values += [k.value for k in node.keywords if k.arg == keyword]
            elif (called in {"error", "task"} and isinstance(node.func, ast.Attribute)
                  and _name(node.func.value) == "metrics"):
                values += node.args[:1]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_code_ref(t) for t in targets):
                values.append(node.value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code_ref(side) for side in sides):
                values += sides
        for value in values:
            for code in _strings(value):
                yield value.lineno, code


_LUA_CODES = re.compile(r"to_dead\((?:[^,()']+,\s*){4}'([^']*)'|'outcome:([a-z0-9_]+)'")


def codes_in_lua(source: str) -> Iterator[tuple[int, str]]:
    """(line, code) for the literal reason of every `to_dead(...)` call in a Lua script and
    every literal `outcome:<code>` counter."""
    for m in _LUA_CODES.finditer(source):
        yield source.count("\n", 0, m.start()) + 1, m[1] or m[2]


def test_the_docs_table_lists_exactly_the_known_codes_with_their_fate() -> None:
    table = docs_table()
    assert sorted(set(table) - set(REASONS)) == [], "in docs/consumer.md, not in common/reasons.py"
    assert sorted(set(REASONS) - set(table)) == [], "in common/reasons.py, not in docs/consumer.md"
    wrong = {code: (fate, REASONS[code].fate) for code, fate in table.items()
             if fate != REASONS[code].fate}
    assert wrong == {}, "docs/consumer.md fate vs common/reasons.py fate"


def test_the_outcomes_are_the_codes_a_task_is_done_with() -> None:
    done = {code for code, reason in REASONS.items() if reason.fate == "done"}
    assert {str(o) for o in Outcome} == done, "common/reasons.py: Outcome vs fate done"
    assert all(type(code) is str for code in REASONS)  # keys print as themselves
    assert f"outcome:{Outcome.NEAR_DUPLICATE}" == "outcome:near_duplicate"


def test_every_reason_literal_in_the_sources_is_a_known_code() -> None:
    known = set(REASONS) | METRIC_OUTCOMES
    unknown: list[str] = []
    seen: set[str] = set()
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "common" / "reasons.py":
                continue
            for line, code in codes_in_python(path.read_text()):
                seen.add(code)
                if code not in known:
                    unknown.append(f"{path.relative_to(ROOT)}:{line}: {code!r}")
        for path in sorted((ROOT / folder).rglob("*.lua")):
            for line, code in codes_in_lua(path.read_text()):
                seen.add(code)
                if code not in known:
                    unknown.append(f"{path.relative_to(ROOT)}:{line}: {code!r}")
    assert unknown == [], "reason codes missing from common/reasons.py (and docs/consumer.md)"
    # The scan really reads the worker's literals and the Lua scripts' dead reasons (the
    # consumer's outcomes are mostly `Outcome` members now: mypy checks those).
    assert {"filtered", "unknown_label", "handler_error", "stalled"} <= seen


def test_the_scan_finds_every_kind_of_use() -> None:
    source = '''
raise FetchError("bogus_a", "m", retryable=False)
Failure(lease, "bogus_b", "m")
Failure(lease, reason="bogus_c", message="m")
Completion(lease, "ack", "bogus_d")
self.metrics.error("bogus_e")
self.metrics.task("bogus_i")
outcome = "ok" if ok else "bogus_f"
if exc.reason in {"bogus_g", "timeout"}:
    pass
log.error("not a code")
if reason != "not a task's reason either":
    pass
'''
    found = [code for _, code in codes_in_python(source)]
    assert sorted(c for c in found if c.startswith("bogus")) == [
        f"bogus_{x}" for x in "abcdefgi"]
    assert "not a code" not in found and "not a task's reason either" not in found
    lua = ("to_dead(dead, errors, dead_reasons, id, 'bogus_h',\n  'msg', now)\n"
           "counters['outcome:bogus_j'] = n")
    assert list(codes_in_lua(lua)) == [(1, "bogus_h"), (3, "bogus_j")]
