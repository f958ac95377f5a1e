"""One-way layers, enforced by import-linter: the contracts in pyproject.toml hold for
the tree, and a wrong import breaks them with a message naming the rule."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# lint-imports runs as a child process, on a copy of the tree
pytestmark = pytest.mark.integration

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


def copy_tree(to: Path) -> None:
    """The packages and the contracts, without what import-linter does not read."""
    for package in ("common", "producer", "consumer", "console", "crawlq"):
        shutil.copytree(ROOT / package, to / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lua", "static"))
    shutil.copy(ROOT / "pyproject.toml", to)


def add_import(module: Path, name: str) -> None:
    module.write_text(module.read_text() + f"\nimport {name}  # noqa\n")


def test_a_wrong_import_breaks_the_contract_it_names(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    add_import(tmp_path / "common" / "codec.py", "consumer.lifecycle")
    add_import(tmp_path / "producer" / "sitemaps.py", "consumer.flush")
    add_import(tmp_path / "console" / "fsck" / "checks.py", "consumer.lifecycle")
    add_import(tmp_path / "consumer" / "housekeeping.py", "console.views.crawls")
    add_import(tmp_path / "crawlq" / "__init__.py", "consumer.wiring")
    add_import(tmp_path / "producer" / "summary.py", "crawlq")
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
    assert "the crawlq facade re-exports common only BROKEN" in out
    assert "nothing inside crawlq imports its facade (the crawlq package) BROKEN" in out
    assert "producer.summary -> crawlq" in out


def test_a_wrong_import_inside_common_breaks_its_layers(tmp_path: Path) -> None:
    """The host model under the queue, the queue under the domains (the fleet's among
    them), those under the policy, the policy under the operator's Frontier; the fleet's
    modules are independent of each other."""
    copy_tree(tmp_path)
    common = tmp_path / "common"
    add_import(common / "hostmodel" / "hostkey.py", "common.queue")
    add_import(common / "redis" / "scripts.py", "common.fleet.wake")
    add_import(common / "fleet" / "workers.py", "common.fleet.history")
    add_import(common / "fleet" / "wake.py", "common.policy")
    add_import(common / "policy" / "__init__.py", "common.frontier.hosts")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    out = result.stdout
    assert "inside common: the policy and domains over the queue over its parts BROKEN" in out
    assert "the fleet's parts (wake-ups, workers, history, locks) are independent BROKEN" in out
    for arrow in ("common.hostmodel.hostkey -> common.queue",
                  "common.redis.scripts -> common.fleet.wake",
                  "common.fleet.workers -> common.fleet.history",
                  "common.fleet.wake -> common.policy", "common.policy -> common.frontier.hosts"):
        assert arrow in out, arrow
    # The other contracts still hold: the wrong imports stay inside common.
    assert "common is the base layer: it imports neither the services nor the console " \
           "KEPT" in out


def test_a_wrong_import_inside_the_console_breaks_its_layers(tmp_path: Path) -> None:
    """The commands over the dashboard, the demo, fsck and a spider's run (which don't
    import each other), over the local processes, over the views."""
    copy_tree(tmp_path)
    console = tmp_path / "console"
    add_import(console / "views" / "crawls.py", "console.cli")
    add_import(console / "local" / "processes.py", "console.run.ownership")
    add_import(console / "dashboard" / "api.py", "console.demo.site")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    out = result.stdout
    assert "inside the console: the commands over their parts over local over the views " \
           "BROKEN" in out
    for arrow in ("console.views.crawls -> console.cli", "console.dashboard.api -> "
                  "console.demo.site", "console.local.processes -> console.run.ownership"):
        assert arrow in out, arrow
    assert "inside common: the policy and domains over the queue over its parts KEPT" in out
