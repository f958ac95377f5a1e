"""Crawler traps and pages that are not what they seem: `rules` (trap rules on a URL's
text, session ids), `book` (the hosts' learned traps and variants in Redis), `simhash`
(near-duplicate fingerprints) and `soft404` (a 200 where a missing page should be).
"""

from common.traps.book import HostState, Learned, Page, TrapBook, TrapRow, Variant
from common.traps.rules import (
    FACETS,
    REFUSALS,
    VARIANTS,
    TrapRules,
    fresh_tokens,
    strip_session_ids,
    variant_of,
    without_tokens,
)
from common.traps.soft404 import Signature

__all__ = [
    "FACETS",
    "REFUSALS",
    "VARIANTS",
    "HostState",
    "Learned",
    "Page",
    "Signature",
    "TrapBook",
    "TrapRow",
    "TrapRules",
    "Variant",
    "fresh_tokens",
    "strip_session_ids",
    "variant_of",
    "without_tokens",
]
