"""The failover drill (issue 33): a crawl that outlives its Redis.

A Sentinel group of real processes on loopback (``support.sentinel``: a primary, two
replicas, three sentinels) first shows its own steps work: a killed primary is replaced
and the sentinels agree, a primary paused past a failover refuses writes when continued
(``min-replicas-to-write``) and is turned into a replica, a killed primary restarted as a
replica syncs. Then the drill itself (``support.drill``) crawls a few thousand URLs with
three ``python -m consumer`` processes pointed at the group's Sentinel URL while the
primary is killed, the new primary paused past a failover and continued (split brain),
and the killed one restarted as a replica; see `test_a_crawl_outlives_failovers` for
what it holds the crawl to.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support.drill import DrillRun, run_drill
from support.sentinel import SentinelGroup, sentinel_binaries

pytestmark = [
    pytest.mark.timeout(300),  # the drill's own deadline (180 s) says where it stood
    pytest.mark.skipif(sentinel_binaries() is None,
                       reason="redis-sentinel not installed (apt-get install redis-sentinel)"),
]


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as started:
        yield started


def test_the_group_fails_over_splits_and_heals(group: SentinelGroup) -> None:
    first = group.primary()
    assert first.name == "n0" and {n.name for n in group.replicas_of(first)} == {"n1", "n2"}
    with redis.Redis(port=first.port) as c:
        c.set("before", "1")
        assert c.wait(2, 5000) == 2

    # (a) kill -9: a replica takes over, every sentinel names it, the other replica follows.
    assert group.kill_primary() is first
    second = group.wait_failover(first)
    assert second.name in ("n1", "n2")
    group.wait_settled(second)
    assert group.sentinel_masters() == [second.address] * 3
    with redis.Redis(port=second.port) as c:
        assert c.get("before") == b"1"
    switches = group.sentinel_events("+switch-master")
    assert {e.sentinel for e in switches} == {0, 1, 2}

    # (c) the killed primary comes back as a replica of the new one and copies its data.
    group.restart_as_replica(first)
    group.wait_settled(second)
    with redis.Redis(port=second.port) as c:
        c.set("after", "2")
        assert c.wait(2, 5000) == 2
    with redis.Redis(port=first.port) as c:
        assert c.get("after") == b"2" and c.info("replication")["role"] == "slave"

    # (b) paused past a failover, then continued: the old primary still believes it is
    # one, but with its replicas gone it refuses writes; the sentinels then demote it.
    group.pause(second)
    third = group.wait_failover(second)
    group.resume(second)
    with redis.Redis(port=second.port) as c, \
            pytest.raises(redis.ResponseError, match=r"NOREPLICAS|READONLY"):
        c.set("split", "brain")
    group.wait_settled(third)
    with redis.Redis(port=second.port) as c:
        assert c.info("replication")["role"] == "slave" and c.get("split") is None
    with redis.Redis(port=third.port) as c:
        assert c.get("before") == b"1" and c.get("after") == b"2"


async def test_a_crawl_outlives_failovers(group: SentinelGroup, tmp_path: Path) -> None:
    run = await run_drill(group, tmp_path, say=lambda stage: print(
        f"{time.strftime('%H:%M:%S')} {stage}", flush=True))  # shown when the test fails
    report = describe(run)
    assert [s.name for s in run.steps] == ["kill", "split"], report
    assert all(s.leasing is not None for s in run.steps), report
    # No consumer exited, and each stopped cleanly when told to.
    assert run.alive_at_end == [True] * 3, report
    assert run.exit_codes == [0] * 3, report
    # Every producer run ended well, the re-run included.
    assert [p["exit_code"] for p in run.producers] == [0, 0, 0], report
    # Every URL done (a 200) or dead with its true reason (a 500, twice).
    assert run.active == 0 and run.wrong_states() == {}, report
    assert run.dead_reasons == {"http_5xx": run.plan.failing}, report
    assert run.lost() == [], report
    assert run.fsck[0] == 0, run.fsck[1]
    # No token was granted to two leases, before, across or after the failovers.
    assert run.token_clashes() == {}, report
    # Every page fetched twice is one whose first fetch's write a failover lost.
    assert run.unexplained() == {}, report


def describe(run: DrillRun) -> str:
    """The drill's figures, for a failure message."""
    steps = "; ".join(
        f"{s.name} {s.old}->{s.new} in flight {s.in_flight}, odown +{_after(s.detected, s.at)}"
        f" switch +{_after(s.promoted, s.at)} leasing +{_after(s.leasing, s.at)}"
        for s in run.steps)
    logs = "\n".join(f"--- {name}\n{text[-1500:]}" for name, text in run.logs.items())
    return (f"timeline: {run.timeline_text()}\nsteps: {steps}\nproducers: {run.producers}\n"
            f"re-run enqueued {run.rerun_enqueued}; fetched twice {run.fetched_twice}; unexplained "
            f"{len(run.unexplained())}; token clashes {len(run.token_clashes())}; states "
            f"{Counter(run.states.values())}; dead {run.dead_reasons}; alive "
            f"{run.alive_at_end}; exits {run.exit_codes}\n{logs}")


def _after(t: float | None, since: float) -> str:
    return "-" if t is None else f"{t - since:.2f}s"
