"""A revisit (issue 26), end to end in-process: a task carrying its URL's previous visit is
fetched with its validators; a 304 is ``not_modified`` and a same-body 200 ``unchanged``,
neither handled (no links re-extracted); a changed page is ``changed`` and its new links
are followed; each ack carries what the fetch learned (`Lease.observed`). Real
redis-server, real aiohttp sites on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consumer_args
from support.history import history_count
from support.routes import serve

from common.http.fetcher import Fetcher
from common.http.results import FetchResult
from common.observability.metrics import Metrics
from common.policy import set_policy
from common.queue import Lease, LeasingQueue, NewTask
from common.revisits.previous import MAX_VALIDATOR_BYTES, Observed, Revisit
from common.urls.canonical import fingerprint
from consumer.completion import Completion
from consumer.config import build_parser, settings_from_args
from consumer.handlers import HandlerContext, HandlerResult, links
from consumer.lifecycle import Consumer
from consumer.revisits import digest, max_age_s, observe
from consumer.sinks import Record

ETAG = '"v1"'
LAST_MODIFIED = "Sat, 01 Feb 2025 10:00:00 GMT"
OLD_PAGE = b'<html><body><a href="/known">known</a></body></html>'
NEW_PAGE = b'<html><body><a href="/known">known</a> <a href="/new">new</a></body></html>'
VALIDATOR_NAMES = ("If-None-Match", "If-Modified-Since")


@dataclass
class Crawl:
    """What a consumer run did: its records, its acked leases, the handler's calls."""

    records: list[Record] = field(default_factory=list)
    acked: dict[str, Lease] = field(default_factory=dict)  # url -> lease
    handled: list[str] = field(default_factory=list)  # urls given to the handler
    metrics: Metrics = field(default_factory=Metrics)

    def record(self, url: str) -> Record:
        [found] = [r for r in self.records if r.url == url]
        return found

    async def write(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def crawl(redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
                tasks: list[NewTask], revisit: str = "fixed", **policy: Any) -> Crawl:
    """Enqueue `tasks` (as a producer run with the policy's recrawl window) and run a
    consumer with the ``links`` handler until the crawl is done (a crawl whose policy says
    `revisit` and `policy`)."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {"revisit": revisit, **policy}, by="test",
                     create=True)
    queue.configure(recrawl_after_s=policy.get("recrawl_after", 0))
    await queue.enqueue(tasks)
    settings = settings_from_args(build_parser().parse_args(
        consumer_args(redis_url, crawl_name, "unused")))
    seen = Crawl()

    async def handler(response: FetchResult, ctx: HandlerContext) -> HandlerResult:
        seen.handled.append(ctx.task.url)
        return await links(response, ctx)

    async with Fetcher(settings.fetch) as fetcher:
        consumer = Consumer(settings, queue, fetcher, seen, seen.metrics, handler=handler)
        add = consumer.flusher.add

        def keep(completion: Completion) -> None:
            if completion.kind == "ack":
                seen.acked[completion.lease.task.url] = completion.lease
            add(completion)

        consumer.flusher.add = keep  # type: ignore[method-assign]
        assert await consumer.run() == 0
    return seen


def revisit_task(url: str, body: bytes = OLD_PAGE, **previous: Any) -> NewTask:
    """`url`'s task as the frontier brings it back: its previous visit saw `body`."""
    visit = {"etag": ETAG, "last_modified": LAST_MODIFIED, "digest": digest(body),
             "fetched_s": 1_760_000_000, "interval_s": 86400, **previous}
    return NewTask(url, fingerprint(url), revisit=Revisit(**visit))


def site_routes(requests: dict[str, list[dict[str, str]]], page: dict[str, bytes]
                ) -> dict[str, Any]:
    """/p answers 304 to its own validators, else `page["body"]`; /moved redirects to /p."""
    async def p(request: web.Request) -> web.Response:
        requests["/p"].append(dict(request.headers))
        if request.headers.get("If-None-Match") == ETAG and page.get("304"):
            return web.Response(status=304, headers={"ETag": ETAG})
        return web.Response(body=page["body"], content_type="text/html",
                            headers={"ETag": '"v2"', "Cache-Control": "max-age=600"})

    async def moved(request: web.Request) -> web.Response:
        requests["/moved"].append(dict(request.headers))
        raise web.HTTPFound("/p")

    async def other(request: web.Request) -> web.Response:
        requests[request.path].append(dict(request.headers))
        return web.Response(text="<html></html>", content_type="text/html")

    return {"/p": p, "/moved": moved, "/known": other, "/new": other}


def counted(metrics: Metrics, outcome: str) -> bool:
    return f'crawlq_tasks_total{{outcome="{outcome}"}} 1.0' in metrics.render()[0].decode()


async def test_a_304_is_not_modified_never_given_a_body_nor_handled(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": []}
    async with serve(site_routes(requests, {"304": b"yes", "body": OLD_PAGE})) as site:
        url = site.url("/p")
        seen = await crawl(redis_client, redis_url, crawl_name, [revisit_task(url)])
    [sent] = requests["/p"]
    assert {k: sent.get(k) for k in VALIDATOR_NAMES} == {
        "If-None-Match": ETAG, "If-Modified-Since": LAST_MODIFIED}
    record = seen.record(url)
    assert (record.outcome, record.status, record.body, record.bytes) == (
        "not_modified", 304, b"", 0)
    assert seen.handled == []  # no handler, so no link re-extracted
    assert seen.acked[url].observed == Observed(ETAG, LAST_MODIFIED, digest(OLD_PAGE), -1)
    assert (record.digest, record.refers_to_s) == (digest(OLD_PAGE), 1_760_000_000)
    assert counted(seen.metrics, "not_modified")


async def test_the_same_body_is_unchanged_and_its_links_are_not_extracted_again(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": [], "/known": []}
    async with serve(site_routes(requests, {"body": OLD_PAGE})) as site:
        url = site.url("/p")
        seen = await crawl(redis_client, redis_url, crawl_name, [revisit_task(url)])
    record = seen.record(url)
    assert (record.outcome, record.status, record.body) == ("unchanged", 200, OLD_PAGE)
    assert seen.handled == [] and requests["/known"] == []
    assert seen.acked[url].observed == Observed('"v2"', "", digest(OLD_PAGE), 600)
    assert counted(seen.metrics, "unchanged")


async def test_a_changed_page_is_changed_and_its_new_links_are_followed(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": [], "/known": [], "/new": []}
    async with serve(site_routes(requests, {"body": NEW_PAGE})) as site:
        url = site.url("/p")
        seen = await crawl(redis_client, redis_url, crawl_name, [revisit_task(url)])
    record = seen.record(url)
    assert (record.outcome, record.digest) == ("changed", digest(NEW_PAGE))
    assert seen.handled[0] == url
    assert len(requests["/new"]) == 1  # the new link was enqueued and fetched
    new = seen.record(site.url("/new"))
    assert new.outcome == "ok" and seen.acked[new.url].observed is not None
    assert counted(seen.metrics, "changed")


async def test_a_first_visit_sends_no_validator_and_is_ok(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": [], "/known": []}
    async with serve(site_routes(requests, {"304": b"yes", "body": OLD_PAGE})) as site:
        url = site.url("/p")
        seen = await crawl(redis_client, redis_url, crawl_name,
                           [NewTask(url, fingerprint(url))])
    assert not set(VALIDATOR_NAMES) & set(requests["/p"][0])
    assert seen.record(url).outcome == "ok" and seen.handled[0] == url
    assert seen.acked[url].observed == Observed('"v2"', "", digest(OLD_PAGE), 600)


async def test_with_revisits_off_a_first_visit_hashes_no_body(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": [], "/known": []}
    async with serve(site_routes(requests, {"body": OLD_PAGE})) as site:
        url = site.url("/p")
        seen = await crawl(redis_client, redis_url, crawl_name,
                           [NewTask(url, fingerprint(url))], revisit="off")
    record = seen.record(url)
    assert (record.outcome, record.digest) == ("ok", "")
    assert seen.acked[url].observed is None and seen.handled[0] == url


def validating_routes(requests: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """/p, an unchanged page as nginx serves one: ETag and Last-Modified on its 200, a
    304 to either of them."""
    async def p(request: web.Request) -> web.Response:
        requests["/p"].append(dict(request.headers))
        validators = {"ETag": ETAG, "Last-Modified": LAST_MODIFIED}
        if (request.headers.get("If-None-Match") == ETAG
                or request.headers.get("If-Modified-Since") == LAST_MODIFIED):
            return web.Response(status=304, headers=validators)
        return web.Response(body=OLD_PAGE, content_type="text/html", headers=validators)

    async def other(request: web.Request) -> web.Response:
        return web.Response(text="<html></html>", content_type="text/html")

    return {"/p": p, "/known": other}


async def recrawled(redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
                    requests: dict[str, list[dict[str, str]]], **policy: Any
                    ) -> tuple[str, Crawl, LeasingQueue]:
    """/p crawled, then enqueued again once its recrawl window (1 s, revisits off: the
    old way's producer run) has passed, and crawled again: its URL, the second run, the
    crawl's queue."""
    async with serve(validating_routes(requests)) as site:
        url = site.url("/p")
        first = await crawl(redis_client, redis_url, crawl_name,
                            [NewTask(url, fingerprint(url))], "off", recrawl_after=1, **policy)
        assert first.record(url).outcome == "ok" and first.handled[0] == url
        await asyncio.sleep(1.1)  # past the window: the seen mark counts whole seconds
        again = await crawl(redis_client, redis_url, crawl_name,
                            [NewTask(url, fingerprint(url))], "off", recrawl_after=1, **policy)
    return url, again, await LeasingQueue.open(redis_client, crawl_name)


async def test_a_recrawl_window_alone_asks_with_the_validators_and_a_304_ends_not_modified(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    """recrawl_after with no revisit option: the first visit keeps its URL's validators,
    its recrawl sends them, and the site's 304 ends it done, not_modified, counted, never
    handled (issue 34: validators kept by default)."""
    requests: dict[str, list[dict[str, str]]] = {"/p": []}
    url, again, queue = await recrawled(redis_client, redis_url, crawl_name, requests)
    first_sent, sent = requests["/p"]
    assert not set(VALIDATOR_NAMES) & set(first_sent)
    assert {k: sent.get(k) for k in VALIDATOR_NAMES} == {
        "If-None-Match": ETAG, "If-Modified-Since": LAST_MODIFIED}
    record = again.record(url)
    assert (record.outcome, record.status, record.bytes) == ("not_modified", 304, 0)
    assert record.digest == digest(OLD_PAGE) and record.refers_to_s > 0
    assert again.handled == []
    assert counted(again.metrics, "not_modified")
    counters = (await queue.stats()).counters
    assert (counters["outcome:not_modified"], counters["recrawled"]) == (1, 1)
    assert counters.get("failed", 0) == 0


async def test_conditional_off_a_recrawl_window_keeps_no_history_and_fetches_whole(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": []}
    url, again, queue = await recrawled(redis_client, redis_url, crawl_name, requests,
                                        conditional=False)
    assert not any(set(VALIDATOR_NAMES) & set(sent) for sent in requests["/p"])
    assert again.record(url).outcome == "ok" and again.handled[0] == url
    assert len(again.handled) == 2  # its link too, past the window: the old way, whole
    assert await history_count(queue) == 0


@pytest.mark.parametrize("status", [404, 410])
async def test_a_recrawl_answered_404_or_410_ends_gone_and_its_history_is_deleted(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, status: int) -> None:
    """A page deleted since its last visit: its recrawl (it has a history record) ends
    done, outcome gone, counted, and under a recrawl window its record is deleted (the
    producer's recrawl of known URLs brings it back no more); a dead link's first 404
    keeps no record either."""
    gone: set[str] = set()

    async def p(request: web.Request) -> web.Response:
        if request.path in gone:
            return web.Response(status=status, text="gone")
        return web.Response(body=b"<html></html>", content_type="text/html",
                            headers={"ETag": ETAG})

    async with serve({"/p": p, "/dead": p}) as site:
        url, dead = site.url("/p"), site.url("/dead")
        gone.add("/dead")
        tasks = [NewTask(u, fingerprint(u)) for u in (url, dead)]
        first = await crawl(redis_client, redis_url, crawl_name, tasks, "off",
                            recrawl_after=1)
        queue = await LeasingQueue.open(redis_client, crawl_name)
        assert (first.record(url).outcome, first.record(dead).outcome) == ("ok", "http_4xx")
        assert await history_count(queue) == 1  # /p's: a dead link is no page
        gone.add("/p")
        await asyncio.sleep(1.1)  # past the window: the seen mark counts whole seconds
        again = await crawl(redis_client, redis_url, crawl_name, tasks[:1], "off",
                            recrawl_after=1)
    record = again.record(url)
    assert (record.outcome, record.status) == ("gone", status)
    assert counted(again.metrics, "gone")
    assert (await queue.stats()).counters["outcome:gone"] == 1
    assert await history_count(queue) == 0


async def test_a_validator_is_never_sent_to_the_redirect_target_nor_kept_for_the_url(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    requests: dict[str, list[dict[str, str]]] = {"/p": [], "/moved": [], "/known": []}
    async with serve(site_routes(requests, {"304": b"yes", "body": OLD_PAGE})) as site:
        url = site.url("/moved")
        seen = await crawl(redis_client, redis_url, crawl_name, [revisit_task(url)])
    assert requests["/moved"][0]["If-None-Match"] == ETAG  # the URL's own
    assert not set(VALIDATOR_NAMES) & set(requests["/p"][0])  # another URL: none of it
    record = seen.record(url)
    assert (record.outcome, record.status) == ("unchanged", 200)
    # /p's ETag is /p's: the history of /moved keeps none.
    assert seen.acked[url].observed == Observed("", "", digest(OLD_PAGE), 600)


# -- observe, a pure function ------------------------------------------------------------


def result(status: int = 200, headers: dict[str, str] | None = None,
           raw: tuple[tuple[bytes, bytes], ...] = (), body: bytes = b"page",
           redirects: tuple[str, ...] = ()) -> FetchResult:
    return FetchResult(url="http://a.test/", final_url="http://a.test/", status=status,
                       headers=headers or {}, raw_headers=raw, body=body, elapsed=0.1,
                       redirects=redirects, http_version="HTTP/1.1")


def test_a_validator_over_256_bytes_is_not_kept() -> None:
    long = '"' + "x" * (MAX_VALIDATOR_BYTES - 1) + '"'
    fits = long[:MAX_VALIDATOR_BYTES]
    got = observe(None, result(headers={"etag": long, "last-modified": fits}))
    assert (got.etag, got.last_modified) == ("", fits)


def test_a_304_keeps_the_previous_digest_and_the_validators_it_does_not_replace() -> None:
    previous = Revisit(ETAG, LAST_MODIFIED, "00000000000000aa", 1, 1)
    got = observe(previous, result(304, {"etag": '"v3"'}, body=b""))
    assert got == Observed('"v3"', LAST_MODIFIED, "00000000000000aa", -1)


def test_digest_is_16_hex_digits_of_blake2b_64() -> None:
    assert digest(b"") == "e4a6a0577479b2b4"  # BLAKE2b-64 of nothing
    assert len(digest(OLD_PAGE)) == 16 and digest(OLD_PAGE) != digest(NEW_PAGE)


NOW = 1_760_000_000.0


@pytest.mark.parametrize(("raw", "date", "expected"), [
    ((), None, -1),
    (((b"Cache-Control", b"public, max-age=600"),), None, 600),
    (((b"cache-control", b'max-age="60"'), (b"Cache-Control", b"no-cache")), None, 0),
    (((b"Cache-Control", b"no-store"), (b"Expires", b"x")), None, 0),
    (((b"Cache-Control", b"s-maxage=60"),), None, -1),
    (((b"Cache-Control", b"max-age=abc"),), None, 0),
    (((b"Cache-Control", b"max-age=" + b"9" * 400),), None, 2**31),
    (((b"Expires", formatdate(NOW + 300, usegmt=True).encode()),),
     formatdate(NOW, usegmt=True), 300),
    (((b"Expires", formatdate(NOW + 300, usegmt=True).encode()),), None, 300),
    (((b"Expires", b"0"),), formatdate(NOW, usegmt=True), 0),
    (((b"Expires", formatdate(NOW - 300, usegmt=True).encode()),), None, 0),
    (((b"Cache-Control", b"max-age=5"), (b"Expires", b"0")), None, 5),
])
def test_max_age_s(raw: tuple[tuple[bytes, bytes], ...], date: str | None,
                   expected: int) -> None:
    assert max_age_s(raw, date, now=NOW) == expected
