"""The producer pipeline: lines -> canonical URLs -> batches of NewTask -> CrawlQueue.enqueue.

A source of requests (``Chunk.requests``) gives JSON objects instead of URLs, each made a
`Request` (``common.tasks.request.request_from_dict``): a line that isn't JSON is rejected as
``bad_json``, one that isn't a valid request (a bad method or label, data that isn't a
JSON object, a body over the cap, a label no route knows) as ``bad_request``, with the
message saying why; its URL is canonicalized and rejected as any URL is. Its task gets the
run's template where the request says nothing: the run's priority when its own is 0, the
run's headers under its own.

Each batch is deduplicated and enqueued by one script call per partition, which is
atomic: a producer killed mid-run leaves every batch either fully in or fully out, and
a re-run enqueues exactly what is missing (the rest is counted as duplicates).

One batch is in flight while the next one is built, so Redis runs the enqueue script
for batch N while Python canonicalizes and hashes batch N+1. A stop request (SIGTERM)
is honoured between batches: the batch being built is sent, the run ends cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any, cast

from common import codec
from common.errors import InvalidRequestError, SourceError
from common.fleet.wake import WakeChannel
from common.queue import CrawlQueue, EnqueueResult, NewTask
from common.tasks.request import Request, checked, request_from_dict
from common.tasks.task import DEFAULT_MAX_ATTEMPTS
from common.urls.canonical import Rejection, canonicalize
from common.urls.redact import redact_url
from producer.progress import Progress
from producer.sources import MAX_REQUEST_LINE_BYTES, Chunk
from producer.summary import MAX_SHOWN_REJECTS, Reject, Summary

__all__ = ["RejectWriter", "TaskTemplate", "produce"]

log = logging.getLogger("producer")

_REJECT_URL_CHARS = 2048
_YIELDS = 4
#: Reject reasons of a line of requests (besides the URL's own: common.urls.canonical.RejectReason).
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """What every task of a run gets besides its URL."""

    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # the policy's max_attempts default
    meta: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # common.tasks.headers


class RejectWriter:
    """Writes every reject as one JSON line: origin, line, reason, message, url.

    The URL is cut to 2 KiB and its userinfo (``user:pass@``) is replaced by ``***``.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, reject: Reject, raw: str) -> None:
        url = redact_url(raw.strip()[:_REJECT_URL_CHARS].encode(
            "utf-8", "backslashreplace").decode("utf-8"))
        self._stream.write(codec.dumps({
            "origin": reject.origin, "line": reject.line, "reason": reject.reason,
            "message": reject.message, "url": url}) + "\n")


class _Sender:
    """Keeps up to ``depth`` enqueue calls in flight and folds their results into the summary.

    Two in flight let Redis run one batch's script while this process builds and packs
    the next call (building a call costs about as much CPU as Redis spends running it).
    Each call is atomic on its own, so their order does not matter for correctness.
    """

    def __init__(self, queue: CrawlQueue | None, summary: Summary, depth: int = 2) -> None:
        self._queue = queue
        self._summary = summary
        self._depth = depth
        self._inflight: deque[asyncio.Task[EnqueueResult]] = deque()
        self._warned_layers: set[int] = set()
        self._fresh = False  # enqueued something consumers have not been told of

    async def send(self, batch: list[NewTask]) -> None:
        if self._queue is None:  # dry run
            return
        while len(self._inflight) >= self._depth:
            await self._collect(self._inflight.popleft())
        self._inflight.append(asyncio.create_task(self._queue.enqueue(batch)))
        # Let the call get built and onto the wire (it suspends a few times on the way)
        # before going back to CPU work.
        for _ in range(_YIELDS):
            await asyncio.sleep(0)

    async def wait(self) -> None:
        """Wait for every call in flight; raises the first failure after all have ended."""
        tasks, self._inflight = list(self._inflight), deque()
        failure: BaseException | None = None
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                failure = failure or outcome
            else:
                self._fold(outcome)
        if self._fresh and self._queue is not None:
            self._fresh = False  # idle consumers lease now, not at their next poll
            await WakeChannel(self._queue.client, self._queue.crawl_keys.wake).notify()
        if failure is not None:
            raise failure

    async def _collect(self, task: asyncio.Task[EnqueueResult]) -> None:
        self._fold(await task)

    def _fold(self, result: EnqueueResult) -> None:
        self._fresh = self._fresh or result.enqueued > 0
        s = self._summary
        s.enqueued += result.enqueued
        s.duplicates += result.duplicates
        s.recrawled += result.recrawled
        for layer in result.bloom_warnings:
            if layer not in self._warned_layers:
                self._warned_layers.add(layer)
                log.warning("bloom_layer_filling", extra={
                    "crawl": s.crawl, "layer": layer,
                    "hint": "a bloom filter layer passed 80% of its capacity; a new layer "
                            "is added automatically, at the cost of memory"})


