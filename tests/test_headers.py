"""Request headers per crawl (consumer --header) and per task (producer --header, key h):
validation, what reaches a local server, cross-origin redirects, redaction."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common.config import add_options
from common.errors import ConfigError, MalformedTaskError
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.queue import CrawlQueue, NewTask
from common.tasks.headers import (
    MAX_HEADERS,
    MAX_HEADERS_BYTES,
    is_credential,
    parse_header_lines,
    redacted_headers,
)
from common.tasks.task import decode_entry, encode_entry
from common.urls.canonical import fingerprint
from console.cli import main_async as crawlq_main
from console.dashboard.app import make_app
from consumer.__main__ import main as consumer_main
from consumer.config import CONSUMER_OPTIONS, build_parser, settings_from_args
from consumer.wiring import run
from producer.cli import PRODUCER_OPTIONS
from producer.cli import main_async as producer_main

TID = "ab" * 16
# Planted credentials: none may show up in a log, a message, a dead letter or --help.
CRAWL_KEY = "crawl-k3y-PLANTED"
TASK_TOKEN = "task-t0ken-PLANTED"
SECRETS = (CRAWL_KEY, TASK_TOKEN)


# --- the rule ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Authorization", "cookie", "X-Api-Key", "X-Auth-Token",
                                  "X-Session-Id", "X-Client-Secret", "X-Amz-Signature",
                                  "X-Password", "X-Credentials"])
def test_credential_names(name: str) -> None:
    assert is_credential(name)
    assert redacted_headers({name: "v", "Accept-Language": "de"}) == {
        name: "***", "Accept-Language": "de"}


@pytest.mark.parametrize("name", ["Accept-Language", "Accept", "X-Request-Id", "Referer",
                                  "If-None-Match", "From"])
def test_plain_names(name: str) -> None:
    assert not is_credential(name)


@pytest.mark.parametrize(("lines", "error"), [
    (["Authorization Bearer " + TASK_TOKEN], "header 1 is not 'Name: value'"),
    (["Accept: */*", "Bad Name " + TASK_TOKEN + ": x"], "header 2: its name is not an HTTP token"),
    ([": " + TASK_TOKEN], "header 1: its name is not an HTTP token"),
    (["Host: example.com"], "'Host' can't be set: the URL decides it"),
    (["content-length: 3"], "'content-length' can't be set: framing"),
    (["Transfer-Encoding: chunked"], "'Transfer-Encoding' can't be set: framing"),
    (["Connection: close"], "'Connection' can't be set: a hop-by-hop header"),
    (["TE: trailers"], "'TE' can't be set: a hop-by-hop header"),
    (["Accept-Encoding: zstd"], "decompresses and caps bodies itself"),
    (["User-Agent: other"], "use --user-agent"),
    (["Proxy-Authorization: Basic " + TASK_TOKEN], "in the --proxy URL"),
    (["X-Api-Key: a", "x-api-key: " + TASK_TOKEN], "'x-api-key' is given twice"),
    (["X-Api-Key: " + TASK_TOKEN + "\r\nHost: evil"], "control or non-ASCII"),
    (["Accept-Language: d\u00e9"], "control or non-ASCII"),
    ([f"X-{i}: v" for i in range(MAX_HEADERS + 1)], f"more than {MAX_HEADERS} headers"),
    (["X-Big: " + "v" * MAX_HEADERS_BYTES], f"more than {MAX_HEADERS_BYTES} bytes"),
])
def test_malformed_headers_are_refused_without_their_values(lines: list[str],
                                                             error: str) -> None:
    with pytest.raises(ConfigError, match=r"^--opt: ") as info:
        parse_header_lines(lines, ConfigError, "--opt")
    assert error in str(info.value)
    assert TASK_TOKEN not in str(info.value)


def test_header_lines_parse() -> None:
    assert parse_header_lines(["Accept-Language:  en-US,en;q=0.9 ", "X-Empty:",
                               "Authorization: Bearer a:b"], ConfigError, "--opt") == {
        "Accept-Language": "en-US,en;q=0.9", "X-Empty": "", "Authorization": "Bearer a:b"}


# --- the entry's h key -----------------------------------------------------------------


def test_entry_carries_headers() -> None:
    headers = {"Accept-Language": "de", "Authorization": "Bearer " + TASK_TOKEN}
    entry = encode_entry(TID, "http://a.test/", headers=headers)
    task = decode_entry(entry)
    assert task.headers == headers
    assert TASK_TOKEN not in repr(task)
    assert decode_entry(encode_entry(TID, "http://a.test/")).headers == {}
    assert encode_entry(TID, "http://a.test/", headers={}) == TID + "http://a.test/"


@pytest.mark.parametrize(("h", "error"), [
    ('["Accept: x"]', "task headers must be a JSON object, got list"),
    ('{"X-Api-Key": 1}', "task headers: headers must map header names to string values"),
    ('{"Host": "' + TASK_TOKEN + '"}', "task headers: header 'Host' can't be set"),
    ('{"bad name": "' + TASK_TOKEN + '"}', "task headers: header 1: its name is not"),
    ('{"X-Api-Key\\n": "v"}', "task headers: header 1: its name is not"),
    ('{"X-Api-Key": "' + TASK_TOKEN + '\\n"}', "task headers: header 'X-Api-Key' has a value"),
    (json.dumps({f"X-{i}": "v" for i in range(MAX_HEADERS + 1)}),
     f"task headers: more than {MAX_HEADERS} headers"),
])
def test_malformed_h_is_a_malformed_task(h: str, error: str) -> None:
    with pytest.raises(MalformedTaskError) as info:
        decode_entry(f'{TID}http://a.test/ {{"h": {h}}}')
    assert str(info.value).startswith(error)
    assert TASK_TOKEN not in str(info.value)


# --- configuration -----------------------------------------------------------------------


def test_consumer_header_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRAWLQ_HEADERS", "Accept-Language: en-US,en;q=0.9\n"
                                         f"X-Api-Key: {CRAWL_KEY}\n")
    settings = settings_from_args(build_parser().parse_args([]))
    assert settings.fetch.headers == (("Accept-Language", "en-US,en;q=0.9"),
                                      ("X-Api-Key", CRAWL_KEY))
    assert CRAWL_KEY not in repr(settings)
    assert "('X-Api-Key', '***')" in repr(settings.fetch)
    flag = settings_from_args(build_parser().parse_args(["--header", "Accept: text/html"]))
    assert flag.fetch.headers[2:] == (("Accept", "text/html"),)  # flags add to the env's


def test_help_shows_no_header_value() -> None:
    env = {"CRAWLQ_HEADERS": f"X-Api-Key: {CRAWL_KEY}",
           "CRAWLQ_TASK_HEADERS": f"Authorization: Bearer {TASK_TOKEN}"}
    for options in (CONSUMER_OPTIONS, PRODUCER_OPTIONS):
        parser = argparse.ArgumentParser()
        add_options(parser, options, env)
        text = parser.format_help()
        assert "--header" in text
        assert not any(s in text for s in SECRETS)


@pytest.mark.parametrize(("argv", "env"), [
    (["--header", "Host: a.test"], {}),
    (["--header", f"Authorization Bearer {CRAWL_KEY}"], {}),
    ([], {"CRAWLQ_HEADERS": f"Accept: */*\nContent-Length: 0\nX-Api-Key: {CRAWL_KEY}"}),
])
def test_malformed_header_config_exits_2_with_one_line(
        argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert consumer_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("crawlq-consumer: --header / CRAWLQ_HEADERS: header ")
    assert err.count("\n") == 1 and CRAWL_KEY not in err


async def test_producer_malformed_header_exits_2_with_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = await producer_main(["--dry-run", "--url", "http://a.test/",
                                "--header", f"Cookie {TASK_TOKEN}"], out=io.StringIO())
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("crawlq-producer: error: --header / CRAWLQ_TASK_HEADERS: header 1 ")
    assert err.count("\n") == 1 and TASK_TOKEN not in err


# --- what reaches the servers ------------------------------------------------------------


@dataclass
class Origin:
    """A local server that records each request's path and headers."""

    base: str = ""
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def headers_of(self, path: str) -> dict[str, str]:
        [got] = [h for p, h in self.seen if p == path]
        return got


