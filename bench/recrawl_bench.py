"""Recrawls that cost little (issue 26): two passes over a real site, and freshness under
a fixed budget, crawlq's adaptive revisit schedule beside a fixed round-robin.

    python bench/recrawl_bench.py [--part site|sim|both] [--root DIR] [--interval 20]
                                  [--recrawl schedule|window] [--no-recrawl-known]
                                  [--pages 200] [--budget 4] [--day 60] [--days 8]
                                  [--warmup 3] [--seed 1] [--dist loguniform|static|both]
                                  [--strategies adaptive,fixed,learned] [--model-only]
    python bench/recrawl_bench.py --quick         # both parts, about 8 minutes
    python bench/recrawl_bench.py --self-check    # the simulator and the freshness
                                                  # computation alone, no crawlq

Every policy option the bench sets is in ``SITE_POLICY``, ``SIM_POLICY`` and
``STRATEGIES`` at the top of this file (and the outcome names in ``OUTCOMES``): if the
feature's final names differ, that is where they change. ``crawlq crawl create``
refusing one stops the bench with its message.

**1. Two passes over a real site.** An nginx the bench starts on a free 127.0.0.1 port
serves Debian's python3-doc (``/usr/share/doc/python3-doc/html``, apt-get installed
when missing; or ``--root``) with its validators on (nginx's defaults: an ETag and a
Last-Modified on every static file, 304 to a matching ``If-None-Match`` /
``If-Modified-Since``). A fresh crawl (its own redis-server) is made with ``crawlq crawl
create`` (``SITE_POLICY``: revisits on, fixed, ``recrawl_after`` = ``--interval``), the
producer enqueues ``index.html``, and one consumer follows links (``--handler
consumer.handlers:links``). Pass 1 is that crawl until empty. Pass 2: once the interval
has passed after pass 1's last request, a fresh consumer is started, and nothing else: no
producer runs, the revisits come back by themselves (the consumer's reaper promotes
them). How a pass ends, either way ``--exit-when-empty`` treats scheduled revisits: the
consumer (pass 1 with ``--exit-when-empty --empty-grace 0``, pass 2 without) is stopped
with SIGTERM once the requests at nginx have not grown for ``--quiet`` seconds (2) and
the queue's stats show nothing pending or leased (a consumer that exits by itself ends
its pass too). Figures per pass, from nginx's access log (status, ``$body_bytes_sent``,
``$bytes_sent``, whether the request was conditional, URI): pages (distinct HTML URIs
answered 200 or 304), requests per status, bytes received (bodies; and all bytes,
headers included), span (start of the first request to the end of the last); the pass 2
outcomes from nginx (304 / 200) and from the consumers' JSONL records (``outcome``
counted) and ``crawlq stats``. Targets: pass 2 finds pass 1's pages, >= 95% of them
``not_modified``, pass 2's bytes <= 10% of pass 1's, pass 2's span <= pass 1's.
``--recrawl window`` recrawls by the window (issues 34 and 43): ``WINDOW_POLICY``,
``recrawl_after`` alone, no ``revisit`` option, over a copy of the tree; between the
passes one page changes to link to a page added beside it (``CHANGED_PAGE``) and another
is deleted (``DELETED_PAGE``; the pages linking to it stay as they were); pass 2 is a
producer run of the start page alone, as a producer on a schedule would re-seed the
crawl, once the window has passed (which brings back every known URL past the window
from the crawl's history), then a link-following consumer until the crawl is empty.
Targets: every page of pass 1 reached (answered 304, 200 or 404), >= 95% of them 304,
pass 2's bytes <= 10% of pass 1's, the changed page fetched whole, the added page found,
the deleted one ending ``gone``. ``--no-recrawl-known`` runs pass 2's producer with that
flag: the seed alone, as a re-seeded crawl recrawled before issue 43 (its targets miss).

**2. A change simulator.** A local aiohttp server (a child process, as pushback_bench's)
on 127.0.0.1 serves ``--pages`` N pages ``/p/<i>`` (default 200). Page i changes as a
Poisson process of rate lambda_i per simulated day, its change times drawn in advance
from ``--seed``; the rates (``--dist``, each in turn with ``both``): log-uniform over
[``--rate-min``, ``--rate-max``] (0.05 .. 500 a day: four orders of magnitude), or mostly
static, what sites look like (``MOSTLY_STATIC``: 80% never change, 15% change 0.5..2
times a day, 5% 12..48 times a day). A simulated day is ``--day`` real seconds (60): the
rates and the policy's intervals (``STRATEGIES``, in days) are scaled by the same factor.
Each answer carries the ETag (``"<i>-<version>"``) and Last-Modified of the page's
current version and is a 304 to a matching ``If-None-Match`` (else
``If-Modified-Since``); the body holds the version, so its digest changes with it. The
server notes every fetch: its time, the page, the version it served (or confirmed with
its 304) and the status. Runs, each a fresh crawl and a fresh server with the same seed,
``--days`` simulated days each (8), one host, the same fetch budget of ``--budget`` B
fetches/s (the policy's ``per_host_delay`` = 1/B, ``per_host_concurrency`` 1): crawlq
``revisit=adaptive`` (Nutch's AdaptiveFetchSchedule: x1.4 when unchanged, x0.8 when
changed, clamped), crawlq ``revisit=fixed`` with ``recrawl_after`` = N/B seconds (a
round-robin: the same budget) and crawlq ``revisit=learned`` with ``recrawl_after`` = N/B
(its budget: what the round-robin spends; each URL's interval from its estimated change
rate, lib/revisits.lua); ``--strategies`` picks some. One consumer, no link following;
the producer enqueues the N URLs.

**Freshness**: over the window after ``--warmup`` simulated days (3), for each page the
share of the time during which the version its latest fetch got equals its current
version (stale before its first fetch), averaged over pages. Printed side by side:
freshness (overall and per quarter of the pages by change rate), fetches/s each used,
the share of 304s, the revisit lateness p50/p99 when ``crawlq stats --json`` has any
field with ``late`` in its name, and the analytic freshness of the fixed round-robin,
mean of (1 - e^(-lambda I)) / (lambda I) with I = N/B, as a check of the instrument;
beside them **model adaptive** and **model learned**: the same schedules and budget run
as models without crawlq (one fetch at most every 1/B s, the earliest due first,
``STRATEGIES``' values; learned mirrors lib/revisits.lua's estimator, interval and
price, with each change's Last-Modified to the exact time where crawlq's has whole
seconds), each policy's own ceiling here; **model informed**: learned's interval and
price told each page's true rate, so that the oracle's lead over learned splits into
what the observations do not tell (informed - learned) and what learning the price in
the run's days costs (oracle - informed); and the **oracle**: the best any schedule can
do at this budget knowing each page's true rate (Cho and Garcia-Molina's optimal refresh
allocation, 2003, in expectation), the ceiling of every schedule that must learn the
rates. Under each
column, the fetches/s a round-robin needs for that freshness (the analytic curve,
inverted) and the share of them the column saves: **fetches saved at equal freshness**.
``--model-only`` prints the analytic, model and oracle columns alone (seconds, no
crawlq). Targets: adaptive and learned >= fixed at equal budget on both distributions;
learned within 2 points of the oracle on the log-uniform one, and >= 50% fewer fetches
than fixed at equal freshness on the mostly static one. (With log-uniform rates over four
orders of magnitude the oracle itself is only 4-8 points above the round-robin at any
budget; under a budget that binds, Nutch's multipliers let the pages that change fastest
shrink to ``min_interval`` and take the budget, as Cho and Garcia-Molina found of
proportional revisiting.)

``--self-check`` runs the simulator against a tiny client of the bench's own (one
aiohttp session fetching the pages round-robin at B/s on a fixed tick, sending the
ETag it holds) and checks that the measured freshness is within 3 points of the
analytic one: the server, its change schedule and the freshness computation, without
crawlq. Every process the bench starts (nginx, redis-server, the server, consumers) is
stopped on exit, Ctrl-C included; a run not over after its timeout is stopped and said
so. Everything runs on 127.0.0.1. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import heapq
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchlib import (  # noqa: E402
    DOC_ROOT,
    add_server_args,
    doc_root,
    parse_with_profile,
    run_in_workdir,
    spawn,
    start_nginx,
    stop,
    stop_all,
    tail,
    wait_port,
)
from pushback_bench import crawlq_cmd  # noqa: E402
from site_bench import AccessLog, page_uri  # noqa: E402

from common.queue import CrawlQueue  # noqa: E402
from common.redis.server import RedisServer, free_port  # noqa: E402
from common.runtime import run_loop  # noqa: E402

# -- what the bench sets: every option name and value, in one place ---------------------
# Values are text in the flags' syntax; {name} is filled in at run time: {interval},
# {per_host} (part 1), {delay}, {round}, and any interval given in simulated days below
# as {days:X} (part 2), each formatted as a duration ("2500ms").

#: Part 1: the policy of the two-pass crawl of the doc tree.
SITE_POLICY = {
    "per_host_delay": "0",
    "per_host_concurrency": "{per_host}",
    "max_depth": "1000",
    "revisit": "fixed",
    "recrawl_after": "{interval}",
}
#: Part 1 with ``--recrawl window``: a recrawl window alone (no revisit option): pass 2
#: is the producer re-seeding the start page past the window.
WINDOW_POLICY = {k: v for k, v in SITE_POLICY.items() if k != "revisit"}
#: Part 2: what both strategies share (the budget: one fetch per 1/B s on the one host).
SIM_POLICY = {
    "per_host_delay": "{delay}",
    "per_host_concurrency": "1",
    "ignore_robots": "true",
}
#: Part 2: each strategy's options; {days:X} is X simulated days.
STRATEGIES = {
    "adaptive": {
        "revisit": "adaptive",
        "recrawl_after": "{days:1}",
        "min_interval": "{days:0.25}",
        "max_interval": "{days:16}",
        "interval_grow": "0.4",
        "interval_shrink": "0.2",
    },
    "fixed": {
        "revisit": "fixed",
        "recrawl_after": "{round}",  # N / B seconds: the round-robin that spends B
    },
    "learned": {
        "revisit": "learned",
        "recrawl_after": "{round}",  # the budget: what the round-robin spends
        "min_interval": "{days:0.1}",
        "max_interval": "{days:16}",
    },
}
#: Part 2's change-rate distributions (--dist): log-uniform over four orders of magnitude
#: (--rate-min..--rate-max), and what sites look like: the shares of pages that never
#: change, change about daily (0.5..2 a day, log-uniform) and about hourly (12..48 a day).
DISTS = ("loguniform", "static")
MOSTLY_STATIC = ((0.80, 1e-6, 1e-6), (0.15, 0.5, 2.0), (0.05, 12.0, 48.0))
#: The outcomes of a revisit, as the consumer's records name them.
OUTCOMES = ("not_modified", "unchanged", "changed")

TARGET_SAME_PAGES = True  # pass 2 finds pass 1's pages
TARGET_NOT_MODIFIED = 0.95  # share of pass 2's pages answered 304, at least
TARGET_BYTES = 0.10  # pass 2's bytes / pass 1's, at most
TARGET_ORACLE_POINTS = 2.0  # oracle - learned freshness on the log-uniform rates, at most
TARGET_SAVED = 0.50  # fetches learned saves against fixed at equal freshness (mostly static)
SELF_CHECK_POINTS = 3.0  # |measured - analytic| freshness of the round-robin, at most
STOP_GRACE_S = 25.0  # the consumer's --grace is 20 s by default
QUICK = {"interval": 15.0, "pages": 100, "day": 30.0, "days": 6.0, "warmup": 2.0}
FULL = {"interval": 20.0, "pages": 200, "day": 60.0, "days": 8.0, "warmup": 3.0}


def fmt_duration(seconds: float) -> str:
    """A duration in the flags' syntax, to the millisecond."""
    return f"{max(1, round(seconds * 1000))}ms"


