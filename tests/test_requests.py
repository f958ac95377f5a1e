"""Requests (common/tasks/request.py) through the queue: their identity, their entry, their
checks at enqueue, against a real redis-server."""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import consumer_handlers
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, consumer_args
from support.handover import hand_over_children
from support.live import snapshot
from support.routes import serve

from common.errors import FetchError, InvalidRequestError, MalformedTaskError
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.observability.metrics import Metrics
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.spider import Spider
from common.tasks.request import (
    MAX_BODY_BYTES,
    Request,
    check_request,
    checked,
    request_from_dict,
)
from common.tasks.task import Task, decode_entry, encode_entry, expand_entry
from common.urls.canonical import canonicalize, fingerprint, task_id
from consumer.intake import LinkIntake
from consumer.live import Live
from producer.cli import main_async
from producer.run import TaskTemplate
from producer.run import produce as produce_tasks
from producer.sources import Chunk
from producer.summary import Summary

ROOT = Path(__file__).resolve().parents[1]
API = "http://api.test/search"
TID = "0" * 32


def task_of(request: Request, **kw: Any) -> NewTask:
    url = canonicalize(request.url)
    assert isinstance(url, str), url
    return NewTask.from_request(request, url, **kw)


async def open_queue(client: aioredis.Redis, crawl: str) -> LeasingQueue:
    return await LeasingQueue.open(client, crawl, CrawlSettings())


async def pending_entries(client: aioredis.Redis, q: LeasingQueue, *,
                          full: bool = True) -> list[bytes]:
    """Every entry the crawl's host queues hold: full (as a lease has it), or as stored."""
    entries: list[bytes] = []
    for pk in q.partitions:
        for host in await client.zrange(pk.queued, 0, -1):
            held = [*await client.lrange(pk.host_queue(host.decode()), 0, -1),
                    *await client.zrange(pk.host_prio(host.decode()), 0, -1)]
            entries += [expand_entry(e, host.decode()) if full else e for e in held]
    return entries


# -- identity --------------------------------------------------------------------------


def test_a_get_keeps_the_canonical_url_as_its_key_and_fingerprint() -> None:
    request = Request("HTTP://Example.test/a?b=1")
    assert request.key() == "http://example.test/a?b=1"
    t = task_of(request)
    assert t.fp == fingerprint("http://example.test/a?b=1")
    assert task_of(Request("http://example.test/a?b=1", method="HEAD")).fp == t.fp


def test_other_methods_key_by_method_url_and_body() -> None:
    a, b = Request.json(API, {"page": 1}), Request.json(API, {"page": 2})
    assert a.key() != b.key() and a.key() == Request.json(API, {"page": 1}).key()
    assert a.key().startswith(f"POST {API} ")
    assert Request(API, "PUT", body=a.body).key() != a.key()
    assert Request(API, "POST", unique_key="page-1").key() == "page-1"


