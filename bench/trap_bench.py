"""Generated sites of real pages behind crawler traps: crawlq, wget and Scrapy on each.

    python bench/trap_bench.py [--seeds 20] [--seed N ...] [--timeout 60] [--budget 10]
                               [--peer-timeout 30] [--skip-wget] [--skip-scrapy]
                               [--set KEY=VALUE]

The corpus is bench/trap_sites.py's: one site per seed (``--seeds N``: seeds 1..N, 20 by
default; ``--seed`` names them instead), each of ~150-500 real pages of one template and
a shared vocabulary (long pages, short ones, near-identical siblings, paginated listings,
items at counter paths and by query, pages only their item links, a chain of 8-15 pages
to the deepest ones) beside 3-6 trap families with parameters of their own (session ids
in the query or the path, soft 404s at the root or under a directory, faceted search by
word or number, calendars by path or query, relative links that repeat segments,
redirect loops and chains, endless pagination). ``python bench/trap_sites.py 1 2 3``
describes sites without crawling them.

Sites run one after another, each served by this file (``--serve``: an aiohttp app in its
own process on a free 127.0.0.1 port; robots.txt answers 404) to each client in turn,
each starting at ``/``:

- **crawlq**: a fresh crawl on the bench's redis-server, one consumer, the links handler,
  per-host concurrency 8, no delay, its trap rules and near-duplicate check at their
  defaults (``--set KEY=VALUE``, ``crawlq crawl set``'s syntax, changes one for its runs)
  and no depth limit of its own (``max_depth`` 1,000,000 when the default is lower): the
  crawl must end by itself (``--exit-when-empty``);
- **wget** ``-r -l <the site's deepest real page> -nd --delete-after`` (one connection);
- **Scrapy**: a CrawlSpider following every link on the host, ``DEPTH_LIMIT`` the site's
  deepest real page, ``CONCURRENT_REQUESTS_PER_DOMAIN`` 8 (the venv of
  bench/site_bench.py).

The server is the instrument: it logs every request (site_bench's access-log format) and
the site knows every request (``Site.real_key``, ``Site.trap_of``). Per client and site:
**real pages** found (the distinct real pages it fetched, answered 200, under a session
token or not) of those the site has, and the ones missed by kind (an item's own notes
page, the chain, the pages behind it, ...); **requests** (robots.txt left out); **in
traps**: every request that is not the first fetch of a real page, by family (a real page
fetched again is ``refetch``, or ``session ids`` if it was found under a token; a 404 no
trap makes is ``not found``), and its share of the requests; how the client **ended**: by
itself, stopped at the timeout (``--timeout`` seconds for crawlq, ``--peer-timeout`` for
wget and Scrapy, which end on hardly any site: their figures are what they did by then),
or stopped once it had sent ``--budget`` times the site's real pages in requests (it
can't be within 5% of them then); its **span** (first request to last). The budget and
the timeouts keep 20 sites under 30 minutes on 2 cores shared with other work (Scrapy,
~40-110 requests a second there, takes most of it). For crawlq,
also its outcome for real pages that were not ``ok`` (``near_duplicate``: links not
followed) and its queue's end state. Then, per client, the sums over all sites, and per
trap family the requests each client spent in it.

**Verdict** for crawlq: on EVERY site every real page found, at most 5% of its requests
in traps, and the crawl ended by itself; the sites and families that miss are printed.
Exit 0 whatever the verdict: a bench, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402
import site_bench  # noqa: E402
from benchlib import apt_install, run_in_workdir, wait_port  # noqa: E402
from site_bench import AccessLog, Client, Run, run_clients, scrapy_python, spawn  # noqa: E402
from trap_sites import FAMILIES, NOT_FOUND, SESSION_IDS, Site  # noqa: E402

from common.policy import OPTIONS, parse_assignments, set_policy  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.runtime import run_loop  # noqa: E402

TARGET_TRAP_SHARE = 0.05
#: crawlq's max_depth when the policy's default is lower: no limit of its own.
NO_DEPTH_LIMIT = 1_000_000
REFETCH = "refetch"

SPIDER = '''\
"""The Scrapy side of bench/trap_bench.py: follow every link on the host."""

import sys
from urllib.parse import urlsplit

from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

START, PER_HOST, USER_AGENT, DEPTH = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])


class TrapSpider(CrawlSpider):
    name = "traps"
    start_urls = [START]
    rules = (Rule(LinkExtractor(allow_domains=[urlsplit(START).netloc], deny_extensions=[]),
                  follow=True),)


process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    "DEPTH_LIMIT": DEPTH, "ROBOTSTXT_OBEY": False, "DOWNLOAD_DELAY": 0,
    "AUTOTHROTTLE_ENABLED": False, "HTTPCACHE_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "WARNING", "USER_AGENT": USER_AGENT,
})
process.crawl(TrapSpider)
process.start()
'''


def crawl_depth() -> int | None:
    """The max_depth crawlq's runs get: none of their own (None: the default is none)."""
    default = OPTIONS["max_depth"].default
    if isinstance(default, int) and not isinstance(default, bool) and default < NO_DEPTH_LIMIT:
        return NO_DEPTH_LIMIT
    return None


