"""Naming what PostgreSQL refused: the record, the column, the server's reason.

A COPY or a merge that fails tells only part of the story: a line number in the error context
(COPY), a column name (sometimes), or nothing at all (an ``INSERT ... SELECT`` of a staged batch,
a foreign key checked at the end of the statement). The sink must still name the culprit - topic,
partition, offset and column - so the record can be fixed or sent to the dead letter queue. This
module turns server errors into :class:`~eosink.connectors.api.errors.RecordError` s, and
:func:`locate` narrows an unnamed refusal down to one record by replaying halves of the batch.
It is apart from :mod:`eosink.connectors.postgres.copy` (the hot path) because none of it runs
unless something was refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from eosink.connectors.api.errors import EosinkError, FatalError, RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.postgres.schema import Table

COMPONENT = "postgres"
_LINE = re.compile(r"COPY [^\n]*?, line (\d+)")


class NeedsDDL(Exception):
    """A record carries a non-null field the table has no column for (auto.evolve is on)."""

    def __init__(self, table: Table, field_name: str) -> None:
        super().__init__(f"{table.display} needs a column for field {field_name!r}")
        self.table = table
        self.field_name = field_name


class RowRejected(Exception):
    """The server refused rows of ``table``; ``suspect`` is the record its error pointed at."""

    def __init__(self, table: Table, suspect: SinkRecord | None, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.table = table
        self.suspect = suspect
        self.error = error


def record_error(rec: SinkRecord, message: str, column: str | None = None) -> RecordError:
    return RecordError(
        message, topic=rec.topic, partition=rec.partition, offset=rec.offset, column=column, component=COMPONENT
    )


def non_object_error(rec: SinkRecord, value: Any) -> RecordError:
    what = ("null (a tombstone: deletes need delete.enabled=true with pk.mode=record_key)" if value is None
            else f"a JSON {type(value).__name__}")
    return record_error(rec, f"value is {what}, not a JSON object: the sink maps object fields to columns")


def error_line(exc: psycopg.Error) -> int | None:
    """The 1-based line of a COPY error, from the server's error context."""
    m = _LINE.search(exc.diag.context or "")
    return int(m.group(1)) if m else None


def error_column(exc: psycopg.Error, columns: Sequence[str]) -> str | None:
    """The column a server error names: ``diag.column_name`` or the COPY context's ``column x``."""
    if exc.diag.column_name:
        return exc.diag.column_name
    ctx = exc.diag.context or ""
    for c in sorted(columns, key=len, reverse=True):
        if f", column {c}:" in ctx or ctx.endswith(f", column {c}") or f", column {c}\n" in ctx:
            return c
    return None


def describe(exc: psycopg.Error) -> str:
    """The server's message, detail and SQLSTATE on one line."""
    d = exc.diag
    parts = [str(d.message_primary or exc).strip()]
    if d.message_detail:
        parts.append(d.message_detail)
    if d.sqlstate:
        parts.append(f"(SQLSTATE {d.sqlstate})")
    return " ".join(parts)


Writer = Callable[[psycopg.Cursor[Any], list[SinkRecord], list[Any]], None]


def locate(
    rej: RowRejected,
    recs: Sequence[SinkRecord],
    values: Sequence[Any],
    write: Writer,
    run: Callable[[Callable[[psycopg.Connection[Any]], Any], str], Any],
) -> EosinkError:
    """Name the record PostgreSQL refused: the one its COPY error line points at, else bisection.

    Errors without a line (an ``INSERT ... SELECT`` in upsert mode, a foreign key checked at the
    end of the statement) are narrowed down by replaying halves of the batch. Every probe runs
    in a transaction that is always rolled back, with constraints checked immediately, so
    nothing of the batch becomes visible. ``write`` replays records into a cursor the way the
    prepare did; ``run`` runs a function on the sink's autocommit connection.
    """
    table = rej.table
    columns = list(table.columns)

    def probe(idx: Sequence[int]) -> psycopg.Error | None:
        sub_r, sub_v = [recs[i] for i in idx], [values[i] for i in idx]

        def attempt(conn: psycopg.Connection[Any]) -> psycopg.Error | None:
            try:
                with conn.transaction(force_rollback=True), conn.cursor() as cur:
                    cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
                    write(cur, sub_r, sub_v)
            except RowRejected as r:
                return r.error
            except (psycopg.DataError, psycopg.IntegrityError) as e:
                return e
            return None

        return run(attempt, "locating the refused record")

    def named(rec: SinkRecord, err: psycopg.Error) -> RecordError:
        return record_error(rec, f"{table.display} refused the row: {describe(err)}", error_column(err, columns))

    index = {id(r): i for i, r in enumerate(recs)}
    if rej.suspect is not None and id(rej.suspect) in index:
        err = probe([index[id(rej.suspect)]])
        if err is not None:
            return named(rej.suspect, err)
    cands = list(range(len(recs)))
    err = probe(cands)
    while err is not None and len(cands) > 1:
        half = len(cands) // 2
        for part in (cands[:half], cands[half:]):
            e = probe(part)
            if e is not None:
                cands, err = part, e
                break
        else:
            break  # each half passes alone: the rows conflict only together (e.g. a duplicate key)
    if err is not None and len(cands) == 1:
        return named(recs[cands[0]], err)
    if rej.suspect is not None:
        return named(rej.suspect, rej.error)
    return FatalError(f"{table.display} refused the batch: {describe(rej.error)}; it could not be narrowed to one record",
                      component=COMPONENT)


__all__ = [
    "COMPONENT",
    "NeedsDDL",
    "RowRejected",
    "Writer",
    "describe",
    "error_column",
    "error_line",
    "locate",
    "non_object_error",
    "record_error",
]
