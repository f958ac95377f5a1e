"""The PostgreSQL sink (issue 32): items upserted by key under their lease's fencing token,
one transaction a batch, acked only once committed. A real postgres (tests/support/
postgres.py), real redis-server, real consumers as processes where a guarantee is about a
process: a stalled one (SIGSTOP past its lease) and killed ones (SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
import ujson
from aiohttp import web
from procs import JsonLog
from sites import start_site_process
from support.consume import consume, enqueue
from support.ports import closed_port
from support.postgres import PostgresServer, find_bindir
from support.routes import serve
from support.tcpgate import TcpGate

from common.errors import ConfigError
from common.exitcodes import EXIT_OK
from common.queue import LeasingQueue
from common.tasks.items import Item
from consumer.sinks import Record, SinkUnavailableError, make_sink, sink_target
from consumer.sinks.postgres import PostgresSink, PostgresTarget

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


def record(url: str, items: list[Any], *, fence: int, fetched_at: float = 1.7e9) -> Record:
    return Record(task_id="t", url=url, final_url=url, status=200, outcome="ok", headers={},
                  raw_headers=(), body=b"", bytes=0, elapsed=0.0, attempt=1,
                  fetched_at=fetched_at, worker="w", items=items, fence=fence)


@pytest.fixture
async def db(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_url)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[PostgresSink]:
    sink = make_sink(url, output_dir=Path("unused"), worker="w", crawl="c")
    assert isinstance(sink, PostgresSink)
    await sink.open()
    try:
        yield sink
    finally:
        await sink.close()


async def rows(db: asyncpg.Connection, table: str = "crawlq_items"
               ) -> dict[str, dict[str, Any]]:
    """key -> the row, its item decoded."""
    got = await db.fetch(f"SELECT * FROM {table} ORDER BY 1")
    return {r[0]: {**dict(r), "item": ujson.loads(r["item"])} for r in got}


# -- the upsert -----------------------------------------------------------------------------


async def test_items_are_upserted_by_key_and_rows_carry_the_fence(
        postgres_url: str, db: asyncpg.Connection) -> None:
    async with opened(postgres_url) as sink:
        await sink.write([record("http://a.test/1", [{"v": 1}, Item("sku-9", {"v": 2})],
                                 fence=5)])
        await sink.write([record("http://a.test/2", [], fence=6)])  # no items: no rows
        got = await rows(db)
        assert {k: (r["item"], r["fence"], r["url"]) for k, r in got.items()} == {
            "http://a.test/1#0": ({"v": 1}, 5, "http://a.test/1"),
            "sku-9": ({"v": 2}, 5, "http://a.test/1"),
        }
        assert got["sku-9"]["crawled_at"].timestamp() == 1.7e9
        # The same task fetched again (another lease, a newer token): the same rows, new data.
        await sink.write([record("http://a.test/1", [{"v": 3}, Item("sku-9", {"v": 4})],
                                 fence=8)])
        again = await rows(db)
        assert {k: (r["item"], r["fence"]) for k, r in again.items()} == {
            "http://a.test/1#0": ({"v": 3}, 8), "sku-9": ({"v": 4}, 8)}
        # The same lease writing again (a retried batch): its equal token replaces.
        await sink.write([record("http://a.test/1", [{"v": 5}], fence=8)])
        assert (await rows(db))["http://a.test/1#0"]["item"] == {"v": 5}
        assert sink.stale_rows == 0


async def test_a_batch_with_duplicate_keys_writes_one_row_a_key_the_newest_fence_winning(
        postgres_url: str, db: asyncpg.Connection) -> None:
    async with opened(postgres_url) as sink:
        await sink.write([
            record("http://a.test/1", [Item("k", {"from": "fence 7"})], fence=7),
            record("http://a.test/2", [Item("k", {"from": "fence 6"})], fence=6),
            record("http://a.test/3", [Item("j", {"from": "first"})], fence=3),
            record("http://a.test/4", [Item("j", {"from": "last"})], fence=3),
            record("http://a.test/5", [{"x": 1}], fence=1),
            record("http://a.test/5", [{"x": 2}], fence=2),
        ])
    got = await rows(db)
    assert {k: (r["item"], r["fence"]) for k, r in got.items()} == {
        "k": ({"from": "fence 7"}, 7), "j": ({"from": "last"}, 3),
        "http://a.test/5#0": ({"x": 2}, 2)}


async def test_an_older_fence_never_replaces_a_newer_row(
        postgres_url: str, db: asyncpg.Connection) -> None:
    async with opened(postgres_url) as sink:
        await sink.write([record("http://a.test/1", [{"by": "successor"}], fence=9)])
        await sink.write([record("http://a.test/1", [{"by": "stale"}, {"new": 1}], fence=4)])
        got = await rows(db)
        assert got["http://a.test/1#0"]["item"] == {"by": "successor"}
        assert got["http://a.test/1#0"]["fence"] == 9
        assert got["http://a.test/1#1"]["item"] == {"new": 1}  # nobody newer wrote it
        assert sink.stale_rows == 1


async def test_consumers_writing_the_same_keys_at_once_never_deadlock(
        postgres_url: str, db: asyncpg.Connection) -> None:
    """Items keyed by declared fields (a product on many list pages) reach the table from
    several consumers at once, in whatever order their pages came: each batch takes its
    rows' locks in one order, so no two batches wait on each other."""
    keys = [f"sku-{i:03d}" for i in range(300)]

    async def writer(order: list[str], fence: int) -> None:
        async with opened(postgres_url) as sink:
            for round_ in range(6):
                await sink.write([record(f"http://a.test/{k}", [Item(k, {"r": round_})],
                                         fence=fence) for k in order])

    await asyncio.gather(writer(keys, 1), writer(keys[::-1], 1),
                         writer(keys[150:] + keys[:150], 1))
    assert len(await rows(db)) == len(keys)


