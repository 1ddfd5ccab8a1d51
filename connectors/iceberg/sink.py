"""Apache Iceberg sink (pyiceberg): Parquet files prepared unreferenced, appended in one snapshot.

One cycle, per :class:`~eosink.connectors.api.sink.TwoPhaseCommitSink`::

    pre_commit(manifest)
      load (or auto-create / evolve) each target table; refuse an older epoch (the resource fence)
      check every record against the schema                        -- RecordError, nothing written
      write Parquet under <table data>/eosink-<txn key>/            -- no snapshot references them
      write <pending>/<connector>/<txn>.json (manifest + file list) -- now "prepared"; recover() lists it
    commit(txn)
      per table: txn id already in a snapshot summary?  -> ok (a replay)
                 newer epoch in the table's fence state? -> FencedError
                 one transaction: fast_append(files, snapshot_properties=txn/offsets/epochs)
                                  + set_properties(fence state per partition)
      delete the marker
    abort(txn)   delete the txn's data directory, then the marker (never files a snapshot holds)

**Why a data directory per txn.** ``abort`` must find every file of a prepare that failed half-way
(before its marker listed them); one prefix per txn is one listing, not a scan of the table.

**Why no pyiceberg commit retries.** pyiceberg retries a conflicting commit by re-applying the append
on the new head (``commit.retry.num-retries``, default 4): a zombie whose epoch was overtaken while
it waited would get through. Auto-created tables get ``commit.retry.num-retries=0``, and every
commit of this sink runs with 0 retries whatever the table says; instead :meth:`commit` retries
itself (``iceberg.commit.attempts``) after re-reading the table, so the fence and the "already
committed" check run again on what is really there.

**The resource fence.** Table property ``eosink.state.<connector>.<topic>-<partition>`` =
``{"epoch", "next_offset", "txn"}``, written in the same metadata commit as the snapshot. A prepare
or commit carrying an older epoch raises :class:`~eosink.connectors.api.errors.FencedError`. The property also
answers "already committed?" after the snapshot that carried the txn id has been expired.

**Several tables per txn** (``iceberg.table`` with ``${topic}``): Iceberg has no multi-table commit
in SQL catalogs, so each table commits on its own. A failed commit is retried (idempotently per
table) until every table has it: every record lands exactly once, but for a moment a reader can see
one topic's rows of a txn before another's. One table per connector keeps txns atomic.

**Rows**: every value field is a column (see :mod:`eosink.connectors.iceberg.arrow` for the types of JSON
values, :mod:`eosink.connectors.iceberg.schema_types` for those typed from a registered schema), plus
``__topic``, ``__partition``, ``__offset`` (``fields.kafka``), so duplicates are findable with
``GROUP BY __topic, __partition, __offset HAVING count(*) > 1``.

The sink's keys, and the catalog and table properties made from them, are in :mod:`.config`; the
loading, conversion and fence check of each target table at prepare, in :mod:`.plan`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.io.pyarrow import _dataframe_to_data_files, parquet_files_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from eosink.connectors.api import formats
from eosink.connectors.api.errors import ConfigError, FatalError, RetryableError
from eosink.connectors.api.records import SinkRecord, TxnManifest
from eosink.connectors.api.sink import BatchingSink
from eosink.connectors.iceberg import config as icfg
from eosink.connectors.iceberg import txn as itx
from eosink.connectors.iceberg.plan import plan_tables
from eosink.connectors.iceberg.store import Markers, Storage
from eosink.connectors.iceberg.tables import Tables
from eosink.connectors.iceberg.tlsio import S3_CA_BUNDLE, untrusted_endpoint
from eosink.connectors.iceberg.txn import (
    SUMMARY_CONNECTOR,
    SUMMARY_EPOCHS,
    SUMMARY_OFFSETS,
    SUMMARY_TXN,
    Prepared,
    TableTxn,
)

if TYPE_CHECKING:
    from eosink.connectors.iceberg.audit import IcebergReader

__all__ = ["IcebergSink", "CycleTimings", "SUMMARY_TXN", "SUMMARY_CONNECTOR", "SUMMARY_EPOCHS", "SUMMARY_OFFSETS"]
log = logging.getLogger(__name__)
COMPONENT = itx.COMPONENT
_REMEMBER_COMMITTED = 1024


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds of the last prepare/commit (for metrics and the benchmark)."""

    load_ms: float = 0.0
    convert_ms: float = 0.0
    write_ms: float = 0.0
    marker_ms: float = 0.0
    commit_ms: float = 0.0  # all of commit()
    append_ms: float = 0.0  # of which Iceberg's own snapshot commit (what a plain append pays too)
    rows: int = 0
    files: int = 0


