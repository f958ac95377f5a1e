"""Enqueue: dedup a batch and put each new task in its host's queue (enqueue.lua, or
enqueue_bloom.lua for a crawl that dedups with a Bloom filter)."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from common.codec import text
from common.errors import ConfigError, InvalidRequestError, MalformedTaskError
from common.hostmodel.hostkey import host_key
from common.keys import PartitionKeys
from common.queue.calls import Call, host_args, run
from common.queue.crawl import Crawl, DedupMode
from common.queue.model import EnqueueResult, NewTask
from common.queue.rendermodes import RenderModes
from common.tasks.request import (
    BODYLESS,
    MAX_BODY_BYTES,
    check_data,
    check_label,
    check_method,
    check_session,
    shown,
)
from common.tasks.task import compact_tail, encode_entry


class _Queued(Protocol):
    """What a batch's item gives its script call: its fingerprint (its id's bytes) and
    priority; its entry comes from the batch's own function."""

    @property
    def fp(self) -> bytes: ...

    @property
    def priority(self) -> int: ...


Q = TypeVar("Q", bound=_Queued)
#: One partition's batch: the partition, and its items by host.
Batch = tuple[int, Mapping[str, Sequence[Q]]]


@dataclass(frozen=True, slots=True)
class KnownEntry:
    """A known URL to queue again as its history record keeps it (common.queue.known):
    its id's 16 bytes (`fp`), priority and compact entry (those bytes, then the tail)."""

    fp: bytes
    priority: int
    entry: bytes


async def enqueue(crawl: Crawl, tasks: Sequence[NewTask], recrawl_after_s: int = 0, *,
                  render_all: bool = False, modes: RenderModes | None = None
                  ) -> EnqueueResult:
    """Dedup and enqueue a batch into its hosts' queues; one script call per
    partition, pipelined. MalformedTaskError for a URL without an http(s) host.
    `recrawl_after_s`: a done URL enqueued again after this long is crawled again (0:
    never). InvalidRequestError, before anything is sent, for a task built by hand whose
    request is bad (`check_new_task`); one made by ``NewTask.from_request`` was checked
    where its request entered the crawl, and is not checked again. Labels are the
    spider's business (its follow, the producer's reader), not the queue's.
    `render_all`: every task is a render request (the crawl policy's ``rendering=all``);
    `modes`: a rendering=auto crawl's decisions: a pair decided ``http`` is not."""
    by_partition: dict[int, dict[str, list[NewTask]]] = defaultdict(
        lambda: defaultdict(list))
    for t in tasks:
        if t.priority < 0 or t.max_attempts < 1 or t.depth < 0:
            raise ConfigError("priority and depth must be >= 0, max_attempts >= 1")
        if not t.checked and (t.method != "GET" or t.body is not None or t.data
                              or t.label is not None):
            check_new_task(t)
        if " " in t.url:  # an entry's URL ends at its first space (common.tasks.task)
            raise MalformedTaskError(f"URL is not canonical (it holds a space): "
                                     f"{t.url[:200]!r}; canonicalize it first")
        host = host_key(t.url)
        by_partition[crawl.partition_of(host)][host].append(t)
    if not by_partition:
        return EnqueueResult()
    if modes is not None:
        await modes.refresh()
    results = await _run(crawl, list(by_partition.items()), recrawl_after_s,
                         functools.partial(_entry, render_all=render_all, modes=modes))
    warnings = tuple(int(r[3]) for r in results if len(r) > 3 and int(r[3]) >= 0)
    return EnqueueResult(
        enqueued=sum(int(r[0]) for r in results),
        duplicates=sum(int(r[1]) for r in results),
        recrawled=sum(int(r[2]) for r in results),
        bloom_warnings=warnings,
    )


async def enqueue_known(crawl: Crawl, partition: int,
                        by_host: Mapping[str, Sequence[KnownEntry]],
                        recrawl_after_s: int) -> EnqueueResult:
    """Queue known URLs of one partition again, each as its history record keeps it,
    through enqueue.lua with the recrawl window: a URL is queued only when its seen mark
    says it ended longer ago than the window (one queued, leased, waiting or dead
    meanwhile is a duplicate), with its validators (`v`) from its record."""
    if not by_host:
        return EnqueueResult()
    [r] = await _run(crawl, [(partition, by_host)], recrawl_after_s, _known_entry)
    return EnqueueResult(enqueued=int(r[0]), duplicates=int(r[1]), recrawled=int(r[2]))


def _known_entry(k: KnownEntry, host: str) -> bytes:
    return k.entry


#: How many times a batch is named again for a politeness_key that changed meanwhile.
REGROUPS = 3


