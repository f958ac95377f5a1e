"""Crawl names and worker ids: one rule each, checked when options are parsed.

A crawl name goes into every Redis key of the crawl, inside a Cluster hash tag
(``crawlq:{<crawl>:<p>}:...``), and into SCAN patterns, so it is kept to characters
that mean nothing there.

A worker id goes into every lease record, ``"<token>:<worker> <attempt> <host> ..."``
(common/lua/lib/leases.lua), which is split on spaces: an id holding whitespace could
lease tasks but never ack them. It is also a registry key, a log field, a file name part
(made safe by the sinks) and a column of ``crawlq workers`` and the dashboard, so it is
kept to printable ASCII: no control character, no look-alike or invisible Unicode.
"""

from __future__ import annotations

import re

from common.errors import ConfigError

__all__ = ["CRAWL_NAME_RULE", "WORKER_ID_RULE", "validate_crawl_name", "validate_worker_id",
           "worker_id_part"]

CRAWL_NAME_RULE = ("1-64 characters: ASCII letters, digits, '-', '_' and '.', "
                   "starting with a letter or digit")
_CRAWL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_crawl_name(name: str) -> str:
    """``name`` unchanged if it is a valid crawl name, else a ConfigError saying the rule."""
    if _CRAWL_NAME.fullmatch(name) is None:
        raise ConfigError(f"invalid crawl name {name!r}: a crawl name is {CRAWL_NAME_RULE}")
    return name


WORKER_ID_RULE = ("1-128 printable ASCII characters without spaces "
                  "(letters, digits and punctuation such as - _ . : / @)")
_WORKER_ID = re.compile(r"[!-~]{1,128}")
_NOT_IN_WORKER_ID = re.compile(r"[^!-~]")


def validate_worker_id(worker: str) -> str:
    """``worker`` unchanged if it is a valid worker id, else a ConfigError saying the rule."""
    if _WORKER_ID.fullmatch(worker) is None:
        raise ConfigError(f"invalid worker id {worker!r}: a worker id is {WORKER_ID_RULE}")
    return worker


def worker_id_part(text: str) -> str:
    """``text`` with each character a worker id can't hold replaced by ``_``."""
    return _NOT_IN_WORKER_ID.sub("_", text)
