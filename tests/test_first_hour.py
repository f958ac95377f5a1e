"""A spider's first hour (issue 44), as a newcomer lives it: the real commands (``crawlq
run``, ``crawlq-producer``, ``crawlq-consumer``, ``crawlq dead``) as processes, on the
demo shop (``console.demo.site``: 3 categories of 25 products, 10 a page).

Five spiders: two in turn on a Redis of their own (the second ``--out`` holds its own
item only), a follow-every-link spider with the defaults (75 of 75 products: no depth
cut), a route that raises (named with its file and line, no traceback), two consumers on
one machine (the second takes a free port), and the fleet seeded by ``crawlq-producer
--spider`` without ``--crawl`` (the crawl is the spider's). Then each mistake of the
first hour: one line, its documented exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from support.ports import closed_port
from support.postgres import PostgresServer, find_bindir

from common.exitcodes import EXIT_NOTHING_FETCHED, EXIT_ROUTES_FAILED, EXIT_SINK, EXIT_USAGE
from common.fleet.workers import WorkerRegistry
from common.queue import LeasingQueue
from console.demo.site import SiteSpec, sample_site
from console.run.ownership import gather_items

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "demo_spider.py"
CLI = "import sys; from console.cli import main; sys.exit(main())"

# Each runs whole crawls as processes (the slowest three crawlq runs): a loaded machine
# (three workers and a busy core) takes minutes where an idle one takes seconds.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TITLES = '''
import os
from crawlq import Spider

spider = Spider("{name}", start=[os.environ["SHOP_URL"] + "/shop"])


@spider.route()
async def page(response, ctx):
    ctx.emit({{"title": response.css("title::text").get()}})
'''

EVERY_LINK = '''
import os
from crawlq import Spider

spider = Spider("{name}", start=[os.environ["SHOP_URL"] + "/shop"])


@spider.route()
async def page(response, ctx):
    ctx.follow(css="a")
    if response.css(".sku"):
        ctx.emit({{"sku": response.css(".sku::text").get()}})
'''

RAISING = '''
import os
from crawlq import Spider

spider = Spider("{name}", start=[os.environ["SHOP_URL"] + "/shop"], item_key="sku")


@spider.route()
async def shop(response, ctx):
    ctx.follow(css="a.category", label="list")


@spider.route("list")
async def product_list(response, ctx):
    ctx.follow(css="li.product a::attr(href)", label="product")


@spider.route("product", item_type="product")
async def product(response, ctx):
    sku = response.css(".sku::text").get()
    price = None if sku.endswith("-3") else response.css(".price::text").get()
    ctx.emit({{"sku": sku, "price": float(price)}})
'''
#: The line of RAISING's float(None).
RAISING_LINE = RAISING.splitlines().index(
    '    ctx.emit({{"sku": sku, "price": float(price)}})') + 1

ALWAYS_RAISING = '''
import os
from crawlq import Spider

spider = Spider("{name}", start=[os.environ["SHOP_URL"] + "/shop"])


@spider.route()
async def page(response, ctx):
    raise KeyError("price")
'''


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "PG"))
           and k != "REDIS_URL"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def spider_file(tmp_path: Path, source: str, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source.format(name=name))
    return path


def example_named(tmp_path: Path, name: str) -> Path:
    """The example spider, its crawl named `name` (the tests share one Redis)."""
    path = tmp_path / f"{name}.py"
    path.write_text(EXAMPLE.read_text().replace('"demo-shop"', f'"{name}"'))
    return path


async def run(*argv: str, cwd: Path, env: dict[str, str], limit_s: float = 240
              ) -> tuple[int, str]:
    """A command run to its end: its exit code and its output (stdout and stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def crawlq(*argv: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    return await run(sys.executable, "-c", CLI, *argv, cwd=cwd, env=env)


def no_traceback(text: str, *logs: Path) -> None:
    assert "Traceback" not in text, text
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def files(where: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in where.glob(pattern))


def lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
async def shop() -> AsyncIterator[str]:
    async with sample_site(spec=SiteSpec(pages=10)) as base:
        yield base


def fast(*extra: str) -> list[str]:
    return ["--allow-private", "--set", "per_host_delay=0", "--set", "per_host_concurrency=8",
            *extra]


# -- five spiders ---------------------------------------------------------------------------


async def test_two_spiders_in_turn_on_a_redis_of_their_own_each_out_holds_its_own(
        shop: str, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    """The issue's first mistake: with REDIS_URL set, a one-page spider's --out held the
    example spider's 225 items from ./crawlq-run/results. A run owns its run now."""
    env = child_env(SHOP_URL=shop, REDIS_URL=redis_url)
    first = example_named(tmp_path, f"{crawl_name}-shop")
    code, text = await crawlq("run", str(first), *fast("--out", "a.jsonl"), cwd=tmp_path,
                              env=env)
    assert code == 0, text
    assert len(lines(tmp_path / "a.product.jsonl")) == 75
    titles = spider_file(tmp_path, TITLES, f"{crawl_name}-titles")
    code, text = await crawlq("run", str(titles), *fast("--out", "t.jsonl"), cwd=tmp_path,
                              env=env)
    assert code == 0, text
    assert lines(tmp_path / "t.jsonl") == [{"title": "shop"}]
    assert f"\nitems: 1 in {tmp_path / 't.jsonl'}\n" in text  # and no other file
    assert files(tmp_path, "t*.jsonl") == ["t.jsonl"]
    code, again = await crawlq("run", str(titles), *fast("--out", "t.jsonl"), cwd=tmp_path,
                               env=env)  # the same spider again: its crawl afresh
    assert code == 0, again
    assert f"reset crawl {crawl_name}-titles in {redis_url} (1 done, 0 to do, 0 dead from " \
           "an earlier run)" in again
    assert "(0 seen before)" in again and lines(tmp_path / "t.jsonl") == [{"title": "shop"}]


async def test_a_follow_every_link_spider_with_the_defaults_gets_every_product(
        shop: str, crawl_name: str, tmp_path: Path) -> None:
    """Page 3 of each category is at depth 4: max_depth was 3 unless set (60 of 75)."""
    every = spider_file(tmp_path, EVERY_LINK, f"{crawl_name}-every")
    code, text = await crawlq("run", str(every), *fast("--out", "e.jsonl"), cwd=tmp_path,
                              env=child_env(SHOP_URL=shop))
    assert code == 0, text
    skus = sorted(item["sku"] for item in lines(tmp_path / "e.jsonl"))
    assert len(skus) == len(set(skus)) == 75, text
    assert f"items: 75 in {tmp_path / 'e.jsonl'}" in text and "too_deep" not in text
    # A depth the spider's user sets cuts, and the summary says so and what to change.
    code, text = await crawlq("run", str(every), *fast("--out", "e.jsonl", "--set",
                                                       "max_depth=2"),
                              cwd=tmp_path, env=child_env(SHOP_URL=shop))
    assert code == 0, text
    assert "    links too_deep " in text and "past the crawl's max_depth: raise it " \
        "(max_depth=none: no limit)" in text
    assert len(lines(tmp_path / "e.jsonl")) < 75


async def test_a_route_that_raises_is_named_with_its_file_and_line_without_a_traceback(
        shop: str, redis_url: str, crawl_name: str, tmp_path: Path) -> None:
    name = f"{crawl_name}-raising"
    raising = spider_file(tmp_path, RAISING, name)
    env = child_env(SHOP_URL=shop, REDIS_URL=redis_url)
    code, text = await crawlq("run", str(raising), *fast("--set", "retry_base=0.1s"),
                              cwd=tmp_path, env=env)
    where = f"{raising.name}:{RAISING_LINE} in product"  # relative to where it runs
    logs = sorted((tmp_path / "crawlq-run" / "logs").glob("*.log"))
    no_traceback(text, *logs)
    assert code == 0, text  # some pages raised, the others' items were delivered
    error = "TypeError: float() argument must be a string or a real number, not 'NoneType'"
    assert f"error: route_error at {where}: {error} on {shop}/shop/" in text  # as it came
    assert f"    {where}: {error} (3 tasks, e.g. {shop}/shop/" in text  # in the summary
    assert "dead handler_error 3: a route raised" in text
    assert len(lines(tmp_path / "crawlq-run" / "items.product.jsonl")) == 27
    assert sum(f'where="{where}"' in log.read_text() for log in logs) >= 1  # logged
    # The dead letters say where too, listed and shown whole.
    code, listed = await crawlq("dead", "ls", "--crawl", name, cwd=tmp_path, env=env)
    assert code == 0 and listed.count(where) == 3, listed
    task_id = listed.split()[0]
    code, shown = await crawlq("dead", "show", task_id, "--crawl", name, cwd=tmp_path,
                               env=env)
    assert code == 0, shown
    assert f"message   {where}: {error}" in shown and "label     product" in shown
    assert "reason    handler_error" in shown and "attempts  3" in shown


async def test_two_consumers_on_one_machine_the_second_takes_a_free_port(
        redis_client: aioredis.Redis, redis_url: str, shop: str, crawl_name: str,
        tmp_path: Path) -> None:
    """The default port (9410) taken, a consumer takes a free one and says so; a port
    asked for and taken is one line and exit 2."""
    name = f"{crawl_name}-two"
    spider = example_named(tmp_path, name)
    env = child_env(SHOP_URL=shop, REDIS_URL=redis_url)
    code, text = await run(sys.executable, "-m", "producer", "--spider", str(spider),
                           "--set", "per_host_delay=0", cwd=tmp_path, env=env)
    assert code == 0, text
    held = socket.socket()
    with contextlib.closing(held):
        try:  # the default port: held here, or by someone else on this machine
            held.bind(("127.0.0.1", 9410))
            held.listen()
            ours = True
        except OSError:
            ours = False
        procs, logs = [], []
        for n in (1, 2):
            logs.append(tmp_path / f"consumer-{n}.log")
            with logs[-1].open("wb") as log:
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "consumer", "--spider", str(spider),
                    "--allow-private", "--exit-when-empty", "--output", f"out-{n}",
                    cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                    stderr=asyncio.subprocess.STDOUT))
        try:
            codes = [await asyncio.wait_for(p.wait(), 120) for p in procs]
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
        no_traceback("", *logs)
        if ours:
            assert all("http_port_taken port=9410 took=" in log.read_text() for log in logs)
        port = held.getsockname()[1] if ours else 9410
        code, text = await run(sys.executable, "-m", "consumer", "--spider", str(spider),
                               "--http-port", str(port), "--exit-when-empty",
                               cwd=tmp_path, env=env, limit_s=60)
    assert code == EXIT_USAGE, text
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    assert f"--http-port {port} on 127.0.0.1 is in use" in text
    q = await LeasingQueue.existing(redis_client, name)
    done = (await q.stats()).counters
    assert done["outcome:ok"] == 190  # both consumers worked the spider's crawl (probes apart)


async def test_the_fleet_seeded_by_the_producer_without_crawl_works_the_spiders_crawl(
        redis_client: aioredis.Redis, redis_url: str, shop: str, crawl_name: str,
        tmp_path: Path) -> None:
    """docs/spiders.md's fleet section as written: crawlq-producer --spider (no --crawl)
    seeds the crawl named after the spider, which crawlq-consumer --spider works."""
    name = f"{crawl_name}-fleet"
    spider = example_named(tmp_path, name)
    env = child_env(SHOP_URL=shop, REDIS_URL=redis_url)
    code, text = await run(sys.executable, "-m", "producer", "--spider", str(spider),
                           "--set", "per_host_delay=0", "--set", "per_host_concurrency=8",
                           cwd=tmp_path, env=env)
    assert code == 0 and f"crawl {name}" in text, text
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer", "--spider", str(spider), "--allow-private",
        "--http-port", "0", "--exit-when-empty", "--output", f"results/c{n}",
        cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        for n in (1, 2)]
    assert [await asyncio.wait_for(p.wait(), 120) for p in procs] == [0, 0]
    stats = await (await LeasingQueue.existing(redis_client, name)).stats()
    assert (stats.counters["outcome:ok"], stats.dead, stats.active) == (190, 0, 0)
    assert not await redis_client.exists("crawlq:{default}:meta")
    files = gather_items(tmp_path / "results", tmp_path / "items.jsonl")
    assert {f.type: f.count for f in files} == {"": 0, "product": 75, "review": 150}


