"""deploy/grafana/crawlq-consumers.json queries only what a consumer's /metrics serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from common.observability.metrics import Metrics
from common.queue import RevisitStats
from consumer.http_server import SideServer

GRAFANA = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "crawlq-consumers.json"
_METRIC = re.compile(r"\bcrawlq_[a-z0-9_]+")
_BY = re.compile(r"by \(([^)]*)\) \(rate\((crawlq_[a-z0-9_]+)")


def _queries(node: Any) -> list[str]:
    """Every PromQL string of the dashboard: panel targets and template queries."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return found + [q for v in node.values() for q in _queries(v)]
    if isinstance(node, list):
        return [q for v in node for q in _queries(v)]
    return []


async def _served() -> dict[str, set[str]]:
    """Series name -> label names, as a working consumer's side server exposes them."""
    async def ready() -> str | None:
        return None

    # A consumer that has fetched a page, met an error and a 429, in a crawl with revisits.
    metrics = Metrics()
    metrics.revisits.stats = RevisitStats(scheduled=3, due=1, revisits=2, late_p50_s=1.0,
                                          late_p99_s=float("inf"))
    metrics.response(200, 1234)
    metrics.task("ok")
    metrics.error("timeout")
    metrics.pushback("http_429")
    metrics.fetch_duration_seconds.observe(0.2)
    server = SideServer("127.0.0.1", 0, metrics, ready)
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    finally:
        await server.stop()
    served: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            name = name.split(" ")[0]
            labels = set(re.findall(r"([a-z_]+)=\"", rest)) if rest else set()
            served.setdefault(name, set()).update(labels)
    return served


async def test_every_queried_metric_and_label_exists() -> None:
    doc = json.loads(GRAFANA.read_text())
    queries = _queries(doc)
    assert len(doc["panels"]) >= 6 and len(queries) >= 10
    served = await _served()
    queried = {m for q in queries for m in _METRIC.findall(q)}
    missing = queried - set(served)
    assert not missing, f"the Grafana dashboard queries metrics /metrics lacks: {missing}"
    for labels, metric in (m for q in queries for m in _BY.findall(q)):
        for label in (x.strip() for x in labels.split(",")):
            assert label in served[metric], f"{metric} has no label {label}"
    # And it shows every family a consumer exports.
    def family(name: str) -> str:
        return re.sub(r"_(total|bucket|sum|count|created)$", "", name)

    assert {family(n) for n in served} - {family(m) for m in queried} == set()
