"""A failing sink ("Bad days"): a consumer whose results can't be written stops leasing,
gives back what it holds, retries for --sink-retry-for and then exits 6, instead of
holding its leases forever with nothing done. Real redis-server, real local sites, and a
real full disk (a 256 KiB tmpfs) where mounting one is allowed."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from support.consume import consume, consumer_args, enqueue
from support.live import snapshot
from support.routes import serve

import consumer.wiring
from common.errors import RedisUnavailableError
from common.exitcodes import EXIT_OK, EXIT_SINK
from common.http.fetcher import Fetcher
from common.keys import CrawlKeys
from common.observability.metrics import Metrics
from common.queue import LeasingQueue
from common.urls.canonical import fingerprint, task_id
from consumer.completion import Completion, CompletionKind
from consumer.config import build_parser, settings_from_args
from consumer.flush import Flusher, sink_outage
from consumer.held import LeaseBook
from consumer.intake import LinkIntake
from consumer.lifecycle import Consumer
from consumer.live import Live
from consumer.sinks import JsonlSink, Record, Sink

BODY = "x" * 2000  # with --store-body, ~100 results fill the 256 KiB disk


async def big_page(request: web.Request) -> web.Response:
    return web.Response(text=f"<html><body>{request.match_info['i']} {BODY}</body></html>",
                        content_type="text/html")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (skipped, not failed, where mounting is refused)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"can't mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last byte with one file; returns it."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def jsonl_results(out: Path) -> list[dict[str, Any]]:
    """Every complete line of the jsonl files (a write torn by ENOSPC leaves a partial
    last line behind, for a task that was released, not done)."""
    got = []
    for f in sorted(out.glob("*.jsonl")):
        for line in f.read_bytes().split(b"\n"):
            try:
                got.append(json.loads(line))
            except ValueError:
                continue
    return got


async def stream_results(client: aioredis.Redis, crawl: str) -> list[dict[str, Any]]:
    entries = await client.xrange(CrawlKeys.build(crawl).results)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


async def check_nothing_held_or_lost(queue: LeasingQueue, urls: Sequence[str],
                                     written: Sequence[dict[str, Any]]) -> int:
    """No lease left, every task pending, waiting or done, and every done task's result
    written; returns how many are done."""
    stats = await queue.stats()
    assert stats.leased == 0, "the consumer left leases behind"
    assert stats.dead == 0
    assert stats.pending + stats.done + stats.waiting == len(urls), "tasks lost"
    on_sink = {r["task_id"] for r in written}
    done = [u for u in urls if await queue.state_of(task_id(fingerprint(u)), u) == "done"]
    assert len(done) == stats.done
    assert [u for u in done if task_id(fingerprint(u)) not in on_sink] == [], \
        "tasks done whose result is not in the sink"
    return len(done)


def break_sink(monkeypatch: pytest.MonkeyPatch,
               fault: Callable[[int], BaseException | None]) -> list[int]:
    """Make the consumer's sink raise fault(n) on its n-th write (None: write). Returns a
    list holding the number of writes so far."""
    real = consumer.wiring.make_sink
    calls = [0]

    def make(kind: str, **kwargs: Any) -> Sink:
        sink = real(kind, **kwargs)
        write = sink.write

        async def failing(records: Sequence[Record]) -> None:
            calls[0] += 1
            exc = fault(calls[0])
            if exc is not None:
                raise exc
            await write(records)

        sink.write = failing  # type: ignore[method-assign]
        return sink

    monkeypatch.setattr(consumer.wiring, "make_sink", make)
    return calls


def disk_full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# -- a sink that fails every write: exit 6 by itself, nothing held, nothing lost --------

async def test_jsonl_on_a_full_disk_exits_6_releasing_everything(
        small_disk: Path, redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(400)]
        queue = await enqueue(redis_client, crawl_name, urls)
        code = await consume(redis_url, crawl_name, small_disk, "--store-body",
                             "--concurrency", "8", "--sink-retry-for", "1s", limit_s=60)
    assert code == EXIT_SINK
    done = await check_nothing_held_or_lost(queue, urls, jsonl_results(small_disk))
    assert 0 < done < len(urls), "the disk should have taken some results, not all"
    [failed] = [r for r in caplog.records if r.getMessage() == "sink_failed"]
    assert failed.levelno == logging.ERROR
    assert str(small_disk) in failed.target and failed.sink == "jsonl"  # type: ignore[attr-defined]
    assert "No space left" in failed.error  # type: ignore[attr-defined]
    assert "restart" in failed.advice  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind,fault", [
    ("jsonl", lambda: OSError(errno.EACCES, os.strerror(errno.EACCES))),
    ("warc", lambda: OSError(errno.EROFS, os.strerror(errno.EROFS))),
])
async def test_a_file_sink_failing_every_write_exits_6_releasing_everything(
        kind: str, fault: Callable[[], OSError], *, monkeypatch: pytest.MonkeyPatch,
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """Its probe passes (the directory is fine), so it leases again, and its next write
    fails again: the bound still ends it."""
    calls = break_sink(monkeypatch, lambda n: fault())
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(100)]
        queue = await enqueue(redis_client, crawl_name, urls)
        code = await consume(redis_url, crawl_name, tmp_path, "--sink", kind,
                             "--concurrency", "8", "--sink-retry-for", "1s", limit_s=60)
    assert code == EXIT_SINK
    assert calls[0] >= 2, "the sink should have been tried again before giving up"
    assert await check_nothing_held_or_lost(queue, urls, []) == 0


async def test_redis_refusing_the_results_stream_exits_6_releasing_everything(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """A real refusal: the results key holds a string, so every XADD is WRONGTYPE (the
    queue's own calls work: this is not an outage)."""
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(100)]
        queue = await enqueue(redis_client, crawl_name, urls)
        results = CrawlKeys.build(crawl_name).results
        await redis_client.set(results, "not a stream")
        code = await consume(redis_url, crawl_name, tmp_path, "--sink", "redis-stream",
                             "--concurrency", "8", "--sink-retry-for", "1s", limit_s=60)
    assert code == EXIT_SINK
    assert await redis_client.type(results) == b"string"
    assert await check_nothing_held_or_lost(queue, urls, []) == 0