# -- each mistake: one line, its exit code ---------------------------------------------------


async def test_a_local_site_without_allow_private_is_said_and_exits_8(
        shop: str, crawl_name: str, tmp_path: Path) -> None:
    spider = spider_file(tmp_path, TITLES, f"{crawl_name}-private")
    code, text = await crawlq("run", str(spider), cwd=tmp_path, env=child_env(SHOP_URL=shop))
    assert code == EXIT_NOTHING_FETCHED, text
    host = shop.removeprefix("http://")
    assert f"warning: ssrf_blocked at {host}: " in text and "--allow-private" in text
    assert "dead ssrf_blocked 1 [" in text
    assert "exit 8: nothing could be fetched" in text
    no_traceback(text)


async def test_an_unreachable_site_says_its_cause_and_exits_8(
        crawl_name: str, tmp_path: Path) -> None:
    site = f"http://127.0.0.1:{closed_port()}"
    spider = spider_file(tmp_path, TITLES, f"{crawl_name}-down")
    code, text = await crawlq("run", str(spider), "--allow-private", "--set", "max_attempts=1",
                              cwd=tmp_path, env=child_env(SHOP_URL=site))
    assert code == EXIT_NOTHING_FETCHED, text
    assert f"dead robots_unavailable 1 [{site}/robots.txt: connect_error: " in text
    assert f"warning: robots_unavailable at {site.removeprefix('http://')}" in text
    no_traceback(text)


