"""PostgreSQL sink: native two-phase commit (``PREPARE TRANSACTION``) with COPY.

One cycle, per :class:`~eosink.connectors.api.sink.TwoPhaseCommitSink`::

    write(records) * n   insert and upsert modes: tpc_begin at the first, each slice COPYed into the
                         open txn at once (upsert: into its staging table, merged when the stream
                         ends; see streaming.StreamingCopy.write); otherwise only buffered
    pre_commit(manifest)
      autocommit   INSERT eosink_txn_manifest (txn, manifest)        -- recovery can read it
      tpc_begin('eosink:<txn>')                                       -- unless streamed
        upsert eosink_offsets ... WHERE eosink_offsets.epoch <= EXCLUDED.epoch   -- the fence
        INSERT eosink_committed_txns (txn); DELETE eosink_txn_manifest (txn)
        [delete.enabled: COPY staging (tombstones' keys) + DELETE ... USING staging]
        COPY rows (insert, unless streamed) | COPY staging + INSERT ... ON CONFLICT (upsert, unless streamed) | + UPDATE ... FROM (update)
      tpc_prepare()                                                   -- durable, invisible
    commit(txn)   COMMIT PREPARED 'eosink:<txn>'   (rows, offsets, proof of commit: all at once)
    abort(txn)    ROLLBACK PREPARED 'eosink:<txn>'; DELETE eosink_txn_manifest (txn)

**Why a manifest table.** Rows of a prepared transaction are invisible to every other session,
so recovery cannot read the manifest from inside it. It is written in its own autocommit
transaction *before* the two-phase transaction prepares (when the rows were streamed, after the
transaction began: its DELETE, a later statement under READ COMMITTED, still sees the manifest)
and deleted *inside* it: COMMIT PREPARED
removes it atomically with the rows becoming visible; after ROLLBACK PREPARED, ``abort`` deletes
it. :meth:`PostgresSink.recover` lists the manifests whose GID sits in ``pg_prepared_xacts``.
A manifest whose transaction never got prepared (a crash in between) is harmless and is
garbage-collected by ``recover`` after :data:`eosink.connectors.postgres.book.ORPHAN_MANIFEST_AGE`.

**Why eosink_committed_txns.** A second ``COMMIT PREPARED`` fails with 42704 whether the
transaction was committed or rolled back: the error cannot tell. The row inserted inside the
prepared transaction becomes visible exactly when it commits, so it is the proof.

**The resource-side fence.** ``eosink_offsets`` holds (epoch, next_offset, txn) per partition.
The prepared transaction upserts it with ``WHERE eosink_offsets.epoch <= EXCLUDED.epoch``; a row
not written means a newer epoch already committed there, and the prepare raises
:class:`~eosink.connectors.api.errors.FencedError`. The row lock taken by that upsert is held until the
decision, so a zombie preparing concurrently with the new owner waits, then sees the newer epoch.

**Kafka coordinates** (``fields.kafka``, default on): every row carries ``__topic``,
``__partition`` and ``__offset``, so it can be traced back to its outbox record and duplicates
found with ``GROUP BY __topic, __partition, __offset HAVING count(*) > 1``. Add a UNIQUE index
on them if you want the database to refuse a duplicate outright (it costs COPY speed).

**Records.** Values must be JSON objects; each field goes into the column of the same name
(quoted, case kept). ``auto.create``/``auto.evolve`` create tables and add columns from the
writer's schema of records read with an Avro, Protobuf or JSON Schema converter
(:mod:`eosink.connectors.postgres.schema_types`: a decimal a numeric, a timestamp a timestamptz, a
non-nullable field NOT NULL), else from the JSON types (bool->boolean, int->bigint, float->double
precision, str->text, object/array->jsonb; a field null in every record of the batch is not created). A field missing from a record gets the
column's DEFAULT on insert and keeps the old value on upsert and update. ``table.name.format``
replaces ``${topic}`` with the topic name with ``.`` and ``-`` turned into ``_``; a ``.`` in the
result separates a schema.

**Kafka Connect JDBC sink keys** (:mod:`eosink.connectors.postgres.config`): ``insert.mode``
insert/upsert/update, ``pk.mode`` none/kafka/record_key/record_value, ``delete.enabled``
(tombstones delete by the record key: :mod:`eosink.connectors.postgres.dml`), field filters; the
JDBC keys eosink does not do are refused, never ignored. Everything a cycle writes - COPYs,
upserts, updates, deletes - is in its one prepared transaction.

DDL runs in its own short transaction before the two-phase one, serialised across workers by an
advisory lock. Statements wait at most ``lock.timeout.ms`` for locks: a prepared transaction left
by a crashed worker holds its locks until recovery resolves it, and waiting forever on it would
hide that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Xid

from eosink.connectors.api.errors import ConfigError, EosinkError, FatalError, FencedError, RecordError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.postgres import book as book
from eosink.connectors.postgres import config as pgconf
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import dml as pgdml
from eosink.connectors.postgres.book import GID_PREFIX
from eosink.connectors.postgres.rejects import COMPONENT, NeedsDDL, RowRejected, locate
from eosink.connectors.postgres.streaming import StreamingCopy
from eosink.connectors.postgres.tables import Groups, TableCache, TableKey

if TYPE_CHECKING:
    from eosink.connectors.postgres.audit import PostgresReader

log = logging.getLogger(__name__)
#: PostgreSQL's GID limit: "a string literal less than 200 bytes long".
MAX_GID_BYTES = 199
_MAX_ATTEMPTS = 3


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds spent in the phases of the last cycle (for metrics and the benchmark)."""

    manifest_ms: float = 0.0
    write_ms: float = 0.0
    prepare_ms: float = 0.0
    commit_ms: float = 0.0
    rows: int = 0


