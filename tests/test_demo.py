"""``crawlq demo`` end to end, as a newcomer runs it: a real process, nothing mocked."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_demo_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "crawlq-demo"
    env = {k: v for k, v in os.environ.items()
           if k != "REDIS_URL" and not k.startswith("CRAWLQ_")}  # the embedded Redis
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from common.cli import main; sys.exit(main())",
         "demo", "--output", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80, check=False)
    text = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{text}\nstderr:\n{proc.stderr}"

    m = re.search(r"demo finished in ([\d.]+)s: (\d+) URLs enqueued, (\d+) done, "
                  r"(\d+) retried, (\d+) dead", text)
    assert m, text
    elapsed, enqueued, done, retried, dead = float(m[1]), *map(int, m.groups()[1:])
    assert elapsed < 60
    assert enqueued == 2024  # 2000 pages + the slow, flaky, 404, 503, private, redirect ones
    assert done + dead == enqueued
    assert retried >= 5  # the flaky pages fail once each
    assert "dead by reason: http_5xx 3, redirect_loop 1" in text
    assert "producer: read 2026, invalid 2, enqueued 2024" in text
    assert f"results: {out / 'results'}" in text
    assert "crawlq stats --crawl demo" in text and "crawlq dead ls --crawl demo" in text

    records = 0
    for f in (out / "results").rglob("*.jsonl"):
        with f.open() as lines:
            records += sum(1 for _ in lines)
    assert records >= 2000
    assert (out / "urls.txt").read_text().startswith("# crawlq demo seed list")
    assert processes_mentioning(str(out)) == []  # consumers, producer and redis-server gone


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_demo_stopped_by_sigterm_stops_everything_it_started(tmp_path: Path) -> None:
    out = tmp_path / "crawlq-demo"
    env = {k: v for k, v in os.environ.items()
           if k != "REDIS_URL" and not k.startswith("CRAWLQ_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from common.cli import main; sys.exit(main())",
         "demo", "--output", str(out), "--pages", "300"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("started 2 consumers"):
            break
    assert processes_mentioning(str(out)), "the consumers should be running now"
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert "interrupted: stopping the consumers, the site and Redis" in rest
    assert processes_mentioning(str(out)) == []
