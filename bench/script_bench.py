"""Redis work per page of the frontier's scripts, alone: lease.lua and ack.lua.

    python bench/script_bench.py [--hosts 1000] [--pages 20] [--batch 10] [--rounds 300]
                                 [--delay 0] [--against REV] [--groups]

frontier_bench measures the whole fleet, where the machine's noise (consumers and the
site share the CPUs with Redis) is about 30 us a page. This bench isolates the scripts: a
fresh redis-server, one partition, `--hosts` hosts of `--pages` pages each (per-host
concurrency 2), then `--rounds` times: lease `--batch` tasks (one `lease_turns` call, as
a consumer with that much room makes) and ack them. Redis' own ``INFO commandstats``,
read around each call, gives per page: the script's time (EVALSHA, its commands
included), the time of the commands it ran, and how many it ran. The client's time is not
in it. Those times are wall clock inside Redis, so a loaded machine (another process
taking the core mid-call) adds to them; the CPU time Redis' main thread spent on the
calls (``/proc/<pid>/task/<pid>/schedstat``: time on a CPU, in ns), read around each
call too, does not count the waits: on a shared machine compare that one ("cpu").

`--against REV` runs the same measurement on a git worktree of REV (made under a temp
dir and removed after) right after this tree's, and prints the ratios: how a change to
the Lua moves its cost, side by side in one run. With `--interleave` the two run at
once instead, each tree's client in its own process on one redis-server, a crawl each,
taking turns call by call (a pipe passes the turn): each lease call's CPU time in Redis'
main thread is read around it, so a loaded machine's swings fall on both alike; it
prints the ratio of their median CPU a page, lease and ack (a run of the same tree
against itself shows the noise: about 1%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

# The crawlq imported is the one first on sys.path: _run_in puts the measured tree there.
from common.frontier.hosts import Frontier
from common.policy import set_policy
from common.queue import CrawlSettings, LeasingQueue, NewTask
from common.redis.server import RedisServer
from common.urls.canonical import fingerprint

ROOT = Path(__file__).resolve().parent.parent


def _cpu_ns(pid: int) -> int:
    """Time Redis' main thread has spent on a CPU (ns; 0 where /proc has no schedstat)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


async def _stats(client: Any) -> dict[str, tuple[int, int]]:
    raw = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in raw.items()}


def _add(into: dict[str, list[int]], before: dict[str, tuple[int, int]],
         after: dict[str, tuple[int, int]]) -> None:
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0 and name != "info":
            acc = into.setdefault(name, [0, 0])
            acc[0] += calls - c0
            acc[1] += usec - u0


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Lease and ack per page in this interpreter's crawlq (see the module docstring)."""
    with RedisServer() as server:
        client = aioredis.Redis.from_url(server.url)
        assert server.process is not None
        pid = server.process.pid
        cpu = {"lease": 0, "ack": 0}
        try:
            q = await LeasingQueue.open(client, "bench", CrawlSettings(partitions=1))
            await Frontier(q).set_defaults(delay_s=args.delay, concurrency=2)
            if args.groups:  # every host its own group (h<i>.test), limiting nothing
                await set_policy(client, "bench", {"politeness_key": "domain",
                                                   "group_delay": 0, "group_concurrency": 0},
                                 by="bench")
            urls = [f"http://h{h}.test/p/{i}" for i in range(args.pages)
                    for h in range(args.hosts)]
            for i in range(0, len(urls), 1000):
                await q.enqueue([NewTask(u, fingerprint(u)) for u in urls[i:i + 1000]])
            lease: dict[str, list[int]] = {}
            ack: dict[str, list[int]] = {}
            pages = 0
            for _ in range(args.rounds):
                s0 = await _stats(client)
                c0 = _cpu_ns(pid)
                batch = await q.lease_turns("w", args.batch, 60_000)
                c1 = _cpu_ns(pid)
                s1 = await _stats(client)
                if not batch.leases:
                    await asyncio.sleep(0.01)
                    continue
                pages += len(batch.leases)
                _add(lease, s0, s1)
                cpu["lease"] += c1 - c0
                c2 = _cpu_ns(pid)
                await q.ack("w", [(lease_, "ok") for lease_ in batch.leases])
                cpu["ack"] += _cpu_ns(pid) - c2
                _add(ack, s1, await _stats(client))
        finally:
            await client.aclose()
    out: dict[str, Any] = {"pages": pages}
    for name, cmds in (("lease", lease), ("ack", ack)):
        calls, usec = cmds.pop("evalsha", [0, 0])
        out[name] = {"calls": calls, "us": usec / max(pages, 1),
                     "cpu_us": cpu[name] / 1000 / max(pages, 1),
                     "inner_us": sum(u for _, u in cmds.values()) / max(pages, 1),
                     "commands": sum(c for c, _ in cmds.values()) / max(pages, 1)}
    return out