async def test_odd_item_values_are_stored_as_json(postgres_url: str,
                                                  db: asyncpg.Connection) -> None:
    async with opened(postgres_url) as sink:
        await sink.write([record("http://a.test/1", [
            "a string", [1, 2], {"nul": "a\x00b", "nan": float("nan"), "set": {1}}], fence=1)])
    got = await rows(db)
    assert [got[f"http://a.test/1#{i}"]["item"] for i in range(3)] == [
        "a string", [1, 2], {"nul": "ab", "nan": None, "set": [1]}]


async def test_a_users_table_and_columns(postgres_url: str, db: asyncpg.Connection) -> None:
    await db.execute("CREATE SCHEMA shop; CREATE TABLE shop.products (sku text PRIMARY KEY, "
                     "doc jsonb, token bigint, seen timestamptz, note text DEFAULT 'kept')")
    url = (f"{postgres_url}?table=shop.products&key=sku&item=doc&fence=token&url="
           "&crawled_at=seen&application_name=crawlq-test")
    async with opened(url) as sink:
        await sink.write([record("http://a.test/1", [Item("p1", {"price": 3})], fence=2)])
        await sink.write([record("http://a.test/1", [Item("p1", {"price": 1})], fence=1)])
        assert await db.fetchval("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE application_name = 'crawlq-test'") == 1
    got = await db.fetch("SELECT sku, doc, token, seen, note FROM shop.products")
    assert [(r["sku"], ujson.loads(r["doc"]), r["token"], r["note"]) for r in got] == [
        ("p1", {"price": 3}, 2, "kept")]
    assert got[0]["seen"].timestamp() == 1.7e9


async def test_a_login_that_may_only_write_rows_of_an_existing_table_is_enough(
        postgres_url: str, db: asyncpg.Connection) -> None:
    role = f"writer_{os.getpid()}_{time.monotonic_ns()}"
    await db.execute("CREATE TABLE crawlq_items (key text PRIMARY KEY, item jsonb NOT NULL, "
                     "fence bigint NOT NULL, url text, crawled_at timestamptz)")
    await db.execute(f"CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; "
                     f"GRANT SELECT, INSERT, UPDATE ON crawlq_items TO {role}")
    as_writer = postgres_url.replace("postgres://postgres@", f"postgres://{role}@")
    async with opened(as_writer) as sink:
        await sink.write([record("http://a.test/1", [{"v": 1}], fence=1)])
    assert list(await rows(db)) == ["http://a.test/1#0"]


