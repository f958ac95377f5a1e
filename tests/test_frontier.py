"""The host-fair frontier: leases serve hosts whose turn has come, and operators steer
hosts and the crawl while it runs. Real redis-server; real local sites for the fleet."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from sites import start_site_process, test_site
from support.consume import NullSink
from support.frontier import host_record, lease_when_due, polite_queue, tasks

from common.errors import ConfigError
from common.frontier.hosts import Frontier
from common.http.fetcher import Fetcher
from common.keys import CrawlKeys
from common.observability.metrics import Metrics
from common.policy import create_policy, set_policy
from common.queue import (
    Code,
    CrawlFormatError,
    Failure,
    Lease,
    LeasingQueue,
    RetryPolicy,
    lease_client,
)
from consumer.clock import RedisClock
from consumer.completion import Completion, CompletionKind
from consumer.config import build_parser, settings_from_args
from consumer.leaser import DISPATCH_MS
from consumer.lifecycle import Consumer
from consumer.slots import Stage
from consumer.turns import LATE_MS, LATE_SLACK_MS
from consumer.wiring import run


async def reclaimed_when_expired(q: LeasingQueue, within: float = 10.0) -> tuple[int, int]:
    """reclaim() until it takes something back (a lease's deadline passes on Redis' clock)."""
    deadline = time.monotonic() + within
    while (got := await q.reclaim()) == (0, 0):
        assert time.monotonic() < deadline, f"nothing reclaimed within {within:g}s"
        await asyncio.sleep(0.005)
    return got


async def test_a_host_with_a_delay_gives_one_task_per_turn_and_says_when_the_next_is(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, delay_s=0.4)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(5)]))
    first = await q.lease_turns("w", 10, 60_000)
    assert len(first.leases) == 1
    second = await q.lease_turns("w", 10, 60_000)
    assert second.leases == [] and second.wait_s is not None and 0.2 < second.wait_s <= 0.4
    await asyncio.sleep(second.wait_s)
    assert len(await lease_when_due(q, "w", 10, 60_000)) == 1


async def test_a_turn_within_ahead_is_leased_timed_to_it_and_counted_from_it(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """With ahead_ms, a host whose next turn comes within it is leased now, its lease
    carrying that turn (not the call's time), and its next turn counts from it: one call
    serves the coming turns, never closer together than the delay. A turn further out
    is left, the reply saying when it comes within reach; a host without a delay whose
    turn is a block's end is not leased before the block ends."""
    q = await polite_queue(redis_client, crawl_name, delay_s=2.0)
    await Frontier(q).set_host("blocked.test", delay_s=0)
    # A block that ends before a.test's next turn and 0.9 s past the first call's reach
    # (under the longest wait a reply gives, 1 s), however late a loaded machine makes
    # that call: what it waits for is timed from Redis' clock below, never the test's.
    await Frontier(q).block_host("blocked.test", 1.0)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(3)] + ["http://blocked.test/"]))
    [first] = await q.lease("w", 10, 60_000)
    pk = q.partitions[0]
    until = (await host_record(redis_client, pk, "blocked.test")).blocked
    assert until < first.granted_ms + 2_000  # the block ends first
    further = await q.lease_turns("w", 10, 60_000, ahead_ms=100)
    assert further.leases == [] and further.wait_s is not None
    # When to ask: the block's end less ahead_ms, from the call's Redis TIME.
    assert further.wait_s == (until - further.now_ms - 100) / 1000 > 0
    ahead = await q.lease_turns("w", 10, 60_000, ahead_ms=2_500)
    assert [(x.host, x.granted_ms, x.delay_ms) for x in ahead.leases] == [
        ("a.test", first.granted_ms + 2_000, 2_000)]
    assert ahead.now_ms < ahead.leases[0].granted_ms
    assert (await host_record(redis_client, pk, "a.test")).last == first.granted_ms + 2_000
    assert await redis_client.zscore(pk.due, "a.test") == first.granted_ms + 4_000
    assert until - ahead.now_ms <= 2_500  # the block ends within its reach: not leased
    assert (await host_record(redis_client, pk, "blocked.test")).inflight == 0
    # The consumer starts it at its turn, not when the reply came.
    settings = settings_from_args(build_parser().parse_args([]))
    consumer = Consumer(settings, q, Fetcher(settings.fetch), NullSink(), Metrics())
    [lease] = ahead.leases
    consumer.leaser.dispatch([lease], ahead.now_ms)
    dispatched, turn_in = time.monotonic(), (lease.granted_ms - ahead.now_ms) / 1000
    await asyncio.sleep(turn_in / 2)  # ~1 s: long past a dispatch, well before the turn
    if time.monotonic() - dispatched < turn_in - 0.1:  # a loop this late can't judge it
        assert consumer.slots.stage(lease) is Stage.SCHEDULED
    await asyncio.sleep(turn_in / 2 + 0.4)
    assert consumer.slots.stage(lease) is not Stage.SCHEDULED
    await consumer.fetcher.close()