@contextlib.asynccontextmanager
async def origin() -> AsyncIterator[Origin]:
    site = Origin()

    async def handle(request: web.Request) -> web.StreamResponse:
        site.seen.append((request.path, dict(request.headers)))
        if request.path.startswith("/to/"):  # /to/<url>: a redirect there
            raise web.HTTPFound(request.path_qs[len("/to/"):])
        if request.path == "/fail":
            return web.Response(status=500)
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    site.base = f"http://127.0.0.1:{tcp._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield site
    finally:
        await runner.cleanup()


def jsonl_text(out: Path) -> str:
    return "\n".join(p.read_text() for p in out.glob("*.jsonl"))


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


CRAWL_HEADERS = (("Accept-Language", "de"), ("X-Api-Key", CRAWL_KEY), ("X-Crawl", "c"))


async def test_credentials_dropped_on_cross_origin_redirect_crawl_and_task_ones() -> None:
    settings = FetchSettings(allow_private=True, headers=CRAWL_HEADERS)
    task = {"Authorization": "Bearer " + TASK_TOKEN, "X-Task": "t"}
    async with origin() as a, origin() as b, Fetcher(settings) as fetcher:
        await fetcher.fetch(f"{a.base}/to/{b.base}/landed", headers=task,
                            crawl_credentials=True)
        await fetcher.fetch(f"{a.base}/to/{a.base}/same", headers=task,
                            crawl_credentials=True)
    first = lower(a.headers_of(f"/to/{b.base}/landed"))
    assert (first["authorization"], first["x-api-key"]) == ("Bearer " + TASK_TOKEN, CRAWL_KEY)
    landed = lower(b.headers_of("/landed"))
    assert "authorization" not in landed and "x-api-key" not in landed
    assert (landed["accept-language"], landed["x-crawl"], landed["x-task"]) == ("de", "c", "t")
    same = lower(a.headers_of("/same"))  # same origin: every header stays
    assert (same["authorization"], same["x-api-key"]) == ("Bearer " + TASK_TOKEN, CRAWL_KEY)


