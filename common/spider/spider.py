"""A spider: routes by label, the item key, and the requests a crawl starts from.

::

    spider = Spider("books", start=["https://example.com/"], item_key=("isbn",))

    @spider.route()                     # the default route: requests without a label
    async def listing(response, ctx):
        ctx.follow(css="a.book::attr(href)", label="book", data={"shelf": 3})

    @spider.route("book", item_type="book")   # its items: table (or file) "book"
    async def book(response, ctx):
        ctx.emit({"isbn": response.css(".isbn::text").get(), **ctx.request.data})

A route may ask for its pages rendered in a browser (``@spider.route("list", render=True)``,
or ``render=Render(wait_for=".product", click="button.more")`` for page actions): every
request of its label is then fetched by a consumer started with ``--browser``
(docs/rendering.md).

A request's label names its route; the label travels through Redis as a string, so any
consumer running the same spider parses it the same way. A request enters the crawl
through its spider (`Spider.admit`: a route's ``ctx.follow``, `Spider.start`), checked
there once: its fields (``common.tasks.request.checked``) and its label, which must have a
route; a leased task whose label has no route ends dead (``unknown_label``): never done
unparsed. A spider is definition only: the consumer runs its routes, the producer its
`start`. A ``--handler`` is a spider too (``consumer.handlers.handler_spider``): one
default route that parses every label (``catch_all``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from common.browser.render import DEFAULT_RENDER, Render
from common.errors import UnknownLabelError
from common.policy import CrawlPolicy, parse_value
from common.proxies.bans import NO_RULES, Blocked
from common.tasks.items import check_item_type
from common.tasks.request import Request, check_label, checked

if TYPE_CHECKING:
    from common.spider.context import Context
    from common.spider.response import Response

__all__ = ["Route", "RouteFn", "Spider"]

#: A route: ``async def route(response, ctx)`` (a plain function or an async generator
#: yielding items and Requests work too).
RouteFn = Callable[["Response", "Context"], Awaitable[Any] | Any]


@dataclass(frozen=True, slots=True)
class Route:
    """One route: its label (None: the default route), its function, its item key, its
    item type (None: the sink's own table or file), what a blocked answer to its
    requests looks like (over the crawl's ``ban_*``), and how its pages are rendered
    (None: fetched over HTTP unless a request asks)."""

    label: str | None
    fn: RouteFn
    item_key: tuple[str, ...]
    item_type: str | None = None
    blocked: Blocked = NO_RULES
    render: Render | None = None


def _key_fields(value: str | Sequence[str]) -> tuple[str, ...]:
    fields = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(f, str) and f for f in fields):
        raise TypeError(f"item_key must be field names, got {value!r}")
    return fields


class Spider:
    """Routes by label, a default route, the item key, and the start requests."""

    def __init__(self, name: str = "spider", *, start: Iterable[str | Request] = (),
                 item_key: str | Sequence[str] = (),
                 policy: Mapping[str, Any] | None = None, catch_all: bool = False) -> None:
        self.name = name
        #: the default route also parses requests whose label has no route of its own (a
        #: --handler alone, which reads the label itself: ``ctx.task.label``)
        self.catch_all = catch_all
        self.item_key = _key_fields(item_key)
        #: crawl policy values (``crawlq crawl set``'s keys) a crawl of this spider is
        #: created with, e.g. ``{"max_depth": 5}`` (no depth limit unless set)
        self.policy = {key: parse_value(key, value) for key, value in (policy or {}).items()}
        CrawlPolicy().replace(self.policy)  # PolicyError now, not when a crawl is made
        self._start = list(start)
        self._seeds: list[Callable[[], Iterable[str | Request]]] = []
        self.routes: dict[str | None, Route] = {}

    def __repr__(self) -> str:
        labels = ", ".join("the default route" if label is None else repr(label)
                           for label in self.routes)
        return f"Spider({self.name!r}, routes: {labels or 'none'})"

    def route(self, label: str | None = None, *, item_key: str | Sequence[str] | None = None,
              item_type: str | None = None, blocked: Blocked | None = None,
              render: bool | Render = False) -> Callable[[RouteFn], RouteFn]:
        """Register the decorated function as the route of `label` (no label: the default
        route, for requests without one). `item_key` overrides the spider's for its
        items; `item_type` names the table (or JSONL file) they go to, each type with
        its own keys (None: the sink's own); `blocked` says what a blocked answer to its
        requests looks like, over the crawl's rules (``Blocked(status=..., css=...,
        text=...)``: such an answer is retried, never parsed); `render`: its pages are
        rendered in a browser (a `Render` says which page actions run first). ValueError
        for a label given twice or an item type that can't name a table."""
        check_label(label, f"spider {self.name!r} route")
        keys = self.item_key if item_key is None else _key_fields(item_key)
        check_item_type(item_type)
        if not isinstance(render, bool | Render):
            raise TypeError(f"render must be True, False or a Render, got {render!r}")
        spec = DEFAULT_RENDER if render is True else (render or None)

        def register(fn: RouteFn) -> RouteFn:
            if label in self.routes:
                what = "the default route" if label is None else f"route {label!r}"
                raise ValueError(f"spider {self.name!r} has {what} already "
                                 f"({self.routes[label].fn.__name__})")
            self.routes[label] = Route(label, fn, keys, item_type, blocked or NO_RULES, spec)
            return fn
        return register

    def default(self, fn: RouteFn) -> RouteFn:
        """Register the decorated function as the default route (``@spider.route()``)."""
        return self.route()(fn)

    def seeds(self, fn: Callable[[], Iterable[str | Request]]
              ) -> Callable[[], Iterable[str | Request]]:
        """Register a function whose URLs and Requests `start` yields too (after
        ``start=``): for seeds computed when the producer runs."""
        self._seeds.append(fn)
        return fn

    def start(self) -> Iterator[Request]:
        """The requests a crawl of this spider starts from: ``start=`` and what each
        ``@spider.seeds`` function yields, URLs made GET Requests for the default route.
        Each enters the crawl here (`admit`: checked once, its label included); the
        producer checks it no more."""
        for source in (self._start, *(fn() for fn in self._seeds)):
            for item in source:
                yield self.admit(item if isinstance(item, Request) else Request(str(item)))

    def admit(self, request: Request) -> Request:
        """`request` as it enters the crawl, checked once: its fields
        (InvalidRequestError naming the first bad one) and its label (UnknownLabelError
        unless it has a route); frozen (its data and headers its own copies, what its maker
        does to them later changes nothing) and rendered when its route renders."""
        request = checked(request)
        self.check(request)
        return self.rendered(request)

    def renders(self, label: str | None) -> bool:
        """Whether the route of `label` renders its pages."""
        route = self._route(label)
        return route is not None and route.render is not None

    def rendered(self, request: Request) -> Request:
        """`request`, rendered when its route renders."""
        if request.render or not self.renders(request.label):
            return request
        return replace(request, render=True)

    def render_of(self, label: str | None) -> Render:
        """How a rendered request of `label` is rendered: its route's page actions, or
        none but the load."""
        route = self._route(label)
        return route.render if route is not None and route.render is not None \
            else DEFAULT_RENDER

    def knows(self, label: str | None) -> bool:
        """Whether a request with `label` has a route."""
        return label in self.routes or (self.catch_all and None in self.routes)

    def check(self, request: Request) -> None:
        """UnknownLabelError unless `request`'s label has a route."""
        if not self.knows(request.label):
            raise UnknownLabelError(self.unknown(request.label))

    def unknown(self, label: str | None) -> str:
        """Why a request with `label` can't be parsed, and what to do."""
        labels = ", ".join(repr(k) for k in self.routes if k is not None) or "none"
        if label is None:
            return (f"spider {self.name!r} has no default route for requests without a "
                    f"label (its labels: {labels}); add @spider.route()")
        return (f"spider {self.name!r} has no route for label {label!r} (its labels: "
                f"{labels}); add @spider.route({label!r}) or fix the label")

    def route_for(self, label: str | None) -> Route:
        """The route of `label`; UnknownLabelError when it has none."""
        route = self._route(label)
        if route is None:
            raise UnknownLabelError(self.unknown(label))
        return route

    def _route(self, label: str | None) -> Route | None:
        route = self.routes.get(label)
        if route is None and self.catch_all:
            return self.routes.get(None)
        return route
