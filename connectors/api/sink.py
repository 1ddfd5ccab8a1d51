"""The two-phase-commit sink contract (``connect/api`` to the engine's ``connect/runtime``).

One instance of a sink serves one task of one connector. The engine drives it per cycle::

    begin_transaction(txn_id)          a new, stable txn id (connector.worker.generation.counter)
    write(records)   * n               stage: buffer or write speculatively, never visible
    pre_commit(manifest)               prepare: durable but invisible, manifest recorded
      -- the engine records the decision in ZooKeeper (the single commit point) --
    commit(txn_id) | abort(txn_id)     make the prepared batch visible / discard it

and on start and on every newly acquired partition::

    recover() -> [TxnManifest]         every txn prepared and not yet committed or aborted
    recover_and_commit(m) | recover_and_abort(m)
    discard_unprepared(partitions)     what a txn that died inside pre_commit left on them

Outcomes are three classes: returning normally is **ok**; raising
:class:`~eosink.connectors.api.errors.RetryableError` is **retryable**; raising
:class:`~eosink.connectors.api.errors.FatalError` (or anything unexpected) is **fatal**.

Every operation is idempotent: committing a committed txn, aborting an aborted one, and
aborting an unknown txn are ok, because any of them is replayed after a retry or a crash.

Sinks that can hold state also fence at the resource: a ``pre_commit`` whose manifest carries
an epoch older than one already seen for the partition raises :class:`FencedError`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from eosink.connectors.api.config import ConfigDef
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest

if TYPE_CHECKING:
    from eosink.connectors.api.audit import AuditReader


class TwoPhaseCommitSink(abc.ABC):
    """Base of every sink. Subclasses declare ``CONFIG`` and implement the five operations."""

    #: Declared configuration of this connector class (drives validation and docs).
    CONFIG: ClassVar[ConfigDef] = ConfigDef()
    #: How old a cycle that has read everything available must be before it may commit early, when
    #: the connector leaves ``commit.min.interval.ms`` unset. A transaction of rows or requests is
    #: cheap to make often, so records go out sooner; a sink whose transaction makes a file, object or
    #: snapshot says None (every cycle runs its full ``commit.interval.ms``): ending early at low
    #: traffic would fill its store with small files.
    CAUGHT_UP_COMMIT_MS: ClassVar[int | None] = 250
    #: Whether the sink reads records' decoded values. A sink that only copies the bytes of JSON
    #: objects and arrays (:func:`~eosink.connectors.api.records.copied_json`), or parses those bytes
    #: itself and reads a value only where it cannot (reading one decodes it then), says False (a
    #: class or instance attribute, set by ``__init__`` where it depends on the config): when every
    #: sink of a connector without transforms says so, the engine checks each JSON value as it reads
    #: it and leaves it undecoded (:class:`~eosink.connectors.api.records.LazyJsonRecord`).
    reads_values: bool = True

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        self.connector = connector
        self.config = self.CONFIG.parse(config, source=f"connector '{connector}'")

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:  # noqa: B027 - an optional hook: a sink with nothing to connect leaves it empty
        """Connect and create what the sink needs (tables, buckets, directories)."""

    def close(self) -> None:  # noqa: B027 - an optional hook, as open()
        """Release connections. Prepared transactions survive on the resource."""

    # -- the commit cycle ------------------------------------------------------------------
    @abc.abstractmethod
    def begin_transaction(self, txn_id: str) -> None:
        """Start staging a new transaction; any unprepared staged data is discarded."""

    @abc.abstractmethod
    def write(self, records: Sequence[SinkRecord]) -> None:
        """Stage records (``stage`` in the contract); nothing becomes visible."""

    @abc.abstractmethod
    def pre_commit(self, manifest: TxnManifest) -> None:
        """Prepare: make the staged batch durable but invisible, and record ``manifest``."""

    @abc.abstractmethod
    def commit(self, txn_id: str) -> None:
        """Make the prepared batch visible atomically. Already committed is ok."""

    @abc.abstractmethod
    def abort(self, txn_id: str) -> None:
        """Discard the prepared (or staged) batch. Already aborted or unknown is ok."""

    @abc.abstractmethod
    def recover(self) -> list[TxnManifest]:
        """Every transaction of this connector that is prepared and not yet resolved."""

    def recover_and_commit(self, manifest: TxnManifest) -> None:
        """Commit a txn found by :meth:`recover` that the decision log names."""
        self.commit(manifest.txn_id)

    def recover_and_abort(self, manifest: TxnManifest) -> None:
        """Abort a txn found by :meth:`recover` that no decision names."""
        self.abort(manifest.txn_id)

    def discard_unprepared(self, partitions: frozenset[TopicPartition]) -> None:  # noqa: B027 - optional hook
        """Discard what a txn that died inside ``pre_commit`` (before its manifest was recorded) left on
        ``partitions``, which :meth:`recover` cannot name: S3 uploads no ``.json`` lists, for one.

        Called once the prepared txns touching ``partitions`` are settled, while this task holds
        them at an epoch newer than any earlier owner's: whatever else is staged there that no
        prepared txn names belongs to a writer that is dead or fenced, and can never be committed.
        """

    # -- audit -------------------------------------------------------------------------------
    def audit_reader(self, name: str) -> AuditReader:
        """This sink read back by itself, for ``eosink connectors audit`` (``name``: the sink's name in
        the report). A sink that cannot be read back says why rather than being reported clean."""
        from eosink.connectors.api.audit import NotAuditable

        return NotAuditable(name, f"{type(self).__name__} cannot be read back: its contents are not audited")


class BatchingSink(TwoPhaseCommitSink):
    """A sink that stages records in memory and writes the whole batch at ``pre_commit``.

    A connector then writes only what is specific to its target: :meth:`prepare_batch`.
    """

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        self._txn_id: str | None = None
        self._batch: list[SinkRecord] = []

    def begin_transaction(self, txn_id: str) -> None:
        self._txn_id = txn_id
        self._batch = []

    def write(self, records: Sequence[SinkRecord]) -> None:
        self._batch.extend(records)

    def pre_commit(self, manifest: TxnManifest) -> None:
        batch, self._batch = self._batch, []
        self.prepare_batch(manifest, batch)

    @abc.abstractmethod
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        """Write ``records`` durably but invisibly under ``manifest.txn_id``."""
