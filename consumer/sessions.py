"""This consumer's side of the crawl's sessions (``common.proxies.sessions``): the session a task
goes with, its cookies used and learned here, what changed written with the flush.

A task names its session (and the least version of it its request needs: the version
its parent's flush wrote), or takes one of its host's pool when the crawl has one. The
book holds the sessions it used; one it does not hold, or holds older than the task
needs, is read first (one round trip), so a session's cookies follow its requests to any
consumer. Every `REFRESH_S` the versions of those in use are read again (one pipelined
round trip) and the changed ones re-read. What its requests did (cookies given, uses,
blocks, its proxy) is written at the flush, before the links the same flush enqueues:
`flush` returns each session's new version, and `carry`/`stamp` give a session's
requests' children the session and that version.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.observability.metrics import Metrics
from common.proxies.sessions import (
    LIVE,
    RETIRED,
    SessionRecord,
    SessionRules,
    SessionUpdate,
    read_pool,
    read_sessions,
    read_versions,
    send_updates,
)
from common.queue import CrawlQueue, NewTask
from common.redis.connection import RedisClient
from common.redis.errors import REDIS_ERRORS
from common.tasks.request import Request
from common.tasks.task import Task
from consumer.config import ConsumerSettings
from consumer.live import Live
from consumer.proxypool import ProxyPool, proxy_pool

log = logging.getLogger("consumer")

#: How often the versions of the sessions in use, and the pools, are read again.
REFRESH_S = 2.0


@dataclass(slots=True)
class Session:
    """A session this consumer holds, and what its requests did since the last flush."""

    record: SessionRecord
    uses: int = 0
    banned: int = 0
    proxy: str = ""  # a proxy it went through since (its record's otherwise)
    used_at: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def pending(self) -> bool:
        return bool(self.uses or self.banned or self.record.jar.changes or self.proxy)


class SessionBook:
    """The sessions this consumer uses."""

    def __init__(self, client: RedisClient, crawl: str,
                 rules: Callable[[], SessionRules]) -> None:
        self.client = client
        self.crawl = crawl
        self._rules = rules
        self.held: dict[str, Session] = {}
        self._pools: dict[str, tuple[float, list[str]]] = {}  # host -> (read at, names)
        self._reading: dict[str, asyncio.Future[Session]] = {}
        self._turn = 0

    async def for_task(self, task: Task, host: str) -> Session | None:
        """The session `task` goes with (read first if not held, or held older than the
        task needs); None: it goes with none (cookies off)."""
        if task.session is not None:
            name, need = task.session, task.session_version
        elif self._rules().pool > 0:
            name, need = await self._pool_pick(host), 0
        else:
            return None
        held = self.held.get(name)
        if held is None or held.record.version < need:
            held = await self._read(name, host if task.session is None else "")
        record = held.record
        if record.version == 0 and not record.headers and task.headers:
            record.headers = dict(task.headers)  # a new session keeps its first's headers
        held.used_at = time.monotonic()
        return held

    async def _read(self, name: str, host: str) -> Session:
        """The session read from Redis: one read at a time a name (requests waiting for
        the same session share it)."""
        reading = self._reading.get(name)
        if reading is None:
            reading = self._reading[name] = asyncio.ensure_future(self._load(name, host))
            reading.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(reading)

    async def _load(self, name: str, host: str) -> Session:
        [record] = await read_sessions(self.client, self.crawl, [name])
        if not record.host:
            record.host = host
        held = self.held.get(name)
        if held is None:
            held = self.held[name] = Session(record)
        else:
            _take(held, record)
        return held

    async def _pool_pick(self, host: str) -> str:
        """One of `host`'s live pool sessions, a new one while the pool is short."""
        read_at, names = self._pools.get(host, (0.0, []))
        if time.monotonic() - read_at > REFRESH_S:
            names = await read_pool(self.client, self.crawl, host)
            self._pools[host] = (time.monotonic(), names)
        live = [n for n in names if (s := self.held.get(n)) is None
                or s.record.state == LIVE]
        if len(live) < self._rules().pool:
            name = f"{host}@{secrets.token_hex(4)}"
            names.append(name)
            return name
        self._turn += 1
        return live[self._turn % len(live)]

    def used(self, session: Session, *, banned: bool, proxy: str = "") -> None:
        """A request went out with `session` (and was answered with a block, or not;
        through `proxy`'s id if it changed). A pool session a block or its usage count
        retires leaves this consumer's pool at once."""
        session.uses += 1
        session.banned += int(banned)
        record = session.record
        if proxy and proxy != record.proxy:
            session.proxy = record.proxy = proxy
        rules = self._rules()
        if record.host and (banned or (rules.max_uses and
                                       record.uses + session.uses >= rules.max_uses)):
            self._leave_pool(session)

    def _leave_pool(self, session: Session) -> None:
        pool = self._pools.get(session.record.host)
        if pool is not None and session.name in pool[1]:
            pool[1].remove(session.name)

    async def flush(self) -> None:
        """Write what the sessions' requests did (one pipelined round trip); kept to be
        sent again when Redis fails (the error is raised)."""
        pending = [s for s in self.held.values() if s.pending]
        if not pending:
            return
        updates = []
        for s in pending:
            changes, s.record.jar.changes = s.record.jar.changes, {}
            headers = s.record.headers if s.record.version == 0 else None
            updates.append(SessionUpdate(s.name, s.record.host, s.uses, s.banned, s.proxy,
                                         headers or None, changes))
            s.uses = s.banned = 0
            s.proxy = ""
        try:
            replies = await send_updates(self.client, self.crawl, updates, self._rules())
        except BaseException:
            for s, u in zip(pending, updates, strict=True):
                s.uses, s.banned = s.uses + u.uses, s.banned + u.banned
                s.proxy = s.proxy or u.proxy
                s.record.jar.changes = {**u.cookies, **s.record.jar.changes}
            raise
        for s, u, (version, state) in zip(pending, updates, replies, strict=True):
            s.record.version = max(s.record.version, version)
            s.record.uses += u.uses
            if state == RETIRED and s.record.state != RETIRED:
                s.record.state = RETIRED
                self._leave_pool(s)
                log.info("session_retired", extra={"session": s.name, "host": s.record.host})

    def version_of(self, name: str) -> int:
        held = self.held.get(name)
        return 0 if held is None else held.record.version

    async def refresh(self) -> None:
        """Read again the sessions in use whose version moved (two round trips at most)."""
        now = time.monotonic()
        for name in [n for n, s in self.held.items() if now - s.used_at > 60 * REFRESH_S
                     and not s.pending]:
            del self.held[name]  # not used for a while: read again when it is
        names = list(self.held)
        if not names:
            return
        versions = await read_versions(self.client, self.crawl, names)
        moved = [n for n, v in zip(names, versions, strict=True)
                 if v > self.held[n].record.version]
        for record in await read_sessions(self.client, self.crawl, moved) if moved else ():
            held = self.held.get(record.name)
            if held is not None:
                _take(held, record)

    async def run(self, closing: Callable[[], bool]) -> None:
        while not closing():
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except REDIS_ERRORS as exc:
                log.warning("redis_error", extra={"during": "sessions",
                                                  "error": str(exc)[:200]})


