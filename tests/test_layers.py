"""One-way layers, enforced by import-linter: the contracts in pyproject.toml hold for
the tree, and a wrong import breaks them with a message naming the rule."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command;"
         " sys.exit(lint_imports_command())", "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_wrong_import_breaks_the_contract_it_names(tmp_path: Path) -> None:
    for package in ("common", "producer", "consumer", "console"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lua", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    codec = tmp_path / "common" / "codec.py"
    codec.write_text(codec.read_text() + "\nimport consumer.lifecycle  # noqa\n")
    sitemaps = tmp_path / "producer" / "sitemaps.py"
    sitemaps.write_text(sitemaps.read_text() + "\nimport consumer.flush  # noqa\n")
    fsck = tmp_path / "console" / "fsck.py"
    fsck.write_text(fsck.read_text() + "\nimport consumer.lifecycle  # noqa\n")
    housekeeping = tmp_path / "consumer" / "housekeeping.py"
    housekeeping.write_text(housekeeping.read_text() + "\nimport console.crawls  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    out = result.stdout
    assert "common is the base layer: it imports neither the services nor the console " \
           "BROKEN" in out
    assert "the producer and the consumer never import each other BROKEN" in out
    assert "the console (crawlq, the dashboard, the demo) drives the services from outside " \
           "BROKEN" in out
    assert "the services never import the console BROKEN" in out
    assert "common.codec -> consumer.lifecycle" in out
