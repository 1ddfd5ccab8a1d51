"""Format versions of what eosink stores, so a worker never misreads what a newer release wrote.

Everything a worker keeps outside itself has a format version, and a reader refuses a version newer
than it knows with :class:`NewerFormatError`, a fatal error that names the place and both versions,
instead of misreading it:

================================  ==========================================================
``ZOOKEEPER``                     the cluster's tree (decision log, assignments, status,
                                  configs): ``/eosink/<cluster>/format``; each decision entry
                                  also carries its own ``format``
``MANIFEST``                      every prepared transaction's manifest, in every sink
                                  (PostgreSQL's ``eosink_txn_manifest``, the S3 ``.json``,
                                  files, HTTP, Iceberg, dead letters)
``POSTGRES_BOOKKEEPING``          the bookkeeping tables (``eosink_offsets``, ...), as their
                                  table comment ``eosink bookkeeping format N``
``S3_EPOCH``                      the S3 sink's epoch objects, as their ``eosink-format`` metadata
``ICEBERG_MARKER``                the Iceberg sink's prepared-txn markers, as their ``v``
================================  ==========================================================

A missing version is format 1: what releases before the versions wrote. The version policy
(docs/operations/upgrades.md) says when a format may change: a release that writes a new format
reads the previous one, and starts writing it only once every worker of the cluster runs it.
"""

from __future__ import annotations

from typing import Any

from eosink.connectors.api.errors import FatalError

ZOOKEEPER = 1
MANIFEST = 1
POSTGRES_BOOKKEEPING = 1
S3_EPOCH = 1
ICEBERG_MARKER = 1
#: The key under which a JSON document carries its format.
KEY = "format"
#: What an unreadable version counts as (not a number this release ever wrote): newer than anything it knows.
UNREADABLE = 1 << 30


class NewerFormatError(FatalError):
    """Stored data in a format newer than this worker reads: written by a newer eosink."""

    def __init__(self, what: str, where: str, found: int, known: int, *, component: str) -> None:
        super().__init__(
            f"{what} at {where} is in format {found}, written by a newer eosink; this worker (eosink {_version()}) "
            f"reads format {known} at most and will not misread it: run the newer release on this worker too "
            "(docs/operations/upgrades.md)", component=component)
        self.found, self.known = found, known


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eosink")
    except PackageNotFoundError:
        return "unknown version"


def version_of(doc: Any) -> int:
    """The format a JSON document says it is in (1 when it says nothing, as before the versions)."""
    v = doc.get(KEY, 1) if isinstance(doc, dict) else 1
    try:
        return int(v)
    except (TypeError, ValueError):
        return UNREADABLE


def check(found: int, known: int, what: str, where: str, *, component: str) -> None:
    """Refuse ``found`` when it is newer than ``known`` (see :class:`NewerFormatError`)."""
    if found > known:
        raise NewerFormatError(what, where, found, known, component=component)
