"""``crawlq-consumer`` / ``python -m consumer``: the long-lived fetching service."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from common.errors import ConfigError
from common.observability.logs import setup_logging
from common.runtime import run_loop, tune_gc
from consumer.config import build_parser, settings_from_args
from consumer.wiring import run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags and env, then run the consumer until it is stopped."""
    try:
        args = build_parser().parse_args(argv)
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"crawlq-consumer: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.common.log_level, settings.common.log_format)
    tune_gc(settings.gc_threshold)
    return run_loop(run(settings))


if __name__ == "__main__":
    sys.exit(main())