async def test_items_of_two_types_go_to_two_tables_each_keyed_in_one_transaction(
        postgres_url: str, db: asyncpg.Connection) -> None:
    """A product and a review with the same key are two rows, in their own tables; a
    stale lease's write to either replaces nothing; an untyped item goes to the sink's."""
    sink = make_sink(postgres_url, output_dir=Path("unused"), worker="w", crawl="c",
                     item_types=["review", "product"], untyped=False)
    assert isinstance(sink, PostgresSink) and sink.tables == ["product", "review"]
    await sink.open()
    try:
        assert await db.fetchval("SELECT to_regclass('crawlq_items')") is None  # none untyped
        await sink.write([
            record("http://a.test/p", [Item("k1", {"name": "book"}, "product"),
                                       Item("k1", {"stars": 5}, "review")], fence=5),
            record("http://a.test/r", [Item("", {"stars": 1}, "review")], fence=5)])
        await sink.write([record("http://a.test/p", [Item("k1", {"name": "old"}, "product"),
                                                     Item("k1", {"stars": 0}, "review"),
                                                     {"loose": 1}], fence=4)])
        assert {k: (r["item"], r["fence"]) for k, r in (await rows(db, "product")).items()} \
            == {"k1": ({"name": "book"}, 5)}
        assert {k: (r["item"], r["fence"]) for k, r in (await rows(db, "review")).items()} \
            == {"k1": ({"stars": 5}, 5), "http://a.test/r#0": ({"stars": 1}, 5)}
        assert list(await rows(db)) == ["http://a.test/p#2"]  # made when it first came
        assert sink.stale_rows == 2
    finally:
        await sink.close()


async def test_a_types_table_is_in_the_schema_the_table_option_names(
        postgres_url: str, db: asyncpg.Connection) -> None:
    await db.execute("CREATE SCHEMA shop")
    async with opened(f"{postgres_url}?table=shop.items") as sink:
        await sink.write([record("http://a.test/1", [Item("r1", {"stars": 4}, "review")],
                                 fence=1)])
    assert list(await rows(db, "shop.review")) == ["r1"]


def test_an_item_type_must_be_able_to_name_a_table_and_a_file() -> None:
    for bad in ("Review", "../x", "a-b", "9lives", "x" * 64):
        with pytest.raises(ValueError, match="item_type"):
            Item("k", {}, bad)
    assert Item("k", {}, "review_2").type == "review_2"


async def test_a_database_that_refuses_says_why_in_one_line_and_what_to_do(
        postgres_url: str, db: asyncpg.Connection) -> None:
    """Connection refused, no such database, a login without rights: each its own advice
    (not the file sinks' "fix the volume"), a setting to fix (ConfigError) or a database
    not there now (SinkUnavailableError: the consumer exits 6)."""
    closed = f"postgres://postgres@127.0.0.1:{closed_port()}/x"
    with pytest.raises(SinkUnavailableError) as down:
        async with opened(closed):
            pass
    assert "refused the connection" in str(down.value) and "host and port" in str(down.value)
    assert "\n" not in str(down.value) and "volume" not in str(down.value)
    with pytest.raises(ConfigError, match=r"does not exist.*createdb"):
        async with opened(postgres_url.rsplit("/", 1)[0] + "/no_such_db"):
            pass
    role = f"reader_{os.getpid()}_{time.monotonic_ns()}"
    await db.execute("CREATE TABLE crawlq_items (key text PRIMARY KEY, item jsonb NOT NULL, "
                     "fence bigint NOT NULL, url text, crawled_at timestamptz)")
    await db.execute(f"CREATE ROLE {role} LOGIN")
    as_reader = postgres_url.replace("postgres://postgres@", f"postgres://{role}@")
    with pytest.raises(ConfigError) as refused:
        async with opened(as_reader):
            pass
    assert f"GRANT SELECT, INSERT, UPDATE ON crawlq_items TO {role}" in str(refused.value)


@pytest.mark.integration
async def test_a_wrong_password_says_where_a_password_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and postgres are not installed (apt: postgresql)")
    with PostgresServer(bindir, password="right") as server:
        monkeypatch.setenv("PGPASSWORD", "wrong")
        with pytest.raises(ConfigError) as refused:
            async with opened(server.url()):
                pass
        assert "refused the login of user postgres" in str(refused.value)
        assert "PGPASSWORD or a ~/.pgpass line" in str(refused.value)
        monkeypatch.setenv("PGPASSWORD", "right")
        async with opened(server.url()) as sink:  # the password from the environment
            await sink.write([record("http://a.test/1", [{"v": 1}], fence=1)])


