"""Politeness groups (issue 35): with the crawl's politeness_key at domain, the hosts of one
registrable domain share their group's delay and concurrency, fleet-wide, beside their
own; at ip, the hosts whose names resolve to one address do; with host, nothing changes.
Real redis-server; real local sites (one server behind many host names, reached through
its proxy mode) and real consumer processes.

Names under ip are resolved for real, by the system resolver, and no test may send a
query off the machine: the names every machine resolves by itself are ``localhost``
(its hosts file) and address literals. A host key carries its port, so ``localhost:P``
and ``127.0.0.1:P`` over many ports P are many hosts of one server: apart by host, apart
by domain too (neither has a registrable domain), one group by ip."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from sites import ROOT, start_site_process
from support.frontier import lease_when_due, tasks

from common.hostmodel.group_record import GroupRecord
from common.hostmodel.hostgroup import NO_GROUP, host_group
from common.policy import PolicyError, create_policy, set_policy
from common.queue import CrawlSettings, DedupMode, Failure, LeasingQueue
from common.queue.calls import run
from common.queue.enqueue import _call
from console.cli import main_async

#: The hosts of one site (site.test: "test" is no public suffix, so its registrable
#: domain is site.test) and one host of another.
SITE = [f"http://n{i}.site.test/p/{i}" for i in range(6)]
OTHER = "http://other.test/p/1"


def test_a_hosts_group_is_its_registrable_domain() -> None:
    assert host_group("a.b.example.com") == "example.com"
    assert host_group("shop.example.co.uk:8080") == "example.co.uk"
    assert host_group("alice.blogspot.com") == "alice.blogspot.com"  # a private suffix
    assert host_group("n3.site.test:1234") == "site.test"
    for ungrouped in ("127.0.0.1:8080", "[::1]:80", "localhost", "com"):
        assert host_group(ungrouped) == NO_GROUP


async def grouped_queue(client: aioredis.Redis, crawl: str, **policy: Any) -> LeasingQueue:
    q = await LeasingQueue.open(client, crawl)
    await create_policy(client, crawl, {"per_host_delay": 0, "per_host_concurrency": 0,
                                        "politeness_key": "domain", "group_delay": 0,
                                        "group_concurrency": 1, **policy}, by="test")
    return q


async def group(client: aioredis.Redis, q: LeasingQueue, name: str) -> GroupRecord:
    return GroupRecord.decode(await client.hget(q.partitions[0].groups, name))


async def test_a_groups_concurrency_holds_across_its_hosts_and_comes_back_at_each_end(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Group concurrency 1, hosts without limits: one lease of site.test at a time, while
    other.test (another group) is served; each way a lease ends (ack, fail, release,
    reclaim, its response in) gives the group's slot back, once."""
    q = await grouped_queue(redis_client, crawl_name)
    await q.enqueue(tasks([*SITE, OTHER]))
    first = await q.lease("w", 10, 60_000)
    assert len(first) == 2 and "other.test" in {x.host for x in first}
    [one] = [x for x in first if x.host.endswith(".site.test")]
    assert (await group(redis_client, q, "site.test")).inflight == 1
    assert await q.lease("w", 10, 60_000) == []  # the group's one slot is taken
    # Its other hosts wait out of `due`, parked on the group: no lease call spins on them.
    pk = q.partitions[0]
    assert await redis_client.zrange(pk.due, 0, -1) == []
    assert await redis_client.zcard(pk.parked) == 5

    assert await q.ack("w", [(one, "ok")])
    [two] = await q.lease("w", 10, 60_000)  # the ack gave the slot back
    await q.fail("w", [Failure(two, "http_500", "boom")])
    [three] = await q.lease("w", 10, 60_000)
    await q.release("w", [three])
    [four] = await q.lease("w", 10, 60_000)
    assert (await q.lease_turns("w", 10, 60_000, responses_in=[four])).leases != []
    assert (await group(redis_client, q, "site.test")).inflight == 1
    assert await q.ack("w", [(four, "ok")])  # its slot came back with its response
    assert (await group(redis_client, q, "site.test")).inflight == 1


