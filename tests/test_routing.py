"""A --handler is a spider with one default route (consumer.handlers.handler_spider), and
the consumer's Router wraps one spider (consumer/routing.py): in one process.

Through real consumers: tests/test_spider_process.py (a handler beside a spider, an
unknown label ending dead), tests/test_request_checks.py (a handler's Requests checked
once), tests/test_consumer.py (the documented handlers).
"""

from __future__ import annotations

from typing import Any

import pytest

from common.errors import InvalidRequestError, UnknownLabelError
from common.http.results import FetchResult
from common.spider import Response, Spider
from common.tasks.request import Request
from common.tasks.task import Task
from consumer.handlers import HandlerContext, HandlerResult, LeaseLostError
from consumer.notices import where_raised
from consumer.routing import Router

TID = "0" * 32
PAGE = b'<html><body><a href="/a">a</a></body></html>'


def result(url: str = "http://shop.test/dir/") -> FetchResult:
    return FetchResult(url=url, final_url=url, status=200,
                       headers={"content-type": "text/html"}, raw_headers=(), body=PAGE,
                       elapsed=0.01, redirects=(), http_version="HTTP/1.1")


def context(task: Task, saved: list[Any], *, lost: bool = False) -> HandlerContext:
    async def save(value: Any) -> bool:
        saved.append(value)
        return not lost
    return HandlerContext(task=task, worker="w-1", _save=save)


SEEN: list[tuple[str | None, str, int, Any]] = []


async def handler(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
    """Says what it got, saves a checkpoint, returns a relative URL, a Request and an
    item that is no dict (a handler's items are any JSON value)."""
    SEEN.append((ctx.task.label, ctx.worker, ctx.max_links, ctx.checkpoint))
    await ctx.save_checkpoint({"at": 1})
    return HandlerResult(items=["plain"], urls=[
        "b", Request("http://shop.test/api", "POST", body=b"{}", label=ctx.task.label)])


async def test_a_handler_alone_is_a_spider_whose_default_route_takes_every_label() -> None:
    router = Router.of(None, handler, max_links=7)
    assert router is not None and router.spider.catch_all
    assert router.files == {__file__}  # where its errors are placed
    SEEN.clear()
    saved: list[Any] = []
    for label in (None, "anything"):
        task = Task(id=TID, url="http://shop.test/dir/", label=label, checkpoint={"at": 0})
        assert router.knows(task) and router.blocked(task).status == ()
        done = await router(result(), context(task, saved))
        assert done.items == ["plain"]
        assert [u if isinstance(u, str) else (u.url, u.method, u.label)
                for u in done.urls] == [
            "http://shop.test/dir/b", ("http://shop.test/api", "POST", label)]
    assert SEEN == [(None, "w-1", 7, {"at": 0}), ("anything", "w-1", 7, {"at": 0})]
    assert saved == [{"at": 1}] * 2
    task = Task(id=TID, url="http://shop.test/dir/")
    with pytest.raises(LeaseLostError):
        await router(result(), context(task, [], lost=True))


async def test_beside_a_spider_a_handler_is_its_default_route() -> None:
    spider = Spider("s")

    @spider.route("api")
    async def api(response: Response, ctx: Any) -> None:
        ctx.emit({"api": True})

    router = Router.of(spider, handler)
    assert router is not None and not router.spider.catch_all
    assert list(spider.routes) == ["api"]  # the spider loaded is left as it was
    assert list(router.spider.routes) == ["api", None]
    unlabelled = Task(id=TID, url="http://shop.test/dir/")
    ghost = Task(id=TID, url="http://shop.test/dir/", label="ghost")
    assert router.knows(unlabelled) and not router.knows(ghost)
    assert "no route for label 'ghost'" in router.unknown(ghost)
    done = await router(result(), context(unlabelled, []))
    assert len(done.urls) == 2
    labelled = Task(id=TID, url="http://shop.test/dir/", label="api")
    assert (await router(result(), context(labelled, []))).items == [{"api": True}]
    with pytest.raises(ValueError, match="default route already"):
        Router.of(router.spider, handler)


async def test_a_handlers_bad_request_or_unknown_label_fails_its_task() -> None:
    async def bad(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
        data: dict[str, Any] = {"ok": 1}
        request = Request("http://shop.test/api", "POST", data=data)
        data["when"] = {1, 2}  # changed after it was made: checked where it is followed
        return HandlerResult(urls=[request])

    async def ghost(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
        return HandlerResult(urls=[Request("http://shop.test/x", label="ghost")])

    task = Task(id=TID, url="http://shop.test/dir/")
    router = Router.of(None, bad)
    assert router is not None
    with pytest.raises(InvalidRequestError, match=r"data\['when'\] is a set") as raised:
        await router(result(), context(task, []))
    # its frame is gone when its Request is checked: the place is its def's line
    code = bad.__code__
    assert where_raised(raised.value, router.files) == (
        where_raised(raised.value)[0], code.co_firstlineno, "bad")
    assert router.files == {__file__}
    spider = Spider("s")
    spider.route("api")(lambda response, ctx: None)
    router = Router.of(spider, ghost)
    assert router is not None
    with pytest.raises(UnknownLabelError, match="no route for label 'ghost'"):
        await router(result(), context(task, []))
    alone = Router.of(None, ghost)  # alone, any label goes: the handler's own to read
    assert alone is not None
    assert len((await alone(result(), context(task, []))).urls) == 1


async def test_a_handler_like_any_route_is_handed_2xx_responses_only() -> None:
    """A 404 or a final 3xx is done as its outcome says, unparsed (issue 48: a handler is
    a route; Scrapy's callbacks get 2xx by default)."""
    calls: list[int] = []

    async def seen(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
        calls.append(response.status)
        return HandlerResult(items=[{"ok": 1}], urls=["/next"])

    router = Router.of(None, seen)
    assert router is not None
    task = Task(id=TID, url="http://shop.test/dir/")
    for status in (404, 301, 200):
        page = result()
        page.status = status
        done = await router(page, context(task, []))
        assert (len(done.items), len(done.urls)) == ((1, 1) if status == 200 else (0, 0))
    assert calls == [200]