async def produce(
    sources: Sequence[AsyncGenerator[Chunk, None]],
    *,
    queue: CrawlQueue | None,
    summary: Summary,
    template: TaskTemplate,
    batch_size: int = 1000,
    sort_query: bool = False,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
    rejects: RejectWriter | None = None,
    known_labels: Collection[str] | None = None,
) -> Summary:
    """Run every source through the pipeline; ``queue=None`` is a dry run.

    Counts go into ``summary`` as they happen, so a caller that catches an error still
    has what was done before it. A request whose label is not one of `known_labels`
    (the ``--spider``'s; None: any) is rejected.
    """
    started = time.monotonic()
    sender = _Sender(queue, summary)
    by_reason = summary.invalid_by_reason
    shown = summary.first_rejects
    canon = canonicalize
    blake2b = hashlib.blake2b
    priority, max_attempts, meta, depth, headers = (
        template.priority, template.max_attempts, template.meta, template.depth,
        template.headers)
    batch: list[NewTask] = []
    append = batch.append
    read = 0
    stopping = False
    try:
        for source in sources:
            async with contextlib.aclosing(source):  # closes a file left early
                async for chunk in source:
                    if chunk.requests:
                        for line_no, raw in enumerate(chunk.lines, chunk.first_line):
                            made = _request_task(raw, template, sort_query, known_labels)
                            if made is None:
                                continue
                            read += 1
                            if isinstance(made, _Refused):
                                by_reason[made.reason] += 1
                                if len(shown) < MAX_SHOWN_REJECTS or rejects is not None:
                                    _note_reject(summary, rejects, Reject(
                                        chunk.origin, line_no, made.reason, made.message),
                                        made.url)
                                continue
                            append(made)
                            if len(batch) >= batch_size:
                                summary.read = read
                                await sender.send(batch)
                                batch = []
                                append = batch.append
                        summary.read = read
                        if progress is not None:
                            progress.update()
                        if stop is not None and stop.is_set():
                            stopping = True
                            break
                        continue
                    for line_no, raw in enumerate(cast(Sequence[str], chunk.lines),
                                                  chunk.first_line):
                        text = raw.strip()
                        if not text or text[0] == "#":
                            continue
                        read += 1
                        url = canon(text, sort_query=sort_query)
                        if isinstance(url, str):
                            fp = blake2b(url.encode(), digest_size=16).digest()
                            append(NewTask(url, fp, priority, max_attempts, meta, depth, headers))
                            if len(batch) >= batch_size:
                                summary.read = read
                                await sender.send(batch)
                                batch = []
                                append = batch.append
                                if progress is not None:
                                    progress.update()
                                if stop is not None and stop.is_set():
                                    stopping = True
                                    break
                        else:
                            by_reason[url.reason.value] += 1
                            if len(shown) < MAX_SHOWN_REJECTS or rejects is not None:
                                _note_reject(summary, rejects, Reject(
                                    chunk.origin, line_no, url.reason.value, url.message), raw)
                    summary.read = read
                    if progress is not None:
                        progress.update()
                    if stopping or (stop is not None and stop.is_set()):
                        stopping = True
                        break
            if stopping:
                log.info("producer_stopping", extra={"crawl": summary.crawl, "read": read})
                break
        await _finish(sender, batch)
    except SourceError:
        # What was read before the failure is sent too (a re-run is idempotent anyway).
        await _finish(sender, batch)
        raise
    except BaseException:
        with contextlib.suppress(Exception):
            await sender.wait()  # their counts belong in the summary
        raise
    finally:
        summary.read = read
        summary.elapsed_s = time.monotonic() - started
        if progress is not None:
            progress.update()
    return summary


@dataclass(frozen=True, slots=True)
class _Refused:
    reason: str
    message: str
    url: str  # what the reject file shows: the request's URL, never its headers or body


def _request_task(raw: str | Request, template: TaskTemplate, sort_query: bool,
                  known_labels: Collection[str] | None) -> NewTask | _Refused | None:
    """The task of one line of requests, why it is refused, or None for a blank line or
    a ``#`` comment. A line is where its request enters the crawl: it is checked here,
    once (``checked``); a Request given as one (a spider's start request) was checked
    where it entered, by ``Spider.start``. Its label must be one of `known_labels`."""
    if isinstance(raw, str):
        text = raw.strip()
        if not text or text[0] == "#":
            return None
        if len(raw) >= MAX_REQUEST_LINE_BYTES:
            return _Refused(BAD_JSON, f"line is over {MAX_REQUEST_LINE_BYTES} bytes", "")
        try:
            obj = codec.loads(text)
        except ValueError as exc:
            return _Refused(BAD_JSON, f"not JSON: {str(exc)[:100]}", "")
        try:
            request = checked(request_from_dict(obj))
        except InvalidRequestError as exc:
            url = obj.get("url") if isinstance(obj, dict) else None
            return _Refused(BAD_REQUEST, str(exc)[:300], url if isinstance(url, str) else "")
    else:
        request = raw
    url = canonicalize(request.url, sort_query=sort_query)
    if isinstance(url, Rejection):
        return _Refused(url.reason.value, url.message, request.url)
    if known_labels is not None and request.label is not None \
            and request.label not in known_labels:
        return _Refused(BAD_REQUEST, f"no route is labelled {request.label!r} (routes: "
                                     f"{', '.join(sorted(known_labels)) or 'none'})",
                        request.url)
    if not request.priority and template.priority:
        request = replace(request, priority=template.priority)
    return NewTask.from_request(request, url, max_attempts=template.max_attempts,
                                depth=template.depth, meta=template.meta,
                                headers=template.headers)


def _note_reject(summary: Summary, rejects: RejectWriter | None, reject: Reject,
                 raw: str) -> None:
    if len(summary.first_rejects) < MAX_SHOWN_REJECTS:
        summary.first_rejects.append(reject)
    if rejects is not None:
        rejects.write(reject, raw)


async def _finish(sender: _Sender, batch: list[NewTask]) -> None:
    if batch:
        await sender.send(batch)
    await sender.wait()