async def test_a_lease_reclaimed_gives_its_groups_slot_back(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name)
    await q.enqueue(tasks(SITE[:3]))
    [_lease] = await q.lease("w", 10, 50)
    await asyncio.sleep(0.1)
    assert await q.reclaim() == (1, 0)
    assert (await group(redis_client, q, "site.test")).inflight == 0
    assert len(await q.lease("w", 10, 60_000)) == 1


async def test_a_groups_delay_spaces_its_hosts_turns_and_says_when_the_next_is(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name, group_delay=0.4, group_concurrency=0)
    await q.enqueue(tasks(SITE))
    first = await q.lease_turns("w", 10, 60_000)
    assert len(first.leases) == 1 and first.leases[0].delay_ms == 400
    second = await q.lease_turns("w", 10, 60_000)
    assert second.leases == [] and second.wait_s is not None and 0.2 < second.wait_s <= 0.4
    [later] = await lease_when_due(q, "w", 10, 60_000)
    assert later.host != first.leases[0].host
    assert later.granted_ms - first.leases[0].granted_ms >= 400


async def test_with_the_host_key_a_group_limits_nothing(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name, politeness_key="host")
    await q.enqueue(tasks(SITE))
    assert len(await q.lease("w", 10, 60_000)) == len(SITE)
    assert await redis_client.exists(q.partitions[0].group_of,
                                      q.partitions[0].groups) == 0


async def test_switching_to_domain_groups_the_hosts_already_queued(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name, politeness_key="host")
    await q.enqueue(tasks(SITE))
    await set_policy(redis_client, crawl_name, {"politeness_key": "domain"}, by="test")
    assert len(await q.lease("w", 10, 60_000)) == 1


async def test_push_back_from_one_host_blocks_its_group(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name)
    await q.enqueue(tasks([*SITE, OTHER]))
    leases = await q.lease("w", 10, 60_000)
    [pushed] = [x for x in leases if x.host.endswith(".site.test")]
    await q.fail("w", [Failure(pushed, "http_429", "slow down", retry_after=30.0,
                               pushback=True)])
    assert (await group(redis_client, q, "site.test")).blocked > 0
    assert await q.lease("w", 10, 60_000) == []  # site.test's other hosts wait too


@pytest.mark.parametrize("key", ["domain", "ip"])
async def test_politeness_groups_need_one_partition(
        redis_client: aioredis.Redis, crawl_name: str, key: str) -> None:
    await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(partitions=2))
    with pytest.raises(PolicyError, match=r"politeness_key: .* 2 partitions"):
        await create_policy(redis_client, crawl_name, {"politeness_key": key}, by="t")