async def test_routes_that_all_raise_exit_9(shop: str, crawl_name: str, tmp_path: Path) -> None:
    spider = spider_file(tmp_path, ALWAYS_RAISING, f"{crawl_name}-always")
    code, text = await crawlq("run", str(spider), *fast("--set", "max_attempts=1"),
                              cwd=tmp_path, env=child_env(SHOP_URL=shop))
    assert code == EXIT_ROUTES_FAILED, text
    assert f"{spider.name}:10 in page: KeyError: 'price'" in text
    assert "exit 9: routes raised on 1 tasks and no item was delivered" in text
    no_traceback(text)


async def test_a_crawl_consumers_work_on_is_not_reset_by_a_run(
        redis_client: aioredis.Redis, redis_url: str, shop: str, crawl_name: str,
        tmp_path: Path) -> None:
    name = f"{crawl_name}-busy"
    await LeasingQueue.open(redis_client, name)
    await WorkerRegistry(redis_client, name, "w-fleet", ttl_s=60).beat(
        in_flight=1, done=0, failed=0, state="running")
    spider = spider_file(tmp_path, TITLES, name)
    code, text = await crawlq("run", str(spider), *fast(), cwd=tmp_path,
                              env=child_env(SHOP_URL=shop, REDIS_URL=redis_url))
    assert code == EXIT_USAGE, text
    assert f"crawl '{name}' in {redis_url} has 1 live consumers" in text
    assert len(text.strip().splitlines()) == 1
    assert await redis_client.exists(f"crawlq:{{{name}}}:meta")  # not reset


