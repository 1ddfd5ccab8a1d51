"""What the sink's role may not do: turning PostgreSQL's refusals into the missing grant, by name.

A sink that runs as a least-privilege role (the secure stack's ``eosink_sink``) fails in ways
whose server messages do not say what to grant: a missing INSERT reads "permission denied for
table t" (no privilege), and a schema without USAGE reads "relation ... does not exist" (its
tables vanish from the ``search_path``). So when a statement fails with one of those classes,
the sink asks the catalogs what the role lacks among the privileges it needs - on its
bookkeeping tables, its target tables and their schemas - and names each (``INSERT on table
s.t``, ``USAGE on schema s``). The catalogs stay readable without any grant, and
``has_*_privilege`` by OID needs no USAGE on the object's schema, so the diagnosis works from
exactly the position the failure left the role in.

What the sink needs (measured against ``eosink_sink`` in ``tests/test_secure_sinks.py``):

- its schema: USAGE; CREATE when it creates tables (bookkeeping at first start, ``auto.create``)
  and in every cycle of an upsert, an update or a delete (its staging table lives in the target's
  schema for the length of the transaction: :mod:`eosink.connectors.postgres.stage`);
- ``eosink_txn_manifest``: SELECT, INSERT, UPDATE, DELETE; ``eosink_offsets``: SELECT, INSERT,
  UPDATE; ``eosink_committed_txns``: SELECT, INSERT, DELETE;
- a target table: INSERT (insert mode); upsert adds SELECT and UPDATE, update mode SELECT and
  UPDATE, ``delete.enabled`` SELECT and DELETE; ALTER (ownership) for ``auto.evolve``;
- nothing for two-phase commit: a role commits and rolls back its own prepared transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg

from eosink.connectors.postgres.config import Settings

#: SQLSTATE classes a missing grant shows up as: 42501 directly, 42P01 / 3F000 when the schema lost USAGE.
PRIVILEGE_ERRORS: tuple[type[psycopg.Error], ...] = (
    psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName,
)
BOOKKEEPING: dict[str, tuple[str, ...]] = {
    "eosink_txn_manifest": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "eosink_offsets": ("SELECT", "INSERT", "UPDATE"),
    "eosink_committed_txns": ("SELECT", "INSERT", "DELETE"),
}

TableKey = tuple[str | None, str]


def target_privileges(settings: Settings) -> tuple[str, ...]:
    """The privileges every write of these settings takes on a target table."""
    needed: list[str] = []
    if settings.insert_mode in ("insert", "upsert"):
        needed.append("INSERT")
    if settings.insert_mode != "insert" or settings.delete_enabled:
        needed.append("SELECT")
    if settings.insert_mode in ("upsert", "update"):
        needed.append("UPDATE")
    if settings.delete_enabled:
        needed.append("DELETE")
    return tuple(needed)


def needs(settings: Settings, targets: Iterable[TableKey]) -> dict[TableKey, tuple[str, ...]]:
    """Per table, the privileges the sink needs: bookkeeping tables and targets."""
    wanted: dict[TableKey, tuple[str, ...]] = {(None, t): p for t, p in BOOKKEEPING.items()}
    for key in targets:
        wanted[key] = target_privileges(settings)
    return wanted


def _default_schema(conn: psycopg.Connection[Any]) -> str | None:
    """The first schema of the role's search_path, ``"$user"`` resolved (current_schema() is NULL
    exactly when the role lost USAGE on it, so it cannot be used here)."""
    row = conn.execute("SELECT current_setting('search_path'), current_user").fetchone()
    if row is None:
        return None
    for part in str(row[0]).split(","):
        name = part.strip().strip('"')
        if name == "$user":
            name = str(row[1])
        if name and name != "pg_catalog":
            return name
    return None


def missing(conn: psycopg.Connection[Any], wanted: Mapping[TableKey, tuple[str, ...]], create: bool) -> list[str]:
    """What the connection's role lacks of ``wanted`` (and CREATE on the schemas when ``create``), by name.

    Objects that do not exist are skipped: a missing table is not a missing grant.
    """
    default = _default_schema(conn)
    lacking: list[str] = []
    schemas = sorted({name for s, _ in wanted if (name := s or default) is not None})
    for schema in schemas:
        row = conn.execute("SELECT has_schema_privilege(oid, 'USAGE'), has_schema_privilege(oid, 'CREATE') "
                           "FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if row is None:
            continue
        if not row[0]:
            lacking.append(f"USAGE on schema {schema}")
        if create and not row[1]:
            lacking.append(f"CREATE on schema {schema}")
    for (named, table), privileges in wanted.items():
        in_schema = named or default
        row = conn.execute("SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE c.relname = %s AND n.nspname = %s AND c.relkind IN ('r', 'p')", (table, in_schema)).fetchone()
        if row is None:
            continue
        absent = [p for p in privileges if not _has(conn, row[0], p)]
        if absent:
            lacking.append(f"{', '.join(absent)} on table {in_schema}.{table}")
    return lacking


def _has(conn: psycopg.Connection[Any], oid: int, privilege: str) -> bool:
    row = conn.execute("SELECT has_table_privilege(%s::oid, %s)", (oid, privilege)).fetchone()
    return bool(row and row[0])
