"""The PostgreSQL sink's insert and upsert modes: each ``write`` COPYed into the open two-phase transaction.

The engine hands a sink its batch in slices while it is still reading the rest: PostgreSQL parses
and stores the rows on its own core meanwhile, and the prepare (:mod:`eosink.connectors.postgres.sink`)
only adds the manifest, the fence and the proof of commit before PREPARE. Insert mode COPYs into the
target; upsert mode into the transaction's staging table (:mod:`eosink.connectors.postgres.stage`),
every record with its offset and position in the batch, and the end of the stream merges it into the
target in one ``INSERT ... SELECT DISTINCT ON (pk) ... ON CONFLICT`` (the last record per key wins,
as when the client dedupes the batch) and drops the stage. So the prepare of an upsert is left with
that one statement, instead of deduplicating, encoding and copying the whole batch first.

**Upserts of new keys.** When every key of a batch is new (no row has it, no two records share
it), the upsert is exactly an insert. So an upsert stream first COPYs straight into the target, as
insert mode does - when the key is the target's PRIMARY KEY or an immediate UNIQUE index on NOT NULL
columns, so the server refuses any key it already has or sees twice (23505). The first such
refusal ends the stream like any other, the prepare merges the whole batch through its stage, and
the next :data:`DIRECT_PAUSE` upsert streams go through the stage without trying: a table whose
keys keep coming back costs at most one wasted stream in that many, one of new keys none of the
merge's work (about a third of an upsert cycle of new keys, measured). Any record the stream
cannot take ends it, and the prepare writes the whole batch as it would without streaming. Once a
stream has run without a hitch, the sink offers the engine a row type for its table's columns
(:meth:`StreamingCopy.row_decoder`), and records come decoded straight into those rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import Xid, sql

from eosink.connectors.api.records import SinkRecord
from eosink.connectors.api.rows import NativeRowTarget, RowRecord
from eosink.connectors.api.sink import BatchingSink
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import copy_native
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres import stage as pgstage
from eosink.connectors.postgres.connection import PostgresConnections
from eosink.connectors.postgres.native_rows import native_shape, target_of, utf8
from eosink.connectors.postgres.tables import Groups, TableCache, TableKey

log = logging.getLogger("eosink.connectors.postgres.sink")
#: Upsert streams that go through the stage after a key the direct COPY met again (see the module docstring).
DIRECT_PAUSE = 16


@dataclass(slots=True)
class _Stream:
    """The COPY of the open transaction, fed by every ``write`` of the cycle (see :meth:`StreamingCopy.write`)."""

    key: TableKey
    shape: pgc.Shape
    closer: contextlib.ExitStack
    write_row: Callable[[tuple[Any, ...]], None]
    #: The COPY's own ``write``: rows the C encoder wrote, joined (:mod:`eosink.connectors.postgres.copy_native`).
    write: Callable[[bytes], None]
    conn: Any = None  # the connection of the open transaction (a COPY of another shape may follow in it)
    #: The values of the rows written, in order (the prepare's groups, without building them again): a
    #: slice that does not fit whole ends the stream, so there is a row for each of them.
    values: list[Any] = field(default_factory=list)
    #: Upsert: the transaction's staging table, and the statements that end the stream (see :func:`_merge_plan`).
    stage: sql.Identifier | None = None
    merge: list[sql.Composed] = field(default_factory=list)
    #: Upsert COPYing straight into the target (every key new, else 23505 ends the stream).
    direct: bool = False


class _NotStreamed(Exception):
    """These records cannot join the open COPY: the prepare writes the whole batch itself."""


class StreamingCopy(PostgresConnections, BatchingSink):
    """The streaming half of :class:`~eosink.connectors.postgres.sink.PostgresSink`, whose ``__init__``
    sets the attributes declared here."""

    _tables: TableCache
    kafka: bool
    mode: str
    #: Insert and upsert modes without deletes stream; the rest writes at prepare.
    _streams: bool
    _stream: _Stream | None
    _stream_off: bool  # this txn's batch is written at prepare (not streamed, or given up)
    _row_shape: pgc.Shape | None
    #: The binary shape native rows are COPYed with, and what the engine decodes them for (:meth:`native_row_target`).
    _native: tuple[pgc.Shape, NativeRowTarget] | None = None
    _xid: Callable[[str], Xid]
    #: Upsert streams still to go through the stage before a direct COPY is tried again.
    _direct_pause: int = 0

    def row_decoder(self) -> Callable[[bytes], Any] | None:
        """Decode JSON values straight into the streamed COPY's rows (see
        :class:`eosink.connectors.api.rows.RowDecoding`): the row type of the last stream's shape,
        which takes exactly the records that shape's COPY takes without a type check; any other
        record keeps its dict, and is written or refused as ever. None until such a stream ran.
        Where the C encoder takes the shape, its ``encode`` instead: the row's binary COPY fields
        (:mod:`eosink.connectors.postgres.copy_native`)."""
        shape = self._row_shape
        if shape is None or not self._streams or not self._tables.plain:
            return None
        return shape.encoded.encode if shape.encoded is not None else shape.decode

    def native_row_target(self) -> NativeRowTarget | None:
        """Decode Avro values straight into native rows of the streamed COPY's columns (see
        :mod:`eosink.connectors.postgres.native_rows`): offered once a stream of Avro records ran on a
        table whose columns all take native values, until a stream fails; None otherwise."""
        native = self._native
        return native[1] if native is not None and self._streams and self._tables.plain else None

    def write(self, records: Sequence[SinkRecord]) -> None:
        """Stage ``records`` and, in insert mode, COPY them into the transaction right away.

        The engine calls ``write`` with slices of the batch while it is still reading the rest
        (``eosink.worker.engine.source``): PostgreSQL parses and stores rows on its own core while
        this process polls and decodes the next ones, instead of idling until the prepare. The
        transaction stays open and unprepared until :meth:`pre_commit`, which adds the manifest,
        the fence and the proof of commit and prepares, exactly as when the batch is written there.

        Streaming is an optimisation, never a different outcome: any record it cannot take as it
        is (another table or shape, a field the table lacks, a value of the wrong type, a row the
        server refuses, a lost connection) ends it; the transaction is rolled back and the prepare
        writes the whole batch itself - with the usual DDL, retries and errors naming the record.
        While streaming, the open transaction holds the target table's ROW EXCLUSIVE lock for the
        whole cycle, not only from the prepare: another worker's auto.evolve waits for it (at most
        ``lock.timeout.ms``, then retries); this sink never runs DDL while its own stream is open.
        """
        super().write(records)
        if self._stream_off or not records:
            return
        try:
            self._stream_rows(list(records))
        except Exception as exc:  # noqa: BLE001 - the prepare writes the batch and reports what is wrong
            log.debug("txn %s: rows written at prepare instead of streamed (%s: %s)", self._txn_id,
                      type(exc).__name__, exc)
            self._note_failure(self._stream, exc)
            self._drop_stream()

    def _stream_rows(self, records: list[SinkRecord]) -> None:
        groups = self._tables.group(records, rows=True)  # a RowRecord's row, not its value (not decoded)
        if len(groups) != 1:
            raise _NotStreamed("records for several tables")
        [(key, (recs, values))] = groups.items()
        st = self._stream
        if st is None:
            if len(self._batch) != len(records) or self._txn_id is None:
                raise _NotStreamed("not at the start of a batch")
            shape = self._row_shape
            if shape is not None and shape.encoded is not None and values[0].__class__ is bytes and recs[0].__class__ is RowRecord:
                # Encoded by the last stream's C encoder: its table, unless the cache was re-read since.
                if self._tables.cached(key) is not shape.table:
                    raise _NotStreamed("the table was re-read since its rows were encoded")
            elif shape is not None and values[0].__class__ is shape.row_type:
                # Decoded into the last stream's rows: its table, unless the cache was re-read since.
                if self._tables.cached(key) is not shape.table:
                    raise _NotStreamed("the table was re-read since its rows were decoded")
                shape = dataclasses.replace(shape, encoded=None) if shape.encoded is not None else shape
            elif values[0].__class__ is tuple and self._native is not None:  # Avro values as native rows
                shape = self._native[0]
                if self._tables.cached(key) is not shape.table:
                    raise _NotStreamed("the table was re-read since its rows were decoded")
            elif type(values[0]) is dict:
                self._tables.ensure(key, recs, values)  # DDL in its own transaction, before the two-phase one
                shape = pgc.Shape.of(self._tables[key], tuple(values[0]), self.kafka)
            else:
                raise _NotStreamed("not a batch of JSON objects")
            st = self._open_stream(key, shape, recs)
        elif key != st.key:
            raise _NotStreamed("records for another table")
        elif values[0].__class__ is tuple and not st.shape.native and self._native is not None:
            self._switch_to_native(st, self._native[0])
        elif values[0].__class__ is bytes and st.shape.encoded is None and recs[0].__class__ is RowRecord:
            shape = self._row_shape
            if shape is None or shape.encoded is None:
                raise _NotStreamed("rows encoded for another shape")
            self._switch_copy(st, shape)
        if self._tables.unverified(key, recs):  # a new schema version mid-cycle: its DDL runs before the prepare
            raise _NotStreamed("a writer's schema not yet checked against the table")
        ordinal = len(st.values) if st.stage is not None else None  # the stream starts with the batch
        if st.shape.encoded is not None:  # one write of the slice's rows, or of those before the first it cannot take
            blob, done = copy_native.join(st.shape.encoded, values, recs, ordinal)
            if done:
                st.write(blob)
        else:
            done = pgc.copy_rows(st.write_row, st.shape, recs, values, self.config["auto.evolve"], ordinal)
        st.values += values
        if done != len(recs):
            raise _NotStreamed("records of another shape")

    def _open_stream(self, key: TableKey, shape: pgc.Shape, recs: list[SinkRecord]) -> _Stream:
        assert self._txn_id is not None
        pgc.check_shape(shape, recs[0])
        table = self._tables[key]
        merge = None
        if self.mode == "upsert":
            pk = self._tables.pk(recs)
            merge = _merge_plan(table, shape, pk)
            if self._direct_pause > 0:
                self._direct_pause -= 1
            elif _keyed(table, pk):
                merge = None  # new keys go straight in; a known one ends the stream (see DIRECT_PAUSE)
        direct = self.mode == "upsert" and merge is None
        xid = self._xid(self._txn_id)
        conn = self._tcon(wait=False)
        if conn is None:  # every two-phase connection of the worker's pool is in use: write at prepare
            raise _NotStreamed("no free connection in the pool")
        self._tx_state = "active"
        try:
            if shape.native and not utf8(conn):
                raise _NotStreamed("native rows need a client encoding of UTF-8")
            with contextlib.ExitStack() as opened:  # on a failure: the COPY failed, the cursor closed
                conn.tpc_begin(xid)
                cur = opened.enter_context(conn.cursor())
                extra: tuple[str, ...]
                if merge is None:
                    stage, target, extra, types = None, table.ident, (), shape.types
                else:
                    stage = pgstage.create(cur, table, shape.all_cols, ordered=True)
                    target, extra, types = stage, pgstage.ORDER, shape.types + pgstage.ORDER_TYPES
                cp = opened.enter_context(cur.copy(shape.copy_statement(target, extra)))
                cp.set_types(list(types))
                if shape.encoded is not None:
                    cp.write(copy_native.SIGNATURE)
                closer = opened.pop_all()
        except BaseException:
            self._rollback_tx()
            raise
        self._stream = _Stream(key, shape, closer, cp.write_row, cp.write, conn=conn, stage=stage,
                               merge=merge(stage) if merge is not None and stage is not None else [], direct=direct)
        if shape.row_type is None:
            self._row_shape = None
        elif shape.encoded is None:  # rows next time: encoded in C where it takes the shape, else typed
            encoded = copy_native.encoded(shape, utf8(conn))
            self._row_shape = dataclasses.replace(shape, encoded=encoded) if encoded is not None else shape
        else:
            self._row_shape = shape
        if not shape.native:
            schema = recs[0].value_schema
            native = native_shape(shape.table, shape.keys, shape.kafka) if schema is not None and schema.format == "avro" else None
            self._native = (native, target_of(native)) if native is not None else None
        return self._stream

    def _switch_to_native(self, st: _Stream, shape: pgc.Shape) -> None:
        """End the open COPY (its rows stay in the transaction) and go on with a binary COPY of native rows
        in the same transaction: the engine decodes into them from the first slice after the stream opened,
        and the batch would otherwise be written again at prepare."""
        if not utf8(st.conn):
            raise _NotStreamed("native rows need a UTF-8 client encoding")
        self._switch_copy(st, shape)

    def _switch_copy(self, st: _Stream, shape: pgc.Shape) -> None:
        """End the open COPY (its rows stay in the transaction) and go on with a COPY of ``shape`` (native
        rows, or rows the C encoder wrote) in the same transaction: the same table, as last read, and keys."""
        if self._tables.cached(st.key) is not shape.table or shape.keys != st.shape.keys:
            raise _NotStreamed("rows of another table or shape, or of a table re-read since")
        _end_copy(st)
        with contextlib.ExitStack() as opened:
            cur = opened.enter_context(st.conn.cursor())
            if st.stage is None:
                cp = opened.enter_context(cur.copy(shape.copy_statement(self._tables[st.key].ident)))
                cp.set_types(list(shape.types))
            else:  # an upsert's stage: its rows go on with their order columns (copy_rows' ordinal)
                cp = opened.enter_context(cur.copy(shape.copy_statement(st.stage, pgstage.ORDER)))
                cp.set_types([*shape.types, *pgstage.ORDER_TYPES])
            if shape.encoded is not None:
                cp.write(copy_native.SIGNATURE)
            st.closer = opened.pop_all()
        st.shape, st.write_row, st.write = shape, cp.write_row, cp.write

    def _drop_stream(self) -> None:
        """Give up streaming for this txn: fail the COPY and roll the open transaction back."""
        st, self._stream = self._stream, None
        self._stream_off = True
        if st is None:
            return
        self._row_shape = self._native = None  # rows only again after a stream that runs without a hitch
        try:
            st.closer.__exit__(_NotStreamed, _NotStreamed("abandoned"), None)  # CopyFail: the server drops the rows
        except Exception:  # noqa: BLE001 - the connection may be gone; the rollback below settles it
            pass
        self._rollback_tx()

    def _finish_stream(self, records: list[SinkRecord]) -> Groups | None:
        """End the open COPY. When the open transaction now holds every row of the batch, the
        batch's groups (one table: every slice went there); else None, and nothing is open."""
        st, self._stream = self._stream, None
        if st is None:
            return None
        if self._stream_off or len(st.values) != len(records):
            self._stream = st
            self._drop_stream()
            return None
        try:
            _end_copy(st)
            if st.stage is not None:
                self._merge(st)
        except Exception as exc:  # noqa: BLE001 - e.g. a row the server refused: written again, and named, at prepare
            self._note_failure(st, exc)
            log.debug("txn %s: streamed rows refused (%s); writing the batch at prepare", self._txn_id, exc)
            self._row_shape = self._native = None
            self._rollback_tx()
            return None
        return {st.key: (records, st.values)}

    def _note_failure(self, st: _Stream | None, exc: Exception) -> None:
        """A direct upsert stream met a key again: the next :data:`DIRECT_PAUSE` go through the stage."""
        if st is not None and st.direct and isinstance(exc, psycopg.errors.UniqueViolation):
            self._direct_pause = DIRECT_PAUSE

    def _merge(self, st: _Stream) -> None:
        """Upsert: run the stream's closing statements (:func:`_merge_plan`) in the open transaction.
        A null key refuses the stream, so that the prepare names the record as it always has."""
        conn = self._tx
        assert conn is not None
        with conn.cursor() as cur:
            for statement in st.merge:
                cur.execute(statement)
                row = cur.fetchone() if cur.description is not None else None
                if row is not None and row[0]:
                    raise _NotStreamed("a record with a null key")


