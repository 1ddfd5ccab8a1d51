"""PostgreSQL sink: native two-phase commit (``PREPARE TRANSACTION``) with COPY.

One cycle, per :class:`~connectors.sink.TwoPhaseCommitSink`::

    pre_commit(manifest)
      autocommit   INSERT eosink_txn_manifest (txn, manifest)        -- recovery can read it
      tpc_begin('eosink:<txn>')
        upsert eosink_offsets ... WHERE eosink_offsets.epoch <= EXCLUDED.epoch   -- the fence
        INSERT eosink_committed_txns (txn); DELETE eosink_txn_manifest (txn)
        COPY rows (insert) | COPY staging + INSERT ... ON CONFLICT (upsert)
      tpc_prepare()                                                   -- durable, invisible
    commit(txn)   COMMIT PREPARED 'eosink:<txn>'   (rows, offsets, proof of commit: all at once)
    abort(txn)    ROLLBACK PREPARED 'eosink:<txn>'; DELETE eosink_txn_manifest (txn)

**Why a manifest table.** Rows of a prepared transaction are invisible to every other session,
so recovery cannot read the manifest from inside it. It is written in its own autocommit
transaction *before* the two-phase transaction begins and deleted *inside* it: COMMIT PREPARED
removes it atomically with the rows becoming visible; after ROLLBACK PREPARED, ``abort`` deletes
it. :meth:`PostgresSink.recover` lists the manifests whose GID sits in ``pg_prepared_xacts``.
A manifest whose transaction never got prepared (a crash in between) is harmless and is
garbage-collected after :data:`ORPHAN_MANIFEST_AGE`.

**Why eosink_committed_txns.** A second ``COMMIT PREPARED`` fails with 42704 whether the
transaction was committed or rolled back: the error cannot tell. The row inserted inside the
prepared transaction becomes visible exactly when it commits, so it is the proof.

**The resource-side fence.** ``eosink_offsets`` holds (epoch, next_offset, txn) per partition.
The prepared transaction upserts it with ``WHERE eosink_offsets.epoch <= EXCLUDED.epoch``; a row
not written means a newer epoch already committed there, and the prepare raises
:class:`~connectors.errors.FencedError`. The row lock taken by that upsert is held until the
decision, so a zombie preparing concurrently with the new owner waits, then sees the newer epoch.

**Kafka coordinates** (``fields.kafka``, default on): every row carries ``__topic``,
``__partition`` and ``__offset``, so it can be traced back to its outbox record and duplicates
found with ``GROUP BY __topic, __partition, __offset HAVING count(*) > 1``. Add a UNIQUE index
on them if you want the database to refuse a duplicate outright (it costs COPY speed).

**Records.** Values must be JSON objects; each field goes into the column of the same name
(quoted, case kept). ``auto.create``/``auto.evolve`` create tables and add columns from the
JSON types (bool->boolean, int->bigint, float->double precision, str->text, object/array->jsonb;
a field null in every record of the batch is not created). A field missing from a record gets the
column's DEFAULT on insert and keeps the old value on upsert. Tombstones (null values) are
refused: deletes are not supported. ``table.name.format`` replaces ``${topic}`` with the topic
name with ``.`` and ``-`` turned into ``_``; a ``.`` in the result separates a schema.

DDL runs in its own short transaction before the two-phase one, serialised across workers by an
advisory lock. Statements wait at most ``lock.timeout.ms`` for locks: a prepared transaction left
by a crashed worker holds its locks until recovery resolves it, and waiting forever on it would
hide that.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar

import psycopg
from psycopg import Xid
from psycopg.conninfo import conninfo_to_dict

from connectors import _pg_copy as pgc
from connectors import _pg_schema as pgs
from connectors.config import ConfigDef, Importance, Type, at_least, non_empty, one_of
from connectors.errors import ConfigError, EosinkError, FatalError, FencedError, RecordError, RetryableError
from connectors.records import PartitionRange, SinkRecord, TopicPartition, TxnManifest
from connectors.sink import BatchingSink

log = logging.getLogger(__name__)
COMPONENT = "postgres"
GID_PREFIX = "eosink:"
#: PostgreSQL's GID limit: "a string literal less than 200 bytes long".
MAX_GID_BYTES = 199
#: Manifests older than this whose transaction is not prepared are deleted by ``recover``.
ORPHAN_MANIFEST_AGE = "15 minutes"
#: Proofs of commit older than this are deleted by ``recover`` unless a partition still names them.
COMMITTED_TXN_RETENTION = "7 days"
_MAX_ATTEMPTS = 3
T = TypeVar("T")


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds spent in the phases of the last cycle (for metrics and the benchmark)."""

    manifest_ms: float = 0.0
    write_ms: float = 0.0
    prepare_ms: float = 0.0
    commit_ms: float = 0.0
    rows: int = 0


