"""Spiders in one process: selectors, routes by label, follow and emit, loading.

The spider's fleet behaviour (a child's label and data reaching its route on another
consumer process, an unknown label ending dead) is in test_spider_process.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from ada_url import join_url
from hypothesis import given, settings
from hypothesis import strategies as st

import crawlq
from common.errors import ConfigError, InvalidRequestError, UnknownLabelError
from common.http.results import FetchResult
from common.spider import Response, Spider, load_spider, run_route
from common.tasks.items import KEY_SEP, Item
from common.tasks.request import Request
from consumer.notices import where_raised

PAGE = b"""<!doctype html><html><head><title>Shelf</title></head><body>
<h1 class="t">Books <b>&amp; more</b></h1>
<ul>
  <li class="book"><a class="detail" href="/book/1">One</a><span class="price">3.50</span></li>
  <li class="book"><a class="detail" href="book/2">Two</a><span class="price">4</span></li>
  <li class="book"><a class="detail" href="https://other.example/3">Three</a></li>
  <li><a class="detail" href="javascript:void(0)">no</a></li>
</ul>
<a class="next" href="?page=2">next</a>
</body></html>"""


def result(body: bytes = PAGE, url: str = "http://shop.test/shelf/", *,
           ctype: str = "text/html; charset=utf-8") -> FetchResult:
    return FetchResult(url=url, final_url=url, status=200, headers={"content-type": ctype},
                       raw_headers=(), body=body, elapsed=0.01, redirects=(),
                       http_version="HTTP/1.1")


def test_css_and_xpath_select_text_attributes_and_elements() -> None:
    r = Response(result())
    assert r.css("h1.t::text").get() == "Books "
    assert r.css("h1.t *::text").getall() == ["Books ", "& more"]  # descendants too
    assert r.css("a.detail::attr(href)").getall() == [
        "/book/1", "book/2", "https://other.example/3", "javascript:void(0)"]
    assert r.xpath("//li[@class='book']/span/text()").getall() == ["3.50", "4"]
    assert r.css("li.book")[1].css(".price::text").get() == "4"
    assert r.css("nothing::text").get() is None
    assert r.css("nothing::text").get(default="x") == "x"
    assert r.xpath("//a[@class=$c]/@href", c="next").get() == "?page=2"
    assert r.urljoin("book/2") == "http://shop.test/shelf/book/2"
    assert r.selector is r.selector  # built once per response


def test_the_body_is_decoded_by_its_charset_and_json_parsed() -> None:
    latin = Response(result("<p>caf\xe9</p>".encode("latin-1"),
                            ctype="text/html; charset=ISO-8859-1"))
    assert latin.css("p::text").get() == "café"
    assert Response(result(b'{"a": [1, 2]}', ctype="application/json")).json() == {"a": [1, 2]}
    with pytest.raises(ValueError):
        Response(result(b"<html>")).json()


def test_a_base_href_is_what_links_resolve_against() -> None:
    page = b'<html><head><base href="http://cdn.test/x/"></head><a href="y">y</a></html>'
    assert Response(result(page)).urljoin("y") == "http://cdn.test/x/y"


@settings(max_examples=400, deadline=None)
@given(href=st.one_of(st.text(max_size=12).map(lambda t: "#" + t),
                      st.text(alphabet="#ab/.?%\" <>`\t\xe9 ", max_size=10)),
       base=st.sampled_from(["http://shop.test/a/b?q=1#top", "http://shop.test",
                             "https://x.test/%7Ey/", "mailto:me@x.test"]))
def test_urljoin_agrees_with_the_url_standard_on_every_href(href: str, base: str) -> None:
    """Fragment-only hrefs are joined without a parse: the result is ada's all the same
    (a character the fragment's encode set holds takes the parse), asked twice."""
    response = Response(result(url=base))
    try:
        expected = join_url(base, href.strip())
    except ValueError:
        expected = href
    assert response.urljoin(href) == expected
    assert response.urljoin(href) == expected  # from the page's cache


def shop_spider() -> Spider:
    spider = Spider("shop", item_key="sku")

    @spider.route()
    async def shelf(response: Response, ctx: Any) -> None:
        ctx.follow(css="a.detail::attr(href)", label="book", data={"shelf": "s1"})
        ctx.follow(css="a.next", label=None, priority=3)

    @spider.route("book", item_key=("shelf", "n"))
    async def book(response: Response, ctx: Any) -> None:
        ctx.emit({"shelf": ctx.request.data["shelf"], "n": 1, "title": "x"})
        ctx.emit(Item("own-key", {"title": "y"}))

    @spider.route("plain", item_key=())
    def plain(response: Response, ctx: Any) -> list[Any]:
        return [{"a": 1}, Request("http://shop.test/b", label="book")]

    return spider


async def saved(value: Any) -> None:
    return None


async def test_follow_by_selector_carries_label_data_and_priority() -> None:
    spider = shop_spider()
    ctx = await run_route(spider, result(), Request("http://shop.test/shelf/"), worker="w",
                          checkpoint=None, save=saved)
    assert [(r.url, r.label, dict(r.data)) for r in ctx.requests[:3]] == [
        ("http://shop.test/book/1", "book", {"shelf": "s1"}),
        ("http://shop.test/shelf/book/2", "book", {"shelf": "s1"}),
        ("https://other.example/3", "book", {"shelf": "s1"}),
    ]  # javascript: skipped
    assert (ctx.requests[3].url, ctx.requests[3].priority) == ("http://shop.test/shelf/?page=2", 3)
    assert len(ctx.requests) == 4 and ctx.items == []


async def test_emit_keys_items_by_the_routes_fields_or_leaves_them_to_the_sink() -> None:
    spider = shop_spider()
    ctx = await run_route(spider, result(), Request("http://shop.test/b", label="book",
                                                    data={"shelf": "s9"}),
                          worker="w", checkpoint=None, save=saved)
    assert ctx.items == [Item(f"s9{KEY_SEP}1", {"shelf": "s9", "n": 1, "title": "x"}),
                         Item("own-key", {"title": "y"})]
    ctx = await run_route(spider, result(), Request("http://shop.test/p", label="plain"),
                          worker="w", checkpoint=None, save=saved)
    assert ctx.items == [{"a": 1}]  # no key fields: keyed <unique key>#<index> by the sink
    assert [r.label for r in ctx.requests] == ["book"]


async def test_a_routes_item_type_goes_with_each_item_keyed_or_not() -> None:
    spider = Spider("typed", item_key="sku")

    @spider.route(item_type="product")
    def product(response: Response, ctx: Any) -> None:
        ctx.emit({"sku": "p1"})
        ctx.emit(Item("own", {"x": 1}))
        ctx.emit(Item("other", {"x": 2}, "offer"))  # an Item's own type is kept

    @spider.route("review", item_key=(), item_type="review")
    def review(response: Response, ctx: Any) -> None:
        ctx.emit({"stars": 5})

    ctx = await run_route(spider, result(), Request("http://shop.test/p"), worker="w",
                          checkpoint=None, save=saved)
    assert ctx.items == [Item("p1", {"sku": "p1"}, "product"), Item("own", {"x": 1}, "product"),
                         Item("other", {"x": 2}, "offer")]
    ctx = await run_route(spider, result(), Request("http://shop.test/r", label="review"),
                          worker="w", checkpoint=None, save=saved)
    assert ctx.items == [Item("", {"stars": 5}, "review")]  # keyed by the sink
    with pytest.raises(ValueError, match="item_type 'Bad Name' must be"):
        spider.route("x", item_type="Bad Name")


def test_a_spiders_repr_names_its_default_route() -> None:
    spider = Spider("one")
    assert repr(spider) == "Spider('one', routes: none)"
    spider.route()(lambda response, ctx: None)
    assert repr(spider) == "Spider('one', routes: the default route)"
    spider.route("list")(lambda response, ctx: None)
    assert repr(spider) == "Spider('one', routes: the default route, 'list')"


async def test_a_missing_key_field_fails_the_route() -> None:
    spider = Spider("s", item_key="sku")

    @spider.route()
    async def route(response: Response, ctx: Any) -> None:
        ctx.emit({"name": "no sku"})

    with pytest.raises(ValueError, match="sku"):
        await run_route(spider, result(), Request("http://shop.test/"), worker="w",
                        checkpoint=None, save=saved)


async def test_an_unknown_label_is_refused_when_followed_and_when_routed() -> None:
    spider = shop_spider()
    with pytest.raises(UnknownLabelError, match="no route for label 'nope'"):
        await run_route(spider, result(), Request("http://shop.test/", label="nope"),
                        worker="w", checkpoint=None, save=saved)

    @spider.route("bad")
    async def bad(response: Response, ctx: Any) -> None:
        ctx.follow("/x", label="typo")

    with pytest.raises(UnknownLabelError, match="'typo'"):
        await run_route(spider, result(), Request("http://shop.test/", label="bad"),
                        worker="w", checkpoint=None, save=saved)
    assert spider.knows("book") and not spider.knows("typo")
    no_default = Spider("n")
    assert "no default route" in no_default.unknown(None)


async def test_an_async_generator_route_yields_items_and_requests() -> None:
    spider = Spider("gen")

    @spider.route()
    async def route(response: Response, ctx: Any) -> Any:
        yield {"title": response.css("title::text").get()}
        yield Request("http://shop.test/next")
        await asyncio.sleep(0)

    ctx = await run_route(spider, result(), Request("http://shop.test/"), worker="w",
                          checkpoint=None, save=saved)
    assert ctx.items == [{"title": "Shelf"}]
    assert [r.url for r in ctx.requests] == ["http://shop.test/next"]


async def test_checkpoints_are_the_tasks() -> None:
    spider = Spider("cp")
    stored: list[Any] = []

    async def save(value: Any) -> None:
        stored.append(value)

    @spider.route()
    async def route(response: Response, ctx: Any) -> None:
        assert ctx.checkpoint == {"page": 1}
        await ctx.save_checkpoint({"page": 2})
        assert ctx.checkpoint == {"page": 2}

    await run_route(spider, result(), Request("http://shop.test/"), worker="w",
                    checkpoint={"page": 1}, save=save)
    assert stored == [{"page": 2}]


def test_start_yields_checked_requests() -> None:
    spider = Spider("seeds", start=["http://a.test/", Request("http://b.test/", label="x")])

    @spider.route()
    async def home(response: Response, ctx: Any) -> None: ...

    @spider.route("x")
    async def x(response: Response, ctx: Any) -> None: ...

    @spider.seeds
    def more() -> list[Any]:
        return ["http://c.test/"]

    assert [(r.url, r.label) for r in spider.start()] == [
        ("http://a.test/", None), ("http://b.test/", "x"), ("http://c.test/", None)]
    with pytest.raises(UnknownLabelError):
        list(Spider("s", start=[Request("http://a.test/", label="y")]).start())
    with pytest.raises(InvalidRequestError):
        spider.route("not a label!")
    with pytest.raises(ValueError, match="already"):
        spider.route("x")(x)


SPIDER_FILE = '''
from crawlq import Spider
one = Spider("one")
@one.route()
async def home(response, ctx):
    pass
'''


def test_a_spider_is_found_by_module_file_or_file_and_name(tmp_path: Path) -> None:
    path = tmp_path / "my_spider.py"
    path.write_text(SPIDER_FILE)
    assert load_spider(str(path)).name == "one"
    assert load_spider(f"{path}:one").name == "one"
    two = tmp_path / "two.py"
    two.write_text(SPIDER_FILE + "\nother = Spider('other')\n")
    with pytest.raises(ConfigError, match=r"exactly one Spider.*found: one, other"):
        load_spider(str(two))
    assert load_spider(f"{two}:other").name == "other"
    with pytest.raises(ConfigError, match=r"'home' in .* is function, not a Spider"):
        load_spider(f"{two}:home")
    with pytest.raises(ConfigError, match="no such file"):
        load_spider(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="RuntimeError: boom"):
        load_spider(str(broken))
    with pytest.raises(ConfigError, match="cannot import"):
        load_spider("no_such_module_here:spider")
    with pytest.raises(ConfigError, match="name the spider"):
        load_spider("json")


def test_the_facade_exports_what_a_spider_file_needs() -> None:
    assert {"Spider", "Request", "Item", "Response", "Context"} <= set(crawlq.__all__)
    assert crawlq.Spider is Spider and crawlq.Request is Request and crawlq.Item is Item


async def test_a_plain_link_is_followed_as_its_url_and_needs_a_default_route() -> None:
    spider = Spider("plain")

    @spider.route()
    async def home(response: Response, ctx: Any) -> None:
        ctx.follow(css="li.book a::attr(href)")

    ctx = await run_route(spider, result(), Request("http://shop.test/shelf/"), worker="w",
                          checkpoint=None, save=saved)
    assert ctx.requests == ["http://shop.test/book/1", "http://shop.test/shelf/book/2",
                            "https://other.example/3"]  # a GET with no label: its URL
    only_labels = Spider("labels")

    @only_labels.route("list")
    async def listing(response: Response, ctx: Any) -> None:
        ctx.follow("/x")

    with pytest.raises(UnknownLabelError, match="no default route"):
        await run_route(only_labels, result(), Request("http://shop.test/", label="list"),
                        worker="w", checkpoint=None, save=saved)


async def test_a_route_parses_2xx_pages_only() -> None:
    spider = shop_spider()
    for status in (404, 410, 304):
        missing = FetchResult(url="http://shop.test/b", final_url="http://shop.test/b",
                              status=status, headers={}, raw_headers=(), body=b"gone",
                              elapsed=0.0, redirects=(), http_version="HTTP/1.1")
        ctx = await run_route(spider, missing, Request("http://shop.test/b", label="book",
                                                       data={"shelf": "s"}),
                              worker="w", checkpoint=None, save=saved)
        assert (ctx.items, ctx.requests) == ([], [])
    with pytest.raises(UnknownLabelError):  # a label with no route is refused all the same
        await run_route(spider, missing, Request("http://shop.test/b", label="nope"),
                        worker="w", checkpoint=None, save=saved)


async def test_follow_checks_once_and_freezes_what_it_took() -> None:
    """What follow took can't be changed (or broken) by what the route does to its dicts
    afterwards: the reason the consumer never checks it again."""
    spider = shop_spider()
    data: dict[str, Any] = {"shelf": "s", "tags": ["a"]}

    @spider.route("later")
    async def later(response: Response, ctx: Any) -> None:
        ctx.follow(Request("http://shop.test/b/9", label="book", data=data))
        ctx.follow(css="li.book a::attr(href)", label="book", data=data)
        data["tags"].append({1, 2})  # not JSON: it would break the task at the flush
        data["shelf"] = "changed"

    ctx = await run_route(spider, result(), Request("http://shop.test/", label="later"),
                          worker="w", checkpoint=None, save=saved)
    assert [(r.url, r.data) for r in ctx.requests] == [  # type: ignore[union-attr]
        ("http://shop.test/b/9", {"shelf": "s", "tags": ["a"]}),
        ("http://shop.test/book/1", {"shelf": "s", "tags": ["a"]}),
        ("http://shop.test/shelf/book/2", {"shelf": "s", "tags": ["a"]}),
        ("https://other.example/3", {"shelf": "s", "tags": ["a"]})]


def _yielding_spider(catch: bool) -> Spider:
    spider = Spider("yields")

    @spider.route()
    async def home(response: Response, ctx: Any) -> Any:
        try:
            yield Request("http://shop.test/x", data={"when": {1, 2}})  # BAD_YIELD
        except InvalidRequestError:
            if not catch:
                raise
            yield {"caught": True}
    return spider


BAD_YIELD = next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                 if line.endswith("# BAD_YIELD"))


