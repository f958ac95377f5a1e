"""``crawlq demo`` end to end, as a newcomer runs it: a real process, nothing mocked."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from procs import group_members

ROOT = Path(__file__).resolve().parent.parent
REDIS_AT = re.compile(r"started an embedded redis-server at redis://127\.0\.0\.1:(\d+)/0")


def start_demo(out: Path, *args: str) -> subprocess.Popen[str]:
    """``crawlq demo`` in a new session: it and every process it starts (redis-server, the
    site, producer, consumers) share the process group whose id is the demo's pid."""
    env = {k: v for k, v in os.environ.items()
           if k != "REDIS_URL" and not k.startswith("CRAWLQ_")}  # the embedded Redis
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from console.cli import main; sys.exit(main())",
         "demo", "--output", str(out), *args],
        cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_demo_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "crawlq-demo"
    proc = start_demo(out)
    try:
        text, stderr = proc.communicate(timeout=80)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"stdout:\n{text}\nstderr:\n{stderr}"
    assert group_members(proc.pid) == []  # consumers, producer, site and redis-server gone
    port = REDIS_AT.search(text)
    assert port, text
    assert not listening(int(port[1]))

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


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_demo_stopped_by_sigterm_stops_everything_it_started(tmp_path: Path) -> None:
    out = tmp_path / "crawlq-demo"
    proc = start_demo(out, "--pages", "300")
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("started 2 consumers"):
                break
        running = group_members(proc.pid)
        # The demo (which serves the site itself), redis-server under its rewritten name,
        # the two consumers (the producer has finished by now).
        names = [member.split(" ", 1)[1] for member in running]
        assert names.count("redis-server") == 1, running
        assert len(running) == 4, running
        assert any(member.startswith(f"{proc.pid} ") for member in running), running
        port = REDIS_AT.search("".join(seen))
        assert port, "".join(seen)
        assert listening(int(port[1]))
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest + err
    assert "interrupted: stopping the consumers, the site and Redis" in rest
    assert group_members(proc.pid) == []
    assert not listening(int(port[1]))
