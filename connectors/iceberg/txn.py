"""Transaction primitives of the Iceberg sink (:mod:`eosink.connectors.iceberg.sink`): the resource fence, the
proof of commit, the one-snapshot append, and how failures are classified.

What a committed txn leaves in a table, all in **one** metadata commit:

* a snapshot whose summary holds ``eosink.txn``, ``eosink.connector``, ``eosink.epochs``
  (``{"topic-p": epoch}``) and ``eosink.offsets`` (``{"topic-p": [first, last]}``) - readable by
  anyone (``SELECT summary FROM t.snapshots`` in Spark), and the first proof that a txn is in;
* table properties ``eosink.state.<connector>.<topic>-<p>`` = ``{"epoch", "next_offset", "txn"}``:
  the fence (the highest epoch committed per partition) and a proof of commit of the partition's
  latest txn that survives snapshot expiry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
    TooManyRequestsError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties

from eosink.connectors.api.errors import EosinkError, FatalError, FencedError, RetryableError
from eosink.connectors.api.records import PartitionRange, TxnManifest

COMPONENT = "iceberg"
SUMMARY_TXN, SUMMARY_CONNECTOR = "eosink.txn", "eosink.connector"
SUMMARY_EPOCHS, SUMMARY_OFFSETS = "eosink.epochs", "eosink.offsets"
STATE_PREFIX = "eosink.state."
NO_RETRIES = {TableProperties.COMMIT_NUM_RETRIES: "0"}
_COMPACT = (",", ":")


@dataclass
class TableTxn:
    """What one txn prepared in one table. ``data_files``, ``spec_id`` and ``loaded`` are in-memory
    shortcuts of the instance that prepared it; after a restart only the marker's fields exist."""

    table: str
    dir: str
    partitions: list[tuple[str, int]]
    files: list[str] = field(default_factory=list)
    data_files: list[DataFile] | None = None
    spec_id: int = -1  # the partition spec data_files were built for
    loaded: Table | None = None  # the table as read at prepare (a stale one only costs a retry)

    def doc(self) -> dict[str, Any]:
        return {"table": self.table, "dir": self.dir, "partitions": self.partitions, "files": self.files}

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> TableTxn:
        return cls(d["table"], d["dir"], [(t, int(p)) for t, p in d["partitions"]], list(d["files"]))

    def ranges(self, manifest: TxnManifest) -> list[PartitionRange]:
        parts = set(self.partitions)
        return [r for r in manifest.ranges if (r.topic, r.partition) in parts]


@dataclass
class Prepared:
    manifest: TxnManifest
    tables: list[TableTxn]


def classify(exc: BaseException, what: str) -> EosinkError:
    """Retryable for commit conflicts, lost connections and unavailable services; fatal otherwise."""
    if isinstance(exc, EosinkError):
        return exc
    transient: tuple[type[BaseException], ...] = (CommitFailedException, CommitStateUnknownException, ServiceUnavailableError,
                                                  ServerError, TooManyRequestsError, OSError, TimeoutError)
    try:
        from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
        from sqlalchemy.exc import TimeoutError as PoolTimeout

        transient += (DisconnectionError, InterfaceError, OperationalError, PoolTimeout)
    except ImportError:  # pragma: no cover - a REST-only install without the sql extra
        pass
    cls = RetryableError if isinstance(exc, transient) else FatalError
    return cls(f"{what} failed: {type(exc).__name__}: {exc}", component=COMPONENT)


def no_retry(table: Table) -> Table:
    """The same table whose *local* metadata says 0 commit retries (the catalog's copy is untouched).

    pyiceberg reads the retry count from the table object it commits through, and on a conflict
    re-applies the append on the new head - without our fence. Overriding it locally keeps this
    sink safe on tables created by others, without changing how their other writers retry.
    """
    props = table.metadata.properties
    if props.get(TableProperties.COMMIT_NUM_RETRIES) == "0":
        return table
    md = table.metadata.model_copy(update={"properties": {**props, **NO_RETRIES}})
    return Table(table.name(), md, table.metadata_location, table.io, table.catalog, table.config)


def state_key(connector: str, topic: str, partition: int) -> str:
    return f"{STATE_PREFIX}{connector}.{topic}-{partition}"


def check_fence(connector: str, table: Table, ranges: Sequence[PartitionRange], txn_id: str) -> None:
    """FencedError if a newer epoch than the txn's already committed to one of its partitions."""
    props = table.metadata.properties
    for r in ranges:
        raw = props.get(state_key(connector, r.topic, r.partition))
        seen = int(json.loads(raw)["epoch"]) if raw is not None else None
        if seen is not None and seen > r.epoch:
            raise FencedError(f"txn {txn_id}: epoch {r.epoch} for {r.tp} is older than epoch {seen} already committed to "
                              f"{'.'.join(table.name())}", component=COMPONENT)


def is_committed(connector: str, table: Table, txn_id: str) -> bool:
    """The txn id in a snapshot summary, or (after snapshot expiry) in a partition's fence state."""
    for snap in table.metadata.snapshots:
        extra = snap.summary.additional_properties if snap.summary is not None else {}
        if extra.get(SUMMARY_TXN) == txn_id and extra.get(SUMMARY_CONNECTOR) == connector:
            return True
    prefix = f"{STATE_PREFIX}{connector}."
    return any(k.startswith(prefix) and json.loads(v).get("txn") == txn_id for k, v in table.metadata.properties.items())


def append(connector: str, table: Table, txn_id: str, ranges: Sequence[PartitionRange], files: Sequence[DataFile]) -> Table:
    """One metadata commit: the files as a fast-append snapshot + the fence state, with 0 retries.

    Raises pyiceberg's CommitFailedException when another writer committed since ``table`` was
    read; the caller re-reads and decides again (fence, proof of commit) before another try.
    Returns the table as committed.
    """
    tps = {f"{r.topic}-{r.partition}": r for r in ranges}
    summary = {
        SUMMARY_TXN: txn_id,
        SUMMARY_CONNECTOR: connector,
        SUMMARY_EPOCHS: json.dumps({k: r.epoch for k, r in tps.items()}, separators=_COMPACT),
        SUMMARY_OFFSETS: json.dumps({k: [r.first_offset, r.last_offset] for k, r in tps.items()}, separators=_COMPACT),
    }
    state: dict[str, str] = {}
    for r in ranges:
        key = state_key(connector, r.topic, r.partition)
        raw = table.metadata.properties.get(key)
        seen = int(json.loads(raw)["epoch"]) if raw else -1
        state[key] = json.dumps({"epoch": max(seen, r.epoch), "next_offset": r.next_offset, "txn": txn_id}, separators=_COMPACT)
    tx = no_retry(table).transaction()
    tx.set_properties(state)
    with tx.update_snapshot(snapshot_properties=summary).fast_append() as fast:
        for df in files:
            fast.append_data_file(df)
    return tx.commit_transaction()