async def test_a_postgres_sink_refused_is_one_line_with_its_advice(
        shop: str, crawl_name: str, tmp_path: Path, *, postgres_url: str, redis_url: str,
        redis_client: aioredis.Redis) -> None:
    """Connection refused (6), a user without rights (2): crawlq run and the consumer."""
    spider = spider_file(tmp_path, TITLES, f"{crawl_name}-pg")
    env = child_env(SHOP_URL=shop)
    down = f"postgres://crawler@127.0.0.1:{closed_port()}/shop"
    code, text = await crawlq("run", str(spider), *fast("--sink", down), cwd=tmp_path, env=env)
    assert code == EXIT_SINK, text
    assert text.strip().splitlines() == [
        f"crawlq run: PostgreSQL at {down.split('@')[1]} refused the connection "
        f"({text.split('(', 1)[1].split(')')[0]}): is it running and listening there? Check "
        "the URL's host and port"], text
    await LeasingQueue.open(redis_client, crawl_name)  # a crawl to open the sink for
    code, text = await run(sys.executable, "-m", "consumer", "--sink", down, "--crawl",
                           crawl_name, "--exit-when-empty", "--http-port", "-1",
                           "--redis-url", redis_url, cwd=tmp_path, env=env, limit_s=60)
    assert code == EXIT_SINK, text
    [failed] = [line for line in text.splitlines() if " ERROR " in line]
    assert "sink_failed" in failed and "refused the connection" in failed, text
    assert "volume" not in failed
    import asyncpg  # noqa: PLC0415

    role = f"nobody_{os.getpid()}"
    db = await asyncpg.connect(postgres_url)
    try:
        await db.execute(f"CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public "
                         "FROM PUBLIC")
    finally:
        await db.close()
    no_rights = postgres_url.replace("postgres://postgres@", f"postgres://{role}@")
    code, text = await crawlq("run", str(spider), *fast("--sink", no_rights), cwd=tmp_path,
                              env=env)
    assert code == EXIT_USAGE, text
    said = [line for line in text.splitlines() if "exited with code 2" in line]
    assert len(said) == 1 and said[0].startswith("consumer-1, consumer-2 exited with code 2: ")
    assert f"GRANT SELECT, INSERT, UPDATE ON crawlq_items TO {role}" in said[0], text
    assert "finished in" not in text  # none could start: no summary of nothing
    no_traceback(text)


