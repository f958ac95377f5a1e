"""The crawl policy's ``accept_content_type``: a response of another type is closed before
its body is read and ends done, outcome ``filtered``; a running consumer takes a change
within a second (the ``policy`` message on the crawl's wake channel)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, enqueue, records
from support.routes import serve

from common.http.fetcher import Fetcher
from common.http.results import FetchSettings, content_type_accepted
from common.observability.metrics import Metrics
from common.policy import create_policy, set_policy
from common.queue import LeasingQueue
from consumer.config import build_parser, settings_from_args
from consumer.lifecycle import Consumer
from consumer.sinks import Record

PDF_BYTES = 20 * 2**20
CHUNK = 64 * 1024


def pdf_server(written: list[int], done: asyncio.Event):  # type: ignore[no-untyped-def]
    """A 20 MB application/pdf body in chunks; `written` gets the bytes it wrote before
    the client went away (or all of them)."""
    async def pdf(request: web.Request) -> web.StreamResponse:
        sent = 0
        try:
            resp = web.StreamResponse(headers={"Content-Type": "Application/PDF; q=1"})
            resp.content_length = PDF_BYTES
            await resp.prepare(request)
            while sent < PDF_BYTES:
                await resp.write(b"%" * CHUNK)
                sent += CHUNK
                await asyncio.sleep(0.005)
            await resp.write_eof()
            return resp
        except (ConnectionError, asyncio.CancelledError):
            raise
        finally:
            written.append(sent)
            done.set()
    return pdf


async def html(request: web.Request) -> web.Response:
    return web.Response(text='<html><a href="/doc.pdf">doc</a></html>',
                        content_type="text/html")


def test_content_type_matching() -> None:
    accept = ("text/html", "image/*")
    assert content_type_accepted("text/html; charset=utf-8", accept)
    assert content_type_accepted("TEXT/HTML", accept)
    assert content_type_accepted("image/png", accept)
    assert not content_type_accepted("application/pdf", accept)
    assert not content_type_accepted("text/plain", accept)
    assert content_type_accepted(None, accept)  # no Content-Type: accepted
    assert content_type_accepted("application/pdf", None)
    assert content_type_accepted("application/pdf", ())


async def test_a_filtered_response_is_closed_before_its_body_is_read() -> None:
    written: list[int] = []
    done = asyncio.Event()
    async with serve({"/doc.pdf": pdf_server(written, done)}) as site, \
            Fetcher(FetchSettings(allow_private=True, max_body_bytes=64 * 2**20)) as fetcher:
        result = await fetcher.fetch(site.url("/doc.pdf"), accept=("text/html",))
        assert result.filtered and result.status == 200 and result.body == b""
        assert result.headers["content-type"] == "Application/PDF; q=1"
        await asyncio.wait_for(done.wait(), 10)
    assert written and written[0] < 2**20, written  # far less than the 20 MB body


async def test_the_consumer_ends_an_unaccepted_type_filtered_without_a_body(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    await create_policy(redis_client, crawl_name, {"accept_content_type": ("text/html",)},
                        by="test")
    written: list[int] = []
    done = asyncio.Event()
    async with serve({"/": html, "/doc.pdf": pdf_server(written, done)}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer.handlers:links", "--max-body-bytes", "64MiB")
        await asyncio.wait_for(done.wait(), 10)
    by_url = {r["url"]: r for r in records(tmp_path)}
    assert by_url[site.url("/")]["outcome"] == "ok"
    pdf = by_url[site.url("/doc.pdf")]
    assert (pdf["outcome"], pdf["status"], pdf["bytes"], pdf["body_sha1"]) == (
        "filtered", 200, 0, None)
    assert pdf["headers"]["content-type"].startswith("Application/PDF")
    assert written[0] < 2**20
    stats = await (await LeasingQueue.existing(redis_client, crawl_name)).stats()
    assert stats.counters.get("outcome:filtered") == 1, stats.counters


class _Sink:
    def __init__(self) -> None:
        self.records: list[Record] = []

    async def open(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    async def close(self) -> None:
        pass


async def test_a_running_consumer_takes_a_policy_change_within_a_second(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str) -> None:
    await create_policy(redis_client, crawl_name, {}, by="test")
    queue = await LeasingQueue.open(redis_client, crawl_name)
    settings = settings_from_args(build_parser().parse_args(
        ["--redis-url", redis_url, "--crawl", crawl_name, "--allow-private",
         "--ignore-robots", "--http-port", "-1", "--per-host-delay", "0",
         "--max-body-bytes", "64MiB"]))
    written: list[int] = []
    done = asyncio.Event()
    sink = _Sink()
    metrics = Metrics()
    async with serve({"/doc.pdf": pdf_server(written, done)}) as site, \
            Fetcher(settings.fetch) as fetcher:
        worker = Consumer(settings, queue, fetcher, sink, metrics)
        worker.housekeeping.on_beat = None  # only the wake message can bring the change
        running = asyncio.create_task(worker.run())
        try:
            for _ in range(1000):  # it has read the policy and is idle
                if worker.leaser.idle:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # it is subscribed by now
            assert worker.policy.now.accept == ()
            await set_policy(redis_client, crawl_name,
                             {"accept_content_type": ("text/html",)}, by="test")
            changed = time.monotonic()
            while worker.policy.now.accept != ("text/html",):
                assert time.monotonic() - changed < 1.0, "the change did not arrive in 1 s"
                await asyncio.sleep(0.01)
            await enqueue(redis_client, crawl_name, [site.url("/doc.pdf")])
            for _ in range(1000):
                if sink.records:
                    break
                await asyncio.sleep(0.01)
            await worker.flush()
        finally:
            worker.request_stop()
            worker.request_stop()
            await asyncio.wait_for(running, 10)
        await asyncio.wait_for(done.wait(), 10)
    [record] = sink.records
    assert (record.outcome, record.status, record.body) == ("filtered", 200, None)
    assert written[0] < 2**20
    text = metrics.render()[0].decode()
    assert 'crawlq_tasks_total{outcome="filtered"} 1.0' in text
