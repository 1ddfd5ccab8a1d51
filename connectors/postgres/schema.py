"""Table metadata, type mapping and DDL for the PostgreSQL sink (:mod:`eosink.connectors.postgres.sink`).

Everything here runs *outside* the two-phase transaction, on the sink's autocommit connection:
DDL inside a prepared transaction would hold ``ACCESS EXCLUSIVE`` locks until the decision, and
every other writer of the table would wait behind a transaction that may sit prepared for a
long time. Concurrent workers serialise their DDL on one advisory lock, so two workers evolving
the same table cannot race each other into ``duplicate key value violates pg_type``.

Identifiers are always composed with :class:`psycopg.sql.Identifier`; type names come only
from the fixed whitelist in :data:`INFERRED_TYPES`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from eosink.connectors.api import formats

#: One advisory lock key for all DDL of every eosink PostgreSQL sink in a database.
DDL_LOCK_KEY = 0x656F73696E6B  # "eosink"
#: Column names of the Kafka coordinates (``fields.kafka``), with their types.
KAFKA_COLUMNS: tuple[tuple[str, str], ...] = (("__topic", "text"), ("__partition", "integer"), ("__offset", "bigint"))
KAFKA_COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in KAFKA_COLUMNS)
#: PostgreSQL identifiers longer than this are silently truncated by the server: refuse them.
MAX_IDENTIFIER_BYTES = 63

# -- kinds: what Python values a column accepts, and how COPY sends them ---------------------
BOOL, INT8, INT, FLOAT, NUMERIC, TEXT, JSON, OTHER, GENERATED = (
    "bool", "int8", "int", "float", "numeric", "text", "json", "other", "generated",
)
_NONE = type(None)
#: Python types a JSON-decoded value may have for a column of each kind (``bool`` is not an
#: ``int`` here: the check compares exact types, so ``true`` never lands in a bigint column).
ALLOWED: dict[str, frozenset[type]] = {
    BOOL: frozenset({bool, _NONE}),
    INT8: frozenset({int, _NONE}),
    INT: frozenset({int, _NONE}),
    FLOAT: frozenset({int, float, _NONE}),
    NUMERIC: frozenset({int, float, str, _NONE}),
    TEXT: frozenset({str, _NONE}),
    JSON: frozenset({dict, list, str, int, float, bool, _NONE}),
    OTHER: frozenset({str, _NONE}),  # timestamptz, uuid, date, ...: the server parses the text
    GENERATED: frozenset(),
}
#: Kinds whose binary COPY encoding psycopg produces exactly. Not int2/int4: psycopg's binary
#: dumpers truncate out-of-range ints silently, so such tables use text COPY, where the server
#: range-checks and names the line. Not numeric/other: they arrive as text.
BINARY_KINDS = frozenset({BOOL, INT8, FLOAT, TEXT, JSON})
_KIND_OF: dict[str, str] = {
    "bool": BOOL, "int8": INT8, "int2": INT, "int4": INT, "float4": FLOAT, "float8": FLOAT,
    "numeric": NUMERIC, "text": TEXT, "varchar": TEXT, "bpchar": TEXT, "json": JSON, "jsonb": JSON,
}
#: Type inferred for a new column from the Python type of its first non-null JSON value.
INFERRED_TYPES: dict[type, str] = {
    bool: "boolean", int: "bigint", float: "double precision", str: "text", dict: "jsonb", list: "jsonb",
}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    typname: str  # base type name from pg_type (domains resolved), e.g. float8
    kind: str
    notnull: bool = False
    sqltype: str = ""  # as PostgreSQL prints it, for messages: double precision, varchar(3)
    has_default: bool = False  # a row that leaves it out gets a value (DEFAULT, identity)

    @property
    def copy_type(self) -> str:
        """The type name given to ``Copy.set_types``: decides which psycopg dumper runs."""
        if self.kind in (TEXT, OTHER):
            return "text"  # varchar/bpchar/timestamptz...: plain text on the wire
        return self.typname


@dataclass(slots=True)
class Table:
    """What the sink knows about one target table (cached per sink instance)."""

    schema: str | None
    name: str
    columns: dict[str, Column] = field(default_factory=dict)
    #: Column sets of the immediate, non-partial unique indexes (what ON CONFLICT can name; a deferrable one it cannot).
    unique_sets: set[frozenset[str]] = field(default_factory=set)
    relkind: str = "r"  # pg_class.relkind: r (table) or p (partitioned table)

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name) if self.schema else sql.Identifier(self.name)

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


def kind_of(typname: str, generated: bool = False) -> str:
    if generated:
        return GENERATED
    return _KIND_OF.get(typname, OTHER)


def check_identifier(name: str, what: str) -> str | None:
    """Why ``name`` cannot be a PostgreSQL identifier, or None when it can."""
    if not name:
        return f"{what} name is empty"
    if "\x00" in name:
        return f"{what} name {name!r} contains a NUL character"
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        return f"{what} name {name!r} is longer than {MAX_IDENTIFIER_BYTES} bytes (PostgreSQL would truncate it)"
    return None


# -- bookkeeping tables -----------------------------------------------------------------------
BOOKKEEPING_TABLES = ("eosink_txn_manifest", "eosink_offsets", "eosink_committed_txns")
#: Each bookkeeping table's comment: its format (:mod:`eosink.connectors.api.formats`); none is format 1.
FORMAT_COMMENT = "eosink bookkeeping format "
BOOKKEEPING_DDL: tuple[str, ...] = (
    # The manifest of every transaction, written (autocommit) before its tpc transaction begins
    # and deleted inside it: recovery reads it while the transaction sits prepared.
    """CREATE TABLE IF NOT EXISTS eosink_txn_manifest (
        txn_id text PRIMARY KEY,
        connector text NOT NULL,
        manifest jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS eosink_txn_manifest_connector_idx ON eosink_txn_manifest (connector, created_at)",
    # The resource-side fence and the committed position per partition (inside the prepared txn).
    """CREATE TABLE IF NOT EXISTS eosink_offsets (
        connector text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        epoch bigint NOT NULL,
        next_offset bigint NOT NULL,
        txn_id text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, topic, partition))""",
    # Proof of commit: the only way to tell "committed" from "rolled back" after the GID is gone.
    """CREATE TABLE IF NOT EXISTS eosink_committed_txns (
        txn_id text PRIMARY KEY,
        connector text NOT NULL,
        committed_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE INDEX IF NOT EXISTS eosink_committed_txns_connector_idx ON eosink_committed_txns (connector, committed_at)",
    *(f"COMMENT ON TABLE {t} IS '{FORMAT_COMMENT}{formats.POSTGRES_BOOKKEEPING}'" for t in BOOKKEEPING_TABLES),
)


def lock_ddl(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_KEY,))


def bootstrap(conn: psycopg.Connection[Any]) -> None:
    """Create the bookkeeping tables if any is missing (one catalog query when all exist), and refuse
    tables a newer eosink keeps in a format this one does not read (their comments say)."""
    row = conn.execute(
        "SELECT to_regclass('eosink_txn_manifest') IS NOT NULL AND to_regclass('eosink_offsets') IS NOT NULL"
        " AND to_regclass('eosink_committed_txns') IS NOT NULL, "
        + ", ".join(f"obj_description(to_regclass('{t}'), 'pg_class')" for t in BOOKKEEPING_TABLES)
    ).fetchone()
    for table, comment in zip(BOOKKEEPING_TABLES, row[1:] if row else ()):
        if comment and str(comment).startswith(FORMAT_COMMENT):
            try:
                found = int(str(comment)[len(FORMAT_COMMENT):])
            except ValueError:
                found = formats.UNREADABLE
            formats.check(found, formats.POSTGRES_BOOKKEEPING, "the bookkeeping table",
                          f"{table} in database {conn.info.dbname} on {conn.info.host}:{conn.info.port}", component="postgres")
    if row and row[0]:
        return
    with conn.transaction():
        lock_ddl(conn)
        for stmt in BOOKKEEPING_DDL:
            conn.execute(stmt)


# -- introspection ----------------------------------------------------------------------------
_COLUMNS_SQL = """
SELECT a.attname, COALESCE(bt.typname, t.typname), a.attnotnull, a.attgenerated <> '' OR a.attidentity = 'a',
       format_type(a.atttypid, a.atttypmod), a.atthasdef OR a.attidentity <> ''
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_UNIQUE_SQL = """
SELECT array_agg(a.attname::text)
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid
"""
_RELATION_SQL = """
SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema()) AND c.relkind IN ('r', 'p')
"""


def _relation(conn: psycopg.Connection[Any], schema: str | None, name: str) -> tuple[int, str] | None:
    row = conn.execute(_RELATION_SQL, (name, schema)).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def _columns(conn: psycopg.Connection[Any], oid: int) -> dict[str, Column]:
    return {
        name: Column(name, typname, kind_of(typname, bool(generated)), bool(notnull), sqltype, bool(has_default))
        for name, typname, notnull, generated, sqltype, has_default in conn.execute(_COLUMNS_SQL, (oid,)).fetchall()
    }


def load_table(conn: psycopg.Connection[Any], schema: str | None, name: str) -> Table | None:
    """The table's columns and unique column sets; None when it does not exist. (Upserts, updates
    and deletes stage their rows in a table of their transaction: :mod:`eosink.connectors.postgres.stage`.)"""
    rel = _relation(conn, schema, name)
    if rel is None:
        return None
    oid = rel[0]
    table = Table(schema, name, _columns(conn, oid), relkind=rel[1])
    table.unique_sets = {frozenset(r[0]) for r in conn.execute(_UNIQUE_SQL, (oid,)).fetchall()}
    return table


# -- inference and DDL ------------------------------------------------------------------------
def infer_types(values: Iterable[Any], known: Iterable[str]) -> dict[str, str]:
    """PostgreSQL types for the fields of ``values`` (dicts) that are not in ``known``.

    The first non-null value decides; ``int`` then ``float`` widens to double precision; a field
    that is null in every record gets no column (nothing to infer, nothing lost). Records whose
    values disagree with the inferred type fail the type check later, naming themselves.
    """
    skip = set(known)
    found: dict[str, type] = {}
    for v in values:
        if type(v) is not dict:
            continue
        for k, x in v.items():
            if x is None or k in skip:
                continue
            t = type(x)
            seen = found.get(k)
            if seen is None:
                found[k] = t
            elif seen is int and t is float:
                found[k] = float
    return {k: INFERRED_TYPES[t] for k, t in found.items() if t in INFERRED_TYPES}


def create_table(
    conn: psycopg.Connection[Any],
    table: Table,
    columns: Sequence[tuple[str, str]],
    pk: Sequence[str],
) -> None:
    parts = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns]  # t: whitelist
    if pk:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, pk))))
    with conn.transaction():
        lock_ddl(conn)
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table.ident, sql.SQL(", ").join(parts)))


def add_columns(conn: psycopg.Connection[Any], table: Table, columns: Sequence[tuple[str, str]]) -> None:
    """``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` on the target."""
    if not columns:
        return
    with conn.transaction():
        lock_ddl(conn)
        adds = sql.SQL(", ").join(
            sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns
        )
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(table.ident, adds))