async def test_operators_list_groups_and_set_ones_limits(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`crawlq hosts --groups` shows each group's slots, limits and parked hosts;
    `crawlq hosts group-set` gives one its own concurrency, which the next lease keeps
    (a raised one brings its parked hosts back at once), and --clear takes it back."""
    q = await grouped_queue(redis_client, crawl_name)
    await q.enqueue(tasks(SITE))
    assert len(await q.lease("w", 10, 60_000)) == 1
    cli = ["--redis-url", redis_url, "--cluster", "no", "--crawl", crawl_name]
    capsys.readouterr()
    assert await main_async(["hosts", "--groups", *cli]) == 0
    out = capsys.readouterr().out
    assert out.startswith("politeness_key domain\n")
    assert out.splitlines()[2].split()[:5] == ["site.test", "1", "0.0s", "1", "5"]
    assert await main_async(["hosts", "group-set", "site.test", "--concurrency", "3",
                             *cli]) == 0
    assert "group site.test: delay 0s, concurrency 3" in capsys.readouterr().out
    assert len(await q.lease("w", 10, 60_000)) == 2
    assert await main_async(["hosts", "--groups", "--json", *cli]) == 0
    [row] = json.loads(capsys.readouterr().out)["groups"]
    assert (row["group"], row["in_flight"], row["concurrency"], row["own_concurrency"],
            row["parked"]) == ("site.test", 3, 3, True, 3)
    assert await main_async(["hosts", "group-set", "site.test", "--clear", "concurrency",
                             *cli]) == 0
    assert "concurrency 1" in capsys.readouterr().out
    assert await main_async(["hosts", "group-set", "site.test", *cli]) == 2
    assert "nothing to change" in capsys.readouterr().err


# -- the fleet: three consumer processes, one server behind 50 names -------------------

#: The site's answer time: long enough that without the group's concurrency more of its
#: requests would be in flight at once than the group allows.
ANSWER_MS = 400
NAMES = 50


def site_test_name(i: int, port: int) -> str:
    """The i-th name of site.test (one registrable domain)."""
    return f"n{i}.site.test:{port}"


def loopback_host(i: int, port: int) -> str:
    """The i-th of 50 hosts whose names resolve to 127.0.0.1 without a DNS query:
    localhost and the address literal, each on 25 ports (the site's proxy answers all)."""
    return f"{'localhost' if i % 2 else '127.0.0.1'}:{port + 1 + i}"


async def crawl_fifty_names(redis_url: str, client: aioredis.Redis, crawl: str,
                            tmp_path: Path, host: Callable[[int, int], str] = site_test_name,
                            **policy: Any) -> tuple[int, list[float]]:
    """One page on each of 50 hosts (`host`: the i-th, given the site's port), all served
    by one local site through its proxy mode, crawled by three consumer processes under
    `policy`: the most requests the server answered at once, and the gaps between their
    starts (s)."""
    async with start_site_process(delay_ms=ANSWER_MS) as site:
        urls = [f"http://{host(i, site.port)}/p/{i}" for i in range(NAMES)]
        q = await LeasingQueue.open(client, crawl)
        await create_policy(client, crawl, {"per_host_delay": 0, "per_host_concurrency": 1,
                                            **policy}, by="test")
        await q.enqueue(tasks(urls))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH"))
                                            if p)
        procs = []
        try:
            for i in range(3):
                with (tmp_path / f"c{i}.log").open("wb") as log:
                    procs.append(await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "consumer", "--redis-url", redis_url,
                        "--crawl", crawl, "--worker-id", f"g{i}", "--allow-private",
                        "--ignore-robots", "--proxy", f"http://127.0.0.1:{site.port}",
                        "--concurrency", "8", "--output", str(tmp_path / f"out{i}"),
                        "--http-port", "-1", "--exit-when-empty", "--empty-grace", "0",
                        cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.DEVNULL, stderr=log))
            codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 120)
        finally:
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    await p.wait()
        assert codes == [0, 0, 0], [(tmp_path / f"c{i}.log").read_text()[-2000:]
                                    for i in range(3)]
        stats = await site.stats()
        assert stats.total() == NAMES  # every page once
        starts = sorted(t for path, ts in stats.times.items() if path.startswith("/p/")
                        for t in ts)
        return stats.peak, [b - a for a, b in itertools.pairwise(starts)]


def kept_group_limits(peak: int, gaps: list[float], delay: float, *, concurrency: int
                      ) -> None:
    """The server saw at most `concurrency` requests at once, none starting closer than
    60 ms under `delay` after another, and 95% within 50 ms of it."""
    assert peak <= concurrency, peak
    assert min(gaps) >= delay - 0.06, sorted(gaps)[:5]
    assert sum(g >= delay - 0.05 for g in gaps) >= 0.95 * len(gaps), sorted(gaps)[:5]


