"""``crawlq fsck`` as a real command against a real crawl, broken on purpose behind its
back (host records, lease records, bodies, the revisit schedule), and the lease's own
repair of a host queue that was lost (a crawl must not hang)."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import redis.asyncio as aioredis
from support.consume import consume
from support.frontier import host_record, put_record
from support.history import history_count, record_of
from support.routes import page, serve

from common.exitcodes import EXIT_INCONSISTENT, EXIT_OK
from common.frontier.hosts import Frontier
from common.hostmodel.group_record import GroupRecord
from common.policy import set_policy
from common.queue import Code, CrawlSettings, Failure, LeasingQueue, NewTask
from common.revisits.record import history_field
from common.tasks.task import expand_entry
from common.urls.canonical import fingerprint

ROOT = Path(__file__).resolve().parent.parent


async def fsck(redis_url: str, crawl: str, *extra: str) -> tuple[int, str]:
    """``python -m console.cli fsck``, as a subprocess: its exit code and stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console.cli", "fsck", "--crawl", crawl, "--redis-url",
        redis_url, "--cluster", "no", *extra, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    assert not err or proc.returncode != 0 or b"Traceback" not in err, err.decode()
    return proc.returncode, out.decode()


def tasks(*urls: str, priority: int = 0) -> list[NewTask]:
    return [NewTask(u, fingerprint(u), priority=priority) for u in urls]


async def crawl_of(client: aioredis.Redis, name: str, partitions: int = 2) -> LeasingQueue:
    """a.test: 4 plain + 2 priority pending; b.test and c.test: 3 each; concurrency 2."""
    q = await LeasingQueue.open(client, name, CrawlSettings(partitions=partitions))
    await Frontier(q).set_defaults(delay_s=0, concurrency=2)
    await q.enqueue(tasks(*(f"http://a.test/{i}" for i in range(4))))
    await q.enqueue(tasks("http://a.test/p1", "http://a.test/p2", priority=5))
    await q.enqueue(tasks(*(f"http://{h}.test/{i}" for h in "bc" for i in range(3))))
    return q


async def drain(q: LeasingQueue) -> int:
    """Lease and ack everything; the number done."""
    done = 0
    for _ in range(100):
        got = await q.lease("w", 10, 60_000)
        if not got:
            if await q.is_empty():
                return done
            await asyncio.sleep(0.01)
            continue
        await q.ack("w", [(x, "ok") for x in got])
        done += len(got)
    raise AssertionError("the crawl did not finish")


async def test_a_clean_crawl_is_clean(redis_url: str, redis_client: aioredis.Redis,
                                      crawl_name: str) -> None:
    q = await crawl_of(redis_client, crawl_name)
    leases = await q.lease("w", 5, 60_000)
    assert len(leases) == 5
    await q.ack("w", [(leases[0], "ok")])
    await q.fail("w", [Failure(leases[1], "gone", "404", permanent=True),
                       Failure(leases[2], "http_5xx", "503", retry_after=600)])
    code, out = await fsck(redis_url, crawl_name)
    assert code == EXIT_OK, out
    assert out.splitlines() == [f"crawl {crawl_name}: clean (2 partitions, 3 hosts, 7 pending, "
                                "2 leased, 1 waiting, 1 dead)"]
    code, out = await fsck(redis_url, crawl_name, "--json")
    doc = json.loads(out)
    assert (code, doc["clean"], doc["problems"]) == (EXIT_OK, True, [])
    assert doc["checked"] == {"hosts": 3, "pending": 7, "leased": 2, "waiting": 1, "dead": 1}


