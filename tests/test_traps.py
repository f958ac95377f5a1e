"""Crawler traps (issue 35): the URL trap rules of the crawl's policy, session ids dropped,
the fleet-wide count of a path's query variants, near-duplicate pages by SimHash, and a
crawl of a local site whose traps end without their links followed."""

from __future__ import annotations

import random
import re
from hashlib import blake2b
from itertools import pairwise
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import ConnectionError as RedisConnectionError
from selectolax.lexbor import LexborHTMLParser
from support.consume import consume, enqueue, records
from support.failover import cutting, script_sha
from support.live import snapshot
from support.routes import serve

from common.http.results import FetchResult
from common.observability.metrics import Metrics
from common.policy import CrawlPolicy, set_policy
from common.queue import LeasingQueue, NewTask
from common.redis.connection import connect
from common.redis.scripts import source
from common.redis.server import RedisServer
from common.tasks.request import Request
from common.tasks.task import Task
from common.traps.book import KEEP, MAX_PROBES, Page, TrapBook
from common.traps.rules import TrapRules, strip_session_ids, without_tokens
from common.traps.simhash import MAX_TEXT, MIN_WORDS, distance, fingerprint, page_text
from common.urls.canonical import fingerprint as url_fingerprint
from common.urls.shape import shape_tag
from console.cli import main_async
from consumer.intake import LinkIntake
from consumer.links import extract_links
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
    off = TrapRules(0, 0, 0, 0, 0, False, 0)
    assert off.judge("http://a.test/a/a/a/a?" + "&".join(["p=1"] * 40)) is None


def test_session_ids_are_dropped_but_a_short_sid_stays() -> None:
    token = "0123456789abcdef0123456789ABCDEF"
    assert strip_session_ids(f"http://a.test/p?sid={token}") == "http://a.test/p"
    assert strip_session_ids(f"http://a.test/p?a=1&PHPSESSID={token}&b=2") \
        == "http://a.test/p?a=1&b=2"
    assert strip_session_ids(f"http://a.test/p;jsessionid={token}?a=1") \
        == "http://a.test/p?a=1"
    assert strip_session_ids("http://a.test/story?sid=12") == "http://a.test/story?sid=12"
    # 16 characters are a session id; 15 are not
    assert strip_session_ids(f"http://a.test/p?sid={token[:16]}&a=1") == "http://a.test/p?a=1"
    assert strip_session_ids(f"http://a.test/p?sid={token[:15]}") \
        == f"http://a.test/p?sid={token[:15]}"
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


def reference_simhash(text: str) -> int | None:
    """The fingerprint as common.traps.simhash defines it, spelled out: every word (\\w+) of the
    lowercased text's first MAX_TEXT characters hashed with BLAKE2b-64, bit by bit."""
    words = set(re.findall(r"\w+", text[:MAX_TEXT].lower()))
    if len(words) < MIN_WORDS:
        return None
    hashes = [int.from_bytes(blake2b(w.encode(), digest_size=8).digest(), "little")
              for w in words]
    return sum(1 << bit for bit in range(64)
               if 2 * sum(h >> bit & 1 for h in hashes) > len(words))


def test_the_fingerprint_is_the_same_function_of_the_text_as_ever() -> None:
    """Fingerprints are shared across the fleet: however they are computed (words cut in
    bytes, hashes kept), they are what the definition gives, for any text."""
    rng = random.Random(7)
    fingerprinted = 0
    letters = "abcXYZ019_" + "éÉßİıΣσς中文١٢٣ﬁＡ\u0301"
    gaps = " -.,;:!?\t\n¶“”—\u00a0\u2003\u200b'/<>&"
    for _ in range(400):
        text = "".join(rng.choice(letters) * rng.randint(1, 2) + rng.choice(gaps)
                       if rng.random() < 0.8 else rng.choice(letters)
                       for _ in range(rng.randint(10, 300)))
        assert fingerprint(text) == reference_simhash(text), text
        fingerprinted += fingerprint(text) is not None
    assert fingerprinted > 300
    pages = [page(article(n), ["/x"]) for n in range(20)]
    for html in [*pages, page("Ünïcödé " + article(1)), page(article(2) * 500)]:
        text = page_text(html.encode())
        assert fingerprint(text) == reference_simhash(text) is not None
        # the text of a tree (the handler's) is the text of the body
        assert page_text(LexborHTMLParser(html.encode(), encoding=True)) == text