class PostgresSink(StreamingCopy):
    """Exactly-once delivery into PostgreSQL tables via ``PREPARE TRANSACTION``.

    Connection handling (both connections, reconnecting, error classes) is in
    :class:`~eosink.connectors.postgres.connection.PostgresConnections`, the rows COPYed into the open
    transaction as the engine hands them over in :class:`~eosink.connectors.postgres.streaming.StreamingCopy`.
    """

    CONFIG = pgconf.CONFIG  # Kafka Connect JDBC sink keys: see eosink.connectors.postgres.config

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        self.settings = pgconf.settings(connector, config, self.config)
        self.mode: str = self.settings.insert_mode
        self.kafka: bool = self.settings.kafka
        self._gid_check(f"{connector}.w.0.0")
        self._ac: psycopg.Connection[Any] | None = None  # autocommit: manifests, DDL, COMMIT/ROLLBACK PREPARED, recovery
        self._tx: psycopg.Connection[Any] | None = None  # the two-phase transactions only
        self._tx_state = "idle"  # idle | active | prepare-sent
        self._bootstrapped = False
        self._leases = None  # the worker's pool for this database, on first use
        self._tables = TableCache(connector, self.config, self.settings, self._with_ac)
        #: Tells this sink's prepared manifests from a sibling sink's (see :meth:`_sibling`).
        self._fingerprint = hashlib.sha1(
            json.dumps({k: v for k, v in sorted(self.config.items()) if k != "connection.password"}, default=str).encode()
        ).hexdigest()[:16]
        self.timings = CycleTimings()
        #: Insert and upsert modes stream each ``write`` into the open transaction (see :meth:`StreamingCopy.write`).
        self._streams = self.mode in ("insert", "upsert") and not self.settings.delete_enabled
        self._stream = None
        self._stream_off = True  # this txn's batch is written at prepare (not streamed, or given up)
        #: The shape of the last stream that ran without a hitch, when its columns have a row type: the
        #: engine decodes records straight into it (:meth:`row_decoder`).
        self._row_shape = None
        self._native = None

    # -- connections ------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, refuse a server without prepared transactions, create the bookkeeping tables."""
        self._with_ac(lambda conn: None)

    def close(self) -> None:
        """Give the connections back (a transaction still open is rolled back); prepared
        transactions stay on the server for recovery."""
        self._drop_stream()
        self._rollback_tx()

    def audit_reader(self, name: str) -> PostgresReader:
        """The rows' Kafka coordinates read back (see :mod:`eosink.connectors.postgres.audit`)."""
        from eosink.connectors.postgres.audit import PostgresReader

        return PostgresReader(name, self)

    def _target_tables(self) -> list[TableKey]:
        return self._tables.known()

    # -- ids --------------------------------------------------------------------------------
    def _gid_check(self, txn_id: str) -> str:
        gid = GID_PREFIX + txn_id
        size = len(gid.encode())
        if size > MAX_GID_BYTES:
            raise ConfigError(
                f"transaction id {txn_id[:60]!r}... makes a PostgreSQL GID of {size} bytes (limit {MAX_GID_BYTES}): "
                f"the connector name '{self.connector[:60]}' is too long, choose a shorter one",
                key="name", source=f"connector '{self.connector[:60]}'",
            )
        return gid

    def _xid(self, txn_id: str) -> Xid:
        """A plain (non-XA) psycopg Xid: the GID ``eosink:<txn_id>`` exactly as PostgreSQL stores it."""
        return Xid.from_string(self._gid_check(txn_id))

    def begin_transaction(self, txn_id: str) -> None:
        self._gid_check(txn_id)
        self._drop_stream()
        super().begin_transaction(txn_id)
        self._stream_off = not self._streams

    # -- prepare ----------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        txn = manifest.txn_id
        xid = self._xid(txn)
        t0 = time.perf_counter()
        held = self._finish_stream(records)  # the rows are in the open transaction already
        in_tx = held is not None
        groups = held if held is not None else self._tables.group(records)
        if not in_tx:
            for key, (recs, values) in groups.items():
                self._tables.ensure(key, recs, values)
        t1 = time.perf_counter()
        state, owner = self._with_ac(lambda conn: book.write_manifest(conn, manifest, self.connector, self._fingerprint),
                                     "writing the manifest")
        self.timings = CycleTimings(manifest_ms=(time.perf_counter() - t1) * 1000, rows=len(records))
        if state is not None and in_tx:
            self._rollback_tx()
        if state == "prepared" and owner not in (None, self._fingerprint):
            raise self._sibling(txn)
        if state is not None:
            log.info("txn %s is already %s: prepare is a no-op", txn, state)
            return
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                streamed, in_tx = in_tx, False  # a retry writes the batch itself
                if not streamed and groups is held:
                    groups = self._tables.group(records)  # the values, not the streamed rows
                self._prepare_once(manifest, xid, groups, streamed)
                self.timings.write_ms += (t1 - t0) * 1000
                return
            except NeedsDDL as need:
                self._rollback_tx()
                key = (need.table.schema, need.table.name)
                self._tables.evolve(key, *groups[key])
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                self._rollback_tx()
                if attempt == _MAX_ATTEMPTS:
                    raise self._abandon(manifest, FatalError(f"tables keep changing under the sink: {exc}", component=COMPONENT)) from exc
                self._tables.clear()  # cached metadata is stale: re-check every table
                if groups is held:
                    groups = self._tables.group(records)  # the values, not the streamed rows
                for key, (recs, values) in groups.items():
                    self._tables.ensure(key, recs, values)
            except RowRejected as rej:
                self._rollback_tx()
                if attempt < _MAX_ATTEMPTS and self._tables.changed(groups):
                    continue  # altered under us (e.g. a column type): not the record's fault
                try:
                    named = self._locate(rej, groups)
                except EosinkError as exc:  # a probe met a record the client-side check refuses first
                    named = exc
                raise self._abandon(manifest, named) from rej.error
            except (RecordError, FencedError, ConfigError) as exc:
                self._rollback_tx()
                raise self._abandon(manifest, exc) from None
            except psycopg.errors.DuplicateObject as exc:  # PREPARE: the GID is taken, in another database
                self._rollback_tx()
                raise self._abandon(manifest, self._sibling(txn)) from exc
            except psycopg.Error as exc:
                conn = self._tx
                broken = conn is None or conn.broken or conn.closed
                err = self._error(exc, conn, f"prepare of {txn}")
                self._rollback_tx()
                # e.g. "insufficient data left in message" (08P01) when binary COPY meets a column
                # whose type changed since it was cached: re-read before giving up
                if not broken and attempt < _MAX_ATTEMPTS and self._tables.changed(groups):
                    continue
                raise err from exc
            except BaseException:
                self._rollback_tx()
                raise
        raise self._abandon(
            manifest, FatalError(f"prepare of {txn}: schema changes did not settle after {_MAX_ATTEMPTS} attempts", component=COMPONENT)
        )

    def _sibling(self, txn: str) -> ConfigError:
        """Two PostgreSQL sinks of one connector on one server would share every GID.

        GIDs are unique per *server*, and both sinks name their transaction ``eosink:<txn>``: the
        second would find "already prepared" and skip its batch. Refuse instead of losing it.
        """
        return ConfigError(
            f"txn {txn} is already prepared on this PostgreSQL server by another sink of connector '{self.connector}' "
            f"(GID '{GID_PREFIX}{txn}'): a connector can have only one postgres sink per PostgreSQL server; "
            "write both tables from one sink (table.name.format) or use separate connectors",
            key="connector.class", source=f"connector '{self.connector}'",
        )

    def _prepare_once(self, manifest: TxnManifest, xid: Xid, groups: Groups, streamed: bool = False) -> None:
        """Fence, write (unless ``streamed``: the open transaction holds the rows) and prepare."""
        if streamed and (self._tx is None or self._tx.broken or self._tx.closed):
            streamed = False  # the connection died with the streamed rows (the server rolled them back): write anew
        conn = self._tcon()
        assert conn is not None
        t0 = time.perf_counter()
        self._tx_state = "active"
        if not streamed:
            try:
                conn.tpc_begin(xid)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                if not (conn.broken or conn.closed):
                    raise
                self._release_tx(discard=True)  # died while idle (e.g. a server restart): nothing was sent, start over
                conn = self._tcon()
                assert conn is not None
                self._tx_state = "active"
                conn.tpc_begin(xid)
        with conn.cursor() as cur:
            book.fence(cur, manifest, self.connector)
            if not streamed:
                for key, (recs, values) in groups.items():
                    self._write(cur, key, recs, values, self.config["auto.evolve"])
        t1 = time.perf_counter()
        self._tx_state = "prepare-sent"
        conn.tpc_prepare()
        self._release_tx()  # the prepared transaction needs no session: the next sink in line may take it
        t2 = time.perf_counter()
        self.timings.write_ms = (t1 - t0) * 1000
        self.timings.prepare_ms = (t2 - t1) * 1000

    def _abandon(self, manifest: TxnManifest, exc: EosinkError) -> EosinkError:
        """Best effort: the transaction was not prepared, so its manifest can go now."""
        try:
            self._with_ac(lambda c: book.delete_manifest(c, manifest.txn_id), "deleting the manifest")
        except EosinkError:
            pass  # abort() or recover()'s garbage collection will do it
        return exc

    def _write(self, cur: psycopg.Cursor[Any], key: TableKey, recs: list[SinkRecord], values: list[Any], evolve: bool) -> None:
        """Deletes first (the keys with a tombstone), then the records that outlive them."""
        table = self._tables[key]
        pk = self._tables.pk(recs) if self.settings.pk_mode != "none" else []
        if self._tables.tombstones(recs):
            del_r, del_k, recs, values = pgdml.split_tombstones(recs, values, pk)
            pgdml.write_delete(cur, table, del_r, del_k, pk)
        if self.mode == "upsert":
            pgc.write_upsert(cur, table, recs, values, self.kafka, evolve, pk)
        elif self.mode == "update":
            pgdml.write_update(cur, table, recs, values, self.kafka, evolve, pk)
        else:
            pgc.write_insert(cur, table, recs, values, self.kafka, evolve)

    def _locate(self, rej: RowRejected, groups: Groups) -> EosinkError:
        key = (rej.table.schema, rej.table.name)
        recs, values = groups[key]
        return locate(rej, recs, values, lambda cur, r, v: self._write(cur, key, r, v, False), self._with_ac)

    # -- commit / abort / recover ---------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        """COMMIT PREPARED; on 42704 ("no such prepared transaction") decide from the proof.

        The GID is gone after a commit *and* after a rollback, so 42704 alone cannot tell. The
        ``eosink_committed_txns`` row was written inside the prepared transaction: present, the
        txn committed earlier (this call is a replay) - ok. Absent, a transaction the decision log
        says committed was rolled back behind our back (an operator's ROLLBACK PREPARED, a
        restored backup): its rows are lost, which only an operator can repair - FatalError.
        """
        xid = self._xid(txn_id)
        t0 = time.perf_counter()

        def run(conn: psycopg.Connection[Any]) -> None:
            try:
                conn.tpc_commit(xid)
            except psycopg.errors.UndefinedObject:
                if not book.is_committed(conn, txn_id):
                    raise FatalError(
                        f"decided txn {txn_id} is gone from the database: it was rolled back by someone "
                        f"(no prepared transaction '{GID_PREFIX}{txn_id}' and no row in eosink_committed_txns); "
                        "its records are not in the tables; operator must check",
                        component=COMPONENT,
                    ) from None

        self._with_ac(run, f"commit of {txn_id}")
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000

    def abort(self, txn_id: str) -> None:
        """ROLLBACK PREPARED (42704 - already aborted, never prepared or unknown - is ok), then
        delete the manifest. A transaction still open on this instance is rolled back first."""
        if self._txn_id == txn_id:
            self._batch = []
        self._drop_stream()
        if self._tx_state != "idle":
            self._rollback_tx()
        xid = self._xid(txn_id)

        def run(conn: psycopg.Connection[Any]) -> None:
            try:
                conn.tpc_rollback(xid)
            except psycopg.errors.UndefinedObject:
                pass
            book.delete_manifest(conn, txn_id)

        self._with_ac(run, f"abort of {txn_id}")

    def recover(self) -> list[TxnManifest]:
        """Manifests of this connector's transactions that are prepared now (one snapshot).

        A prepared GID ``eosink:<connector>.…`` without a manifest (deleted by hand?) is
        returned with no ranges and a warning: the runtime cannot tie it to a decision and
        leaves it for an operator, as it must. A connector name that is a dotted prefix of
        another's (``a`` and ``a.b``) cannot tell such orphans apart; keep names distinct.
        Also garbage-collects orphaned manifests and old proofs of commit of this connector.
        """

        def run(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None, str | None]]:
            rows = book.prepared_manifests(conn)
            book.collect_garbage(conn, self.connector)
            return rows

        out: list[TxnManifest] = []
        prefix = f"{GID_PREFIX}{self.connector}."
        for gid, connector, text in self._with_ac(run, "recovery"):
            txn_id = gid[len(GID_PREFIX):]
            if connector is not None:
                if connector == self.connector:
                    try:
                        out.append(TxnManifest.from_json(text or "", f"eosink_txn_manifest ({gid})"))
                    except (ValueError, KeyError, TypeError) as exc:
                        log.warning("prepared transaction %s has an unreadable manifest (%s): left for an operator", gid, exc)
                        out.append(TxnManifest(txn_id, self.connector, ()))
            elif gid.startswith(prefix):
                log.warning("prepared transaction %s has no manifest: cannot tell its partitions; left for an operator", gid)
                out.append(TxnManifest(txn_id, self.connector, ()))
        return out

    def read_offsets(self, connector: str | None = None) -> dict[TopicPartition, tuple[int, int]]:
        """Committed ``(epoch, next_offset)`` per partition of ``connector`` (default: this one)."""
        return self._with_ac(lambda c: book.read_offsets(c, connector or self.connector), "reading offsets")

