"""``crawlq stats``, ``crawlq workers`` and ``crawlq crawls``: what a crawl, its fleet and
the Redis hold, as text or JSON; ``stats --watch`` redraws until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import UTC, datetime
from typing import Any

from common.exitcodes import EXIT_OK
from common.fleet.workers import read_workers
from common.queue import CrawlQueue
from common.redis.connection import RedisClient
from console.cli.output import emit, open_queue, when
from console.views.crawls import summaries, summary
from console.views.losses import advice

WATCH_EVERY_S = 2.0


#: After Ctrl-C, how long ``stats --watch`` waits for a read in flight.
WATCH_STOP_GRACE_S = 1.0


def _stats_text(doc: dict[str, Any]) -> str:
    st = doc["states"]
    lines = [f"crawl {doc['crawl']} (partitions {doc['settings']['partitions']}, "
             f"dedup {doc['settings']['dedup']})" + ("  PAUSED" if doc["paused"] else "")]
    lines += [f"  {name:<8} {st[name]:>10,}" for name in
              ("pending", "leased", "waiting", "dead", "done")]
    r = doc["rates"]
    if r is None:
        lines.append("rates: n/a (needs two history snapshots: are consumers running?)")
    else:
        shown = [f"{k[:-6]} {v:,.1f}/s" for k, v in r.items() if k.endswith("_per_s")
                 and k[:-6] in ("done", "failed", "enqueued", "leased", "dead", "retried")]
        lines.append(f"rates (last {r['window_s']:.0f}s): " + (", ".join(shown) or "n/a"))
    counters = {k: v for k, v in doc["counters"].items() if v}
    if counters:
        lines.append("counters: " + ", ".join(f"{k} {v:,}" for k, v in counters.items()))
    if doc["links"]:
        lines.append("links not followed: " + ", ".join(
            f"{k} {v:,} ({advice(k)})" if k == "too_deep" else f"{k} {v:,}"
            for k, v in sorted(doc["links"].items(), key=lambda kv: -kv[1])))
    reasons = {k: v for k, v in doc["dead_reasons"].items() if v}
    lines.append("dead letters by reason: "
                 + (", ".join(f"{k} {v:,}" for k, v in reasons.items()) or "none"))
    lines.append(f"hosts with work and a free slot: {doc['hosts_due']:,}")
    if doc.get("parked"):
        lines.append(f"parked (pending on hosts past their page budget): {doc['parked']:,}")
    if doc.get("render_pending"):
        lines.append(f"render requests pending (for consumers with --browser): "
                     f"{doc['render_pending']:,}")
    if doc["revisits"] is not None:
        lines.append(_revisits_text(doc["revisits"]))
    lines.append(f"live workers: {doc['workers']}")
    return "\n".join(lines)


def _late(seconds: float | str | None) -> str:
    if seconds is None:
        return "-"
    return "over 1d" if seconds == "+Inf" else f"<= {seconds:g}s"


def _revisits_text(rv: dict[str, Any]) -> str:
    return (f"revisits: {rv['scheduled']:,} scheduled, {rv['due']:,} due now, "
            f"{rv['revisits']:,} brought back (late p50 {_late(rv['late_p50_s'])}, p99 "
            f"{_late(rv['late_p99_s'])}); found not_modified {rv['not_modified']:,}, "
            f"unchanged {rv['unchanged']:,}, changed {rv['changed']:,}")


def _show_stats(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    if args.json:
        emit(doc)
        return
    text = _stats_text(doc)
    if args.watch:
        # Home, clear to the end of the screen, redraw: no scrolling, no flicker.
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        text = f"\x1b[H\x1b[J{text}\n\n{stamp}  every {WATCH_EVERY_S:g}s, Ctrl-C quits"
    print(text, flush=True)


async def cmd_stats(args: argparse.Namespace, client: RedisClient) -> int:
    queue = await open_queue(client, args.crawl)
    if args.watch:
        return await _watch_stats(args, queue)
    _show_stats(args, (await summary(queue)).to_json())
    return EXIT_OK


async def _watch_stats(args: argparse.Namespace, queue: CrawlQueue) -> int:
    """Redraw every WATCH_EVERY_S until SIGINT or SIGTERM, then exit 0.

    The signals set an event; nothing is cancelled mid-call. A cancelled task is not a
    reliable way out: Python 3.11's ``asyncio.wait_for`` (redis-py's socket writes and
    reads) swallows a cancellation that lands as its I/O completes, and the watch went on
    drawing after Ctrl-C. The handlers are the loop's own, so a SIGINT its parent ignores
    (``crawlq stats --watch &`` in a script inherits SIG_IGN) still ends it.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            reading = asyncio.ensure_future(summary(queue))
            await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                # A read in flight is given a moment to finish; one that doesn't (a Redis
                # gone silent) is cancelled when the loop closes.
                await asyncio.wait({reading}, timeout=WATCH_STOP_GRACE_S)
                return EXIT_OK
            _show_stats(args, reading.result().to_json())
            await asyncio.wait({stopped}, timeout=WATCH_EVERY_S)
            if stop.is_set():
                return EXIT_OK
    finally:
        stopped.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def cmd_workers(args: argparse.Namespace, client: RedisClient) -> int:
    live = (await read_workers(client, args.crawl)).workers
    if args.json:
        emit([w.to_json() for w in live])
        return EXIT_OK
    if not live:
        print(f"no live workers in crawl {args.crawl}")
        return EXIT_OK
    width = max(2, *(len(w.id) for w in live))
    print(f"{'id':<{width}} {'host':<20} {'pid':>7} {'age':>7} {'in_flight':>9} {'done':>9} "
          f"{'failed':>7} {'pages/s':>8}  started")
    for w in live:
        late = "  (late)" if w.stale else ""
        print(f"{w.id:<{width}} {w.host[:20]:<20} {w.pid:>7} {w.age_ms / 1000:>6.1f}s "
              f"{w.in_flight:>9} {w.done:>9} {w.failed:>7} {w.pages_per_s:>8.1f}  "
              f"{when(w.started_ms) if w.started_ms else '-'}{late}")
    return EXIT_OK


async def cmd_crawls(args: argparse.Namespace, client: RedisClient) -> int:
    found, _ = await summaries(client, limit=10**9)
    rows: list[dict[str, Any]] = [
        {"crawl": c, "settings": None, "states": None} if isinstance(c, str) else
            {**c.to_json(), "enqueued": c.stats.counters.get("enqueued", 0)} for c in found]
    if args.json:
        emit(rows)
        return EXIT_OK
    if not rows:
        print("no crawls in this Redis")
        return EXIT_OK
    width = max(5, *(len(r["crawl"]) for r in rows))
    print(f"{'crawl':<{width}} {'parts':>5} {'dedup':<6} {'pending':>10} {'leased':>8} "
          f"{'waiting':>8} {'dead':>8} {'done':>10} {'enqueued':>10}")
    for r in rows:
        if r["states"] is None:
            print(f"{r['crawl']:<{width}} (no settings: partly deleted? crawlq reset "
                  f"--crawl {r['crawl']} --yes removes it)")
            continue
        st = r["states"]
        print(f"{r['crawl']:<{width}} {r['settings']['partitions']:>5} "
              f"{r['settings']['dedup']:<6} {st['pending']:>10,} {st['leased']:>8,} "
              f"{st['waiting']:>8,} {st['dead']:>8,} {st['done']:>10,} {r['enqueued']:>10,}")
    return EXIT_OK
