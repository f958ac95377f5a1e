"""Result sinks: files and a stream read back, every record exactly once."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from warcio.archiveiterator import ArchiveIterator

from common.errors import ConfigError, RedisUnavailableError
from consumer.sinks import JsonlSink, Record, Sink, StreamSink, WarcSink, make_sink
from consumer.sinks.base import INLINE_WRITE_BYTES, SLOW_WRITE_S
from consumer.sinks.jsonl import encode_record, encode_records


def _record(i: int, *, status: int | None = 200, body: bytes | None = None) -> Record:
    if body is None and status is not None:
        body = f"<html><body>page {i} \u00e9t\u00e9 {'x' * (i % 50)}</body></html>".encode()
    return Record(
        task_id=f"id{i:05d}",
        url=f"http://example.test/p/{i}",
        final_url=f"http://example.test/p/{i}" if i % 3 else f"https://example.test/final/{i}",
        status=status,
        outcome="ok" if status is not None else "robots_disallowed",
        headers={"content-type": "text/html; charset=utf-8"} if status is not None else {},
        raw_headers=[
            (b"Content-Type", b"text/html; charset=utf-8"),
            (b"Content-Encoding", b"gzip"),
            (b"Transfer-Encoding", b"chunked"),
            (b"Content-Length", b"17"),
            (b"Set-Cookie", b"a=1"),
        ]
        if status is not None
        else [],
        body=body,
        bytes=len(body) if body is not None else 0,
        elapsed=0.125 + i / 1000,
        attempt=1 + i % 2,
        fetched_at=1_780_000_000.5 + i,
        worker="host-1:42",
        items=[{"title": f"t{i}", "n": i}] if i % 2 else [],
        depth=i % 4,
        meta={"source": "seed"},
        fence=100 + i,
    )


def _batches(n: int, size: int) -> list[list[Record]]:
    records = [_record(i) for i in range(n)]
    return [records[i : i + size] for i in range(0, n, size)]


def _files(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def _read_jsonl(files: list[Path]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                assert line.endswith("\n")
                rows.append(json.loads(line))
    return rows


# -- jsonl --------------------------------------------------------------------------


async def test_jsonl_writes_every_record_once(tmp_path: Path) -> None:
    sink = make_sink(
        "jsonl", output_dir=tmp_path, worker="w1", crawl="c1", redis=None,
        rotate_bytes=1 << 30, gzip=False, store_body=True, stream_maxlen=1, stream_key="",
    )  # fmt: skip
    assert isinstance(sink, JsonlSink)
    assert isinstance(sink, Sink)
    await sink.open()
    for batch in _batches(200, 64):
        await sink.write(batch)
    await sink.write([])
    await sink.close()
    await sink.close()  # idempotent

    files = _files(tmp_path)
    assert [p.name for p in files] == ["c1-w1-00000.jsonl"]
    rows = _read_jsonl(files)
    assert [r["task_id"] for r in rows] == [f"id{i:05d}" for i in range(200)]
    row = rows[7]
    original = _record(7)
    assert original.body is not None
    assert row["url"] == original.url
    assert row["final_url"] == original.final_url
    assert row["status"] == 200
    assert row["outcome"] == "ok"
    assert row["headers"] == {"content-type": "text/html; charset=utf-8"}
    assert row["bytes"] == len(original.body)
    assert row["elapsed"] == pytest.approx(original.elapsed)
    assert row["attempt"] == original.attempt
    assert row["fetched_at"] == pytest.approx(original.fetched_at)
    assert row["worker"] == "host-1:42"
    assert row["depth"] == 3
    assert row["meta"] == {"source": "seed"}
    assert row["items"] == [{"title": "t7", "n": 7}]
    assert row["item_keys"] == [None]  # a plain dict: keyed <unique key>#<index> on load
    assert row["body"] == original.body.decode()
    assert row["body_sha1"] == hashlib.sha1(original.body).hexdigest()
    assert set(row) == {
        "task_id", "url", "final_url", "status", "outcome", "headers", "bytes", "elapsed",
        "attempt", "fetched_at", "worker", "depth", "meta", "items", "item_keys", "item_types",
        "body",
        "body_sha1", "revisit", "digest", "token",
    }  # fmt: skip
    assert row["token"] == 107
    assert (row["revisit"], row["digest"]) == (None, None)  # a first visit, not digested

    with pytest.raises(RuntimeError):
        await sink.write([_record(1)])


async def test_jsonl_without_body_keeps_sha1_and_handles_odd_values(tmp_path: Path) -> None:
    sink = JsonlSink(output_dir=tmp_path, crawl="c", worker="w", store_body=False)
    odd = _record(1, body=b"\xff\xfe not utf-8")
    odd.meta = {"nan": float("nan"), "obj": object(), "surrogate": "\ud800"}
    no_response = _record(2, status=None)
    await sink.write([odd, no_response])
    await sink.close()
    rows = _read_jsonl(_files(tmp_path))
    assert rows[0]["body"] is None
    assert rows[0]["body_sha1"] == hashlib.sha1(b"\xff\xfe not utf-8").hexdigest()
    meta = rows[0]["meta"]
    assert isinstance(meta, dict)
    assert meta["nan"] is None
    assert rows[1]["status"] is None
    assert rows[1]["body"] is None
    assert rows[1]["body_sha1"] is None


@pytest.mark.parametrize("nested", [
    [{"a": 1}, {"task_id": "x"}],  # an object boundary lookalike inside items
    ["},{", ',{"task_id":', "\n"],  # lookalikes inside strings (escaped or harmless)
])
def test_encode_records_is_one_line_per_record_whatever_items_hold(nested: list[Any]) -> None:
    batch = [_record(i) for i in range(5)]
    batch[2].items = nested
    batch[3].meta = {"k": nested}
    lines = encode_records(batch, store_body=False).decode().split("\n")
    assert lines[-1] == ""
    rows = [json.loads(line) for line in lines[:-1]]
    assert [r["task_id"] for r in rows] == [r.task_id for r in batch]
    assert rows[2]["items"] == nested and rows[3]["meta"] == {"k": nested}
    assert [encode_record(r, store_body=False) for r in batch] == [
        (line + "\n").encode() for line in lines[:-1]]


async def test_jsonl_store_body_replaces_invalid_utf8(tmp_path: Path) -> None:
    sink = JsonlSink(output_dir=tmp_path, crawl="c", worker="w", store_body=True)
    await sink.write([_record(1, body=b"ok \xff end")])
    await sink.close()
    (row,) = _read_jsonl(_files(tmp_path))
    assert row["body"] == "ok \ufffd end"


@pytest.mark.parametrize("use_gzip", [False, True])
async def test_jsonl_rotates_by_size(tmp_path: Path, use_gzip: bool) -> None:
    sink = JsonlSink(
        output_dir=tmp_path, crawl="rot", worker="w/1", rotate_bytes=4096, gzip=use_gzip,
        store_body=True,
    )  # fmt: skip
    n = 600
    for batch in _batches(n, 64):
        await sink.write(batch)
    await sink.close()

    files = _files(tmp_path)
    suffix = ".jsonl.gz" if use_gzip else ".jsonl"
    assert len(files) > 2
    assert files == sink.files
    assert [p.name for p in files] == [f"rot-w_1-{i:05d}{suffix}" for i in range(len(files))]
    # every closed-by-rotation file passed the limit; none is empty
    for path in files[:-1]:
        assert path.stat().st_size >= 4096
    assert all(p.stat().st_size > 0 for p in files)
    rows = _read_jsonl(files)
    ids = [r["task_id"] for r in rows]
    assert sorted(ids) == [f"id{i:05d}" for i in range(n)]
    assert len(set(ids)) == n


async def test_jsonl_gzip_is_valid_after_every_batch_and_after_close(tmp_path: Path) -> None:
    sink = JsonlSink(output_dir=tmp_path, crawl="gz", worker="w", gzip=True)
    batches = _batches(300, 100)
    await sink.write(batches[0])
    (path,) = sink.files
    with gzip.open(path, "rt", encoding="utf-8") as fh:  # readable while still open
        assert len(fh.readlines()) == 100
    for batch in batches[1:]:
        await sink.write(batch)
    await sink.close()
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    lines = data.decode().splitlines()
    assert len(lines) == 300
    assert all(json.loads(line)["worker"] == "host-1:42" for line in lines)


async def test_jsonl_restart_does_not_overwrite_files(tmp_path: Path) -> None:
    for run in range(2):
        sink = JsonlSink(output_dir=tmp_path, crawl="c", worker="w")
        await sink.open()
        await sink.write([_record(run)])
        await sink.close()
    assert [p.name for p in _files(tmp_path)] == ["c-w-00000.jsonl", "c-w-00001.jsonl"]
    assert len(_read_jsonl(_files(tmp_path))) == 2


async def test_jsonl_concurrent_writes_never_interleave(tmp_path: Path) -> None:
    sink = JsonlSink(output_dir=tmp_path, crawl="c", worker="w", rotate_bytes=8192)
    await asyncio.gather(*(sink.write(batch) for batch in _batches(400, 20)))
    await sink.close()
    rows = _read_jsonl(sink.files)
    assert sorted(r["task_id"] for r in rows) == [f"id{i:05d}" for i in range(400)]


class _FailOnce(JsonlSink):
    """A JSON lines sink whose second batch fails half-way, like a full disk."""

    calls = 0

    def _encode_and_write(self, fh: BinaryIO, records: list[Record]) -> None:
        self.calls += 1
        if self.calls == 2:
            fh.write(b"\x1f\x8b torn")
            raise OSError(28, "No space left on device")
        super()._encode_and_write(fh, records)


async def test_failed_write_starts_a_new_file(tmp_path: Path) -> None:
    sink = _FailOnce(output_dir=tmp_path, crawl="c", worker="w", gzip=True)
    batches = _batches(30, 10)
    await sink.write(batches[0])
    with pytest.raises(OSError, match="No space"):
        await sink.write(batches[1])
    await sink.write(batches[2])
    await sink.close()
    assert [p.name for p in sink.files] == ["c-w-00000.jsonl.gz", "c-w-00001.jsonl.gz"]
    with gzip.open(sink.files[1], "rt") as fh:
        assert [json.loads(line)["task_id"] for line in fh] == [r.task_id for r in batches[2]]


async def test_close_without_writes_creates_no_file(tmp_path: Path) -> None:
    for sink in (
        JsonlSink(output_dir=tmp_path / "j", crawl="c", worker="w"),
        WarcSink(output_dir=tmp_path / "w", crawl="c", worker="w"),
    ):
        await sink.open()
        await sink.close()
    assert _files(tmp_path / "j") == []
    assert _files(tmp_path / "w") == []


def _revisit(i: int, outcome: str) -> Record:
    """A revisit's record as the consumer writes it: a 304 (no body) or a 200."""
    rec = _record(i, status=304 if outcome == "not_modified" else 200,
                  body=b"" if outcome == "not_modified" else None)
    rec.final_url = rec.url
    rec.outcome = outcome
    rec.digest = f"{i:016x}"
    rec.refers_to_s = 1_770_000_000
    return rec


