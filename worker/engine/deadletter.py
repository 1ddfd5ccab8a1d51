"""The dead-letter topic as one more two-phase-commit sink of the cycle: exactly once.

With ``errors.tolerance=all`` the engine hands every bad record of a cycle (undecodable, or
rejected by a sink) to :class:`DeadLetterSink`, which the runner adds as the connector's last
sink. The dead-letter write then belongs to the cycle: it becomes visible if and only if the
cycle's decision is recorded, and exactly once.

Why not simply "produce in a Kafka transaction at prepare, commit it at commit"? Because a Kafka
transaction cannot be *prepared* and committed later by another process: if the worker dies
between the decision and the Kafka commit, the open transaction is aborted (by the broker's
``transaction.timeout.ms`` or the next ``init_transactions()`` on its ``transactional.id``) and
the decided dead-letter records would be lost. So the Kafka transaction is only the fast path;
durability and idempotence come from two more pieces:

``pre_commit(manifest)``
    1. writes a *dead-letter manifest* znode ``/eosink/<cluster>/deadletter/<connector>/<txn>``:
       the txn's manifest (partitions, epochs) and, per bad record, its coordinates
       (topic, partition, offset), stage, exception class and message - not its bytes, which
       stay on the source topic, so the znode stays small;
    2. begins a Kafka transaction with ``transactional.id = eosink-dlq.<connector>.<worker>.<generation>``
       (derived from the txn id, so anyone can recompute it from the manifest), produces the
       records with their context headers, and - in the same Kafka transaction - commits
       offsets for the source partitions to the consumer group named like the transactional.id,
       with **offset metadata = the txn id**: the *commit marker*, visible atomically with the records.

``commit(txn)``  commits the Kafka transaction, then deletes the znode.

``recover_and_commit(m)`` (a decided txn whose znode is still there: the worker died after the
decision) - and ``commit`` itself when the Kafka commit fails:
    ``init_transactions()`` with the txn's transactional.id - this fences any older producer
    with that id (a zombie) and completes or aborts its open transaction - then reads the marker
    (a ``read_committed`` offset fetch, which waits for pending transactional commits). Marker
    present: the records are already visible, done. Absent: re-read the bad records from the
    source topic by offset, produce them again with the same headers and marker in a new Kafka
    transaction, commit. Delete the znode. Two processes doing this at once fence each other on
    the transactional.id and each checks the marker after its own ``init_transactions()``, so
    only one can commit.

    Why one marker group per transactional.id, not one per connector: after the recoverer's
    ``init_transactions()`` no other producer can commit a txn of that id, and no *later* txn of
    that id can have been committed either (it would need a decision, and the recoverer's epoch
    bump fences the old owner's decisions; a decision made before it would have deleted this
    znode first). So the marker read then is final. A group shared by the connector could
    meanwhile be overwritten by another worker's later write on the same source partition.

``abort(txn)`` / ``recover_and_abort(m)`` (undecided): abort the Kafka transaction (or fence it
with ``init_transactions()``), delete the znode. Nothing was ever visible to read_committed
consumers of the dead-letter topic.

A cycle without bad records costs nothing here: no znode, no Kafka transaction. A decided txn
whose bad records the source topic no longer holds (retention ran out before recovery) cannot be
completed: commit raises :class:`FatalError`, the task is FAILED with that reason in ``/status``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eosink.connectors.api.records import SinkRecord, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine import deadletter_manifest
from eosink.worker.engine.batch import FailedRecord
from eosink.worker.engine.deadletter_manifest import DeadLetterManifests
from eosink.worker.engine.deadletter_writer import DeadLetterWriter
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.engine.deadletter")


class DeadLetterSink(TwoPhaseCommitSink):
    """Bad records of the cycle into ``errors.deadletterqueue.topic.name``, exactly once (see the module doc)."""

    reads_values = False  # failed records travel as the bytes they had on the topic

    def __init__(self, connector: str, *, session: Any, worker_id: str, bootstrap: str, topic: str,
                 kafka: Mapping[str, str] | None = None, context_headers: bool = True, replication_factor: int = -1,
                 timeout_s: float = 30.0) -> None:
        super().__init__(connector, {})
        self.session = session
        self.worker_id = worker_id
        self.topic = topic
        self.manifests = DeadLetterManifests(session, connector)
        self.writer = DeadLetterWriter(connector, bootstrap=bootstrap, topic=topic, kafka=kafka, context_headers=context_headers,
                                       replication_factor=replication_factor, timeout_s=timeout_s)
        self._txn: str | None = None
        self._staged: list[FailedRecord] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the dead-letter topic when it is missing (as Kafka Connect does)."""
        self.writer.create_topic()

    def close(self) -> None:
        self.writer.close()

    # -- the cycle ----------------------------------------------------------------------------------
    def begin_transaction(self, txn_id: str) -> None:
        self._txn = txn_id
        self._staged = []

    def write(self, records: Sequence[SinkRecord]) -> None:
        """Good records are the other sinks' business."""

    def report(self, failed: Sequence[FailedRecord]) -> None:
        """Stage the cycle's bad records (called by the engine between write and pre_commit)."""
        self._staged.extend(failed)

    def pre_commit(self, manifest: TxnManifest) -> None:
        staged, self._staged = self._staged, []
        if not staged:
            return
        records = deadletter_manifest.rows(staged)
        self.manifests.write(manifest, self.worker_id, records)
        self.writer.produce(manifest.txn_id, records, [(f.key, f.value, f.headers) for f in staged], self.worker_id)

    def commit(self, txn_id: str) -> None:
        if self.writer.open == txn_id:
            try:
                count = self.writer.commit_open()
                metrics.DEAD_LETTERED.labels(self.connector).inc(count)
                log.info("dead_lettered", connector=self.connector, txn=txn_id, records=count, topic=self.topic)
                self.manifests.delete(txn_id)
                return
            except Exception as exc:  # noqa: BLE001 - fall back to the recovery path, which is idempotent
                log.warning("dead_letter_commit_failed", connector=self.connector, txn=txn_id, error=str(exc))
                self.writer.drop_producer()
        doc = self.manifests.read(txn_id)
        if doc is not None:
            self.writer.redeliver(txn_id, doc)
            self.manifests.delete(txn_id)

    def abort(self, txn_id: str) -> None:
        if self._txn == txn_id:
            self._staged = []
        self.writer.abort_open(txn_id)
        self.manifests.delete(txn_id)

    # -- recovery -----------------------------------------------------------------------------------
    def recover(self) -> list[TxnManifest]:
        return self.manifests.prepared()

    def recover_and_commit(self, manifest: TxnManifest) -> None:
        self.commit(manifest.txn_id)

    def recover_and_abort(self, manifest: TxnManifest) -> None:
        if self.writer.open != manifest.txn_id and self.manifests.read(manifest.txn_id) is not None:
            # Fence the old producer and abort its open transaction now, rather than leaving it to
            # block read_committed readers of the dead-letter topic until transaction.timeout.ms.
            self.writer.fence(manifest.txn_id)
        self.abort(manifest.txn_id)