async def test_two_post_bodies_to_one_url_are_two_tasks_and_one_body_twice_is_one(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    page1, page2 = Request.json(API, {"page": 1}), Request.json(API, {"page": 2})
    first = await q.enqueue([task_of(page1), task_of(page2), task_of(page1)])
    assert (first.enqueued, first.duplicates) == (2, 1)
    again = await q.enqueue([task_of(Request.json(API, {"page": 2})), task_of(Request(API))])
    assert (again.enqueued, again.duplicates) == (1, 1)  # the GET is a task of its own
    leases = await q.lease("w1", 10, 30_000)
    got = sorted((t.method, t.body) for t in (lease.task for lease in leases))
    assert got == [("GET", None), ("POST", b'{"page":1}'), ("POST", b'{"page":2}')]
    assert {lease.task.id for lease in leases} == {
        task_id(fingerprint(r.key())) for r in (page1, page2, Request(API))}


# -- the entry -------------------------------------------------------------------------


async def test_a_plain_get_entry_is_byte_identical_to_before(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    url = "http://plain.test/page"
    await q.enqueue([task_of(Request(url))])
    assert await pending_entries(redis_client, q) == [
        (task_id(fingerprint(url)) + url).encode()]
    assert await pending_entries(redis_client, q, full=False) == [fingerprint(url) + b":/page"]
    assert encode_entry(TID, url, method="GET", body=None, label=None, data={},
                        unique_key=None) == TID + url


def test_an_entry_carries_method_body_label_data_and_unique_key() -> None:
    entry = encode_entry(TID, API, method="POST", body=b'{"q":"\xc3\xa9"}', label="api",
                         data={"category": "books", "n": [1, 2]}, unique_key="search-1")
    assert entry == (TID + API + ' {"M":"POST","b":"{\\"q\\":\\"é\\"}","l":"api",'
                     '"u":{"category":"books","n":[1,2]},"k":"search-1"}')
    task = decode_entry(entry)
    assert (task.method, task.body, task.label, task.data, task.unique_key) == (
        "POST", b'{"q":"\xc3\xa9"}', "api", {"category": "books", "n": [1, 2]}, "search-1")
    assert task.key() == "search-1"
    assert task.as_request() == Request(API, "POST", {}, b'{"q":"\xc3\xa9"}', "api",
                                        {"category": "books", "n": [1, 2]}, 0, "search-1")
    binary = decode_entry(encode_entry(TID, API, method="PUT", body=b"\xff\x00"))
    assert binary.body == b"\xff\x00"
    assert binary.key() == Request(API, "PUT", body=b"\xff\x00").key()


@pytest.mark.parametrize(("extra", "message"), [
    ('{"M":"BREW"}', "method 'BREW'"),
    ('{"l":"no spaces"}', "label"),
    ('{"u":[1]}', "data must be a JSON object"),
    ('{"B":"not base64!"}', "base64"),
    ('{"b":1}', "body must be a string"),
])
def test_a_bad_request_field_in_an_entry_is_malformed(extra: str, message: str) -> None:
    with pytest.raises(MalformedTaskError, match=message):
        decode_entry(f"{TID}{API} {extra}")


# -- checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Request(API, "BREW"), "method 'BREW' is not one of GET, HEAD, POST"),
    (lambda: Request(API, data={"when": {1, 2}}), r"data\['when'\] is a set, not JSON"),
    (lambda: Request(API, data={"x": float("nan")}), "JSON can't hold"),
    (lambda: Request(API, data={1: "a"}),  # type: ignore[dict-item]
     "JSON object keys are strings"),
    (lambda: Request(API, data=["a"]), "data must be a JSON object"),  # type: ignore[arg-type]
    (lambda: Request(API, "POST", body=b"x" * (MAX_BODY_BYTES + 1)),
     f"body is {MAX_BODY_BYTES + 1} bytes, over the {MAX_BODY_BYTES}"),
    (lambda: Request(API, body=b"x"), "a GET carries no body"),
    (lambda: Request(API, label="two words"), "is not a route name"),
    (lambda: Request(API, headers={"Host": "x"}), "'Host' can't be set"),
    (lambda: Request(API, priority=-1), "priority must be an integer >= 0"),
])
def test_a_bad_request_is_refused_where_it_enters(make: Any, message: str) -> None:
    request = make()  # made, it is only normalized: checked where it enters a crawl
    with pytest.raises(InvalidRequestError, match=message):
        checked(request)
    spider = Spider("s")
    spider.route()(lambda response, ctx: None)
    spider.route("two")(lambda response, ctx: None)
    with pytest.raises(InvalidRequestError, match=message):
        spider.admit(request)  # a route's follow, a spider's start


def test_a_checked_request_is_frozen() -> None:
    data: dict[str, Any] = {"tags": ["a"]}
    headers = {"X-Page": "1"}
    request = checked(Request(API, "post", headers, b"{}", data=data))
    data["tags"].append({1, 2})  # what its maker does to its dicts later changes nothing
    headers["Host"] = "evil"
    assert (request.method, request.data, request.headers) == (
        "POST", {"tags": ["a"]}, {"X-Page": "1"})
    check_request(request)


