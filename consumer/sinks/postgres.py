"""PostgreSQL sink: every item of a record upserted as one row keyed by its item key.

``--sink postgres://user:pass@host:5432/db?table=crawlq_items`` (asyncpg). The table is
created if missing::

    key         text PRIMARY KEY   -- the item's key (common.items): declared, or <unique key>#<i>
    item        jsonb NOT NULL     -- the item
    fence       bigint NOT NULL    -- the fencing token of the lease that wrote the row
    url         text               -- the URL of the page it came from
    crawled_at  timestamptz        -- when that page was fetched

Query options map a table of the user's instead: ``table`` (``schema.name``), and the
columns ``key``, ``item``, ``fence``, ``url``, ``crawled_at`` (``url=`` empty: not
written); ``timeout`` bounds one write (seconds, default 30). Any other query parameter
goes to asyncpg (``sslmode``, server settings). A URL without a password takes it from
``PGPASSWORD`` or ``~/.pgpass``.

A batch is one statement, so one transaction: its rows deduplicated by key (the highest
fence wins, the later record on a tie), then ``INSERT ... SELECT FROM unnest(...) ON
CONFLICT (key) DO UPDATE ... WHERE t.fence <= EXCLUDED.fence``. `write()` returns once
it committed (the consumer acks after that). A row written under a newer lease is never
replaced by an older one's write: a consumer whose lease expired (stopped, a long pause)
and whose late write arrives after its successor's leaves the successor's row. Equal
fences replace (the same lease writing again). Page records are not written: this sink
holds the extracted items; pages without items write nothing.

Any failure (the database down, a refused write, a timeout) raises; the connection is
dropped and the next write or `probe()` connects again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
from asyncpg.prepared_stmt import PreparedStatement

from common.config import redact_url
from common.errors import ConfigError
from common.items import Item, item_key
from consumer.sinks.base import Record, is_postgres_url
from consumer.sinks.jsonl import json_text

__all__ = ["DEFAULT_TABLE", "PostgresSink", "PostgresTarget", "rows_of"]

log = logging.getLogger("consumer.sinks")

DEFAULT_TABLE = "crawlq_items"
DEFAULT_TIMEOUT_S = 30.0
#: The row's parts, in the order the statement's arrays hold them; each a column option.
COLUMNS = ("key", "item", "fence", "url", "crawled_at")
_REQUIRED = ("key", "item", "fence")
_OPTIONS = frozenset({"table", "timeout", *COLUMNS})
_ARRAY_TYPES = ("text[]", "jsonb[]", "int8[]", "text[]", "float8[]")
_COLUMN_TYPES = {"key": "text PRIMARY KEY", "item": "jsonb NOT NULL",
                 "fence": "bigint NOT NULL", "url": "text", "crawled_at": "timestamptz"}
#: What the database says of a wrong URL or table mapping (classes 28, 3D, 42).
_CONFIG_ERRORS = (asyncpg.InvalidAuthorizationSpecificationError,
                  asyncpg.InvalidCatalogNameError, asyncpg.SyntaxOrAccessError)
_EMPTY: tuple[list[Any], ...] = ([], [], [], [], [])
#: The key of the row a probe writes and rolls back.
PROBE_KEY = "\x1fcrawlq-probe"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """A ``--sink postgres://`` URL, parsed: where to connect and what to write where."""

    dsn: str  # the URL without this sink's own options (asyncpg's)
    table: str  # as given: name or schema.name
    columns: Mapping[str, str]  # part (COLUMNS) -> column name; "" = not written
    timeout_s: float

    @classmethod
    def parse(cls, url: str) -> PostgresTarget:
        """ConfigError when `url` is not a postgres URL or an option is wrong."""
        parts = urlsplit(url)
        if not is_postgres_url(url):
            raise ConfigError(f"not a PostgreSQL URL: {redact_url(url)!r} "
                              "(try postgres://user@host:5432/db)")
        ours: dict[str, str] = {}
        theirs: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in _OPTIONS:
                ours[name] = value
            else:
                theirs.append((name, value))
        columns = {part: ours.get(part, part) for part in COLUMNS}
        missing = [part for part in _REQUIRED if not columns[part]]
        if missing:
            raise ConfigError(f"the postgres sink needs a column for {', '.join(missing)}; "
                              f"drop the empty {missing[0]}= option")
        table = ours.get("table", DEFAULT_TABLE)
        if not table or any(not p for p in table.split(".", 1)):
            raise ConfigError(f"table={table!r}: name a table (name or schema.name)")
        try:
            timeout_s = float(ours.get("timeout", DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout_s = -1.0
        if not timeout_s > 0:
            raise ConfigError(f"timeout={ours['timeout']!r}: give seconds > 0 (e.g. 30)")
        dsn = urlunsplit(parts._replace(query=urlencode(theirs)))
        return cls(dsn, table, columns, timeout_s)

    @property
    def table_sql(self) -> str:
        return ".".join(_quote(p) for p in self.table.split(".", 1))

    def create_sql(self) -> str:
        """CREATE TABLE IF NOT EXISTS with the mapped columns."""
        cols = ", ".join(f"{_quote(c)} {_COLUMN_TYPES[part]}"
                         for part, c in self.columns.items() if c)
        return f"CREATE TABLE IF NOT EXISTS {self.table_sql} ({cols})"

    def upsert_sql(self) -> str:
        """One statement for a whole batch: $1..$5 are the arrays of COLUMNS' values."""
        written = [(part, c) for part, c in self.columns.items() if c]
        names = ", ".join(_quote(c) for _, c in written)
        values = ", ".join("to_timestamp(r.crawled_at)" if part == "crawled_at" else f"r.{part}"
                           for part, _ in written)
        arrays = ", ".join(f"${i}::{t}" for i, t in enumerate(_ARRAY_TYPES, 1))
        key, fence = _quote(self.columns["key"]), _quote(self.columns["fence"])
        sets = ", ".join(f"{_quote(c)} = EXCLUDED.{_quote(c)}" for part, c in written
                         if part != "key")
        return (f"INSERT INTO {self.table_sql} AS t ({names}) SELECT {values} "
                f"FROM unnest({arrays}) AS r({', '.join(COLUMNS)}) "
                f"ON CONFLICT ({key}) DO UPDATE SET {sets} WHERE t.{fence} <= EXCLUDED.{fence}")


def _no_nul(value: Any) -> Any:
    """`value` without NUL characters in its strings (jsonb can't hold \\u0000)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, Mapping):
        return {_no_nul(str(k)): _no_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nul(v) for v in value]
    return value


def _jsonb(value: Any) -> str:
    text = json_text(value)
    return json_text(_no_nul(value)) if "\\u0000" in text else text


Rows = tuple[list[str], list[str], list[int], list[str], list[float]]


def rows_of(records: Sequence[Record]) -> Rows:
    """The batch's rows as COLUMNS' arrays, one row a key: of the items written under the
    same key, the one with the highest fence, the later one on a tie. Rows are in key order,
    so batches of several consumers lock the rows they share in one order and never
    deadlock (in the order pages came, two batches holding each other's keys did)."""
    best: dict[str, tuple[int, Any, Record]] = {}
    for record in records:
        for index, item in enumerate(record.items):
            if isinstance(item, Item):
                key, data = item.key, dict(item.data)
            else:  # no key fields declared: the data plays no part in its key
                key = item_key({}, unique_key=record.unique_key, index=index)
                data = item
            held = best.get(key)
            if held is None or held[0] <= record.fence:
                best[key] = (record.fence, data, record)
    keys = sorted(best)
    rows = [best[key] for key in keys]
    return (keys, [_jsonb(data) for _, data, _ in rows], [fence for fence, _, _ in rows],
            [r.url for _, _, r in rows], [r.fetched_at for _, _, r in rows])


class PostgresSink:
    """Upserts records' items into a PostgreSQL table; see the module docstring."""

    kind = "postgres"

    def __init__(self, url: str) -> None:
        self.target = PostgresTarget.parse(url)
        self.where = f"{redact_url(url).split('?', 1)[0]} table {self.target.table}"
        self._sql = self.target.upsert_sql()
        self._conn: asyncpg.Connection | None = None
        self._stmt: PreparedStatement[Any] | None = None
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._closed = False
        self.stale_rows = 0  # rows not written: a newer lease's row was there

    async def open(self) -> None:
        """Connect, create the table if missing, prepare the upsert and plan it. A table,
        mapping or login the database refuses is a ConfigError; a database that can't be
        used now (down, starting, full) a ConnectionError."""
        if self._closed:
            raise RuntimeError("sink is closed")
        async with self._lock:
            try:
                stmt = await self._connected()
                await stmt.explain(*_EMPTY)  # plans it: a key column with no unique index fails
            except _CONFIG_ERRORS as exc:
                self._drop()
                raise ConfigError(f"the postgres sink ({self.where}) refused: "
                                  f"{type(exc).__name__}: {exc}; check the URL's login, "
                                  "database and table (its key column must be unique)"
                                  ) from exc
            except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self._drop()
                raise ConnectionError(f"the postgres sink ({self.where}) can't be used: "
                                      f"{type(exc).__name__}: {exc}") from exc

    async def write(self, records: Sequence[Record]) -> None:
        """Upsert the batch's items in one statement; returns once it committed."""
        if self._closed:
            raise RuntimeError("sink is closed")
        rows = rows_of(records)
        if not rows[0]:
            return
        async with self._lock:
            stmt = await self._connected()
            try:
                await stmt.fetch(*rows, timeout=self.target.timeout_s)
            except BaseException:
                self._drop()  # cancelled or failed mid-statement: its state is unknown
                raise
            status = stmt.get_statusmsg() or ""  # "INSERT 0 <rows inserted or updated>"
        stale = len(rows[0]) - int(status.rsplit(" ", 1)[-1] or 0)
        if stale:
            self.stale_rows += stale
            log.warning("sink_stale_rows", extra={"rows": stale, "table": self.target.table})

    async def probe(self) -> None:
        """Upsert a probe row and roll it back: returns if a write would commit now."""
        if self._closed:
            raise RuntimeError("sink is closed")
        async with self._lock:
            stmt = await self._connected()
            conn = self._conn
            assert conn is not None
            try:
                tx = conn.transaction()
                await tx.start()
                try:
                    await stmt.fetch([PROBE_KEY], ["{}"], [0], [""], [0.0],
                                     timeout=self.target.timeout_s)
                finally:
                    await tx.rollback()
            except BaseException:
                self._drop()
                raise

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            conn, self._conn, self._stmt = self._conn, None, None
            if conn is not None:
                await conn.close(timeout=5)

    async def _connected(self) -> PreparedStatement[Any]:
        """The prepared upsert on a live connection (connecting first when there is none)."""
        if self._stmt is not None and self._conn is not None and not self._conn.is_closed():
            return self._stmt
        self._drop()
        timeout = self.target.timeout_s
        conn = await asyncpg.connect(self.target.dsn, timeout=timeout, command_timeout=timeout)
        try:
            if await conn.fetchval("SELECT to_regclass($1)", self.target.table_sql) is None:
                await self._create(conn)
            self._stmt = await conn.prepare(self._sql)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        return self._stmt

    async def _create(self, conn: asyncpg.Connection) -> None:
        """Create the missing table. Only then: CREATE TABLE IF NOT EXISTS needs the right to
        create in the schema even when the table is there, which a login that only writes
        rows lacks. Consumers starting together would race in it (one fails on pg_type's
        unique index): one at a time, under a lock on the name."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"crawlq:{self.target.table}")
            await conn.execute(self.target.create_sql())

    def _drop(self) -> None:
        conn, self._conn, self._stmt = self._conn, None, None
        if conn is not None:
            conn.terminate()