async def test_a_bad_request_a_route_yields_is_raised_at_its_yield() -> None:
    """A Request is checked when followed, not when made: one a route yields is thrown
    back in at its yield, so the route error names the spider's line."""
    with pytest.raises(InvalidRequestError, match=r"data\['when'\] is a set") as raised:
        await run_route(_yielding_spider(catch=False), result(), Request("http://shop.test/"),
                        worker="w", checkpoint=None, save=saved)
    assert where_raised(raised.value, {__file__})[1:] == (BAD_YIELD, "home")
    ctx = await run_route(_yielding_spider(catch=True), result(),
                          Request("http://shop.test/"), worker="w", checkpoint=None,
                          save=saved)
    assert (ctx.items, ctx.requests) == ([{"caught": True}], [])


async def test_a_bad_request_a_route_returns_names_the_route() -> None:
    """A Request a route returns is checked after the route's frame is gone: the route
    error names the file and the line of the route's def."""
    spider = Spider("returns")

    @spider.route()
    def home(response: Response, ctx: Any) -> Any:
        return [{"ok": 1}, Request("http://shop.test/x", data={"when": {1, 2}})]

    with pytest.raises(InvalidRequestError, match=r"data\['when'\] is a set") as raised:
        await run_route(spider, result(), Request("http://shop.test/"), worker="w",
                        checkpoint=None, save=saved)
    line = home.__code__.co_firstlineno
    assert where_raised(raised.value, {__file__}) == (
        where_raised(raised.value)[0], line, "home")
    assert where_raised(raised.value)[0].endswith("test_spider.py")