async def test_a_fetch_without_crawl_credentials_sends_only_plain_crawl_headers() -> None:
    async with origin() as a, Fetcher(FetchSettings(allow_private=True,
                                                    headers=CRAWL_HEADERS)) as fetcher:
        await fetcher.fetch(f"{a.base}/robots.txt")
    got = lower(a.headers_of("/robots.txt"))
    assert (got["accept-language"], got["x-crawl"]) == ("de", "c")
    assert "x-api-key" not in got


async def test_crawl_and_task_headers_reach_the_server_from_producer_to_consumer(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    common = ["--redis-url", redis_url, "--crawl", crawl_name, "--cluster", "no"]
    async with origin() as site:
        # The producer's headers: stored on these tasks only; one overrides the crawl's.
        assert await producer_main([*common, "--url", f"{site.base}/task",
                                    "--header", "Accept-Language: fr",
                                    "--header", f"Authorization: Bearer {TASK_TOKEN}",
                                    "--progress", "off"], out=io.StringIO()) == 0
        out = io.StringIO()  # headers don't change a task's identity: a duplicate
        assert await producer_main([*common, "--url", f"{site.base}/task", "--json",
                                    "--header", "X-Other: o", "--progress", "off"],
                                   out=out) == 0
        assert json.loads(out.getvalue())["duplicates"] == 1
        assert await producer_main([*common, "--url", f"{site.base}/plain",
                                    "--progress", "off"], out=io.StringIO()) == 0
        settings = settings_from_args(build_parser().parse_args([
            *common, "--output", str(tmp_path), "--exit-when-empty", "--empty-grace", "0",
            "--allow-private", "--http-port", "-1", "--per-host-delay", "0",
            "--header", "Accept-Language: de", "--header", f"X-Api-Key: {CRAWL_KEY}"]))
        assert await asyncio.wait_for(run(settings), 60) == 0
    plain, task, robots = (lower(site.headers_of(p)) for p in ("/plain", "/task", "/robots.txt"))
    assert (plain["accept-language"], plain["x-api-key"]) == ("de", CRAWL_KEY)
    assert "authorization" not in plain
    assert (task["accept-language"], task["x-api-key"]) == ("fr", CRAWL_KEY)
    assert "x-other" not in task
    assert task["authorization"] == f"Bearer {TASK_TOKEN}"
    # robots.txt: the crawl's plain headers, no credential, no task's header.
    assert robots["accept-language"] == "de"
    assert "x-api-key" not in robots and "authorization" not in robots
    logged = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert "consumer_started" in logged
    assert not any(s in logged for s in SECRETS)
    results = jsonl_text(tmp_path)
    assert results.count('"status":200') == 2 and not any(s in results for s in SECRETS)


async def test_malformed_h_is_dead_lettered_and_no_header_value_is_shown(
        redis_client: aioredis.Redis, redis_url: str, crawl_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with origin() as site:
        queue = await CrawlQueue.open(redis_client, crawl_name)
        bad, dead5xx = f"{site.base}/bad", f"{site.base}/fail"
        secret = {"Authorization": f"Bearer {TASK_TOKEN}"}
        # enqueue() does not check headers: decode_entry does, at the lease.
        await queue.enqueue([
            NewTask(bad, fingerprint(bad), headers={**secret, "Host": TASK_TOKEN}),
            NewTask(dead5xx, fingerprint(dead5xx), max_attempts=1, headers=secret),
        ])
        settings = settings_from_args(build_parser().parse_args([
            "--redis-url", redis_url, "--crawl", crawl_name, "--output", str(tmp_path),
            "--exit-when-empty", "--empty-grace", "0", "--allow-private", "--http-port", "-1",
            "--per-host-delay", "0", "--ignore-robots", "--cluster", "no"]))
        assert await asyncio.wait_for(run(settings), 60) == 0
    dead = {d.url: d for d in await queue.dead_list()}
    assert dead[bad].reason == "malformed"
    assert dead[bad].message.startswith("task headers: header 'Host' can't be set")
    assert dead[dead5xx].reason == "http_5xx"
    assert not any(s in d.message for d in dead.values() for s in SECRETS)
    assert site.headers_of("/fail")["Authorization"] == f"Bearer {TASK_TOKEN}"
    assert "/bad" not in [p for p, _ in site.seen]
    capsys.readouterr()
    for fmt in ((), ("--json",)):
        assert await crawlq_main(["dead", "ls", *fmt, "--redis-url", redis_url,
                                  "--crawl", crawl_name, "--cluster", "no"]) == 0
        shown = capsys.readouterr().out
        assert "malformed" in shown and "http_5xx" in shown
        assert not any(s in shown for s in SECRETS)
    client = TestClient(TestServer(make_app(redis_client, token=None, bind_host="127.0.0.1"),
                                   host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.get(f"/api/crawls/{crawl_name}/dead")
        doc: Any = await resp.json()
    finally:
        await client.close()
    assert {i["reason"] for i in doc["items"]} == {"malformed", "http_5xx"}
    assert not any(s in json.dumps(doc) for s in SECRETS)