class PostgresSink(BatchingSink):
    """Exactly-once delivery into PostgreSQL tables via ``PREPARE TRANSACTION``."""

    ALIAS = "postgres"
    CONFIG = (
        ConfigDef()
        .define("connection.url", Type.STRING, doc="PostgreSQL DSN, e.g. postgresql://host:5432/db (libpq URI or key=value).",
                importance=Importance.HIGH, validator=non_empty)
        .define("connection.user", Type.STRING, None, "User name; overrides the DSN's.", Importance.HIGH)
        .define("connection.password", Type.PASSWORD, None, "Password; overrides the DSN's.", Importance.HIGH)
        .define("table.name.format", Type.STRING, "${topic}",
                "Target table; ${topic} is the topic with '.' and '-' replaced by '_'. A '.' in the result separates a schema.",
                validator=non_empty)
        .define("insert.mode", Type.STRING, "insert", "insert: COPY every record as a new row. upsert: one row per primary key, "
                "the record with the highest offset wins (needs pk.mode and a unique index on pk.fields).",
                Importance.HIGH, one_of("insert", "upsert"))
        .define("pk.mode", Type.STRING, "none", "none | record_key (the Kafka key: a JSON object's fields, else the key "
                "itself in column pk.fields[0] or __key) | record_value (pk.fields of the value).",
                Importance.HIGH, one_of("none", "record_key", "record_value"))
        .define("pk.fields", Type.LIST, [], "Primary key columns (comma-separated). Required with pk.mode=record_value.")
        .define("auto.create", Type.BOOLEAN, True, "Create a missing table from the batch's JSON types (with PRIMARY KEY pk.fields).")
        .define("auto.evolve", Type.BOOLEAN, True, "Add a column for a new non-null field (ALTER TABLE ... ADD COLUMN, nullable).")
        .define("fields.kafka", Type.BOOLEAN, True, "Add columns __topic text, __partition int, __offset bigint to every row "
                "so it can be traced to (and deduplicated by) its outbox record.")
        .define("lock.timeout.ms", Type.LONG, 10_000, "Longest wait for a lock before the cycle fails as retryable "
                "(PostgreSQL lock_timeout); 0 waits forever.", validator=at_least(0))
    )

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        c = self.config
        src = f"connector '{connector}'"
        self.upsert: bool = c["insert.mode"] == "upsert"
        self.pk_mode: str = c["pk.mode"]
        self.pk_fields: list[str] = list(c["pk.fields"])
        self.kafka: bool = bool(c["fields.kafka"])
        if self.upsert and self.pk_mode == "none":
            raise ConfigError("insert.mode=upsert needs a primary key: set pk.mode to record_key or record_value", key="pk.mode", source=src)
        if self.pk_mode == "record_value" and not self.pk_fields:
            raise ConfigError("pk.mode=record_value needs pk.fields (the value fields forming the key)", key="pk.fields", source=src)
        self._gid_check(f"{connector}.w.0.0")
        self._ac: psycopg.Connection[Any] | None = None  # autocommit: manifests, DDL, COMMIT/ROLLBACK PREPARED, recovery
        self._tx: psycopg.Connection[Any] | None = None  # the two-phase transactions only
        self._tx_state = "idle"  # idle | active | prepare-sent
        self._bootstrapped = False
        self._tables: dict[tuple[str | None, str], pgs.Table] = {}
        self._table_names: dict[str, tuple[str | None, str]] = {}
        self.timings = CycleTimings()

    # -- connections ------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, refuse a server without prepared transactions, create the bookkeeping tables."""
        self._with_ac(lambda conn: None)
        self._tcon()

    def close(self) -> None:
        """Close both connections; prepared transactions stay on the server for recovery."""
        for conn in (self._tx, self._ac):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - closing a broken connection may fail; nothing to do
                    pass
        self._tx = self._ac = None
        self._tx_state = "idle"

    def _connect(self, autocommit: bool) -> psycopg.Connection[Any]:
        url = self.config["connection.url"]
        kwargs: dict[str, Any] = {"autocommit": autocommit, "application_name": f"eosink/{self.connector}"[:63]}
        try:
            if "connect_timeout" not in conninfo_to_dict(url):
                kwargs["connect_timeout"] = 10
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"not a valid PostgreSQL DSN: {exc}", key="connection.url", source=f"connector '{self.connector}'") from None
        if self.config["connection.user"]:
            kwargs["user"] = self.config["connection.user"]
        if self.config["connection.password"]:
            kwargs["password"] = self.config["connection.password"]
        try:
            conn = psycopg.connect(url, **kwargs)
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(self.config['lock.timeout.ms'])}ms",))
            if not autocommit:
                conn.commit()
        except psycopg.OperationalError as exc:
            raise RetryableError(f"cannot connect to PostgreSQL: {exc}".strip(), component=COMPONENT) from exc
        pgc.register_dumpers(conn)
        return conn

    def _acon(self) -> psycopg.Connection[Any]:
        if self._ac is None or self._ac.closed or self._ac.broken:
            conn = self._connect(autocommit=True)
            if not self._bootstrapped:
                try:
                    self._check_server(conn)
                    pgs.bootstrap(conn)
                except BaseException as exc:
                    conn.close()
                    if isinstance(exc, psycopg.Error):
                        raise self._error(exc, None, "creating the bookkeeping tables") from exc
                    raise
                self._bootstrapped = True
            self._ac = conn
        return self._ac

    def _tcon(self) -> psycopg.Connection[Any]:
        if self._tx is None or self._tx.closed or self._tx.broken:
            self._tx = self._connect(autocommit=False)
            self._tx_state = "idle"
        return self._tx

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
        if row is None or int(row[0]) <= 0:
            info = conn.info
            raise FatalError(
                f"PostgreSQL at {info.host}:{info.port}/{info.dbname} has max_prepared_transactions = 0, so two-phase "
                "commit is disabled. Set max_prepared_transactions (at least the number of sink tasks writing to this "
                "server, e.g. 64) in postgresql.conf and restart PostgreSQL.",
                component=COMPONENT,
            )

    def _with_ac(self, fn: Callable[[psycopg.Connection[Any]], T], what: str = "statement") -> T:
        """Run an idempotent ``fn`` on the autocommit connection, reconnecting once if it broke.

        Everything run here may be repeated (the sink contract makes every operation idempotent),
        so a connection found dead - e.g. after a server restart - costs a retry, not a cycle.
        """
        for attempt in (1, 2):
            conn = self._acon()
            try:
                return fn(conn)
            except psycopg.Error as exc:
                if attempt == 1 and (conn.broken or conn.closed) and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                    self._ac = None
                    continue
                raise self._error(exc, conn, what) from exc
        raise AssertionError("unreachable")

    def _error(self, exc: psycopg.Error, conn: psycopg.Connection[Any] | None, what: str) -> EosinkError:
        """Retryable for lost connections, timeouts and serialization failures; fatal otherwise."""
        if conn is not None and (conn.broken or conn.closed):
            if conn is self._ac:
                self._ac = None
            elif conn is self._tx:
                self._tx = None
                self._tx_state = "idle"
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return RetryableError(f"{what} failed: {exc}".strip(), component=COMPONENT)
        return FatalError(f"{what} failed: {pgc.describe(exc)}", component=COMPONENT)

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
        super().begin_transaction(txn_id)

    # -- prepare ----------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        txn = manifest.txn_id
        xid = self._xid(txn)
        t0 = time.perf_counter()
        groups = self._group(records)
        for key, (recs, values) in groups.items():
            self._ensure_table(key, recs, values)
        t1 = time.perf_counter()
        state = self._with_ac(lambda conn: self._write_manifest(conn, manifest), "writing the manifest")
        self.timings = CycleTimings(manifest_ms=(time.perf_counter() - t1) * 1000, rows=len(records))
        if state is not None:
            log.info("txn %s is already %s: prepare is a no-op", txn, state)
            return
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                self._prepare_once(manifest, xid, groups)
                self.timings.write_ms += (t1 - t0) * 1000
                return
            except pgc.NeedsDDL as need:
                self._rollback_tx()
                key = (need.table.schema, need.table.name)
                self._evolve(key, *groups[key])
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                self._rollback_tx()
                if attempt == _MAX_ATTEMPTS:
                    raise self._abandon(manifest, FatalError(f"tables keep changing under the sink: {exc}", component=COMPONENT))
                self._tables.clear()  # cached metadata is stale: re-check every table
                for key, (recs, values) in groups.items():
                    self._ensure_table(key, recs, values)
            except pgc.RowRejected as rej:
                self._rollback_tx()
                try:
                    named = self._locate(rej, groups)
                except EosinkError as exc:  # a probe met a record the client-side check refuses first
                    named = exc
                raise self._abandon(manifest, named) from rej.error
            except (RecordError, FencedError, ConfigError) as exc:
                self._rollback_tx()
                raise self._abandon(manifest, exc)
            except psycopg.Error as exc:
                conn = self._tx
                err = self._error(exc, conn, f"prepare of {txn}")
                self._rollback_tx()
                raise err from exc
            except BaseException:
                self._rollback_tx()
                raise
        raise self._abandon(manifest, FatalError(f"prepare of {txn}: schema changes did not settle after {_MAX_ATTEMPTS} attempts", component=COMPONENT))

    def _prepare_once(self, manifest: TxnManifest, xid: Xid, groups: dict[tuple[str | None, str], tuple[list[SinkRecord], list[Any]]]) -> None:
        conn = self._tcon()
        t0 = time.perf_counter()
        self._tx_state = "active"
        try:
            conn.tpc_begin(xid)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if not (conn.broken or conn.closed):
                raise
            self._tx = None  # died while idle (e.g. a server restart): nothing was sent, start over
            conn = self._tcon()
            self._tx_state = "active"
            conn.tpc_begin(xid)
        with conn.cursor() as cur:
            self._fence(cur, manifest)
            for key, (recs, values) in groups.items():
                table = self._tables[key]
                if self.upsert:
                    pgc.write_upsert(cur, table, recs, values, self.kafka, self.config["auto.evolve"], self._pk(recs))
                else:
                    pgc.write_insert(cur, table, recs, values, self.kafka, self.config["auto.evolve"])
        t1 = time.perf_counter()
        self._tx_state = "prepare-sent"
        conn.tpc_prepare()
        self._tx_state = "idle"
        t2 = time.perf_counter()
        self.timings.write_ms = (t1 - t0) * 1000
        self.timings.prepare_ms = (t2 - t1) * 1000

    def _rollback_tx(self) -> None:
        """End a failed two-phase transaction on ``_tx``; drop the connection if in doubt.

        After ``PREPARE TRANSACTION`` was sent, psycopg's ``tpc_rollback()`` would issue
        ROLLBACK PREPARED for the GID - which, if the failure was "GID already in use", would
        roll back somebody else's prepared transaction. Closing the connection instead rolls back
        only what is not prepared.
        """
        conn, state = self._tx, self._tx_state
        self._tx_state = "idle"
        if conn is None or state == "idle":
            return
        if state == "active" and not (conn.broken or conn.closed):
            try:
                conn.tpc_rollback()
                return
            except psycopg.Error:
                pass
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - already broken
            pass
        self._tx = None

    def _abandon(self, manifest: TxnManifest, exc: EosinkError) -> EosinkError:
        """Best effort: the transaction was not prepared, so its manifest can go now."""
        try:
            self._with_ac(lambda c: c.execute("DELETE FROM eosink_txn_manifest WHERE txn_id = %s", (manifest.txn_id,)))
        except EosinkError:
            pass  # abort() or recover()'s garbage collection will do it
        return exc

    def _write_manifest(self, conn: psycopg.Connection[Any], manifest: TxnManifest) -> str | None:
        """Insert the manifest unless the txn is already prepared or committed (returned)."""
        row = conn.execute(
            """
            WITH st AS (
              SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = %(gid)s AND database = current_database()) AS prepared,
                     EXISTS (SELECT 1 FROM eosink_committed_txns WHERE txn_id = %(txn)s) AS committed
            ), ins AS (
              INSERT INTO eosink_txn_manifest (txn_id, connector, manifest, created_at)
              SELECT %(txn)s, %(connector)s, %(manifest)s::jsonb, now() FROM st WHERE NOT st.prepared AND NOT st.committed
              ON CONFLICT (txn_id) DO UPDATE SET manifest = EXCLUDED.manifest, created_at = EXCLUDED.created_at
            )
            SELECT prepared, committed FROM st
            """,
            {"gid": GID_PREFIX + manifest.txn_id, "txn": manifest.txn_id, "connector": self.connector, "manifest": manifest.to_json()},
        ).fetchone()
        assert row is not None
        return "committed" if row[1] else "prepared" if row[0] else None

    def _fence(self, cur: psycopg.Cursor[Any], manifest: TxnManifest) -> None:
        """Offsets + epoch per partition, proof of commit, manifest removal: one statement.

        Runs first in the transaction so a zombie fails before copying anything.
        """
        ranges = _merge_ranges(manifest.ranges)
        txn, conn_name = manifest.txn_id, self.connector
        tail = (
            " done AS (INSERT INTO eosink_committed_txns (txn_id, connector, committed_at) VALUES (%s, %s, now())),"
            " gone AS (DELETE FROM eosink_txn_manifest WHERE txn_id = %s)"
        )
        tail_params = [txn, conn_name, txn]
        if not ranges:
            cur.execute("WITH" + tail + " SELECT 1", tail_params)
            return
        rows = ", ".join(["(%s, %s, %s, %s, %s, %s, now())"] * len(ranges))
        params: list[Any] = [x for r in ranges for x in (conn_name, r.topic, r.partition, r.epoch, r.next_offset, txn)]
        cur.execute(
            "WITH fence AS (INSERT INTO eosink_offsets (connector, topic, partition, epoch, next_offset, txn_id, updated_at)"
            f" VALUES {rows} ON CONFLICT (connector, topic, partition) DO UPDATE SET epoch = EXCLUDED.epoch,"
            " next_offset = EXCLUDED.next_offset, txn_id = EXCLUDED.txn_id, updated_at = EXCLUDED.updated_at"
            " WHERE eosink_offsets.epoch <= EXCLUDED.epoch RETURNING topic, partition),"
            + tail + " SELECT topic, partition FROM fence",
            params + tail_params,
        )
        written = {(t, p) for t, p in cur.fetchall()}
        fenced = [r for r in ranges if (r.topic, r.partition) not in written]
        if fenced:
            cur.execute(
                "SELECT topic, partition, epoch FROM eosink_offsets WHERE connector = %s AND topic = ANY(%s)",
                (conn_name, list({r.topic for r in fenced})),
            )
            seen = {(t, p): e for t, p, e in cur.fetchall()}
            what = ", ".join(f"{r.topic}-{r.partition} (epoch {r.epoch} < {seen.get((r.topic, r.partition), '?')})" for r in fenced)
            raise FencedError(f"txn {txn}: a newer epoch already committed to {what}", component=COMPONENT)

    # -- tables -----------------------------------------------------------------------------
    def _table_key(self, topic: str) -> tuple[str | None, str]:
        key = self._table_names.get(topic)
        if key is None:
            name = self.config["table.name.format"].replace("${topic}", topic.replace(".", "_").replace("-", "_"))
            schema, dot, table = name.partition(".")
            key = (schema, table) if dot else (None, name)
            for part, what in ((key[0], "schema"), (key[1], "table")):
                why = pgs.check_identifier(part, what) if part is not None else None
                if why:
                    raise ConfigError(f"{why} (topic {topic!r})", key="table.name.format", source=f"connector '{self.connector}'")
            self._table_names[topic] = key
        return key

    def _group(self, records: list[SinkRecord]) -> dict[tuple[str | None, str], tuple[list[SinkRecord], list[Any]]]:
        """Records per target table, with the values the rows are built from."""
        if not records:
            return {}
        topics = set(map(attrgetter("topic"), records))
        by_table: dict[tuple[str | None, str], list[SinkRecord]] = {}
        if len(topics) == 1:
            by_table[self._table_key(records[0].topic)] = records
        else:
            for r in records:
                by_table.setdefault(self._table_key(r.topic), []).append(r)
        out = {}
        for key, recs in by_table.items():
            if self.pk_mode == "record_key":
                values = [self._with_key(r) for r in recs]
            else:
                values = list(map(attrgetter("value"), recs))
            out[key] = (recs, values)
        return out

    def _key_fields(self, rec: SinkRecord) -> dict[str, Any]:
        """pk.mode=record_key: the columns the Kafka key fills.

        A JSON object key gives its fields (all, or those named by pk.fields); any other key (a
        JSON scalar, or plain UTF-8 text) fills one column: pk.fields[0], else ``__key``.
        """
        key = rec.key
        if key is None:
            raise pgc.record_error(rec, "the Kafka key is null but pk.mode=record_key")
        try:
            obj: Any = json.loads(key)
        except ValueError:
            try:
                obj = key.decode("utf-8")
            except UnicodeDecodeError:
                raise pgc.record_error(rec, "the Kafka key is neither JSON nor UTF-8 text (pk.mode=record_key)") from None
        if type(obj) is dict:
            if not self.pk_fields:
                return obj
            for f in self.pk_fields:
                if f not in obj:
                    raise pgc.record_error(rec, f"primary key field {f!r} is missing from the Kafka key", f)
            return {f: obj[f] for f in self.pk_fields}
        if len(self.pk_fields) > 1:
            raise pgc.record_error(rec, f"the Kafka key is a JSON {type(obj).__name__}, not an object, but pk.fields names "
                                        f"{len(self.pk_fields)} fields; a non-object key fills one column")
        return {(self.pk_fields[0] if self.pk_fields else "__key"): obj}

    def _with_key(self, rec: SinkRecord) -> Any:
        """The record's value with the key's fields added (they win over same-named value fields)."""
        v = rec.value
        if type(v) is not dict:
            return v  # refused later, naming the record
        return {**v, **self._key_fields(rec)}

    def _pk(self, recs: Sequence[SinkRecord]) -> list[str]:
        """The primary key columns: pk.fields, or for record_key the fields of the first key."""
        if self.pk_fields or self.pk_mode != "record_key" or not recs:
            return self.pk_fields
        return list(self._key_fields(recs[0]))

    def _ensure_table(self, key: tuple[str | None, str], recs: list[SinkRecord], values: list[Any]) -> None:
        """Before the two-phase transaction: the table exists, has the Kafka columns and the
        first record's fields (the common case: later records have the same fields)."""
        table = self._tables.get(key)
        if table is None:
            table = self._with_ac(lambda c: pgs.load_table(c, key[0], key[1], with_stage=self.upsert), "reading the table")
            if table is None:
                table = self._create(key, recs, values)
            self._tables[key] = table
            self._check_table(table, recs)
        first = values[0] if values else None
        if isinstance(first, dict) and any(v is not None and k not in table.columns for k, v in first.items()):
            self._evolve(key, recs, values)

    def _check_table(self, table: pgs.Table, recs: Sequence[SinkRecord]) -> None:
        src = f"connector '{self.connector}'"
        missing = [c for c in pgs.KAFKA_COLUMN_NAMES if self.kafka and c not in table.columns]
        if missing:
            if not self.config["auto.evolve"]:
                raise ConfigError(f"table {table.display} lacks columns {', '.join(missing)}: add them, enable auto.evolve or "
                                  "set fields.kafka=false", key="fields.kafka", source=src)
            key = (table.schema, table.name)
            self._with_ac(lambda c: pgs.add_columns(c, table, [kc for kc in pgs.KAFKA_COLUMNS if kc[0] in missing]), "altering the table")
            self._tables[key] = table = self._reload(key)
        if self.upsert:
            pk = self._pk(recs)
            if frozenset(pk) not in table.unique_sets:
                raise ConfigError(f"table {table.display} has no PRIMARY KEY or UNIQUE index on exactly ({', '.join(pk)}); "
                                  "upsert needs one for ON CONFLICT", key="pk.fields", source=src)

    def _reload(self, key: tuple[str | None, str]) -> pgs.Table:
        table = self._with_ac(lambda c: pgs.load_table(c, key[0], key[1], with_stage=self.upsert), "reading the table")
        if table is None:
            raise RetryableError(f"table {'.'.join(p for p in key if p)} disappeared while the sink was altering it", component=COMPONENT)
        return table

    def _create(self, key: tuple[str | None, str], recs: list[SinkRecord], values: list[Any]) -> pgs.Table:
        display = ".".join(p for p in key if p)
        if not self.config["auto.create"]:
            raise ConfigError(f"table {display} does not exist and auto.create is false", key="auto.create",
                              source=f"connector '{self.connector}'")
        for r, v in zip(recs, values):
            if type(v) is not dict:
                raise pgc.non_object_error(r, v)
        pk = self._pk(recs) if self.pk_mode != "none" else []
        if pk:
            pgc.latest_per_key(recs, values, pk)  # names the first record lacking a key field
        inferred = pgs.infer_types(values, pgs.KAFKA_COLUMN_NAMES if self.kafka else ())
        self._check_names(inferred, recs, values)
        columns = list(inferred.items()) + (list(pgs.KAFKA_COLUMNS) if self.kafka else [])
        table = pgs.Table(key[0], key[1])
        self._with_ac(lambda c: pgs.create_table(c, table, columns, pk), "creating the table")
        log.info("created table %s with columns %s", display, ", ".join(f"{c} {t}" for c, t in columns))
        return self._reload(key)

    def _evolve(self, key: tuple[str | None, str], recs: list[SinkRecord], values: list[Any]) -> None:
        table = self._tables[key]
        new = pgs.infer_types(values, table.columns)
        if not new:
            return
        if not self.config["auto.evolve"]:
            for r, v in zip(recs, values):
                if type(v) is dict:
                    for k, x in v.items():
                        if x is not None and k in new:
                            raise pgc.record_error(r, f"{table.display} has no column {k!r} and auto.evolve is false", k)
        self._check_names(new, recs, values)
        self._with_ac(lambda c: pgs.add_columns(c, table, list(new.items())), "altering the table")
        log.info("added columns to %s: %s", table.display, ", ".join(f"{c} {t}" for c, t in new.items()))
        self._tables[key] = self._reload(key)

    @staticmethod
    def _check_names(columns: Mapping[str, str], recs: list[SinkRecord], values: list[Any]) -> None:
        for name in columns:
            why = pgs.check_identifier(name, "field")
            if why:
                rec = next(r for r, v in zip(recs, values) if isinstance(v, dict) and name in v)
                raise pgc.record_error(rec, why, name)

    def _locate(self, rej: pgc.RowRejected, groups: dict[tuple[str | None, str], tuple[list[SinkRecord], list[Any]]]) -> EosinkError:
        """Name the record PostgreSQL refused: the line its COPY error points at, else bisection.

        Each probe replays a subset in a transaction that is always rolled back (constraints
        checked immediately), so nothing of the batch becomes visible.
        """
        table = rej.table
        recs, values = groups[(table.schema, table.name)]
        columns = list(table.columns)

        def probe(idx: Sequence[int]) -> psycopg.Error | None:
            sub_r, sub_v = [recs[i] for i in idx], [values[i] for i in idx]

            def run(conn: psycopg.Connection[Any]) -> psycopg.Error | None:
                try:
                    with conn.transaction(force_rollback=True), conn.cursor() as cur:
                        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
                        if self.upsert:
                            pgc.write_upsert(cur, table, sub_r, sub_v, self.kafka, False, self._pk(recs))
                        else:
                            pgc.write_insert(cur, table, sub_r, sub_v, self.kafka, False)
                except pgc.RowRejected as r:
                    return r.error
                except (psycopg.DataError, psycopg.IntegrityError) as e:
                    return e
                return None

            return self._with_ac(run, "locating the refused record")

        def named(rec: SinkRecord, err: psycopg.Error) -> RecordError:
            return pgc.record_error(rec, f"{table.display} refused the row: {pgc.describe(err)}", pgc.error_column(err, columns))

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
                break  # each half passes alone: the rows conflict only together
        if err is not None and len(cands) == 1:
            return named(recs[cands[0]], err)
        if rej.suspect is not None:
            return named(rej.suspect, rej.error)
        return FatalError(f"{table.display} refused the batch: {pgc.describe(rej.error)}; it could not be narrowed to one record",
                          component=COMPONENT)

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
                if conn.execute("SELECT 1 FROM eosink_committed_txns WHERE txn_id = %s", (txn_id,)).fetchone() is None:
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
        if self._tx_state != "idle":
            self._rollback_tx()
        xid = self._xid(txn_id)

        def run(conn: psycopg.Connection[Any]) -> None:
            try:
                conn.tpc_rollback(xid)
            except psycopg.errors.UndefinedObject:
                pass
            conn.execute("DELETE FROM eosink_txn_manifest WHERE txn_id = %s", (txn_id,))

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
            rows = conn.execute(
                "SELECT p.gid, m.connector, m.manifest::text FROM pg_prepared_xacts p"
                " LEFT JOIN eosink_txn_manifest m ON m.txn_id = substr(p.gid, %s)"
                " WHERE p.database = current_database() AND starts_with(p.gid, %s) ORDER BY p.prepared, p.gid",
                (len(GID_PREFIX) + 1, GID_PREFIX),
            ).fetchall()
            conn.execute(
                "DELETE FROM eosink_txn_manifest m WHERE connector = %s AND created_at < now() - %s::interval"
                " AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.gid = %s || m.txn_id)",
                (self.connector, ORPHAN_MANIFEST_AGE, GID_PREFIX),
            )
            conn.execute(
                "DELETE FROM eosink_committed_txns c WHERE connector = %s AND committed_at < now() - %s::interval"
                " AND NOT EXISTS (SELECT 1 FROM eosink_offsets o WHERE o.connector = c.connector AND o.txn_id = c.txn_id)",
                (self.connector, COMMITTED_TXN_RETENTION),
            )
            return rows

        out: list[TxnManifest] = []
        prefix = f"{GID_PREFIX}{self.connector}."
        for gid, connector, text in self._with_ac(run, "recovery"):
            txn_id = gid[len(GID_PREFIX):]
            if connector is not None:
                if connector == self.connector:
                    out.append(TxnManifest.from_json(text) if text else TxnManifest(txn_id, connector))
            elif gid.startswith(prefix):
                log.warning("prepared transaction %s has no manifest: cannot tell its partitions; left for an operator", gid)
                out.append(TxnManifest(txn_id, self.connector, ()))
        return out

    def read_offsets(self, connector: str | None = None) -> dict[TopicPartition, tuple[int, int]]:
        """Committed ``(epoch, next_offset)`` per partition of ``connector`` (default: this one)."""
        rows = self._with_ac(
            lambda c: c.execute(
                "SELECT topic, partition, epoch, next_offset FROM eosink_offsets WHERE connector = %s",
                (connector or self.connector,),
            ).fetchall(),
            "reading offsets",
        )
        return {TopicPartition(t, int(p)): (int(e), int(n)) for t, p, e, n in rows}


def _merge_ranges(ranges: Sequence[PartitionRange]) -> list[PartitionRange]:
    """One range per partition (the upsert may touch each offsets row once per statement)."""
    merged: dict[tuple[str, int], PartitionRange] = {}
    for r in ranges:
        m = merged.get((r.topic, r.partition))
        merged[(r.topic, r.partition)] = r if m is None else PartitionRange(
            r.topic, r.partition, min(m.first_offset, r.first_offset), max(m.last_offset, r.last_offset), max(m.epoch, r.epoch)
        )
    return list(merged.values())