async def test_concurrency_caps_leases_per_host_until_one_ends(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, concurrency=2)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(5)]))
    held = await q.lease("w", 10, 60_000)
    assert len(held) == 2
    assert await q.lease("w", 10, 60_000) == []
    await q.ack("w", [(held[0], "ok")])
    assert len(await q.lease("w", 10, 60_000)) == 1


async def test_hosts_are_served_in_rotation_whatever_the_seed_order(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, delay_s=60)
    # Sorted by host, as sitemaps are: a FIFO would hand out a.test's ten first.
    urls = [f"http://{h}.test/{i}" for h in "abc" for i in range(10)]
    await q.enqueue(tasks(urls))
    got = await q.lease("w", 10, 60_000)
    assert sorted(lease.host for lease in got) == ["a.test", "b.test", "c.test"]


async def commands(client: aioredis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"]
            for k, v in (await client.info("commandstats")).items()}


async def test_a_steady_lease_is_one_round_trip_on_the_hosts_the_last_one_named(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(30)]))
    assert len(await q.lease("w", 10, 60_000)) == 10  # reads `due` first: nothing named
    await redis_client.config_resetstat()
    assert len(await q.lease("w", 10, 60_000)) == 10
    used = await commands(redis_client)  # commands in scripts count: the lease's own TIME
    assert (used.get("evalsha"), used.get("time")) == (1, 1), used


async def test_hosts_the_last_lease_did_not_name_are_found_when_the_named_give_nothing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, concurrency=1)
    await q.enqueue(tasks(["http://a.test/1", "http://b.test/1"]))
    [first] = await q.lease("w", 1, 60_000)  # names the other host, ready
    other = LeasingQueue(redis_client, crawl_name, q.settings)
    [second] = await other.lease("w2", 1, 60_000)  # another consumer takes its turn
    assert {first.host, second.host} == {"a.test", "b.test"}
    await q.enqueue(tasks(["http://c.test/1"]))
    assert [x.host for x in await q.lease("w", 10, 60_000)] == ["c.test"]


async def test_a_request_sent_late_moves_its_hosts_next_turn_on_ack_and_on_fail(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Politeness counts from when a request went out: a consumer whose event loop held a
    request back reports it, and the host's next turn is a full delay after it."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0.3)
    await q.enqueue(tasks(["http://a.test/1", "http://a.test/2", "http://a.test/3"]))
    pk = q.partitions[0]
    for settle in ("ack", "fail"):
        [lease] = await lease_when_due(q, "w", 1, 60_000)  # the second: after the 500 ms
        assert (await host_record(redis_client, pk, "a.test")).last == lease.granted_ms
        lease.sent_ms = lease.granted_ms + 200
        if settle == "ack":
            await q.ack("w", [(lease, "ok")])
        else:
            await q.fail("w", [Failure(lease, "http_5xx", "503", permanent=True)])
        assert (await host_record(redis_client, pk, "a.test")).last == lease.granted_ms + 200
        assert await redis_client.zscore(pk.due, "a.test") == lease.granted_ms + 500


async def test_an_earlier_sent_time_never_moves_a_turn_back(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, delay_s=0.3, concurrency=2)
    await q.enqueue(tasks(["http://a.test/1", "http://a.test/2", "http://a.test/3"]))
    [first] = await q.lease("w", 1, 60_000)
    await asyncio.sleep(0.3)
    [second] = await lease_when_due(q, "w", 1, 60_000)
    first.sent_ms = first.granted_ms + 10  # sent late, but before the second turn
    await q.ack("w", [(first, "ok")])
    assert (await host_record(redis_client, q.partitions[0], "a.test")).last == \
        second.granted_ms


async def test_priority_goes_first_within_a_host_and_across_hosts(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, delay_s=60)
    await q.enqueue(tasks([f"http://{h}.test/{i}" for h in "abcd" for i in range(3)]))
    await q.enqueue(tasks(["http://c.test/urgent"], priority=9))
    [first] = await q.lease("w", 1, 60_000)
    assert first.task.url == "http://c.test/urgent" and first.task.priority == 9


async def test_a_push_back_blocks_the_host_for_every_consumer_within_the_cap(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name)
    q.configure(retry=RetryPolicy(base_ms=10, max_retry_after_ms=800, backoff_base_ms=10))
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(3)] + ["http://b.test/"]))
    leases = await q.lease("w1", 2, 60_000)
    a = next(x for x in leases if x.host == "a.test")
    await q.fail("w1", [Failure(a, "http_429", "slow down", retry_after=999_999,
                                pushback=True)])
    # Another consumer: b.test is served, a.test is not, for 0.8 s (the cap), not 11 days.
    other = await q.lease_turns("w2", 10, 60_000)
    assert {x.host for x in other.leases} <= {"b.test"}
    row = await Frontier(q).host("a.test")
    assert row is not None and row.blocked_until_ms is not None
    page = await Frontier(q).hosts(sort="blocked_until")
    assert [r.host for r in page.rows] == ["a.test"]
    assert 0 < row.blocked_until_ms - page.now_ms <= 800
    await asyncio.sleep(0.8)
    assert {x.host for x in await lease_when_due(q, "w2", 10, 60_000)} == {"a.test"}


