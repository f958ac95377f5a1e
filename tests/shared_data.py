"""The one place the tests name ``shared/``: public data kept beside the repository.

``shared/`` sits beside the project root (``<repo>/../shared``, CI has it there too);
``CRAWLQ_SHARED`` points elsewhere. It holds data we don't carry in the repository:
the WPT URL data (``data/urltestdata.json``), the Compose Specification schema and
KEDA's CRDs (``schemas/``).

`require` is how a test asks for one of those files: without it the test is skipped on a
developer's machine, but fails (naming the path and what to do) when ``CI`` is set, so a
CI run that lost ``shared/`` can't pass by skipping what it was meant to check.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CRAWLQ_SHARED") or REPO.parent / "shared")


def in_ci() -> bool:
    """True when the ``CI`` variable is set to anything but empty, "0" or "false"."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(path: Path, what: str) -> Path:
    """`path` if it is a file; else skip the test, or fail it when ``CI`` is set."""
    if path.is_file():
        return path
    message = (f"{what} is not at {path}: put shared/ beside the repository "
               f"({REPO.parent / 'shared'}) or set CRAWLQ_SHARED to its path")
    if in_ci():
        pytest.fail(f"{message} (CI is set, so this fails rather than skips)", pytrace=False)
    pytest.skip(message)
