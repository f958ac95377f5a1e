"""Logging set-up (formats, redaction) and the Prometheus metrics registry."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from common.errors import ConfigError
from common.observability.logs import RedactFilter, redact, setup_logging
from common.observability.metrics import FETCH_BUCKETS, OUTCOMES, Metrics, status_class

PROXY = "http://u:secret@proxy:8080"
TS_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root logger back as it was: setup_logging changes process-wide state."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    filters = {h: list(h.filters) for h in handlers}
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler, old in filters.items():
            handler.filters[:] = old
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


# -- logs ---------------------------------------------------------------------------


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_hold_event_and_extras() -> None:
    out = io.StringIO()
    setup_logging("debug", "json", stream=out)
    log = logging.getLogger("consumer")
    log.info("task_leased", extra={"n": 5, "partition": "p3", "ids": ["a", "b"]})
    log.debug("odd_values", extra={"nan": float("nan"), "obj": object(), "event": "clash"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("fetch_failed", extra={"reason": "dns"})

    lines = _lines(out)
    docs = [json.loads(line) for line in lines[:2]]
    assert docs[0]["event"] == "task_leased"
    assert docs[0]["level"] == "INFO"
    assert docs[0]["logger"] == "consumer"
    assert re.fullmatch(TS_RE, docs[0]["ts"])
    assert docs[0]["n"] == 5
    assert docs[0]["partition"] == "p3"
    assert docs[0]["ids"] == ["a", "b"]
    assert docs[1]["event"] == "odd_values"  # an extra cannot overwrite a core field
    assert docs[1]["extra_event"] == "clash"
    assert docs[1]["nan"] == "nan"
    assert docs[1]["obj"].startswith("<object")
    # the traceback is inside the JSON string: still one object per line
    assert len(lines) == 3
    exc_doc = json.loads(lines[2])
    assert exc_doc["event"] == "fetch_failed"
    assert exc_doc["reason"] == "dns"
    assert "ValueError: boom" in exc_doc["exc"]


@pytest.mark.usefixtures("restore_logging")
def test_text_format() -> None:
    out = io.StringIO()
    setup_logging("INFO", "text", stream=out)
    log = logging.getLogger("consumer")
    log.info("task_dead", extra={"reason": "http_500", "id": "ab12"})
    log.info("note", extra={"msg_text": "two words"})
    log.debug("hidden")
    lines = _lines(out)
    assert len(lines) == 2
    assert re.fullmatch(TS_RE + r" INFO  consumer  task_dead reason=http_500 id=ab12", lines[0])
    assert lines[1].endswith('note msg_text="two words"')


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_passwords_redacted_in_message_extras_and_exceptions(
    fmt: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = io.StringIO()
    setup_logging("INFO", fmt, stream=out)
    log = logging.getLogger("producer")
    with caplog.at_level(logging.INFO):
        log.warning(
            "proxy_failed via %s", PROXY, extra={"proxy": PROXY, "password": "secret", "n": 1}
        )
        log.info("redis_connect", extra={"dsn": "redis://:secret@localhost:6379/0"})
        log.info("auth", extra={"headers": {"Authorization": "Bearer secret", "api_key": "secret"}})
        try:
            raise ConnectionError(f"cannot reach {PROXY}?token=secret")
        except ConnectionError:
            log.exception("proxy_down")

    text = out.getvalue()
    assert "secret" not in text
    assert "http://u:***@proxy:8080" in text
    assert "redis://:***@localhost:6379/0" in text
    assert "proxy_down" in text
    # the filter rewrites records in place: other handlers (pytest's here) see it too
    assert "secret" not in caplog.text
    assert all("secret" not in r.getMessage() for r in caplog.records)
    assert caplog.records[0].proxy == "http://u:***@proxy:8080"  # type: ignore[attr-defined]
    if fmt == "json":
        first = json.loads(text.splitlines()[0])
        assert first["event"] == "proxy_failed via http://u:***@proxy:8080"
        assert first["password"] == "***"
        assert first["n"] == 1


@pytest.mark.usefixtures("restore_logging")
def test_default_stream_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "json")
    logging.getLogger("consumer").info("started", extra={"url": PROXY})
    err = capsys.readouterr().err
    doc = json.loads(err.strip().splitlines()[-1])
    assert doc["event"] == "started"
    assert doc["url"] == "http://u:***@proxy:8080"
    assert "secret" not in err


@pytest.mark.usefixtures("restore_logging")
def test_setup_logging_twice_does_not_stack_handlers() -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    first, second = io.StringIO(), io.StringIO()
    setup_logging("INFO", "text", stream=first)
    setup_logging("WARNING", "json", stream=second)
    assert len(root.handlers) == before + 1
    assert all(any(isinstance(f, RedactFilter) for f in h.filters) for h in root.handlers)
    logging.getLogger("x").warning("once")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["event"] == "once"


def test_setup_logging_rejects_bad_values() -> None:
    with pytest.raises(ConfigError):
        setup_logging("LOUD")
    with pytest.raises(ConfigError):
        setup_logging("INFO", "xml")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (PROXY, "http://u:***@proxy:8080"),
        ("socks5://user:p@ss@h:1080/x", "socks5://user:***@h:1080/x"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("https://example.test:8443/a@b", "https://example.test:8443/a@b"),
        ("https://user@example.test/", "https://user@example.test/"),
        ("GET /login?user=a&password=hunter2&x=1", "GET /login?user=a&password=***&x=1"),
        ("token: abc123", "token: ***"),
        ('{"api_key": "k-1", "n": 2}', '{"api_key": "***", "n": 2}'),
        ("CRAWLQ_REDIS_PASSWORD=pw", "CRAWLQ_REDIS_PASSWORD=***"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer ***"),
        ("tokens: 5 leased", "tokens: 5 leased"),
        ("", ""),
    ],
)
def test_redact(raw: str, expected: str) -> None:
    assert redact(raw) == expected


# -- metrics ------------------------------------------------------------------------


def test_counters_increment_and_render() -> None:
    m = Metrics()
    m.task("ok")
    m.task("dead", 2)
    m.response(200, nbytes=1234)
    m.response(404)
    m.response(None)
    m.error("timeout")
    m.fetch_duration_seconds.observe(0.3)
    m.in_flight.inc(3)
    m.in_flight.dec()
    m.leases_renewed_total.inc()
    m.leases_lost_total.inc()
    m.reclaimed_total.inc(4)
    m.robots_turns_total.inc()
    m.redis_errors_total.inc()

    body, content_type = m.render()
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert 'crawlq_tasks_total{outcome="ok"} 1.0' in text
    assert 'crawlq_tasks_total{outcome="dead"} 2.0' in text
    assert 'crawlq_tasks_total{outcome="stale"} 0.0' in text  # pre-created series
    assert 'crawlq_responses_total{status_class="2xx"} 1.0' in text
    assert 'crawlq_responses_total{status_class="4xx"} 1.0' in text
    assert 'crawlq_responses_total{status_class="error"} 1.0' in text
    assert "crawlq_response_bytes_total 1234.0" in text
    assert 'crawlq_errors_total{kind="timeout"} 1.0' in text
    assert 'crawlq_fetch_duration_seconds_bucket{le="0.5"} 1.0' in text
    assert 'crawlq_fetch_duration_seconds_bucket{le="60.0"} 1.0' in text
    assert "crawlq_fetch_duration_seconds_count 1.0" in text
    assert "crawlq_in_flight 2.0" in text
    assert "crawlq_leases_renewed_total 1.0" in text
    assert "crawlq_leases_lost_total 1.0" in text
    assert "crawlq_reclaimed_total 4.0" in text
    assert "crawlq_robots_turns_total 1.0" in text
    assert "crawlq_redis_errors_total 1.0" in text


def test_fetch_histogram_buckets_match_prometheus_histogram() -> None:
    m = Metrics()
    reg = CollectorRegistry()
    reference = Histogram("fetch_duration_seconds", "x", namespace="crawlq",
                          buckets=FETCH_BUCKETS, registry=reg)
    for value in (0.0, 0.01, 0.0100001, 0.3, 0.5, 59.9, 60.0, 61.0, 1e9):
        m.fetch_duration_seconds.observe(value)
        reference.observe(value)

    def series(text: str) -> list[str]:
        return sorted(line for line in text.splitlines()
                      if line.startswith("crawlq_fetch_duration_seconds_")
                      and "_created" not in line)

    ours = series(m.render()[0].decode())
    assert ours == series(generate_latest(reg).decode())
    assert 'crawlq_fetch_duration_seconds_bucket{le="0.01"} 2.0' in ours
    assert 'crawlq_fetch_duration_seconds_bucket{le="+Inf"} 9.0' in ours


def test_responses_are_tallied_until_published() -> None:
    m = Metrics()
    m.response(200, nbytes=10)
    assert 'crawlq_responses_total{status_class="2xx"} 0.0' in generate_latest(
        m.registry).decode()
    m.publish()
    m.response(201, nbytes=5)
    text = m.render()[0].decode()
    assert 'crawlq_responses_total{status_class="2xx"} 2.0' in text
    assert "crawlq_response_bytes_total 15.0" in text


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.task("ok")
    assert 'crawlq_tasks_total{outcome="ok"} 0.0' in b.render()[0].decode()
    assert a.registry is not b.registry


def test_labels_are_bounded_never_a_url() -> None:
    m = Metrics()
    m.task("http://example.test/page?id=1")
    m.error("https://example.test/")
    m.error("Connection refused by example.test")
    m.task("retried")
    names: set[str] = set()
    for family in m.registry.collect():
        assert family.name.startswith("crawlq_")
        for sample in family.samples:
            names.update(sample.labels)
            for value in sample.labels.values():
                assert "://" not in value
                assert "example.test" not in value
    assert names <= {"outcome", "status_class", "kind", "fate", "le"}
    text = m.render()[0].decode()
    assert 'crawlq_tasks_total{outcome="other"} 1.0' in text
    assert 'crawlq_errors_total{kind="other"} 2.0' in text
    assert set(OUTCOMES) >= {"ok", "http_4xx", "robots_disallowed", "retried", "dead"}


@pytest.mark.parametrize(
    ("status", "cls"),
    [(100, "1xx"), (200, "2xx"), (301, "3xx"), (404, "4xx"), (599, "5xx"), (None, "error"),
     (0, "error"), (600, "error")],
)  # fmt: skip
def test_status_class(status: int | None, cls: str) -> None:
    assert status_class(status) == cls


# -- the event loop each command runs on -------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "crawlq-consumer": ["-m", "consumer", "--exit-when-empty", "--empty-grace", "0",
                        "--http-port", "-1"],
    "crawlq-producer": ["-m", "producer", "--dry-run", "--url", "https://example.com/"],
    "crawlq": ["-c", "import sys; from console.cli import main; sys.exit(main())", "crawls"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
async def test_every_command_runs_on_uvloop(command: str, redis_url: str, crawl_name: str
                                            ) -> None:
    """Each entry point logs its loop's class as it starts (common.runtime.run_loop)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env.update(PYTHONPATH=str(ROOT), REDIS_URL=redis_url, CRAWLQ_CRAWL=crawl_name,
               CRAWLQ_LOG_LEVEL="DEBUG", CRAWLQ_LOG_FORMAT="json")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *COMMANDS[command], cwd=ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        loops = []
        while not loops:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, f"{command} ended without logging event_loop:\n{''.join(seen)}"
            seen.append(line)
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if doc.get("event") == "event_loop":
                    loops.append(doc["loop"])
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.communicate()
    assert loops == ["uvloop.Loop"]


def test_every_precreated_outcome_is_one_the_consumer_emits() -> None:
    """A series created at 0 that nothing ever counts would mislead a dashboard."""
    root = Path(__file__).resolve().parents[1] / "consumer"
    source = "\n".join(p.read_text() for p in root.rglob("*.py"))
    # Named by its string or by its common.reasons constant (NEAR_DUPLICATE).
    silent = [o for o in OUTCOMES if f'"{o}"' not in source and o.upper() not in source]
    assert silent == []