async def _run(crawl: Crawl, batches: Sequence[Batch[Q]], recrawl_after_s: int,
               entry: Callable[[Q, str], bytes]) -> list[Any]:
    """The script's reply for each partition's batch. A batch whose groups were named for
    another politeness_key than its partition holds changes nothing and answers {-1, key}:
    it is named again for that key (a process learns the key at its first batch, and a
    changed one at the next)."""
    results: list[Any] = [None] * len(batches)
    todo = list(range(len(batches)))
    for _ in range(REGROUPS):
        calls = []
        for i in todo:
            p, by_host = batches[i]
            groups = await crawl.grouper.words(list(by_host))
            calls.append(_call(crawl, crawl.partitions[p], by_host, recrawl_after_s, groups,
                               entry=entry))
        replies = await run(crawl.client, calls)
        again = []
        for i, reply in zip(todo, replies, strict=True):
            if int(reply[0]) < 0:
                crawl.grouper.learn(text(reply[1]))
                again.append(i)
            else:
                results[i] = reply
        if not again:
            return results
        todo = again
    raise ConfigError(f"crawl {crawl.name}: its politeness_key changed {REGROUPS} times "
                      "while one batch was enqueued; enqueue it again")


def _call(crawl: Crawl, pk: PartitionKeys, by_host: Mapping[str, Sequence[Q]],
          recrawl_after_s: int, groups: str, *,
          entry: Callable[[Q, str], bytes] | None = None) -> Call:
    """One partition's enqueue call; each item's entry from `entry` (default: a NewTask's,
    `_entry`)."""
    if entry is None:
        entry = cast(Callable[[Q, str], bytes], _entry)
    settings = crawl.settings
    host_keys, host_head = host_args(pk, list(by_host))
    head = [*pk.host_state, pk.tasks, pk.stats, pk.pending, pk.prio_hosts]
    args: list[Any]
    if settings.dedup is DedupMode.BLOOM:
        if recrawl_after_s:
            raise ConfigError("recrawl_after needs exact dedup: bloom keeps no timestamps")
        layers = settings.bloom_layers
        keys = [*head, pk.bloom, *pk.group_state, *(pk.bloom_layer(i) for i in range(layers)),
                *host_keys]
        args = [settings.bloom_capacity, repr(settings.bloom_error), layers, *host_head,
                groups]
        for h, (host, batch) in enumerate(by_host.items(), 1):
            for t in batch:
                args += [int.from_bytes(t.fp[8:12], "big"),
                         int.from_bytes(t.fp[12:16], "big") | 1, t.priority, h,
                         entry(t, host)]
        return crawl.scripts.enqueue_bloom, keys, args
    keys = [*head, *pk.group_state, *host_keys]
    args = [recrawl_after_s, *host_head, groups]
    buckets = []
    for h, (host, batch) in enumerate(by_host.items(), 1):
        for t in batch:
            buckets.append(crawl.bucket(t.fp))
            keys.append(pk.seen(buckets[-1]))
            args += [t.fp[2:], t.priority, h, entry(t, host)]
    if recrawl_after_s:  # a recrawl reads the URL's history record
        keys += [pk.history(b) for b in buckets]
    return crawl.scripts.enqueue, keys, args


def check_new_task(t: NewTask) -> None:
    """InvalidRequestError saying what is wrong with the request `t` holds: its method,
    body, label, session or data."""
    where = f"task {shown(t.url)!r}"
    check_method(t.method, where)
    if t.body is not None:
        if not isinstance(t.body, bytes) or len(t.body) > MAX_BODY_BYTES:
            raise InvalidRequestError(f"{where}: body must be bytes, at most "
                                      f"{MAX_BODY_BYTES} of them")
        if t.method in BODYLESS:
            raise InvalidRequestError(f"{where}: a {t.method} carries no body")
    check_label(t.label, where)
    check_session(t.session, where)
    check_data(t.data, where)


def _renders(t: NewTask, host: str, render_all: bool, modes: RenderModes | None) -> bool:
    """Whether `t` is enqueued as a render request."""
    if not (t.render or render_all):
        return False
    return modes is None or modes.mode(host, t.label) != "http"


def _entry(t: NewTask, host: str, *, render_all: bool = False,
           modes: RenderModes | None = None) -> bytes:
    """Its entry compact (common.tasks.task), as the queue keeps it: its fingerprint's bytes
    (its id), then its URL and fields less what the queue names; a render request's
    (`_renders`) marked as one."""
    rest = encode_entry("", t.url, max_attempts=t.max_attempts, priority=t.priority,
                        meta=t.meta, depth=t.depth, headers=t.headers, revisit=t.revisit,
                        method=t.method, body=t.body, label=t.label, data=t.data,
                        unique_key=t.unique_key, session=t.session,
                        session_version=t.session_version,
                        render=_renders(t, host, render_all, modes))
    return t.fp + compact_tail(rest, host).encode()