async def test_jsonl_says_which_revisit_it_was_and_the_digest(tmp_path: Path) -> None:
    sink = JsonlSink(output_dir=tmp_path, crawl="c", worker="w")
    first = _record(0)
    first.digest = "00000000000000aa"
    await sink.write([first, *(_revisit(i, o) for i, o in
                               enumerate(("not_modified", "unchanged", "changed"), 1))])
    await sink.close()
    rows = _read_jsonl(sink.files)
    assert [(r["outcome"], r["revisit"], r["digest"]) for r in rows] == [
        ("ok", None, "00000000000000aa"),
        ("not_modified", "not_modified", "0000000000000001"),
        ("unchanged", "unchanged", "0000000000000002"),
        ("changed", "changed", "0000000000000003"),
    ]


# -- warc ---------------------------------------------------------------------------


def _read_warc(files: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in files:
        with path.open("rb") as fh:
            for rec in ArchiveIterator(fh, check_digests="raise"):  # digests must verify
                out.append(
                    {
                        "file": path.name,
                        "type": rec.rec_type,
                        "uri": rec.rec_headers.get_header("WARC-Target-URI"),
                        "date": rec.rec_headers.get_header("WARC-Date"),
                        "warcinfo_id": rec.rec_headers.get_header("WARC-Warcinfo-ID"),
                        "record_id": rec.rec_headers.get_header("WARC-Record-ID"),
                        "task_uri": rec.rec_headers.get_header("WARC-Crawlq-Task-URI"),
                        "status": rec.http_headers.get_statuscode() if rec.http_headers else None,
                        "http": rec.http_headers,
                        "body": rec.content_stream().read(),
                    }
                )
    return out


async def test_warc_round_trip(tmp_path: Path) -> None:
    sink = make_sink(
        "warc", output_dir=tmp_path, worker="w1", crawl="arc", redis=None,
        rotate_bytes=1 << 30, gzip=True, store_body=False, stream_maxlen=1, stream_key="",
    )  # fmt: skip
    assert isinstance(sink, WarcSink)
    records = [_record(i) for i in range(20)]
    records[5] = _record(5, status=None)  # robots_disallowed: a metadata record
    records[6] = _record(6, status=404, body=b"")
    records[7] = _record(7, status=599, body=b"odd status")
    await sink.open()
    await sink.write(records[:10])
    await sink.write(records[10:])
    await sink.close()

    files = _files(tmp_path)
    assert [p.name for p in files] == ["arc-w1-00000.warc.gz"]
    got = _read_warc(files)
    assert got[0]["type"] == "warcinfo"
    info = got[0]["body"]
    assert isinstance(info, bytes)
    assert b"isPartOf: arc" in info
    assert b"software: crawlq" in info
    assert len(got) == 21
    for rec, out in zip(records, got[1:], strict=True):
        assert out["warcinfo_id"] == got[0]["record_id"]
        if rec.status is None:
            assert out["type"] == "metadata"
            assert out["uri"] == rec.url
            body = out["body"]
            assert isinstance(body, bytes)
            assert b"crawlq-outcome: robots_disallowed" in body
            assert f"crawlq-task-id: {rec.task_id}".encode() in body
            continue
        assert out["type"] == "response"
        assert out["uri"] == rec.final_url
        assert out["task_uri"] == (rec.url if rec.url != rec.final_url else None)
        assert out["status"] == str(rec.status)
        assert out["body"] == rec.body
        expected = datetime.fromtimestamp(rec.fetched_at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert out["date"] == expected
        http = out["http"]
        assert http is not None
        assert http.get_header("Content-Type") == "text/html; charset=utf-8"
        assert http.get_header("Set-Cookie") == "a=1"
        assert http.get_header("Content-Encoding") is None
        assert http.get_header("Transfer-Encoding") is None
        assert http.get_header("X-Crawlq-Orig-Content-Encoding") == "gzip"
        assert http.get_header("Content-Length") == str(len(rec.body or b""))
    assert got[1]["http"].protocol == "HTTP/1.1"
    assert got[1]["http"].statusline == "200 OK"


async def test_warc_revisit_records_for_not_modified_and_unchanged(tmp_path: Path) -> None:
    sink = WarcSink(output_dir=tmp_path, crawl="v", worker="w")
    records = [_revisit(1, "not_modified"), _revisit(2, "unchanged"), _revisit(3, "changed")]
    records[1].refers_to_s = 0  # the previous visit's time not known: no Refers-To-Date
    await sink.write(records)
    await sink.close()
    with sink.files[0].open("rb") as fh:
        got = [(rec.rec_type, rec.rec_headers, rec.http_headers, rec.content_stream().read())
               for rec in ArchiveIterator(fh, check_digests="raise")][1:]
    profile = "http://netpreserve.org/warc/1.1/revisit/"
    (t304, h304, http304, b304), (tsame, hsame, httpsame, bsame), (tnew, _, _, bnew) = got
    assert (t304, tsame, tnew) == ("revisit", "revisit", "response")
    assert h304.get_header("WARC-Profile") == profile + "server-not-modified"
    assert hsame.get_header("WARC-Profile") == profile + "identical-payload-digest"
    for headers, rec in ((h304, records[0]), (hsame, records[1])):
        assert headers.get_header("WARC-Target-URI") == rec.url
        assert headers.get_header("WARC-Refers-To-Target-URI") == rec.url
    assert h304.get_header("WARC-Refers-To-Date") == "2026-02-02T02:40:00Z"
    assert hsame.get_header("WARC-Refers-To-Date") is None
    assert h304.get_header("WARC-Payload-Digest") is None  # a 304 shows no payload
    body = records[1].body
    assert body is not None
    sha1 = base64.b32encode(hashlib.sha1(body).digest()).decode()
    assert hsame.get_header("WARC-Payload-Digest") == "sha1:" + sha1
    assert http304.get_statuscode() == "304" and httpsame.get_statuscode() == "200"
    assert (b304, bsame, bnew) == (b"", b"", records[2].body)  # revisits hold no payload


async def test_warc_date_is_fetched_at(tmp_path: Path) -> None:
    sink = WarcSink(output_dir=tmp_path, crawl="d", worker="w")
    rec = _record(0)
    rec.fetched_at = 1_780_000_000.25  # 2026-05-28T20:26:40.25Z
    await sink.write([rec])
    await sink.close()
    got = _read_warc(sink.files)
    assert got[1]["date"] == "2026-05-28T20:26:40.250000Z"


async def test_warc_rotates_with_warcinfo_in_every_file(tmp_path: Path) -> None:
    sink = WarcSink(output_dir=tmp_path, crawl="r", worker="w", rotate_bytes=4096)
    for batch in _batches(300, 32):
        await sink.write(batch)
    await sink.close()
    files = _files(tmp_path)
    assert len(files) > 1
    assert files == sink.files
    got = _read_warc(files)
    seen: list[object] = []
    for path in files:
        in_file = [g for g in got if g["file"] == path.name]
        assert in_file[0]["type"] == "warcinfo"
        assert [g["type"] for g in in_file[1:]] == ["response"] * (len(in_file) - 1)
        seen.extend(g["uri"] for g in in_file[1:])
    assert sorted(map(str, seen)) == sorted(r.final_url for b in _batches(300, 32) for r in b)


# -- redis stream -------------------------------------------------------------------


async def test_stream_fields_and_length(redis_client: aioredis.Redis, crawl_name: str) -> None:
    key = f"crawlq:{crawl_name}:results"
    sink = make_sink(
        "redis-stream", output_dir=Path("."), worker="w1", crawl=crawl_name,
        redis=redis_client, rotate_bytes=1, gzip=False, store_body=True,
        stream_maxlen=10_000, stream_key=key,
    )  # fmt: skip
    assert isinstance(sink, StreamSink)
    records = [_record(i) for i in range(50)]
    records[3] = _record(3, status=None)
    await sink.open()
    await sink.write(records[:25])
    await sink.write(records[25:])
    await sink.write([])
    await sink.close()
    assert await redis_client.xlen(key) == 50

    entries = await redis_client.xrange(key)
    assert [e[1][b"task_id"].decode() for e in entries] == [r.task_id for r in records]
    fields = entries[1][1]
    rec = records[1]
    assert fields[b"url"].decode() == rec.url
    assert fields[b"final_url"].decode() == rec.final_url
    assert fields[b"status"] == b"200"
    assert fields[b"outcome"] == b"ok"
    assert int(fields[b"bytes"]) == rec.bytes
    assert float(fields[b"elapsed"]) == rec.elapsed
    assert int(fields[b"attempt"]) == rec.attempt
    assert float(fields[b"fetched_at"]) == rec.fetched_at
    assert fields[b"worker"] == b"host-1:42"
    assert fields[b"body"] == rec.body
    assert json.loads(fields[b"items"]) == rec.items
    assert entries[3][1][b"status"] == b""
    assert b"body" not in entries[3][1]
    assert b"items" not in entries[0][1]  # no items: field left out


async def test_stream_without_body(redis_client: aioredis.Redis, crawl_name: str) -> None:
    key = f"crawlq:{crawl_name}:results"
    sink = StreamSink(redis_client, stream_key=key, stream_maxlen=100, store_body=False)
    await sink.write([_record(1)])
    (entry,) = await redis_client.xrange(key)
    assert b"body" not in entry[1]
    assert set(entry[1]) >= {
        b"url", b"final_url", b"status", b"outcome", b"bytes", b"elapsed", b"attempt",
        b"fetched_at", b"worker", b"task_id",
    }  # fmt: skip


async def test_stream_maxlen_trims_approximately(
    redis_client: aioredis.Redis, crawl_name: str
) -> None:
    key = f"crawlq:{crawl_name}:results"
    sink = StreamSink(redis_client, stream_key=key, stream_maxlen=50)
    for batch in _batches(2000, 100):
        await sink.write(batch)
    length = await redis_client.xlen(key)
    # MAXLEN ~ trims whole stream nodes (100 entries each by default): never below the
    # cap, and far below what was added.
    assert 50 <= length <= 250
    last = await redis_client.xrevrange(key, count=1)
    assert last[0][1][b"task_id"] == b"id01999"


async def test_stream_unreachable_redis_raises_redis_unavailable() -> None:
    client = aioredis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        sink = StreamSink(client, stream_key="k", stream_maxlen=10)
        with pytest.raises(RedisUnavailableError):
            await sink.write([_record(1)])
    finally:
        await client.aclose()


# -- make_sink ----------------------------------------------------------------------


def test_make_sink_rejects_bad_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown sink"):
        make_sink("parquet", output_dir=tmp_path, worker="w", crawl="c")
    with pytest.raises(ConfigError, match="Redis client"):
        make_sink("redis-stream", output_dir=tmp_path, worker="w", crawl="c", stream_key="k")
    with pytest.raises(ConfigError, match="rotate_bytes"):
        make_sink("jsonl", output_dir=tmp_path, worker="w", crawl="c", rotate_bytes=0)


class _WriteThreads(JsonlSink):
    """Notes the thread each batch is written in; can be made slow once."""

    threads: list[int]
    slow_once = 0.0

    def _encode_and_write(self, fh: BinaryIO, records: list[Record]) -> None:
        self.threads.append(threading.get_ident())
        if self.slow_once:
            time.sleep(self.slow_once)
            self.slow_once = 0.0
        super()._encode_and_write(fh, records)


async def test_small_batches_are_written_on_the_loop_large_ones_in_a_thread(
        tmp_path: Path) -> None:
    sink = _WriteThreads(output_dir=tmp_path, crawl="c", worker="w", store_body=True)
    sink.threads = []
    small = [_record(i, body=b"x" * 1000) for i in range(10)]
    large = [_record(10 + i, body=b"y" * (INLINE_WRITE_BYTES // 4)) for i in range(5)]
    await sink.write(small)
    await sink.write(large)
    await sink.close()
    loop_thread = threading.get_ident()
    assert sink.threads[0] == loop_thread
    assert sink.threads[1] != loop_thread  # ~1.25 MiB of bodies: kept off the loop
    rows = _read_jsonl(sink.files)
    assert [r["task_id"] for r in rows] == [r.task_id for r in small + large]
    assert rows[-1]["body"] == "y" * (INLINE_WRITE_BYTES // 4)


async def test_a_slow_write_on_the_loop_sends_later_batches_to_a_thread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = _WriteThreads(output_dir=tmp_path, crawl="c", worker="w")
    sink.threads, sink.slow_once = [], SLOW_WRITE_S + 0.05  # a disk stalling once
    batches = _batches(30, 10)
    for batch in batches:
        await sink.write(batch)
    await sink.close()
    loop_thread = threading.get_ident()
    assert sink.threads[0] == loop_thread
    assert loop_thread not in sink.threads[1:]
    assert "sink_slow_write" in caplog.text
    assert [r["task_id"] for r in _read_jsonl(sink.files)] == [
        r.task_id for b in batches for r in b]
