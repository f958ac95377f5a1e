"""Spiders across real processes and a real Redis: a child's label and data reach its
route on another consumer, a label with no route ends dead with its reason, and
``crawlq run`` crawls the example spider end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from procs import group_members
from support.consume import consume, consumer_args
from support.handover import hand_over_children, until
from support.leases import owned_by
from support.routes import serve

from common.keys import CrawlKeys
from common.policy import create_policy, read_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.tasks.request import Request
from common.urls.canonical import canonicalize
from console.demo.site import SHOP_CATEGORIES, SiteSpec, product, reviews, sample_site
from console.run.command import gather_items
from console.run.ownership import type_path
from producer.cli import main_async

ROOT = Path(__file__).resolve().parents[1]
SPIDER = str(ROOT / "tests" / "support" / "relay_spider.py")

pytestmark = pytest.mark.timeout(120)


def task_of(request: Request) -> NewTask:
    url = canonicalize(request.url)
    assert isinstance(url, str), url
    return NewTask.from_request(request, url)


async def listing(request: web.Request) -> web.Response:
    return web.Response(text='<html><body><a href="/c/1">1</a><a href="/c/2">2</a>'
                             "</body></html>", content_type="text/html")


async def leaf(request: web.Request) -> web.Response:
    return web.Response(text=f"<html><body>leaf {request.match_info['i']}</body></html>",
                        content_type="text/html")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")
           and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return env


async def start_consumer(redis_url: str, crawl: str, out: Path, worker: str
                         ) -> asyncio.subprocess.Process:
    with (out.parent / f"{worker}.log").open("wb") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer", *consumer_args(redis_url, crawl, out),
            "--worker-id", worker, "--spider", SPIDER, env=child_env(), cwd=out.parent,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT)


def items_in(out: Path) -> list[tuple[str | None, Any]]:
    return [(key, item) for path in sorted(out.rglob("*.jsonl"))
            for line in path.read_text().splitlines() if line
            for key, item in zip(json.loads(line)["item_keys"], json.loads(line)["items"],
                                 strict=True)]


async def test_a_childs_label_and_data_reach_its_route_on_another_consumer_process(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with serve({"/list": listing}) as lists, serve({"/c/{i}": leaf}) as children:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([task_of(Request(lists.url("/list"), label="list", data={
            "children_at": children.base, "category": "books"}))])
        # The children's host is blocked: the first consumer can't take them.
        await hand_over_children(
            q, children.url("/"), tmp_path, "list",
            lambda worker: start_consumer(redis_url, crawl_name, out, worker))
    assert sorted(items_in(out)) == [
        (str(n), {"path": str(n), "label": "child", "worker": "w-child",
                  "data": {"category": "books", "found_by": "w-parent"},
                  "text": f"leaf {n}"}) for n in (1, 2)]
    assert sorted(s.path for s in children.seen) == ["/c/1", "/c/2"]


async def test_a_label_with_no_route_ends_dead_also_beside_a_handler(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """With --handler beside --spider, the handler is the default route: it parses the
    tasks without a label, never one whose label the spider has no route for (that one
    ends dead unknown_label, unfetched, as without a handler)."""
    async with serve({"/c/{i}": leaf}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([task_of(Request(site.url("/c/1"), label="ghost")),
                         task_of(Request(site.url("/c/2")))])
        assert await consume(redis_url, crawl_name, tmp_path / "out", "--spider",
                             str(ROOT / "tests" / "support" / "relay_spider.py"),
                             "--handler", "consumer_handlers:links") == 0
    [dead] = await q.dead_list(limit=10)
    assert (dead.url, dead.reason) == (site.url("/c/1"), "unknown_label")
    assert "no route for label 'ghost'" in dead.message
    assert [s.path for s in site.seen] == ["/c/2"]  # the handler's; the dead one unfetched
    stats = await q.stats()
    assert (stats.done, stats.dead) == (1, 1)


async def test_a_task_whose_label_has_no_route_ends_dead_with_its_reason_unfetched(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with serve({"/c/{i}": leaf}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings())
        await q.enqueue([
            task_of(Request(site.url("/c/1"), label="ghost")),  # a route this spider lacks
            task_of(Request(site.url("/c/2"))),  # no label, and the spider has no default
            task_of(Request(site.url("/c/3"), label="child",
                            data={"category": "x", "found_by": "test"})),
        ])
        proc = await start_consumer(redis_url, crawl_name, out, "w-1")
        try:
            assert await asyncio.wait_for(proc.wait(), 60) == 0, \
                (tmp_path / "w-1.log").read_text()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    dead = {d.url: d for d in await q.dead_list(limit=10)}
    assert sorted(dead) == [site.url("/c/1"), site.url("/c/2")]
    assert {(d.reason, d.attempts) for d in dead.values()} == {("unknown_label", 1)}
    assert "no route for label 'ghost'" in dead[site.url("/c/1")].message
    assert "no default route" in dead[site.url("/c/2")].message
    assert [s.path for s in site.seen] == ["/c/3"]  # the dead were never fetched
    stats = await q.stats()
    assert (stats.done, stats.dead, stats.dead_reasons.get("unknown_label")) == (1, 2, 2)
    assert [item["path"] for _, item in items_in(out)] == ["3"]


def shop_items(dest: Path) -> list[dict[str, Any]]:
    """The items gathered to `dest` and its item types' files (the example spider's items
    are products and reviews: items.product.jsonl, items.review.jsonl)."""
    return [json.loads(line) for path in (dest, type_path(dest, "product"),
                                          type_path(dest, "review"))
            for line in path.read_text().splitlines()]


def expected_shop_items(spec: SiteSpec) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for category in SHOP_CATEGORIES:
        for i in range(spec.products):
            p = product(category, i)
            found[str(p["sku"])] = p
            for review in reviews(str(p["sku"])):
                found[str(review["review"])] = review
    return found


@pytest.mark.slow
async def test_crawlq_run_crawls_the_example_spider_end_to_end(tmp_path: Path) -> None:
    spec = SiteSpec(pages=10, products=12)
    items_file = tmp_path / "items.jsonl"
    async with sample_site(spec=spec) as base:
        env = {**child_env(), "SHOP_URL": base}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
            "run", str(ROOT / "examples" / "demo_spider.py"), "--allow-private",
            "--set", "per_host_delay=0", "--set", "per_host_concurrency=8", "--consumers", "2",
            "--output", str(tmp_path / "run"), "--out", str(items_file), "--timeout", "90",
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = stdout.decode()
    assert proc.returncode == 0, text
    items = shop_items(items_file)
    want = expected_shop_items(spec)
    got = {str(i.get("review") or i["sku"]): i for i in items}
    assert len(items) == len(got)  # one line a key
    for sku, item in got.items():
        if "review" not in item:
            assert item.pop("url") == f"{base}/shop/{item['category']}/item/" \
                                      f"{sku.rpartition('-')[2]}"
    assert sorted(got) == sorted(want), text
    assert got == want
    reviews = sum("review" in item for item in want.values())
    assert "0 dead" in text and (f"items: product 36 in {type_path(items_file, 'product')}; "
                                 f"review {reviews} in {type_path(items_file, 'review')}") \
        in text


SEEDS_FILE = '''
from crawlq import Request, Spider
spider = Spider("seeds", policy={{"max_depth": 9}})
spider.route()(lambda response, ctx: None)
spider.route("list")(lambda response, ctx: None)

@spider.seeds
def seeds():
    yield "http://shop.test/"
    yield Request("http://shop.test/api", method="POST", body=b"{{}}", label={label!r},
                  data={{"page": 1}})
'''


async def test_the_producer_enqueues_a_spiders_start_once_and_refuses_a_label_with_no_route(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spider = tmp_path / "seeds.py"
    spider.write_text(SEEDS_FILE.format(label="list"))
    runs = []
    for _ in range(2):  # a second run (a schedule's) enqueues nothing new
        out = StringIO()
        code = await main_async(["--redis-url", redis_url, "--crawl", crawl_name, "--json",
                                 "--progress", "off", "--spider", str(spider)], out=out)
        assert code == 0
        runs.append(json.loads(out.getvalue().splitlines()[-1]))
    assert [(r["read"], r["enqueued"], r["duplicates"]) for r in runs] == [(2, 2, 0),
                                                                           (2, 0, 2)]
    stored = await read_policy(redis_client, crawl_name)
    assert stored is not None and stored.policy.max_depth == 9  # the spider's own

    spider.write_text(SEEDS_FILE.format(label="ghost"))
    out = StringIO()
    code = await main_async(["--redis-url", redis_url, "--crawl", crawl_name, "--json",
                             "--progress", "off", "--spider", str(spider)], out=out)
    assert code == 2
    assert "no route for label 'ghost'" in capsys.readouterr().err
    q = await LeasingQueue.existing(redis_client, crawl_name)
    assert (await q.stats()).pending == 2  # nothing more


async def crawl_killing_one(redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            *sink: str) -> LeasingQueue:
    """The example spider's crawl by consumers with `sink`'s args, one of them SIGKILLed
    while it holds leases: its tasks come back when their leases expire, another consumer
    runs their routes again. The crawl, done."""
    # Enough work left after the first 30 tasks that the doomed consumer is still at it
    # when it is caught holding leases, however fast the machine.
    spec = SiteSpec(pages=10, products=80)
    out = tmp_path / "out"
    example = str(ROOT / "examples" / "demo_spider.py")
    await create_policy(redis_client, crawl_name, {
        "per_host_delay": 0.0, "per_host_concurrency": 4, "max_depth": 50,
        "retry_base": 0.1, "retry_cap": 0.2}, by="test")
    procs: list[asyncio.subprocess.Process] = []

    async def consumer(name: str) -> asyncio.subprocess.Process:
        with (tmp_path / f"{name}.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "consumer",
                *consumer_args(redis_url, crawl_name, out / name), "--worker-id", name,
                "--spider", example, "--lease", "2", "--concurrency", "4", *sink,
                env={**child_env(), "SHOP_URL": base}, cwd=tmp_path,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        async with sample_site(spec=spec) as base:
            monkeypatch.setenv("SHOP_URL", base)  # the producer loads it here
            code = await main_async(["--redis-url", redis_url, "--crawl", crawl_name,
                                     "--progress", "off", "--spider", example],
                                    out=StringIO())
            assert code == 0
            q = await LeasingQueue.existing(redis_client, crawl_name)
            doomed = await consumer("w-doomed")
            await consumer("w-steady")

            async def under_way() -> bool:
                return (await q.stats()).done >= 30
            await until(under_way, 60, "30 tasks done")

            async def stopped_holding_leases() -> bool:
                assert doomed.returncode is None, "the crawl ended before the kill"
                doomed.send_signal(signal.SIGSTOP)  # frozen, then judged: no race
                if await owned_by(q, "w-doomed"):
                    return True
                doomed.send_signal(signal.SIGCONT)
                return False
            await until(stopped_holding_leases, 60, "the doomed consumer to hold leases")
            doomed.kill()  # SIGKILL: its leases are left to expire
            await doomed.wait()
            await consumer("w-late")
            for proc in procs[1:]:
                assert await asyncio.wait_for(proc.wait(), 90) == 0, \
                    (tmp_path / "w-late.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stats = await q.stats()
    assert (stats.dead, stats.active) == (0, 0)
    assert stats.counters.get("reclaimed", 0) >= 1  # the killed one held leases
    return q


@pytest.mark.slow
async def test_consumers_killed_mid_crawl_leave_every_item_once_by_key(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of a consumer in the middle of the example spider's crawl: the items
    gathered one a key are exactly the shop's."""
    await crawl_killing_one(redis_client, redis_url, crawl_name, tmp_path, monkeypatch)
    gather_items(tmp_path / "out", tmp_path / "items.jsonl")
    items = shop_items(tmp_path / "items.jsonl")
    got = {str(i.get("review") or i["sku"]): i for i in items}
    assert len(got) == len(items)
    for item in got.values():
        item.pop("url", None)
    assert got == expected_shop_items(SiteSpec(pages=10, products=80))


