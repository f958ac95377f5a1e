"""What a spider route gets besides the response: its request, and what it can do.

``ctx.request`` is the task's Request (``label``, ``data``, ``url``, ``method``, ...).
``ctx.follow(...)`` asks for more requests: links chosen by a CSS or XPath selector, URLs,
or Requests; ``ctx.emit(item)`` hands an item to the sink, keyed by the route's item key
fields when it declares some (else the sink keys it ``<unique key>#<index>``), of the
route's item type when it has one (its own table or file).
``ctx.checkpoint`` / ``await ctx.save_checkpoint(value)`` keep a long task's progress,
as for any handler. What a route followed and emitted reaches the crawl and the sink only
when the route returns: an exception leaves nothing behind (the task is retried).

``follow`` is where a route's requests enter the crawl: each is checked there, once
(`Spider.admit`: its fields and its label), and frozen, so the route may go on changing
the dicts it made it from; the links of one call share one Request checked for them
all. The consumer trusts what follow took (the intake, ``NewTask.from_request``, the
enqueue check nothing again). A bad one raises from the route's ``follow`` call, or at
its ``yield`` (``common.spider.dispatch``): the route's line is where it failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from common.errors import UnknownLabelError
from common.spider.response import Response
from common.spider.spider import Route, Spider
from common.tasks.items import Item, item_key
from common.tasks.request import Request, checked
from common.tasks.task import Task

__all__ = ["Context"]

_SKIPPED = ("javascript:", "mailto:", "data:", "tel:", "#")
_ABSOLUTE = ("http://", "https://")


class Context:
    """A route's view of its task: the request, follow, emit and checkpoints."""

    __slots__ = ("_save", "_spider", "checkpoint", "items", "request", "requests", "response",
                 "route", "task", "worker")

    def __init__(self, spider: Spider, route: Route, request: Request, response: Response, *,
                 worker: str, checkpoint: Any, save: Callable[[Any], Awaitable[None]],
                 task: Task | None = None) -> None:
        self._spider = spider
        self.route = route
        self.request = request
        self.response = response
        self.worker = worker
        #: the leased task (its id, depth, attempt, meta; None outside a consumer): read
        #: only, as a --handler's ``ctx.task``
        self.task = task
        #: the last checkpoint saved for this task (None on a first attempt)
        self.checkpoint = checkpoint
        self._save = save
        self.items: list[Item | dict[str, Any]] = []
        #: what the route followed: Requests, and plain links as URLs
        self.requests: list[str | Request] = []

    async def save_checkpoint(self, value: Any) -> None:
        """Store progress a retry of this task resumes from (``ctx.checkpoint``); raises
        when this consumer no longer owns the task (the route stops there)."""
        await self._save(value)
        self.checkpoint = value

    def follow(self, target: str | Request | Iterable[str | Request] | None = None, *,
               css: str | None = None, xpath: str | None = None, label: str | None = None,
               data: Mapping[str, Any] | None = None, priority: int = 0) -> int:
        """Crawl more: `target` (a URL, a Request, or several), or the links `css` /
        `xpath` select in the response (elements: their ``href``; ``::attr()`` / ``@attr``:
        that value), made GET Requests with `label`, `data` and `priority`. Relative
        URLs are resolved against the page. Returns how many requests were added; raises
        UnknownLabelError for a label the spider has no route for, InvalidRequestError
        for a bad Request (or bad `data`, `priority`): each checked here, once."""
        found: list[str | Request] = []
        if target is not None:
            found += [target] if isinstance(target, str | Request) else list(target)
        if css is not None or xpath is not None:
            found += _selected(self.response, css, xpath)
        spider = self._spider
        if not spider.knows(label) and any(isinstance(f, str) for f in found):
            raise UnknownLabelError(spider.unknown(label))
        # A plain link (no label, data or priority, to a route that does not render) goes
        # as its URL: the same task as a GET Request, without one built.
        render = spider.renders(label)
        plain = label is None and not data and not priority and not render
        links: Request | None = None  # the first link's Request: checked for them all
        added = 0
        for item in found:
            if isinstance(item, Request):
                self.requests.append(spider.admit(item))
            else:
                href = item.strip()
                if not href or href[:11].lower().startswith(_SKIPPED):
                    continue
                # An absolute http(s) URL is parsed once, by the intake's canonicalizer.
                url = href if href[:8].lower().startswith(_ABSOLUTE) else \
                    self.response.urljoin(href)
                if plain:
                    self.requests.append(url)
                elif links is None:
                    links = checked(Request(url, label=label, data=data or {},
                                            priority=priority, render=render))
                    self.requests.append(links)
                else:  # its data frozen (and checked) with the first link's
                    self.requests.append(Request(url, label=label, data=links.data,
                                                 priority=priority, render=render))
            added += 1
        return added

    def emit(self, item: Mapping[str, Any] | Item) -> Item | dict[str, Any]:
        """Hand `item` (a dict of JSON values, or an Item with its own key) to the sink;
        keyed by the route's item key fields when it has some (a missing field raises)."""
        kind = self.route.item_type or ""
        if isinstance(item, Item):
            out: Item | dict[str, Any] = item if item.type or not kind else \
                Item(item.key, item.data, kind)
        elif isinstance(item, Mapping):
            data = dict(item)
            keys = self.route.item_key
            if keys or kind:  # no key: the sink keys it by the request's and its index
                out = Item(item_key(data, unique_key="", index=len(self.items),
                                    key_fields=keys) if keys else "", data, kind)
            else:
                out = data
        else:
            raise TypeError(f"ctx.emit takes a dict or an Item, not {type(item).__name__}")
        self.items.append(out)
        return out


def _selected(response: Response, css: str | None, xpath: str | None) -> list[str]:
    """The URLs a selector picks: strings as they are, elements by their href (or src)."""
    chosen = response.css(css) if css is not None else response.xpath(xpath or "")
    urls = []
    for sel in chosen:
        if isinstance(sel.root, str):
            urls.append(sel.root)
        else:
            href = sel.attrib.get("href") or sel.attrib.get("src")
            if href:
                urls.append(href)
    return urls
