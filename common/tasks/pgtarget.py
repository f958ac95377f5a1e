"""A ``--sink postgres://`` URL: where the items go (a table per item type), the SQL that
writes them, and what a failure to reach the database means and what to do about it.

No database driver here: the consumer's sink (``consumer.sinks.postgres``, asyncpg) runs
the statements, ``crawlq run`` checks the database before it starts and counts the rows
after. A table name is the sink's ``table`` for an item without a type, else the item's
type (a route's ``item_type``), in the schema ``table`` names, if any: ``table=shop.items``
puts type ``review`` in ``shop.review``. Each table has the same columns, mapped by the
URL's options, and its own key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from common.errors import ConfigError
from common.exitcodes import EXIT_SINK, EXIT_USAGE
from common.urls.redact import redact_url

__all__ = ["COLUMNS", "DEFAULT_TABLE", "PostgresTarget", "SinkProblem", "is_postgres_url",
           "quote", "sink_problem"]

DEFAULT_TABLE: Final = "crawlq_items"
DEFAULT_TIMEOUT_S: Final = 30.0
#: The row's parts, in the order the statement's arrays hold them; each a column option.
COLUMNS: Final = ("key", "item", "fence", "url", "crawled_at")
_REQUIRED = ("key", "item", "fence")
_OPTIONS = frozenset({"table", "timeout", *COLUMNS})
_ARRAY_TYPES = ("text[]", "jsonb[]", "int8[]", "text[]", "float8[]")
_COLUMN_TYPES = {"key": "text PRIMARY KEY", "item": "jsonb NOT NULL",
                 "fence": "bigint NOT NULL", "url": "text", "crawled_at": "timestamptz"}


def is_postgres_url(text: str) -> bool:
    """Whether a ``--sink`` value names a PostgreSQL database rather than a sink kind."""
    return text.startswith(("postgres://", "postgresql://"))


def quote(name: str) -> str:
    """`name` as an SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """A ``--sink postgres://`` URL, parsed: where to connect and what to write where."""

    dsn: str  # the URL without this sink's own options (asyncpg's)
    table: str  # as given: name or schema.name (the items without a type)
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
    def where(self) -> str:
        """Host, port and database, for messages (no user, no password)."""
        parts = urlsplit(self.dsn)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"

    @property
    def user(self) -> str:
        """The login the URL names ("": the default, the local user name)."""
        return urlsplit(self.dsn).username or ""

    def table_for(self, item_type: str = "") -> str:
        """The table (name or schema.name) the items of `item_type` go to ("": none)."""
        if not item_type:
            return self.table
        schema, dot, _ = self.table.rpartition(".")
        return f"{schema}{dot}{item_type}"

    @staticmethod
    def table_sql(table: str) -> str:
        """`table` (name or schema.name) quoted for SQL."""
        return ".".join(quote(p) for p in table.split(".", 1))

    def create_sql(self, table: str) -> str:
        """CREATE TABLE IF NOT EXISTS `table` with the mapped columns."""
        cols = ", ".join(f"{quote(c)} {_COLUMN_TYPES[part]}"
                         for part, c in self.columns.items() if c)
        return f"CREATE TABLE IF NOT EXISTS {self.table_sql(table)} ({cols})"

    def upsert_sql(self, table: str) -> str:
        """One statement for a whole batch of `table`'s rows: $1..$5 are the arrays of
        COLUMNS' values; a row a newer lease wrote (a higher fence) is never replaced."""
        written = [(part, c) for part, c in self.columns.items() if c]
        names = ", ".join(quote(c) for _, c in written)
        values = ", ".join("to_timestamp(r.crawled_at)" if part == "crawled_at" else f"r.{part}"
                           for part, _ in written)
        arrays = ", ".join(f"${i}::{t}" for i, t in enumerate(_ARRAY_TYPES, 1))
        key, fence = quote(self.columns["key"]), quote(self.columns["fence"])
        sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for part, c in written
                         if part != "key")
        return (f"INSERT INTO {self.table_sql(table)} AS t ({names}) SELECT {values} "
                f"FROM unnest({arrays}) AS r({', '.join(COLUMNS)}) "
                f"ON CONFLICT ({key}) DO UPDATE SET {sets} WHERE t.{fence} <= EXCLUDED.{fence}")


@dataclass(frozen=True, slots=True)
class SinkProblem:
    """Why the database can't be used, in one line, and the exit code it means: 2 for a
    setting to fix (login, database, rights), 6 for a database not there now."""

    exit_code: int
    message: str


#: SQLSTATEs (PostgreSQL's error codes) of the failures a setting fixes.
_AUTH = ("28P01", "28000")  # invalid password, invalid authorization (no pg_hba entry)
_NO_DATABASE = "3D000"
_NO_RIGHTS = "42501"


def sink_problem(exc: BaseException, target: PostgresTarget, table: str = "") -> SinkProblem:
    """What `exc`, raised connecting to or preparing the sink's `table`, says of it: one
    line with the advice that fits (connection refused, authentication, rights, ...)."""
    at, user = target.where, target.user or "(your user name)"
    table = table or target.table
    state = getattr(exc, "sqlstate", None)
    said = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    if state in _AUTH:
        return SinkProblem(EXIT_USAGE, f"PostgreSQL at {at} refused the login of user {user} "
                           f"({said}): set the password in PGPASSWORD or a ~/.pgpass line "
                           "(host:port:db:user:password), not in the URL, and check the user "
                           "and pg_hba.conf")
    if state == _NO_DATABASE:
        return SinkProblem(EXIT_USAGE, f"PostgreSQL at {at}: {said}: create it (createdb) "
                           "or fix the database in the URL")
    if state == _NO_RIGHTS:
        return SinkProblem(EXIT_USAGE, f"PostgreSQL at {at}: user {user} may not use table "
                           f"{table} ({said}): GRANT SELECT, INSERT, UPDATE ON {table} TO "
                           f"{user} (and CREATE on its schema for the sink to create it)")
    if isinstance(exc, ConnectionRefusedError) or "refused" in str(exc).lower():
        return SinkProblem(EXIT_SINK, f"PostgreSQL at {at} refused the connection ({said}): "
                           "is it running and listening there? Check the URL's host and port")
    if isinstance(exc, TimeoutError):
        return SinkProblem(EXIT_SINK, f"PostgreSQL at {at} did not answer in "
                           f"{target.timeout_s:g}s ({said}): is the host right and "
                           "reachable (a firewall)? timeout= sets how long to wait")
    if isinstance(exc, OSError):
        return SinkProblem(EXIT_SINK, f"PostgreSQL at {at} can't be reached ({said}): check "
                           "the URL's host and port")
    if state is not None and state.startswith(("42", "3F")):  # a table or column mapping
        return SinkProblem(EXIT_USAGE, f"PostgreSQL at {at} refused table {table} ({said}): "
                           "check the URL's table and column options (its key column must "
                           "be unique)")
    return SinkProblem(EXIT_SINK, f"PostgreSQL at {at} can't be used now ({said})")