# -- a sink that fails a while, then recovers: every task done once, results written ----

async def test_a_full_disk_freed_within_the_bound_is_carried_on_with(
        small_disk: Path, redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    filler = fill(small_disk)
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(40)]
        queue = await enqueue(redis_client, crawl_name, urls)
        running = asyncio.create_task(consume(
            redis_url, crawl_name, small_disk, "--store-body", "--concurrency", "4",
            "--sink-retry-for", "60s", limit_s=60))
        deadline = time.monotonic() + 20
        while not any(r.getMessage() == "sink_probe_failed" for r in caplog.records):
            assert time.monotonic() < deadline, "the consumer never found the disk full"
            assert not running.done()
            await asyncio.sleep(0.05)
        filler.unlink()  # the operator frees space
        assert await running == EXIT_OK
    got = jsonl_results(small_disk)
    assert sorted(r["url"] for r in got) == sorted(urls)  # each once
    assert await check_nothing_held_or_lost(queue, urls, got) == len(urls)


async def test_a_sink_failing_a_few_writes_then_recovering_does_every_task_once(
        monkeypatch: pytest.MonkeyPatch, redis_client: aioredis.Redis, redis_url: str,
        crawl_name: str, tmp_path: Path) -> None:
    calls = break_sink(monkeypatch, lambda n: disk_full() if n <= 3 else None)
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(200)]
        queue = await enqueue(redis_client, crawl_name, urls)
        code = await consume(redis_url, crawl_name, tmp_path, "--concurrency", "8",
                             "--sink-retry-for", "30s", limit_s=60)
    assert code == EXIT_OK
    assert calls[0] > 3
    got = jsonl_results(tmp_path)
    assert sorted(r["url"] for r in got) == sorted(urls)
    assert await check_nothing_held_or_lost(queue, urls, got) == len(urls)


