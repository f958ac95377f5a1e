"""A fetched page as a spider route sees it: the fetch result plus selectors.

``response.css("h1::text").get()``, ``response.xpath("//a/@href").getall()`` and
``response.json()`` follow Scrapy's conventions through parsel, Scrapy's own selector
library: users bring their selectors over unchanged. A rendered page (docs/rendering.md)
is its DOM as the page's scripts left it, read the same way, and ``response.fetched``
holds the JSON responses its scripts fetched. The parsel tree (lxml) is built
once per response, on the first ``css``/``xpath`` call, so a route that reads only JSON
or only the status pays nothing for it (bench/selector_bench.py measures what it costs
a page next to selectolax).
"""

from __future__ import annotations

import re
from contextlib import suppress
from typing import Any

from ada_url import join_url
from parsel import Selector, SelectorList

from common import codec
from common.browser.render import Fetched, RenderResult
from common.http.results import FetchResult

__all__ = ["Response"]

# A fragment-only href whose characters the URL Standard keeps as they are (printable
# ASCII but the fragment percent-encode set's space, ", <, >, `): joined by concatenation.
_PLAIN_FRAGMENT = re.compile(r"#[!#-;=?-_a-~]*")


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"').lower()
    return None


class Response:
    """A response (``FetchResult``'s fields) with Scrapy-style selectors."""

    __slots__ = ("_base", "_joined", "_selector", "_text", "result")

    def __init__(self, result: FetchResult) -> None:
        self.result = result
        self._selector: Selector | None = None
        self._text: str | None = None
        self._base: str | None = None
        self._joined: dict[str, str] = {}  # href -> URL: a page links to one place often

    @property
    def url(self) -> str:
        """The URL the page came from: the last redirect's target (Scrapy's ``url``)."""
        return self.result.final_url

    @property
    def status(self) -> int:
        return self.result.status

    @property
    def headers(self) -> dict[str, str]:
        """The kept response headers, lowercase names (``FetchResult.headers``)."""
        return self.result.headers

    @property
    def body(self) -> bytes:
        return self.result.body

    @property
    def text(self) -> str:
        """The body decoded by its Content-Type charset (UTF-8 if none; bad bytes replaced)."""
        if self._text is None:
            charset = _charset(self.result.headers.get("content-type", "")) or "utf-8"
            try:
                self._text = self.result.body.decode(charset, errors="replace")
            except LookupError:  # a charset Python does not know
                self._text = self.result.body.decode("utf-8", errors="replace")
        return self._text

    @property
    def selector(self) -> Selector:
        """The page's parsel selector, built on first use and kept."""
        if self._selector is None:
            self._selector = Selector(text=self.text or "<html></html>", type="html",
                                      base_url=self.url)
        return self._selector

    def css(self, query: str) -> SelectorList[Selector]:
        """Elements (or, with ``::text`` / ``::attr(name)``, strings) matching a CSS query;
        ``.get()`` gives the first or None, ``.getall()`` all."""
        return self.selector.css(query)

    def xpath(self, query: str, **variables: Any) -> SelectorList[Selector]:
        """Nodes matching an XPath query (``$name`` variables from keywords)."""
        return self.selector.xpath(query, **variables)

    def json(self) -> Any:
        """The body parsed as JSON; ValueError saying so when it is not JSON."""
        return codec.loads(self.result.body)

    @property
    def rendered(self) -> bool:
        """Whether this page was rendered in a browser (its body is the DOM)."""
        return isinstance(self.result, RenderResult)

    @property
    def fetched(self) -> tuple[Fetched, ...]:
        """The JSON responses a rendered page's scripts fetched, in order (``.url``,
        ``.status``, ``.json()``); empty for a page fetched over HTTP."""
        return self.result.fetched if isinstance(self.result, RenderResult) else ()

    def urljoin(self, href: str) -> str:
        """`href` resolved against the page's ``<base href>``, else its URL, by the WHATWG
        URL Standard (ada, as the consumer's link extraction: ~20x urllib's urljoin, which
        cost a link-heavy page more than its parse); an href that can't be joined is
        returned as it is (the crawl then refuses it as any bad URL)."""
        joined = self._joined.get(href)
        if joined is not None:
            return joined
        if self._base is None:
            self._base = self._find_base()
        stripped = href.strip()
        if _PLAIN_FRAGMENT.fullmatch(stripped):  # half a doc page's links: no parse
            joined = self._base.partition("#")[0] + stripped
        else:
            try:
                joined = join_url(self._base, stripped)
            except ValueError:
                joined = href
        self._joined[href] = joined
        return joined

    def _find_base(self) -> str:
        """The page's ``<base href>`` joined to its URL, else its URL; parsed, so that a
        fragment can be put on it as it is."""
        base = self.url
        with suppress(ValueError):  # an unparsable URL stays as it is
            base = join_url(base, "")
        if b"<base" in self.result.body.lower():
            found = self.css("base::attr(href)").get()
            if found:
                with suppress(ValueError):  # an unparsable <base href> is ignored
                    base = join_url(base, found.strip())
        return base
