"""Filesystem sink: JSON Lines files, prepared then atomically renamed into place.

Layout under ``file.path``/<connector>/::

    prepared/<txn>.manifest.json   what recovery needs (partitions, offsets, epochs), written first
    prepared/<txn>.jsonl           the batch, fsynced, invisible to readers: the txn is prepared once it is here
    committed/<txn>.jsonl          visible: readers read only committed/*.jsonl
    epochs/<topic>-<partition>     highest epoch committed per partition (the resource fence)

``commit`` is one ``rename(2)`` of the data file (atomic on POSIX) followed by an fsync of the
directory, so a crash leaves a batch either prepared or committed, never both and never half.

The manifest goes before the data so that a prepare killed part way always leaves a file naming its
partitions: a manifest whose data is neither prepared nor committed is a prepare that never finished,
and :meth:`FilesystemSink.discard_unprepared` removes it (with its half-written data) as soon as a
newer epoch holds one of those partitions. Data with no manifest beside it names nothing and is
removed once it is older than any live write (``ORPHAN_TMP_S``).

Each line: ``{"topic","partition","offset","key","id","value"}`` with ``value`` the record's
JSON as it was on the topic (not re-encoded; on one line even when the topic's JSON was
pretty-printed: see :mod:`eosink.connectors.common.jsonlines`), so ``jq`` reads it and the sink
stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty, one_of
from eosink.connectors.api.errors import FencedError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import BatchingSink
from eosink.connectors.common import jsonlines
from eosink.connectors.common.durable import describe_os_error, write_durably
from eosink.connectors.common.durable import fsync_dir as _fsync_dir
from eosink.connectors.filesystem_audit import FilesystemReader

_DATA = ".jsonl"
_MANIFEST = ".manifest.json"
#: Records encoded and written at a time (see write_durably).
_SLICE = 20_000
#: A ``*.tmp`` file (or data without its manifest) untouched this long was left by a writer killed
#: mid-write (a live write touches it with every slice, and a write that resumes later fails at its
#: rename): recovery removes it, so a crash does not keep the space of a half-written batch, on a
#: full disk least of all.
ORPHAN_TMP_S = 900.0


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
            raise self._error(f"cannot create {self.root}", exc) from exc

    # -- prepare -------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        name = _safe_name(manifest.txn_id)
        data_path = self.prepared_dir / (name + _DATA)
        manifest_path = self.prepared_dir / (name + _MANIFEST)
        if (self.committed_dir / (name + _DATA)).exists() or data_path.exists() and manifest_path.exists():
            return  # already prepared or committed: idempotent
        self._check_epochs(manifest)
        try:
            self._write(manifest_path, manifest.to_json().encode())  # first: see the module's docstring
            write_durably(data_path, (self._encode(records[i:i + _SLICE]) for i in range(0, len(records), _SLICE)),
                          fsync=self.fsync)
            if self.fsync:
                _fsync_dir(self.prepared_dir)
        except OSError as exc:
            with contextlib.suppress(OSError):  # nothing half-prepared stays: the space goes back at once
                data_path.unlink(missing_ok=True)
                manifest_path.unlink(missing_ok=True)
            raise self._error(f"prepare {manifest.txn_id}", exc) from exc

    def _write(self, path: Path, data: bytes) -> None:
        """A small file, whole or not at all (never truncated by a full disk), fsynced with ``file.fsync``."""
        write_durably(path, (data,), fsync=self.fsync)

    def _error(self, what: str, exc: OSError) -> RetryableError:
        """Every local failure is retryable; a full disk or quota says so and names the file and volume."""
        return RetryableError(f"{what}: {describe_os_error(exc, self.root)}", component="filesystem")

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
        """Raise the epoch fence from the manifest, rename the data into committed/, drop the manifest.

        The fence goes first: it is the one step that needs space (a few bytes per partition), so
        on a full disk the batch stays prepared and the commit is retried in place until space
        returns; a retry after the rename still raises the fence, since the manifest goes last."""
        name = _safe_name(txn_id)
        src = self.prepared_dir / (name + _DATA)
        manifest_path = self.prepared_dir / (name + _MANIFEST)
        try:
            if manifest_path.exists():
                self._raise_fence(TxnManifest.from_json(manifest_path.read_bytes(), str(manifest_path)))
            if src.exists():
                os.replace(src, self.committed_dir / (name + _DATA))
                if self.fsync:
                    _fsync_dir(self.committed_dir)
                    _fsync_dir(self.prepared_dir)
            manifest_path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._error(f"commit {txn_id}", exc) from exc

    def _raise_fence(self, manifest: TxnManifest) -> None:
        for r in manifest.ranges:
            path = self._epoch_path(r.tp)
            try:
                seen = int(path.read_text())
            except FileNotFoundError:
                seen = -1
            if r.epoch > seen:
                self._write(path, str(r.epoch).encode())

    def abort(self, txn_id: str) -> None:
        name = _safe_name(txn_id)
        self._batch = [] if self._txn_id == txn_id else self._batch
        try:
            for suffix in (_DATA, _DATA + ".tmp", _MANIFEST, _MANIFEST + ".tmp"):  # the manifest last, as written first
                (self.prepared_dir / (name + suffix)).unlink(missing_ok=True)
        except OSError as exc:
            raise self._error(f"abort {txn_id}", exc) from exc

    def recover(self) -> list[TxnManifest]:
        """The prepared txns: a manifest with its data beside it.

        A manifest whose data was committed is the last step of a commit that was cut short: it goes. One
        whose data is nowhere is a prepare that has not finished, in flight or dead: it stays for
        :meth:`discard_unprepared`, which alone knows whether its writer can still commit."""
        out: list[TxnManifest] = []
        try:
            for path, stem in self._manifests():
                if (self.prepared_dir / (stem + _DATA)).exists():
                    out.append(self._read_manifest(path))
                elif (self.committed_dir / (stem + _DATA)).exists():
                    path.unlink(missing_ok=True)
            self._remove_orphans(time.time() - ORPHAN_TMP_S)
        except OSError as exc:
            raise self._error("recover", exc) from exc
        return out

    def discard_unprepared(self, partitions: frozenset[TopicPartition]) -> None:
        """Remove the manifest and half-written data of every prepare that died before its data was in place
        and that covers one of ``partitions``: their writer is dead or fenced, so it can never commit."""
        try:
            for path, stem in self._manifests():
                if (self.prepared_dir / (stem + _DATA)).exists() or (self.committed_dir / (stem + _DATA)).exists():
                    continue
                try:
                    manifest = self._read_manifest(path)
                except FileNotFoundError:
                    continue  # aborted or discarded meanwhile
                if manifest.partitions & partitions:
                    (self.prepared_dir / (stem + _DATA + ".tmp")).unlink(missing_ok=True)
                    path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._error("discarding unprepared txns", exc) from exc

    def _manifests(self) -> list[tuple[Path, str]]:
        """Each manifest in prepared/, with its txn's file stem."""
        return [(p, p.name[: -len(_MANIFEST)]) for p in sorted(self.prepared_dir.glob("*" + _MANIFEST))]

    @staticmethod
    def _read_manifest(path: Path) -> TxnManifest:
        try:
            return TxnManifest.from_json(path.read_bytes(), str(path))
        except ValueError as exc:
            raise RetryableError(f"recover failed: {exc}", component="filesystem") from exc

    def _remove_orphans(self, cutoff: float) -> None:
        """Temporary files, and data that no manifest names, untouched since ``cutoff``."""
        stale = [*self.prepared_dir.glob("*.tmp"), *self.epochs_dir.glob("*.tmp")]
        stale += [p for p in self.prepared_dir.glob("*" + _DATA)
                  if not p.with_name(p.name[: -len(_DATA)] + _MANIFEST).exists()]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):  # its writer finished or another recovery won
                if path.stat().st_mtime < cutoff:
                    path.unlink()

    # -- for tests and the demo: what a reader sees ---------------------------------------
    def read_committed(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for path in sorted(self.committed_dir.glob("*" + _DATA)):
            with open(path, "rb") as f:
                rows.extend(json.loads(line) for line in f if line.strip())
        return rows
