"""Redis Stream sink: XADD each record to one stream, capped with ``MAXLEN ~``.

One non-transactional pipeline per batch; `write()` returns when Redis has answered
every XADD. Fields (all strings or bytes on the wire)::

    url, final_url, status ("" when there was no response), outcome, bytes, elapsed,
    attempt, fetched_at, worker, task_id, depth, items (JSON, only when non-empty),
    body (raw bytes, only with store_body and a body)

``MAXLEN ~ stream_maxlen`` keeps memory bounded: Redis trims whole stream nodes, so the
length stays at or a little above the cap. A downstream reader that falls further
behind than the cap loses the oldest entries; size the cap for that.

The Redis client belongs to the caller: `close()` does not close it. Connection
errors, timeouts and out-of-memory refusals raise `RedisUnavailableError`; records of
a failed batch may be partly added (at-least-once: they are added again on retry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import ujson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import ConfigError, RedisUnavailableError
from consumer.sinks.base import Record

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

    from common.redis.connection import RedisClient

__all__ = ["StreamSink", "stream_fields"]


def stream_fields(record: Record, *, store_body: bool) -> dict[FieldT, EncodableT]:
    """The XADD fields of one record."""
    fields: dict[FieldT, EncodableT] = {
        "url": record.url,
        "final_url": record.final_url,
        "status": "" if record.status is None else record.status,
        "outcome": record.outcome,
        "bytes": record.bytes,
        "elapsed": repr(float(record.elapsed)),
        "attempt": record.attempt,
        "fetched_at": repr(float(record.fetched_at)),
        "worker": record.worker,
        "task_id": record.task_id,
        "depth": record.depth,
    }
    if record.items:
        fields["items"] = ujson.dumps(
            record.items, ensure_ascii=False, escape_forward_slashes=False, default=str
        )
    if store_body and record.body is not None:
        fields["body"] = record.body
    return fields


class StreamSink:
    """XADDs records to `stream_key`; see the module docstring for the fields."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        stream_key: str,
        stream_maxlen: int,
        store_body: bool = False,
    ) -> None:
        if not stream_key:
            raise ConfigError("the redis-stream sink needs a stream key")
        if stream_maxlen <= 0:
            raise ConfigError(f"stream_maxlen must be positive, got {stream_maxlen}")
        self.redis = redis
        self.stream_key = stream_key
        self.stream_maxlen = stream_maxlen
        self.store_body = store_body
        self._closed = False

    async def open(self) -> None:
        """Nothing to prepare: the stream is created by the first XADD."""
        if self._closed:
            raise RuntimeError("sink is closed")

    async def write(self, records: Sequence[Record]) -> None:
        """XADD every record in one pipeline; returns once Redis acknowledged all."""
        if self._closed:
            raise RuntimeError("sink is closed")
        if not records:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for record in records:
                    pipe.xadd(
                        self.stream_key,
                        stream_fields(record, store_body=self.store_body),
                        maxlen=self.stream_maxlen,
                        approximate=True,
                    )
                await pipe.execute()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailableError(f"XADD to {self.stream_key!r} failed: {exc}") from exc
        except ResponseError as exc:
            if str(exc).startswith("OOM"):
                raise RedisUnavailableError(
                    f"Redis refused XADD to {self.stream_key!r} (out of memory): {exc}"
                ) from exc
            raise

    async def close(self) -> None:
        """Mark the sink closed; the Redis client is the caller's to close."""
        self._closed = True
