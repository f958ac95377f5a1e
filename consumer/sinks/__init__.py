"""Result sinks: where a consumer puts what it fetched.

``jsonl`` (default): JSON lines files, size-rotated, optional gzip (`JsonlSink`).
``warc``: WARC/1.1 gzip files via warcio (`WarcSink`).
``redis-stream``: XADD to a capped Redis Stream (`StreamSink`).
``postgres://...``: items upserted by key into a table (`consumer.sinks.postgres`; asyncpg
is imported only for it).

Every sink follows the `Sink` protocol: `open()`, `write(records)` returning only once
the records have reached the sink (the consumer acks after it), `close()`. File sinks
and the PostgreSQL sink also have `probe()` (`ProbingSink`): whether they take writes
again.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError
from common.urls.redact import redact_url
from consumer.sinks.base import (
    DEFAULT_ROTATE_BYTES,
    NamedSink,
    ProbingSink,
    Record,
    RotatingFileSink,
    Sink,
    SinkUnavailableError,
    is_postgres_url,
)
from consumer.sinks.jsonl import JsonlSink
from consumer.sinks.stream import StreamSink
from consumer.sinks.warc import WarcSink

if TYPE_CHECKING:
    from common.redis.connection import RedisClient

__all__ = [
    "DEFAULT_ROTATE_BYTES",
    "SINK_KINDS",
    "JsonlSink",
    "NamedSink",
    "ProbingSink",
    "Record",
    "Sink",
    "SinkUnavailableError",
    "StreamSink",
    "WarcSink",
    "make_sink",
    "sink_kind",
    "sink_target",
]

SINK_KINDS = ("jsonl", "warc", "redis-stream")
DEFAULT_STREAM_MAXLEN = 1_000_000


def _unknown(text: str) -> ConfigError:
    return ConfigError(f"unknown sink {redact_url(text)!r}; use one of {', '.join(SINK_KINDS)} "
                       "or postgres://user@host:5432/db")


def sink_kind(text: str) -> str:
    """A ``--sink`` value checked: one of SINK_KINDS or a postgres:// URL (ConfigError)."""
    if text in SINK_KINDS or is_postgres_url(text):
        return text
    raise _unknown(text)


def make_sink(
    kind: str,
    *,
    output_dir: Path,
    worker: str,
    crawl: str,
    redis: RedisClient | None = None,
    rotate_bytes: int = DEFAULT_ROTATE_BYTES,
    gzip: bool = False,
    store_body: bool = False,
    stream_maxlen: int = DEFAULT_STREAM_MAXLEN,
    stream_key: str = "",
    item_types: Collection[str] = (),
    untyped: bool = True,
) -> Sink:
    """Build the sink named `kind` (one of SINK_KINDS, or a postgres:// URL); ConfigError
    for anything else.

    Options that do not apply to a kind are ignored: `gzip` (WARC files are always
    gzip, streams never), `store_body` for WARC (always stored), file options for
    ``redis-stream``. `item_types` (a spider's) are the tables the PostgreSQL sink
    prepares at open besides its own (none: `untyped` False).
    """
    if is_postgres_url(kind):
        from consumer.sinks.postgres import PostgresSink  # noqa: PLC0415 - asyncpg only here

        return PostgresSink(kind, item_types=item_types, untyped=untyped)
    if kind == "jsonl":
        return JsonlSink(
            output_dir=output_dir,
            crawl=crawl,
            worker=worker,
            rotate_bytes=rotate_bytes,
            gzip=gzip,
            store_body=store_body,
        )
    if kind == "warc":
        return WarcSink(
            output_dir=output_dir, crawl=crawl, worker=worker, rotate_bytes=rotate_bytes
        )
    if kind == "redis-stream":
        if redis is None:
            raise ConfigError("the redis-stream sink needs a Redis client")
        return StreamSink(
            redis, stream_key=stream_key, stream_maxlen=stream_maxlen, store_body=store_body
        )
    raise _unknown(kind)


def sink_target(sink: Sink) -> tuple[str, str]:
    """The kind of `sink` and where it writes (a directory, a stream key), for operators."""
    if isinstance(sink, StreamSink):
        return "redis-stream", f"stream {sink.stream_key}"
    if isinstance(sink, NamedSink):
        return sink.kind, sink.where
    if isinstance(sink, RotatingFileSink):
        kind = "warc" if isinstance(sink, WarcSink) else "jsonl"
        return kind, f"directory {sink.output_dir}"
    return type(sink).__name__, "?"
