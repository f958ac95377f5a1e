"""``python -m producer`` and the ``crawlq-producer`` console script."""

from __future__ import annotations

import sys

from producer.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