def test_a_response_is_parsed_once_and_its_links_and_text_are_the_bodys() -> None:
    body = (f"<html><head><style>p {{}}</style><script>var x = 1;</script></head><body>"
            f"{article(3)} <a href='/a'>a</a> <template>t</template></body></html>").encode()
    result = FetchResult("http://a.test/", "http://a.test/", 200, {}, (), body, 0.0, (),
                         "HTTP/1.1")
    tree = result.tree()
    assert result.tree() is tree
    assert extract_links(tree, result.final_url, 10) == extract_links(
        body, result.final_url, 10) == ["http://a.test/a"]
    assert result.take_tree() is tree
    assert page_text(tree) == page_text(body)
    assert "var x" not in page_text(tree)
    assert result.tree() is not tree  # taken (and changed): parsed again
    assert extract_links(result.tree(), result.final_url, 10) == ["http://a.test/a"]


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


class Learned:
    """Where the intake keeps the session tokens it learns (consumer.judgement.Judge's
    part of it)."""

    def __init__(self) -> None:
        self.rules: dict[str, dict[str, str]] = {}

    def tokens(self, host: str) -> dict[str, str]:
        return self.rules.get(host, {})

    def learn(self, host: str, rule: str, value: str) -> None:
        self.rules.setdefault(host, {}).setdefault(rule, value)


def token(n: int) -> str:
    """A made-up session token (letters and digits, 20 characters)."""
    return "".join(f"{n:02d}ab" for _ in range(5))


def test_tokens_fresh_per_visit_are_learned_from_a_page_and_left_out_of_the_key(
) -> None:
    """A page under one token whose links carry another, shared by links to most of its
    host's paths, shows a session token: the host's links are then deduplicated without
    it (fetched as linked), so a page under a session is the page its plain links
    reached. In the query under a name no list knows, in the path (a /s/<token>/ prefix),
    and as a long number. An id shared by a few links is no token."""
    learned = Learned()
    i = LinkIntake(Metrics(), Live(snapshot(max_depth=5)), cache_size=1000, tokens=learned)

    def visit(n: int, url: str, tok: object = token) -> list[Task]:
        links = [url.replace("PAGE", str(k)).replace("TOKEN", tok(n + 1))  # type: ignore[operator]
                 for k in range(6)] + ["http://a.test/about"]
        tasks, mark = i.children([(parent(url.replace("PAGE", str(n)).replace(
            "TOKEN", tok(n))), links)])  # type: ignore[operator]
        i.sent(mark)
        return tasks

    # a listing's plain links, then an item whose links carry a fresh token: learned, and
    # its links are the listing's, already sent (and the about page, new)
    first, mark = i.children([(parent("http://a.test/"), [
        f"http://a.test/doc/{k}" for k in range(6)])])
    i.sent(mark)
    assert learned.rules == {} and len(first) == 6
    assert [t.url for t in visit(1, "http://a.test/doc/PAGE?s=TOKEN")] \
        == ["http://a.test/about"]
    assert learned.rules["a.test"].keys() == {"q:s"}
    assert [t.url for t in visit(3, "http://a.test/doc/PAGE?s=TOKEN")] == []
    # in the path: /s/<token>/<n>.html is <n>.html
    paths = visit(1, "http://b.test/s/TOKEN/PAGE.html")
    assert learned.rules["b.test"].keys() == {"p:2"}
    assert {t.unique_key for t in paths} >= {f"http://b.test/{k}.html" for k in range(6)}
    # a session id of 13 digits
    visit(1, "http://d.test/p/PAGE?visit=TOKEN", lambda n: f"{n:013d}")
    assert learned.rules["d.test"].keys() == {"q:visit"}
    # a friend's pages: one id shared by 3 of 12 links is no session token
    for n in (1, 2, 3):
        own = f"http://c.test/user?uid={token(n)}"
        links = [f"http://c.test/{p}?uid={token(9)}" for p in ("photos", "posts", "likes")]
        links += [f"http://c.test/topic/{k}" for k in range(9)]
        i.children([(parent(own), links)])
    assert "c.test" not in learned.rules


