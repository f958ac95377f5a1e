"""``python -m console.cli``: the ``crawlq`` command."""

import sys

from console.cli import main

sys.exit(main())