async def turns(args: argparse.Namespace, url: str, crawl: str, pid: int) -> None:
    """One side of `--interleave`: on the turn (a line on stdin), one lease call and one
    ack on `url`'s redis-server (pid `pid`); prints each one's CPU a page, as JSON."""
    client = aioredis.Redis.from_url(url)
    q = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=1))
    await Frontier(q).set_defaults(delay_s=args.delay, concurrency=2)
    urls = [f"http://h{h}.test/p/{i}" for i in range(args.pages) for h in range(args.hosts)]
    for i in range(0, len(urls), 1000):
        await q.enqueue([NewTask(u, fingerprint(u)) for u in urls[i:i + 1000]])
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
        c0 = _cpu_ns(pid)
        batch = await q.lease_turns("w", args.batch, 60_000)
        c1 = _cpu_ns(pid)
        if batch.leases:
            await q.ack("w", [(lease, "ok") for lease in batch.leases])
        c2 = _cpu_ns(pid)
        n = len(batch.leases)
        print(json.dumps({"pages": n, "lease": (c1 - c0) / max(n, 1),
                          "ack": (c2 - c1) / max(n, 1)}), flush=True)
    await client.aclose()


def interleave(root: Path, other: Path, argv: list[str], rounds: int) -> None:
    """`turns` of this tree and of `other` on one redis-server, alternating."""
    with RedisServer() as server:
        assert server.process is not None
        code = ("import asyncio, sys; sys.path.insert(0, sys.argv[1]); import script_bench "
                "as b; asyncio.run(b.turns(b.parse_args(sys.argv[5:]), sys.argv[2], "
                "sys.argv[3], int(sys.argv[4])))")
        sides = []
        for tree, crawl in ((root, "here"), (other, "there")):
            sides.append(subprocess.Popen(
                [sys.executable, "-c", code, str(tree), server.url, crawl,
                 str(server.process.pid), *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
                env={**os.environ,
                     "PYTHONPATH": f"{tree}{os.pathsep}{Path(__file__).parent}"}))
        for side in sides:
            assert side.stdout is not None and json.loads(side.stdout.readline())["ready"]
        per: list[dict[str, list[float]]] = [{"lease": [], "ack": []}, {"lease": [], "ack": []}]
        for r in range(rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                side = sides[k]
                assert side.stdin is not None and side.stdout is not None
                side.stdin.write("go\n")
                side.stdin.flush()
                got = json.loads(side.stdout.readline())
                if got["pages"]:
                    per[k]["lease"].append(got["lease"])
                    per[k]["ack"].append(got["ack"])
        for side in sides:
            assert side.stdin is not None
            side.stdin.close()
            side.wait(30)
    for name in ("lease", "ack"):
        here, there = (statistics.median(p[name]) / 1000 for p in per)
        print(f"{name:5s} this tree {here:6.1f} us/page, {other.name[:10]} {there:6.1f} "
              f"us/page of Redis CPU (medians of {len(per[0][name])} calls): "
              f"{here / max(there, 1e-9):.3f} x")


def _run_in(root: Path, argv: list[str]) -> dict[str, Any]:
    """`measure` in a child interpreter whose crawlq is the one at `root`."""
    code = ("import asyncio, json, sys; sys.path.insert(0, sys.argv[1]); "
            "import script_bench as b; "
            "print(json.dumps(asyncio.run(b.measure(b.parse_args(sys.argv[2:])))))")
    done = subprocess.run([sys.executable, "-c", code, str(root), *argv], check=True,
                          capture_output=True, text=True, cwd=root,
                          env={**os.environ,
                               "PYTHONPATH": f"{root}{os.pathsep}{Path(__file__).parent}"})
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _show(label: str, result: dict[str, Any]) -> None:
    for name in ("lease", "ack"):
        r = result[name]
        print(f"{label:10s} {name:5s} {r['us']:6.1f} us/page, cpu {r['cpu_us']:6.1f} us/page  "
              f"(its commands {r['inner_us']:5.1f} us, {r['commands']:4.2f} commands a page; "
              f"{r['calls']} calls for {result['pages']} pages)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--batch", type=int, default=10, help="tasks a lease call asks for")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--delay", type=float, default=0.0, help="the crawl's per-host delay, s")
    p.add_argument("--against", default=None, help="a git revision to measure beside")
    p.add_argument("--interleave", action="store_true",
                   help="with --against: both at once, call by call (see the docstring)")
    p.add_argument("--groups", action="store_true",
                   help="politeness_key=domain, each host its own group with no limit: the "
                        "cost of keeping politeness groups (a revision before them can't be "
                        "measured --against with it)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    child = list(argv if argv is not None else sys.argv[1:])
    if "--against" in child:
        i = child.index("--against")
        del child[i:i + 2]
    if args.interleave and args.against:
        child.remove("--interleave")
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / args.against[:10]
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(tree), args.against], check=True)
            try:
                interleave(ROOT, tree, child, args.rounds)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=True)
        return 0
    here = _run_in(ROOT, child)
    _show("this tree", here)
    if args.against:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(tree), args.against], check=True)
            try:
                there = _run_in(tree, child)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=True)
        _show(args.against[:10], there)
        for name in ("lease", "ack"):
            print(f"{name:5s} this tree / {args.against[:10]}: "
                  f"{here[name]['us'] / max(there[name]['us'], 1e-9):.2f} x the Redis time, "
                  f"{here[name]['cpu_us'] / max(there[name]['cpu_us'], 1e-9):.2f} x its CPU, "
                  f"{here[name]['commands'] / max(there[name]['commands'], 1e-9):.2f} x the "
                  "commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
