"""The extraction crawl of bench/pgsink_bench.py: python3-doc's pages, each documented
signature an item (``dt.sig[id]``: id and text), the page's links followed."""

from __future__ import annotations

from selectolax.lexbor import LexborHTMLParser

from common.http.results import FetchResult
from consumer.handlers import HandlerContext, HandlerResult, links


async def signatures(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Every ``<dt class="sig" id=...>`` of the page as {"id", "signature"}; its links."""
    followed = await links(response, ctx)
    if not followed.urls and not response.body:
        return followed
    tree = LexborHTMLParser(response.body)
    followed.items = [{"id": dt.attributes.get("id"), "signature": dt.text(strip=True)}
                      for dt in tree.css("dt.sig[id]")]
    return followed