def test_a_learned_token_rule_takes_a_random_id_with_few_digits_but_keeps_a_slug() -> None:
    """Once a host's /u/<token>/ prefix is learned, a later link's id of the learned
    length is the session's though it has too few letter-digit changes for a token (one
    random base-62 id in ~15 of 24 characters; each one let through cost its page's dozen
    links on the trap corpus' seed 16); a slug there, or a word of another length, stays."""
    rules = {"p:2": "KAR1OnOCsoFMbYsJlkfKqx5u", "q:s": "8f3a9c1d2e4b5a6f"}
    assert without_tokens("http://a.test/u/yIyRhZfsYLlnMSduKyy1CMeC/list?c=1", rules) \
        == "http://a.test/list?c=1"
    assert without_tokens("http://a.test/u/yIyRhZfsYLlnMSduKyyICMeC/x", rules) \
        == "http://a.test/x"  # no digit at all: both cases, the learned length
    assert without_tokens("http://a.test/u/getting-started-with-it/x", rules) is None
    assert without_tokens("http://a.test/u/GettingStarted/x", rules) is None
    assert without_tokens("http://a.test/doc?s=python", rules) is None
    assert without_tokens("http://a.test/doc?s=yIyRhZfsYLlnMSduK1", rules) == "http://a.test/doc"


def test_a_faceted_page_is_judged_by_numbers_too_but_never_by_its_pagination() -> None:
    """Four parameters varied by numbers (c, s, p, sort) make a faceted search, more than
    trap_page_facets (2): refused; the links that change only its page are followed. Two
    do not."""
    rules = CrawlPolicy().trap_rules()
    shop = "http://a.test/shop?c=1"
    facets = ["http://a.test/shop?c=2", "http://a.test/shop?c=1&s=2",
              "http://a.test/shop?c=1&p=3", "http://a.test/shop?c=1&sort=4"]
    pages = ["http://a.test/shop?c=1&page=2", "http://a.test/shop?c=1&offset=40"]
    assert rules.facet_links(shop, facets + pages) == frozenset(facets)
    assert rules.facet_links(shop, facets[:2] + pages) == frozenset()


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