def fill(policy: dict[str, str], values: dict[str, float], day: float = 0.0) -> list[str]:
    """``KEY=VALUE`` words of `policy` with its {placeholders} filled in."""
    words = []
    for key, template in policy.items():
        value = template
        if template.startswith("{days:") and template.endswith("}"):
            value = fmt_duration(float(template[6:-1]) * day)
        elif template.startswith("{") and template.endswith("}"):
            name = template[1:-1]
            value = fmt_duration(values[name]) if name in (
                "interval", "delay", "round") else f"{values[name]:g}"
        words.append(f"{key}={value}")
    return words


# -- crawlq, run as its commands --------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def run_cmd(what: str, argv: list[str], log: Path, timeout: float = 120.0) -> str:
    """Run one crawlq command to its end; SystemExit with its output if it fails."""
    with open(log, "wb") as fh:
        try:
            done = subprocess.run(argv, cwd=ROOT, env=child_env(), check=False,
                                  stdin=subprocess.DEVNULL, stdout=fh,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"crawlq {what} did not finish in {timeout:.0f} s:\n"
                             f"{tail(log)}") from None
    text = log.read_text(errors="replace")
    if done.returncode:
        hint = ""
        if what == "crawl create":
            hint = ("\n  the policy options the bench sets are at the top of "
                    f"{Path(__file__).name} (SITE_POLICY, SIM_POLICY, STRATEGIES): does "
                    "this crawlq have issue 26's revisit options under these names?")
        raise SystemExit(f"crawlq {what} exited {done.returncode}:\n{tail(log, 12)}{hint}")
    return text


def create_crawl(redis_url: str, crawl: str, words: list[str], workdir: Path) -> None:
    print(f"  crawlq crawl create {' '.join(words)}", flush=True)
    run_cmd("crawl create", crawlq_cmd("console.cli", "crawl", "create", "--redis-url",
                                       redis_url, "--crawl", crawl, *words),
            workdir / f"{crawl}-create.log")


def produce(redis_url: str, crawl: str, urls: list[str], workdir: Path,
            *extra: str) -> dict[str, Any]:
    """A producer run of `urls`: its --json summary."""
    path = workdir / f"{crawl}-urls.txt"
    path.write_text("".join(u + "\n" for u in urls))
    out = run_cmd("producer", crawlq_cmd("producer", "--redis-url", redis_url, "--crawl",
                                         crawl, "--allow-private", "--progress", "off",
                                         "--json", *extra, str(path)),
                  workdir / f"{crawl}-producer.log")
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                return doc
    return {}


