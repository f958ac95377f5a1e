"""Real HTML trees from Debian's doc packages: does crawlq's page judgement cost a page?

    python bench/tree_bench.py [--trees python3-doc,postgresql-doc-15,libstdc++-12-doc]
                               [--rounds 5] [--other-rounds 1]
                               [--per-host-concurrency 8] [--skip-spider]
                               [--skip-scrapy] [--timeout 600]

Issue 43's real-tree checks, on trees no one here wrote or tuned a heuristic on, each
made by another generator: ``python3-doc`` (Sphinx, ~530 pages), ``postgresql-doc-15``
(DocBook XSL, ~1,170 pages: the SQL reference whose ``DROP TEXT SEARCH TEMPLATE`` page
was once judged 1 bit from ``DROP TEXT SEARCH PARSER``'s) and ``libstdc++-12-doc``
(Doxygen's API reference, ~3,800 pages named ``a01234.html``, all of one URL shape, and
a DocBook manual). A missing package is installed with apt-get. Each tree is served by
an nginx the bench starts on a free 127.0.0.1 port (its own robots.txt: none of these
trees has one, so a 404), and every crawl starts at the tree's ``index.html``:

1. **wget** ``-r -l inf -np``, one connection (``bench/site_bench.py``'s run): the HTML
   pages it reached (200s in the access log) are the reference.
2. **crawlq**, one consumer a crawl, the links handler, on the bench's own
   redis-server, with the crawl policy's defaults but ``per_host_delay=0``,
   ``per_host_concurrency=P`` (8) and ``max_depth=1000`` (the policy's default, none, is
   unlimited too: set explicitly so an older crawlq compares alike), in three variants:
   **defaults** (``near_duplicate_distance=off``, ``soft_404=true``), **near-dup 3**
   (``near_duplicate_distance=3``: the judgement on) and **all off**
   (``near_duplicate_distance=off soft_404=false``). A round runs the three at once,
   each its own crawl and consumer on the same nginx and Redis, so whatever else the
   machine runs meanwhile slows each alike (one after another, on a shared 2-core
   machine, one variant's CPU per page swung by 50% between rounds: more than the
   10% to be told apart); ``--rounds`` rounds on the first tree (python3-doc: the CPU
   comparison), ``--other-rounds`` (1) on the others.
   Per run: its pages (200s of HTML) against wget's, both ways, with examples; its
   outcome counts (``crawlq stats``' ``outcome:*`` counters: ok, soft_404,
   near_duplicate, probe, ...); the probes it made (requests for a made-up name, from
   the access log, with nginx's answer); its host's trap tallies (``crawlq traps``:
   links refused by a trap rule, pages judged); every page judged ``soft_404`` or
   ``near_duplicate`` by URL, and for a near duplicate the page of its URL shape
   nearest to it among those the run fetched, with the distance in bits (recomputed
   here as the consumer computes it: the links handler's links, ``common.traps.simhash``);
   and the consumer's **CPU per page** (user + system from its first request at the
   server to its exit: site_bench's measure, start-up left out).
3. **a spider** emitting one item per HTML page (``{"url", "title"}`` keyed by URL) and
   following every ``<a href>`` / ``<area href>`` (one consumer, ``--spider``, the policy
   the spider file gives: the defaults but the three values above): items written (the
   JSONL sink's records) against its pages and against wget's.
4. **a catch-all**: the tree served again by an nginx that answers a missing path 200
   with the tree's ``index.html`` (``error_page 404 =200 /index.html``, as hosts that
   serve a single-page app do), crawled by crawlq with the defaults: the soft-404
   judgement's probe now gets a page, so each page the run fetched is judged against
   it. Printed: real pages (a file of the tree) judged ``soft_404`` (false, each by
   URL), made-up paths (the tree's broken links, what they lead to) judged so (true)
   and not (missed), and wget's pages not reached.

Then (unless ``--skip-spider-bench``) ``bench/spider_bench.py`` on python3-doc: crawlq's
spider with the defaults, with ``near_duplicate_distance=3`` and with both judgements
off against Scrapy's, pages/s over their spans and CPU per page, ``--spider-rounds``
(3) rounds. The machine may be shared: CPU time, not wall time, is the
figure for cost: per variant, the median over the rounds of its CPU per page over
**all off**'s in the same round (the target: the defaults' at most 1.10), and a table
of every tree close the report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402
import site_bench  # noqa: E402
from benchlib import (  # noqa: E402
    apt_install,
    nginx_conf,
    run_in_workdir,
    spawn,
    start_nginx,
    wait_port,
    which_nginx,
)
from neardup_bench import create_policy  # noqa: E402
from site_bench import AccessLog, Client, Env, Run, consumer_argv, run_clients  # noqa: E402

from common.queue import CrawlQueue, CrawlSettings, NewTask  # noqa: E402
from common.redis.server import RedisServer  # noqa: E402
from common.runtime import run_loop  # noqa: E402
from common.traps import simhash  # noqa: E402
from common.traps.book import TrapBook  # noqa: E402
from common.urls.canonical import canonicalize  # noqa: E402
from common.urls.canonical import fingerprint as url_fingerprint  # noqa: E402
from common.urls.shape import shape  # noqa: E402
from consumer.judgement import link_features  # noqa: E402
from consumer.links import extract_links  # noqa: E402


@dataclass(frozen=True, slots=True)
class Tree:
    name: str  # the Debian package
    root: Path  # served; holds index.html
    generator: str


TREES = (
    Tree("python3-doc", Path("/usr/share/doc/python3-doc/html"), "Sphinx"),
    Tree("postgresql-doc-15", Path("/usr/share/doc/postgresql-doc-15/html"), "DocBook XSL"),
    Tree("libstdc++-12-doc", Path("/usr/share/doc/libstdc++-12-doc/libstdc++"),
         "Doxygen API + DocBook manual"),
)

#: Policy values of every crawlq run: no delay, no depth limit (as the default, none;
#: set explicitly so an older checkout compares alike).
BASE = {"per_host_delay": "0", "max_depth": "1000"}
VARIANTS = (
    ("defaults", {}),
    ("near-dup 3", {"near_duplicate_distance": "3"}),
    ("all off", {"near_duplicate_distance": "off", "soft_404": "false"}),
)
JUDGED = ("soft_404", "near_duplicate")
#: A probe's made-up name (common.traps.soft404.probe_url): a letter, 14 of [a-z0-9], a digit.
PROBE = re.compile(r"/[a-z][a-z0-9]{14}[0-9](\.[A-Za-z0-9]{1,5}|/)?$")
#: The CPU target: the defaults' consumer CPU per page over all-off's, at most.
TARGET_CPU = 1.10

SPIDER = '''\
"""tree_bench's spider: one item per HTML page, every link followed."""
import json
import os