async def test_a_retry_after_of_zero_still_waits_the_normal_backoff(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name)
    q.configure(retry=RetryPolicy(base_ms=2000))
    await q.enqueue(tasks(["http://a.test/"]))
    [lease] = await q.lease("w", 1, 60_000)
    [(_, delay)] = await q.fail("w", [Failure(lease, "http_503", "x", retry_after=0)])
    assert delay == 2000


async def test_host_settings_pause_and_resume_apply_to_the_next_lease(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, delay_s=60)
    front = Frontier(q)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(4)]))
    assert len(await q.lease("w", 10, 60_000)) == 1
    assert await q.lease("w", 10, 60_000) == []  # next turn in 60 s
    await front.set_host("A.test", delay_s=0, concurrency=10)
    assert len(await q.lease("w", 10, 60_000)) == 3
    await q.enqueue(tasks(["http://a.test/more"]))
    await front.set_paused(True)
    paused = await q.lease_turns("w", 10, 60_000)
    assert paused.leases == [] and paused.paused and await front.is_paused()
    await front.set_paused(False)
    assert len(await q.lease("w", 10, 60_000)) == 1
    await q.enqueue(tasks(["http://a.test/blocked"]))
    await front.block_host("a.test", 60)
    assert await q.lease("w", 10, 60_000) == []
    await front.block_host("a.test", 0)
    assert len(await q.lease("w", 10, 60_000)) == 1
    with pytest.raises(ConfigError):
        await front.set_host("a.test")


async def test_a_budget_counts_pages_that_got_a_response_and_parks_the_rest(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name)
    front = Frontier(q)
    await front.set_host("a.test", budget=3)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(10)]))

    async def used() -> tuple[int, int]:
        row = await front.host("a.test")
        assert row is not None
        return row.used, row.reserved

    # A lease holds a page of the budget: three leases at most, however many are asked.
    a, b, c = await q.lease("w", 100, 60_000)
    assert await q.lease("w", 100, 60_000) == [] and await used() == (0, 3)
    # A release (shutdown, a robots.txt turn) gives its page back...
    assert await q.release("w", [a]) == [Code.OK]
    [a] = await q.lease("w", 100, 60_000)
    # ... and so does a failure with no response (a timeout, a refused connection).
    await q.fail("w", [Failure(b, "timeout", "read timed out", permanent=True)])
    assert await used() == (0, 2)
    [d] = await q.lease("w", 100, 60_000)
    # A 503 is a request the host answered: it spends a page, retried or not.
    await q.fail("w", [Failure(c, "http_5xx", "HTTP 503", permanent=True)])
    assert await used() == (1, 2)
    await q.ack("w", [(a, "ok"), (d, "http_4xx")])
    assert await used() == (3, 0)

    # Spent: the host is not served; its 6 tasks wait, parked, and the crawl is empty
    # for its consumers (--exit-when-empty exits).
    assert await q.lease("w", 100, 60_000) == []
    s = await q.stats()
    assert (s.pending, s.parked, s.done, s.dead, s.hosts_due) == (6, 6, 2, 2, 0)
    assert "outcome:host_budget" not in s.counters
    assert await q.is_empty()

    # Raising the budget serves the parked tasks again.
    await front.set_host("a.test", budget=5)
    assert (await q.stats()).parked == 0 and not await q.is_empty()
    more = await q.lease("w", 100, 60_000)
    assert len(more) == 2
    await q.ack("w", [(x, "ok") for x in more])
    assert await used() == (5, 0) and (await q.stats()).parked == 4
    await front.set_host("a.test", clear=("budget",))
    rest = await q.lease("w", 100, 60_000)
    assert len(rest) == 4 and (await q.stats()).parked == 0