def _take(held: Session, record: SessionRecord) -> None:
    """A newer read of a held session, taken in place: its jar (which fetches under way
    hold) gets the stored cookies, what it learned since over them."""
    mine = held.record
    if record.version < mine.version:
        return
    mine.jar.reload(record.jar)
    mine.version, mine.uses, mine.bans, mine.state = (record.version, record.uses,
                                                      record.bans, record.state)
    mine.proxy = record.proxy or mine.proxy
    mine.headers = record.headers or mine.headers
    mine.host = mine.host or record.host


def carry(found: Iterable[tuple[Task, Sequence[str | Request]]]
          ) -> Iterable[tuple[Task, Sequence[str | Request]]]:
    """Each session's task's links and Requests as Requests of its session (a Request
    that names another session keeps it)."""
    for task, urls in found:
        if task.session is None:
            yield task, urls
            continue
        yield task, [Request(u, session=task.session) if isinstance(u, str)
                     else u if u.session is not None else replace(u, session=task.session)
                     for u in urls]


@dataclass(slots=True)
class FlushHooks:
    """What the flush does for the proxy pool and the sessions around the links it
    enqueues: write their reports first, then give sessions' children their session's
    version."""

    proxies: ProxyPool | None = None
    sessions: SessionBook | None = None

    @classmethod
    def of(cls, settings: ConsumerSettings, queue: CrawlQueue, live: Live,
           metrics: Metrics) -> FlushHooks:
        """The consumer's proxy pool (with --proxy) and its sessions' book."""
        return cls(proxy_pool(settings, queue, live, metrics),
                   SessionBook(queue.client, queue.crawl, lambda: live.now.sessions))

    async def start(self) -> None:
        """The proxy pool's first snapshot, before any pick."""
        if self.proxies is not None:
            await self.proxies.start()

    def loops(self, closing: Callable[[], bool]) -> list[Coroutine[Any, Any, None]]:
        """What reads the fleet's pool and sessions again while the consumer runs."""
        return [x.run(closing) for x in (self.proxies, self.sessions) if x is not None]

    async def write(self) -> None:
        """Send what the pool and the sessions learned (nothing when there is nothing)."""
        if self.proxies is not None:
            await self.proxies.flush()
        if self.sessions is not None:
            await self.sessions.flush()

    def carry(self, found: Iterable[tuple[Task, Sequence[str | Request]]]
              ) -> Iterable[tuple[Task, Sequence[str | Request]]]:
        return found if self.sessions is None else carry(found)

    def stamp(self, children: list[NewTask]) -> list[NewTask]:
        """`children`, each of a session with its session's version now (the one its
        parent's cookies reached Redis with)."""
        book = self.sessions
        if book is None:
            return children
        return [replace(c, session_version=book.version_of(c.session))
                if c.session is not None else c for c in children]
