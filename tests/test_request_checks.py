"""A request is checked once, where it enters the crawl (issue 48): a route's follow, a
spider's start, the producer's reader of request lines. Counted on real runs (a consumer
on a real Redis and a local site; the producer's pipeline into a real queue), with every
name that a field check of a request is bound to, in every module loaded, counting its
calls: whichever way a check is reached, it is counted.

Counted apart (``<check>@decode``): decoding a leased entry (``common.tasks.task``), which
guards what Redis holds (MalformedTaskError) once per lease, not a request entering the
crawl.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, records
from support.routes import serve

import common.queue.enqueue as enqueue_module
import common.tasks.request as request_module
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.spider import load_spider
from common.tasks.request import Request
from common.urls.canonical import canonicalize
from producer.run import TaskTemplate, produce
from producer.sources import Chunk
from producer.spiders import spider_chunks
from producer.summary import Summary

#: Every function that checks a request's fields (a whole request's, or one field's).
CHECKS: dict[str, Callable[..., Any]] = {
    "request": request_module._checked_data_json,  # checked(), check_request()
    "new_task": enqueue_module.check_new_task,  # a NewTask's at enqueue
    "method": request_module.check_method,  # every check of a whole request calls it
    "session": request_module.check_session,
    "data": request_module._data_json,  # check_data() too
}


def count_checks(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the calls of each of `CHECKS` from now on, by every name it is bound to."""
    counts: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kw)
        return call

    names = {id(fn): name for name, fn in CHECKS.items()}
    for module in list(sys.modules.values()):
        decode = "@decode" if getattr(module, "__name__", "") == "common.tasks.task" else ""
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if id(value) in names and callable(value):
                monkeypatch.setattr(module, attr,
                                    counted(names[id(value)] + decode, value))
    return counts


def entry_checks(counts: Counter[str]) -> dict[str, int]:
    """The checks of requests entering the crawl: `counts` but the decoder's."""
    return {name: n for name, n in counts.items() if not name.endswith("@decode")}


def task_of(request: Request) -> NewTask:
    url = canonicalize(request.url)
    assert isinstance(url, str), url
    return NewTask.from_request(request, url)


#: A seed route that follows 4 Requests one by one and 3 links with one label and data
#: (checked once for the three): 5 checks, 7 tasks.
SPIDER = '''
from crawlq import Request, Spider

spider = Spider("counted")

@spider.route()
async def seed(response, ctx):
    for n in range(4):
        ctx.follow(Request.json(response.url + "api", {"n": n}, label="item",
                                data={"n": n}, headers={"X-N": str(n)}))
    ctx.follow(css="a::attr(href)", label="item", data={"n": -1})

@spider.route("item")
async def item(response, ctx):
    ctx.emit({"n": ctx.request.data["n"], "method": ctx.request.method})
'''


async def seed_page(request: web.Request) -> web.Response:
    return web.Response(text='<html><body><a href="/l/1">1</a><a href="/l/2">2</a>'
                             '<a href="/l/3">3</a></body></html>', content_type="text/html")


async def answer(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def test_a_followed_request_is_checked_once_on_its_way_to_redis(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spider = tmp_path / "counted.py"
    spider.write_text(SPIDER)
    async with serve({"/": seed_page, "/api": answer, "/l/{i}": answer}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([task_of(Request(site.url("/")))])
        counts = count_checks(monkeypatch)
        assert await consume(redis_url, crawl_name, tmp_path / "out", "--spider",
                             str(spider)) == 0
    assert (await q.stats()).dead == 0
    items = sorted((i["n"], i["method"]) for r in records(tmp_path / "out")
                   for i in r["items"])
    assert items == [(-1, "GET")] * 3 + [(n, "POST") for n in range(4)]
    # One check per followed Request, one for the three links: none at the intake,
    # from_request or enqueue, none when a leased task is made a Request for its route.
    assert entry_checks(counts) == {"request": 5, "method": 5, "session": 5, "data": 5}
    assert counts["method@decode"] >= 8  # each lease's entry: the patch reached its calls


async def test_a_handlers_requests_are_checked_once_too(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A --handler is a spider's default route: its Requests go through its follow."""
    async with serve({"/": answer, "/api": answer}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([task_of(Request(site.url("/"), data={
            "api": site.url("/api"), "category": "books"}))])
        counts = count_checks(monkeypatch)
        assert await consume(redis_url, crawl_name, tmp_path / "out", "--handler",
                             "consumer_handlers:labelled") == 0
    assert (await q.stats()).dead == 0
    items = [i for r in records(tmp_path / "out") for i in r["items"]]
    assert sorted(i["data"]["page"] for i in items if i.get("label") == "api") == [1, 2]
    assert entry_checks(counts) == {"request": 2, "method": 2, "session": 2, "data": 2}


async def test_the_producer_checks_each_request_once(
        redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A line of requests is checked by the producer's reader; a spider's start request
    by `Spider.start`; neither again by `from_request` or the enqueue."""
    spider_file = tmp_path / "starts.py"
    spider_file.write_text(
        "from crawlq import Request, Spider\n"
        "spider = Spider('starts', start=[Request(f'http://s.test/{n}', label='item',"
        " data={'n': n}) for n in range(3)])\n"
        "spider.route('item')(lambda response, ctx: None)\n")
    spider = load_spider(str(spider_file))
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
    counts = count_checks(monkeypatch)

    async def lines() -> AsyncGenerator[Chunk, None]:
        yield Chunk("requests", 1, [f'{{"url": "http://r.test/{n}", "json": {{"n": {n}}},'
                                    f' "label": "item", "data": {{"n": {n}}}}}'
                                    for n in range(4)], requests=True)
    summary = await produce([lines(), spider_chunks(spider)], queue=q,
                            summary=Summary(crawl_name), template=TaskTemplate(),
                            known_labels=frozenset({"item"}))
    assert (summary.read, summary.enqueued) == (7, 7)
    assert entry_checks(counts) == {"request": 7, "method": 7, "session": 7, "data": 7}
