"""Filesystem sink: JSON Lines files, prepared then atomically renamed into place.

Layout under ``file.path``/<connector>/::

    prepared/<txn>.jsonl           the batch, fsynced, invisible to readers
    prepared/<txn>.manifest.json   what recovery needs (partitions, offsets, epochs)
    committed/<txn>.jsonl          visible: readers read only committed/*.jsonl
    epochs/<topic>-<partition>     highest epoch committed per partition (the resource fence)

``commit`` is one ``rename(2)`` of the data file (atomic on POSIX) followed by an fsync of the
directory, so a crash leaves a batch either prepared or committed, never both and never half.
Each line: ``{"topic","partition","offset","key","id","value"}`` with ``value`` the record's
JSON as it was on the topic (not re-encoded; on one line even when the topic's JSON was
pretty-printed: see :mod:`eosink.connectors.common.jsonlines`), so ``jq`` reads it and the sink
stays fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty, one_of
from eosink.connectors.api.errors import FencedError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import BatchingSink
from eosink.connectors.common import jsonlines
from eosink.connectors.common.durable import fsync_dir as _fsync_dir
from eosink.connectors.filesystem_audit import FilesystemReader

_DATA = ".jsonl"
_MANIFEST = ".manifest.json"
#: Records encoded and written at a time (see _write_durably).
_SLICE = 20_000


def _write_durably(path: Path, chunks: Iterable[bytes], *, fsync: bool = True) -> None:
    """Write ``chunks`` to a temporary file, fsync it (with ``fsync``) and rename it into place.

    Each chunk is handed to the kernel's writeback as soon as it is written (``POSIX_FADV_DONTNEED``
    starts writeback of dirty pages): for a batch encoded slice by slice (a generator), the disk
    works while the next slice is encoded and the final fsync waits only for the tail."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        fd, written = f.fileno(), 0
        for data in chunks:
            f.write(data)
            if fsync:
                f.flush()
                os.posix_fadvise(fd, written, len(data), os.POSIX_FADV_DONTNEED)
            written += len(data)
        f.flush()
        if fsync:
            os.fsync(fd)
    os.replace(tmp, path)


def _safe_name(txn_id: str) -> str:
    return txn_id.replace("/", "_")


