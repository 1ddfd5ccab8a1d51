"""Prepared-transaction markers and file housekeeping for the Iceberg sink (:mod:`eosink.connectors.iceberg.sink`).

A prepared txn is, on storage, its Parquet files (under ``<table data path>/eosink-<txn key>/``,
referenced by no snapshot) plus one JSON **marker** ``<pending location>/<connector>/<txn>.json``
written *after* them. The marker is what makes the txn "prepared": ``recover()`` lists the markers,
``commit`` reads one to find the files after a crash, and deletes it last; ``abort`` deletes the
files first and the marker last, so a crash in between leaves a marker that recovery aborts again.

Why not let Iceberg hold it: nothing a catalog stores is invisible-but-listable - a snapshot is
visible once committed, and a staged (uncommitted) snapshot is lost with the process. Why not the
catalog database: a REST catalog has none we can write to. The table's FileIO can always write
objects, so the markers live there; pyiceberg's FileIO has no listing, so listing uses the pyarrow
filesystem behind it.

Markers are written atomically: one PUT on object stores, tmp + fsync + rename on a local disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from pyarrow import fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from eosink.connectors.api import formats
from eosink.connectors.common.durable import fsync_dir
from eosink.connectors.iceberg.tlsio import S3_CA_BUNDLE, CaBundleFileIO

MARKER_SUFFIX = ".json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def txn_key(connector: str, txn_id: str) -> str:
    """A directory name for the txn's data files, safe for every filesystem and for Hadoop paths.

    Readable prefix plus a hash of the exact id: ``a/b`` and ``a_b`` must not share a directory,
    and Hadoop (Spark's Iceberg reader) mangles ``%`` escapes, so quoting is not an option here.
    """
    digest = hashlib.sha1(f"{connector}\0{txn_id}".encode()).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', txn_id)[:80]}-{digest}"


def _local_path(uri: str) -> str | None:
    scheme, _, path = PyArrowFileIO.parse_location(uri)
    return path if scheme == "file" else None


class Storage:
    """Byte-level access to one location family (``file://`` or ``s3://``) with listing.

    ``fsync``: local files and their directories are fsynced, so "prepared" survives a power loss,
    not only a process crash (object stores are durable on PUT).
    """

    def __init__(self, io: FileIO, fsync: bool = True) -> None:
        self.io = io
        self.fsync = fsync

    @classmethod
    def for_properties(cls, properties: Mapping[str, str], fsync: bool = True) -> Storage:
        """A FileIO for ``properties``; with ``s3.ca-bundle`` one that trusts that CA (see :mod:`.tlsio`)."""
        io_class = CaBundleFileIO if properties.get(S3_CA_BUNDLE) else PyArrowFileIO
        return cls(io_class(dict(properties)), fsync)

    def _fs(self, uri: str) -> tuple[pafs.FileSystem, str]:
        fs_by_scheme = getattr(self.io, "fs_by_scheme", None)
        scheme, netloc, path = PyArrowFileIO.parse_location(uri)
        if fs_by_scheme is None:  # not a PyArrowFileIO (e.g. fsspec): listing through our own
            fs_by_scheme = PyArrowFileIO(dict(self.io.properties)).fs_by_scheme
        return fs_by_scheme(scheme, netloc), path

    def write_atomic(self, uri: str, data: bytes) -> None:
        local = _local_path(uri)
        if local is None:
            with self.io.new_output(uri).create(overwrite=True) as f:
                f.write(data)
            return
        os.makedirs(os.path.dirname(local), exist_ok=True)
        tmp = f"{local}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, local)
        if self.fsync:
            fsync_dir(os.path.dirname(local))

    def read(self, uri: str) -> bytes | None:
        try:
            with self.io.new_input(uri).open() as f:
                return f.read()
        except FileNotFoundError:
            return None

    def delete(self, uri: str) -> None:
        try:
            self.io.delete(uri)
        except FileNotFoundError:
            pass

    def list(self, dir_uri: str, recursive: bool = False) -> list[str]:
        """URIs of the files under ``dir_uri`` (none if it does not exist)."""
        fs, path = self._fs(dir_uri)
        infos = fs.get_file_info(pafs.FileSelector(path.rstrip("/"), recursive=recursive, allow_not_found=True))
        base = dir_uri.rstrip("/")
        root = path.rstrip("/")
        return [base + info.path[len(root):] for info in infos if info.type == pafs.FileType.File]

    def delete_tree(self, dir_uri: str) -> int:
        """Delete everything under ``dir_uri`` and the directory itself; the number of files deleted.

        One ``delete_dir`` rather than a delete per file: on S3 pyarrow re-creates an empty
        "directory" object when the last file under a prefix goes, which would litter one per abort.
        """
        files = self.list(dir_uri, recursive=True)
        fs, path = self._fs(dir_uri)
        try:
            fs.delete_dir(path.rstrip("/"))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if "does not exist" not in str(exc) and "not found" not in str(exc).lower():
                raise
        return len(files)

    def sync_files(self, uris: Sequence[str]) -> None:
        """fsync local data files and their directories (a no-op for object stores)."""
        if not self.fsync:
            return
        dirs: set[str] = set()
        for uri in uris:
            local = _local_path(uri)
            if local is None:
                continue
            fd = os.open(local, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dirs.add(os.path.dirname(local))
        for d in dirs:
            fsync_dir(d)


class Markers:
    """``<location>/<connector>/<quoted txn>.json``: the prepared txns of one connector."""

    def __init__(self, storage: Storage, location: str, connector: str) -> None:
        self.storage = storage
        self.dir = f"{location.rstrip('/')}/{connector}"

    def uri(self, txn_id: str) -> str:
        return f"{self.dir}/{quote(txn_id, safe='')}{MARKER_SUFFIX}"

    def put(self, txn_id: str, doc: dict[str, Any]) -> None:
        self.storage.write_atomic(self.uri(txn_id), json.dumps(doc, separators=(",", ":")).encode())

    def get(self, txn_id: str) -> dict[str, Any] | None:
        data = self.storage.read(self.uri(txn_id))
        return None if data is None else self.parse(txn_id, data)

    def parse(self, txn_id: str, data: bytes) -> dict[str, Any]:
        """A marker's document; :class:`~eosink.connectors.api.formats.NewerFormatError` when a newer eosink
        wrote it in a format this one does not read (its ``v``)."""
        doc: dict[str, Any] = json.loads(data)
        found = doc.get("v", 1) if isinstance(doc, dict) else 1
        formats.check(found if isinstance(found, int) else formats.UNREADABLE, formats.ICEBERG_MARKER, "the prepared-txn marker",
                      self.uri(txn_id), component="iceberg")
        return doc

    def delete(self, txn_id: str) -> None:
        self.storage.delete(self.uri(txn_id))

    def list(self) -> list[tuple[str, bytes | None]]:
        """``(txn_id, marker bytes)`` of every marker (bytes None when it vanished while listing)."""
        out: list[tuple[str, bytes | None]] = []
        for uri in sorted(self.storage.list(self.dir)):
            name = uri.rsplit("/", 1)[-1]
            if not name.endswith(MARKER_SUFFIX):
                continue  # e.g. a .json.tmp left by a crash mid-write: never a prepared txn
            out.append((unquote(name[: -len(MARKER_SUFFIX)]), self.storage.read(uri)))
        return out
