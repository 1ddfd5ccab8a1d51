"""A micro-batch partition's publish: known by its content, not by its index.

A batch run's partition is its index: a retry or a re-run puts the same rows there. A streaming
query's replay does not promise that (Spark's Kafka source can hand a replayed offset range another
index; see :mod:`eosink.spark_jobs.fingerprint`), so a micro-batch partition is identified by what it
holds: the content fingerprint of its rows and their count, ``{fingerprint:016x}-{rows}``. Its ledger
key is ``{job}/{run}/{index}.{identity}`` and it is published iff no entry of the run with the same
identity is committed.

The order of operations keeps the batch publisher's argument (:mod:`eosink.spark_jobs.task`):
``init_transactions`` first (fencing earlier attempts of this index); the rows go into the
transaction as they arrive, the fingerprint summed on the way (the content is only known at the
end); then, before the ledger entry, the check: an identity the driver saw committed before this
attempt began, or one the ledger has committed under this very key (an earlier attempt of this
index), aborts the transaction and publishes nothing. An earlier attempt of the same content under
*another* index cannot commit after the check: the driver ends every open transaction of the
query's transactional.ids before the first micro-batch of a restarted query and before any replay
(:mod:`eosink.spark_jobs.fencing`), and within one run a content has one index.

Record ids (``eosink.id``) are ``{job}/{run}/{index}-{first batch's fingerprint}/{sequence}``: unique, since a
replay can put a new content at an index whose committed records (another content's) are numbered from 0
too; the same across attempts where the partition's first rows are (an offset range of the Kafka source).

Two partitions of one micro-batch with exactly the same rows (as multisets of key and value bytes)
share an identity: on a replay after one of them committed, the other is taken as published.

A replay of a partly committed batch (``spec.replay`` set by the driver) holds its rows until the
content is known: a content matching no committed entry is first compared with the run's committed
records, and only its rows provably not published yet go into the transaction, or the task refuses
(:mod:`eosink.spark_jobs.replay_check`). Every other micro-batch produces its rows as they arrive.
"""

from __future__ import annotations

import pyarrow as pa

from eosink.spark_jobs.errors import ReplayRegroupedError
from eosink.spark_jobs.fingerprint import batch_fingerprint, combine
from eosink.spark_jobs.ledger import LedgerEntry, lookup_committed
from eosink.spark_jobs.naming import ledger_key, record_id_prefix
from eosink.spark_jobs.replay_check import committed_groups, new_rows, row_records
from eosink.spark_jobs.task import PartitionPublisher, PartitionResult, TaskSpec


def content_of(spec: TaskSpec, batch: pa.RecordBatch) -> int:
    """The fingerprint of a batch over every outbox's key and value columns."""
    cols = batch.columns
    return combine(*((i + 1) * batch_fingerprint(cols[ob.key_col], cols[ob.value_col]) for i, ob in enumerate(spec.outboxes)))


class StreamPartitionPublisher(PartitionPublisher):
    """:class:`PartitionPublisher` for a micro-batch: the ledger is asked at commit, by content."""

    def __init__(self, spec: TaskSpec, partition: int, attempt: int) -> None:
        super().__init__(spec, partition, attempt)
        self.fingerprint = 0
        self.rows = 0
        #: A replay of a partly committed batch: the rows, held until the content is known (see the module doc).
        self.held: list[pa.RecordBatch] | None = [] if spec.replay is not None else None

    @property
    def identity(self) -> str:
        return f"{self.fingerprint:016x}-{self.rows}"

    def _committed_entry(self) -> LedgerEntry | None:
        return None  # the content is known only once every row is in: see commit()

    def _ledger_key(self) -> str:
        return ledger_key(self.spec.job, self.spec.run_id, f"{self.partition}.{self.identity}")

    def _entry_extra(self) -> dict[str, object]:
        return {"content": self.identity, "rows": self.rows, "transaction_timeout_ms": self.spec.transaction_timeout_ms}

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            content = content_of(self.spec, batch)
            if not self.rows:
                # eosink.id must stay unique: after a replay moved contents between indices, this index may already
                # hold another content's committed records, numbered from 0 like these.
                self._prefix = record_id_prefix(self.spec.job, self.spec.run_id, f"{self.partition}-{content:016x}")
            self.fingerprint = combine(self.fingerprint, content)
            self.rows += batch.num_rows
            if self.held is not None:
                self.held.append(batch)
                return
        super().write(batch)

    def commit(self) -> PartitionResult:
        spec = self.spec
        earlier = spec.published_content.get(self.identity)
        if earlier is None:
            pending = tuple(o for offsets in spec.pending.values() for o in offsets)
            earlier = lookup_committed(spec.producer_config, spec.ledger_topic, self._ledger_key(), spec.ledger_since,
                                       spec.ledger_timeout_s, pending=pending)
        if earlier is not None:
            self.abort()  # these rows were published by an earlier attempt: this copy is never visible
            return self.skipped(earlier)
        if self.held is not None:
            self._publish_held()
        return super().commit()

    def _publish_held(self) -> None:
        """A new content in a replay of a partly committed batch: only its rows no earlier attempt committed."""
        spec, held, self.held = self.spec, self.held or [], None
        assert spec.replay is not None
        groups = committed_groups(spec.producer_config, spec.replay, spec.run_id, spec.ledger_timeout_s)
        rows = [r for batch in held for r in row_records(spec.outboxes, batch)] if groups else []
        keep = new_rows(rows, groups) if groups else [True] * self.rows
        if keep is None:
            self.abort()
            raise ReplayRegroupedError(spec.job, spec.run_id, self.partition,
                                       f"{self.rows} rows of content {self.identity}, some of which were committed by "
                                       "an earlier attempt inside a group this partition holds only in part")
        first = 0
        for batch in held:
            mask, first = keep[first:first + batch.num_rows], first + batch.num_rows
            super().write(batch if all(mask) else batch.filter(pa.array(mask)))