# -- one client on one site: what it did -----------------------------------------------------


@dataclass
class Tally:
    """What one client did on one site."""

    client: str
    seed: int
    real: int
    found: set[str]
    requests: int
    traps: Counter[str]
    ended: str  # "ended", "timeout", "budget" (stopped), or "exited N"
    span: float
    missed: Counter[str]  # real pages not found, by kind
    examples: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def wasted(self) -> int:
        return sum(self.traps.values())

    @property
    def share(self) -> float:
        return self.wasted / self.requests if self.requests else 0.0

    @property
    def by_itself(self) -> bool:
        return self.ended == "ended"

    @property
    def ok(self) -> bool:
        return len(self.found) == self.real and self.share <= TARGET_TRAP_SHARE \
            and self.by_itself


def tally(site: Site, run: Run) -> Tally:
    """Judge a run's requests by what the site knows of each."""
    hits = [h for h in run.hits if h.uri != "/robots.txt"]
    found: dict[str, bool] = {}  # real page -> found under a session token
    traps: Counter[str] = Counter()
    for h in sorted(hits, key=lambda h: h.start):
        key = site.real_key(h.uri)
        family = site.trap_of(h.uri)
        if h.status == 200 and key is not None and key not in found:
            found[key] = family is not None
        elif family is None and key is not None and found.get(key):
            traps[SESSION_IDS] += 1  # its plain URL, after it was found under a token
        else:
            traps[family or REFETCH] += 1
    if run.over_budget:
        ended = "budget"
    elif run.timed_out:
        ended = "timeout"
    elif any(run.exit_codes):
        ended = f"exited {','.join(str(c) for c in run.exit_codes)}"
    else:
        ended = "ended"
    missing = sorted(site.real_paths - set(found), key=lambda k: (site.depth[k], k))
    return Tally(run.label, site.seed, len(site.real_paths), set(found), len(hits), traps,
                 ended, run.span, Counter(site.kind_of(k) for k in missing), missing[:4])


# -- the runs ----------------------------------------------------------------------------------


@dataclass
class Served:
    """A site being served, and where a run's files go."""

    site: Site
    start: str  # its start URL
    log: AccessLog
    workdir: Path


