"""What a failover costs a crawl: the same crawl with and without ``kill -9`` of its primary.

    python bench/failover_bench.py [--rounds 3] [--pages 2000]

Each run starts its own Sentinel group on loopback (a primary, two replicas, three
sentinels of Debian's ``redis-sentinel``, ``down-after-milliseconds`` 1000; see
``tests/support/sentinel.py``) and runs the failover drill's crawl on it
(``tests/support/drill.py``: a local site answering in 250 ms, three ``python -m
consumer`` processes through the Sentinel URL, a second producer run under way at the
kill). The baseline run has no failure; the other kills the primary once ``kill_at`` of
the pages are done. Printed side by side, per round and as medians:

- Sentinel's own time: the kill to the first ``+odown`` (detection) and to the first
  ``+switch-master`` (promotion, when the Sentinels name the new primary);
- the fleet's time: the promotion to the first lease on the new primary (target: 5 s),
  and the kill to it;
- pages lost: pages with no result and not done (target: 0), and the enqueues the
  failover lost (what the producer's re-run enqueued again);
- pages fetched twice (target: no more than the leases in flight at the kill);
- the crawl's wall time, from the first producer run to the drained queue.

Needs redis-server and redis-sentinel (``apt-get install redis-sentinel``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.drill import DrillPlan, DrillRun, run_drill  # noqa: E402
from support.sentinel import SentinelGroup, sentinel_binaries  # noqa: E402

FAILOVER_TARGET_S = 5.0


def _after(t: float | None, since: float) -> float | None:
    return None if t is None else t - since


def figures(run: DrillRun) -> dict[str, float | None]:
    """One run's figures (None: does not apply)."""
    step = run.steps[0] if run.steps else None
    out: dict[str, float | None] = {
        "wall_s": run.drained - run.started,
        "lost": float(len(run.lost()) + len(run.wrong_states())),
        "enqueues_lost": float(run.rerun_enqueued),
        "fetched_twice": float(run.fetched_twice),
        "in_flight": None, "detected_s": None, "promoted_s": None, "leasing_s": None,
        "death_to_leasing_s": None,
    }
    if step is not None:
        out |= {"in_flight": float(step.in_flight),
                "detected_s": _after(step.detected, step.at),
                "promoted_s": _after(step.promoted, step.at),
                "leasing_s": _after(step.leasing, step.promoted or step.at),
                "death_to_leasing_s": _after(step.leasing, step.at)}
    return out


ROWS = [
    ("crawl wall time (s)", "wall_s"),
    ("sentinel: kill -> +odown (s)", "detected_s"),
    ("sentinel: kill -> promoted (s)", "promoted_s"),
    ("fleet: promoted -> leasing (s)", "leasing_s"),
    ("kill -> leasing again (s)", "death_to_leasing_s"),
    ("leases in flight at the kill", "in_flight"),
    ("pages fetched twice", "fetched_twice"),
    ("pages lost", "lost"),
    ("enqueues lost (re-run restored)", "enqueues_lost"),
]


def table(base: list[dict[str, float | None]], fail: list[dict[str, float | None]]) -> str:
    def cell(values: list[float | None]) -> str:
        got = [v for v in values if v is not None]
        if not got:
            return "-"
        med = statistics.median(got)
        return f"{med:.2f}" if len(got) == 1 else f"{med:.2f} ({min(got):.2f}-{max(got):.2f})"

    lines = [f"{'':34} {'no failover':>22} {'kill -9 primary':>22}"]
    for label, key in ROWS:
        lines.append(f"{label:34} {cell([f[key] for f in base]):>22} "
                     f"{cell([f[key] for f in fail]):>22}")
    return "\n".join(lines)


async def one(plan: DrillPlan) -> DrillRun:
    with tempfile.TemporaryDirectory(prefix="crawlq-failover-bench-") as d, \
            SentinelGroup() as group:
        return await run_drill(group, Path(d), plan)


def verdict(fail: list[dict[str, float | None]]) -> list[str]:
    """The targets each failover run missed."""
    missed = []
    for i, f in enumerate(fail, 1):
        leasing = f["leasing_s"]
        if leasing is None or leasing > FAILOVER_TARGET_S:
            missed.append(f"round {i}: leasing again {leasing} s after the promotion "
                          f"(target <= {FAILOVER_TARGET_S:g} s)")
        if f["lost"]:
            missed.append(f"round {i}: {f['lost']:.0f} pages lost")
        if (f["fetched_twice"] or 0) > (f["in_flight"] or 0):
            missed.append(f"round {i}: {f['fetched_twice']:.0f} fetched twice > "
                          f"{f['in_flight']:.0f} in flight at the kill")
    return missed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pages", type=int, default=DrillPlan().pages)
    args = p.parse_args(argv)
    if sentinel_binaries() is None:
        raise SystemExit("redis-sentinel not installed (apt-get install redis-sentinel)")
    base: list[dict[str, float | None]] = []
    fail: list[dict[str, float | None]] = []
    for r in range(1, args.rounds + 1):
        for steps, into in (((), base), (("kill",), fail)):
            run = asyncio.run(one(DrillPlan(pages=args.pages, steps=steps)))
            into.append(figures(run))
            print(f"round {r} {'kill -9' if steps else 'baseline'}: "
                  f"{run.timeline_text()}", flush=True)
    print()
    print(table(base, fail))
    missed = verdict(fail)
    print("\n" + ("\n".join(missed) if missed else "every target met"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
