"""What near-duplicate detection costs a crawl: consumer CPU and Redis commands per page,
with it on, off, and as another checkout does it, side by side.

    python bench/neardup_bench.py [--before DIR] [--rounds 3] [--root DIR]

One consumer with the links handler crawls Debian's python3-doc tree (~530 pages, served
by nginx on 127.0.0.1; ``apt-get install -y python3-doc nginx`` when missing) from its
index, with bench/site_bench.py's flags (per-host concurrency 16, no delay, robots.txt
on: a 404), on a fresh crawl in the bench's own redis-server, in these variants, each
round in turn:

- **on**: this checkout, ``near_duplicate_distance=3`` (the judgement on; the
  policy's default is ``off``);
- **off**: this checkout, ``near_duplicate_distance=off`` (no fingerprint, no call);
- **before** (with ``--before DIR``): the checkout in DIR with the policy's defaults,
  its consumer run from DIR with ``PYTHONPATH=DIR`` (e.g. ``git worktree add /tmp/before
  <commit>``: the code before a change, on the same site, Redis and nginx).

Per run: **pages** (distinct HTML pages answered 200), how many ended
``near_duplicate`` (the jsonl sink's records), the consumer's **CPU per page** (user +
system from its first request at the server to its exit: site_bench's measure, start-up
left out), **Redis commands per page** (``INFO commandstats`` before and after the run,
the bench's own INFO calls left out; the EVALSHA calls, one per script call, beside it)
and **redis-server CPU per page** (``/proc/<pid>/stat``). The machine may be shared with
other work: CPU time, not wall time, is the figure; the span is printed for scale only.
With ``--rounds`` > 1 the medians follow, and the ratios of each variant's CPU per page
to **off**'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402
import site_bench  # noqa: E402
from benchlib import cpu_seconds, doc_root, run_in_workdir, start_nginx  # noqa: E402
from site_bench import AccessLog, Client, consumer_argv, run_clients  # noqa: E402

from common.policy import parse_assignments, set_policy  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.runtime import run_loop  # noqa: E402


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    tree: Path  # the checkout whose consumer runs
    values: dict[str, str]  # policy values for its crawl


@dataclass(frozen=True, slots=True)
class Figures:
    variant: str
    pages: int
    near_duplicates: int
    consumer_cpu: float  # seconds, first request to exit
    commands: int
    evalsha: int
    top: str  # the most called commands, per page
    redis_cpu: float
    span: float
    note: str

    def per_page(self, value: float) -> float:
        return value / self.pages if self.pages else 0.0


def commandstats(client: redis.Redis) -> Counter[str]:
    """Calls per command so far."""
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"])
                    for name, v in stats.items()})


async def create_policy(url: str, crawl: str, values: dict[str, str]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await set_policy(client, crawl, parse_assignments(f"{k}={v}" for k, v in values.items()),
                         by="neardup_bench", create=True)
    finally:
        await client.aclose()


def outcomes(out: Path) -> Counter[str]:
    """The outcomes of the records a jsonl sink wrote under `out`."""
    counts: Counter[str] = Counter()
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            counts[json.loads(line).get("outcome", "?")] += 1
    return counts


def run_variant(v: Variant, args: argparse.Namespace, *, redis_server: RedisServer,
                log: AccessLog, start_url: str, workdir: Path, n: int) -> Figures:
    crawl = f"neardup-{v.name}-{n}"
    run_loop(site_bench.fresh_crawl(redis_server.url, crawl, start_url))
    # The flags below make the policy of a crawl without one: this one has one already.
    run_loop(create_policy(redis_server.url, crawl, {
        "per_host_delay": "0", "per_host_concurrency": str(args.per_host_concurrency),
        "max_depth": "1000", **v.values}))
    out = workdir / crawl
    env = {k: val for k, val in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = str(v.tree)
    agent = f"crawlq-{v.name}"
    client = Client(consumer_argv(redis_server.url, crawl, agent, out, args), agent)
    r = redis.Redis.from_url(redis_server.url)
    assert redis_server.process is not None
    pid = redis_server.process.pid
    try:
        before, redis_cpu = commandstats(r), cpu_seconds(pid) or 0.0
        run = run_clients(v.name, [client], log=log, workdir=workdir, timeout=args.timeout,
                          env=env, cwd=v.tree)
        calls = commandstats(r) - before
        redis_cpu = (cpu_seconds(pid) or 0.0) - redis_cpu
    finally:
        r.close()
    calls["info"] -= 1  # the bench's own, after the run
    note = ""
    if run.timed_out or run.exit_codes[0]:
        note = f"exited {run.exit_codes[0]}{' (timed out)' if run.timed_out else ''}\n" \
               f"{site_bench.tail(client.out)}"
    done = outcomes(out)
    pages = len(run.pages)
    top = ", ".join(f"{name} {n / pages:.2f}" for name, n in calls.most_common(5)) \
        if pages else ""
    return Figures(v.name, pages, done["near_duplicate"], run.cpu, sum(calls.values()),
                   calls["evalsha"], top, redis_cpu, run.span, note)


def show(f: Figures) -> None:
    print(f"{f.variant:8} {f.pages:5d} pages  {f.near_duplicates:3d} near_duplicate  "
          f"consumer CPU {1e3 * f.per_page(f.consumer_cpu):5.2f} ms/page  "
          f"Redis {f.per_page(f.commands):5.2f} commands/page "
          f"({f.per_page(f.evalsha):4.2f} EVALSHA)  redis-server CPU "
          f"{1e6 * f.per_page(f.redis_cpu):4.0f} us/page  (span {f.span:5.2f} s)")
    print(f"{'':8} commands a page: {f.top}")
    if f.note:
        print("    " + f.note)


def medians(rounds: list[dict[str, Figures]]) -> None:
    def med(name: str, value: str) -> float:
        return statistics.median(getattr(r[name], value) / r[name].pages
                                 for r in rounds if r[name].pages)

    print(f"\n-- medians over {len(rounds)} rounds (per page) --")
    names = list(rounds[0])
    for name in names:
        cpu = med(name, "consumer_cpu")
        ratio = cpu / med("off", "consumer_cpu") if "off" in names else 0.0
        print(f"{name:8} consumer CPU {1e3 * cpu:5.2f} ms ({ratio:4.2f} x off)  "
              f"Redis {med(name, 'commands'):5.2f} commands ({med(name, 'evalsha'):4.2f} "
              f"EVALSHA)  redis-server CPU {1e6 * med(name, 'redis_cpu'):4.0f} us")


def bench(args: argparse.Namespace, workdir: Path) -> int:
    root = doc_root(args.root)
    variants = [Variant("on", ROOT, {"near_duplicate_distance": "3"}),
                Variant("off", ROOT, {"near_duplicate_distance": "off"})]
    if args.before is not None:
        if not (args.before / "consumer" / "__main__.py").is_file():
            raise SystemExit(f"--before {args.before}: not a crawlq checkout")
        variants.append(Variant("before", args.before.resolve(), {}))
    port, log_path = start_nginx(root, workdir, site_bench.NGINX_HTTP)
    redis_server = RedisServer().start()
    start_url = f"http://127.0.0.1:{port}/index.html"
    print(f"{root} on 127.0.0.1:{port}, redis-server "
          f"{'.'.join(map(str, redis_server.version()))}, {os.cpu_count()} CPUs; "
          f"variants: {', '.join(f'{v.name} ({v.tree})' for v in variants)}")
    rounds: list[dict[str, Figures]] = []
    try:
        for n in range(args.rounds):
            print(f"\n-- round {n + 1} of {args.rounds} --")
            order = variants[n % len(variants):] + variants[:n % len(variants)]
            figures = {}
            for v in order:
                figures[v.name] = f = run_variant(
                    v, args, redis_server=redis_server, log=AccessLog(log_path),
                    start_url=start_url, workdir=workdir, n=n)
                show(f)
            rounds.append({v.name: figures[v.name] for v in variants})
        if args.rounds > 1:
            medians(rounds)
    finally:
        redis_server.stop()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--before", type=Path, default=None,
                   help="another crawlq checkout to run beside this one (e.g. a worktree "
                   "of the commit before a change)")
    p.add_argument("--root", type=Path, default=None,
                   help=f"the HTML tree to serve (default {site_bench.DOC_ROOT})")
    p.add_argument("--rounds", type=int, default=3, help="repeat every variant")
    p.add_argument("--per-host-concurrency", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--timeout", type=float, default=180.0,
                   help="stop a run (and report it) after this many seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_in_workdir("crawlq-neardup-bench-", lambda workdir: bench(args, workdir),
                          site_bench.stop_all)


if __name__ == "__main__":
    sys.exit(main())
