"""Sessions kept in Redis, so any consumer continues one: a cookie jar, and optionally the
proxy it goes through and headers it sends (Crawlee's ``Session``).

A request names its session (``Request(url, session="member")``; the requests a route
follows carry it), or, with the crawl's ``session_pool`` above 0, a request that names
none takes one of its host's pool (Crawlee's ``SessionPool``): made on demand, retired on
a block and after ``session_max_uses`` requests. A session's record (``se:<name>``,
``common/keys.py``) holds its cookies field by field, its version, uses, blocks and state;
``session_update.lua`` changes it, one call a session per flush. What a session's
cookies are is a credential: they are kept in Redis (guard it as the crawl's other
credentials), never shown (`SessionRow` holds none), never in a log or a record.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.codec import text
from common.http.cookies import CookieJar
from common.keys import CrawlKeys
from common.redis.connection import RedisClient
from common.redis.scripts import register

__all__ = ["LIVE", "RETIRED", "SessionRecord", "SessionRow", "SessionRules", "SessionUpdate",
           "list_sessions", "read_pool", "read_sessions", "send_updates"]

LIVE, RETIRED = "live", "retired"
_OPS = itertools.count(1)
_PROCESS = os.urandom(4).hex()


@dataclass(frozen=True, slots=True)
class SessionRules:
    """The crawl policy's session options: a pool of `pool` sessions a host (0: none),
    each retired after `max_uses` requests (0: never)."""

    pool: int = 0
    max_uses: int = 50


@dataclass(slots=True)
class SessionRecord:
    """A session as Redis holds it (`jar` holds its cookies; a missing one is new)."""

    name: str
    version: int = 0
    uses: int = 0
    bans: int = 0
    state: str = LIVE
    proxy: str = ""
    host: str = ""  # its pool's host ('': a named session)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    jar: CookieJar = field(default_factory=CookieJar)

    @classmethod
    def parse(cls, name: str, raw: Mapping[Any, Any]) -> SessionRecord:
        fields = {text(k): text(v) for k, v in raw.items()}
        try:
            headers = json.loads(fields.get("~h", "{}"))
        except ValueError:
            headers = {}
        return cls(name, int(fields.get("~v", 0)), int(fields.get("~uses", 0)),
                   int(fields.get("~bans", 0)), fields.get("~state", LIVE),
                   fields.get("~proxy", ""), fields.get("~host", ""),
                   headers if isinstance(headers, dict) else {},
                   CookieJar.from_fields(fields))


async def read_sessions(client: RedisClient, crawl: str, names: Sequence[str]
                        ) -> list[SessionRecord]:
    """The sessions named, in one pipelined round trip."""
    keys = CrawlKeys.build(crawl)
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(keys.session(name))
        replies = await pipe.execute()
    return [SessionRecord.parse(n, r) for n, r in zip(names, replies, strict=True)]


async def read_versions(client: RedisClient, crawl: str, names: Sequence[str]) -> list[int]:
    """The sessions' versions (0: none), in one round trip."""
    keys = CrawlKeys.build(crawl)
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hget(keys.session(name), "~v")
        replies = await pipe.execute()
    return [int(v) if v is not None else 0 for v in replies]


async def read_pool(client: RedisClient, crawl: str, host: str) -> list[str]:
    """The names of `host`'s live pool sessions, oldest first."""
    names: list[Any] = await client.zrange(CrawlKeys.build(crawl).session_pool(host), 0, -1)
    return [text(n) for n in names]


@dataclass(slots=True)
class SessionUpdate:
    """One session's call: what its requests did since the last one."""

    name: str
    host: str
    uses: int
    banned: int
    proxy: str = ""
    headers: dict[str, str] | None = None
    cookies: dict[str, str] = field(default_factory=dict, repr=False)

    def args(self, max_uses: int) -> list[str | int]:
        pairs = [x for f, v in self.cookies.items() for x in (f, v)]
        return [f"{_PROCESS}-{next(_OPS)}", self.name, self.host, self.uses, self.banned,
                max_uses, self.proxy, json.dumps(self.headers) if self.headers else "",
                *pairs]


async def send_updates(client: RedisClient, crawl: str, updates: Sequence[SessionUpdate],
                       rules: SessionRules) -> list[tuple[int, str]]:
    """Send `updates` in one pipelined round trip; each session's (version, state)."""
    keys = CrawlKeys.build(crawl)
    script = register(client, "session_update")
    async with client.pipeline(transaction=False) as pipe:
        for u in updates:
            await script(keys=[keys.sessions, keys.session(u.name),
                               keys.session_pool(u.host)],
                         args=u.args(rules.max_uses), client=pipe)
        replies = await pipe.execute()
    return [(int(reply[0]), text(reply[1])) for reply in replies]


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session as an operator sees it: no cookie value, only how many it holds."""

    name: str
    host: str
    state: str
    version: int
    uses: int
    bans: int
    cookies: int
    proxy: str
    changed_ms: int


async def list_sessions(client: RedisClient, crawl: str, limit: int = 100
                        ) -> tuple[list[SessionRow], int]:
    """The sessions changed last, newest first, and how many the crawl has."""
    keys = CrawlKeys.build(crawl)
    async with client.pipeline(transaction=False) as pipe:
        pipe.zrevrange(keys.sessions, 0, limit - 1, withscores=True)
        pipe.zcard(keys.sessions)
        newest, total = await pipe.execute()
    names = [text(n) for n, _ in newest]
    records = await read_sessions(client, crawl, names)
    return [SessionRow(r.name, r.host, r.state, r.version, r.uses, r.bans, len(r.jar),
                       r.proxy, int(score)) for r, (_, score) in
            zip(records, newest, strict=True)], int(total)
