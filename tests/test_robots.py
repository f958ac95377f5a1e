"""robots.txt cache: real aiohttp servers on 127.0.0.1, a real Redis, the real Fetcher.

Each test starts its own origin(s) (robots.txt always lives at ``/robots.txt``, so one
origin per scenario) that count robots.txt hits, and uses its own crawl name, so the Redis
copies of different tests never meet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from support.handover import until
from support.live import snapshot
from support.ports import closed_port

from common import codec
from common.errors import ConfigError, FetchError
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.keys import CrawlKeys
from common.queue import Lease
from common.tasks.task import Task
from consumer.live import Live
from consumer.robots import (
    MAX_ROBOTS_BYTES,
    RobotsCache,
    RobotsVerdict,
    origin_of,
    product_token,
    read_ahead,
)

UA = "crawlq/0.1 (+https://github.com/crawlq/crawlq)"

ROBOTS = """\
# a comment
User-agent: *
Disallow: /private/
Allow: /private/open
Disallow: /*.pdf$
Crawl-delay: 2

User-agent: crawlq
Disallow: /private/
Disallow: /*.pdf$
Crawl-delay: 5

User-agent: github
Disallow: /
"""


@dataclass
class Origin:
    """One local test server: its origin URL and what its robots.txt handler saw."""

    url: str  # http://127.0.0.1:<port>
    hits: int = 0
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain"
    delay: float = 0.0
    redirect_to: str | None = None  # answer robots.txt with a 301 to this URL


ServeFn = Callable[..., Awaitable[Origin]]


@pytest.fixture
async def serve() -> AsyncIterator[ServeFn]:
    """Start local origins: `await serve(status=..., body=..., delay=...)` -> Origin."""
    runners: list[web.AppRunner] = []

    async def start(
        *, status: int = 200, body: str | bytes = b"", delay: float = 0.0,
        content_type: str = "text/plain", redirect_to: str | None = None,
    ) -> Origin:
        origin = Origin(url="", status=status, delay=delay, content_type=content_type,
                        body=body.encode() if isinstance(body, str) else body,
                        redirect_to=redirect_to)

        async def robots(request: web.Request) -> web.Response:
            origin.hits += 1
            if origin.delay:
                await asyncio.sleep(origin.delay)
            if origin.redirect_to is not None:
                raise web.HTTPMovedPermanently(origin.redirect_to)
            return web.Response(status=origin.status, body=origin.body,
                                content_type=origin.content_type)

        app = web.Application()
        app.router.add_get("/robots.txt", robots)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        origin.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return origin

    try:
        yield start
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    settings = FetchSettings(
        user_agent=UA, allow_private=True, total_timeout=3.0, connect_timeout=1.0,
        sock_read_timeout=2.0,
    )
    async with Fetcher(settings) as f:
        yield f


@pytest.fixture
def make_cache(
    redis_client: aioredis.Redis, crawl_name: str, fetcher: Fetcher
) -> Callable[..., RobotsCache]:
    def make(*, user_agent: str = UA, ttl_s: float = 86400, policy: Live | None = None,
             **options: object) -> RobotsCache:
        live = policy or Live(snapshot(user_agent=user_agent, robots_ttl=ttl_s))
        return RobotsCache(redis_client, crawl_name, fetcher, policy=live,
                           **options)  # type: ignore[arg-type]

    return make


async def gone_everywhere(redis_client: aioredis.Redis, crawl: str, cache: RobotsCache,
                          url: str, *, by: float, within: float = 10.0) -> None:
    """Poll until `url`'s robots.txt copy is gone from Redis and from `cache`'s own copies.

    `by` (time.monotonic()) is when the own copy must be gone at the latest: one still
    held after it fails at once, however late the poll runs.
    """
    key = CrawlKeys.build(crawl).robots(origin_of(url)[0])
    deadline = time.monotonic() + within
    while True:
        now = time.monotonic()
        try:
            held = cache.cached(url) is not None
        except FetchError:  # a cached failure
            held = True
        assert not (held and now > by), f"the own copy of {key} outlived its TTL"
        if not held and not await redis_client.exists(key):
            return
        assert now < deadline, f"{key} still in Redis after {within:g}s"
        await asyncio.sleep(0.02)


async def _stored(redis_client: aioredis.Redis, crawl: str, origin: str) -> dict[str, object]:
    raw = await redis_client.get(CrawlKeys.build(crawl).robots(origin))
    assert raw is not None, "no Redis copy"
    doc: dict[str, object] = codec.loads(raw)
    return doc


# --- rules ----------------------------------------------------------------------------------


async def test_disallow_allow_and_wildcards(serve: ServeFn, make_cache: Callable[..., RobotsCache],
                                            redis_client: aioredis.Redis, crawl_name: str) -> None:
    o = await serve(body=ROBOTS)
    cache = make_cache()
    assert await cache.check(f"{o.url}/private/x") == RobotsVerdict(False, 5.0)
    assert await cache.check(f"{o.url}/public") == RobotsVerdict(True, 5.0)
    assert (await cache.check(f"{o.url}/")).allowed
    assert not (await cache.check(f"{o.url}/docs/report.pdf")).allowed
    assert (await cache.check(f"{o.url}/docs/report.pdf?page=2")).allowed  # `$` anchors
    assert (await cache.check(f"{o.url}/docs/report.pdfx")).allowed
    assert (await cache.check(f"{o.url}/public#private/")).allowed  # fragment ignored
    # our own group has no Allow for /private/open; the * group's would not apply to us
    assert not (await cache.check(f"{o.url}/private/open")).allowed
    # the `github` group must not apply just because "github" is in our User-Agent
    assert (await cache.check(f"{o.url}/anything")).allowed
    assert o.hits == 1

    doc = await _stored(redis_client, crawl_name, o.url)
    assert doc["status"] == 200
    assert doc["body"] == ROBOTS
    assert isinstance(doc["fetched_at"], float) and abs(doc["fetched_at"] - time.time()) < 60
    assert "error" not in doc


async def test_star_group_and_its_crawl_delay(serve: ServeFn,
                                              make_cache: Callable[..., RobotsCache]) -> None:
    o = await serve(body=ROBOTS)
    other = make_cache(user_agent="otherbot/2.0")
    assert await other.check(f"{o.url}/private/x") == RobotsVerdict(False, 2.0)
    assert await other.check(f"{o.url}/private/open/a") == RobotsVerdict(True, 2.0)  # longest
    assert not (await other.check(f"{o.url}/a/b.pdf")).allowed
    assert await other.check(f"{o.url}/public") == RobotsVerdict(True, 2.0)


async def test_groups_match_our_product_token_only(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    """"github" appears in our User-Agent string, but is not our product token."""
    o = await serve(body="User-agent: github\nDisallow: /\n\nUser-agent: crawl\nDisallow: /x\n")
    cache = make_cache()
    assert (await cache.check(f"{o.url}/a")).allowed
    assert not (await cache.check(f"{o.url}/x")).allowed  # protego: a prefix of our token
    assert not (await make_cache(user_agent="GitHub-Hookshot/1").check(f"{o.url}/a")).allowed


async def test_a_new_user_agent_judges_cached_robots_txt_again(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    """The crawl policy changed the user agent: the cached robots.txt (in this process
    and in Redis) is judged for the new product token, Crawl-delay included; nothing is
    fetched again."""
    o = await serve(body=ROBOTS)
    live = Live(snapshot(user_agent=UA))
    cache = make_cache(policy=live)
    assert await cache.check(f"{o.url}/private/open/a") == RobotsVerdict(False, 5.0)
    live.now = snapshot(user_agent="OtherBot/2.0 (+https://example.com)")
    assert cache.agent == "OtherBot"
    assert cache.cached(f"{o.url}/private/open/a") == RobotsVerdict(True, 2.0)  # group *
    assert await cache.check(f"{o.url}/private/x") == RobotsVerdict(False, 2.0)
    live.now = snapshot(user_agent=UA)
    assert cache.cached(f"{o.url}/private/open/a") == RobotsVerdict(False, 5.0)
    # Another process that reads the Redis copy judges it for its own agent.
    other = make_cache(user_agent="GitHub-Hookshot/1")
    assert await other.check(f"{o.url}/a") == RobotsVerdict(False, None)
    assert o.hits == 1
    with pytest.raises(ConfigError, match="no product token"):
        live.now = snapshot(user_agent="/1.0")
    assert cache.agent == "crawlq"  # a refused agent changes nothing


async def test_request_rate_gives_crawl_delay(serve: ServeFn,
                                              make_cache: Callable[..., RobotsCache]) -> None:
    o1 = await serve(body="User-agent: *\nRequest-rate: 3/1m\n")
    o2 = await serve(body="User-agent: crawlq\nRequest-rate: 1/10s\nCrawl-delay: 4\n")
    o3 = await serve(body="User-agent: *\nDisallow: /x\n")
    cache = make_cache()
    assert await cache.check(f"{o1.url}/a") == RobotsVerdict(True, 20.0)
    assert await cache.check(f"{o2.url}/a") == RobotsVerdict(True, 4.0)  # Crawl-delay wins
    assert await cache.check(f"{o3.url}/a") == RobotsVerdict(True, None)


def test_product_token() -> None:
    assert product_token(UA) == "crawlq"
    assert product_token("  FooBot ") == "FooBot"
    with pytest.raises(ValueError):
        product_token("  ")


async def test_bad_url_is_permanent(make_cache: Callable[..., RobotsCache]) -> None:
    cache = make_cache()
    for url in ("ftp://example.com/a", "/relative", "http://"):
        with pytest.raises(FetchError) as info:
            await cache.check(url)
        assert info.value.reason == "bad_url" and not info.value.retryable


# --- fetch outcomes -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 410, 401, 403])
async def test_4xx_allows_all(status: int, serve: ServeFn, make_cache: Callable[..., RobotsCache],
                              redis_client: aioredis.Redis, crawl_name: str) -> None:
    o = await serve(status=status, body="User-agent: *\nDisallow: /\n")
    cache = make_cache()
    assert await cache.check(f"{o.url}/private/x") == RobotsVerdict(True, None)
    assert await cache.check(f"{o.url}/") == RobotsVerdict(True, None)
    assert o.hits == 1
    doc = await _stored(redis_client, crawl_name, o.url)
    assert doc["status"] == status and doc["body"] == "" and "error" not in doc
    ttl = await redis_client.ttl(CrawlKeys.build(crawl_name).robots(o.url))
    assert 86000 < ttl <= 86400  # a real answer: cached for the full TTL


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_unavailable_is_retryable_and_cached_briefly(
    status: int, serve: ServeFn, make_cache: Callable[..., RobotsCache],
    redis_client: aioredis.Redis, crawl_name: str,
) -> None:
    o = await serve(status=status, body="User-agent: *\nDisallow: /\n")
    cache = make_cache()
    for _ in range(3):
        with pytest.raises(FetchError) as info:
            await cache.check(f"{o.url}/page")
        err = info.value
        assert err.reason == "robots_unavailable"
        assert err.retryable
        assert err.retry_after is not None and 0 < err.retry_after <= 60
        assert f"HTTP {status}" in err.message
    assert o.hits == 1  # the failure is cached, fleet-wide ...
    key = CrawlKeys.build(crawl_name).robots(o.url)
    assert 0 < await redis_client.pttl(key) <= 60_000  # ... but only briefly
    doc = await _stored(redis_client, crawl_name, o.url)
    assert doc["status"] == status and "error" in doc

    # a second consumer sees the cached failure without fetching
    with pytest.raises(FetchError) as info:
        await make_cache().check(f"{o.url}/page")
    assert info.value.reason == "robots_unavailable"
    assert o.hits == 1


async def test_failure_expires_then_refetched(serve: ServeFn,
                                              make_cache: Callable[..., RobotsCache],
                                              redis_client: aioredis.Redis,
                                              crawl_name: str) -> None:
    o = await serve(status=500)
    cache = make_cache(failure_ttl_s=0.5)
    with pytest.raises(FetchError):
        await cache.check(f"{o.url}/private/x")
    fetched = time.monotonic()
    key = CrawlKeys.build(crawl_name).robots(o.url)
    assert 0 < await redis_client.pttl(key) <= 500
    o.status, o.body = 200, ROBOTS.encode()
    with pytest.raises(FetchError) as info:  # still cached
        await cache.check(f"{o.url}/private/x")
    assert info.value.retry_after is not None and info.value.retry_after <= 0.5
    assert o.hits == 1
    await gone_everywhere(redis_client, crawl_name, cache, f"{o.url}/private/x",
                          by=fetched + 0.5)
    assert await cache.check(f"{o.url}/private/x") == RobotsVerdict(False, 5.0)
    assert o.hits == 2


async def test_connection_refused_and_timeout_are_unavailable(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    cache = make_cache()
    with pytest.raises(FetchError) as info:
        await cache.check(f"http://127.0.0.1:{closed_port()}/a")
    assert info.value.reason == "robots_unavailable" and info.value.retryable
    assert "connect_error" in info.value.message

    slow = await serve(body=ROBOTS, delay=5.0)  # longer than the fetcher's 2 s read timeout
    with pytest.raises(FetchError) as info:
        await cache.check(f"{slow.url}/a")
    assert info.value.reason == "robots_unavailable" and info.value.retryable
    assert "timeout" in info.value.message


async def test_ssrf_blocked_is_reraised_and_not_cached(
    serve: ServeFn, redis_client: aioredis.Redis, crawl_name: str
) -> None:
    o = await serve(body=ROBOTS)
    async with Fetcher(FetchSettings(user_agent=UA)) as guarded:  # allow_private=False
        cache = RobotsCache(redis_client, crawl_name, guarded,
                            policy=Live(snapshot(user_agent=UA)))
        with pytest.raises(FetchError) as info:
            await cache.check(f"{o.url}/public")
    assert info.value.reason == "ssrf_blocked" and not info.value.retryable
    assert o.hits == 0
    keys = CrawlKeys.build(crawl_name)
    assert await redis_client.exists(keys.robots(o.url), keys.robots(o.url) + ":lock") == 0


async def test_redirect_followed(serve: ServeFn,
                                 make_cache: Callable[..., RobotsCache]) -> None:
    target = await serve(body="User-agent: *\nDisallow: /private/\n")
    hop = await serve(redirect_to=f"{target.url}/robots.txt")  # another origin
    start = await serve(redirect_to=f"{hop.url}/robots.txt")
    cache = make_cache()
    assert not (await cache.check(f"{start.url}/private/a")).allowed
    assert (await cache.check(f"{start.url}/public")).allowed
    assert (start.hits, hop.hits, target.hits) == (1, 1, 1)


async def test_redirect_loop_allows_all(serve: ServeFn,
                                        make_cache: Callable[..., RobotsCache]) -> None:
    o = await serve()
    o.redirect_to = f"{o.url}/robots.txt?again"  # loops back to the same URL
    assert await make_cache().check(f"{o.url}/private/a") == RobotsVerdict(True, None)


async def test_garbage_and_html_never_raise(serve: ServeFn,
                                            make_cache: Callable[..., RobotsCache]) -> None:
    junk = await serve(body=bytes(range(256)) * 64 + b"\xff\xfe:\x00\n::::\n\x00Disallow",
                       content_type="application/octet-stream")
    html = await serve(body="<html><body><h1>Welcome</h1><p>Disallow: /</p></body></html>",
                       content_type="text/html")
    cache = make_cache()
    assert await cache.check(f"{junk.url}/a") == RobotsVerdict(True, None)
    assert await cache.check(f"{html.url}/a") == RobotsVerdict(True, None)


async def test_bom_and_crlf(serve: ServeFn, make_cache: Callable[..., RobotsCache]) -> None:
    o = await serve(body=b"\xef\xbb\xbfUser-agent: *\r\nDisallow: /private/\r\n")
    assert not (await make_cache().check(f"{o.url}/private/a")).allowed


async def test_body_capped_at_512_kib(serve: ServeFn, make_cache: Callable[..., RobotsCache],
                                      redis_client: aioredis.Redis, crawl_name: str) -> None:
    filler = ("# " + "x" * 98 + "\n") * (MAX_ROBOTS_BYTES // 100)  # ~512 KiB of comments
    body = f"User-agent: *\nDisallow: /early/\n{filler}Disallow: /late/\n"
    assert len(body) > MAX_ROBOTS_BYTES
    o = await serve(body=body)
    cache = make_cache()
    assert not (await cache.check(f"{o.url}/early/a")).allowed
    assert (await cache.check(f"{o.url}/late/a")).allowed  # past the cap: ignored
    doc = await _stored(redis_client, crawl_name, o.url)
    assert isinstance(doc["body"], str)
    assert len(doc["body"].encode()) <= MAX_ROBOTS_BYTES and doc["body"].endswith("\n")


# --- fetched once, cached ------------------------------------------------------------------


async def test_fetched_once_across_consumers(
    serve: ServeFn, redis_client: aioredis.Redis, redis_url: str, crawl_name: str,
    fetcher: Fetcher,
) -> None:
    o = await serve(body=ROBOTS, delay=0.3)  # slow: the 50 checks really overlap
    second_client = aioredis.Redis.from_url(redis_url)  # a second consumer process
    try:
        live = Live(snapshot(user_agent=UA))
        a = RobotsCache(redis_client, crawl_name, fetcher, policy=live)
        b = RobotsCache(second_client, crawl_name, fetcher, policy=live)
        urls = [f"{o.url}/private/{i}" if i % 2 else f"{o.url}/public/{i}" for i in range(50)]
        verdicts = await asyncio.gather(
            *((a if i % 2 else b).check(url) for i, url in enumerate(urls))
        )
    finally:
        await second_client.aclose()
    assert o.hits == 1
    assert [v.allowed for v in verdicts] == [i % 2 == 0 for i in range(50)]
    assert {v.crawl_delay for v in verdicts} == {5.0}
    lock = CrawlKeys.build(crawl_name).robots(o.url) + ":lock"
    assert await redis_client.exists(lock) == 0  # released, not left to expire


async def test_stale_lock_is_taken_over(serve: ServeFn, make_cache: Callable[..., RobotsCache],
                                        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A consumer that took the lock and died: the others wait for it to expire, then fetch."""
    o = await serve(body=ROBOTS)
    lock = CrawlKeys.build(crawl_name).robots(o.url) + ":lock"
    await redis_client.set(lock, "dead-consumer", px=400)
    cache = make_cache(lock_ms=400)
    started = time.monotonic()
    assert not (await cache.check(f"{o.url}/private/x")).allowed
    assert 0.25 < time.monotonic() - started < 2.0
    assert o.hits == 1


async def test_ttl_expiry_refetches(serve: ServeFn, make_cache: Callable[..., RobotsCache],
                                    redis_client: aioredis.Redis, crawl_name: str) -> None:
    o = await serve(body=ROBOTS)
    cache = make_cache(ttl_s=1)
    assert not (await cache.check(f"{o.url}/private/x")).allowed
    fetched = time.monotonic()
    assert 0 < await redis_client.pttl(CrawlKeys.build(crawl_name).robots(o.url)) <= 1000
    assert not (await cache.check(f"{o.url}/private/y")).allowed
    assert o.hits == 1
    o.body = b"User-agent: *\nDisallow:\n"  # robots.txt changed on the site
    await gone_everywhere(redis_client, crawl_name, cache, f"{o.url}/private/x",
                          by=fetched + 1)
    assert (await cache.check(f"{o.url}/private/x")).allowed
    assert o.hits == 2


async def test_a_new_ttl_applies_to_the_copies_fetched_after_it(
        serve: ServeFn, make_cache: Callable[..., RobotsCache],
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A new robots_ttl in the policy snapshot (changed while a consumer runs): a copy
    fetched after it lives that long, in Redis and in-process, and a failure no longer
    than it; a copy fetched before keeps its expiry. Not > 0: ConfigError."""
    before, after = await serve(body=ROBOTS), await serve(body=ROBOTS)
    live = Live(snapshot(user_agent=UA))
    cache = make_cache(policy=live, failure_ttl_s=30)
    assert not (await cache.check(f"{before.url}/private/x")).allowed
    keys = CrawlKeys.build(crawl_name)
    assert await redis_client.pttl(keys.robots(before.url)) > 3_600_000
    live.now = snapshot(user_agent=UA, robots_ttl=1)
    assert (cache.ttl_s, cache.failure_ttl_s) == (1, 1)
    assert not (await cache.check(f"{after.url}/private/x")).allowed
    assert 0 < await redis_client.pttl(keys.robots(after.url)) <= 1000
    await asyncio.sleep(1.1)
    assert not (await cache.check(f"{after.url}/private/y")).allowed
    assert not (await cache.check(f"{before.url}/private/y")).allowed
    assert (before.hits, after.hits) == (1, 2)
    live.now = snapshot(user_agent=UA, robots_ttl=3600)
    assert (cache.ttl_s, cache.failure_ttl_s) == (3600, 30)
    with pytest.raises(ConfigError, match="must be > 0"):
        live.now = snapshot(user_agent=UA, robots_ttl=0)
    assert cache.ttl_s == 3600


async def test_local_copy_expires_with_the_redis_copy(
    serve: ServeFn, make_cache: Callable[..., RobotsCache],
    redis_client: aioredis.Redis, crawl_name: str
) -> None:
    """A consumer that reads a copy written earlier by another keeps it only as long."""
    o = await serve(body=ROBOTS)
    writer = make_cache(ttl_s=2)
    assert not (await writer.check(f"{o.url}/private/x")).allowed
    key = CrawlKeys.build(crawl_name).robots(o.url)
    deadline = time.monotonic() + 10
    while (left_ms := int(await redis_client.pttl(key))) > 1500:  # 0.5 s on Redis' clock
        assert time.monotonic() < deadline, f"PTTL of {key} stuck at {left_ms} ms"
        await asyncio.sleep(0.02)
    assert left_ms > 0, "the copy expired before the reader read it"
    reader = make_cache()  # default 24 h TTL: must still follow the copy's remaining ~1.5 s
    assert not (await reader.check(f"{o.url}/private/x")).allowed
    read = time.monotonic()
    assert o.hits == 1
    o.body = b"User-agent: *\nDisallow:\n"
    # The reader's copy lives at most what was left of the Redis copy before it read it.
    await gone_everywhere(redis_client, crawl_name, reader, f"{o.url}/private/x",
                          by=read + left_ms / 1000)
    assert (await reader.check(f"{o.url}/private/x")).allowed
    assert o.hits == 2


async def _commands(redis_client: aioredis.Redis) -> int:
    stats = await redis_client.info("stats")
    return int(stats["total_commands_processed"])


async def test_in_process_cache_needs_no_redis(
    serve: ServeFn, make_cache: Callable[..., RobotsCache], redis_client: aioredis.Redis
) -> None:
    o = await serve(body=ROBOTS)
    cache = make_cache()
    await cache.check(f"{o.url}/public")
    before = await _commands(redis_client)
    for i in range(100):
        assert (await cache.check(f"{o.url}/public/{i}")).allowed
    after = await _commands(redis_client)
    assert after - before <= 2  # the INFO calls themselves; none from the 100 checks
    assert o.hits == 1


async def test_concurrent_checks_in_one_process_share_one_lookup(
    serve: ServeFn, make_cache: Callable[..., RobotsCache], redis_client: aioredis.Redis
) -> None:
    o = await serve(body=ROBOTS, delay=0.2)
    cache = make_cache()
    before = await _commands(redis_client)
    await asyncio.gather(*(cache.check(f"{o.url}/p/{i}") for i in range(100)))
    used = await _commands(redis_client) - before
    # one lookup: GET+PTTL, SET NX, GET+PTTL, SET, unlock (EVALSHA, maybe EVAL), INFO
    assert used <= 12, used
    assert o.hits == 1


async def test_cancelled_caller_does_not_cancel_shared_lookup(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    o = await serve(body=ROBOTS, delay=0.3)
    cache = make_cache()
    first = asyncio.create_task(cache.check(f"{o.url}/private/x"))
    second = asyncio.create_task(cache.check(f"{o.url}/public"))
    deadline = time.monotonic() + 10
    while o.hits == 0:  # the lookup is in flight: the server holds its request 0.3 s
        assert time.monotonic() < deadline, "robots.txt not requested within 10s"
        await asyncio.sleep(0.01)
    assert not first.done()
    first.cancel()
    assert await second == RobotsVerdict(True, 5.0)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert o.hits == 1


async def test_local_lru_is_bounded(serve: ServeFn, make_cache: Callable[..., RobotsCache],
                                    redis_client: aioredis.Redis) -> None:
    origins = [await serve(body=ROBOTS) for _ in range(3)]
    cache = make_cache(local_size=2)
    for o in origins:
        await cache.check(f"{o.url}/public")
    before = await _commands(redis_client)
    await cache.check(f"{origins[2].url}/public")  # recent: in process
    await cache.check(f"{origins[1].url}/public")
    assert await _commands(redis_client) - before == 1  # only INFO
    before = await _commands(redis_client)
    assert not (await cache.check(f"{origins[0].url}/private/x")).allowed  # evicted: Redis
    assert await _commands(redis_client) - before > 1
    assert [o.hits for o in origins] == [1, 1, 1]  # ... but no refetch


async def test_warm_reads_the_fleets_copies_ahead_and_fetches_nothing(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    """A page leased ahead of its turn has its origin's copy read in (one round trip)
    before the turn: then its verdict is in process; an origin Redis holds no copy of is
    left to the lookup at the turn, and warm fetches nothing over HTTP."""
    fetched, missing = await serve(body=ROBOTS), await serve(body=ROBOTS)
    other = make_cache()  # another consumer fetched this origin's robots.txt
    await other.check(f"{fetched.url}/public")
    cache = make_cache()
    assert cache.cached(f"{fetched.url}/private/x") is None
    await cache.warm([f"{fetched.url}/private/x", f"{missing.url}/public", "not a url"])
    verdict = cache.cached(f"{fetched.url}/private/x")
    assert verdict is not None and not verdict.allowed and verdict.crawl_delay == 5.0
    assert cache.cached(f"{missing.url}/public") is None
    assert (fetched.hits, missing.hits) == (1, 0)


async def test_the_leasers_read_ahead_warms_its_timed_leases_unless_robots_is_ignored(
    serve: ServeFn, make_cache: Callable[..., RobotsCache]
) -> None:
    """What the consumer gives its leaser for the leases it times (consumer/lifecycle.py):
    their origins' copies are read in before their turns, in a task of their own; with
    the crawl ignoring robots.txt, nothing is read."""
    o = await serve(body=ROBOTS)
    await make_cache().check(f"{o.url}/public")  # another consumer fetched it
    url = f"{o.url}/private/x"
    leases = [Lease(Task(id=f"{1:032x}", url=url), 0, "1", 0, "h")]
    ignoring = Live(snapshot(user_agent=UA, ignore_robots=True))
    cache = make_cache(policy=ignoring)
    read_ahead(cache, ignoring)(leases)
    read_ahead(None, ignoring)(leases)  # a consumer without a robots.txt cache
    await asyncio.sleep(0.05)
    assert cache.cached(url) is None
    live = Live(snapshot(user_agent=UA))
    cache = make_cache(policy=live)
    read_ahead(cache, live)(leases)

    async def warmed() -> bool:
        return cache.cached(url) is not None

    await until(warmed, 5.0, "the copy read ahead")
    verdict = cache.cached(url)
    assert verdict is not None and not verdict.allowed
    assert o.hits == 1  # read from the fleet's copy, not fetched again


async def test_the_lock_is_released_when_redis_lost_the_unlock_script(
    serve: ServeFn, make_cache: Callable[..., RobotsCache], redis_client: aioredis.Redis,
    crawl_name: str
) -> None:
    """The copy is stored and the lock released in one round trip (EVALSHA in the
    pipeline); a Redis that lost its scripts (restarted, failed over) still gets the lock
    released, not left to expire."""
    o = await serve(body=ROBOTS)
    await redis_client.script_flush()
    assert not (await make_cache().check(f"{o.url}/private/x")).allowed
    key = CrawlKeys.build(crawl_name).robots(o.url)
    assert await redis_client.exists(key) == 1
    assert await redis_client.exists(key + ":lock") == 0