async def test_a_lost_host_queue_is_found_repaired_and_the_crawl_finishes(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await crawl_of(redis_client, crawl_name)
    pk = q.partitions[q.partition_of("a.test")]
    p = pk.partition
    await redis_client.delete(pk.host_queue("a.test"), pk.host_prio("a.test"))

    code, out = await fsck(redis_url, crawl_name)
    assert code == EXIT_INCONSISTENT, out
    lines = out.splitlines()
    assert f"partition {p} host a.test: its record counts 6 queued, its queues hold 0 " \
        "(hq 0, hp 0)" in lines
    assert f"partition {p} host a.test: in due with no pending entries" in lines
    assert any(line.startswith(f"partition {p}: pending is ") for line in lines)
    assert lines[-1].startswith(f"crawl {crawl_name}: ") and "run again with --repair" in out

    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert f"partition {p}: repaired queued of 1 host recounted from the queues (6 " \
        "entries were missing); pending " in out
    assert "due: 0 added, 1 removed" in out
    assert "all repaired" in out.splitlines()[-1]
    code, out = await fsck(redis_url, crawl_name)
    assert (code, "clean" in out) == (EXIT_OK, True), out

    assert (await host_record(redis_client, pk, "a.test")).queued == 0
    assert await redis_client.zscore(pk.queued, "a.test") == 0
    stats = await q.stats()
    assert stats.pending == 6 and stats.hosts_due == 2  # b.test and c.test
    assert (stats.counters["repaired_hosts"], stats.counters["lost_pending"]) == (1, 6)
    assert await drain(q) == 6
    assert await q.is_empty() and (await q.stats()).pending == 0


async def test_a_wrong_inflight_count_is_found_and_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await crawl_of(redis_client, crawl_name, partitions=1)
    pk = q.partitions[0]
    leased = await q.lease("w", 10, 60_000)
    on_b = sum(1 for x in leased if x.host == "b.test")
    assert on_b == 2  # its concurrency: b.test is full, out of `due`
    assert await redis_client.zscore(pk.due, "b.test") is None
    await put_record(redis_client, pk, "b.test", inflight=0)  # a count lost: b.test looks free

    code, out = await fsck(redis_url, crawl_name, "--json")
    assert code == EXIT_INCONSISTENT
    doc = json.loads(out)
    assert [(x["kind"], x["host"], x["message"]) for x in doc["problems"]] == [
        ("inflight", "b.test", "partition 0 host b.test: its record counts 0 in flight, it "
                               "holds 2 leases whose response is not in")]
    assert doc["problems"][0]["repairable"] and not doc["clean"]

    code, out = await fsck(redis_url, crawl_name, "--repair", "--json")
    doc = json.loads(out)
    assert (code, doc["clean"], doc["remaining"]) == (EXIT_OK, True, [])
    assert doc["repaired"][0]["leases_fixed"] == 1
    assert (await host_record(redis_client, pk, "b.test")).inflight == 2
    assert await redis_client.zscore(pk.due, "b.test") is None
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK


async def test_a_host_missing_from_due_is_found_and_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name)
    await q.enqueue(tasks("http://solo.test/1"))
    pk = q.partitions[0]
    await redis_client.zrem(pk.due, "solo.test")
    assert await q.lease("w", 5, 60_000) == []  # nothing is served: the crawl would hang

    code, out = await fsck(redis_url, crawl_name)
    assert code == EXIT_INCONSISTENT
    assert out.splitlines()[0] == ("partition 0 host solo.test: not in due, but it has 1 "
                                   "pending and a free slot (0 of unlimited in flight)")
    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert "due: 1 added, 0 removed" in out
    [lease] = await q.lease("w", 5, 60_000)
    assert lease.task.url == "http://solo.test/1"