async def test_three_consumers_keep_a_groups_concurrency_and_delay_across_50_names(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """politeness_key=domain, group concurrency 2 and delay 0.2 s: the server never
    answers more than 2 requests at once, and its requests start the delay apart: none
    closer than 60 ms under it (a request more than 25 ms late takes a turn of its own:
    late_turn.lua), and 95% within 50 ms of it."""
    delay = 0.2
    peak, gaps = await crawl_fifty_names(redis_url, redis_client, crawl_name, tmp_path,
                                         politeness_key="domain", group_delay=delay,
                                         group_concurrency=2)
    kept_group_limits(peak, gaps, delay, concurrency=2)


async def test_with_the_host_key_50_names_are_50_hosts(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """Today's behaviour: each name is its own host, the group settings keep nothing, so
    the server sees many more requests at once than a group would allow."""
    peak, _ = await crawl_fifty_names(redis_url, redis_client, crawl_name, tmp_path,
                                      politeness_key="host", group_delay=0.2,
                                      group_concurrency=2)
    assert peak > 4, peak


async def test_three_consumers_keep_an_ip_groups_concurrency_and_delay_across_50_hosts(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """politeness_key=ip, group concurrency 2 and delay 0.2 s, 50 hosts of one address
    (`loopback_host`) each allowed one request in flight, enqueued by a process that
    learns the key at its first batch: the server never answers more than 2 at once,
    and its requests start the delay apart (as the domain test above judges it). The
    groups are named before the first lease, so the first requests keep them too."""
    delay = 0.2
    peak, gaps = await crawl_fifty_names(redis_url, redis_client, crawl_name, tmp_path,
                                         loopback_host, politeness_key="ip",
                                         group_delay=delay, group_concurrency=2)
    kept_group_limits(peak, gaps, delay, concurrency=2)


async def test_by_domain_the_50_hosts_of_one_address_are_not_grouped(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        tmp_path: Path) -> None:
    """The same 50 hosts under domain: localhost and an address have no registrable
    domain, so no group holds them and the server sees many requests at once."""
    peak, _ = await crawl_fifty_names(redis_url, redis_client, crawl_name, tmp_path,
                                      loopback_host, politeness_key="domain",
                                      group_delay=0.2, group_concurrency=2)
    assert peak > 4, peak


# -- politeness_key=ip: the queue --------------------------------------------------------

#: A name no resolver can answer, refused before any query leaves the process: a label
#: longer than DNS allows (63 characters).
UNRESOLVABLE = "x" * 64 + ".test"


async def test_by_ip_a_hosts_group_is_its_names_address_named_before_its_first_lease(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """The queue is opened before the policy says ip: its first batch, named by domain,
    is refused by the script and named again by ip. localhost and 127.0.0.1 share a group
    over any port, 127.0.0.2 and ::1 are others; the first lease call keeps them."""
    q = await LeasingQueue.open(redis_client, crawl_name)
    await grouped_queue(redis_client, crawl_name, politeness_key="ip")
    hosts = ["localhost:1001", "localhost:1002", "127.0.0.1:1003", "127.0.0.2:1004",
             "[::1]:1005"]
    result = await q.enqueue(tasks([f"http://{h}/p" for h in hosts]))
    assert result.enqueued == 5
    pk = q.partitions[0]
    assert {k.decode(): v.decode() for k, v in
            (await redis_client.hgetall(pk.group_of)).items()} == {
        "localhost:1001": "127.0.0.1", "localhost:1002": "127.0.0.1",
        "127.0.0.1:1003": "127.0.0.1", "127.0.0.2:1004": "127.0.0.2",
        "[::1]:1005": "::1"}
    leased = await q.lease("w", 10, 60_000)
    assert len(leased) == 3 and {x.host for x in leased} >= {"127.0.0.2:1004", "[::1]:1005"}
    assert (await group(redis_client, q, "127.0.0.1")).inflight == 1
    assert (await redis_client.hget(pk.stats, "enqueued")) == b"5"


async def test_by_ip_a_bloom_crawl_names_its_hosts_groups_too(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await LeasingQueue.open(redis_client, crawl_name, CrawlSettings(dedup=DedupMode.BLOOM))
    await grouped_queue(redis_client, crawl_name, politeness_key="ip")
    assert (await q.enqueue(tasks(["http://localhost:1001/a", "http://127.0.0.1:1002/a",
                                   "http://localhost:1001/a"]))).enqueued == 2
    assert await redis_client.hget(q.partitions[0].group_of, "localhost:1001") == b"127.0.0.1"
    assert len(await q.lease("w", 10, 60_000)) == 1


async def test_by_ip_a_name_that_fails_to_resolve_stays_ungrouped_and_is_counted(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name, politeness_key="ip")
    await q.enqueue(tasks([f"http://{UNRESOLVABLE}/a", "http://localhost:1001/a"]))
    await q.enqueue(tasks([f"http://{UNRESOLVABLE}/b"]))  # its failure is remembered
    pk = q.partitions[0]
    assert await redis_client.hget(pk.group_of, UNRESOLVABLE) is None
    assert await redis_client.hget(pk.stats, "group_unresolved") == b"1"
    # It keeps its own limits only (none here): both its URLs and localhost's are leased.
    assert len(await q.lease("w", 10, 60_000)) == 3


async def test_by_ip_a_host_keeps_the_first_group_it_was_named(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    """Another process may resolve a name to another address (a changed or balanced DNS
    answer): the host keeps its group, whose slot its leases in flight hold."""
    q = await grouped_queue(redis_client, crawl_name, politeness_key="ip")
    await q.enqueue(tasks(["http://localhost:1001/a"]))
    [lease] = await q.lease("w", 10, 60_000)
    pk = q.partitions[0]
    other = _call(q.on, pk, {"localhost:1001": tasks(["http://localhost:1001/b"])}, 0,
                  "ip 192.0.2.7")
    assert int((await run(redis_client, [other]))[0][0]) == 1
    assert await redis_client.hget(pk.group_of, "localhost:1001") == b"127.0.0.1"
    assert await q.ack("w", [(lease, "ok")])
    assert (await group(redis_client, q, "127.0.0.1")).inflight == 0


async def test_switching_to_ip_groups_the_hosts_already_queued(
        redis_client: aioredis.Redis, crawl_name: str) -> None:
    q = await grouped_queue(redis_client, crawl_name, politeness_key="domain")
    """Each host's name is looked up; one that fails loses the domain group it had."""
    await q.enqueue(tasks(["http://localhost:1001/a", "http://127.0.0.1:1002/a",
                           f"http://{UNRESOLVABLE}/a"]))
    pk = q.partitions[0]
    assert await redis_client.hget(pk.group_of, UNRESOLVABLE) == UNRESOLVABLE.encode()
    await set_policy(redis_client, crawl_name, {"politeness_key": "ip"}, by="test")
    named = {k.decode(): v.decode() for k, v in
             (await redis_client.hgetall(pk.group_of)).items()}
    assert named == {"localhost:1001": "127.0.0.1", "127.0.0.1:1002": "127.0.0.1"}
    leased = await q.lease("w", 20, 60_000)
    assert sum(x.host in ("localhost:1001", "127.0.0.1:1002") for x in leased) == 1


async def test_by_ip_operators_list_groups_by_address_and_set_one(
        redis_url: str, redis_client: aioredis.Redis, crawl_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An IPv6 group is named without brackets; group-set takes it either way."""
    q = await grouped_queue(redis_client, crawl_name, politeness_key="ip")
    await q.enqueue(tasks(["http://[::1]:1001/a", "http://[::1]:1002/a"]))
    assert len(await q.lease("w", 10, 60_000)) == 1
    cli = ["--redis-url", redis_url, "--cluster", "no", "--crawl", crawl_name]
    capsys.readouterr()
    assert await main_async(["hosts", "--groups", *cli]) == 0
    out = capsys.readouterr().out
    assert out.startswith("politeness_key ip\n")
    assert out.splitlines()[2].split()[:2] == ["::1", "1"]
    assert await main_async(["hosts", "group-set", "[::1]", "--concurrency", "2", *cli]) == 0
    assert "group ::1: delay 0s, concurrency 2" in capsys.readouterr().out
    assert len(await q.lease("w", 10, 60_000)) == 1