async def test_a_bad_request_is_refused_at_enqueue_and_nothing_is_enqueued(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A NewTask built by hand has its request fields checked at enqueue; one made by
    `NewTask.from_request` was checked where its request entered, and is trusted."""
    q = await open_queue(redis_client, crawl_name)
    good = task_of(Request("http://fine.test/"))
    with pytest.raises(InvalidRequestError, match=r"data\['when'\] is a set"):
        await q.enqueue([good, NewTask(API, fingerprint(API), data={"when": {1, 2}})])
    with pytest.raises(InvalidRequestError, match="method 'BREW'"):
        await q.enqueue([good, NewTask(API, fingerprint(API), method="BREW")])
    with pytest.raises(InvalidRequestError, match="body must be bytes, at most"):
        await q.enqueue([good, NewTask(API, fingerprint(API), method="POST",
                                       body=b"x" * (MAX_BODY_BYTES + 1))])
    with pytest.raises(InvalidRequestError, match="is not a route name"):
        await q.enqueue([good, NewTask(API, fingerprint(API), label="two words")])
    assert await pending_entries(redis_client, q) == []
    assert (await q.stats()).pending == 0
    # Labels are the spider's business, not the queue's: any label is enqueued.
    assert (await q.enqueue([good, task_of(Request(API, label="api"))])).enqueued == 2


# -- the JSON form ---------------------------------------------------------------------


def test_a_request_from_its_json_form() -> None:
    r = request_from_dict({"url": API, "json": {"q": 1}, "label": "api",
                           "data": {"c": "x"}, "priority": 3})
    assert (r.method, r.body, r.headers, r.label, r.data, r.priority) == (
        "POST", b'{"q":1}', {"Content-Type": "application/json"}, "api", {"c": "x"}, 3)
    form = request_from_dict({"url": API, "form": {"a": "b c"}, "method": "put"})
    assert (form.method, form.body) == ("PUT", b"a=b+c")
    assert request_from_dict({"url": API, "body": "raw"}).method == "POST"
    assert request_from_dict({"url": API}).method == "GET"
    for bad, message in [([1], "must be a JSON object"), ({"url": API, "colour": 1},
                         "unknown fields colour"), ({"url": API, "body": "a", "json": 1},
                         "body twice"), ({}, "needs a \"url\"")]:
        with pytest.raises(InvalidRequestError, match=message):
            request_from_dict(bad)


# -- the fetch -------------------------------------------------------------------------

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)


def fetcher() -> Fetcher:
    return Fetcher(FetchSettings(allow_networks=LOOPBACK, total_timeout=10.0))


async def echo(request: web.Request) -> web.Response:
    return web.Response(text=f"{request.method} {(await request.read()).decode()}")


def redirecting(status: int, to: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": to})
    return handler


async def test_a_post_with_a_json_body_reaches_the_server_as_it_was_made() -> None:
    async with serve({"/api": echo}) as site, fetcher() as f:
        request = Request.json(site.url("/api?x=1"), {"q": "é", "page": 2},
                               headers={"X-Trace": "t1"})
        task = decode_entry(encode_entry(TID, request.url, method=request.method,
                                         body=request.body, headers=dict(request.headers)))
        result = await f.fetch(task.url, method=task.method, body=task.body,
                               headers=task.headers)
    assert result.status == 200 and result.body == b'POST {"q":"\xc3\xa9","page":2}'
    [seen] = site.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/api?x=1",
                                                  '{"q":"é","page":2}'.encode())
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["X-Trace"] == "t1"


@pytest.mark.parametrize(("status", "method", "then"), [
    (303, "POST", "GET"), (303, "PUT", "GET"), (303, "HEAD", "HEAD"),
    (301, "POST", "GET"), (302, "POST", "GET"), (302, "PUT", "PUT"), (301, "DELETE", "DELETE"),
    (307, "POST", "POST"), (308, "POST", "POST"), (307, "PATCH", "PATCH"),
])
async def test_a_redirect_keeps_or_drops_the_method_and_body_as_http_says(
        status: int, method: str, then: str) -> None:
    async with serve({"/from": redirecting(status, "/to"), "/to": echo}) as site, \
            fetcher() as f:
        body = None if method == "HEAD" else b'{"a":1}'
        result = await f.fetch(site.url("/from"), method=method, body=body,
                               headers={"Content-Type": "application/json"})
    assert result.status == 200 and result.final_url == site.url("/to")
    first, second = site.seen
    assert (first.method, first.body) == (method, body or b"")
    kept = then == method
    assert (second.method, second.body) == (then, body or b"" if kept else b"")
    assert ("Content-Type" in second.headers) == kept


async def test_validators_go_with_a_get_or_head_only() -> None:
    async with serve({"/api": echo}) as site, fetcher() as f:
        for method, body in (("GET", None), ("HEAD", None), ("POST", b"q=1")):
            await f.fetch(site.url("/api"), method=method, body=body,
                          conditional={"If-None-Match": '"v1"'})
    assert [(s.method, s.headers.get("If-None-Match")) for s in site.seen] == [
        ("GET", '"v1"'), ("HEAD", '"v1"'), ("POST", None)]


@pytest.mark.parametrize("status", [307, 308])
async def test_the_ssrf_guard_checks_a_posts_redirect_too(status: int) -> None:
    async with serve({"/from": redirecting(status, "http://10.255.255.1/x")}) as site, \
            fetcher() as f:
        with pytest.raises(FetchError) as info:
            await f.fetch(site.url("/from"), method="POST", body=b"secret=1")
    assert info.value.reason == "ssrf_blocked"
    assert [s.method for s in site.seen] == ["POST"]


# -- children through the crawl --------------------------------------------------------


async def start_consumer(redis_url: str, crawl: str, out: Path, worker: str,
                         ) -> asyncio.subprocess.Process:
    """A ``python -m consumer`` child running the `labelled` handler; logs beside `out`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    with (out.parent / f"{worker}.log").open("wb") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer", *consumer_args(redis_url, crawl, out),
            "--worker-id", worker, "--handler", "consumer_handlers:labelled",
            env=env, cwd=out.parent, stdin=asyncio.subprocess.DEVNULL, stdout=log,
            stderr=asyncio.subprocess.STDOUT)