async def test_an_ack_without_a_request_and_an_expired_lease_give_their_page_back(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name)
    front = Frontier(q)
    await front.set_host("a.test", budget=2)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(5)]))
    x, y = await q.lease("w", 100, 1)
    await asyncio.sleep(0.01)
    assert await q.reclaim() == (2, 0)  # its consumer died: not known to be a page
    x, y = await q.lease("w", 100, 60_000)
    y.responded = False  # the consumer says: no request went out
    await q.ack("w", [(x, "robots_disallowed"), (y, "ok")])
    row = await front.host("a.test")
    assert row is not None and (row.used, row.reserved, row.budget) == (0, 0, 2)
    # A budget counts the pages leased after it was set (an ack of a host without one
    # costs no budget bookkeeping).
    await front.set_host("a.test", clear=("budget",))
    [z] = await q.lease("w", 1, 60_000)
    await front.set_host("a.test", budget=2)
    await q.ack("w", [(z, "ok")])
    row = await front.host("a.test")
    assert row is not None and (row.used, row.reserved) == (0, 0)
    assert len(await q.lease("w", 100, 60_000)) == 2


async def test_hosts_lists_pages_sorted_by_any_column_across_partitions(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, partitions=3)
    urls = [f"http://h{h}.test/{i}" for h in range(6) for i in range(h + 1)]
    await q.enqueue(tasks(urls))
    front = Frontier(q)
    page = await front.hosts(sort="queued", limit=4)
    assert page.total == 6
    assert [(r.host, r.queued) for r in page.rows] == [
        ("h5.test", 6), ("h4.test", 5), ("h3.test", 4), ("h2.test", 3)]
    rest = await front.hosts(sort="queued", offset=4, limit=4)
    assert [r.host for r in rest.rows] == ["h1.test", "h0.test"]
    asc = await front.hosts(sort="queued", desc=False, limit=1)
    assert asc.rows[0].host == "h0.test"
    with pytest.raises(ConfigError):
        await front.hosts(sort="nope")


async def test_one_host_lives_in_one_partition_with_its_state(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, partitions=4)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(20)]))
    p = q.partition_of("a.test")
    assert await redis_client.llen(q.on.partitions[p].host_queue("a.test")) == 20
    assert all(lease.partition == p for lease in await q.lease("w", 20, 60_000))