async def test_a_host_due_at_the_wrong_turn_is_found_and_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A host's turn is its last request + its delay (its own, or robots.txt's when
    longer): a crawl of hosts with delays is clean; a `due` score moved behind its back
    (an hour late: the host would starve) is found and set back."""
    q = await crawl_of(redis_client, crawl_name, partitions=1)
    pk = q.partitions[0]
    front = Frontier(q)
    await front.set_host("a.test", delay_s=30)
    await front.set_robots_delay("b.test", 20)
    leased = await q.lease("w", 10, 60_000)
    a = await host_record(redis_client, pk, "a.test")
    assert await redis_client.zscore(pk.due, "a.test") == a.last + 30_000
    b = await host_record(redis_client, pk, "b.test")
    assert await redis_client.zscore(pk.due, "b.test") == b.last + 20_000
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK

    await redis_client.zadd(pk.due, {"b.test": b.last + 3_600_000})
    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert out.splitlines()[0] == (
        f"partition 0 host b.test: in due at {b.last + 3_600_000}, its turn is "
        f"{b.last + 20_000} (its last request + its delay, or its block's end; ms of Redis "
        "TIME)")
    assert await redis_client.zscore(pk.due, "b.test") == b.last + 20_000
    await q.ack("w", [(x, "ok") for x in leased])
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK


async def test_a_broken_host_record_a_wrong_index_and_reserved_pages_are_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """a.test's record cut short (unreadable: every script would stop at it), b.test's
    h:queued entry wrong, c.test's reserved pages lost: found, repaired from what is
    there (a.test's budget from h:budget), and the crawl finishes."""
    q = await crawl_of(redis_client, crawl_name, partitions=1)
    pk = q.partitions[0]
    front = Frontier(q)
    await front.set_host("a.test", budget=100)
    await front.set_host("c.test", budget=5)
    leased = await q.lease("w", 10, 60_000)
    on = {h: sum(1 for x in leased if x.host == h) for h in ("a.test", "c.test")}
    assert on == {"a.test": 2, "c.test": 2}  # the crawl's concurrency
    a = await host_record(redis_client, pk, "a.test")
    assert (a.queued, a.inflight, a.reserved) == (4, 2, 2)
    await redis_client.hset(pk.hosts, "a.test", a.encode()[:100])
    await redis_client.zadd(pk.queued, {"b.test": 99})
    await put_record(redis_client, pk, "c.test", reserved=0)

    code, out = await fsck(redis_url, crawl_name, "--json")
    doc = json.loads(out)
    assert code == EXIT_INCONSISTENT
    assert [(x["kind"], x["host"], x["message"]) for x in doc["problems"]] == [
        ("host_record", "a.test", "partition 0 host a.test: its record is 100 bytes, not "
                                  "144 (unreadable: every script that meets it stops)"),
        ("queued_index", "b.test", "partition 0 host b.test: h:queued says 99, its record "
                                   "counts 1 queued"),
        ("reserved", "c.test", "partition 0 host c.test: its record counts 0 pages "
                               "reserved, 2 of its leases hold a page of its budget")]

    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert "partition 0: repaired the records of 1 host rebuilt (unreadable); inflight and " \
        "reserved of 2 hosts recounted from the lease records; h:queued of 1 host set to " \
        "their records'" in out
    a = await host_record(redis_client, pk, "a.test")
    assert (a.queued, a.inflight, a.reserved, a.budget) == (4, 2, 2, 100)
    assert (await host_record(redis_client, pk, "c.test")).reserved == 2
    assert await redis_client.zscore(pk.queued, "b.test") == 1
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK
    await q.ack("w", [(x, "ok") for x in leased])
    assert await drain(q) == 12 - len(leased)
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK


async def test_leases_and_bodies_missing_their_other_half_are_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A lease record with no deadline gets a passed one (the reaper's reclaim takes it
    back), a deadline with no record goes, a stale body of a pending task goes, and a
    task left with only its body goes back to its host's queue."""
    q = await crawl_of(redis_client, crawl_name, partitions=1)
    pk = q.partitions[0]
    x, y, *rest = await q.lease("w", 10, 60_000)
    [(code, _)] = await q.fail("w", [Failure(y, "http_5xx", "503", retry_after=600)])
    assert code == Code.RETRY
    queued = (await redis_client.lrange(pk.host_queue("b.test"), 0, 0))[0]
    pending = expand_entry(queued, "b.test")  # a body holds the full entry
    stray = "e" * 32
    await redis_client.zrem(pk.leases, x.id)
    await redis_client.zadd(pk.leases, {stray: 1})
    await redis_client.zrem(pk.delayed, y.id)  # its body left in tasks, in no state
    await redis_client.hset(pk.tasks, pending[:32], b"b.test 0 " + pending)

    code, out = await fsck(redis_url, crawl_name, "--json")
    doc = json.loads(out)
    assert code == EXIT_INCONSISTENT
    found = {(p["kind"], p["id"]): p["message"] for p in doc["problems"]}
    assert set(found) == {("lease_no_deadline", x.id), ("deadline_no_lease", stray),
                          ("orphan_body", y.id), ("orphan_body", pending[:32].decode()),
                          ("counters", None)}, found
    assert found["orphan_body", pending[:32].decode()].endswith(
        "a body in tasks but not waiting or dead (a stale copy: it is pending)")
    assert [p["repairable"] for p in doc["problems"] if p["kind"] == "counters"] == [False]

    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert "1 lease record given a passed deadline (reclaim takes them back); 1 deadline " \
        "with no lease record removed; 1 stale body dropped from tasks; 1 task in no state " \
        "queued again" in out
    assert await redis_client.zscore(pk.leases, stray) is None
    assert await q.state_of(y.id) == "pending"
    assert (await host_record(redis_client, pk, y.host)).queued == \
        await redis_client.llen(pk.host_queue(y.host)) + \
        await redis_client.zcard(pk.host_prio(y.host))
    assert await q.reclaim() == (1, 0)
    assert await q.state_of(x.id) == "pending"
    await q.ack("w", [(r, "ok") for r in rest])
    assert await drain(q) == 12 - len(rest)
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK


async def test_what_fsck_cannot_repair_it_reports_and_exits_non_zero(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await crawl_of(redis_client, crawl_name, partitions=1)
    pk = q.partitions[0]
    x, y = await q.lease("w", 2, 60_000)
    await redis_client.zadd(pk.dead, {x.id: 1})  # leased and dead at once
    await redis_client.hset(pk.leased, y.id, b"garbage")
    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_INCONSISTENT
    assert f"partition 0 task {x.id}: in 2 places (leased, dead)  [not repairable]" in out
    assert f"partition 0 task {x.id}: dead with no body in tasks (requeue can't put it " \
        "back)  [not repairable]" in out
    assert f"partition 0 task {y.id}: its lease record can't be read (no host: reclaim " \
        "can't take it back)  [not repairable]" in out
    assert "still wrong: " in out


# -- the lease repairs a lost host queue itself ---------------------------------------------


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_consumer_finishes_a_crawl_whose_host_queue_was_lost(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str, tmp_path: Path) -> None:
    """Before: h:queued and pending still counted the lost entries, the host stayed due,
    every lease popped nothing, and an --exit-when-empty consumer leased ~300 times a
    second forever."""
    async with serve({"/p/{i}": page}) as site:
        q = await LeasingQueue.open(redis_client, crawl_name)
        await q.enqueue(tasks(*(site.url(f"/p/{i}") for i in range(5))))
        await q.enqueue(tasks(*(f"http://lost.test/{i}" for i in range(4))))
        await q.enqueue(tasks("http://lost.test/p", priority=3))
        pk = q.partitions[0]
        await redis_client.delete(pk.host_queue("lost.test"), pk.host_prio("lost.test"))
        before = await evalsha_calls(redis_client)
        assert await consume(redis_url, crawl_name, tmp_path, limit_s=20) == 0
        calls = await evalsha_calls(redis_client) - before
    stats = await q.stats()
    assert (stats.pending, stats.leased, stats.done) == (0, 0, 5)
    assert stats.counters["repaired_hosts"] == 1 and stats.counters["lost_pending"] == 5
    assert await redis_client.zscore(pk.queued, "lost.test") == 0
    assert await redis_client.zscore(pk.due, "lost.test") is None
    assert calls < 50, calls  # every script: leases, acks, heartbeats, history
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK


# -- the revisit schedule ---------------------------------------------------------------------


async def test_the_revisit_schedule_is_checked_and_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=1))
    await set_policy(redis_client, crawl_name, {"revisit": "fixed", "recrawl_after": 600,
                                                "per_host_delay": 0.0,
                                                "per_host_concurrency": 0}, by="t", create=True)
    q.configure(revisits=True)
    urls = [f"http://a.test/{i}" for i in range(5)]
    await q.enqueue(tasks(*urls))
    leases = await q.lease("w", 5, 60_000)
    await q.ack("w", [(lease, "ok") for lease in leases])
    pk = q.partitions[0]
    ids = {lease.task.url: lease.id for lease in leases}
    now = (await redis_client.time())[0] * 1000
    # A revisit brought back and leased keeps its history, out of rv:due: not a problem.
    await redis_client.zadd(pk.rv_due, {ids[urls[0]]: now - 5})
    assert (await q.promote())[0] == 1
    [again] = await q.lease("w", 1, 60_000)
    code, out = await fsck(redis_url, crawl_name)
    assert code == EXIT_OK, out
    assert out.endswith("1 leased, 0 waiting, 0 dead, 4 scheduled)\n")

    # Broken behind its back: one scheduled with no history, one scheduled while leased,
    # one history with no schedule.
    stray = "e" * 32
    await redis_client.zadd(pk.rv_due, {stray: now, again.id: now + 10**6})
    await redis_client.hdel(q.on.history_key(pk, ids[urls[1]]), history_field(ids[urls[1]]))
    await redis_client.zrem(pk.rv_due, ids[urls[2]])
    code, out = await fsck(redis_url, crawl_name, "--json")
    doc = json.loads(out)
    found = {(p["kind"], p["id"]) for p in doc["problems"]}
    assert found == {("due_no_history", stray), ("due_no_history", ids[urls[1]]),
                     ("scheduled_and_active", again.id),
                     ("history_unscheduled", ids[urls[2]])}, doc["problems"]
    assert code == EXIT_INCONSISTENT and all(p["repairable"] for p in doc["problems"])

    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert "rv:due: 1 scheduled, 3 removed" in out
    record = await record_of(q, ids[urls[2]])
    assert record is not None
    fetched_s = record.fetched_s
    assert await redis_client.zscore(pk.rv_due, ids[urls[2]]) == (fetched_s + 600) * 1000
    assert await redis_client.zscore(pk.rv_due, again.id) is None
    assert await redis_client.zcard(pk.rv_due) == 3  # urls 2, 3, 4
    # The revisit's ack schedules it again; everything adds up.
    await q.ack("w", [(again, "not_modified")])
    code, out = await fsck(redis_url, crawl_name)
    assert code == EXIT_OK, out


