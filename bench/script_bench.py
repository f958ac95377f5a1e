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
in it.

`--against REV` runs the same measurement on a git worktree of REV (made under a temp
dir and removed after) right after this tree's, and prints the ratios: how a change to
the Lua moves its cost, side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from common.redis_server import RedisServer
from common.urls import fingerprint

ROOT = Path(__file__).resolve().parent.parent


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
                batch = await q.lease_turns("w", args.batch, 60_000)
                s1 = await _stats(client)
                if not batch.leases:
                    await asyncio.sleep(0.01)
                    continue
                pages += len(batch.leases)
                _add(lease, s0, s1)
                await q.ack("w", [(lease_, "ok") for lease_ in batch.leases])
                _add(ack, s1, await _stats(client))
        finally:
            await client.aclose()
    out: dict[str, Any] = {"pages": pages}
    for name, cmds in (("lease", lease), ("ack", ack)):
        calls, usec = cmds.pop("evalsha", [0, 0])
        out[name] = {"calls": calls, "us": usec / max(pages, 1),
                     "inner_us": sum(u for _, u in cmds.values()) / max(pages, 1),
                     "commands": sum(c for c, _ in cmds.values()) / max(pages, 1)}
    return out


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
        print(f"{label:10s} {name:5s} {r['us']:6.1f} us/page  (its commands {r['inner_us']:5.1f}"
              f" us, {r['commands']:4.2f} commands a page; {r['calls']} calls for "
              f"{result['pages']} pages)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--batch", type=int, default=10, help="tasks a lease call asks for")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--delay", type=float, default=0.0, help="the crawl's per-host delay, s")
    p.add_argument("--against", default=None, help="a git revision to measure beside")
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
                  f"{here[name]['commands'] / max(there[name]['commands'], 1e-9):.2f} x the "
                  "commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