class FilesystemSink(BatchingSink):
    CAUGHT_UP_COMMIT_MS = None  # a file per transaction: cycles run their full commit.interval.ms
    reads_values = False  # JSON Lines and raw files copy each value's bytes (see TwoPhaseCommitSink.reads_values)

    CONFIG = (
        ConfigDef()
        .define("file.path", Type.STRING, doc="Directory the connector writes under.", importance=Importance.HIGH, validator=non_empty)
        .define("file.fsync", Type.BOOLEAN, True, "fsync files and directories (turn off only for throwaway data).")
        .define("file.format", Type.STRING, "jsonl", "jsonl: one JSON object per record with topic, partition, "
                "offset, key, id and value; raw: each record's value bytes as they were on the topic, one per "
                "line (what Kafka Connect's FileStreamSink writes; values must not contain newlines).",
                validator=one_of("jsonl", "raw"))
    )

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        self.root = Path(self.config["file.path"]) / connector
        self.prepared_dir = self.root / "prepared"
        self.committed_dir = self.root / "committed"
        self.epochs_dir = self.root / "epochs"
        self.fsync = bool(self.config["file.fsync"])
        self._encode = self._encode_raw if self.config["file.format"] == "raw" else self._encode_jsonl

    def audit_reader(self, name: str) -> FilesystemReader:
        """The committed files read back, line by line (see :mod:`eosink.connectors.filesystem_audit`)."""
        return FilesystemReader(name, self.root, self.config["file.format"])

    def open(self) -> None:
        try:
            for d in (self.prepared_dir, self.committed_dir, self.epochs_dir):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RetryableError(f"cannot create {self.root}: {exc}", component="filesystem") from exc

    # -- prepare -------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        name = _safe_name(manifest.txn_id)
        data_path = self.prepared_dir / (name + _DATA)
        if (self.committed_dir / (name + _DATA)).exists() or data_path.exists() and (self.prepared_dir / (name + _MANIFEST)).exists():
            return  # already prepared or committed: idempotent
        self._check_epochs(manifest)
        try:
            _write_durably(data_path, (self._encode(records[i:i + _SLICE]) for i in range(0, len(records), _SLICE)),
                           fsync=self.fsync)
            self._write(self.prepared_dir / (name + _MANIFEST), manifest.to_json().encode())
            if self.fsync:
                _fsync_dir(self.prepared_dir)
        except OSError as exc:
            raise RetryableError(f"prepare {manifest.txn_id} failed: {exc}", component="filesystem") from exc

    def _write(self, path: Path, data: bytes) -> None:
        if self.fsync:
            _write_durably(path, (data,))
        else:
            path.write_bytes(data)

    @staticmethod
    def _encode_raw(records: list[SinkRecord]) -> bytes:
        """The value bytes of each record, newline-terminated (a null value is an empty line)."""
        parts = [r.raw_value or b"" for r in records]
        parts.append(b"")
        return b"\n".join(parts)

    @staticmethod
    def _encode_jsonl(records: list[SinkRecord]) -> bytes:
        return jsonlines.envelopes(records, "filesystem")

    def _epoch_path(self, tp: TopicPartition) -> Path:
        return self.epochs_dir / f"{tp.topic}-{tp.partition}"

    def _check_epochs(self, manifest: TxnManifest) -> None:
        for r in manifest.ranges:
            try:
                seen = int(self._epoch_path(r.tp).read_text())
            except FileNotFoundError:
                continue
            if r.epoch < seen:
                raise FencedError(f"epoch {r.epoch} for {r.tp} is older than {seen} already committed", component="filesystem")

    # -- commit / abort ------------------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        name = _safe_name(txn_id)
        src = self.prepared_dir / (name + _DATA)
        manifest_path = self.prepared_dir / (name + _MANIFEST)
        try:
            if src.exists():
                manifest = TxnManifest.from_json(manifest_path.read_bytes(), str(manifest_path)) if manifest_path.exists() else None
                os.replace(src, self.committed_dir / (name + _DATA))
                if self.fsync:
                    _fsync_dir(self.committed_dir)
                    _fsync_dir(self.prepared_dir)
                if manifest is not None:
                    for r in manifest.ranges:
                        path = self._epoch_path(r.tp)
                        try:
                            seen = int(path.read_text())
                        except FileNotFoundError:
                            seen = -1
                        if r.epoch > seen:
                            self._write(path, str(r.epoch).encode())
            manifest_path.unlink(missing_ok=True)
        except OSError as exc:
            raise RetryableError(f"commit {txn_id} failed: {exc}", component="filesystem") from exc

    def abort(self, txn_id: str) -> None:
        name = _safe_name(txn_id)
        self._batch = [] if self._txn_id == txn_id else self._batch
        try:
            (self.prepared_dir / (name + _DATA)).unlink(missing_ok=True)
            (self.prepared_dir / (name + _MANIFEST)).unlink(missing_ok=True)
            (self.prepared_dir / (name + _DATA + ".tmp")).unlink(missing_ok=True)
        except OSError as exc:
            raise RetryableError(f"abort {txn_id} failed: {exc}", component="filesystem") from exc

    def recover(self) -> list[TxnManifest]:
        out: list[TxnManifest] = []
        try:
            for path in sorted(self.prepared_dir.glob("*" + _MANIFEST)):
                data = path.with_name(path.name[: -len(_MANIFEST)] + _DATA)
                if data.exists():
                    out.append(TxnManifest.from_json(path.read_bytes(), str(path)))
                else:
                    path.unlink(missing_ok=True)  # committed or aborted after the data moved
        except (OSError, ValueError) as exc:
            raise RetryableError(f"recover failed: {exc}", component="filesystem") from exc
        return out

    # -- for tests and the demo: what a reader sees ---------------------------------------
    def read_committed(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for path in sorted(self.committed_dir.glob("*" + _DATA)):
            with open(path, "rb") as f:
                rows.extend(json.loads(line) for line in f if line.strip())
        return rows
