"""Crawler traps (issue 35): the URL trap rules of the crawl's policy, session ids dropped,
the fleet-wide count of a path's query variants, near-duplicate pages by SimHash, and a
crawl of a local site whose traps end without their links followed."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.consume import consume, enqueue, records
from support.live import snapshot
from support.routes import serve

from common.metrics import Metrics
from common.policy import CrawlPolicy, set_policy
from common.queue import LeasingQueue, NewTask
from common.simhash import distance, fingerprint, page_text
from common.task import Task
from common.trapbook import KEEP, TrapBook
from common.traps import TrapRules, strip_session_ids
from common.urls import fingerprint as url_fingerprint
from console.cli import main_async
from consumer.intake import LinkIntake
from consumer.live import Live

RULES = CrawlPolicy().trap_rules()
WORDS = [f"w{i}" for i in range(3000)]
#: A site's template: the same ~200 words on every page (navigation, footer).
TEMPLATE = " ".join(random.Random(0).choices(WORDS, k=200))


def page(text: str, links: list[str] = ()) -> str:  # type: ignore[assignment]
    hrefs = "".join(f'<a href="{h}">more</a> ' for h in links)
    return f"<html><body><nav>{TEMPLATE}</nav><main>{text}</main>{hrefs}</body></html>"


def article(n: int) -> str:
    """The text of real page `n`: a paragraph of its own."""
    return " ".join(random.Random(n).choices(WORDS, k=80))


def test_each_rule_refuses_its_trap_and_lets_a_plain_url_through() -> None:
    ok = "http://a.test/docs/2026/01/01/index.html?x=1&y=2"
    assert RULES.judge(ok) is None
    assert RULES.judge("http://a.test/" + "x" * 1100) == "trap_length"
    assert RULES.judge("http://a.test/" + "/".join(f"s{i}" for i in range(21))) \
        == "trap_segments"
    assert RULES.judge("http://a.test/" + "/".join(f"s{i}" for i in range(20))) is None
    assert RULES.judge("http://a.test/a/b/a/b/") is None  # each segment twice: allowed
    assert RULES.judge("http://a.test/a/b/a/b/a/b/") == "trap_repeats"  # Heritrix's
    assert RULES.judge("http://a.test/x/a/y/a/z/a/") == "trap_repeats"  # Nutch's
    assert RULES.judge("http://a.test/cal/a/a/a") == "trap_repeats"
    assert RULES.judge("http://a.test/s?" + "&".join(f"p{i}=1" for i in range(13))) \
        == "trap_params"
    assert RULES.judge("http://a.test/s?" + "&".join(f"p{i}=1" for i in range(12))) is None
    off = TrapRules(0, 0, 0, 0, 0, False)
    assert off.judge("http://a.test/a/a/a/a?" + "&".join(["p=1"] * 40)) is None


def test_session_ids_are_dropped_but_a_short_sid_stays() -> None:
    token = "0123456789abcdef0123456789ABCDEF"
    assert strip_session_ids(f"http://a.test/p?sid={token}") == "http://a.test/p"
    assert strip_session_ids(f"http://a.test/p?a=1&PHPSESSID={token}&b=2") \
        == "http://a.test/p?a=1&b=2"
    assert strip_session_ids(f"http://a.test/p;jsessionid={token}?a=1") \
        == "http://a.test/p?a=1"
    assert strip_session_ids("http://a.test/story?sid=12") == "http://a.test/story?sid=12"
    assert strip_session_ids("http://a.test/p?q=sidewalk") == "http://a.test/p?q=sidewalk"


def simhash(html: str) -> int:
    fp = fingerprint(page_text(html.encode()))
    assert fp is not None
    return fp


def test_near_identical_pages_are_within_3_bits_and_real_pages_far_apart() -> None:
    soft = [simhash(page("Sorry, this page was not found.", [f"/missing/{i}/more"]))
            for i in range(5)]
    assert {distance(soft[0], s) for s in soft} == {0}  # links are not text
    months = [simhash(page(f"Calendar {m} 2026: no events this month."))
              for m in ("january", "february", "march", "april", "may", "june")]
    assert max(distance(a, b) for a, b in pairwise(months)) <= 3
    real = [simhash(page(article(n))) for n in range(60)]
    assert min(distance(a, b) for i, a in enumerate(real) for b in real[i + 1:]) > 3
    # A page of too few words has no fingerprint: it is never a near duplicate.
    assert fingerprint(page_text(b"<html><body><a href=/c/1>next</a></body></html>")) \
        is None


def intake(queue: LeasingQueue, **values: object) -> LinkIntake:
    return LinkIntake(Metrics(), Live(snapshot(**{"max_depth": 5, **values})),
                      cache_size=1000, book=TrapBook(queue))


def fates(i: LinkIntake) -> dict[str, float]:
    i.publish()
    return {s.labels["fate"]: s.value for m in i.metrics.links_total.collect()
            for s in m.samples if s.name.endswith("_total") and s.value}


def parent(url: str = "http://a.test/") -> Task:
    return Task(id="0" * 32, url=url, depth=0)


async def test_refused_links_are_counted_by_reason_and_per_host(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each refused link counts for its fate and for its host; `crawlq traps` lists the
    host with its tallies."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    i = intake(queue)
    links = ["http://a.test/a/b/a/b/a/b/", "http://a.test/" + "y" * 1100,
             "http://a.test/ok", "http://a.test/c/c/c"]
    tasks, _ = i.children([(parent(), links)])
    assert [t.url for t in tasks] == ["http://a.test/ok"]
    i.tally("a.test", "near_duplicate")
    assert [t.url for t in await i.admit(tasks)] == ["http://a.test/ok"]
    assert fates(i) == {"sent": 1, "trap_repeats": 2, "trap_length": 1}
    [row] = await TrapBook(queue).hosts()
    assert (row.host, row.total) == ("a.test", 4)
    assert row.reasons == {"near_duplicate": 1, "trap_length": 1, "trap_repeats": 2}
    capsys.readouterr()
    assert await main_async(["traps", "--crawl", crawl_name, "--redis-url", redis_url,
                             "--cluster", "no"]) == 0
    assert capsys.readouterr().out.split() == [
        "a.test", "4", "near_duplicate", "1,", "trap_length", "1,", "trap_repeats", "2"]


def test_a_page_under_another_session_is_the_same_link_and_a_rule_change_applies(
) -> None:
    """Session ids are dropped before the seen cache and the dedup see the link; a
    policy change (here: the rules off) applies to the next batch."""
    live = Live(snapshot(max_depth=5))
    i = LinkIntake(Metrics(), live, cache_size=1000)
    sids = [f"http://a.test/p?sid={n:032x}" for n in range(3)]
    tasks, mark = i.children([(parent(), sids)])
    assert [t.url for t in tasks] == ["http://a.test/p"]
    i.sent(mark)
    again, _ = i.children([(parent(), [f"http://a.test/p?sid={9:032x}"])])
    assert again == []
    assert i.children([(parent(), ["http://a.test/x/x/x"])])[0] == []
    live.now = snapshot(max_depth=5, trap_repeated_segments=0, trap_session_ids=False)
    tasks, _ = i.children([(parent(), ["http://a.test/x/x/x", sids[0]])])
    assert [t.url for t in tasks] == ["http://a.test/x/x/x", sids[0]]


async def test_a_paths_query_variants_are_bounded_across_the_fleet(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Two consumers' intakes share the count: 5 variants of /shop in all, a query seen
    before stays admitted, another path has its own count."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    one, two = intake(queue, trap_path_variants=5), intake(queue, trap_path_variants=5)
    first, _ = one.children([(parent(), [f"http://a.test/shop?c={n}" for n in range(4)])])
    assert len(await one.admit(first)) == 4
    second, _ = two.children([(parent(), [f"http://a.test/shop?c={n}" for n in range(2, 8)]
                               + ["http://a.test/other?c=9"])])
    admitted = [t.url for t in await two.admit(second)]
    assert admitted == ["http://a.test/shop?c=2", "http://a.test/shop?c=3",
                        "http://a.test/shop?c=4", "http://a.test/other?c=9"]
    assert fates(two) == {"sent": 4, "trap_variants": 3}
    [row] = await TrapBook(queue).hosts()
    assert row.reasons == {"trap_variants": 3}


async def test_a_page_is_never_its_own_near_duplicate_and_fingerprints_are_bounded(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name)
    book = TrapBook(queue)
    fp = simhash(page("the same text"))
    url_fp = url_fingerprint("http://a.test/x")
    assert not await book.seen_like("a.test", url_fp, fp, 3)
    assert not await book.seen_like("a.test", url_fp, fp, 3)  # a retry, a revisit
    assert await book.seen_like("a.test", url_fingerprint("http://a.test/y"), fp ^ 0b101, 3)
    assert not await book.seen_like("b.test", url_fingerprint("http://b.test/y"), fp, 3)
    for n in range(KEEP + 10):
        await book.seen_like("c.test", url_fingerprint(f"http://c.test/{n}"), n, 0)
    pk = queue.partitions[queue.partition_of("c.test")]
    assert await redis_client.strlen(pk.fingerprints("c.test")) == KEEP * 12


def trap_site(real: int) -> dict[str, web.RequestHandler]:  # type: ignore[name-defined]
    """Real pages 0..real-1 in a chain of index pages, beside a catch-all soft 404 whose
    pages link to more of themselves and relative links that repeat path segments."""

    async def index(request: web.Request) -> web.Response:
        return html(page(article(1000), ["/real/0", "/lost/a", "/lost/b", "/dir/"]))

    async def real_page(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        links = [f"/real/{n + 1}"] if n + 1 < real else []
        return html(page(article(n), links))

    async def soft_404(request: web.Request) -> web.Response:
        # 200 to any path, and a link deeper into itself from each.
        return html(page("Sorry, this page was not found.", [request.path + "/more"]))

    async def relative(request: web.Request) -> web.Response:
        return html(page(f"A directory listing of {request.path}.", ["a/", "b/"]))

    return {"/": index, "/real/{n}": real_page, "/lost/{tail:.*}": soft_404,
            "/dir/{tail:.*}": relative}


def html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html")


async def test_a_crawl_finds_every_real_page_and_follows_no_near_duplicate(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """The first soft 404 is a page like any other; the next ones are near duplicates
    of it, done with outcome near_duplicate, and their links (/lost/a/more/more) are
    never fetched; so are the relative links' (/dir/a/a/: the same listing)."""
    await set_policy(redis_client, crawl_name, {"max_depth": 30, "per_host_delay": 0.0,
                                                "per_host_concurrency": 0,
                                                "ignore_robots": True},
                     by="test", create=True)
    async with serve(trap_site(12)) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer.handlers:links", limit_s=60)
    paths = set(site.hits)
    assert {f"/real/{n}" for n in range(12)} <= paths
    assert not [p for p in paths if p.count("/more") > 1]
    assert not [p for p in paths if p.startswith("/dir/") and
                max(p.split("/").count(s) for s in ("a", "b")) > 2]
    outcomes = {r["url"].removeprefix(site.base): r["outcome"] for r in records(tmp_path)}
    lost = [o for p, o in outcomes.items() if p.startswith("/lost/")]
    assert lost.count("near_duplicate") >= len(lost) - 1 >= 1
    assert {o for p, o in outcomes.items() if p.startswith("/real/")} == {"ok"}
    queue = await LeasingQueue.open(redis_client, crawl_name)
    [row] = await TrapBook(queue).hosts()
    assert row.reasons["near_duplicate"] == list(outcomes.values()).count("near_duplicate")


async def test_seeds_are_the_operators_word(redis_client: aioredis.Redis,
                                            crawl_name: str) -> None:
    """The trap rules judge links, never what is enqueued directly."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    url = "http://a.test/a/a/a/a"
    assert (await queue.enqueue([NewTask(url, url_fingerprint(url))])).enqueued == 1