def _end_copy(st: _Stream) -> None:
    """Close the stream's COPY: psycopg ends a COPY of rows itself, one of joined rows needs its trailer."""
    if st.shape.encoded is not None:
        st.write(copy_native.TRAILER)
    st.closer.close()


def _keyed(table: pgs.Table, pk: list[str]) -> bool:
    """Does the server refuse a second row of a key, whatever the rows? (An immediate unique index on
    exactly the key, NOT NULL columns: :attr:`~eosink.connectors.postgres.schema.Table.unique_sets`.)"""
    return bool(pk) and frozenset(pk) in table.unique_sets and all(table.columns[c].notnull for c in pk)


def _merge_plan(table: pgs.Table, shape: pgc.Shape, pk: list[str]) -> Callable[[sql.Identifier], list[sql.Composed]]:
    """What ends an upsert's stream into ``stage``: [the null-key probe (when a key column is
    nullable),] the merge, the DROP. Raises :class:`_NotStreamed` for a shape whose key the client
    must check itself (a missing or JSON key column) or that has a column named like the stage's
    order columns: the prepare writes such a batch."""
    if not pk or any(c not in shape.cols or table.columns[c].kind == pgs.JSON for c in pk):
        raise _NotStreamed("a key the records' shape does not carry as a plain column")
    if set(pgstage.ORDER) & set(shape.all_cols):
        raise _NotStreamed("a field named like the staging table's order columns")
    nullable = any(not table.columns[c].notnull for c in pk)

    def plan(stage: sql.Identifier) -> list[sql.Composed]:
        probe = [pgstage.null_key(pk, stage)] if nullable else []
        return [*probe, pgstage.merge(table, shape.all_cols, pk, stage, ordered=True),
                pgstage.drop_statement(stage)]

    return plan