@pytest.mark.slow
async def test_two_item_types_into_postgres_with_a_consumer_killed_lose_and_double_no_row(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, *,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> None:
    """The example spider's products and reviews into PostgreSQL, kill -9 of a consumer
    mid-way: two tables, each keyed (a product and a review never share a table), every
    row there once."""
    await crawl_killing_one(redis_client, redis_url, crawl_name, tmp_path, monkeypatch,
                            "--sink", postgres_url)
    want = expected_shop_items(SiteSpec(pages=10, products=80))
    db = await asyncpg.connect(postgres_url)
    try:
        got = {table: [(r["key"], json.loads(r["item"]), r["fence"])
                       for r in await db.fetch(f"SELECT key, item, fence FROM {table}")]
               for table in ("product", "review")}
        assert await db.fetchval("SELECT count(*) FROM crawlq_items") == 0
    finally:
        await db.close()
    for table, field in (("product", "sku"), ("review", "review")):
        keys = [key for key, _, _ in got[table]]
        assert len(keys) == len(set(keys))  # a primary key: never doubled
        assert sorted(keys) == sorted(k for k, v in want.items() if field in v
                                      and (field == "review" or "review" not in v))
        for key, item, fence in got[table]:
            item.pop("url", None)
            assert item == want[key] and fence > 0


@pytest.mark.slow
async def test_crawlq_run_stopped_by_sigterm_stops_everything_it_started(
        tmp_path: Path) -> None:
    env = {**child_env(), "SHOP_URL": "http://127.0.0.1:9"}  # nothing answers
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
        "run", str(ROOT / "examples" / "demo_spider.py"), "--allow-private",
        "--output", str(tmp_path / "run"), env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True)
    assert proc.stdout is not None
    seen = []
    try:
        async with asyncio.timeout(60):
            while not any(line.startswith("started 2 consumers") for line in seen):
                seen.append((await proc.stdout.readline()).decode())
                assert seen[-1], "".join(seen)
        names = [m.split(" ", 1)[1] for m in group_members(proc.pid)]
        assert names.count("redis-server") == 1 and len(names) == 4, names
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest.decode()
    assert "interrupted: stopping the consumers and Redis" in rest.decode()
    assert group_members(proc.pid) == []