async def test_a_recrawl_windows_history_is_no_unscheduled_one(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """revisit off, recrawl_after set: each done URL's record (interval 0) is kept for
    its recrawl's validators, never scheduled, and neither a problem nor repaired."""
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=1))
    await set_policy(redis_client, crawl_name, {"recrawl_after": 600, "per_host_delay": 0.0,
                                                "per_host_concurrency": 0}, by="t", create=True)
    q.configure(revisits=True)  # what a consumer does for this policy (keeps_history)
    await q.enqueue(tasks("http://a.test/0"))
    [lease] = await q.lease("w", 1, 60_000)
    await q.ack("w", [(lease, "ok")])
    pk = q.partitions[0]
    assert await history_count(q) == 1
    code, out = await fsck(redis_url, crawl_name, "--repair")
    assert code == EXIT_OK, out
    assert await redis_client.zcard(pk.rv_due) == 0


async def test_a_politeness_groups_wrong_slot_count_is_found_and_repaired(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str) -> None:
    """A group counted full (a count lost the other way: its hosts parked for good) is
    found, its slots recounted from the lease records, and its parked hosts served again;
    its hosts' places in due (parked) are no problem."""
    q = await LeasingQueue.open(redis_client, crawl_name)
    await set_policy(redis_client, crawl_name, {
        "per_host_delay": 0, "per_host_concurrency": 0, "politeness_key": "domain",
        "group_delay": 0, "group_concurrency": 2}, by="test", create=True)
    await q.enqueue(tasks(*(f"http://n{i}.site.test/" for i in range(5))))
    assert len(await q.lease("w", 1, 60_000)) == 1
    assert (await fsck(redis_url, crawl_name))[0] == EXIT_OK
    pk = q.partitions[0]
    record = GroupRecord.decode(await redis_client.hget(pk.groups, "site.test"))
    await redis_client.hset(pk.groups, "site.test", replace(record, inflight=2).encode())
    assert await q.lease("w", 5, 60_000) == []  # the group looks full

    code, out = await fsck(redis_url, crawl_name, "--json")
    doc = json.loads(out)
    assert code == EXIT_INCONSISTENT
    assert [(x["kind"], x["host"], x["message"]) for x in doc["problems"]] == [
        ("group_inflight", "site.test", "partition 0 group site.test: its record counts 2 "
                                        "in flight, 1 leases hold a slot of it")]
    code, out = await fsck(redis_url, crawl_name, "--repair", "--json")
    doc = json.loads(out)
    assert (code, doc["clean"], doc["repaired"][0]["groups_fixed"]) == (EXIT_OK, True, 1)
    assert len(await q.lease("w", 5, 60_000)) == 1  # one more slot, one more lease
