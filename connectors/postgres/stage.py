"""Staging tables of upserts, updates and deletes: created and dropped inside the two-phase transaction.

An upsert merges its batch with ``INSERT INTO target SELECT ... FROM stage ON CONFLICT (pk) DO
UPDATE``; an update and a delete join the target with the staged keys. The rows get into the stage
by binary COPY, which is what makes these modes fast, so a stage is needed. Where it lives decides
what is left behind:

* **Not a TEMPORARY table**: PostgreSQL refuses ``PREPARE TRANSACTION`` in a transaction that
  touched one ("cannot PREPARE a transaction that has operated on temporary objects"). And a temp
  table outlives the transaction on a pooled connection (:mod:`eosink.connectors.postgres.pool`)
  unless ``ON COMMIT DROP``, which two-phase commit cannot use either.
* **Not a permanent table per target** (what earlier versions did, ``<table>__eosink_stage_<hash>``):
  it stays in the schema after the connector is deleted, and every cycle's ``DELETE FROM stage``
  leaves dead rows for vacuum.
* **An UNLOGGED table created and dropped in the same transaction** (:func:`create`, :func:`drop`),
  named ``<table>__eosink_stage_<random>``: its creation is uncommitted until the transaction
  ends, so no other session ever sees it, and PostgreSQL prepares such a transaction (no temporary
  object is involved). Whatever happens to the transaction, nothing is left: a worker killed before
  the prepare has its transaction rolled back by the server with its connection, so the CREATE is
  undone; a prepared transaction already holds the DROP, so ``COMMIT PREPARED`` and ``ROLLBACK
  PREPARED`` (by the worker, or by whoever recovers its partitions) both end with no table. The
  random name keeps concurrent transactions from queueing on each other's uncommitted catalog row
  (a second CREATE of one name waits for the first transaction to end, which for a prepared one is
  the cycle's decision). Unlogged: the rows never outlive the transaction, so WAL for them is waste.

The cost is the catalog rows of one small table per transaction and shape (about a millisecond),
against the COPY and merge of a whole batch. The stage is ``CREATE TABLE AS SELECT <columns> FROM
target WITH NO DATA``: the target's column types, and none of its constraints, so a record lacking a
column the target gives a DEFAULT is not refused in staging; the target enforces them at the merge.
A streamed upsert (:mod:`eosink.connectors.postgres.streaming`) adds two columns, the record's
offset and its position in the batch, so that the merge keeps the last record per key (see
:func:`merge`), as :func:`eosink.connectors.postgres.copy.latest_per_key` does on the client.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from eosink.connectors.postgres.schema import Table

#: What every staging table's name contains (also the names older versions used, per target).
MARK = "__eosink_stage_"
#: The columns a streamed stage adds for deduplication: the record's offset, its position in the batch.
ORDER = ("__eosink_stage_offset", "__eosink_stage_n")
ORDER_TYPES = ("int8", "int8")


def name(table: Table) -> str:
    """``<table>__eosink_stage_<12 random hex>``, the table's name cut so that it fits 63 bytes."""
    head = table.name.encode()[:36].decode("utf-8", "ignore")
    return f"{head}{MARK}{secrets.token_hex(6)}"


def create(cur: psycopg.Cursor[Any], table: Table, cols: Sequence[str], *, ordered: bool = False) -> sql.Identifier:
    """Create the transaction's stage for ``cols`` of ``table`` (plus :data:`ORDER` when ``ordered``)."""
    stage = name(table)
    ident = sql.Identifier(table.schema, stage) if table.schema else sql.Identifier(stage)
    select: list[sql.Composable] = [sql.Identifier(c) for c in cols]
    if ordered:
        select += [sql.SQL("NULL::int8 AS {}").format(sql.Identifier(c)) for c in ORDER]
    cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
        ident, sql.SQL(", ").join(select), table.ident))
    return ident


def drop_statement(stage: sql.Identifier) -> sql.Composed:
    return sql.SQL("DROP TABLE {}").format(stage)


def drop(cur: psycopg.Cursor[Any], stage: sql.Identifier) -> None:
    """Drop the stage in the transaction that created it (the DROP commits, or rolls back, with it)."""
    cur.execute(drop_statement(stage))


def merge(table: Table, cols: Sequence[str], pk: Sequence[str], stage: sql.Identifier, *, ordered: bool = False) -> sql.Composed:
    """``INSERT INTO target (cols) SELECT cols FROM stage ON CONFLICT (pk) DO UPDATE`` of the
    non-key ``cols`` (``DO NOTHING`` when there are none). ``ordered``: the stage may hold several
    rows per key, and ``SELECT DISTINCT ON (pk) ... ORDER BY pk, offset DESC, position DESC`` keeps
    the one with the highest offset, then the later one - the record ``latest_per_key`` keeps (ON
    CONFLICT cannot take one key twice in a statement)."""
    names = sql.SQL(", ").join(map(sql.Identifier, cols))
    keys = sql.SQL(", ").join(map(sql.Identifier, pk))
    updates = [c for c in cols if c not in set(pk)]
    action = (
        sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates))
        if updates
        else sql.SQL("DO NOTHING")
    )
    if ordered:
        source = sql.SQL("SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, {} DESC, {} DESC").format(
            keys, names, stage, keys, *map(sql.Identifier, ORDER))
    else:
        source = sql.SQL("SELECT {} FROM {}").format(names, stage)
    return sql.SQL("INSERT INTO {} ({}) {} ON CONFLICT ({}) {}").format(table.ident, names, source, keys, action)


def null_key(pk: Sequence[str], stage: sql.Identifier) -> sql.Composed:
    """Does a staged row have a null key column? (A unique index on nullable columns would take it,
    where :func:`~eosink.connectors.postgres.copy.latest_per_key` refuses the record by name.)"""
    return sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {})").format(
        stage, sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier(c)) for c in pk))


__all__ = ["MARK", "ORDER", "ORDER_TYPES", "create", "drop", "drop_statement", "merge", "name", "null_key"]