def start_consumer(redis_url: str, crawl: str, workdir: Path, name: str,
                   *extra: str) -> subprocess.Popen[bytes]:
    return spawn(crawlq_cmd(
        "consumer", "--redis-url", redis_url, "--crawl", crawl, "--worker-id", name,
        "--allow-private", "--http-port", "-1", "--sink", "jsonl",
        "--output", str(workdir / f"{crawl}-out"), "--log-level", "WARNING", *extra),
        log=workdir / f"{name}.log", env=child_env())


def stats_json(redis_url: str, crawl: str) -> dict[str, Any]:
    """``crawlq stats --json`` (empty when it fails)."""
    res = subprocess.run(crawlq_cmd("console.cli", "stats", "--json", "--redis-url",
                                    redis_url, "--crawl", crawl), cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, check=False, timeout=60)
    with contextlib.suppress(ValueError):
        doc = json.loads(res.stdout)
        if isinstance(doc, dict):
            return doc
    return {}


async def _queue_state(url: str, crawl: str) -> tuple[int, int, int]:
    import redis.asyncio  # noqa: PLC0415

    client = redis.asyncio.Redis.from_url(url)
    try:
        s = await (await CrawlQueue.existing(client, crawl)).stats()
    finally:
        await client.aclose()
    return s.pending, s.leased, s.waiting


def queue_state(url: str, crawl: str) -> tuple[int, int, int]:
    """pending, leased, waiting of the crawl."""
    return run_loop(_queue_state(url, crawl))


def revisit_fields(doc: Any, path: str = "") -> dict[str, Any]:
    """Every field of `doc` whose name says revisit, lateness or an outcome."""
    found: dict[str, Any] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            name = f"{path}.{k}" if path else str(k)
            if isinstance(v, dict | list):
                found.update(revisit_fields(v, name))
            elif v and any(w in str(k).lower() for w in (
                    "revisit", "late", "recrawl", "schedul", "due", *OUTCOMES)):
                found[name] = v
    return found


def lateness_fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in revisit_fields(doc).items() if "late" in k.lower()}


def jsonl_outcomes(out: Path, since: float = 0.0) -> Counter[str]:
    """Outcomes of the consumers' records fetched at or after `since` (unix seconds)."""
    outcomes: Counter[str] = Counter()
    for path in sorted(out.glob("*.jsonl")) if out.exists() else []:
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if float(rec.get("fetched_at") or 0) >= since:
                    outcomes[str(rec.get("outcome"))] += 1
    return outcomes


# -- part 1: two passes over python3-doc --------------------------------------------------------

#: recrawl_bench's part of nginx's http block: the access log it reads ({log}), the types,
#: validators on (nginx's defaults, said out loud).
NGINX_HTTP = """\
    log_format recrawl '$msec\\t$request_time\\t$status\\t$body_bytes_sent\\t$bytes_sent\\t'
                       '$http_if_none_match\\t$http_if_modified_since\\t$request_uri';
    access_log {log} recrawl;
    types {
        text/html html htm;
        text/css css;
        application/javascript js;
        image/png png;
        image/svg+xml svg;
        text/plain txt py inv;
    }
    default_type application/octet-stream;
    etag on;
    if_modified_since exact;
    sendfile on;
    tcp_nopush on;"""


@dataclass(frozen=True, slots=True)
class Hit:
    """One access-log line."""

    start: float  # $msec - $request_time (unix seconds)
    end: float  # $msec
    status: int
    body: int  # $body_bytes_sent
    sent: int  # $bytes_sent: headers included
    conditional: bool  # it carried If-None-Match or If-Modified-Since
    uri: str


def parse_line(line: str) -> Hit | None:
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 8:
        return None
    msec, rt, status, body, sent, inm, ims, uri = parts
    end = float(msec)
    return Hit(end - float(rt), end, int(status), int(body), int(sent),
               inm != "-" or ims != "-", uri)


@dataclass
class Pass:
    label: str
    hits: list[Hit] = field(default_factory=list)
    ended: str = ""  # how the pass ended
    wall_s: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)  # from the JSONL records
    notes: list[str] = field(default_factory=list)

    @property
    def pages(self) -> set[str]:
        return {u for h in self.hits if h.status in (200, 304) and (u := page_uri(h.uri))}

    @property
    def not_modified(self) -> set[str]:
        return {u for h in self.hits if h.status == 304 and (u := page_uri(h.uri))}

    @property
    def span(self) -> float:
        return (max(h.end for h in self.hits) - min(h.start for h in self.hits)
                if self.hits else 0.0)

    @property
    def body_bytes(self) -> int:
        return sum(h.body for h in self.hits)

    @property
    def sent_bytes(self) -> int:
        return sum(h.sent for h in self.hits)


def until_quiet(proc: subprocess.Popen[bytes], log: AccessLog, offset: int,
                state: Callable[[], tuple[int, int, int]], *, quiet: float,
                timeout: float) -> str:
    """Wait until `proc` exits, or the access log has not grown for `quiet` seconds
    (after at least one request) and `state()` shows nothing pending or leased; stop it
    (SIGTERM) then. Says how it ended. Stopped at `timeout` too, or after 5 x `quiet`
    seconds without a request whatever the stats say (said so)."""
    started = time.monotonic()
    size, grew = offset, started
    while True:
        if proc.poll() is not None:
            return f"the consumer exited by itself ({proc.returncode})"
        now = time.monotonic()
        if (n := log.size()) != size:
            size, grew = n, now
        if size > offset and now - grew >= quiet:
            pending, leased, waiting = state()
            if pending == 0 and leased == 0:
                stop([proc], STOP_GRACE_S)
                return (f"no request for {quiet:g} s and nothing pending or leased (waiting "
                        f"{waiting}): the consumer was stopped (exit {proc.returncode})")
            if now - grew >= 5 * quiet:
                stop([proc], STOP_GRACE_S)
                return (f"no request for {5 * quiet:g} s but stats show pending {pending}, "
                        f"leased {leased}: stopped anyway (are scheduled revisits counted as "
                        f"pending?)")
        if now - started > timeout:
            stop([proc], STOP_GRACE_S)
            return f"TIMED OUT after {timeout:.0f} s: stopped, figures are partial"
        time.sleep(0.25)


def run_pass(label: str, proc: subprocess.Popen[bytes], log: AccessLog,
             state: Callable[[], tuple[int, int, int]], args: argparse.Namespace) -> Pass:
    offset, started = log.size(), time.monotonic()
    p = Pass(label)
    p.ended = until_quiet(proc, log, offset, state, quiet=args.quiet, timeout=args.timeout)
    p.wall_s = time.monotonic() - started
    time.sleep(0.05)  # nginx logs a request as its answer goes out
    p.hits, _ = log.read(offset)
    return p



#: ``--recrawl window``: the page changed between the passes to link to a page added
#: then, and the page deleted then (pass 1's page at the middle and the third of its
#: sorted pages when the tree has not these).
CHANGED_PAGE, DELETED_PAGE = "/library/json.html", "/library/zipapp.html"
ADDED_NAME = "recrawl-bench-added.html"


@dataclass(frozen=True, slots=True)
class Edits:
    """What changed in the served copy between the passes (URIs)."""

    changed: str
    added: str
    deleted: str