async def test_a_faceted_pages_filter_links_are_refused_and_its_pages_followed(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A listing whose links to its own path vary four parameters by words (filters and a
    sort order: more than trap_page_facets, 2) is a faceted search: those links are
    refused, counted trap_facets and for the host; its next page (a number), a link that
    drops its filter and links to other paths are followed. A facet is one on its page
    only: the same URL linked from another page is followed. Two such parameters are
    not a faceted search."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    i = intake(queue)
    shop = "http://a.test/shop?color=red"
    facets = ["http://a.test/shop?color=red&size=s", "http://a.test/shop?color=red&size=m",
              "http://a.test/shop?brand=acme&color=red", "http://a.test/shop?color=blue",
              "http://a.test/shop?color=red&sort=price"]
    kept = ["http://a.test/shop?color=red&page=2", "http://a.test/shop",
            "http://a.test/product/1", "http://a.test/other?brand=a&size=b&sort=c&view=d"]
    tasks, mark = i.children([(parent(shop), [*facets, *kept])])
    assert [t.url for t in await i.admit(tasks)] == kept
    i.sent(mark)
    assert fates(i) == {"sent": 4, "trap_facets": 5}
    [row] = await TrapBook(queue).hosts()
    assert (row.host, row.reasons) == ("a.test", {"trap_facets": 5})
    tasks, _ = i.children([(parent("http://a.test/blog"), facets[:1])])
    assert [t.url for t in tasks] == facets[:1]
    two, _ = i.children([(parent(shop), facets[1:3])])
    assert [t.url for t in two] == facets[1:3]
    assert TrapRules(0, 0, 0, 0, 0, False, 0).facet_links(shop, facets) == frozenset()


async def test_a_page_is_never_its_own_near_duplicate_and_fingerprints_are_bounded(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    queue = await LeasingQueue.open(redis_client, crawl_name)
    book = TrapBook(queue)
    fp = simhash(page("the same text"))

    def at(url: str, fp: int, within: int = 3) -> Page:
        host = url.split("/")[2]
        return Page.of(host, url_fingerprint(url), fp, within, shape=shape_tag(host, url))

    assert await book.near_duplicates([at("http://a.test/p?x", fp)]) == [False]
    # pages of another shape are never compared: /x/1 and /x/2 are variants, /y/1 not
    assert await book.near_duplicates([at("http://s.test/x/1", fp),
                                       at("http://s.test/y/1", fp),
                                       at("http://s.test/x/2", fp)]) == [False, False, True]
    # a retry, a revisit: in a later flush, or twice in one
    assert await book.near_duplicates([at("http://a.test/p?x", fp)] * 2) == [False, False]
    assert await book.near_duplicates([at("http://a.test/p?y", fp ^ 0b101),
                                       at("http://b.test/p?y", fp)]) == [True, False]
    # pages of one flush are judged against those before them in it: /w is 4 bits from
    # b.test's held page, 2 from /z
    assert await book.near_duplicates([at("http://b.test/p?z", fp ^ 0b11),
                                       at("http://c.test/p?0", 7, 0),
                                       at("http://b.test/p?w", fp ^ 0b1111, 2)]) \
        == [True, False, True]
    assert await book.near_duplicates([]) == []
    await book.near_duplicates([at(f"http://c.test/p?{n}", n, 0) for n in range(KEEP + 10)])
    pk = queue.partitions[queue.partition_of("c.test")]
    assert await redis_client.strlen(pk.fingerprints("c.test")) == KEEP * 24
    # an entry that aged out of the host's newest KEEP no longer matches
    assert await book.near_duplicates([at("http://c.test/p?again", 5, 0),
                                       at("http://c.test/p?more", 20, 0)]) == [False, True]


# -- calls sent again after their reply was lost (lib/once.lua) -------------------------


async def loaded_traps(redis_client: aioredis.Redis) -> None:
    """traps.lua and fingerprints.lua loaded: a relay then cuts the reply of a call that
    ran (an unloaded script's first call is answered NOSCRIPT and never runs)."""
    for name in ("traps", "fingerprints"):
        await redis_client.script_load(source(name))


@pytest.mark.parametrize("retries", [3, 0])
async def test_tallies_and_variants_count_once_when_a_call_is_sent_again(
        redis_client: aioredis.Redis, redis_server: RedisServer, crawl_name: str,
        retries: int) -> None:
    """The call ran and its reply was lost. Sent again by the client (retries 3), or by
    the flusher's retry of its step, the intake's admit of the same links again (retries
    0: the client gives up), it is answered as the first run was: the host's tallies and
    its path's variants count each link once, and the verdicts are the first run's."""
    async with cutting(redis_server.port) as cutter:
        client = connect(cutter.url, retries=retries)
        try:
            queue = await LeasingQueue.open(client, crawl_name)
            i = intake(queue, trap_path_variants=2)
            links = [f"http://a.test/shop?c={n}" for n in range(4)] + [
                "http://a.test/" + "y" * 1100, "http://a.test/a/b/a/b/a/b/"]
            tasks, _ = i.children([(parent(), links)])
            await loaded_traps(redis_client)
            cutter.cut_after(script_sha("traps"))
            if retries:
                admitted = await i.admit(tasks)
            else:
                with pytest.raises(RedisConnectionError):
                    await i.admit(tasks)
                admitted = await i.admit(tasks)  # the flusher's retry: the same batch
            assert cutter.cuts == 1
            assert [t.url for t in admitted] == links[:2]
            [row] = await TrapBook(queue).hosts()
            assert row.reasons == {"trap_length": 1, "trap_repeats": 1,
                                   "trap_variants": 2}
            assert row.total == 4
            pk = queue.partitions[queue.partition_of("a.test")]
            [held] = (await redis_client.hgetall(pk.variants("a.test"))).values()
            assert len(held) == 2 * 4  # two query hashes, each once
        finally:
            await client.aclose()


async def test_fingerprints_sent_again_add_nothing_and_judge_as_the_first_run(
        redis_client: aioredis.Redis, redis_server: RedisServer, crawl_name: str) -> None:
    """Two near-identical pages of a host in one call: the second is the first's near
    duplicate, never the other way round, also when the call is answered by a second
    send after its first ran (which holds both pages' fingerprints by then)."""
    fp = simhash(page("the same text"))
    pages = [Page.of("a.test", url_fingerprint(f"http://a.test/{n}"), fp ^ n, 3)
             for n in (0, 1)]
    async with cutting(redis_server.port) as cutter:
        client = connect(cutter.url, retries=0)
        try:
            queue = await LeasingQueue.open(client, crawl_name)
            book = TrapBook(queue, "w")
            await loaded_traps(redis_client)
            cutter.cut_after(script_sha("fingerprints"))
            with pytest.raises(RedisConnectionError):
                await book.near_duplicates(pages, op="0123456789abcdef")
            assert cutter.cuts == 1
            again = await book.near_duplicates(pages, op="0123456789abcdef")
            assert again == [False, True]
            pk = queue.partitions[queue.partition_of("a.test")]
            assert await redis_client.strlen(pk.fingerprints("a.test")) == 2 * 24
            # Another call (another op) is a first run: both held pages judge it.
            assert await book.near_duplicates(pages[:1]) == [True]
        finally:
            await client.aclose()


def trap_site(real: int) -> dict[str, web.RequestHandler]:  # type: ignore[name-defined]
    """Real pages 0..real-1 in a chain of index pages, beside a catch-all soft 404 whose
    pages link to more of themselves and relative links that repeat path segments."""

    async def index(request: web.Request) -> web.Response:
        return html(page(article(1000), ["/real/0", "/lost/a", "/lost/b", "/dir/"]))

    async def real_page(request: web.Request) -> web.Response:
        if not request.match_info["n"].isdigit():  # a probe's name: a real site's 404
            raise web.HTTPNotFound()
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


async def test_a_crawl_finds_every_real_page_and_follows_no_soft_404(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """With the policy's defaults, the host's root and the catch-all's directory
    (/lost/: two of its pages share a title, here none) are probed; the catch-all's
    pages fetched after its probe are soft 404s, done with outcome soft_404, their items
    written and their links (/lost/a/more/more) never fetched; so are the relative
    links' listings (/dir/a/a/). Every real page is found."""
    await set_policy(redis_client, crawl_name, {"max_depth": 30, "per_host_delay": 0.0,
                                                "per_host_concurrency": 0,
                                                "ignore_robots": True},
                     by="test", create=True)
    async with serve(trap_site(12)) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    paths = set(site.hits)
    assert {f"/real/{n}" for n in range(12)} <= paths
    assert not [p for p in paths if p.count("/more") > 2]
    assert not [p for p in paths if p.startswith("/dir/") and p.count("/") > 5]
    outcomes = {r["url"].removeprefix(site.base): r["outcome"] for r in records(tmp_path)}
    lost = [o for p, o in outcomes.items() if p.startswith(("/lost/", "/dir/"))]
    assert lost.count("soft_404") >= 1
    assert set(lost) <= {"ok", "soft_404"}
    assert {o for p, o in outcomes.items() if p.startswith("/real/")} == {"ok"}
    # the items of a soft 404 are written: a heuristic drops none unless asked to
    assert {len(r["items"]) for r in records(tmp_path)} == {1}
    assert 2 <= len(site.probes) <= MAX_PROBES, site.probes
    queue = await LeasingQueue.open(redis_client, crawl_name)
    [row] = await TrapBook(queue).hosts()
    assert row.reasons["soft_404"] == list(outcomes.values()).count("soft_404")
    # their links not followed are counted where crawlq stats and crawlq run read
    assert (await queue.stats()).counters.get("links:soft_404", 0) >= lost.count("soft_404")


def titled(title: str, text: str, links: list[str] = ()) -> str:  # type: ignore[assignment]
    return page(text, links).replace("<html>", f"<html><head><title>{title}</title></head>")


async def test_a_near_duplicate_stops_its_calendar_but_never_a_listing_of_other_items(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """With near_duplicate_distance 3: an empty calendar's months (one shape: /cal?m=N)
    are near duplicates of each other, and a month links both its neighbours, so the
    first near duplicates' links to them are not followed (the entry month and its two
    neighbours fetched); their other links are. A feed whose empty pages link only the
    next one (/feed?after=N) is cut a step later: the first near duplicate's links are
    followed, the second's to its shape not. A listing's pages (/list?page=N, one shape,
    the same template and words) link other items, so none is a near duplicate of another
    and every item is found. Pages of one generator's counter names, near duplicates of
    each other, each the only page linking its own: the first near duplicate of a chain
    has its links followed, so every one is found."""
    await set_policy(redis_client, crawl_name, {"max_depth": 100, "per_host_delay": 0.0,
                                                "per_host_concurrency": 4,
                                                "ignore_robots": True,
                                                "near_duplicate_distance": 3},
                     by="test", create=True)

    async def home(request: web.Request) -> web.Response:
        return html(titled("Home", article(1), ["/cal?m=100", "/list?page=1",
                                                 "/feed?after=7"]
                           + [f"/api/a{n}.html" for n in range(10)]))

    async def cal(request: web.Request) -> web.Response:
        m = int(request.query["m"])
        return html(titled(f"Events {m}", f"No events in month {m}.",
                           [f"/cal?m={m - 1}", f"/cal?m={m + 1}", "/about"]))

    async def feed(request: web.Request) -> web.Response:
        n = int(request.query["after"])
        return html(titled(f"Feed {n}", f"Nothing after entry {n}.",
                           [f"/feed?after={n + 1}", "/about"]))

    async def listing(request: web.Request) -> web.Response:
        n = int(request.query["page"])
        items = [f"/item/{n * 5 + k}" for k in range(5)]
        return html(titled("Items", "Our items, five a page.",
                           items + ([f"/list?page={n + 1}"] if n < 12 else [])))

    async def item(request: web.Request) -> web.Response:
        return html(titled("An item", "The same words on every item page."))

    async def about(request: web.Request) -> web.Response:
        return html(titled("About", article(2)))

    async def api(request: web.Request) -> web.Response:
        # A generator's pages named by a counter (Doxygen's a01234.html): ten classes of
        # the same members, each the only page linking its own member list.
        n = int(request.match_info["n"])
        if n < 10:
            return html(titled("class", "A class of these members.",
                               [f"/api/a{100 + n}.html", "/about"]))
        return html(titled("members", "The members of a class.", [f"/api/a{n - 100}.html"]))

    routes = {"/": home, "/cal": cal, "/feed": feed, "/list": listing, "/item/{n}": item,
              "/about": about, "/api/a{n}.html": api}
    async with serve(routes) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    months = [p for p in site.hits if p == "/cal"]
    assert {f"/item/{n}" for n in range(5, 65)} <= set(site.hits)
    # the first near duplicate of a chain has its links followed: every member list
    assert {f"/api/a{100 + n}.html" for n in range(10)} <= set(site.hits)
    assert len(site.hits["/cal"]) == 3, site.paths  # m=100 and its two neighbours
    # The feed: 7 (the first of its shape), 8 (a near duplicate: its links followed), 9
    # (a near duplicate reached from one: its link to its shape not followed).
    assert len(site.hits["/feed"]) == 3, site.paths
    assert "/about" in site.hits and months
    outcomes = [r["outcome"] for r in records(tmp_path) if "/cal?" in r["url"]]
    assert "near_duplicate" in outcomes
    assert {r["outcome"] for r in records(tmp_path) if "/list?" in r["url"]} == {"ok"}
    # a month's links to its neighbours not followed, counted where crawlq stats reads
    stats = await (await LeasingQueue.open(redis_client, crawl_name)).stats()
    assert stats.counters.get("links:near_duplicate", 0) >= 2, stats.counters


async def test_a_page_that_says_it_is_missing_waits_for_its_directorys_probe(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """A catch-all under /old/ answers any path with a "Page not found" page linking two
    more of its paths. Its first pages, reached by dead links, claim the probe of /old/
    and are held until it answers: soft 404s, their links are never followed, so no page
    of the catch-all's second level is fetched."""
    await set_policy(redis_client, crawl_name, {"max_depth": 100, "per_host_delay": 0.0,
                                                "per_host_concurrency": 4,
                                                "ignore_robots": True},
                     by="test", create=True)

    async def home(request: web.Request) -> web.Response:
        return html(titled("Home", article(1), [f"/doc/{n}" for n in range(3)]))

    async def doc(request: web.Request) -> web.Response:
        n = request.match_info["n"]
        return html(titled(f"Doc {n}", article(int(n) + 10), [f"/old/{n}.html"]))

    async def old(request: web.Request) -> web.Response:
        tail = request.match_info["tail"]
        return html(titled("Page not found", "Sorry, we could not find that page.",
                           [f"/old/{tail}-x.html", f"/old/{tail}-y.html"]))

    async with serve({"/": home, "/doc/{n}": doc, "/old/{tail}.html": old}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    catch_all = sorted(p for p in site.hits if p.startswith("/old/"))
    assert catch_all == ["/old/0.html", "/old/1.html", "/old/2.html"]
    assert [p for p in site.probes if p.startswith("/old/")]
    assert {r["outcome"] for r in records(tmp_path) if "/old/" in r["url"]} == {"soft_404"}


async def test_a_listings_catch_all_under_the_roots_is_probed_and_judged(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """The root answers any unknown path with a short "not found" page (its probe finds
    that catch-all); /files/ answers any directory under it with a bare listing of
    three relative directories, each one a directory deeper, for ever. The listing's
    copies are twins (the same words once their own path is left out) that the root's
    signature does not judge: their directory is probed all the same, and the listing
    stops within its second level (it took 271 requests a site on the trap corpus)."""
    await set_policy(redis_client, crawl_name, {"max_depth": 100, "per_host_delay": 0.0,
                                                "per_host_concurrency": 4,
                                                "ignore_robots": True},
                     by="test", create=True)

    async def home(request: web.Request) -> web.Response:
        return html(titled("Home", article(1), [*(f"/doc/{n}" for n in range(3)),
                                                "/files/", "/gone.html"]))

    async def doc(request: web.Request) -> web.Response:
        n = request.match_info["n"]
        return html(titled(f"Doc {n}", article(int(n) + 10), ["/"]))

    async def listing(request: web.Request) -> web.Response:
        rows = "".join(f'<tr><td><a href="{d}/">{d}/</a></td></tr>'
                       for d in ("archive", "2026", "old"))
        return html(f"<html><head><title>Index of {request.path}</title></head><body>"
                    f"<h1>Index of {request.path}</h1><table>{rows}</table></body></html>")

    async def missing(request: web.Request) -> web.Response:
        return html("<html><head><title>Not found</title></head><body>Nothing here."
                    "</body></html>")

    async with serve({"/": home, "/doc/{n}": doc, r"/files/{tail:.*}": listing,
                      r"/{tail:.*}": missing}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/")])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    deep = [p for p in site.hits if p.startswith("/files/") and p.count("/") > 4]
    assert not deep, deep  # no third level below /files/
    assert {"/doc/0", "/doc/1", "/doc/2"} <= set(site.hits)
    assert [p for p in site.probes if p.startswith("/files/")]


async def test_a_labelled_request_is_never_a_near_duplicate(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """Product pages of one template that differ by a word each are near duplicates by
    their text (with near_duplicate_distance on), but a labelled request is the spider's
    word that it wants the page: each is handled and its item written; the same pages
    unlabelled end near_duplicate, their items written all the same (with
    drop_judged_items, not)."""
    await set_policy(redis_client, crawl_name, {"per_host_delay": 0.0,
                                                "per_host_concurrency": 1,
                                                "ignore_robots": True,
                                                "near_duplicate_distance": 3},
                     by="test", create=True)

    async def item(request: web.Request) -> web.Response:
        return html(page(f"{article(0)} sku{request.match_info['n']}"))

    async with serve({"/item/{n}": item}) as site:
        queue = await LeasingQueue.open(redis_client, crawl_name)
        await queue.enqueue([NewTask.from_request(Request(site.url(f"/item/{n}"),
                                                          label="product"),
                                                  site.url(f"/item/{n}"))
                             for n in range(3)])
        await enqueue(redis_client, crawl_name, [site.url(f"/item/{n}") for n in range(3, 8)])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    fates = {r["url"].removeprefix(site.base): (r["outcome"], len(r["items"]))
             for r in records(tmp_path)}
    assert {fates[f"/item/{n}"] for n in range(3)} == {("ok", 1)}
    # Pages flushed together can't see each other's fingerprints: some of these may be
    # judged before the first is kept, but not all.
    unlabelled = [fates[f"/item/{n}"] for n in range(3, 8)]
    assert set(unlabelled) == {("ok", 1), ("near_duplicate", 1)}


async def test_a_labelled_request_is_no_near_duplicate_on_its_retry_either(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
        tmp_path: Path) -> None:
    """A labelled product page whose first fetch failed (500) is fetched again: at its
    second attempt, too, it is the spider's word, never judged against the held page of
    its template it would be a near duplicate of."""
    await set_policy(redis_client, crawl_name, {"per_host_delay": 0.0,
                                                "per_host_concurrency": 1,
                                                "ignore_robots": True, "retry_base": 0.05,
                                                "near_duplicate_distance": 3},
                     by="test", create=True)
    failed: set[str] = set()

    async def item(request: web.Request) -> web.Response:
        n = request.match_info["n"]
        if n == "1" and n not in failed:
            failed.add(n)
            return web.Response(status=500)
        return html(page(f"{article(0)} sku{n}"))

    async with serve({"/item/{n}": item}) as site:
        await enqueue(redis_client, crawl_name, [site.url("/item/9")])  # held first
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
        queue = await LeasingQueue.open(redis_client, crawl_name)
        await queue.enqueue([NewTask.from_request(Request(site.url("/item/1"),
                                                          label="product"),
                                                  site.url("/item/1"))])
        await consume(redis_url, crawl_name, tmp_path, "--handler",
                      "consumer_handlers:links_and_items", limit_s=60)
    assert failed == {"1"} and site.hits["/item/1"] and len(site.hits["/item/1"]) == 2
    [done] = [r for r in records(tmp_path) if r["url"] == site.url("/item/1")
              and r["status"] == 200]
    assert (done["attempt"], done["outcome"], len(done["items"])) == (2, "ok", 1)


async def test_seeds_are_the_operators_word(redis_client: aioredis.Redis,
                                            crawl_name: str) -> None:
    """The trap rules judge links, never what is enqueued directly."""
    queue = await LeasingQueue.open(redis_client, crawl_name)
    url = "http://a.test/a/a/a/a"
    assert (await queue.enqueue([NewTask(url, url_fingerprint(url))])).enqueued == 1