async def test_a_childs_label_and_data_reach_its_handler_in_another_consumer_process(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with serve({"/list": echo}) as listing, serve({"/api": echo}) as api:
        q = await open_queue(redis_client, crawl_name)
        await q.enqueue([task_of(Request(listing.url("/list"), label=None,
                                         data={"api": api.url("/api"),
                                               "category": "books"}))])
        # The API's host is blocked: the first consumer can't take the children.
        await hand_over_children(
            q, api.url("/"), tmp_path, "seed",
            lambda worker: start_consumer(redis_url, crawl_name, out, worker))
    items = sorted((item for record in records_in(out) for item in record["items"]),
                   key=lambda item: item["data"]["page"])
    assert items == [{"label": "api", "data": {"page": n, "category": "books",
                                               "found_by": "w-parent"},
                      "method": "POST", "depth": 1, "body": f'{{"page":{n}}}',
                      "echo": f'POST {{"page":{n}}}', "worker": "w-child"} for n in (1, 2)]
    assert sorted((s.method, s.body, s.headers["Content-Type"]) for s in api.seen) == [
        ("POST", f'{{"page":{n}}}'.encode(), "application/json") for n in (1, 2)]


def records_in(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(out.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line]


# -- the producer's JSON lines ---------------------------------------------------------


async def produce(redis_url: str, crawl: str, *rest: str, stdin: Any = None
                  ) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = await main_async(["--redis-url", redis_url, "--crawl", crawl, "--cluster", "no",
                             "--progress", "off", "--json", *rest], out=out, stdin=stdin)
    return code, json.loads(out.getvalue())


REQUEST_LINES = [
    {"url": API, "json": {"page": 1}, "label": "api", "data": {"category": "books"}},
    {"url": API, "json": {"page": 2}, "label": "api", "priority": 5},
    {"url": API, "form": {"q": "a b"}, "method": "PUT"},
    {"url": "http://api.test/raw", "body": "x=1", "headers": {"X-Trace": "t"}},
    {"url": "http://api.test/plain"},
]


async def test_the_producer_enqueues_json_lines_of_requests_idempotently(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("# seeds of the API\n\n"
                    + "".join(json.dumps(r) + "\n" for r in REQUEST_LINES), encoding="utf-8")
    code, summary = await produce(redis_url, crawl_name, "--requests", str(path),
                                  "--header", "X-Run: r1")
    assert code == 0, summary
    assert (summary["read"], summary["invalid"], summary["enqueued"]) == (5, 0, 5)
    code, again = await produce(redis_url, crawl_name, "--requests", str(path))
    assert (code, again["enqueued"], again["duplicates"]) == (0, 0, 5)
    q = await open_queue(redis_client, crawl_name)
    tasks = {(t.url, t.body): t for t in map(decode_entry,
                                             await pending_entries(redis_client, q))}
    page1 = tasks[API, b'{"page":1}']
    assert (page1.method, page1.label, page1.data, page1.priority) == (
        "POST", "api", {"category": "books"}, 0)
    assert page1.headers == {"X-Run": "r1", "Content-Type": "application/json"}
    assert page1.id == task_id(fingerprint(Request.json(API, {"page": 1}).key()))
    assert tasks[API, b'{"page":2}'].priority == 5
    assert tasks[API, b"q=a+b"].method == "PUT"
    raw = tasks["http://api.test/raw", b"x=1"]
    assert (raw.method, raw.headers) == ("POST", {"X-Run": "r1", "X-Trace": "t"})
    plain = tasks["http://api.test/plain", None]
    assert (plain.method, plain.id) == ("GET", task_id(fingerprint("http://api.test/plain")))


async def test_a_bad_line_of_requests_is_counted_with_its_reason_never_a_crash(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    lines = [
        '{"url": "http://api.test/ok", "json": {"a": 1}}',
        "not json",
        '["a list"]',
        '{"url": "http://api.test/x", "method": "BREW"}',
        '{"url": "http://api.test/x", "data": [1]}',
        '{"url": "http://api.test/x", "label": "two words"}',
        '{"url": "http://api.test/x", "body": "' + "x" * (MAX_BODY_BYTES + 1) + '"}',
        '{"url": "ftp://api.test/x"}',
        '{"url": "http://u:secret@api.test/x", "headers": {"Authorization": "Bearer s3"}}',
    ]
    rejects = tmp_path / "rejects.jsonl"
    code, summary = await produce(
        redis_url, crawl_name, "--requests", "-", "--reject-file", str(rejects),
        stdin=io.BytesIO("\n".join(lines).encode()))
    assert code == 0, summary
    assert (summary["read"], summary["enqueued"]) == (9, 1)
    assert summary["invalid_by_reason"] == {"bad_json": 1, "bad_request": 5,
                                            "bad_scheme": 1, "userinfo": 1}
    written = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in written] == [
        (2, "bad_json"), (3, "bad_request"), (4, "bad_request"), (5, "bad_request"),
        (6, "bad_request"), (7, "bad_request"), (8, "bad_scheme"), (9, "userinfo")]
    assert "method 'BREW' is not one of" in written[2]["message"]
    assert f"body is {MAX_BODY_BYTES + 1} bytes" in written[5]["message"]
    assert "secret" not in rejects.read_text() and "s3" not in rejects.read_text()


async def test_a_label_no_route_knows_is_refused_by_the_producer(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await open_queue(redis_client, crawl_name)
    summary = Summary(crawl_name)

    async def seeds() -> AsyncIterator[Chunk]:
        yield Chunk("spider", 1, [Request(API, label="api"), Request(API, label="nope"),
                                  '{"url": "http://api.test/b", "label": "nope"}'],
                    requests=True)
    await produce_tasks([seeds()], queue=q, summary=summary, template=TaskTemplate(),
                        known_labels=frozenset({"api"}))
    assert (summary.read, summary.enqueued) == (3, 1)
    assert summary.invalid_by_reason == {"bad_request": 2}
    assert "no route is labelled 'nope' (routes: api)" in summary.first_rejects[0].message


# -- the consumer's intake -------------------------------------------------------------


def test_the_intake_keeps_a_childs_request_and_dedups_it_by_its_unique_key() -> None:
    intake = LinkIntake(Metrics(), Live(snapshot(max_depth=5)), cache_size=100)
    parent = Task(id=TID, url="http://a.test/list", depth=1, meta={"run": "r1"})
    children = [
        Request.json("http://a.test/api", {"page": 1}, label="api", data={"n": 1},
                     priority=2),
        Request.json("http://a.test/api", {"page": 2}, label="api", data={"n": 2}),
        Request.json("http://a.test/api", {"page": 1}, label="api", data={"n": 1}),
        Request("http://other.test/api", "POST", body=b"x"),  # out of the parent's host
        "http://a.test/api",  # the GET: a task of its own
    ]
    tasks, mark = intake.children([(parent, children)])
    assert [(t.method, t.body, t.label, t.data, t.depth, t.meta, t.priority)
            for t in tasks] == [
        ("POST", b'{"page":1}', "api", {"n": 1}, 2, {"run": "r1"}, 2),
        ("POST", b'{"page":2}', "api", {"n": 2}, 2, {"run": "r1"}, 0),
        ("GET", None, None, {}, 2, {"run": "r1"}, 0)]
    assert [t.fp for t in tasks] == [fingerprint(r.key()) for r in (
        children[0], children[1], Request("http://a.test/api"))]
    assert tasks[0].headers == {"Content-Type": "application/json"}
    intake.sent(mark)
    again, _ = intake.children([(parent, children[:3])])
    assert again == []  # remembered by unique key, as Redis dedups them


async def test_a_bad_child_request_fails_the_task_that_returned_it(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    async with serve({"/": echo}) as site:
        q = await open_queue(redis_client, crawl_name)
        await q.enqueue([task_of(Request(site.url("/")), max_attempts=1)])
        assert await consume(redis_url, crawl_name, tmp_path, "--handler",
                             "consumer_handlers:bad_child") == 0
    [dead] = await q.dead_list()
    assert dead.reason == "handler_error"
    line = consumer_handlers.bad_child.__code__.co_firstlineno  # its def: it returned
    assert dead.message.startswith(f"tests/consumer_handlers.py:{line} in bad_child: "
                                   "InvalidRequestError: Request ")
    assert "data['when'] is a set, not JSON" in dead.message
    stats = await q.stats()
    assert (stats.pending, stats.counters.get("enqueued")) == (0, 1)  # no child enqueued
