"""PostgreSQL sink: every item of a record upserted as one row keyed by its item key, in
the table of its type.

``--sink postgres://user@host:5432/db?table=crawlq_items`` (asyncpg; the password from
``PGPASSWORD`` or ``~/.pgpass``). An item without a type goes to ``table``; an item of a
type (its route's ``item_type``) to the table of that name, in ``table``'s schema if it
names one (``common.tasks.pgtarget``): products and reviews each in a table of their own, each
with its own keys. A table is created if missing::

    key         text PRIMARY KEY   -- its key (common.tasks.items): declared, or <unique key>#<i>
    item        jsonb NOT NULL     -- the item
    fence       bigint NOT NULL    -- the fencing token of the lease that wrote the row
    url         text               -- the URL of the page it came from
    crawled_at  timestamptz        -- when that page was fetched

Query options map a table of the user's instead: ``table`` (``schema.name``), and the
columns ``key``, ``item``, ``fence``, ``url``, ``crawled_at`` (``url=`` empty: not
written), the same in every table; ``timeout`` bounds one write (seconds, default 30).
Any other query parameter goes to asyncpg (``sslmode``, server settings).

A batch is one transaction: its rows deduplicated by table and key (the highest fence
wins, the later record on a tie), then per table, in the tables' name order, one
``INSERT ... SELECT FROM unnest(...) ON CONFLICT (key) DO UPDATE ... WHERE t.fence <=
EXCLUDED.fence`` (a batch of one table: that one statement alone). `write()` returns
once it committed (the consumer acks after that). A row written under a newer lease is
never replaced by an older one's write: a consumer whose lease expired (stopped, a long
pause) and whose late write arrives after its successor's leaves the successor's row.
Equal fences replace (the same lease writing again). Page records are not written: this
sink holds the extracted items; pages without items write nothing.

`open()` connects and prepares the tables it is told of (`item_types`: a spider's), so a
login, a database or a right the server refuses is a ConfigError at start-up, and a
database that can't be reached a ConnectionError, each saying what to do
(``common.tasks.pgtarget.sink_problem``). Any failure of a write (the database down, a refused
write, a timeout) raises; the connection is dropped and the next write or `probe()`
connects again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import asyncpg
from asyncpg.prepared_stmt import PreparedStatement

from common.errors import ConfigError
from common.exitcodes import EXIT_SINK
from common.tasks.items import Item, item_key
from common.tasks.pgtarget import DEFAULT_TABLE, PostgresTarget, sink_problem
from common.urls.redact import redact_url
from consumer.sinks.base import Record, SinkUnavailableError
from consumer.sinks.jsonl import json_text

__all__ = ["DEFAULT_TABLE", "PostgresSink", "PostgresTarget", "tables_of"]

log = logging.getLogger("consumer.sinks")

#: What the database says of a wrong URL or table mapping (classes 28, 3D, 42).
_CONFIG_ERRORS = (asyncpg.InvalidAuthorizationSpecificationError,
                  asyncpg.InvalidCatalogNameError, asyncpg.SyntaxOrAccessError)
_EMPTY: tuple[list[Any], ...] = ([], [], [], [], [])
#: The key of the row a probe writes and rolls back.
PROBE_KEY = "\x1fcrawlq-probe"


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


def tables_of(records: Sequence[Record]) -> dict[str, Rows]:
    """The batch's rows by item type ("": none), each as COLUMNS' arrays, one row a key
    of its type: of the items written under the same type and key, the one with the
    highest fence, the later one on a tie. Rows are in key order, so batches of several
    consumers lock the rows they share in one order and never deadlock (in the order
    pages came, two batches holding each other's keys did)."""
    best: dict[str, dict[str, tuple[int, Any, Record]]] = {}
    for record in records:
        for index, item in enumerate(record.items):
            if isinstance(item, Item):
                kind, data = item.type, dict(item.data)
                key = item.key or item_key({}, unique_key=record.unique_key, index=index)
            else:  # no key fields declared: the data plays no part in its key
                kind, data = "", item
                key = item_key({}, unique_key=record.unique_key, index=index)
            rows = best.setdefault(kind, {})
            held = rows.get(key)
            if held is None or held[0] <= record.fence:
                rows[key] = (record.fence, data, record)
    out: dict[str, Rows] = {}
    for kind, rows in best.items():
        keys = sorted(rows)
        kept = [rows[key] for key in keys]
        out[kind] = (keys, [_jsonb(data) for _, data, _ in kept],
                     [fence for fence, _, _ in kept], [r.url for _, _, r in kept],
                     [r.fetched_at for _, _, r in kept])
    return out


class PostgresSink:
    """Upserts records' items into PostgreSQL tables; see the module docstring."""

    kind = "postgres"

    def __init__(self, url: str, *, item_types: Collection[str] = (),
                 untyped: bool = True) -> None:
        self.target = PostgresTarget.parse(url)
        #: The tables prepared at open: the sink's own (items without a type), unless
        #: told none come (`untyped`), and each of `item_types`'.
        self.tables = [*([self.target.table] if untyped or not item_types else []),
                       *(self.target.table_for(t) for t in sorted(set(item_types)))]
        self.where = f"{redact_url(url).split('?', 1)[0]} table {', '.join(self.tables)}"
        self._conn: asyncpg.Connection | None = None
        self._stmts: dict[str, PreparedStatement[Any]] = {}  # table -> its upsert
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._closed = False
        self.stale_rows = 0  # rows not written: a newer lease's row was there

    async def open(self) -> None:
        """Connect, create the tables if missing, prepare their upserts and plan them. A
        table, mapping, right or login the database refuses is a ConfigError; a
        database that can't be used now (down, starting, full) a ConnectionError; each
        says what to do."""
        if self._closed:
            raise RuntimeError("sink is closed")
        async with self._lock:
            table = self.tables[0]
            try:
                for table in self.tables:
                    stmt = await self._prepared(table)
                    await stmt.explain(*_EMPTY)  # plans it: a key column with no unique index fails
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                self._drop()
                problem = sink_problem(exc, self.target, table)
                if isinstance(exc, _CONFIG_ERRORS) or problem.exit_code != EXIT_SINK:
                    raise ConfigError(f"the postgres sink refused: {problem.message}") from exc
                raise SinkUnavailableError(problem.message) from exc

    async def write(self, records: Sequence[Record]) -> None:
        """Upsert the batch's items, one statement a table, in one transaction; returns
        once it committed."""
        if self._closed:
            raise RuntimeError("sink is closed")
        by_type = tables_of(records)
        if not by_type:
            return
        batches = sorted((self.target.table_for(kind), rows) for kind, rows in by_type.items())
        stale: dict[str, int] = {}
        async with self._lock:
            try:
                stmts = [await self._prepared(table) for table, _ in batches]
                conn = self._conn
                assert conn is not None
                if len(batches) == 1:  # one statement: a transaction of its own
                    stale = self._stale(batches[0][0], batches[0][1], await self._run(
                        stmts[0], batches[0][1]))
                else:
                    async with conn.transaction():
                        for stmt, (table, rows) in zip(stmts, batches, strict=True):
                            stale |= self._stale(table, rows, await self._run(stmt, rows))
            except BaseException:
                self._drop()  # cancelled or failed mid-statement: its state is unknown
                raise
        for table, n in stale.items():
            self.stale_rows += n
            log.warning("sink_stale_rows", extra={"rows": n, "table": table})

    async def _run(self, stmt: PreparedStatement[Any], rows: Rows) -> str:
        await stmt.fetch(*rows, timeout=self.target.timeout_s)
        return stmt.get_statusmsg() or ""  # "INSERT 0 <rows inserted or updated>"

    @staticmethod
    def _stale(table: str, rows: Rows, status: str) -> dict[str, int]:
        stale = len(rows[0]) - int(status.rsplit(" ", 1)[-1] or 0)
        return {table: stale} if stale else {}

    async def probe(self) -> None:
        """Upsert a probe row and roll it back: returns if a write would commit now."""
        if self._closed:
            raise RuntimeError("sink is closed")
        async with self._lock:
            try:
                stmt = await self._prepared(self.tables[0])
                conn = self._conn
                assert conn is not None
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
            conn, self._conn = self._conn, None
            self._stmts.clear()
            if conn is not None:
                await conn.close(timeout=5)

    async def _prepared(self, table: str) -> PreparedStatement[Any]:
        """`table`'s prepared upsert on a live connection (connecting first when there is
        none, creating the table when it is missing)."""
        if self._conn is None or self._conn.is_closed():
            self._drop()
            timeout = self.target.timeout_s
            self._conn = await asyncpg.connect(self.target.dsn, timeout=timeout,
                                               command_timeout=timeout)
        stmt = self._stmts.get(table)
        if stmt is not None:
            return stmt
        conn = self._conn
        try:
            if await conn.fetchval("SELECT to_regclass($1)",
                                   self.target.table_sql(table)) is None:
                await self._create(conn, table)
            stmt = self._stmts[table] = await conn.prepare(self.target.upsert_sql(table))
        except BaseException:
            self._drop()
            raise
        return stmt

    async def _create(self, conn: asyncpg.Connection, table: str) -> None:
        """Create the missing table. Only then: CREATE TABLE IF NOT EXISTS needs the right to
        create in the schema even when the table is there, which a login that only writes
        rows lacks. Consumers starting together would race in it (one fails on pg_type's
        unique index): one at a time, under a lock on the name."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"crawlq:{table}")
            await conn.execute(self.target.create_sql(table))

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._stmts.clear()
        if conn is not None:
            conn.terminate()