class IcebergSink(BatchingSink):
    """Exactly-once delivery into Apache Iceberg tables through a SQL or REST catalog."""

    CAUGHT_UP_COMMIT_MS = None  # a data file and a snapshot per transaction: cycles run their full commit.interval.ms
    reads_values = False  # the JSON bytes are parsed into Arrow (jsonarrow); a value is decoded only where they cannot be

    CONFIG = icfg.CONFIG  # see eosink.connectors.iceberg.config

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        c = self.config
        settings = icfg.settings(connector, c)
        self.kafka = bool(c["fields.kafka"])
        self.template: str = c["iceberg.table"]
        self.catalog_props = settings.catalog_props
        self.table_props = settings.table_props
        self.attempts: int = c["iceberg.commit.attempts"]
        self.storage = Storage.for_properties(settings.io_props, fsync=bool(c["iceberg.fsync"]))
        self.markers = Markers(self.storage, settings.pending, connector)
        #: Tells this sink's markers from a sibling's in a fanout connector writing to the same place.
        self._fingerprint = hashlib.sha1(
            json.dumps([c["iceberg.catalog.uri"], c["iceberg.catalog.name"], self.template]).encode()
        ).hexdigest()[:12]
        self.tables = Tables(c["iceberg.catalog.name"], self.catalog_props, auto_create=bool(c["auto.create"]),
                             auto_evolve=bool(c["auto.evolve"]), kafka=self.kafka, partition_fields=c["iceberg.partition.fields"],
                             table_props=self.table_props, attempts=self.attempts)
        self._prepared: dict[str, Prepared] = {}
        self._staging: dict[str, list[TableTxn]] = {}  # files being written: what abort must clean
        self._committed: OrderedDict[str, None] = OrderedDict()
        self.timings = CycleTimings()
        icfg.warn_small_files(connector, config)

    # -- catalog and tables -------------------------------------------------------------------
    def open(self) -> None:
        """Check the S3 endpoint's certificate, connect to the catalog (a SQL catalog creates its two tables if missing)."""
        endpoint, ca = self.config.get("s3.endpoint"), self.config.get(S3_CA_BUNDLE)
        if ca and not os.path.isfile(ca):
            raise ConfigError(f"{ca} is not a readable file (the CA certificates, PEM, that sign the endpoint's certificate)",
                              key=S3_CA_BUNDLE, source=f"connector '{self.connector}'")
        why = untrusted_endpoint(endpoint, ca) if endpoint else None
        if why is not None:
            raise FatalError(f"connector '{self.connector}': TLS: the certificate of {endpoint} (s3.endpoint) is not trusted "
                             f"({why}): set {S3_CA_BUNDLE} to the CA file that signed it", component=COMPONENT)
        self.tables.catalog()

    def close(self) -> None:
        """Forget in-memory state; prepared txns stay on storage for :meth:`recover`."""
        self.tables.close()
        self._prepared.clear()

    def audit_reader(self, name: str) -> IcebergReader:
        """The coordinate columns read back (see :mod:`eosink.connectors.iceberg.audit`)."""
        from eosink.connectors.iceberg.audit import IcebergReader

        return IcebergReader(name, self)

    def table_name(self, topic: str) -> str:
        """The table identifier for ``topic`` (``${topic}`` with '.' and '-' as '_')."""
        return self.template.replace("${topic}", topic.replace(".", "_").replace("-", "_"))

    # -- prepare --------------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        txn = manifest.txn_id
        if txn in self._prepared or txn in self._committed:
            return  # a replay: already durable (or visible)
        try:
            self._prepare(manifest, records)
        except Exception as exc:  # noqa: BLE001 - classified; abort() cleans what was written
            raise itx.classify(exc, f"prepare of {txn}") from exc

    def _prepare(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        txn = manifest.txn_id
        t0 = time.perf_counter()
        plan = plan_tables(self.connector, manifest, records, tables=self.tables, table_name=self.table_name, kafka=self.kafka)
        # Every record fits: from here on files are written, and abort() knows where.
        t3 = time.perf_counter()
        existing = self.markers.get(txn)
        if existing is not None and existing.get("sink") != self._fingerprint:
            # A sibling sink of a fanout connector writes its markers to the same place: recovery
            # would mix the two up (and lose one's files). Refuse before writing anything.
            raise FatalError(f"another Iceberg sink of connector {self.connector} keeps its markers in {self.markers.dir}: give each "
                             "sink of a fanout its own iceberg.pending.location", component=COMPONENT)
        self._staging[txn] = [tt for tt, _ in plan.tables]
        for tt, arrow in plan.tables:
            tt.data_files = self._write_files(tt, arrow, txn)
            tt.spec_id = tt.loaded.metadata.default_spec_id if tt.loaded is not None else -1
            tt.files = [df.file_path for df in tt.data_files]
            self.storage.sync_files(tt.files)
        t4 = time.perf_counter()
        doc = {"v": formats.ICEBERG_MARKER, "txn": txn, "connector": self.connector, "sink": self._fingerprint,
               "manifest": json.loads(manifest.to_json()),
               "tables": [tt.doc() for tt, _ in plan.tables], "prepared_ms": int(time.time() * 1000)}
        self.markers.put(txn, doc)
        self._prepared[txn] = Prepared(manifest, [tt for tt, _ in plan.tables])
        self._staging.pop(txn, None)
        t5 = time.perf_counter()
        self.timings = CycleTimings(load_ms=plan.load_ms, convert_ms=plan.convert_ms, write_ms=(t4 - t3) * 1000, marker_ms=(t5 - t4) * 1000,
                                    rows=len(records), files=sum(len(tt.files) for tt, _ in plan.tables))
        log.debug("prepared %s: %d rows in %d files (%.1f ms)", txn, len(records), self.timings.files, (t5 - t0) * 1000)

    def _write_files(self, tt: TableTxn, arrow: Any, txn: str) -> list[DataFile]:
        """Parquet files under the txn's own directory (``write.data.path`` overridden for this write only)."""
        table = tt.loaded
        assert table is not None
        md = table.metadata
        md = md.model_copy(update={"properties": {**md.properties, TableProperties.WRITE_DATA_PATH: tt.dir}})
        write_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"eosink:{self.connector}:{txn}:{tt.table}")
        return list(_dataframe_to_data_files(md, arrow, table.io, write_uuid=write_uuid))

    # -- commit ---------------------------------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        """Append every table's prepared files in one snapshot each; already committed is ok."""
        t0 = time.perf_counter()
        self.timings.append_ms = 0.0
        try:
            prepared = self._prepared.get(txn_id)
            if prepared is None:
                if txn_id in self._committed:
                    return
                doc = self.markers.get(txn_id)
                if doc is None:
                    self._commit_without_marker(txn_id)
                    return
                manifest = TxnManifest.from_json(json.dumps(doc["manifest"]), f"the marker of txn {txn_id}")
                prepared = Prepared(manifest, [TableTxn.from_doc(t) for t in doc["tables"]])
            for tt in prepared.tables:
                self._commit_table(prepared.manifest, tt)
            self.markers.delete(txn_id)
        except Exception as exc:  # noqa: BLE001 - classified; commit is idempotent, the engine retries it
            raise itx.classify(exc, f"commit of {txn_id}") from exc
        self._prepared.pop(txn_id, None)
        self._remember(txn_id)
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000

    def _remember(self, txn_id: str) -> None:
        self._committed[txn_id] = None
        while len(self._committed) > _REMEMBER_COMMITTED:
            self._committed.popitem(last=False)

    def _commit_table(self, manifest: TxnManifest, tt: TableTxn) -> None:
        txn = manifest.txn_id
        ranges = tt.ranges(manifest)
        table, tt.loaded = tt.loaded, None
        for attempt in range(1, self.attempts + 1):
            if table is None:
                table = self.tables.load(tt.table)
            if itx.is_committed(self.connector, table, txn):
                return
            itx.check_fence(self.connector, table, ranges, txn)
            if tt.data_files is None or tt.spec_id != table.metadata.default_spec_id:
                tt.data_files, tt.spec_id = self._data_files(table, tt, txn), table.metadata.default_spec_id
            t0 = time.perf_counter()
            try:
                self.tables.remember(tt.table, itx.append(self.connector, table, txn, ranges, tt.data_files))
                self.timings.append_ms += (time.perf_counter() - t0) * 1000
                return
            except CommitFailedException as exc:
                # Another writer committed first. Never re-apply on top blindly (that is what
                # pyiceberg's retries would do): re-read, then check the fence and the txn id again.
                log.info("commit of %s to %s conflicted (attempt %d/%d): %s", txn, tt.table, attempt, self.attempts, exc)
                table = None
                if attempt == self.attempts:
                    raise RetryableError(f"commit of {txn} to {tt.table}: another writer committed first {self.attempts} "
                                         f"time(s) in a row ({exc})", component=COMPONENT) from exc

    def _data_files(self, table: Table, tt: TableTxn, txn: str) -> list[DataFile]:
        """DataFiles rebuilt from the Parquet footers (after a restart only the paths are known)."""
        try:
            return list(parquet_files_to_data_files(table.io, table.metadata, iter(tt.files)))
        except FileNotFoundError as exc:
            raise FatalError(f"prepared data file of txn {txn} is gone ({exc}); the txn cannot be committed: its records are "
                             f"not in {tt.table}. Was remove_orphan_files run with a threshold shorter than the txn's age? "
                             "Operator must check", component=COMPONENT) from exc

    def _commit_without_marker(self, txn_id: str) -> None:
        """No marker: committed earlier (the marker goes last) - or aborted/never prepared, which is fatal."""
        candidates = set(self.tables.known)
        if "${topic}" not in self.template:
            candidates.add(self.template)
        for ident in sorted(candidates):
            try:
                if itx.is_committed(self.connector, self.tables.load(ident), txn_id):
                    self._remember(txn_id)
                    return
            except NoSuchTableError:
                continue
        raise FatalError(f"decided txn {txn_id} has no prepared marker ({self.markers.uri(txn_id)}) and no snapshot of "
                         f"{', '.join(sorted(candidates)) or 'the tables this sink knows'} carries it: it was aborted or never "
                         "prepared, so its records are not in Iceberg; operator must check", component=COMPONENT)

    # -- abort / recover ------------------------------------------------------------------------
    def abort(self, txn_id: str) -> None:
        """Delete the txn's data directories, then its marker. Unknown or already aborted is ok.

        Files of a table whose snapshots already carry the txn are never deleted (an abort replayed
        after a commit must not break the table).
        """
        if self._txn_id == txn_id:
            self._batch = []
        try:
            prepared = self._prepared.pop(txn_id, None)
            tables = prepared.tables if prepared else self._staging.get(txn_id)
            if tables is None:
                doc = self.markers.get(txn_id)
                tables = [TableTxn.from_doc(t) for t in doc["tables"]] if doc else []
            for tt in tables:
                try:
                    table: Table | None = self.tables.load(tt.table)
                except (NoSuchTableError, NoSuchNamespaceError):
                    table = None
                if table is not None and itx.is_committed(self.connector, table, txn_id):
                    log.error("abort of %s: it is already committed to %s; its files stay", txn_id, tt.table)
                    continue
                storage = Storage(table.io, self.storage.fsync) if table is not None else self.storage
                n = storage.delete_tree(tt.dir)
                log.info("aborted %s: deleted %d file(s) under %s", txn_id, n, tt.dir)
            self.markers.delete(txn_id)
            self._staging.pop(txn_id, None)
        except Exception as exc:  # noqa: BLE001 - classified; abort is retried by the engine
            raise itx.classify(exc, f"abort of {txn_id}") from exc

    def recover(self) -> list[TxnManifest]:
        """The manifests of every marker of this connector (prepared, not yet committed or aborted).

        A marker that cannot be read is returned without ranges: the engine cannot tie it to a
        decision and reports it for an operator, as it must.
        """
        out: list[TxnManifest] = []
        try:
            listed = self.markers.list()
        except Exception as exc:  # noqa: BLE001 - classified
            raise itx.classify(exc, "recovery (listing markers)") from exc
        for txn_id, data in listed:
            if data is None:
                continue  # committed or aborted while we listed
            try:
                doc = self.markers.parse(txn_id, data)
                out.append(TxnManifest.from_json(json.dumps(doc["manifest"]), f"the marker of txn {txn_id}"))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("marker of txn %s is unreadable (%s): left for an operator", txn_id, exc)
                out.append(TxnManifest(txn_id, self.connector, ()))
        return out
