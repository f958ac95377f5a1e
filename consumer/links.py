"""Fast link extraction from an HTML page, for the ready-made ``links`` handler.

Lexbor (through selectolax) parses the page as a browser would (HTML5 tree building,
entities decoded, encoding detected from a BOM or ``<meta charset>``), and ada joins each
``<a href>`` / ``<area href>`` to the document's base URL by the WHATWG URL Standard,
the same parser that backs ``common/urls/canonical.py``.
"""

from __future__ import annotations

from contextlib import suppress

from ada_url import join_url
from selectolax.lexbor import LexborHTMLParser

# ASCII whitespace as the HTML Standard strips it from an href: TAB, LF, FF, CR, SPACE.
_ASCII_WS = "\t\n\f\r "
# Schemes that never name a page to fetch; rejected before the (costlier) join.
_SKIPPED = ("javascript:", "mailto:", "data:", "tel:")
_LONGEST_SKIPPED = max(map(len, _SKIPPED))
_HTTP = ("http://", "https://")


def extract_links(page: bytes | LexborHTMLParser, base_url: str, limit: int) -> list[str]:
    """The distinct http(s) URLs of a page's ``<a href>`` and ``<area href>``, in order,
    from its body or its parsed tree (read, not changed: ``FetchResult.tree``).

    Each href is joined to the first ``<base href>`` (itself resolved against
    ``base_url``) or to ``base_url``; hrefs that fail to join, ``javascript:``,
    ``mailto:``, ``data:`` and ``tel:`` hrefs, and self links (empty or ``#fragment``
    only) are dropped, and fragments are stripped. Collecting stops at ``limit`` URLs,
    so a page with a million links costs ``limit`` joins, not a million (each distinct
    href is joined once; only hrefs that fail or aren't http(s) are joined beyond that).
    """
    if limit <= 0 or not page:
        return []
    tree = LexborHTMLParser(page, encoding=True) if isinstance(page, bytes) else page
    base = base_url
    base_el = tree.css_first("base[href]")
    if base_el is not None:
        with suppress(ValueError):  # an unparsable <base href> is ignored, as browsers do
            base = join_url(base_url, (base_el.attrs.get("href") or "").strip(_ASCII_WS))
    found: dict[str, None] = {}
    tried: set[str] = set()  # hrefs already joined: a repeated href is joined once
    for node in tree.css("a[href], area[href]"):
        href = (node.attrs.get("href") or "").strip(_ASCII_WS)
        if (not href or href[0] == "#"
                or href[:_LONGEST_SKIPPED].lower().startswith(_SKIPPED)):
            continue
        # The URL parser ends every component at the first "#", so cutting the fragment
        # off first gives the same URL, and links to one page's anchors join only once.
        href = href.partition("#")[0]
        if href in tried:
            continue
        tried.add(href)
        try:
            url = join_url(base, href)
        except ValueError:
            continue
        if not url.startswith(_HTTP):  # ada serializes the scheme in lower case
            continue
        found[url] = None
        if len(found) >= limit:
            break
    return list(found)