async def test_a_handler_and_a_spiders_default_route_both_parsing_unlabelled_is_exit_2(
        redis_url: str, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    example = str(ROOT / "examples" / "demo_spider.py")  # it has a default route
    assert await consume(redis_url, crawl_name, tmp_path, "--spider", example,
                         "--handler", "consumer.handlers:links", limit_s=30) == 2
    errors = [getattr(r, "error", "") for r in caplog.records if r.msg == "config_error"]
    assert "both parse requests without a label: drop one" in errors[-1]
    assert await consume(redis_url, crawl_name, tmp_path, "--spider",
                         str(tmp_path / "missing.py"), limit_s=30) == 2
    errors = [getattr(r, "error", "") for r in caplog.records if r.msg == "config_error"]
    assert "no such file" in errors[-1]


@pytest.mark.slow
async def test_crawlq_run_stopped_and_run_again_on_its_redis_goes_on_where_it_was(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    spec = SiteSpec(pages=10, products=25)
    items_file = tmp_path / "items.jsonl"
    async with sample_site(spec=spec) as base:
        argv = [sys.executable, "-c",
                "import sys; from console.cli import main; sys.exit(main())",
                "run", str(ROOT / "examples" / "demo_spider.py"), "--allow-private",
                "--redis-url", redis_url, "--crawl", crawl_name,
                "--set", "per_host_delay=0", "--set", "per_host_concurrency=2",
                "--output", str(tmp_path / "run"), "--out", str(items_file), "--resume"]
        env = {**child_env(), "SHOP_URL": base}
        first = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        try:
            async def some_done() -> bool:
                assert first.returncode is None
                if not await redis_client.exists(CrawlKeys.build(crawl_name).meta):
                    return False
                q = await LeasingQueue.existing(redis_client, crawl_name)
                return (await q.stats()).done >= 40
            await until(some_done, 60, "40 requests done")
            first.send_signal(signal.SIGTERM)
            await asyncio.wait_for(first.communicate(), 30)
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        q = await LeasingQueue.existing(redis_client, crawl_name)
        assert (await q.stats()).active > 0  # stopped half-way
        second = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(second.communicate(), 110)
    text = stdout.decode()
    assert second.returncode == 0, text
    assert "(1 seen before)" in text  # the start request: the crawl went on
    assert f"going on with crawl {crawl_name} in {redis_url}" in text
    items = shop_items(items_file)
    got = {str(i.get("review") or i["sku"]): i for i in items}
    for item in got.values():
        item.pop("url", None)
    assert got == expected_shop_items(spec)


@pytest.mark.slow
async def test_crawlq_run_hands_the_example_spiders_items_to_postgres_one_row_a_key(
        postgres_url: str, tmp_path: Path) -> None:
    spec = SiteSpec(pages=10, products=12)
    async with sample_site(spec=spec) as base:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
            "run", str(ROOT / "examples" / "demo_spider.py"), "--allow-private",
            "--set", "per_host_delay=0", "--set", "per_host_concurrency=8",
            "--output", str(tmp_path / "run"), "--sink", postgres_url,
            env={**child_env(), "SHOP_URL": base}, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        stdout, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = stdout.decode()
    assert proc.returncode == 0, text
    db = await asyncpg.connect(postgres_url)
    try:
        rows = {table: await db.fetch(f"SELECT key, item FROM {table}")
                for table in ("product", "review")}
        assert await db.fetchval("SELECT count(*) FROM crawlq_items") == 0  # none untyped
    finally:
        await db.close()
    got = {row["key"]: json.loads(row["item"]) for row in rows["product"] + rows["review"]}
    for item in got.values():
        item.pop("url", None)
    assert got == expected_shop_items(spec)  # keyed by sku and review: one row a key
    assert len(rows["product"]) == 36
    assert f"items: 36 rows in table product; {len(rows['review'])} rows in table review" \
        in text
    assert "password" not in text
