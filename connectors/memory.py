"""In-memory sink: the reference the model tests run against.

Keeps prepared batches and the committed history in process memory, shared per ``store``
name so that a "restarted" sink instance (a new object over the same store) sees what its
predecessor prepared - exactly what a crash looks like to recovery.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eosink.connectors.api.config import ConfigDef, Type
from eosink.connectors.api.errors import FencedError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import BatchingSink


@dataclass
class MemoryStore:
    """The "external system" of the memory sink."""

    prepared: dict[str, tuple[TxnManifest, list[SinkRecord]]] = field(default_factory=dict)
    committed: list[SinkRecord] = field(default_factory=list)
    committed_txns: set[str] = field(default_factory=set)
    epochs: dict[TopicPartition, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def store(name: str) -> MemoryStore:
    with _STORES_LOCK:
        return _STORES.setdefault(name, MemoryStore())


def drop_store(name: str) -> None:
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemorySink(BatchingSink):
    CONFIG = ConfigDef().define("memory.store", Type.STRING, "default", "Name of the shared in-process store.")

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        self.store = store(self.config["memory.store"])

    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        s = self.store
        with s.lock:
            if manifest.txn_id in s.prepared or manifest.txn_id in s.committed_txns:
                return
            for r in manifest.ranges:
                seen = s.epochs.get(r.tp, -1)
                if r.epoch < seen:
                    raise FencedError(f"epoch {r.epoch} for {r.tp} is older than {seen}", component="memory")
            s.prepared[manifest.txn_id] = (manifest, list(records))

    def commit(self, txn_id: str) -> None:
        s = self.store
        with s.lock:
            entry = s.prepared.pop(txn_id, None)
            if entry is None:
                return  # already committed, or unknown: idempotent
            manifest, records = entry
            for r in manifest.ranges:
                s.epochs[r.tp] = max(s.epochs.get(r.tp, -1), r.epoch)
            s.committed.extend(records)
            s.committed_txns.add(txn_id)

    def abort(self, txn_id: str) -> None:
        with self.store.lock:
            self.store.prepared.pop(txn_id, None)
        if self._txn_id == txn_id:
            self._batch = []

    def recover(self) -> list[TxnManifest]:
        with self.store.lock:
            return [m for m, _ in self.store.prepared.values() if m.connector == self.connector]