def run_crawlq(args: argparse.Namespace, on: Served, redis_server: RedisServer) -> Tally:
    site, start, log, workdir = on.site, on.start, on.log, on.workdir
    crawl = f"traps-{site.seed}-{int(time.time() * 1000)}"
    run_loop(site_bench.fresh_crawl(redis_server.url, crawl, start))
    depth = crawl_depth()
    run_loop(create_policy(redis_server.url, crawl, {
        "per_host_delay": 0.0, "per_host_concurrency": 8,
        **({"max_depth": depth} if depth is not None else {}),
        **parse_assignments(args.set)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    agent = "crawlq-bench-0"
    out = workdir / crawl
    client = Client([sys.executable, "-m", "consumer", "--redis-url", redis_server.url,
                     "--crawl", crawl, "--worker-id", agent, "--header",
                     f"X-Bench-Client: {agent}", "--handler", "consumer.handlers:links",
                     "--allow-private", "--exit-when-empty", "--empty-grace", "0",
                     "--concurrency", "32", "--http-port", "-1", "--sink", "jsonl",
                     "--output", str(out), "--grace", "2", "--log-level", "WARNING"], agent)
    run = run_clients("crawlq", [client], log=log, workdir=workdir, timeout=args.timeout,
                      env=env, max_requests=args.budget * len(site.real_paths))
    t = tally(site, run)
    for outcome, kinds in real_outcomes(site, out).items():
        t.notes.append(f"real pages never handled ok (links not followed): {outcome} "
                       f"{kinds.total()} (" + ", ".join(f"{k} {n}" for k, n in
                                                        kinds.most_common()) + ")")
    t.notes.append("queue: " + run_loop(site_bench.crawl_outcome(redis_server.url, crawl)))
    if t.ended.startswith("exited"):
        t.notes.append(site_bench.tail(client.out))
    shutil.rmtree(out, ignore_errors=True)
    return t


def real_outcomes(site: Site, out: Path) -> dict[str, Counter[str]]:
    """The real pages crawlq fetched but never handled ok (so never followed their links):
    by outcome, their kinds (its JSON lines: under any URL, a session token's included)."""
    outcomes: dict[str, set[str]] = {}
    for path in out.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            parts = urlsplit(record["url"])
            key = site.real_key(parts.path + (f"?{parts.query}" if parts.query else ""))
            if key is not None:
                outcomes.setdefault(key, set()).add(record["outcome"])
    kinds: dict[str, Counter[str]] = {}
    for key, seen in outcomes.items():
        if "ok" not in seen:
            kinds.setdefault(",".join(sorted(seen)), Counter())[site.kind_of(key)] += 1
    return kinds


async def create_policy(url: str, crawl: str, values: dict[str, Any]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await set_policy(client, crawl, values, by="trap_bench", create=True)
    finally:
        await client.aclose()


def run_wget(args: argparse.Namespace, on: Served) -> Tally:
    site, start, log, workdir = on.site, on.start, on.log, on.workdir
    out = workdir / "wget"
    argv = ["wget", "-r", "-l", str(site.deepest), "-nd", "--delete-after", "-nv", "-P",
            str(out), "-U", "wget-bench", "--no-proxy", start]
    run = run_clients("wget", [Client(argv, "wget-bench")], log=log, workdir=workdir,
                      timeout=args.peer_timeout,
                      max_requests=args.budget * len(site.real_paths))
    shutil.rmtree(out, ignore_errors=True)
    t = tally(site, run)
    if t.ended.startswith("exited"):  # 8: a 404 somewhere; it ended by itself all the same
        t.ended = "ended"
        t.notes.append(f"wget exited {run.exit_codes[0]}")
    return t


def run_scrapy(args: argparse.Namespace, on: Served, python: Path) -> Tally:
    site, start, log, workdir = on.site, on.start, on.log, on.workdir
    spider = workdir / "trap_spider.py"
    spider.write_text(SPIDER)
    agent = "scrapy-bench"
    argv = [str(python), str(spider), start, "8", agent, str(site.deepest)]
    run = run_clients("scrapy", [Client(argv, agent)], log=log, workdir=workdir,
                      timeout=args.peer_timeout,
                      max_requests=args.budget * len(site.real_paths))
    return tally(site, run)


def start_site(site: Site, workdir: Path) -> tuple[subprocess.Popen[bytes], Served]:
    """The site served by a process of its own (``--serve``)."""
    log_path = workdir / f"access-{site.seed}.log"
    log_path.touch()
    server = spawn([sys.executable, __file__, "--serve", str(log_path), "--seed",
                    str(site.seed)], stdout=subprocess.PIPE)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    wait_port(port, server, f"site {site.seed}")
    return server, Served(site, f"http://127.0.0.1:{port}/", AccessLog(log_path), workdir)


# -- reporting ---------------------------------------------------------------------------------


def print_tally(t: Tally) -> None:
    ended = {"ended": "ended by itself", "timeout": "STOPPED at the timeout",
             "budget": "STOPPED at the request budget"}.get(t.ended, t.ended.upper())
    print(f"  {t.client:7} real {len(t.found):4d}/{t.real:<4d} requests {t.requests:6d}  "
          f"in traps {t.wasted:6d} ({100 * t.share:5.1f}%)  {ended}, span {t.span:.2f} s")
    if t.traps:
        print("          in traps: " + ", ".join(f"{f} {n}" for f, n in t.traps.most_common()))
    if t.missed:
        print("          missed: " + ", ".join(f"{k} {n}" for k, n in t.missed.most_common())
              + f" (e.g. {', '.join(t.examples)})")
    for note in t.notes:
        print("          " + note)


def floor_line(site: Site) -> str:
    """The site's floor (``Site.floor``): requests in traps no crawler can avoid."""
    floor = site.floor()
    n = sum(floor.values())
    return (f"in traps {n:6d} ({100 * n / (n + len(site.real_paths)):5.1f}%) at the least: "
            + (", ".join(f"{f} {k}" for f, k in floor.items()) or "none"))


def print_totals(tallies: list[Tally], sites: dict[int, Site]) -> None:
    clients = list(dict.fromkeys(t.client for t in tallies))
    print(f"\n-- all {len(sites)} sites --")
    print(f"{'client':8} {'real found':>17} {'sites all found':>15} {'requests':>9} "
          f"{'in traps':>16} {'sites <= 5%':>11} {'ended':>6} {'stopped':>8} {'span s':>8}")
    for c in clients:
        ts = [t for t in tallies if t.client == c]
        real, found = sum(t.real for t in ts), sum(len(t.found) for t in ts)
        requests, wasted = sum(t.requests for t in ts), sum(t.wasted for t in ts)
        print(f"{c:8} {found:7d}/{real:<5d} {100 * found / real:5.1f}% "
              f"{sum(len(t.found) == t.real for t in ts):>9d}/{len(ts):<5d} {requests:9d} "
              f"{wasted:8d} ({100 * wasted / max(requests, 1):4.1f}%) "
              f"{sum(t.share <= TARGET_TRAP_SHARE for t in ts):>8d}/{len(ts):<2d} "
              f"{sum(t.by_itself for t in ts):>6d} {len(ts) - sum(t.by_itself for t in ts):>8d} "
              f"{sum(t.span for t in ts):8.1f}")
    print("\nrequests in traps by family (sites with it; the floor: what no crawler can "
          "avoid, Site.floor; per client: requests, and the sites where the family alone "
          "took > 5% of the client's requests)")
    families = [*FAMILIES, REFETCH, NOT_FOUND]
    print(f"{'family':20} {'sites':>5}  {'floor':>20}  "
          + "  ".join(f"{c:>20}" for c in clients))
    floors = {seed: site.floor() for seed, site in sites.items()}
    for f in families:
        having = sorted(s for s, site in sites.items() if f in site.traps)
        row = [f"{sum(fl.get(f, 0) for fl in floors.values()):9d}"]
        for c in clients:
            ts = [t for t in tallies if t.client == c]
            heavy = [t.seed for t in ts if t.requests and t.traps[f] > TARGET_TRAP_SHARE
                     * t.requests]
            row.append(f"{sum(t.traps[f] for t in ts):9d} ({len(heavy):2d} sites)")
        if any(t.traps[f] for t in tallies) or having:
            print(f"{f:20} {len(having):5d}  " + "  ".join(f"{r:>20}" for r in row))
    print("\neach family's sites: its parameters there, and the requests each client "
          "spent in it")
    for f in FAMILIES:
        print(f)
        for seed, site in sites.items():
            if f in site.traps:
                spent = "  ".join(f"{t.client} {t.traps[f]:5d}" for t in tallies
                                  if t.seed == seed)
                print(f"  seed {seed:<4d} {spent}   {site.traps[f].describe()}")
    print("\nreal pages missed by kind")
    for c in clients:
        missed: Counter[str] = Counter()
        for t in tallies:
            if t.client == c:
                missed.update(t.missed)
        print(f"{c:8} " + (", ".join(f"{k} {n}" for k, n in missed.most_common()) or "none"))


def print_verdict(tallies: list[Tally], sites: dict[int, Site]) -> None:
    ts = [t for t in tallies if t.client == "crawlq"]
    bad = [t for t in ts if not t.ok]
    print(f"\ncrawlq on every site: every real page found, <= {100 * TARGET_TRAP_SHARE:.0f}% "
          f"of requests in traps, ended by itself: {'OK' if not bad else 'MISSED'} "
          f"({len(ts) - len(bad)} of {len(ts)} sites)")
    for t in bad:
        why = []
        if len(t.found) < t.real:
            why.append(f"{t.real - len(t.found)} real pages missed ("
                       + ", ".join(f"{k} {n}" for k, n in t.missed.most_common()) + ")")
        if t.share > TARGET_TRAP_SHARE:
            floor = sum(sites[t.seed].floor().values())
            why.append(f"{100 * t.share:.1f}% in traps (" + ", ".join(
                f"{f} {n}" for f, n in t.traps.most_common(3)) + f"; the floor {floor}, "
                f"{100 * floor / (floor + t.real):.1f}%)")
        if not t.by_itself:
            why.append(f"did not end by itself ({t.ended})")
        print(f"  seed {t.seed} [{', '.join(sites[t.seed].traps)}]: {'; '.join(why)}")


# -- main --------------------------------------------------------------------------------------


def bench(args: argparse.Namespace, workdir: Path) -> int:
    if not args.skip_wget and shutil.which("wget") is None:
        apt_install("wget")
    python = None if args.skip_scrapy else scrapy_python(False)
    seeds = args.seed or list(range(1, args.seeds + 1))
    redis_server = RedisServer().start()
    sites: dict[int, Site] = {}
    tallies: list[Tally] = []
    began = time.monotonic()
    try:
        print(f"{len(seeds)} sites, seeds {seeds[0]}..{seeds[-1]}; crawlq max_depth "
              f"{crawl_depth() or 'default'}{', ' + ', '.join(args.set) if args.set else ''};"
              f" budget {args.budget} requests a real page, timeout {args.timeout:.0f} s "
              f"(wget, Scrapy {args.peer_timeout:.0f} s); "
              f"{os.cpu_count()} CPUs", flush=True)
        for seed in seeds:
            site = sites[seed] = Site(seed)
            print(f"\n{site.describe()}", flush=True)
            server, served = start_site(site, workdir)
            try:
                tallies.append(run_crawlq(args, served, redis_server))
                if not args.skip_wget:
                    tallies.append(run_wget(args, served))
                if python is not None:
                    tallies.append(run_scrapy(args, served, python))
            finally:
                site_bench.stop(server)
            for t in tallies:
                if t.seed == seed:
                    print_tally(t)
            print("  floor   " + floor_line(site))
            sys.stdout.flush()
        print_totals(tallies, sites)
        print_verdict(tallies, sites)
        print(f"\n({time.monotonic() - began:.0f} s in all)")
    finally:
        redis_server.stop()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="sites of seeds 1..N")
    p.add_argument("--seed", type=int, action="append", default=[],
                   help="a site's seed (repeatable; instead of --seeds)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="stop crawlq (and report it) after this many seconds on a site")
    p.add_argument("--peer-timeout", type=float, default=30.0,
                   help="stop wget or Scrapy (and report it) after this many seconds on a site")
    p.add_argument("--budget", type=int, default=10,
                   help="stop a client once it has sent this many requests per real page of "
                   "the site (0: no limit)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a crawl policy value for crawlq's runs (crawlq crawl set's syntax; "
                   "e.g. near_duplicate_distance=off), over the defaults")
    p.add_argument("--skip-wget", action="store_true")
    p.add_argument("--skip-scrapy", action="store_true")
    p.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        Site(args.seed[0]).serve(args.serve)
        return 0
    parse_assignments(args.set)  # a mistake said before anything starts
    return run_in_workdir("crawlq-trap-bench-", lambda workdir: bench(args, workdir),
                          site_bench.stop_all)


if __name__ == "__main__":
    sys.exit(main())