async def test_a_crawl_made_by_the_previous_version_gets_a_clear_error(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    old = '{"partitions": 1, "dedup": "exact", "seen_bits": 16, "bloom_capacity": 1000000,' \
          ' "bloom_error": 1e-06, "bloom_layers": 8}'
    await redis_client.hset(f"crawlq:{{{crawl_name}}}:meta", "settings", old)
    with pytest.raises(CrawlFormatError, match="re-create it"):
        await LeasingQueue.existing(redis_client, crawl_name)


async def test_release_and_reclaim_put_tasks_back_at_the_head_of_their_host(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await polite_queue(redis_client, crawl_name, concurrency=1)
    await q.enqueue(tasks(["http://a.test/1", "http://a.test/2"]))
    [one] = await q.lease("w", 5, 60_000)
    assert await q.release("w", [one]) == [0]
    [again] = await q.lease("w", 5, 1)
    assert again.task.url == "http://a.test/1"
    assert await reclaimed_when_expired(q) == (1, 0)
    [third] = await q.lease("w", 5, 60_000)
    assert third.task.url == "http://a.test/1" and third.task.attempt == 2


# -- the fleet, measured at the server -------------------------------------------------


def _consumer_settings(redis_url: str, crawl: str, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args([
        "--redis-url", redis_url, "--crawl", crawl, "--output", str(out), "--allow-private",
        "--http-port", "-1", "--exit-when-empty", "--empty-grace", "0", "--lease", "10s",
        *extra]))


async def test_three_consumers_keep_each_hosts_delay_and_concurrency_robots_included(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path) -> None:
    delay = 0.3
    async with start_site_process(delay_ms=50, robots="User-agent: *\nAllow: /") as s1, \
            start_site_process(delay_ms=50, robots="User-agent: *\nAllow: /") as s2:
        urls = [s.url(f"/p/{i}") for s in (s1, s2) for i in range(6)]
        await LeasingQueue.open(redis_client, crawl_name)
        q = await LeasingQueue.existing(redis_client, crawl_name)
        await q.enqueue(tasks(urls))
        codes = await asyncio.gather(*(run(_consumer_settings(
            redis_url, crawl_name, tmp_path / f"c{i}", "--per-host-delay", f"{delay}",
            "--per-host-concurrency", "1", "--concurrency", "8")) for i in range(3)))
        assert codes == [0, 0, 0]
        for site in (s1, s2):
            times = sorted(t for path, ts in (await site.stats()).times.items()
                           if path.startswith(("/p/", "/robots.txt")) for t in ts)
            assert len(times) == 7  # robots.txt and six pages, each once
            gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= delay - 0.05, gaps
        assert (await q.stats()).done == 12


@pytest.mark.parametrize("held_ms", [700, 1300], ids=["before-next-turn", "after-next-turn"])
async def test_a_late_robots_txt_and_the_pages_that_waited_for_it_keep_the_delay(
        held_ms: int, redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """robots.txt is looked up before a host's first page (the fleet's copy, a lock) and
    may go out well after that page's turn, under its lease; with a concurrency of 2 the
    host's next turn may be leased meanwhile, a delay after the first, and its page then
    waits for that robots.txt and goes late too. Each takes a turn of its own
    (late_turn.lua). Here a lock a dead consumer left holds every robots.txt lookup back
    `held_ms`, less or more than the delay: two consumers still keep every request,
    robots.txt included, a delay apart."""
    delay, pages = 1.0, 3
    async with contextlib.AsyncExitStack() as stack:
        sites = [await stack.enter_async_context(
            start_site_process(robots="User-agent: *\nAllow: /")) for _ in range(2)]
        urls = [site.url(f"/p/{i}") for i in range(pages) for site in sites]
        await LeasingQueue.open(redis_client, crawl_name)
        q = await LeasingQueue.existing(redis_client, crawl_name)
        await q.enqueue(tasks(urls))
        for site in sites:
            lock = CrawlKeys.build(crawl_name).robots(site.base) + ":lock"
            await redis_client.set(lock, "a dead consumer's", px=held_ms)
        codes = await asyncio.gather(*(run(_consumer_settings(
            redis_url, crawl_name, tmp_path / f"c{i}", "--per-host-delay", f"{delay}",
            "--per-host-concurrency", "2", "--concurrency", "8")) for i in range(2)))
        assert codes == [0, 0]
        for site in sites:
            seen = await site.stats()
            times = sorted(t for path, ts in seen.times.items()
                           if path.startswith(("/p/", "/robots.txt")) for t in ts)
            assert seen.hits["/robots.txt"] == 1 and seen.total() == pages
            gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
            assert min(gaps) >= delay - 0.05, gaps
    assert (await q.stats()).done == len(urls)


async def test_a_request_late_on_the_wire_takes_a_turn_of_its_own(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """Whether a polite request is late is judged as its headers go out, after its
    connect: here the consumer's pool holds one connection per host and the first page
    answers in 1.5 s, so the second page, leased for its turn a delay later, waits for
    the connection and would go out half a delay late; it answers in 0.8 s, so the third
    page's turn is leased, a delay after the second's, before the second's ack says when
    it went. The second takes a turn of its own instead: every request a delay apart
    (without it, the second and third came 0.8 s apart)."""
    delay = 1.0
    async with start_site_process() as site:
        paths = ["/p/0?delay=1500", "/p/1?delay=800", "/p/2", "/p/3"]
        await LeasingQueue.open(redis_client, crawl_name)
        q = await LeasingQueue.existing(redis_client, crawl_name)
        await q.enqueue(tasks([site.url(p) for p in paths]))
        settings = _consumer_settings(
            redis_url, crawl_name, tmp_path / "c", "--per-host-delay",
            f"{delay}", "--per-host-concurrency", "2", "--concurrency", "8")
        settings = dataclasses.replace(
            settings, fetch=dataclasses.replace(settings.fetch, limit_per_host=1))
        assert await run(settings) == 0
        seen = await site.stats()
        times = sorted(t for path, ts in seen.times.items() for t in ts)
        assert seen.total() == len(paths)
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
        assert min(gaps) >= delay - 0.05, gaps
    assert (await q.stats()).done == len(paths)


async def test_each_lease_says_its_hosts_delay_whatever_the_consumers_flags(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Politeness comes from the lease: the reply carries each host's delay (the crawl's
    default, the host's own setting, or robots.txt's Crawl-delay when longer), and a
    consumer times those requests whatever its own flags say."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=0)
    front = Frontier(q)
    await front.set_host("slow.test", delay_s=0.25)
    await front.set_robots_delay("robots.test", 0.5)
    await q.enqueue(tasks(["http://fast.test/", "http://slow.test/", "http://robots.test/"]))
    leases = {lease.host: lease for lease in await q.lease("w", 10, 60_000)}
    assert {h: lease.delay_ms for h, lease in leases.items()} == {
        "fast.test": 0, "slow.test": 250, "robots.test": 500}

    settings = settings_from_args(build_parser().parse_args(
        ["--per-host-delay", "0", "--per-host-concurrency", "0"]))
    consumer = Consumer(settings, q, Fetcher(settings.fetch), NullSink(), Metrics())
    consumer.leaser.dispatch(list(leases.values()), leases["fast.test"].granted_ms)
    assert consumer.slots.ids(Stage.QUEUED) == {leases["fast.test"].id}
    assert consumer.slots.ids(Stage.SCHEDULED) == {leases["slow.test"].id,
                                                   leases["robots.test"].id}
    await consumer.fetcher.close()


async def test_a_hosts_slot_comes_back_once_when_the_response_is_in(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """With concurrency 1, naming a lease whose response is in gives its host's slot back
    in the same lease call, before the ack; the ack then doesn't give it back again. A
    lease named by a worker that doesn't hold it (another worker, a stale token) frees
    nothing."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=1)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(4)]))
    [first] = await q.lease("w1", 5, 60_000)
    assert first.concurrency == 1
    assert await q.lease("w1", 5, 60_000) == []  # the host's one slot is taken
    stranger = Lease(first.task, first.partition, first.token, first.deadline_ms, first.host)
    assert (await q.lease_turns("w2", 5, 60_000, responses_in=[stranger])).leases == []
    forged = Lease(first.task, first.partition, "999", first.deadline_ms, first.host)
    assert (await q.lease_turns("w1", 5, 60_000, responses_in=[forged])).leases == []

    fetched = [first]
    second = (await q.lease_turns("w1", 5, 60_000, responses_in=fetched)).leases
    assert fetched == []  # the list is taken
    assert [x.task.url for x in second] == ["http://a.test/1"]
    assert await q.ack("w1", [(first, "ok")]) == [Code.OK]
    assert await q.lease("w1", 5, 60_000) == []  # the ack gave nothing back twice
    await q.lease_turns("w1", 0, 60_000, responses_in=[second[0], second[0]])  # named twice
    assert len(await q.lease("w1", 5, 60_000)) == 1
    assert await q.lease("w1", 5, 60_000) == []


async def test_a_hosts_slots_are_shared_with_a_worker_whose_lease_came_back_empty(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Fair share (lease.lua): w1 holds all four slots of a host; w2 asks and gets none, so
    it is hungry. When w1's responses are in, w1 takes back only its share (two, counting
    what it holds), says so on the wake channel, and w2 takes the other two. With nobody
    hungry (w2 got work, or its mark is old), a worker takes every free slot."""
    q = await polite_queue(redis_client, crawl_name, concurrency=4)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(20)]))
    pk = q.partitions[0]
    first = (await q.lease_turns("w1", 10, 60_000)).leases
    assert len(first) == 4  # nobody else asked: every slot
    pubsub = redis_client.pubsub()
    await pubsub.subscribe(q.crawl_keys.wake)
    assert (await q.lease_turns("w2", 10, 60_000)).leases == []
    assert await redis_client.zscore(pk.hungry, "w2") is not None

    def none(host: str) -> int:
        return 0

    again = (await q.lease_turns("w1", 10, 60_000, responses_in=list(first), held=none)).leases
    assert len(again) == 2
    deadline = time.monotonic() + 5
    while (woken := await pubsub.get_message(ignore_subscribe_messages=True,
                                             timeout=0.1)) is None:
        assert time.monotonic() < deadline, "the capped lease published no wake-up"
    assert woken["data"] == b"1"
    assert (await q.lease_turns("w1", 10, 60_000, held=lambda host: 2)).leases == []
    theirs = (await q.lease_turns("w2", 10, 60_000, held=none)).leases
    assert len(theirs) == 2
    assert await redis_client.zscore(pk.hungry, "w2") is None  # fed: not hungry

    # Nobody hungry: w1's two freed slots and nothing held elsewhere by w1 -> all it may.
    assert len((await q.lease_turns("w1", 10, 60_000, responses_in=list(again),
                                    held=none)).leases) == 2
    # A hungry mark older than HUNGRY_MS (2 s) no longer caps anyone.
    seconds, micros = await redis_client.time()
    await redis_client.zadd(pk.hungry, {"w3": seconds * 1000 + micros // 1000 - 3000})
    assert len((await q.lease_turns("w2", 10, 60_000, responses_in=list(theirs),
                                    held=none)).leases) == 2
    await pubsub.aclose()


async def test_a_lease_reply_names_the_policy_version_its_partition_holds(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A busy consumer learns of a policy change from its next lease reply, with no round
    trip of its own (a lost pub/sub message then costs nothing)."""
    q = await polite_queue(redis_client, crawl_name, concurrency=0)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(4)]))
    first = await q.lease_turns("w", 1, 60_000)
    await set_policy(redis_client, crawl_name, {"per_host_concurrency": 3}, by="test")
    second = await q.lease_turns("w", 1, 60_000)
    assert len(first.leases) == len(second.leases) == 1
    assert second.policy_version == first.policy_version + 1 > 0


async def test_a_policy_change_reaches_three_running_consumers_within_a_second(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Three consumers wait for a host's next turn under a 5 s delay; the delay is set to
    0.1 s (policy version 3). Each applies the new version within a second, and the
    host's next request comes within a second too (the change moved its turn earlier and
    woke the consumers) instead of at the old turn."""
    caplog.set_level(logging.INFO, logger="consumer")
    async with test_site(robots="User-agent: *\nAllow: /") as site:
        await LeasingQueue.open(redis_client, crawl_name)
        await create_policy(redis_client, crawl_name,
                            {"per_host_delay": 0.1, "per_host_concurrency": 1}, by="test")
        q = await LeasingQueue.existing(redis_client, crawl_name)
        await q.enqueue(tasks([site.url(f"/p/{i}") for i in range(8)]))
        runs = [asyncio.create_task(run(_consumer_settings(
            redis_url, crawl_name, tmp_path / f"c{i}", "--concurrency", "4")))
            for i in range(3)]
        deadline = time.monotonic() + 10
        while not site.times.get("/p/1"):
            assert time.monotonic() < deadline, "the first pages were never fetched"
            await asyncio.sleep(0.01)
        await set_policy(redis_client, crawl_name, {"per_host_delay": 5.0}, by="test")
        # Every consumer is waiting for the host's next turn (the wakes of the last acks,
        # and the turns leased ahead, all past: under load they took over 0.5 s).
        await asyncio.sleep(1.5)
        changed = time.monotonic()
        stored = await set_policy(redis_client, crawl_name, {"per_host_delay": 0.1},
                                  by="test")
        assert await asyncio.wait_for(asyncio.gather(*runs), 20) == [0, 0, 0]
    applied = [r.created for r in caplog.records if r.getMessage() == "crawl_policy_applied"
               and getattr(r, "version", None) == stored.version]
    assert len(applied) == 3, "each consumer applies the new version once"
    wall_changed = time.time() - (time.monotonic() - changed)
    assert max(applied) - wall_changed < 1.0
    after = sorted(t for path, ts in site.times.items() if path.startswith("/p/")
                   for t in ts if t > changed)
    assert after and after[0] - changed < 1.0, "the next turn waited for the old delay"
    assert len(after) + sum(1 for i in range(8) if site.times.get(f"/p/{i}", [changed])[0]
                            < changed) == 8


def late_turns(consumer: Consumer) -> float | None:
    """The consumer's crawlq_late_turns_total."""
    return consumer.metrics.registry.get_sample_value("crawlq_late_turns_total")


async def test_a_polite_request_counts_from_when_its_headers_went_out(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The late-send report (sent_ms, which moves the host's next turn at the ack) is taken
    when the request's headers are written (after a slow connect or a busy loop), not when
    the fetch began; only its first hop counts. A request later than LATE_MS there takes
    a turn of its own first (late_turn.lua), then goes. A host without a delay reports
    nothing. (frontier_bench: a host's first request, on a new connection, reached the
    server up to 90 ms after its fetch began, and the next turn, counted from the fetch,
    came 0.92 s after it.)"""
    q = await polite_queue(redis_client, crawl_name, delay_s=1.0, concurrency=2)
    await q.enqueue(tasks(["http://a.test/1", "http://a.test/2"]))
    settings = settings_from_args(build_parser().parse_args([]))
    consumer = Consumer(settings, q, Fetcher(settings.fetch), NullSink(), Metrics())
    turns, clock = consumer.runner.turns, consumer.leaser.clock
    [noted] = (await q.lease_turns(consumer.worker_id, 1, 60_000)).leases
    [late] = (await q.lease_turns(consumer.worker_id, 1, 60_000, ahead_ms=2_000)).leases
    late_by = DISPATCH_MS + LATE_SLACK_MS + 2  # noted, no turn taken
    clock.observe(time.monotonic(), noted.granted_ms + late_by)  # Redis' clock: now
    sent = turns.on_sent(noted)
    assert sent is not None and noted.sent_ms == 0
    await sent()
    start = noted.granted_ms + late_by - DISPATCH_MS
    assert start <= noted.sent_ms <= start + LATE_MS - LATE_SLACK_MS - 2
    first = noted.sent_ms
    await sent()  # a redirect's hop: a later request, not this one's start
    assert noted.sent_ms == first and late_turns(consumer) == 0

    # The second turn, leased a delay after the first, goes 200 ms after it, no later
    # turn leased: a turn of its own, at once.
    turns.clock = RedisClock()
    sec, us = await redis_client.time()
    turns.clock.observe(time.monotonic(), sec * 1000 + us // 1000)
    turn = late.granted_ms
    await asyncio.sleep((turn - (sec * 1000 + us // 1000)) / 1000 + 0.2)
    sent = turns.on_sent(late)
    assert sent is not None
    await sent()
    assert late_turns(consumer) == 1 and late.granted_ms >= turn + 150
    untimed = Lease(late.task, late.partition, late.token, late.deadline_ms, late.host)
    assert turns.on_sent(untimed) is None
    await consumer.fetcher.close()


async def test_an_ended_lease_wakes_the_leaser_only_if_its_host_can_go_before_it_asks(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """An ack frees its host's slot, but a host with a delay takes its next request only
    at its next turn: the ack wakes the leaser (and, through the flusher, the fleet's idle
    consumers) only when that turn comes before the leaser would ask anyway, so a polite
    crawl makes no lease call per flush that can only find hosts not due. A host without
    a delay, or one whose response came slower than its delay, wakes it at once.
    (frontier_bench, 2 consumers: 8.8-10.0 Redis commands a page before, 7.8-8.2 after.)"""
    q = await polite_queue(redis_client, crawl_name, delay_s=1.0, concurrency=1)
    await q.enqueue(tasks(["http://a.test/", "http://b.test/"]))
    settings = settings_from_args(build_parser().parse_args([]))
    consumer = Consumer(settings, q, Fetcher(settings.fetch), NullSink(), Metrics())
    leases = await q.lease(consumer.worker_id, 10, 60_000)
    try:
        assert consumer.leaser.turn_soon(leases)  # no clock yet: nothing is known, wake
        consumer.leaser.clock.observe(time.monotonic(), leases[0].granted_ms)
        assert not consumer.leaser.turn_soon(leases)  # next turns a second away
        slow = dataclasses.replace(leases[1], granted_ms=leases[1].granted_ms - 1000)
        assert consumer.leaser.turn_soon([leases[0], slow])  # its next turn is now
        untimed = dataclasses.replace(leases[0], delay_ms=0)
        assert consumer.leaser.turn_soon([untimed])
        consumer.leaser.wake_at = time.monotonic() + 5  # the leaser sleeps past the next turns
        assert consumer.leaser.turn_soon(leases)

        consumer.leaser.wake_at = 0.0
        consumer.leaser.freed.clear()
        consumer.book.hold(leases[0], time.monotonic())
        told: list[str] = []

        async def notify() -> None:
            told.append("wake")
        consumer.flusher._notify = notify
        consumer.flusher.add(Completion(leases[0], CompletionKind.ACK))
        await consumer.flusher.flush()
        assert consumer.flusher.done == 1
        assert not consumer.leaser.freed.is_set() and told == []
        consumer.book.hold(slow, time.monotonic())
        consumer.flusher.add(Completion(slow, CompletionKind.ACK))
        await consumer.flusher.flush()
        assert consumer.leaser.freed.is_set() and told == ["wake"]
    finally:
        await consumer.fetcher.close()


async def test_a_lease_call_reads_no_more_candidate_hosts_than_it_may_use(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The script reads every candidate host it is given, so a call is given no more
    than its n may use (the reply's `next` may name up to a large call's worth), and a
    call that only gives slots back (n = 0) is given none."""
    q = await polite_queue(redis_client, crawl_name, delay_s=0, concurrency=1)
    await q.enqueue(tasks([f"http://h{i}.test/{j}" for i in range(60) for j in range(2)]))
    given: list[tuple[int, int]] = []
    script = q.leases._lease_script

    async def recording(pk, worker, n, lease_ms, *, hosts, **kw):  # type: ignore[no-untyped-def]
        given.append((n, len(hosts)))
        return await script(pk, worker, n, lease_ms, hosts=hosts, **kw)
    q.leases._lease_script = recording  # type: ignore[method-assign]
    big = await q.lease_turns("w", 50, 60_000)
    assert len(big.leases) == 50
    given.clear()
    small = await q.lease_turns("w", 1, 60_000)
    assert len(small.leases) == 1
    assert given and all(hosts <= lease_client.candidates_for(1) for _, hosts in given)
    given.clear()
    await q.lease_turns("w", 0, 60_000, responses_in=small.leases)
    assert given == [(0, 0)]


async def test_a_call_that_only_gives_slots_back_wakes_the_fleet(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A consumer whose CPU is behind gives its hosts' slots back with n = 0, reading no
    candidate hosts: the script itself publishes on the wake channel, so the fleet's idle
    consumers take those slots now, not when this one's handlers catch up."""
    q = await polite_queue(redis_client, crawl_name, concurrency=2)
    await q.enqueue(tasks([f"http://a.test/{i}" for i in range(6)]))
    held = (await q.lease_turns("w1", 10, 60_000)).leases
    assert len(held) == 2
    pubsub = redis_client.pubsub()
    await pubsub.subscribe(q.crawl_keys.wake)
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    assert (await q.lease_turns("w1", 0, 60_000, responses_in=list(held))).leases == []
    woken = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
    assert woken is not None and woken["data"] == b"1", "slots given back, nobody woken"
    assert len((await q.lease_turns("w2", 10, 60_000)).leases) == 2
    await pubsub.aclose()