def edit_site(served: Path, pages: set[str]) -> Edits:
    """Between the passes: a page of pass 1 changes, linking to a page added beside it,
    and another is deleted (the pages that link to it stay as they were)."""
    ordered = sorted(p for p in pages if p.endswith(".html") and p != "/index.html")
    changed = CHANGED_PAGE if CHANGED_PAGE in pages else ordered[len(ordered) // 2]
    deleted = DELETED_PAGE if DELETED_PAGE in pages else ordered[len(ordered) // 3]
    added = changed.rsplit("/", 1)[0] + "/" + ADDED_NAME
    page = served / changed.lstrip("/")
    text = page.read_text(errors="replace")
    link = f'<p><a href="{ADDED_NAME}">a page added between the passes</a></p>'
    page.write_text(text.replace("</body>", link + "</body>", 1) if "</body>" in text
                    else text + link)
    (served / added.lstrip("/")).write_text(
        "<html><head><title>added</title></head><body><p>A page added between the "
        "passes of recrawl_bench.</p></body></html>")
    (served / deleted.lstrip("/")).unlink()
    return Edits(changed, added, deleted)


def jsonl_outcome_of(out: Path, uri: str, since: float) -> str | None:
    """The outcome of the record of the URL ending in `uri` fetched at or after `since`."""
    for path in sorted(out.glob("*.jsonl")) if out.exists() else []:
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if (str(rec.get("url", "")).endswith(uri)
                        and float(rec.get("fetched_at") or 0) >= since):
                    return str(rec.get("outcome"))
    return None


def part_site(args: argparse.Namespace, workdir: Path) -> bool:
    root = doc_root(args.root)
    window = args.recrawl == "window"
    served = root
    if window:  # a copy: pages change, appear and go between the passes
        served = workdir / "site"
        shutil.copytree(root, served, ignore_dangling_symlinks=True)
        workdir.chmod(0o755)  # mkdtemp's 0700 keeps nginx's workers out
    port, log_path = start_nginx(served, workdir, NGINX_HTTP)
    log = AccessLog(log_path, parse_line)
    redis = RedisServer().start()
    try:
        crawl = f"recrawl-site-{int(time.time())}"
        url = f"http://127.0.0.1:{port}/index.html"
        print(f"\n== part 1: two passes over {root} (nginx on 127.0.0.1:{port}, one "
              f"consumer, " + (f"recrawl window {args.interval:g} s, no revisit option: "
                               f"pass 2 is a producer run of the start page alone, as one "
                               f"on a schedule" if window else
                               f"revisit interval {args.interval:g} s") + ")", flush=True)
        create_crawl(redis.url, crawl, fill(WINDOW_POLICY if window else SITE_POLICY, {
            "interval": args.interval, "per_host": args.per_host_concurrency}), workdir)
        produce(redis.url, crawl, [url], workdir)

        def state() -> tuple[int, int, int]:
            return queue_state(redis.url, crawl)

        links = ["--handler", "consumer.handlers:links", "--concurrency", "64"]
        first = run_pass("pass 1", start_consumer(
            redis.url, crawl, workdir, "pass-1", *links, "--exit-when-empty",
            "--empty-grace", "0"), log, state, args)
        if not first.hits:
            raise SystemExit(f"pass 1 made no request ({first.ended}):\n"
                             f"{tail(workdir / 'pass-1.log', 12)}")
        p1_start, p1_end = min(h.start for h in first.hits), max(h.end for h in first.hits)
        if p1_end - p1_start > args.interval:
            first.notes.append(f"pass 1 took {p1_end - p1_start:.1f} s, longer than the "
                               f"interval: its first pages came due again during it "
                               f"(raise --interval)")
        due = p1_end + args.interval + 1.0
        print(f"  pass 1: {len(first.hits)} requests in {first.span:.1f} s; pass 2 starts "
              f"in {max(0.0, due - time.time()):.0f} s, when every page is due", flush=True)
        edits = edit_site(served, first.pages) if window else None
        time.sleep(max(0.0, due - time.time()))
        p2_wall = time.time()
        until_empty: tuple[str, ...] = ()
        produced = ""
        if window:  # a scheduled producer run: the start page alone, re-seeded
            run = produce(redis.url, crawl, [url], workdir, *(
                ("--no-recrawl-known",) if args.no_recrawl_known else ()))
            produced = (
                f"its producer run of the start page: recrawled {run.get('recrawled')}, "
                f"known URLs recrawled {run.get('recrawled_known')} (of "
                f"{run.get('known_scanned')} in the history)")
            until_empty = ("--exit-when-empty", "--empty-grace", "0")
        second = run_pass("pass 2", start_consumer(redis.url, crawl, workdir, "pass-2",
                                                   *links, *until_empty), log, state, args)
        if edits is not None:
            second.notes.append(produced)
            second.notes.append(f"between the passes: {edits.changed} changed to link to "
                                f"{edits.added}, {edits.deleted} deleted")
        if not second.hits and not window:
            second.notes.append("no revisit came back: is the revisit schedule on (stats "
                                "below), and does the consumer's reaper promote due URLs?\n"
                                + tail(workdir / "pass-2.log", 8))
        out = workdir / f"{crawl}-out"
        first.outcomes = jsonl_outcomes(out) - jsonl_outcomes(out, p2_wall)
        second.outcomes = jsonl_outcomes(out, p2_wall)
        doc = stats_json(redis.url, crawl)
        gone = None if edits is None else jsonl_outcome_of(out, edits.deleted, p2_wall)
    finally:
        redis.stop()
    return report_site(first, second, doc, args, edits=edits, gone=gone)


def report_site(first: Pass, second: Pass, doc: dict[str, Any],
                args: argparse.Namespace, *, edits: Edits | None = None,
                gone: str | None = None) -> bool:
    print()
    for p in (first, second):
        statuses = Counter(h.status for h in p.hits)
        print(f"{p.label}  {len(p.pages):5d} pages  {len(p.hits):5d} requests "
              f"({', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))}; conditional "
              f"{sum(h.conditional for h in p.hits)})  bodies {p.body_bytes / 1e6:8.3f} MB  "
              f"all bytes {p.sent_bytes / 1e6:8.3f} MB  span {p.span:6.2f} s  "
              f"({p.wall_s:.1f} s wall)")
        print(f"    ended: {p.ended}")
        print("    outcomes (JSONL records): " + (", ".join(
            f"{k} {v}" for k, v in p.outcomes.most_common()) or "none"))
        for note in p.notes:
            print(f"    {note}")
    fields = revisit_fields(doc)
    print("crawlq stats --json at the end: states " + ", ".join(
        f"{k} {v}" for k, v in doc.get("states", {}).items()) + (
        "; revisit fields: " + ", ".join(f"{k} {v}" for k, v in fields.items())
        if fields else "; no revisit fields"))
    n1 = len(first.pages)
    nm_nginx = len(second.not_modified & first.pages) / n1 if n1 else 0.0
    nm_rec = second.outcomes.get(OUTCOMES[0], 0) / n1 if n1 else 0.0
    ratio_b = second.body_bytes / first.body_bytes if first.body_bytes else 0.0
    ratio_s = second.sent_bytes / first.sent_bytes if first.sent_bytes else 0.0
    missing, extra = first.pages - second.pages, second.pages - first.pages
    timed_out = any("TIMED OUT" in p.ended for p in (first, second))
    reached = {u for h in second.hits if (u := page_uri(h.uri))}
    if edits is not None:  # pass 1's pages reached, whatever they answer now
        missing = first.pages - reached
        extra = reached - {u for h in first.hits if (u := page_uri(h.uri))} - {edits.added}
    checks: list[tuple[str, str, bool]] = [
        ("pass 2 reaches pass 1's pages", f"{len(first.pages & reached)} of {n1}"
         + (f" (missing e.g. {sorted(missing)[:3]})" if missing else "")
         + (f" (beyond: {sorted(extra)[:3]})" if extra else ""), not missing and not extra),
        (f"not_modified >= {100 * TARGET_NOT_MODIFIED:.0f}% of the pages",
         f"nginx 304s {100 * nm_nginx:.1f}%, records {100 * nm_rec:.1f}%",
         min(nm_nginx, nm_rec) >= TARGET_NOT_MODIFIED),
        (f"bytes pass 2 / pass 1 <= {100 * TARGET_BYTES:.0f}%",
         f"bodies {100 * ratio_b:.1f}%, all bytes {100 * ratio_s:.1f}%",
         ratio_s <= TARGET_BYTES),
        ("span pass 2 <= pass 1", f"{second.span:.2f} s vs {first.span:.2f} s",
         bool(second.hits) and second.span <= first.span),
    ]
    if edits is not None:
        changed = [h.status for h in second.hits if page_uri(h.uri) == edits.changed]
        added = [h.status for h in second.hits if page_uri(h.uri) == edits.added]
        checks += [
            ("a page changed between the passes", f"{edits.changed}: {changed}",
             changed == [200]),
            ("the page it added a link to is found", f"{edits.added}: {added}",
             added == [200]),
            ("a page deleted between the passes ends gone",
             f"{edits.deleted}: outcome {gone}", gone == "gone"),
        ]
    return print_checks("targets (part 1)", checks, timed_out)


def print_checks(title: str, checks: list[tuple[str, str, bool]], void: bool = False) -> bool:
    print(f"\n{title}:")
    for what, figure, good in checks:
        verdict = "n/a (timed out)" if void else ("OK" if good else "MISSED")
        print(f"  {what:<40} {figure:<56} {verdict}")
    return all(good for _, _, good in checks) and not void


# -- part 2: the change simulator ----------------------------------------------------------------


@dataclass
class Schedule:
    """Each page's change rate (per real second) and change times (real seconds after the
    server's start), drawn from the seed: the same for every run."""

    rates: list[float]
    changes: list[list[float]]

    @classmethod
    def make(cls, pages: int, *, seed: int, rate_min: float, rate_max: float, day: float,
             horizon: float, dist: str = "loguniform") -> Schedule:
        rng = random.Random(seed)
        if dist == "static":
            bands = [band for share, *band in MOSTLY_STATIC
                     for _ in range(round(share * pages))]
            bands = (bands + [bands[0]] * pages)[:pages]
            rng.shuffle(bands)
            per_day = [math.exp(rng.uniform(math.log(lo), math.log(hi))) for lo, hi in bands]
        else:
            per_day = [math.exp(rng.uniform(math.log(rate_min), math.log(rate_max)))
                       for _ in range(pages)]
        rates = [r / day for r in per_day]
        changes = []
        for i, rate in enumerate(rates):
            own = random.Random(f"{seed}-{i}")  # a page's times don't depend on the horizon
            times, t = [], own.expovariate(rate)
            while t <= horizon:
                times.append(t)
                t += own.expovariate(rate)
            changes.append(times)
        return cls(rates, changes)

    def version(self, page: int, t: float) -> int:
        return bisect.bisect_right(self.changes[page], t)


def sim_schedule(args: argparse.Namespace) -> Schedule:
    return Schedule.make(args.pages, seed=args.seed, rate_min=args.rate_min,
                         rate_max=args.rate_max, day=args.day, dist=args.dist,
                         horizon=args.days * args.day + 600.0)


def http_date(unix: float) -> str:
    return formatdate(int(unix), usegmt=True)


#: A fetch the server noted: time (s after its start), page, version, status.
Fetch = tuple[float, int, int, int]


async def serve(args: argparse.Namespace) -> dict[str, Any]:
    """Serve the pages until SIGTERM; returns the fetches."""
    from aiohttp import web  # noqa: PLC0415

    sched = sim_schedule(args)
    t0, wall0 = time.monotonic(), time.time()
    fetches: list[Fetch] = []
    filler = "<p>" + "lorem ipsum dolor sit amet " * 80 + "</p>"  # ~2 KB a page

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n")
        try:
            page = int(request.match_info["page"])
        except (KeyError, ValueError):
            page = -1
        if not 0 <= page < len(sched.changes):
            return web.Response(status=404, text="no such page")
        now = time.monotonic() - t0
        v = sched.version(page, now)
        etag = f'"{page}-{v}"'
        modified = int(wall0 + (sched.changes[page][v - 1] if v else -args.day))
        headers = {"ETag": etag, "Last-Modified": http_date(modified),
                   "Cache-Control": "no-cache"}
        inm, ims = request.headers.get("If-None-Match"), request.headers.get(
            "If-Modified-Since")
        if inm is not None:  # RFC 9110 13.2.2: If-None-Match first, IMS ignored then
            tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
            fresh = etag in tags or "*" in tags
        elif ims is not None:
            try:
                fresh = modified <= parsedate_to_datetime(ims).timestamp()
            except (TypeError, ValueError):
                fresh = False
        else:
            fresh = False
        fetches.append((round(now, 4), page, v, 304 if fresh else 200))
        if fresh:
            return web.Response(status=304, headers=headers)
        return web.Response(text=f"<html><head><title>page {page}</title></head><body>"
                            f"<h1>page {page}, version {v}</h1>{filler}</body></html>",
                            content_type="text/html", headers=headers)

    app = web.Application()
    app.router.add_get("/p/{page}", handle)
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024).start()
    print("ready", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    await stopping.wait()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(runner.cleanup(), 2)
    return {"t0": t0, "fetches": fetches}


def start_server(args: argparse.Namespace, workdir: Path, label: str,
                 port: int) -> tuple[subprocess.Popen[bytes], Path]:
    out = workdir / f"{label}-fetches.json"
    proc = spawn([sys.executable, __file__, "--serve", "--port", str(port), "--out", str(out),
                  "--pages", str(args.pages), "--seed", str(args.seed), "--rate-min",
                  str(args.rate_min), "--rate-max", str(args.rate_max), "--dist", args.dist,
                  "--day",
                  str(args.day), "--days", str(args.days)],
                 log=workdir / f"{label}-server.log")
    wait_port(port, proc, "the bench's server")
    return proc, out


def finish_server(proc: subprocess.Popen[bytes], out: Path) -> tuple[float, list[Fetch]]:
    stop([proc], 10)
    if not out.exists():
        raise SystemExit(f"the bench's server wrote no records (exit {proc.returncode})")
    data = json.loads(out.read_text())
    return float(data["t0"]), [(float(t), int(p), int(v), int(s))
                               for t, p, v, s in data["fetches"]]


def page_freshness(changes: list[float], fetched: list[float], w0: float, w1: float) -> float:
    """Share of [w0, w1] during which the page's latest fetch (sorted times) got its
    current version: from each fetch to the next fetch or the page's next change,
    whichever is first; stale before its first fetch."""
    fresh = 0.0
    for j, f in enumerate(fetched):
        nxt = fetched[j + 1] if j + 1 < len(fetched) else w1
        k = bisect.bisect_right(changes, f)
        change = changes[k] if k < len(changes) else math.inf
        a, b = max(f, w0), min(nxt, change, w1)
        if b > a:
            fresh += b - a
    return fresh / (w1 - w0)


def analytic_round_robin(rates: list[float], interval: float) -> list[float]:
    """Each page's expected freshness when fetched every `interval` seconds:
    (1 - e^(-lambda I)) / (lambda I)."""
    return [(1 - math.exp(-r * interval)) / (r * interval) for r in rates]


def _refresh_rate(rate: float, mu: float) -> float:
    """The refresh rate f that maximizes a page's freshness gain per fetch at the price
    `mu`: the root r = rate / f of 1 - e^-r (1 + r) = mu * rate (0 when mu * rate >= 1:
    the page changes too fast to be worth a fetch)."""
    c = mu * rate
    if c >= 1:
        return 0.0
    lo, hi = 1e-9, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - math.exp(-mid) * (1 + mid) < c else (lo, mid)
    return rate / lo


def oracle_optimum(rates: list[float], budget: float) -> list[float]:
    """Each page's expected freshness under the best any schedule can do at `budget`
    fetches/s knowing every page's true change rate (Cho and Garcia-Molina, "Effective
    page refresh policies", 2003: the Lagrangian optimum of sum (1 - e^(-lambda/f)) f /
    lambda subject to sum f = budget): a ceiling for crawlq's adaptive schedule, which
    must learn the rates."""
    lo, hi = 1e-12, 1e12
    for _ in range(200):
        mu = math.sqrt(lo * hi)
        lo, hi = (mu, hi) if sum(_refresh_rate(r, mu) for r in rates) > budget else (lo, mu)
    return [(1 - math.exp(-r / f)) * f / r if (f := _refresh_rate(r, mu)) > 0 else 0.0
            for r in rates]


def _strategy_values(name: str, sched: Schedule,
                     args: argparse.Namespace) -> tuple[float, float, float, float, float]:
    """STRATEGIES[name]'s first, min and max interval (s), grow and shrink."""
    from common.config import duration  # noqa: PLC0415

    values = {"delay": 1.0 / args.budget, "round": len(sched.rates) / args.budget}
    words = dict(w.split("=", 1) for w in fill(STRATEGIES[name], values, args.day))
    return (duration(words.get("recrawl_after", f"{args.day}s")),
            float(max(1, duration(words.get("min_interval", "60s")))),
            duration(words.get("max_interval", f"{1e9}s")),
            float(words.get("interval_grow", 0.4)), float(words.get("interval_shrink", 0.2)))


#: lib/revisits.lua's learned constants, as the model mirrors them.
LEARNED_DECAY = 0.9
PRICE_AT_FIRST = 1 - 2 / math.e


def _optimal_interval(rate: float, price: float) -> float | None:
    """lib/revisits.lua's optimal_interval: None when the page is not worth a visit."""
    c = price * rate
    if c >= 1:
        return None
    lo, hi = 0.0, 50.0
    for _ in range(48):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - math.exp(-mid) * (1 + mid) < c else (lo, mid)
    return (lo + hi) / 2 / rate


def _change_rate(visits: float, changes: float, covered: float, stayed: float | None,
                 first: float) -> float:
    """lib/revisits.lua's change_rate: from the seconds the page is known to have stayed
    as it was (Last-Modified) when there are, else from whether visits found it changed."""
    if stayed is not None:
        return (changes + 0.5) / (stayed + 0.5 * min(covered / visits, first))
    return -math.log((visits - changes + 0.5) / (visits + 1)) / (covered / visits)


def model_schedule(name: str, sched: Schedule,
                   args: argparse.Namespace) -> tuple[list[float], float]:
    """Each page's freshness under a model of crawlq's `name` schedule (adaptive or
    learned), no crawlq: one fetch at most every 1/B s, the earliest due first, the
    values of STRATEGIES[name]. Adaptive: the first interval ``recrawl_after``, then
    x(1 + grow) when the version is the one fetched last, x(1 - shrink) when not.
    Learned: lib/revisits.lua's estimator, optimal interval and price, one fetch at a
    time. Informed: learned's interval and price, told each page's true rate (no
    estimator): what learned could do if its observations told it everything.
    Clamped to [min_interval, max_interval]. What crawlq's run can be judged against: the
    policy's own ceiling at this budget. Returns each page's freshness and the fetches/s
    spent in the window."""
    learns = name in ("learned", "informed")
    first, low, high, grow, shrink = _strategy_values("learned" if learns else name, sched,
                                                      args)
    n = len(sched.rates)
    due = [(0.0, i) for i in range(n)]
    interval, last, at = [first] * n, [-1] * n, [0.0] * n
    est = [(0.0, 0.0, 0.0, 0.0)] * n
    price, demand, known = PRICE_AT_FIRST * first, 0.0, 0
    fetched: list[list[float]] = [[] for _ in range(n)]
    t, end = -1.0 / args.budget, args.days * args.day
    while t < end:
        due_at, i = heapq.heappop(due)
        t = max(t + 1.0 / args.budget, due_at)
        v = sched.version(i, t)
        old = interval[i] if last[i] >= 0 else 0.0
        if last[i] >= 0 and name == "learned":
            visits, changes, covered, stayed = est[i]
            elapsed = max(t - at[i], interval[i])
            # the server's Last-Modified dates each change: the page stayed as it is
            # since its latest one
            since = t - sched.changes[i][v - 1] if v != last[i] else elapsed
            est[i] = (visits * LEARNED_DECAY + 1, changes * LEARNED_DECAY + (v != last[i]),
                      covered * LEARNED_DECAY + elapsed,
                      stayed * LEARNED_DECAY + min(since, elapsed))
            interval[i] = min(high, max(low, _optimal_interval(
                _change_rate(*est[i], first), price) or high))
        elif last[i] >= 0 and name == "informed":
            interval[i] = min(high, max(low, _optimal_interval(sched.rates[i], price) or high))
        elif last[i] >= 0:
            interval[i] = min(high, max(low, interval[i] * (
                1 - shrink if v != last[i] else 1 + grow)))
        if learns:
            known += last[i] < 0
            demand = max(0.0, demand + 1 / interval[i] - (1 / old if old else 0.0))
            target = known / first
            if demand > 0:
                step = math.log(demand / target) * min(1.0, 1 / known)
                price *= math.exp(max(-0.5, min(0.5, step)))
        last[i], at[i] = v, t
        fetched[i].append(t)
        heapq.heappush(due, (t + interval[i], i))
    w0, w1 = args.warmup * args.day, end
    spent = sum(w0 <= f < w1 for page in fetched for f in page) / (w1 - w0)
    return [page_freshness(sched.changes[i], fetched[i], w0, w1) for i in range(n)], spent


def fixed_rate_for(freshness: float, rates: list[float]) -> float:
    """The fetches/s a round-robin needs to reach mean `freshness` over pages changing at
    `rates` (the analytic freshness, which falls as its interval grows)."""
    lo, hi = 1e-6, 1e9
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        fresh = statistics.fmean(analytic_round_robin(rates, mid))
        lo, hi = (mid, hi) if fresh >= freshness else (lo, mid)
    return len(rates) / lo


@dataclass
class SimRun:
    label: str
    start: float = 0.0  # when the client started, seconds after the server's start
    fetches: list[Fetch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lateness: dict[str, Any] = field(default_factory=dict)

    def figures(self, sched: Schedule, args: argparse.Namespace) -> SimFigures:
        w0 = self.start + args.warmup * args.day
        w1 = self.start + args.days * args.day
        by_page: list[list[float]] = [[] for _ in sched.rates]
        wrong = 0
        for t, page, v, _ in sorted(self.fetches):
            by_page[page].append(t)
            wrong += v != sched.version(page, t)
        inside = [f for f in self.fetches if w0 <= f[0] < w1]
        return SimFigures(
            [page_freshness(sched.changes[i], by_page[i], w0, w1)
             for i in range(len(sched.rates))],
            len(inside) / (w1 - w0) if w1 > w0 else 0.0,
            sum(f[3] == 304 for f in inside) / len(inside) if inside else 0.0,
            wrong)


@dataclass
class SimFigures:
    per_page: list[float]
    per_s: float  # fetches per second in the window
    share304: float
    wrong_versions: int  # fetches whose noted version disagrees with the schedule (0)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_page) if self.per_page else 0.0


def groups_of(sched: Schedule, dist: str, day: float) -> list[list[int]]:
    """The pages in groups by change rate, slowest first: four quarters, or the mostly
    static distribution's bands."""
    order = sorted(range(len(sched.rates)), key=lambda i: sched.rates[i])
    if dist == "static":
        bands = [[i for i in order if lo <= sched.rates[i] * day * (1 + 1e-9)
                  and sched.rates[i] * day <= hi * (1 + 1e-9)] for _, lo, hi in MOSTLY_STATIC]
        return [band for band in bands if band]
    n = len(order)
    return [order[q * n // 4:(q + 1) * n // 4] for q in range(4)]


async def round_robin(port: int, pages: int, budget: float, seconds: float) -> int:
    """The self-check's client: page n % N at t0 + n / B, sending the ETag it holds."""
    import aiohttp  # noqa: PLC0415

    etags: dict[int, str] = {}
    start, n = time.monotonic(), 0
    async with aiohttp.ClientSession() as session:
        while (due := start + n / budget) < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            page = n % pages
            headers = {"If-None-Match": etags[page]} if page in etags else {}
            async with session.get(f"http://127.0.0.1:{port}/p/{page}",
                                   headers=headers) as resp:
                await resp.read()
                etags[page] = resp.headers.get("ETag", "")
            n += 1
    return n


def run_self_check(args: argparse.Namespace, workdir: Path, sched: Schedule) -> SimRun:
    run = SimRun("self-check round-robin")
    proc, out = start_server(args, workdir, "self-check", port := free_port())
    began = time.monotonic()
    n = asyncio.run(round_robin(port, args.pages, args.budget, args.days * args.day))
    t0, run.fetches = finish_server(proc, out)
    run.start = began - t0
    run.notes.append(f"{n} fetches")
    return run


def run_strategy(args: argparse.Namespace, workdir: Path, name: str) -> SimRun:
    run = SimRun(f"crawlq {name}")
    port = free_port()
    redis = RedisServer().start()
    server: subprocess.Popen[bytes] | None = None
    try:
        crawl = f"recrawl-{name}-{int(time.time())}"
        values = {"delay": 1.0 / args.budget, "round": args.pages / args.budget}
        create_crawl(redis.url, crawl, fill(SIM_POLICY, values) + fill(
            STRATEGIES[name], values, args.day), workdir)
        server, out = start_server(args, workdir, name, port)
        produce(redis.url, crawl, [f"http://127.0.0.1:{port}/p/{i}"
                                   for i in range(args.pages)], workdir)
        began = time.monotonic()
        consumer = start_consumer(redis.url, crawl, workdir, f"{name}-consumer")
        end = began + args.days * args.day
        while time.monotonic() < end and consumer.poll() is None:
            time.sleep(0.5)
        if consumer.poll() is not None:
            run.notes.append(f"the consumer exited early, after "
                             f"{time.monotonic() - began:.0f} s ({consumer.returncode}):\n"
                             f"{tail(workdir / f'{name}-consumer.log', 8)}")
        doc = stats_json(redis.url, crawl)
        run.lateness = lateness_fields(doc)
        fields = revisit_fields(doc)
        run.notes.append("crawlq stats: states " + ", ".join(
            f"{k} {v}" for k, v in doc.get("states", {}).items()) + (
            "; revisit fields: " + ", ".join(f"{k} {v}" for k, v in fields.items())
            if fields else ""))
        stop([consumer], STOP_GRACE_S)
        outcomes = jsonl_outcomes(workdir / f"{crawl}-out")
        run.notes.append("outcomes (JSONL records): " + (", ".join(
            f"{k} {v}" for k, v in outcomes.most_common()) or "none"))
        t0, run.fetches = finish_server(server, out)
        server = None
        run.start = began - t0
    finally:
        if server is not None:
            stop([server])
        redis.stop()
    return run


def report_sim(runs: list[SimRun], sched: Schedule, args: argparse.Namespace) -> bool:
    interval = args.pages / args.budget
    analytic = analytic_round_robin(sched.rates, interval)
    figs = [r.figures(sched, args) for r in runs]
    groups = groups_of(sched, args.dist, args.day)
    print(f"\nover simulated days {args.warmup:g}..{args.days:g} of each run (a day = "
          f"{args.day:g} s); budget {args.budget:g} fetches/s; round-robin interval N/B = "
          f"{interval:g} s = {interval / args.day:.2f} day; rates: {args.dist}")
    models = {name: model_schedule(name, sched, args)
              for name in ("adaptive", "learned", "informed")}
    model_spent = [spent for _, spent in models.values()]
    oracle = oracle_optimum(sched.rates, args.budget)
    others = {"analytic round-robin": analytic, **{f"model {k}": v for k, (v, _) in
                                                   models.items()}, "oracle": oracle}
    names = [r.label for r in runs] + list(others)
    width = max(len(n) for n in names) + 2
    print(" " * 24 + "".join(n.rjust(width) for n in names))

    def row(what: str, cells: list[str]) -> None:
        print(what.ljust(24) + "".join(c.rjust(width) for c in cells))

    means = [f.mean for f in figs] + [statistics.fmean(x) for x in others.values()]
    row("freshness", [f"{100 * m:.1f}%" for m in means])
    for group in groups:
        lo, hi = (sched.rates[group[0]] * args.day, sched.rates[group[-1]] * args.day)
        row(f"  {lo:.3g}-{hi:.3g}/day", [
            f"{100 * statistics.fmean(f.per_page[i] for i in group):.1f}%" for f in figs]
            + [f"{100 * statistics.fmean(x[i] for i in group):.1f}%" for x in others.values()])
    spent = [f.per_s for f in figs] + [args.budget, *model_spent, args.budget]
    row("fetches/s", [f"{x:.2f}" for x in spent])
    needed = [fixed_rate_for(m, sched.rates) for m in means]
    row("fixed needs /s for it", [f"{x:.2f}" for x in needed])
    row("fetches saved vs fixed", [f"{100 * (1 - b / x):.0f}%"
                                   for b, x in zip(spent, needed, strict=True)])
    row("304 share", [f"{100 * f.share304:.1f}%" for f in figs] + ["-"] * len(others))
    row("lateness", [", ".join(f"{k} {v}" for k, v in r.lateness.items()) or "n/a"
                     for r in runs] + ["-"] * len(others))
    for r, f in zip(runs, figs, strict=True):
        if f.wrong_versions:
            r.notes.append(f"{f.wrong_versions} fetches noted a version the schedule "
                           f"disagrees with (a bug of the instrument)")
        for note in r.notes:
            print(f"  {r.label}: {note}")
    by = {r.label: f for r, f in zip(runs, figs, strict=True)}
    checks = []
    if "self-check round-robin" in by:
        diff = 100 * (by["self-check round-robin"].mean - statistics.fmean(analytic))
        checks.append(("self-check: measured ~ analytic", f"{diff:+.1f} points (within "
                       f"{SELF_CHECK_POINTS:g})", abs(diff) <= SELF_CHECK_POINTS))
    if "crawlq fixed" in by:
        diff = 100 * (by["crawlq fixed"].mean - statistics.fmean(analytic))
        print(f"  crawlq fixed vs analytic: {diff:+.1f} points (the instrument's check)")
        print(f"  the oracle's gain over the round-robin, the ceiling of any schedule at "
              f"this budget: {100 * (statistics.fmean(oracle) - statistics.fmean(analytic)):+.1f}"
              f" points")
        for name in ("crawlq adaptive", "crawlq learned"):
            if name in by:
                diff = 100 * (by[name].mean - by["crawlq fixed"].mean)
                checks.append((f"{name.split()[1]} >= fixed at equal budget",
                               f"{diff:+.1f} points", diff >= 0))
    if "crawlq learned" in by and args.dist == "loguniform":
        gap = 100 * (statistics.fmean(oracle) - by["crawlq learned"].mean)
        checks.append((f"learned within {TARGET_ORACLE_POINTS:g} points of the oracle",
                       f"{gap:.1f} points below", gap <= TARGET_ORACLE_POINTS))
    if "crawlq learned" in by and args.dist == "static":
        f = by["crawlq learned"]
        saved = 1 - f.per_s / fixed_rate_for(f.mean, sched.rates)
        checks.append((f"learned saves >= {100 * TARGET_SAVED:.0f}% at equal freshness",
                       f"{100 * saved:.0f}% fewer fetches", saved >= TARGET_SAVED))
    return print_checks(f"targets (part 2, {args.dist})", checks) if checks else True


def part_sim(args: argparse.Namespace, workdir: Path) -> bool:
    good = True
    for dist in DISTS if args.dist == "both" else (args.dist,):
        args.dist = dist
        good &= sim_one(args, workdir)
    return good


def sim_one(args: argparse.Namespace, workdir: Path) -> bool:
    sched = sim_schedule(args)
    total = sum(len(c) for c in sched.changes)
    rates = (f"{args.rate_min:g}..{args.rate_max:g}/day (log-uniform" if args.dist ==
             "loguniform" else ", ".join(f"{100 * share:.0f}% at {lo:g}..{hi:g}/day"
                                         for share, lo, hi in MOSTLY_STATIC) + " (mostly static")
    print(f"\n== part 2: {args.pages} pages changing at {rates}, seed {args.seed}; {total} "
          f"changes drawn), a day = {args.day:g} s, {args.days:g} days a run, warm-up "
          f"{args.warmup:g} days, budget {args.budget:g} fetches/s", flush=True)
    runs = []
    if args.self_check:
        print(f"  self-check: round-robin at {args.budget:g}/s for "
              f"{args.days * args.day:.0f} s ...", flush=True)
        runs.append(run_self_check(args, workdir, sched))
    elif not args.model_only:
        for name in args.strategies:
            print(f"  crawlq {name}: {args.days * args.day:.0f} s ...", flush=True)
            runs.append(run_strategy(args, workdir, name))
    return report_sim(runs, sched, args)


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="--quick: revisit interval 15 s, 100 pages, a day of 30 s, 6 days a run, "
        "2 days of warm-up (any flag given overrides it). Full defaults: 20 s, 200, "
        "60 s, 8, 3.")
    p.add_argument("--part", choices=("site", "sim", "both"), default="both")
    p.add_argument("--quick", action="store_true", help="a shorter run (see below)")
    p.add_argument("--self-check", action="store_true",
                   help="part 2's server and freshness against the bench's own round-robin "
                   "client, no crawlq")
    p.add_argument("--root", type=Path, default=None,
                   help=f"part 1's HTML tree (default {DOC_ROOT}, installed when missing)")
    p.add_argument("--interval", type=float, default=None,
                   help="part 1's revisit interval, seconds (20)")
    p.add_argument("--recrawl", choices=("schedule", "window"), default="schedule",
                   help="part 1: revisits fixed (SITE_POLICY), or recrawl_after alone "
                        "(WINDOW_POLICY) with pass 2 a producer run of the start page")
    p.add_argument("--no-recrawl-known", action="store_true",
                   help="--recrawl window: pass 2's producer run with --no-recrawl-known, "
                        "its seed alone (how a re-seeded crawl recrawled before issue 43)")
    p.add_argument("--per-host-concurrency", type=int, default=8,
                   help="part 1's policy per_host_concurrency")
    p.add_argument("--quiet", type=float, default=2.0,
                   help="part 1: a pass is over after this many seconds without a request")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="part 1: stop a pass (and say so) after this many seconds")
    p.add_argument("--pages", type=int, default=None, help="part 2's pages, N (200)")
    p.add_argument("--budget", type=float, default=4.0, help="part 2's fetches/s, B")
    p.add_argument("--day", type=float, default=None,
                   help="real seconds in a simulated day (60)")
    p.add_argument("--days", type=float, default=None, help="simulated days a run (8)")
    p.add_argument("--warmup", type=float, default=None,
                   help="simulated days left out of the freshness (3)")
    p.add_argument("--rate-min", type=float, default=0.05, help="slowest changes/day")
    p.add_argument("--rate-max", type=float, default=500.0, help="fastest changes/day")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dist", choices=(*DISTS, "both"), default="both",
                   help="part 2's change rates: log-uniform, mostly static, or both")
    p.add_argument("--strategies", type=lambda t: t.split(","), default=list(STRATEGIES),
                   help=f"part 2's crawlq runs, comma-separated (default "
                   f"{','.join(STRATEGIES)})")
    p.add_argument("--model-only", action="store_true",
                   help="part 2 without crawlq runs: the analytic, model and oracle columns")
    p.add_argument("--keep", type=Path, default=None,
                   help="copy the logs and records into this directory")
    add_server_args(p)
    args = parse_with_profile(p, argv, QUICK, FULL)
    if args.warmup >= args.days:
        p.error("--warmup must be shorter than --days")
    if not 0 < args.rate_min < args.rate_max:
        p.error("need 0 < --rate-min < --rate-max")
    if unknown := set(args.strategies) - set(STRATEGIES):
        p.error(f"--strategies: no strategy {', '.join(sorted(unknown))}")
    return args


def bench(args: argparse.Namespace, workdir: Path) -> int:
    print(f"recrawl bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    good = True
    if args.self_check:
        return 0 if part_sim(args, workdir) else 1
    if args.part in ("site", "both"):
        good &= part_site(args, workdir)
    if args.part in ("sim", "both"):
        good &= part_sim(args, workdir)
    return 0 if good else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        with contextlib.suppress(PermissionError):  # the instrument first; needs root
            os.nice(-10)
        seen = asyncio.run(serve(args))
        Path(args.out).write_text(json.dumps(seen))
        return 0

    def keep(workdir: Path) -> None:
        if args.keep is not None:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
    return run_in_workdir("crawlq-recrawl-bench-", lambda workdir: bench(args, workdir),
                          stop_all, keep)


if __name__ == "__main__":
    sys.exit(main())