async def test_a_wrong_postgres_password_says_where_the_password_goes(
        shop: str, crawl_name: str, tmp_path: Path) -> None:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and postgres are not installed (apt: postgresql)")
    spider = spider_file(tmp_path, TITLES, f"{crawl_name}-pw")
    with PostgresServer(bindir, password="right") as server:
        code, text = await crawlq("run", str(spider), *fast("--sink", server.url()),
                                  cwd=tmp_path, env=child_env(SHOP_URL=shop,
                                                              PGPASSWORD="wrong"))
        assert code == EXIT_USAGE, text
        assert len(text.strip().splitlines()) == 1, text
        assert "refused the login of user postgres" in text and "PGPASSWORD" in text
        code, text = await crawlq("run", str(spider), *fast("--sink", server.url()),
                                  cwd=tmp_path, env=child_env(SHOP_URL=shop,
                                                              PGPASSWORD="right"))
        assert code == 0, text
        assert "items: 1 rows in table crawlq_items" in text


async def test_an_output_that_cant_be_written_is_one_line_before_anything_starts(
        crawl_name: str, tmp_path: Path) -> None:
    spider = spider_file(tmp_path, TITLES, f"{crawl_name}-ro")
    for flag, where in (("--output", "/proc/crawlq-run"), ("--out", "/proc/x/items.jsonl")):
        code, text = await crawlq("run", str(spider), flag, where, cwd=tmp_path,
                                  env=child_env(SHOP_URL="http://127.0.0.1:9"))
        assert code == EXIT_USAGE, text
        missing = where.rsplit("/", 1)[0] if flag == "--out" else where
        assert text.strip().splitlines() == [
            f"crawlq run: error: can't write {missing}: No such file or directory; give an "
            "--output (or --out) where you can write"]
