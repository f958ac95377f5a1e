"""The two tiers (tests/support/tiers.py): a test is ``unit`` unless its fixtures or its
marks say it needs a server, and one that starts a process while counted unit fails,
saying where it belongs, whatever else it did: it can't slip into ``python -m pytest -m
unit`` unseen."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiers import SERVER_FIXTURES

TESTS = Path(__file__).resolve().parent

CONFTEST = '''
import subprocess
import pytest
from support import tiers


def pytest_configure(config):
    config.pluginmanager.register(tiers, "crawlq-tiers")


@pytest.fixture(scope="session")
def redis_server():  # listed in SERVER_FIXTURES: its tests are integration
    subprocess.run(["true"], check=True)
    return "a server"


@pytest.fixture
def redis_url(redis_server):
    return redis_server


@pytest.fixture
def helper():  # starts a process, but is not listed
    subprocess.run(["true"], check=True)
'''

TESTS_OF_A_TOY = '''
import subprocess
import pytest


def test_pure():
    assert 1 + 1 == 2


def test_through_a_server_fixture(redis_url):
    assert redis_url == "a server"


@pytest.mark.integration
def test_marked_starts_a_child():
    subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_end_to_end():
    subprocess.run(["true"], check=True)


def test_starts_a_child_unmarked():
    subprocess.run(["true"], check=True)


def test_fails_for_want_of_its_server_too():
    subprocess.run(["true"], check=True)
    raise ConnectionRefusedError("nothing listens")


async def test_an_async_child():
    import asyncio
    await (await asyncio.create_subprocess_exec("true")).wait()


def test_a_multiprocessing_child():
    import multiprocessing
    multiprocessing.get_context("spawn").Process(target=print).start()


def test_an_unlisted_fixture(helper):
    pass


@pytest.mark.integration
def test_an_unlisted_fixture_marked(helper):
    pass
'''


def run_toy(tmp_path: Path, *args: str) -> dict[str, str]:
    """Run the toy suite with `args`: {test name: PASSED | FAILED | ERROR + first line}."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_toy.py").write_text(TESTS_OF_A_TOY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
           "COLUMNS": "1000"}  # the summary lines whole
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-p", "no:randomly", "-o", "addopts=", "-o", "asyncio_mode=auto", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    outcomes = {}
    for line in done.stdout.splitlines():
        if m := re.match(r"(PASSED|FAILED|ERROR) test_toy\.py::(\w+)(?: - (.*))?", line):
            outcomes[m[2]] = m[1] + (f": {m[3]}" if m[3] else "")
    return outcomes


@pytest.mark.integration
def test_the_unit_tier_holds_what_starts_no_process_and_refuses_the_rest(
        tmp_path: Path) -> None:
    unit = run_toy(tmp_path, "-m", "unit")
    assert sorted(unit) == sorted(["test_pure", "test_starts_a_child_unmarked",
                                   "test_fails_for_want_of_its_server_too", "test_an_async_child",
                                   "test_a_multiprocessing_child", "test_an_unlisted_fixture"])
    assert unit.pop("test_pure") == "PASSED"
    for name, outcome in unit.items():
        assert outcome.startswith(("FAILED", "ERROR")), (name, outcome)
        assert f"TierError: unit test test_toy.py::{name} started a process" in outcome, (
            name, outcome)
    integration = run_toy(tmp_path, "-m", "integration")
    assert integration == {
        "test_through_a_server_fixture": "PASSED", "test_marked_starts_a_child": "PASSED",
        "test_end_to_end": "PASSED",
        "test_an_unlisted_fixture_marked": "ERROR: support.tiers.TierError: fixture helper "
        "started a process: add it to SERVER_FIXTURES (tests/support/tiers.py), so the "
        "tests using it are integration"}


def defined_fixtures() -> set[str]:
    """Every fixture of tests/, as SERVER_FIXTURES names one."""
    found = set()
    for path in TESTS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    "fixture" in ast.unparse(d) for d in node.decorator_list):
                found.add(node.name if path.name == "conftest.py"
                          else f"{path.name}::{node.name}")
    return found


def test_each_server_fixture_named_is_one_of_the_suite() -> None:
    fixtures = defined_fixtures()
    assert "redis_server" in fixtures and "test_fetcher.py::servers" in fixtures
    assert sorted(SERVER_FIXTURES - fixtures) == []
