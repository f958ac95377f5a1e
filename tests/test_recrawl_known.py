"""A scheduled recrawl reaches every page it knew (issue 43): a link-following crawl with a
recrawl window (``recrawl_after``, revisits off, validators kept by default), re-seeded by
a producer run after the window, gets its start page's 304, whose missing body has no
links; the producer brings back every known URL past the window from the crawl's history
(Nutch's generate, common/queue/known.py). Unchanged pages end ``not_modified``, a changed
one is fetched whole and the page it newly links is found, a deleted one ends ``gone``
and its history record is deleted. Real redis-server, a local aiohttp site, the producer
and the consumer in-process."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.clock import window_passed
from support.consume import consume, records
from support.history import history_count, record_of
from support.routes import serve

from common.policy import set_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.revisits.previous import Observed
from common.urls.canonical import fingerprint, task_id
from console.fsck import check
from producer.cli import main_async

#: The tree: each page and the pages it links to (13 pages, 4 levels; /dead is a dead link).
TREE = {
    "/": ["/a", "/b", "/c"],
    "/a": ["/a/1", "/a/2", "/a/3"],
    "/b": ["/b/1", "/b/2"],
    "/c": ["/c/1", "/c/2"],
    "/a/1": ["/a/1/x"], "/a/2": [], "/a/3": ["/dead"], "/b/1": ["/b/1/x"], "/b/2": [],
    "/c/1": [], "/c/2": [], "/a/1/x": [], "/b/1/x": [],
}
LAST_MODIFIED = formatdate(1_750_000_000, usegmt=True)


class Tree:
    """A site of `TREE`'s pages as a static server serves them: an ETag of each body and
    a Last-Modified, a 304 to a matching If-None-Match; pages can change, appear and go."""

    def __init__(self) -> None:
        self.links = {path: list(to) for path, to in TREE.items()}
        self.versions: Counter[str] = Counter()

    def body(self, path: str) -> bytes:
        hrefs = "".join(f'<a href="{to}">{to}</a> ' for to in self.links[path])
        return (f"<html><body><h1>{path} v{self.versions[path]}</h1>{hrefs}"
                "</body></html>").encode()

    def change(self, path: str, *, link: str) -> None:
        """`path` changes, linking to the new page `link` too."""
        self.versions[path] += 1
        self.links[path].append(link)
        self.links[link] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.path not in self.links:
            return web.Response(status=404, text="not found")
        body = self.body(request.path)
        etag = '"' + hashlib.blake2b(body, digest_size=6).hexdigest() + '"'
        headers = {"ETag": etag, "Last-Modified": LAST_MODIFIED}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="text/html", headers=headers)


async def produce(redis_url: str, crawl: str, url: str, *rest: str) -> dict[str, Any]:
    """A producer run seeding `url`, as one run on a schedule: its --json summary."""
    import io  # noqa: PLC0415

    out = io.StringIO()
    code = await main_async(["--redis-url", redis_url, "--crawl", crawl, "--cluster", "no",
                             "--progress", "off", "--json", "--url", url, *rest], out=out)
    assert code == 0, out.getvalue()
    summary: dict[str, Any] = json.loads(out.getvalue())
    return summary


async def crawl_pass(redis_url: str, crawl: str, out: Path) -> dict[str, dict[str, Any]]:
    """A link-following consumer until the crawl is empty: its records by path."""
    assert await consume(redis_url, crawl, out, "--handler", "consumer.handlers:links") == 0
    found: dict[str, dict[str, Any]] = {}
    for rec in records(out):
        path = "/" + rec["url"].split("/", 3)[3]
        assert path not in found, f"{path} fetched twice in one pass"
        found[path] = rec
    return found


async def test_a_recrawl_past_its_window_reaches_every_page_it_knew(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    tree = Tree()
    await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {
        "recrawl_after": 1, "per_host_delay": 0, "per_host_concurrency": 0},
        by="test", create=True)
    async with serve({"/{tail:.*}": tree.handle}) as site:
        start = site.url("/")
        first_run = await produce(redis_url, crawl_name, start)
        assert first_run["enqueued"] == 1
        first = await crawl_pass(redis_url, crawl_name, tmp_path / "pass1")
        assert set(first) == {*TREE, "/dead"} and first.pop("/dead")["status"] == 404
        assert {r["status"] for r in first.values()} == {200}

        tree.change("/b", link="/b/new")  # deep in the site, linked from a changed page
        del tree.links["/c/1"]  # deleted: /c, unchanged, still links to it
        await window_passed(redis_client, 1)
        run = await produce(redis_url, crawl_name, start)
        # the seed by its window; every other known page from the crawl's history (a
        # dead link was never a page: only a seed or a link brings it back)
        assert (run["recrawled"], run["recrawled_known"]) == (1, len(TREE) - 1)
        assert run["known_scanned"] == len(TREE)
        asked = len(site.seen)
        second = await crawl_pass(redis_url, crawl_name, tmp_path / "pass2")
        conditional = [s for s in site.seen[asked:] if "If-None-Match" in s.headers]
        queue = await LeasingQueue.existing(redis_client, crawl_name)
        assert (await check(queue)).problems == []  # fsck: records with their entries

        # The next run past the window brings back what is known now: /b/new, not /c/1.
        await window_passed(redis_client, 1)
        third = await produce(redis_url, crawl_name, start)
        leased = await queue.lease("check", 100, 60_000)
        assert (await check(queue)).problems == []  # their records kept while leased

    assert set(first) <= set(second), "pass 2 did not reach every page of pass 1"
    assert "/dead" not in second
    outcomes = {path: rec["outcome"] for path, rec in second.items()}
    unchanged = set(TREE) - {"/b", "/c/1"}
    assert {outcomes[p] for p in unchanged} == {"not_modified"}
    assert {second[p]["status"] for p in unchanged} == {304}
    assert (outcomes["/b"], second["/b"]["status"]) == ("changed", 200)
    assert (outcomes["/b/new"], second["/b/new"]["status"]) == ("ok", 200)
    assert (outcomes["/c/1"], second["/c/1"]["status"]) == ("gone", 404)
    assert len(conditional) == len(TREE)  # each known URL asked with its own validator

    assert await record_of(queue, task_id(fingerprint(site.url("/c/1")))) is None
    assert await record_of(queue, task_id(fingerprint(site.url("/b/new")))) is not None
    counters = (await queue.stats()).counters
    assert (counters["outcome:gone"], counters["outcome:not_modified"]) == (1, 11)

    assert (third["recrawled"], third["recrawled_known"]) == (1, len(TREE) - 1)
    paths = {"/" + lease.task.url.split("/", 3)[3] for lease in leased}
    assert paths == (set(TREE) - {"/c/1"}) | {"/b/new"}


async def test_a_run_before_anything_is_due_reads_no_history(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """An operator's producer runs every hour with new URLs: once a scan has run, a run
    before any record can have come due reads one field of each partition, not the
    history, and says when the first comes due."""
    await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {
        "recrawl_after": 3600, "per_host_delay": 0, "per_host_concurrency": 0},
        by="test", create=True)
    tree = Tree()
    async with serve({"/{tail:.*}": tree.handle}) as site:
        seeded = await produce(redis_url, crawl_name, site.url("/"))
        await crawl_pass(redis_url, crawl_name, tmp_path / "pass1")
        skipped = await produce(redis_url, crawl_name, site.url("/"))
        off = await produce(redis_url, crawl_name, site.url("/"), "--no-recrawl-known")
    queue = await LeasingQueue.existing(redis_client, crawl_name)
    assert await history_count(queue) == len(TREE)
    # the first run read the (empty) history and remembered when it did: nothing fetched
    # since can come due before the window has passed from then
    assert (seeded["known_scanned"], seeded["known_due_in_s"]) == (0, None)
    assert skipped["known_scanned"] == 0
    assert 3590 < skipped["known_due_in_s"] <= 3600
    assert "the first comes due in" in skipped["notice"]
    assert (off["known_scanned"], off["known_due_in_s"]) == (0, None)


@pytest.mark.parametrize("partitions", [1, 3])
async def test_known_urls_come_back_with_their_request_from_big_buckets(
        redis_client: aioredis.Redis, crawl_name: str, partitions: int) -> None:
    """9,000 done URLs in 16 buckets a partition (one partition: hashtables, read by
    HSCAN's cursor) come back, each once, with its request as it was enqueued (label,
    data, depth, priority) and its validators; one queued again meanwhile is not queued
    twice."""
    queue = await LeasingQueue.open(redis_client, crawl_name,
                                    CrawlSettings(seen_bits=4, partitions=partitions))
    await set_policy(redis_client, crawl_name, {
        "recrawl_after": 1, "per_host_delay": 0, "per_host_concurrency": 0},
        by="test", create=True)
    queue.configure(recrawl_after_s=1, revisits=True)
    urls = [f"https://h{i % 40}.example/p/{i}" for i in range(9000)]
    tasks = [NewTask(u, fingerprint(u), label="page", data={"i": i}, depth=i % 5,
                     priority=i % 2) for i, u in enumerate(urls)]
    await queue.enqueue(tasks)
    while leases := await queue.lease("w", 1000, 60_000):
        for lease in leases:
            lease.observed = Observed('"e"', "", "0123456789abcdef", -1)
        await queue.ack("w", [(lease, "ok") for lease in leases])
    assert await history_count(queue) == 9000
    await window_passed(redis_client, 1)
    assert (await queue.enqueue(tasks[:1])).recrawled == 1  # a seed, past its window
    known = await queue.recrawl_known()
    assert (known.scanned, known.recrawled, known.duplicates) == (9000, 8999, 1)
    again = await queue.recrawl_known()  # all queued already: none doubled
    assert again.recrawled == 0 and again.duplicates == again.scanned
    back: dict[str, Any] = {}
    while leases := await queue.lease("w", 1000, 60_000):
        assert not set(back) & {lease.task.url for lease in leases}
        back.update({lease.task.url: lease.task for lease in leases})
    assert len(back) == 9000
    for i in (0, 1, 17, 4242, 8999):
        task = back[urls[i]]
        assert (task.label, task.data, task.depth, task.priority) == (
            "page", {"i": i}, i % 5, i % 2)
        assert task.revisit is not None and task.revisit.etag == '"e"'


async def test_a_stopped_scan_leaves_the_rest_to_the_next_run(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A stop request (the producer's SIGTERM) ends the scan between batches, without
    remembering it ran, so the next run brings back what it left."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {
        "recrawl_after": 1, "per_host_delay": 0, "per_host_concurrency": 0},
        by="test", create=True)
    queue.configure(recrawl_after_s=1, revisits=True)
    urls = [f"https://s{i % 7}.example/{i}" for i in range(300)]
    await queue.enqueue([NewTask(u, fingerprint(u)) for u in urls])
    while leases := await queue.lease("w", 1000, 60_000):
        await queue.ack("w", [(lease, "ok") for lease in leases])
    await window_passed(redis_client, 1)
    stop = asyncio.Event()
    stop.set()
    cut = await queue.recrawl_known(stop=stop)
    assert cut.stopped and cut.recrawled == 0 and 0 < cut.scanned < 300
    rest = await queue.recrawl_known()
    assert (rest.stopped, rest.scanned, rest.recrawled) == (False, 300, 300)