async def test_a_table_without_a_unique_key_column_is_a_config_error(
        postgres_url: str, db: asyncpg.Connection) -> None:
    await db.execute("CREATE TABLE loose (key text, item jsonb, fence bigint, url text, "
                     "crawled_at timestamptz)")
    sink = PostgresSink(f"{postgres_url}?table=loose")
    with pytest.raises(ConfigError, match="must be unique"):
        await sink.open()
    await sink.close()


def test_the_url_is_checked_and_its_password_never_shown() -> None:
    for bad, says in [("postgres://h/db?key=", "needs a column for key"),
                      ("postgres://h/db?timeout=0", "timeout='0'"),
                      ("postgres://h/db?table=.x", "name a table"),
                      ("parquet://h/db", "unknown sink")]:
        with pytest.raises(ConfigError, match=says):
            make_sink(bad, output_dir=Path("unused"), worker="w", crawl="c")
    sink = make_sink("postgresql://crawler:s3cret@db.test:5433/crawl?table=t&sslmode=disable",
                     output_dir=Path("unused"), worker="w", crawl="c")
    kind, where = sink_target(sink)
    assert kind == "postgres" and "s3cret" not in where
    assert where == "postgresql://***@db.test:5433/crawl table t"
    with pytest.raises(ConfigError) as refused:
        make_sink("postgress://crawler:s3cret@db.test/crawl", output_dir=Path("unused"),
                  worker="w", crawl="c")
    assert "s3cret" not in str(refused.value)
    target = PostgresTarget.parse("postgres://u:p@h/d?table=t&sslmode=disable&key=k")
    assert target.dsn == "postgres://u:p@h/d?sslmode=disable"
    assert dict(target.columns)["key"] == "k"


async def test_a_probe_writes_nothing_and_fails_where_a_write_would(
        postgres_url: str, db: asyncpg.Connection) -> None:
    async with opened(postgres_url) as sink:
        await sink.probe()
        assert await rows(db) == {}, "a probe left its row behind"
        await db.execute("ALTER TABLE crawlq_items ADD CONSTRAINT refuse CHECK (false)")
        with pytest.raises(asyncpg.CheckViolationError):
            await sink.probe()
        await db.execute("ALTER TABLE crawlq_items DROP CONSTRAINT refuse")
        await sink.probe()  # connected again after the failure
        assert await rows(db) == {}


async def test_a_database_that_hangs_fails_the_write_at_its_timeout(
        postgres_server: PostgresServer, postgres_url: str, db: asyncpg.Connection) -> None:
    async with TcpGate(postgres_server.port).running() as gate:
        through_gate = postgres_url.replace(f":{postgres_server.port}/", f":{gate.port}/")
        async with opened(f"{through_gate}?timeout=1") as sink:
            gate.hold()  # the database answers nothing
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await sink.write([record("http://a.test/1", [{"v": 1}], fence=1)])
            assert time.monotonic() - started < 10
            gate.release()  # the held statement may still land, late: under an older fence
            await sink.write([record("http://a.test/1", [{"v": 2}], fence=2)])
    assert (await rows(db))["http://a.test/1#0"]["item"] == {"v": 2}


# -- delivery: acked only once committed ----------------------------------------------------


