"""An extraction crawl of a real doc tree by a crawlq spider and by a Scrapy spider with
the same selectors, side by side.

    python3 bench/spider_bench.py [--root DIR] [--per-host-concurrency 16] [--skip-scrapy]
                                  [--variant defaults] [--variant KEY=VALUE,...] [--rounds 1]

The tree is Debian's python3-doc (installed when missing), served by an nginx the bench
starts on a free 127.0.0.1 port. Both crawlers start at ``library/index.html``, follow
every ``a.reference.internal`` link to another page of ``library/`` (fragment dropped) and
emit one item per documented signature: ``{"id": <dt.sig's id>, "page": <path>}``, keyed
by its id. crawlq: one consumer (``--spider``), its crawl created by the producer's
``--spider`` with the spider's policy: the policy's defaults but no delay,
``--per-host-concurrency`` a host and no depth limit (``max_depth`` 1000, set explicitly
for older checkouts: the default is none now), once for each ``--variant`` (the
defaults, where near-duplicate judgement is off and soft 404s are probed, and
``near_duplicate_distance=3``: the judgement on; each on a fresh redis-server), JSONL sink; Scrapy:
``CONCURRENT_REQUESTS`` 64, the same per-host concurrency, no robots.txt, no delay, run
from a venv the bench makes once (Scrapy is never a crawlq dependency). Printed per
crawler: pages fetched, items (the sets are compared), wall time from process start to
exit, the span from its first request's start to its last response's end at the server
(nginx's access log, by User-Agent), pages/s over the span, and its process's CPU per page
(user + system, from ``wait4``: start-up included for both); each crawlq variant's
pages/s over Scrapy's. With ``--rounds`` N the runs are repeated (Scrapy between the
crawlq runs each round) and the medians of each round's ratios follow: on a machine
shared with other work one round's ratio swings by 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import ROOT, doc_root, run_in_workdir, spawn, start_nginx, stop_all
from site_bench import scrapy_python

HTTP = """\
    log_format spider '$msec\t$request_time\t$http_user_agent';
    access_log {log} spider;
    types {
        text/html html htm;
        text/css css;
        application/javascript js;
    }
    default_type application/octet-stream;
    sendfile on;"""

CRAWLQ_SPIDER = '''\
import json
import os
from crawlq import Spider

START = os.environ["BENCH_START"]
# The policy's defaults but these, and the variant's values (BENCH_POLICY).
spider = Spider("pydoc", start=[START], item_key="id", policy={
    "per_host_delay": 0, "per_host_concurrency": int(os.environ["BENCH_PER_HOST"]),
    "max_depth": 1000, "user_agent": os.environ["BENCH_AGENT"],
    **json.loads(os.environ["BENCH_POLICY"])})


@spider.route()
async def page(response, ctx):
    path = response.url.split("/", 3)[3]
    for sig in response.css("dt.sig[id]::attr(id)").getall():
        ctx.emit({"id": sig, "page": path})
    for href in response.css("a.reference.internal::attr(href)").getall():
        url = response.urljoin(href).partition("#")[0]
        if "/library/" in url and url.endswith(".html"):
            ctx.follow(url)
'''

SCRAPY_SPIDER = '''\
import json
import sys

import scrapy
from scrapy.crawler import CrawlerProcess

START, PER_HOST, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class DocSpider(scrapy.Spider):
    name = "pydoc"
    start_urls = [START]
    pages = 0
    items = {}

    def parse(self, response):
        self.pages += 1
        path = response.url.split("/", 3)[3]
        for sig in response.css("dt.sig[id]::attr(id)").getall():
            self.items[sig] = {"id": sig, "page": path}
        for href in response.css("a.reference.internal::attr(href)").getall():
            url = response.urljoin(href).partition("#")[0]
            if "/library/" in url and url.endswith(".html"):
                yield scrapy.Request(url, callback=self.parse)

    def closed(self, reason):
        with open(OUT, "w") as out:
            json.dump({"pages": self.pages, "items": sorted(self.items)}, out)


process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    "ROBOTSTXT_OBEY": False, "DOWNLOAD_DELAY": 0, "AUTOTHROTTLE_ENABLED": False,
    "HTTPCACHE_ENABLED": False, "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "WARNING",
    "DEPTH_LIMIT": 0, "USER_AGENT": "scrapy-bench/1.0",
})
process.crawl(DocSpider)
process.start()
'''


@dataclass
class Result:
    name: str
    pages: int
    items: set[str]
    wall_s: float
    cpu_s: float
    span_s: float = 0.0  # first request's start to last response's end, at the server

    def line(self) -> str:
        return (f"{self.name:<40}{self.pages:>7}{len(self.items):>8}{self.wall_s:>9.2f}s"
                f"{self.span_s:>9.2f}s{self.pages / self.span_s:>10.1f}"
                f"{self.cpu_s / self.pages * 1e3:>12.2f}ms")


def span(log: Path, agent: str, offset: int = 0) -> float:
    """From the start of `agent`'s first request to the end of its last, by the server's
    access log from byte `offset` (``$msec`` is a response's end, ``$request_time`` its
    duration)."""
    starts, ends = [], []
    with log.open("rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", "replace")
    for line in text.splitlines():
        msec, took, ua = line.split("\t", 2)
        if ua.startswith(agent):
            ends.append(float(msec))
            starts.append(float(msec) - float(took))
    return max(ends) - min(starts)


def timed(argv: list[str], *, env: dict[str, str], log: Path) -> tuple[float, float, int]:
    """Run `argv` to its end: (wall seconds, its CPU seconds, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = spawn(argv, env=env, log=log)
    code = proc.wait()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, code


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``defaults`` or ``key=value,key=value`` (crawl policy values): its name and values."""
    if text == "defaults":
        return text, {}
    values = dict(pair.split("=", 1) for pair in text.split(",") if "=" in pair)
    if not values or len(values) != text.count(",") + 1:
        raise argparse.ArgumentTypeError(f"{text!r}: 'defaults' or key=value[,key=value]")
    return text, values


def run_crawlq(workdir: Path, start: str, per_host: int,
               values: tuple[str, dict[str, str]]) -> Result:
    from common.redis.server import RedisServer  # noqa: PLC0415 - ROOT is on the path now
    from console.run.command import gather_items  # noqa: PLC0415

    name, policy = values
    workdir = workdir / f"crawlq-{len(list(workdir.glob('crawlq-*')))}"
    workdir.mkdir()
    spider = workdir / "pydoc_spider.py"
    spider.write_text(CRAWLQ_SPIDER)
    (workdir / "redis").mkdir()
    redis = RedisServer(data_dir=workdir / "redis")
    redis.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env.update(BENCH_START=start, BENCH_PER_HOST=str(per_host), PYTHONPATH=str(ROOT),
                   BENCH_AGENT=agent_of(name), BENCH_POLICY=json.dumps(policy))
        common = ["--redis-url", redis.url, "--crawl", "pydoc", "--spider", str(spider),
                  "--log-level", "WARNING"]
        _, _, code = timed([sys.executable, "-m", "producer", *common, "--progress", "off"],
                           env=env, log=workdir / "producer.log")
        if code:
            raise SystemExit(f"the producer exited {code}: see {workdir / 'producer.log'}")
        out = workdir / "results"
        wall, cpu, code = timed([
            sys.executable, "-m", "consumer", *common, "--allow-private", "--exit-when-empty",
            "--empty-grace", "0", "--http-port", "-1", "--output", str(out)],
            env=env, log=workdir / "consumer.log")
        if code:
            raise SystemExit(f"the consumer exited {code}:\n"
                             f"{(workdir / 'consumer.log').read_text()[-2000:]}")
    finally:
        redis.stop()
    records = [json.loads(line) for path in out.rglob("*.jsonl")
               for line in path.read_text().splitlines()]
    gather_items(out, workdir / "items.jsonl")
    items = {json.loads(line)["id"] for line in (workdir / "items.jsonl").read_text().split()}
    return Result(f"crawlq {name}", sum(r["status"] == 200 for r in records), items, wall,
                  cpu)


def agent_of(name: str) -> str:
    """The User-Agent of a crawlq variant's run: its requests in the access log."""
    return "crawlq-bench-" + "".join(c if c.isalnum() else "-" for c in name) + "/1.0"


def run_scrapy(workdir: Path, start: str, per_host: int, python: Path) -> Result:
    spider, out = workdir / "scrapy_spider.py", workdir / "scrapy.json"
    spider.write_text(SCRAPY_SPIDER)
    wall, cpu, code = timed([str(python), str(spider), start, str(per_host), str(out)],
                            env=dict(os.environ), log=workdir / "scrapy.log")
    if code or not out.exists():
        raise SystemExit(f"scrapy exited {code}:\n{(workdir / 'scrapy.log').read_text()[-2000:]}")
    doc = json.loads(out.read_text())
    return Result("scrapy", doc["pages"], set(doc["items"]), wall, cpu)


def report(results: list[Result]) -> None:
    """One round's runs, and each crawlq run against Scrapy's."""
    print(f"{'':<40}{'pages':>7}{'items':>8}{'wall':>10}{'span':>10}{'pages/s':>10}"
          f"{'CPU/page':>14}")
    for r in results:
        print(r.line())
    scrapy = next((r for r in results if r.name == "scrapy"), None)
    for a in results:
        if scrapy is None or a is scrapy:
            continue
        b = scrapy
        same = a.items == b.items
        print(f"{a.name}: same items as Scrapy: {same}" + ("" if same else
              f" (crawlq only {len(a.items - b.items)}, scrapy only "
              f"{len(b.items - a.items)})"))
        print(f"  crawlq / scrapy pages/s over the span: {speedup(a, b):.2f}x (target >= 5x); "
              f"over the wall time (start-up in): "
              f"{(a.pages / a.wall_s) / (b.pages / b.wall_s):.2f}x; CPU per page: "
              f"{less_cpu(a, b):.2f}x less", flush=True)


def speedup(a: Result, scrapy: Result) -> float:
    return (a.pages / a.span_s) / (scrapy.pages / scrapy.span_s)


def less_cpu(a: Result, scrapy: Result) -> float:
    return (scrapy.cpu_s / scrapy.pages) / (a.cpu_s / a.pages)


def bare_loop(root: Path, start: str) -> tuple[int, float]:
    """The spider's route alone over the pages it reaches, read from disk first: crawlq's
    Response (parsel, as the route gets it), the same selectors, urljoin and a set for
    follow; no fetch, no queue, no sink. Returns (pages, CPU seconds of the route's work):
    the most pages a second one process can parse, whatever the crawler around it."""
    from common.http.fetcher import FetchResult  # noqa: PLC0415
    from common.spider.response import Response  # noqa: PLC0415

    base = start.rsplit("/library/", 1)[0]
    seen, todo, bodies = {start}, [start], {}
    while todo:  # read every page the route reaches first: the disk is not its work
        url = todo.pop()
        path = root / url[len(base) + 1:]
        if not path.is_file():
            continue
        bodies[url] = path.read_bytes()
        for href in _HREF.findall(bodies[url]):
            target = _join(url, href.decode())
            if target not in seen and "/library/" in target and target.endswith(".html"):
                seen.add(target)
                todo.append(target)
    begun = time.process_time()
    follows: set[str] = set()
    for url, body in bodies.items():
        response = Response(FetchResult(url, url, 200, {"content-type": "text/html"}, (),
                                        body, 0.0, (), "HTTP/1.1"))
        for sig in response.css("dt.sig[id]::attr(id)").getall():
            _ = {"id": sig, "page": url}
        for href in response.css("a.reference.internal::attr(href)").getall():
            joined = response.urljoin(href).partition("#")[0]
            if "/library/" in joined and joined.endswith(".html"):
                follows.add(joined)
    return len(bodies), time.process_time() - begun


_HREF = re.compile(rb'<a class="reference internal" href="([^"#]*)')


def _join(url: str, href: str) -> str:
    from urllib.parse import urljoin  # noqa: PLC0415
    return urljoin(url, href) if href else url


def print_bare(root: Path, start: str, rounds: list[list[Result]]) -> None:
    """The bare loop's pages a second of CPU beside Scrapy's pages/s over its span: the
    ceiling of crawlq's ratio with one consumer, were the crawler itself free."""
    pages, cpu = bare_loop(root, start)
    scrapy = [r for results in rounds for r in results if r.name == "scrapy"]
    line = f"bare loop (the route alone, {pages} pages): {pages / cpu:.0f} pages a CPU second"
    if scrapy:
        best = statistics.median(r.pages / r.span_s for r in scrapy)
        line += (f" = {pages / cpu / best:.2f}x Scrapy's pages/s (median {best:.0f}): the "
                 f"ceiling of one consumer's ratio")
    print(line, flush=True)


def medians(rounds: list[list[Result]]) -> None:
    """Per crawlq run, the median (and range) over the rounds of its ratios to the
    Scrapy run of its round."""
    print(f"-- over {len(rounds)} rounds: median (range) --")
    for i, first in enumerate(rounds[0]):
        if first.name == "scrapy":
            continue
        pairs = [(r[i], next(x for x in r if x.name == "scrapy")) for r in rounds]
        fast = [speedup(a, b) for a, b in pairs]
        cheap = [less_cpu(a, b) for a, b in pairs]
        print(f"{first.name}: pages/s over the span {statistics.median(fast):.2f}x Scrapy's "
              f"({min(fast):.2f}-{max(fast):.2f}; target >= 5x), CPU per page "
              f"{statistics.median(cheap):.2f}x less ({min(cheap):.2f}-{max(cheap):.2f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=None, help="an HTML tree (python3-doc's)")
    p.add_argument("--per-host-concurrency", type=int, default=16)
    p.add_argument("--skip-scrapy", action="store_true")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the runs; the medians of the ratios follow")
    p.add_argument("--variant", type=variant, action="append", default=None,
                   help="a crawlq run: 'defaults' or policy values key=value[,key=value] "
                   "(repeat it; default: defaults and near_duplicate_distance=3)")
    args = p.parse_args(argv)
    variants = args.variant or [variant("defaults"), variant("near_duplicate_distance=3")]
    root = doc_root(args.root)

    def body(workdir: Path) -> int:
        python = None if args.skip_scrapy else scrapy_python(refresh=False)
        port, log = start_nginx(root, workdir, HTTP)
        start = f"http://127.0.0.1:{port}/library/index.html"
        rounds: list[list[Result]] = []
        for n in range(args.rounds):
            if args.rounds > 1:
                print(f"-- round {n + 1} of {args.rounds} --", flush=True)
            results = []
            runs: list[tuple[str, object]] = [("crawlq", v) for v in variants]
            if python is not None:  # Scrapy between crawlq's runs: the same hour for all
                runs.insert(min(1, len(runs)), ("scrapy", None))
            for kind, values in runs:
                offset = log.stat().st_size if log.exists() else 0
                if kind == "scrapy":
                    assert python is not None
                    r = run_scrapy(workdir, start, args.per_host_concurrency, python)
                    r.span_s = span(log, "scrapy-bench", offset)
                else:
                    assert isinstance(values, tuple)
                    r = run_crawlq(workdir, start, args.per_host_concurrency, values)
                    r.span_s = span(log, agent_of(values[0]), offset)
                results.append(r)
            report(results)
            rounds.append(results)
        if len(rounds) > 1 and python is not None:
            medians(rounds)
        print_bare(root, start, rounds)
        return 0

    return run_in_workdir("spider-bench-", body, stop_all)


if __name__ == "__main__":
    sys.exit(main())
