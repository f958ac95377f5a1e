"""What a blocked answer looks like: a page that is a site's refusal, not its content.

A `Blocked` rule set holds statuses, CSS selectors and texts. The crawl's policy holds
one (``ban_status``, ``ban_selector``, ``ban_text``) and a spider's route may add its own
(``@spider.route("detail", blocked=Blocked(css=".captcha"))``); `judge` checks a
response against both, so a captcha page, an "access denied" shell or a 403 handed to a
proxy is never taken as data:

- a status of `statuses` is a block of a request that had another way to go: sent
  through the proxy pool (a proxy, or its ``direct`` tier) or with a session; a route's
  own statuses are blocks of its requests whatever way they went;
- a 2xx HTML page that any of `selectors` matches (Lexbor's CSS, on the tree the handler
  reads too) or whose body holds any of `texts` (case-insensitive) is a block however it
  was sent.

`judge` returns why (``status 403``, ``selector .captcha``, ``text 'Access denied'``) or
None.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser, SelectolaxError

from common.http.results import FetchResult

__all__ = ["NO_RULES", "Blocked", "check_selector", "judge", "statuses"]


def check_selector(css: str) -> str:
    """`css` if Lexbor parses it as a CSS selector, else ArgumentTypeError."""
    try:
        LexborHTMLParser("<p></p>").css_first(css)
    except (SelectolaxError, ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"{css!r} is not a CSS selector") from None
    return css


def statuses(values: Iterable[int]) -> frozenset[int]:
    """HTTP statuses (100-599), else ArgumentTypeError."""
    found = frozenset(values)
    bad = sorted(s for s in found if not (isinstance(s, int) and 100 <= s <= 599))
    if bad:
        raise argparse.ArgumentTypeError(f"not an HTTP status (100-599): {bad[0]!r}")
    return found


@dataclass(frozen=True, slots=True, init=False)
class Blocked:
    """What a blocked answer looks like: statuses, CSS selectors, texts (any one)."""

    status: tuple[int, ...] = ()
    css: tuple[str, ...] = ()
    text: tuple[str, ...] = ()

    def __init__(self, status: int | Iterable[int] = (), css: str | Iterable[str] = (),
                 text: str | Iterable[str] = ()) -> None:
        found = statuses((status,) if isinstance(status, int) else status)
        selectors = (css,) if isinstance(css, str) else tuple(css)
        texts = (text,) if isinstance(text, str) else tuple(text)
        for selector in selectors:
            check_selector(selector)
        if any(not isinstance(t, str) or not t for t in texts):
            raise argparse.ArgumentTypeError("a block's text must be a non-empty string")
        object.__setattr__(self, "status", tuple(sorted(found)))
        object.__setattr__(self, "css", selectors)
        object.__setattr__(self, "text", texts)

    def __bool__(self) -> bool:
        return bool(self.status or self.css or self.text)

    def __add__(self, other: Blocked) -> Blocked:
        return Blocked((*self.status, *other.status), (*self.css, *other.css),
                       (*self.text, *other.text))


NO_RULES = Blocked()


def _html(result: FetchResult) -> bool:
    ctype = result.headers.get("content-type")
    return ctype is None or "html" in ctype


def judge(result: FetchResult, crawl: Blocked, route: Blocked = NO_RULES, *,
          elsewhere: bool) -> str | None:
    """Why `result` is a block under the crawl's rules and its route's, or None.
    `elsewhere`: it went through the proxy pool or a session (the crawl's statuses count
    only then)."""
    status = result.status
    if status in route.status or (elsewhere and status in crawl.status):
        return f"status {status}"
    if not 200 <= status <= 299 or not result.body:
        return None
    for rules in (crawl, route):
        if rules.text:
            body = result.body.lower()
            for text in rules.text:
                if text.lower().encode() in body:
                    return f"text {text[:60]!r}"
        if rules.css and _html(result):
            tree = result.tree()
            for css in rules.css:
                if tree.css_first(css) is not None:
                    return f"selector {css[:60]}"
    return None