async def test_a_results_stream_refused_then_fixed_is_carried_on_with(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    async with serve({"/p/{i}": big_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(60)]
        queue = await enqueue(redis_client, crawl_name, urls)
        results = CrawlKeys.build(crawl_name).results
        await redis_client.set(results, "not a stream")
        running = asyncio.create_task(consume(
            redis_url, crawl_name, tmp_path, "--sink", "redis-stream", "--concurrency", "4",
            "--sink-retry-for", "60s", limit_s=60))
        deadline = time.monotonic() + 20
        while not any(r.getMessage() == "sink_write_failed" for r in caplog.records):
            assert time.monotonic() < deadline, "the stream was never refused"
            await asyncio.sleep(0.05)
        await redis_client.delete(results)  # the operator fixes the key
        assert await running == EXIT_OK
    got = await stream_results(redis_client, crawl_name)
    assert sorted(r["url"] for r in got) == sorted(urls)
    assert await check_nothing_held_or_lost(queue, urls, got) == len(urls)


# -- what an operator sees: /readyz, /metrics -----------------------------------------

class BrokenJsonl(JsonlSink):
    """A jsonl sink whose writes fail while `broken` (its probe works: the disk is fine)."""

    broken = True

    async def write(self, records: Sequence[Record]) -> None:
        if self.broken:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        await super().write(records)


async def test_readyz_names_the_failing_sink_and_metrics_count_it(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    async def slow_page(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)  # the crawl outlasts the recovery: /readyz is seen at 200
        return await big_page(request)

    async with serve({"/p/{i}": slow_page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(200)]
        queue = await enqueue(redis_client, crawl_name, urls)
        settings = settings_from_args(build_parser().parse_args(consumer_args(
            redis_url, crawl_name, tmp_path, "--concurrency", "4",
            "--sink-retry-for", "60s")))
        sink = BrokenJsonl(output_dir=tmp_path, crawl=crawl_name, worker="w")
        metrics = Metrics()
        async with Fetcher(settings.fetch) as fetcher:
            worker = Consumer(settings, queue, fetcher, sink, metrics)
            running = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 20
            while not worker.sink_health.failing:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            problem = await worker.ready_problem()
            assert problem is not None and "sink failing" in problem
            assert str(tmp_path) in problem and "Read-only file system" in problem
            text = metrics.render()[0].decode()
            errors = next(line for line in text.splitlines()
                          if line.startswith("crawlq_sink_errors_total "))
            assert float(errors.split()[1]) >= 1
            assert worker._status()["state"] in ("sink_failing", "running")
            sink.broken = False
            while (problem := await worker.ready_problem()) is not None:
                assert time.monotonic() < deadline and not running.done(), \
                    f"readyz never came back: {problem}"
                await asyncio.sleep(0.02)
            assert await asyncio.wait_for(running, 30) == EXIT_OK
    got = jsonl_results(tmp_path)
    assert sorted(r["url"] for r in got) == sorted(urls)
    assert await check_nothing_held_or_lost(queue, urls, got) == len(urls)


# -- the flush step itself ------------------------------------------------------------

class RefusingSink:
    async def open(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        raise ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    async def close(self) -> None:
        pass


async def test_a_refused_write_releases_its_tasks_and_acks_nothing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await enqueue(redis_client, crawl_name, [f"http://g.test/{i}" for i in range(3)])
    leases = await queue.lease("w", 3, 30_000)
    metrics = Metrics()
    book = LeaseBook(30.0, metrics)
    intake = LinkIntake(metrics, Live(snapshot(max_depth=5)), cache_size=0)
    flush = Flusher(queue, RefusingSink(), metrics, book, worker="w", batch=8,
                    intake=intake, on_freed=lambda turn: None)
    for lease in leases:
        book.hold(lease, time.monotonic())
    for lease in leases[:2]:
        task = lease.task
        flush.add(Completion(lease, CompletionKind.ACK, record=Record(
            task_id=task.id, url=task.url, final_url=task.url, status=200, outcome="ok",
            headers={}, raw_headers=(), body=b"", bytes=0, elapsed=0.0, attempt=1,
            fetched_at=time.time(), worker="w"), urls=["http://g.test/child"]))
    flush.add(Completion(leases[2], CompletionKind.RELEASE))
    await asyncio.wait_for(flush.flush(), 10)
    assert [await queue.state_of(lease.id) for lease in leases] == ["pending"] * 3
    assert len(book) == 0 and flush.done == 0
    assert flush.health.failing and metrics.sink_errors_total._value.get() == 1
    stats = await queue.stats()
    assert (stats.pending, stats.leased, stats.done) == (3, 0, 0)  # the child not sent


def test_only_an_unreachable_redis_is_an_outage_of_the_stream_sink() -> None:
    def wrapped(cause: BaseException) -> RedisUnavailableError:
        try:
            raise RedisUnavailableError("XADD failed") from cause
        except RedisUnavailableError as exc:
            return exc
    assert sink_outage(wrapped(RedisConnectionError("refused")))
    assert not sink_outage(wrapped(ResponseError("OOM command not allowed")))
    assert not sink_outage(ResponseError("WRONGTYPE"))
    assert not sink_outage(OSError(errno.ENOSPC, "No space left on device"))