async def test_a_refused_write_acks_nothing_until_the_database_takes_it(
        *, redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        postgres_url: str, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    # The database refuses every row (a constraint no row meets) until the operator drops it.
    await db.execute("CREATE TABLE crawlq_items (key text PRIMARY KEY, item jsonb NOT NULL, "
                     "fence bigint NOT NULL, url text, crawled_at timestamptz, "
                     "CONSTRAINT refuse CHECK (false))")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html>x</html>", content_type="text/html")

    async with serve({"/p/{i}": page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(30)]
        queue = await enqueue(redis_client, crawl_name, urls)
        running = asyncio.create_task(consume(
            redis_url, crawl_name, tmp_path, "--sink", postgres_url, "--concurrency", "4",
            "--handler", "consumer_handlers:extract", "--sink-retry-for", "60s", limit_s=90))
        deadline = time.monotonic() + 30
        while sum(r.getMessage() == "sink_write_failed" for r in caplog.records) < 1 \
                or not any(r.getMessage() == "sink_probe_failed" for r in caplog.records):
            assert time.monotonic() < deadline, "the database never refused a write"
            assert not running.done(), "the consumer finished while the database refused " \
                f"every row (exit {running.result()})"
            await asyncio.sleep(0.05)
        stats = await queue.stats()
        assert stats.done == 0, "a task was acked while the database refused its rows"
        assert await db.fetchval("SELECT count(*) FROM crawlq_items") == 0
        await db.execute("ALTER TABLE crawlq_items DROP CONSTRAINT refuse")
        assert await running == EXIT_OK
    stats = await queue.stats()
    assert (stats.done, stats.pending, stats.leased, stats.dead) == (len(urls), 0, 0, 0)
    assert set(await rows(db)) == {f"{u}#{n}" for u in urls for n in range(2)}


async def test_a_database_down_mid_crawl_loses_nothing(
        *, redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer")
    url = own_postgres.url()

    async def page(request: web.Request) -> web.Response:
        await asyncio.sleep(0.02)
        return web.Response(text="<html>x</html>", content_type="text/html")

    async def written() -> int:
        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM crawlq_items"))
        except asyncpg.UndefinedTableError:  # the consumer has not opened its sink yet
            return 0
        finally:
            await conn.close()

    def failed() -> bool:
        return any(r.getMessage() == "sink_write_failed" for r in caplog.records)

    async with serve({"/p/{i}": page}) as site:
        urls = [site.url(f"/p/{i}") for i in range(150)]
        queue = await enqueue(redis_client, crawl_name, urls)
        running = asyncio.create_task(consume(
            redis_url, crawl_name, tmp_path, "--sink", url, "--concurrency", "4",
            "--handler", "consumer_handlers:extract", "--sink-retry-for", "60s", limit_s=90))
        deadline = time.monotonic() + 30
        while await written() == 0:
            assert time.monotonic() < deadline, "nothing was written"
            await asyncio.sleep(0.05)
        own_postgres.down()
        while not failed():
            assert time.monotonic() < deadline, "no write failed with the database down"
            assert not running.done()
            await asyncio.sleep(0.05)
        done = (await queue.stats()).done
        assert done < len(urls), "the crawl ended before the database went down"
        await asyncio.sleep(1)
        assert (await queue.stats()).done == done, "acked while the database was down"
        own_postgres.up()
        assert await running == EXIT_OK
    stats = await queue.stats()
    assert (stats.done, stats.pending, stats.leased, stats.dead) == (len(urls), 0, 0, 0)
    conn = await asyncpg.connect(url)
    try:
        assert set(await rows(conn)) == {f"{u}#{n}" for u in urls for n in range(2)}
    finally:
        await conn.close()


# -- real consumer processes ----------------------------------------------------------------


@dataclass
class Proc(JsonLog):
    name: str
    worker_id: str
    proc: asyncio.subprocess.Process
    log_path: Path


class Consumers:
    """`python -m consumer` children of one test, killed at its end."""

    def __init__(self, redis_url: str, crawl: str, tmp_path: Path) -> None:
        self.redis_url, self.crawl, self.tmp_path = redis_url, crawl, tmp_path
        self.children: list[Proc] = []

    async def start(self, name: str, sink: str, *args: str) -> Proc:
        worker_id = f"w-{name}-{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env.update(CRAWLQ_LOG_FORMAT="json",
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
        log_path = self.tmp_path / f"{name}.log"
        with log_path.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "consumer", "--redis-url", self.redis_url,
                "--crawl", self.crawl, "--worker-id", worker_id, "--allow-private",
                "--http-port", "-1", "--empty-grace", "0", "--retry-base", "0.1",
                "--per-host-concurrency", "0", "--per-host-delay", "0", "--ignore-robots",
                "--handler", "consumer_handlers:extract", "--sink", sink, *args,
                cwd=self.tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT)
        child = Proc(name, worker_id, proc, log_path)
        self.children.append(child)
        return child

    async def close(self) -> None:
        for child in self.children:
            await child.kill()


@pytest.fixture
async def consumers(redis_url: str, crawl_name: str,
                    tmp_path: Path) -> AsyncIterator[Consumers]:
    spawned = Consumers(redis_url, crawl_name, tmp_path)
    try:
        yield spawned
    finally:
        await spawned.close()


async def until(pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_stale_consumers_late_write_does_not_replace_its_successors_row(
        *, consumers: Consumers, redis_client: aioredis.Redis, crawl_name: str,
        postgres_server: PostgresServer, postgres_url: str, db: asyncpg.Connection) -> None:
    """a writes its result, its statement held on the way to the database; a is frozen
    (SIGSTOP) past its lease; b reclaims the task, fetches it and writes; then a's
    statement reaches the database: b's row must stay."""
    async with start_site_process(delay_ms=1500) as site, \
            TcpGate(postgres_server.port).running() as gate:
        url = site.url("/p/1")
        queue = await enqueue(redis_client, crawl_name, [url])
        through_gate = postgres_url.replace(f":{postgres_server.port}/", f":{gate.port}/")
        a = await consumers.start("a", through_gate, "--lease", "2s", "--concurrency", "1")

        async def fetching() -> bool:
            return (await site.stats()).total() >= 1

        await until(fetching, 30, "a to fetch the page")
        gate.hold()  # a's connection is open and its statement prepared: what comes is its write

        async def writing() -> bool:
            return gate.held_bytes > 0

        await until(writing, 30, "a to write its rows")
        a.proc.send_signal(signal.SIGSTOP)
        b = await consumers.start("b", postgres_url, "--lease", "2s", "--exit-when-empty")
        assert await b.wait(60) == 0, b.log_text()[-3000:]
        stats = await queue.stats()
        assert stats.done == 1 and stats.counters.get("reclaimed", 0) == 1
        assert {r["item"]["worker"] for r in (await rows(db)).values()} == {b.worker_id}

        gate.release()  # a's late statement reaches the database now

        async def answered() -> bool:
            return gate.replied_bytes > 0

        await until(answered, 30, "the database to answer a's late write")
        got = await rows(db)
        assert {r["item"]["worker"] for r in got.values()} == {b.worker_id}, \
            "a stale lease's late write replaced its successor's row"
        a.proc.send_signal(signal.SIGCONT)

        async def a_saw_it() -> bool:
            return a.event("sink_stale_rows") is not None

        await until(a_saw_it, 30, "a to see its rows refused as stale")
        a.proc.send_signal(signal.SIGTERM)
        assert await a.wait(30) == 0, a.log_text()[-3000:]
    assert (await queue.stats()).done == 1
    assert len(await rows(db)) == 2


async def test_kill_9_of_consumers_in_an_extraction_crawl_loses_no_row(
        consumers: Consumers, redis_client: aioredis.Redis, crawl_name: str,
        postgres_url: str, db: asyncpg.Connection) -> None:
    n = 400
    seed = random.randrange(2**32)
    rng = random.Random(seed)  # the kill moments: named in every failure, to replay them
    async with start_site_process(delay_ms=20) as site:
        urls = [site.url(f"/p/{i}") for i in range(n)]
        queue: LeasingQueue = await enqueue(redis_client, crawl_name, urls)
        common = ("--concurrency", "4", "--lease", "2s", "--exit-when-empty")
        live = [await consumers.start(f"c{i}", postgres_url, *common) for i in range(3)]
        kills = 0
        for round_ in range(4):
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            if (await queue.stats()).done >= n:
                break
            victim = live.pop(rng.randrange(len(live)))
            victim.proc.kill()  # SIGKILL: mid-fetch, mid-write or mid-ack, as it comes
            assert await victim.wait(10) == -signal.SIGKILL
            kills += 1
            live.append(await consumers.start(f"r{round_}", postgres_url, *common))
        assert kills >= 1, f"the crawl ended before any kill (seed {seed})"
        for child in live:
            assert await child.wait(90) == 0, child.log_text()[-3000:]
    stats = await queue.stats()
    assert (stats.done, stats.pending, stats.leased, stats.waiting, stats.dead) == \
        (n, 0, 0, 0, 0), f"seed {seed}"
    got = await db.fetch("SELECT key, item, fence, url FROM crawlq_items")
    keys = [r["key"] for r in got]
    assert len(keys) == len(set(keys)), f"a key written twice (seed {seed})"
    assert set(keys) == {f"{u}#{i}" for u in urls for i in range(2)}, \
        f"rows missing (seed {seed})"
    for r in got:
        item = ujson.loads(r["item"])
        assert r["key"] == f"{item['url']}#{item['n']}" and r["url"] == item["url"]
        assert r["fence"] > 0
