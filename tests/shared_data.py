"""The one place the tests name their public data files: ``tests/data/`` in the repository.

It holds what the tests check against and no package carries: the WPT URL data
(``urltestdata.json``), the Compose Specification schema and KEDA's CRDs (``schemas/``);
their sources and licences are in ``tests/data/README.md``. A fresh clone has them, so no
test is skipped for its data. `require` is how a test asks for one: a file missing is a
broken checkout, and the test fails naming it rather than skipping what it was meant to
check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def require(path: Path, what: str) -> Path:
    """`path` if it is a file; else fail the test naming it."""
    if path.is_file():
        return path
    pytest.fail(f"{what} is not at {path}: it is part of the repository (tests/data/); "
                "restore it with git checkout", pytrace=False)
