"""Crawl names: one rule, checked when options are parsed and where keys are built.

A crawl name goes into every Redis key of the crawl, inside a Cluster hash tag
(``crawlq:{<crawl>:<p>}:...``), and into SCAN patterns, so it is kept to characters
that mean nothing there.
"""

from __future__ import annotations

import re

from common.errors import ConfigError

__all__ = ["CRAWL_NAME_RULE", "validate_crawl_name"]

CRAWL_NAME_RULE = ("1-64 characters: ASCII letters, digits, '-', '_' and '.', "
                   "starting with a letter or digit")
_CRAWL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_crawl_name(name: str) -> str:
    """``name`` unchanged if it is a valid crawl name, else a ConfigError saying the rule."""
    if _CRAWL_NAME.fullmatch(name) is None:
        raise ConfigError(f"invalid crawl name {name!r}: a crawl name is {CRAWL_NAME_RULE}")
    return name
