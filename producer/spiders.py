"""A spider's start requests as a producer source (``--spider``).

``spider.start()`` runs here, in the producer: its URLs and Requests go through the same
pipeline as JSON lines of requests (canonicalized, deduplicated, a label no route knows
refused), in chunks, so a run on a schedule (``--every``) enqueues only what is new. A
start request the spider refuses (a label it has no route for, a bad Request) stops the
run with that message (exit 2; batches before it are in, and a re-run after the fix is
idempotent); anything else its code raises is a source that could not be read (exit 4).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from common.errors import ConfigError, InvalidRequestError, SourceError, UnknownLabelError
from common.spider import Spider
from common.tasks.request import Request
from producer.sources import Chunk

__all__ = ["CHUNK_REQUESTS", "spider_chunks"]

#: Start requests per chunk: one enqueue batch's worth.
CHUNK_REQUESTS = 1000


async def spider_chunks(spider: Spider, size: int = CHUNK_REQUESTS
                        ) -> AsyncGenerator[Chunk, None]:
    """`spider`'s start requests, in chunks of requests."""
    origin = f"spider {spider.name}"
    line = 1
    chunk: list[str | Request] = []
    requests = spider.start()
    while True:
        try:
            request = next(requests, None)
        except (InvalidRequestError, UnknownLabelError) as exc:
            raise ConfigError(f"{origin}, start request {line + len(chunk)}: {exc}") from None
        except Exception as exc:
            raise SourceError(f"{origin}: start() raised {type(exc).__name__}: "
                              f"{str(exc)[:300]}") from None
        if request is None:
            break
        chunk.append(request)
        if len(chunk) >= size:
            yield Chunk(origin, line, chunk, requests=True)
            line += len(chunk)
            chunk = []
    if chunk:
        yield Chunk(origin, line, chunk, requests=True)
