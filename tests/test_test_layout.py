"""The tests' own layout: a spec file (``tests/test_*.py``) holds tests, and what spec files
share lives in ``tests/support/`` (or a helper module beside them: ``sites.py``,
``procs.py``, ...), imported one way, by its own name (``from support.routes import
serve``: pytest puts tests/ on sys.path). No file of tests/ imports a test module: a spec
file that doubles as a helper library ties every file that imports it to its own, and a
helper imported both as ``tests.x`` and as ``x`` is two modules."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
#: Calls that import the module their first argument names.
_DYNAMIC = {"importorskip", "import_module", "__import__"}


def imported(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import in `source`: import statements at any depth (a
    function's own included, relative ones with their dots), and a module named by a string
    to ``pytest.importorskip``, ``importlib.import_module`` or ``__import__``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if name in _DYNAMIC and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str):
                found.append((node.lineno, first.value))
    return sorted(found)


def wrong_imports(source: str) -> list[str]:
    """Each import of `source` that breaks the layout, as ``"<line>: <module>: why"``."""
    wrong = []
    for line, module in imported(source):
        top = module.split(".")[0]
        if top.startswith("test_") or module.startswith("tests.test_"):
            wrong.append(f"{line}: {module}: a test module (share through tests/support/)")
        elif top in ("tests", "conftest") or module.startswith("."):
            wrong.append(f"{line}: {module}: import a helper by its own name "
                         "(from support.x import y); conftest.py's fixtures come unasked")
    return wrong


def test_no_file_of_the_tests_imports_a_test_module() -> None:
    files = sorted(p for p in TESTS.rglob("*.py") if "artifacts" not in p.parts)
    assert TESTS / "test_consumer.py" in files and SUPPORT / "routes.py" in files
    wrong = {str(p.relative_to(TESTS)): found for p in files
             if (found := wrong_imports(p.read_text(encoding="utf-8")))}
    assert wrong == {}


def test_support_holds_no_tests() -> None:
    """pytest would collect a ``test_*`` file of support/, and a ``test*`` function or
    class once in every spec file that imports it."""
    for path in sorted(SUPPORT.glob("*.py")):
        assert not path.name.startswith("test"), path
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.name for n in tree.body
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        assert [n for n in names if n.lower().startswith("test")] == [], path


def test_each_way_of_importing_a_test_module_is_caught() -> None:
    source = "\n".join([
        "from test_consumer import serve",
        "import test_queue",
        "import test_dashboard_browser as tdb",
        "from tests.test_frontier import tasks",
        "from tests.sites import test_site",
        "from tests.conftest import DASHBOARD_TOKEN",
        "from conftest import DASHBOARD_TOKEN",
        "from .support import routes",
        "def f():",
        "    import test_frontier",
        "    tdb = pytest.importorskip('test_dashboard_browser')",
        "    return importlib.import_module('test_queue')",
    ])
    assert [w.split(":")[0] for w in wrong_imports(source)] == [str(n) for n in range(1, 13)
                                                                 if n != 9]
    fine = "\n".join([
        "import pytest",
        "import consumer_handlers",
        "from sites import test_site",
        "from support.routes import page, serve",
        "from common.queue import CrawlQueue",
        "webdriver = pytest.importorskip('selenium.webdriver')",
    ])
    assert wrong_imports(fine) == []
