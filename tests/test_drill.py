"""The mutation drill's runner, on a toy tree: a guarded mutant is killed, an unguarded one
survives, a stale patch or a table out of step with tests/mutants/ fails the drill."""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

import pytest
from mutation_drill import MUTANTS, MUTANTS_DIR, Mutant, drill, exit_code

CALC = "def add(a, b):\n    return a + b\n\n\ndef unused(x):\n    return x\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"


def patch(old: str, new: str, name: str = "calc.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), f"a/{name}", f"b/{name}"))


def toy(tmp_path: Path, patches: dict[str, str]) -> tuple[Path, Path]:
    """A git work tree with calc.py and its test (untracked: the drill copies those too),
    and a mutants folder with `patches`."""
    root = tmp_path / "tree"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TEST)
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    for name, text in patches.items():
        (mutants / f"{name}.patch").write_text(text)
    return root, mutants


@pytest.mark.integration
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_guarded_mutant_is_killed_an_unguarded_one_survives_and_fails_the_drill(
        tmp_path: Path, jobs: int) -> None:
    root, mutants = toy(tmp_path, {
        "guarded": patch(CALC, CALC.replace("a + b", "a - b")),
        "unguarded": patch(CALC, CALC.replace("return x", "return -x")),
    })
    lines: list[str] = []
    tests = ("test_calc.py::test_add",)
    table = [Mutant("guarded", "adds", tests), Mutant("unguarded", "nothing", tests)]
    # Judged at once (jobs=2), each mutant still has its own copy and the outcomes come
    # back in table order.
    outcomes = drill(root, mutants, table, jobs=jobs, say=lines.append)
    assert [(o.name, o.verdict) for o in outcomes] == [("guarded", "killed"),
                                                       ("unguarded", "survived")]
    assert outcomes[0].detail == "test_calc.py::test_add"
    assert exit_code(outcomes) == 1
    assert exit_code(outcomes[:1]) == 0
    assert any(line.startswith("guarded") and "killed by test_calc.py::test_add" in line
               for line in lines)
    assert any(line.startswith("unguarded") and "SURVIVED" in line for line in lines)
    assert (root / "calc.py").read_text() == CALC  # mutants touch copies only


@pytest.mark.integration
def test_a_stale_patch_a_missing_patch_and_a_stray_patch_fail_the_drill(tmp_path: Path) -> None:
    root, mutants = toy(tmp_path, {
        "stale": patch(CALC.replace("a + b", "b + a"), CALC.replace("a + b", "a * b")),
        "stray": patch(CALC, CALC.replace("a + b", "a - b")),
    })
    table = [Mutant("stale", "adds", ("test_calc.py",)),
             Mutant("missing", "adds", ("test_calc.py",))]
    outcomes = drill(root, mutants, table)
    verdicts = {o.name: (o.verdict, o.detail) for o in outcomes}
    assert verdicts["stray"] == ("broken", "a patch with no entry in the drill's table")
    assert verdicts["missing"][0] == "broken" and "no missing.patch" in verdicts["missing"][1]
    assert verdicts["stale"][0] == "broken"
    assert verdicts["stale"][1].startswith("patch does not apply")
    assert exit_code(outcomes) == 1


@pytest.mark.integration
def test_a_baseline_that_fails_unpatched_fails_the_drill(tmp_path: Path) -> None:
    root, mutants = toy(tmp_path, {"guarded": patch(CALC, CALC.replace("a + b", "a - b"))})
    (root / "test_calc.py").write_text(TEST.replace("== 3", "== 4"))
    outcomes = drill(root, mutants, [Mutant("guarded", "adds", ("test_calc.py",))])
    assert [(o.name, o.verdict) for o in outcomes] == [("baseline", "broken")]
    assert exit_code(outcomes) == 1


def test_the_table_and_the_patches_match_and_name_existing_test_files() -> None:
    assert sorted(p.stem for p in MUTANTS_DIR.glob("*.patch")) == sorted(m.name for m in MUTANTS)
    root = MUTANTS_DIR.parent.parent
    for m in MUTANTS:
        assert m.tests, m.name
        for test in m.tests:
            assert (root / test.split("::")[0]).is_file(), test