from crawlq import Spider

spider = Spider(os.environ["BENCH_CRAWL"], start=[os.environ["BENCH_START"]],
                item_key="url", policy=json.loads(os.environ["BENCH_POLICY"]))


@spider.route()
async def page(response, ctx):
    if "html" not in response.headers.get("content-type", ""):
        return
    ctx.emit({"url": response.url, "title": response.css("title::text").get("")})
    ctx.follow(css="a::attr(href), area::attr(href)")
'''


@dataclass
class Crawl:
    """One crawlq run of a tree: the server's view, and the crawl's own counts."""

    label: str
    run: Run
    outcomes: Counter[str] = field(default_factory=Counter)
    traps: dict[str, int] = field(default_factory=dict)
    judged: dict[str, str] = field(default_factory=dict)  # url -> outcome
    ok_pages: dict[str, str] = field(default_factory=dict)  # a 2xx HTML page's url -> outcome
    probes: list[str] = field(default_factory=list)  # "uri status"
    items: set[str] | None = None  # a spider's item keys
    note: str = ""

    @property
    def pages(self) -> set[str]:
        return self.run.pages

    @property
    def cpu_per_page(self) -> float:
        return self.run.cpu / len(self.pages) if self.pages else 0.0


def ensure_tree(tree: Tree) -> Path:
    """The tree's root, its package installed when missing."""
    if not (tree.root / "index.html").is_file():
        apt_install(tree.name)
    if not (tree.root / "index.html").is_file():
        raise SystemExit(f"{tree.root}/index.html not found: apt-get install -y {tree.name}")
    return tree.root.resolve()


async def crawl_counts(url: str, crawl: str) -> tuple[Counter[str], dict[str, int], str]:
    """The crawl's outcome counters, its hosts' trap tallies summed, and a note of what
    is left or dead."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        queue = await CrawlQueue.open(client, crawl)
        s = await queue.stats()
        rows = await TrapBook(queue).hosts(limit=100)
    finally:
        await client.aclose()
    outcomes = Counter({k.removeprefix("outcome:"): v for k, v in s.counters.items()
                        if k.startswith("outcome:") and v})
    traps: Counter[str] = Counter()
    for row in rows:
        traps.update(row.reasons)
    note = ""
    if s.dead or s.active:
        note = (f"dead {s.dead} ({dict(s.dead_reasons)}), pending {s.pending}, "
                f"leased {s.leased}, waiting {s.waiting}")
    return outcomes, dict(traps), note


def records(out: Path) -> list[dict[str, object]]:
    """The JSONL sink's records under `out`."""
    found = []
    for path in sorted(out.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def is_page(record: dict[str, object]) -> bool:
    """Whether a sink record is of a 2xx HTML page."""
    status, headers = record.get("status"), record.get("headers")
    return isinstance(status, int) and 200 <= status <= 299 and isinstance(headers, dict) \
        and "html" in str(headers.get("content-type", ""))


def probes_of(run: Run, root: Path) -> list[str]:
    """The run's requests for a made-up name no file has: its soft-404 probes."""
    return sorted(f"{h.uri} {h.status}" for h in run.hits
                  if PROBE.search(h.uri.partition("?")[0])
                  and not (root / unquote(h.uri.lstrip("/"))).exists())


def finish(c: Crawl, redis_url: str, crawl: str, out: Path, root: Path) -> Crawl:
    """Fill `c` from the crawl's counters, its sink's records and the access log."""
    c.outcomes, c.traps, c.note = run_loop(crawl_counts(redis_url, crawl))
    if c.run.timed_out or any(c.run.exit_codes):
        c.note += f" exited {c.run.exit_codes}{' (timed out)' if c.run.timed_out else ''}" \
                  f"\n{site_bench.tail(c.run.clients[0].out)}"
    recs = records(out)
    c.judged = {str(r["url"]): str(r["outcome"]) for r in recs if r.get("outcome") in JUDGED}
    c.ok_pages = {str(r["url"]): str(r["outcome"]) for r in recs if is_page(r)}
    if c.items is not None:
        c.items = {str(k) for r in recs for k in (r.get("item_keys") or []) if k is not None}
    c.probes = probes_of(c.run, root)
    shutil.rmtree(out, ignore_errors=True)
    return c


async def flushall(url: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


async def new_crawl(url: str, crawl: str, start_url: str, values: dict[str, str]) -> None:
    """A crawl of `start_url` with policy `values` (nothing else flushed)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        queue = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=1))
        canonical = canonicalize(start_url)
        assert isinstance(canonical, str), canonical
        await queue.enqueue([NewTask(canonical, url_fingerprint(canonical))])
    finally:
        await client.aclose()
    await create_policy(url, crawl, values)


def run_links(env: Env, variants: list[tuple[str, dict[str, str]]], n: int) -> list[Crawl]:
    """One consumer a variant, the links handler, each on a crawl of its own with its
    values over the base, all at once: whatever else the machine runs meanwhile slows
    each alike."""
    args = env.args
    run_loop(flushall(env.redis.url))
    clients, crawls = [], []
    for label, values in variants:
        crawl = f"tree-{n}-{re.sub(r'[^a-z0-9]+', '-', label)}"
        run_loop(new_crawl(env.redis.url, crawl, env.start_url, {
            **BASE, "per_host_concurrency": str(args.per_host_concurrency), **values}))
        agent = f"crawlq-{n}-{re.sub(r'[^a-z0-9]+', '-', label)}"
        clients.append(Client(consumer_argv(env.redis.url, crawl, agent,
                                            env.workdir / crawl, args), agent))
        crawls.append(crawl)
    together = run_clients(f"round {n}", clients, log=env.log, workdir=env.workdir,
                           timeout=args.timeout, env=child_env())
    out = []
    for (label, _), crawl, client, code in zip(variants, crawls, clients,
                                               together.exit_codes, strict=True):
        run = Run(label, hits=[h for h in together.hits if h.agent == client.agent],
                  clients=[client], timed_out=together.timed_out, wall_s=together.wall_s,
                  exit_codes=[code])
        out.append(finish(Crawl(label, run), env.redis.url, crawl, env.workdir / crawl,
                          env.root))
    return out


def run_spider(env: Env, n: int) -> Crawl:
    """The item-per-page spider: the producer makes its crawl, one consumer runs it."""
    args = env.args
    crawl = f"tree-spider-{n}"
    spider = env.workdir / "tree_spider.py"
    spider.write_text(SPIDER)
    policy = {**BASE, "per_host_concurrency": str(args.per_host_concurrency)}
    run_loop(flushall(env.redis.url))
    e = child_env(BENCH_CRAWL=crawl, BENCH_START=env.start_url,
                  BENCH_POLICY=json.dumps(policy))
    common = ["--redis-url", env.redis.url, "--crawl", crawl, "--spider", str(spider),
              "--log-level", "WARNING"]
    made = subprocess.run([sys.executable, "-m", "producer", *common, "--progress", "off"],
                          env=e, cwd=ROOT, capture_output=True, check=False)
    if made.returncode:
        raise SystemExit(f"the producer exited {made.returncode}: {made.stderr[-2000:]!r}")
    out = env.workdir / crawl
    agent = f"crawlq-spider-{n}"
    argv = [sys.executable, "-m", "consumer", *common, "--allow-private",
            "--exit-when-empty", "--empty-grace", "0", "--http-port", "-1",
            "--concurrency", str(args.concurrency), "--header", f"X-Bench-Client: {agent}",
            "--sink", "jsonl", "--output", str(out), "--grace", "2"]
    run = run_clients("spider", [Client(argv, agent)], log=env.log, workdir=env.workdir,
                      timeout=args.timeout, env=e)
    return finish(Crawl("spider (defaults)", run, items=set()), env.redis.url, crawl, out,
                  env.root)


def start_catch_all(root: Path, d: Path) -> tuple[int, Path]:
    """nginx serving `root` as `start_nginx` does, but a missing path is answered 200
    with the tree's index.html (``error_page 404 =200 /index.html``): a soft 404."""
    from common.redis.server import free_port  # noqa: PLC0415

    d.mkdir()
    port, log = free_port(), d / "access.log"
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, port, http=site_bench.NGINX_HTTP.replace("{log}", str(log)),
                               server=f"        root {root};\n        index index.html;\n"
                               "        error_page 404 =200 /index.html;"))
    nginx = which_nginx(install=True)
    if nginx is None:
        raise SystemExit("no nginx on PATH (apt-get install nginx)")
    proc = spawn([nginx, "-p", str(d), "-c", str(conf)], stdout=subprocess.DEVNULL)
    wait_port(port, proc, "nginx")
    return port, log


def show_catch_all(c: Crawl, wget: Run, root: Path) -> tuple[int, int, int, int]:
    """What the defaults' soft-404 judgement made of a catch-all's answers: real pages
    judged soft_404 (false), made-up ones judged so (true), made-up ones taken for
    pages (missed); and wget's pages not reached. Printed, and returned in that order."""
    real = {u for u in c.ok_pages if page_file(root, u).is_file()}
    made_up = set(c.ok_pages) - real
    false = sorted(u for u in real if c.ok_pages[u] == "soft_404")
    true = sorted(u for u in made_up if c.ok_pages[u] == "soft_404")
    missed = sorted(u for u in made_up if c.ok_pages[u] != "soft_404")
    reached = {unquote(u.split("://", 1)[1].partition("/")[2].partition("?")[0])
               for u in real}
    lost = {p for p in wget.pages if p.lstrip("/") not in reached
            and (p.lstrip("/") + "index.html") not in reached}
    print(f"    catch-all: {len(real)} real pages answered, {len(made_up)} made-up paths "
          f"answered 200 (the tree's broken links, the probes); soft_404: {len(true)} of "
          f"the made-up, {len(false)} real (false); made-up pages taken for real: "
          f"{len(missed)}; wget's pages not reached: {len(lost)}")
    for u in false:
        print(f"    FALSE soft_404: {u}")
    if missed:
        print(f"    made-up, not judged: {site_bench.examples(set(missed))}")
    if lost:
        print(f"    not reached: {site_bench.examples(lost)}")
    return len(false), len(true), len(missed), len(lost)


# -- why a page was judged ----------------------------------------------------------------


def page_file(root: Path, url: str) -> Path:
    path = unquote(url.split("://", 1)[1].partition("/")[2].partition("?")[0])
    f = root / path
    return f / "index.html" if f.is_dir() or path.endswith("/") or not path else f


_FINGERPRINTS: dict[tuple[Path, str], tuple[int | None, str]] = {}


def fingerprint(root: Path, url: str) -> tuple[int | None, str]:
    """A page's near-duplicate fingerprint as the consumer makes it (its links as the
    links handler finds them, its text), and its title; each page's once."""
    key = (root, url)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = _fingerprint(root, url)
    return _FINGERPRINTS[key]


def _fingerprint(root: Path, url: str) -> tuple[int | None, str]:
    from selectolax.lexbor import LexborHTMLParser  # noqa: PLC0415

    body = page_file(root, url).read_bytes()
    tree = LexborHTMLParser(body, encoding=True)
    urls = extract_links(tree, url, 10_001)
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node is not None else ""
    return simhash.fingerprint(simhash.page_text(tree), link_features(urls, shape(url))), title


def nearest(root: Path, url: str, pages: set[str], origin: str) -> str:
    """The page of `url`'s shape nearest to it among `pages` (URI paths), by the
    consumer's fingerprint: what its near-duplicate verdict was likely against."""
    fp, title = fingerprint(root, url)
    if fp is None:
        return f"{title!r}: no fingerprint (too few words)"
    best: tuple[int, str, str] | None = None
    for uri in pages:
        other = origin + uri
        if other == url or shape(other) != shape(url):
            continue
        ofp, otitle = fingerprint(root, other)
        if ofp is not None and (best is None or simhash.distance(fp, ofp) < best[0]):
            best = (simhash.distance(fp, ofp), uri, otitle)
    if best is None:
        return f"{title!r}: no other page of its shape {shape(url)}"
    return f"{title!r}, {best[0]} bits from {best[1]} ({best[2]!r}), shape {shape(url)}"


# -- reporting ----------------------------------------------------------------------------


def show(c: Crawl, wget: Run, root: Path, origin: str) -> None:
    run = c.run
    statuses = Counter(h.status for h in run.hits)
    print(f"  {c.label:18} {len(c.pages):5d} pages  {len(run.hits):5d} requests "
          f"({', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))})  "
          f"CPU {1e3 * c.cpu_per_page:5.2f} ms/page  span {run.span:6.2f} s")
    print(f"    outcomes: {', '.join(f'{k} {v}' for k, v in c.outcomes.most_common())}")
    if c.traps:
        print(f"    trap tallies: {', '.join(f'{k} {v}' for k, v in sorted(c.traps.items()))}")
    print(f"    probes ({len(c.probes)}): {', '.join(c.probes) or 'none'}")
    probed = {p.split()[0] for p in c.probes}
    missing, extra = wget.pages - c.pages, c.pages - wget.pages - probed
    print("    vs wget: " + "; ".join(
        [f"not reached {len(missing)}: {site_bench.examples(missing)}"] * bool(missing)
        + [f"beyond wget's {len(extra)}: {site_bench.examples(extra)}"] * bool(extra)
        or ["same pages"]))
    if c.items is not None:
        keys = {unquote(k.split("://", 1)[-1].partition("/")[2].partition("?")[0])
                for k in c.items}
        lost = {p for p in c.pages if p.lstrip("/") not in keys}
        print(f"    items {len(c.items)} for {len(c.pages)} pages"
              + (f": pages without an item {len(lost)}: {site_bench.examples(lost)}"
                 if lost else " (an item for every page)"))
    made_up: Counter[str] = Counter()
    for url, outcome in sorted(c.judged.items()):
        if not page_file(root, url).is_file():  # a broken link behind a catch-all
            made_up[outcome] += 1
            continue
        why = nearest(root, url, c.pages, origin) if outcome == "near_duplicate" else ""
        print(f"    {outcome} (a real page): {url}  {why}")
    for outcome, n in made_up.items():
        urls = {u for u, o in c.judged.items() if o == outcome
                and not page_file(root, u).is_file()}
        print(f"    {outcome}, no such file: {n}: {site_bench.examples(urls, 3)}")
    if c.note:
        print(f"    note: {c.note}")


@dataclass
class TreeResult:
    tree: Tree
    files: int
    wget: Run
    runs: dict[str, list[Crawl]]
    spider: Crawl | None
    catch_all: tuple[int, int, int, int] | None  # false, true, missed soft 404s; lost


def paired_ratio(runs: dict[str, list[Crawl]], name: str) -> float:
    """The median over the rounds of `name`'s CPU per page over all off's in its round
    (they ran at once)."""
    ratios = [c.cpu_per_page / o.cpu_per_page
              for c, o in zip(runs[name], runs["all off"], strict=True) if o.cpu_per_page]
    return statistics.median(ratios) if ratios else 0.0


def median_cpu(crawls: list[Crawl]) -> float:
    return statistics.median(c.cpu_per_page for c in crawls) if crawls else 0.0


def summary(results: list[TreeResult]) -> None:
    print("\n== summary ==")
    print("| tree | .html files | wget pages | crawlq pages (defaults / near-dup 3 / all off)"
          " | not reached (defaults / near-dup 3) | spider items / pages | soft_404 "
          "(defaults / near-dup 3) | near_duplicate (defaults / near-dup 3) | probes | "
          "consumer CPU ms/page (defaults / near-dup 3 / all off) | defaults / all off | "
          "near-dup 3 / all off | catch-all: soft_404 real (false) / made-up (true) / "
          "made-up not judged / not reached |")
    print("| --- " * 13 + "|")
    for r in results:
        w = r.wget.pages
        first = {name: runs[0] for name, runs in r.runs.items()}
        pages = " / ".join(str(len(c.pages)) for c in first.values())
        judged = ["defaults", "near-dup 3"]
        lost = " / ".join(str(max(len(w - c.pages) for c in r.runs[n])) for n in judged)
        soft, near = (" / ".join(str(max(c.outcomes[k] for c in r.runs[n])) for n in judged)
                      for k in JUDGED)
        probes = first["defaults"].outcomes["probe"]
        cpu = {n: median_cpu(runs) for n, runs in r.runs.items()}
        ratio = {n: paired_ratio(r.runs, n) for n in cpu}
        spider = (f"{len(r.spider.items or ())} / {len(r.spider.pages)}"
                  if r.spider is not None else "-")
        print(f"| {r.tree.name} ({r.tree.generator}) | {r.files} | {len(w)} | {pages} | "
              f"{lost} | {spider} | {soft} | {near} | {probes} | "
              f"{' / '.join(f'{1e3 * v:.2f}' for v in cpu.values())} | "
              f"{ratio['defaults']:.2f} | {ratio['near-dup 3']:.2f} | "
              f"{' / '.join(map(str, r.catch_all)) if r.catch_all else '-'} |")
    for r in results:
        runs = r.runs
        if "all off" not in runs or len(runs["all off"]) < 2:
            continue
        print(f"\n{r.tree.name}: consumer CPU per page over {len(runs['all off'])} rounds "
              "(median, range), and over all off's:")
        off = median_cpu(runs["all off"])
        for name, crawls in runs.items():
            values = [1e3 * c.cpu_per_page for c in crawls]
            paired = paired_ratio(runs, name)
            ok = "OK" if paired <= TARGET_CPU else "MISSED"
            target = f"   target <= {TARGET_CPU:.2f}: {ok}" if name == "defaults" else ""
            print(f"  {name:12} {statistics.median(values):5.2f} ms "
                  f"({min(values):.2f}-{max(values):.2f}), {median_cpu(crawls) / off:4.2f} x "
                  f"all off's median; its round's all off, median {paired:4.2f} x{target}")


def bench_tree(tree: Tree, rounds: int, args: argparse.Namespace, workdir: Path,
               redis_server: RedisServer) -> TreeResult:
    root = ensure_tree(tree)
    files = sum(1 for _ in root.rglob("*.html"))
    d = workdir / tree.name
    d.mkdir()
    port, log_path = start_nginx(root, d, site_bench.NGINX_HTTP)
    env = Env(args, root, port, AccessLog(log_path), d, redis_server, {})
    origin = f"http://127.0.0.1:{port}"
    print(f"\n== {tree.name} ({tree.generator}): {root}, {files} .html files, "
          f"{origin}/index.html ==", flush=True)
    wget = site_bench.run_wget(env)
    print(f"  {'wget -r -l inf':18} {len(wget.pages):5d} pages  {len(wget.hits):5d} requests  "
          f"span {wget.span:6.2f} s" + (f"  {wget.note}" if wget.note else ""), flush=True)
    runs: dict[str, list[Crawl]] = {name: [] for name, _ in VARIANTS}
    for n in range(rounds):
        print(f"  -- round {n + 1} of {rounds}: the three variants at once --")
        for c in run_links(env, list(VARIANTS), n):
            runs[c.label].append(c)
            show(c, wget, root, origin)
        sys.stdout.flush()
    spider = None
    if not args.skip_spider:
        spider = run_spider(env, 0)
        show(spider, wget, root, origin)
    catch_all = None
    if not args.skip_catch_all:
        port2, log2 = start_catch_all(root, d / "catch-all")
        env2 = Env(args, root, port2, AccessLog(log2), d, redis_server, {})
        [c] = run_links(env2, [("catch-all", {})], rounds)
        show(c, wget, root, f"http://127.0.0.1:{port2}")
        catch_all = show_catch_all(c, wget, root)
    return TreeResult(tree, files, wget, runs, spider, catch_all)


def bench(args: argparse.Namespace, workdir: Path) -> int:
    if shutil.which("wget") is None:
        apt_install("wget")
    chosen = [t for t in TREES if t.name in args.trees.split(",")]
    if not chosen:
        raise SystemExit(f"--trees: none of {args.trees!r} is one of "
                         f"{', '.join(t.name for t in TREES)}")
    redis_server = RedisServer().start()
    print(f"redis-server {'.'.join(map(str, redis_server.version()))}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; per-host concurrency {args.per_host_concurrency}, "
          f"concurrency {args.concurrency}; policy {BASE} + each variant's values")
    started = time.monotonic()
    try:
        results = [bench_tree(t, args.rounds if i == 0 else args.other_rounds, args, workdir,
                              redis_server)
                   for i, t in enumerate(chosen)]
    finally:
        redis_server.stop()
    summary(results)
    print(f"\n(trees done in {time.monotonic() - started:.0f} s wall)")
    if not args.skip_spider_bench:
        import spider_bench  # noqa: PLC0415

        print("\n== bench/spider_bench.py (python3-doc) ==", flush=True)
        spider_bench.main(["--per-host-concurrency", "16", "--rounds", str(args.spider_rounds),
                           "--variant", "defaults", "--variant", "near_duplicate_distance=3",
                           "--variant", "near_duplicate_distance=off,soft_404=false"]
                          + (["--skip-scrapy"] if args.skip_scrapy else []))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--trees", default=",".join(t.name for t in TREES),
                   help="which trees, comma-separated (the first gets --rounds)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds of the three crawlq variants on the first tree")
    p.add_argument("--other-rounds", type=int, default=1,
                   help="rounds of the three crawlq variants on each other tree")
    p.add_argument("--per-host-concurrency", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="stop a run (and report it) after this many seconds")
    p.add_argument("--skip-spider", action="store_true", help="no item-per-page spider")
    p.add_argument("--skip-catch-all", action="store_true",
                   help="no crawl of each tree behind a catch-all (missing paths 200)")
    p.add_argument("--skip-spider-bench", action="store_true",
                   help="don't run bench/spider_bench.py at the end")
    p.add_argument("--spider-rounds", type=int, default=3, help="spider_bench's --rounds")
    p.add_argument("--skip-scrapy", action="store_true",
                   help="spider_bench without its Scrapy run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_in_workdir("crawlq-tree-bench-", lambda workdir: bench(args, workdir),
                          site_bench.stop_all)


if __name__ == "__main__":
    sys.exit(main())
