"""The commit cycle of one connector on one worker: begin, flush, prepare, decide, commit.

Everything a cycle does is here, in the order it does it; what it leans on lives next door:
the task's states and settings in ``types.py`` (:class:`~eosink.worker.engine.types.TaskState`
lists the transitions), the partitions it runs over in ``holding.py``, the decision log in
``decision.py``, recovery in ``recovery.py`` and bad records under ``errors.tolerance`` in
``tolerance.py``; the task that runs cycles on its thread is ``task.py``.

Outcomes of a cycle follow the failure table of ``docs/architecture.md``: a failure before the
decision aborts every sink (ABORTED, retried); a refused compare-and-set, at the decision or at a
sink's resource, is FENCED (abort, drop those partitions); an unknown decision outcome is settled
by reading the log once reconnected; a commit is retried in place (see ``fanout.py``), and the decision stands.
Recovery of newly acquired partitions is described there too ("Recovery") and done in ``recovery.py``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from eosink.connectors.api.errors import CommitStateUnknownError, FatalError, FencedError, Outcome, outcome_of
from eosink.connectors.api.records import TopicPartition, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine import gcpause
from eosink.worker.engine.batch import Batch
from eosink.worker.engine.decision import PartitionsFenced, Settlement, settle_unknown
from eosink.worker.engine.fanout import SinkFanout
from eosink.worker.engine.faults import FAULTS
from eosink.worker.engine.holding import PartitionHolder
from eosink.worker.engine.ranges import check_not_behind, txn_ranges
from eosink.worker.engine.types import Backoff, CycleOutcome, CycleResult, Prepared, TaskState
from eosink.worker.transforms import TransformChain

#: How long a new owner's first flushes last at least (see :meth:`CycleRunner._poll`).
RESUME_S = 0.1


class CycleRunner(PartitionHolder):
    """Commit cycles over the partitions held. A part of :class:`~eosink.worker.engine.task.SinkTask`,
    whose constructor sets every attribute declared here."""

    worker_id: str
    paused: bool
    #: ``paused`` as the task thread last saw it, between two cycles: /status says PAUSED once no cycle is in flight.
    pause_applied: bool
    fanout: SinkFanout
    transforms: TransformChain | None
    dead_letter: TwoPhaseCommitSink | None
    sleep: Callable[[float], None]
    lag: dict[TopicPartition, int]
    _counter: int
    _backoff: Backoff
    _lag_at: float

    # ------------------------------------------------------------------ the cycle
    def run_cycle(self) -> CycleResult:
        with self._lock:
            if self.paused != self.pause_applied:
                # Between two cycles: a pause holds from here on (the cycle before it may have delivered what
                # it read), so only now may /status say PAUSED - a record written after that is not delivered.
                self.pause_applied = self.paused
                if self.on_change is not None:
                    self.on_change()
            if self.state is TaskState.FAILED or self.state is TaskState.STOPPED or self.paused:
                return CycleResult(CycleOutcome.EMPTY)
            if self.fanout.abort_pending and not self.fanout.retry_aborts():
                return CycleResult(CycleOutcome.ABORTED)
            if not self.fanout.opened:
                self._unrecovered |= set(self.grants)  # opened in recovery, before anything is consumed
            if time.monotonic() - self._recovered_at > self.settings.recovery_interval_s:
                self._unrecovered |= set(self.grants)
            if self._unrecovered:
                if not self._recover_pending():  # its error shows in /status like a failed cycle's
                    return CycleResult(CycleOutcome.ABORTED, error=self.recovery_error)
                self._position()
            if not self.active_partitions():
                return CycleResult(CycleOutcome.EMPTY)
            with gcpause.paused():  # a batch is born and dies within its cycle: no collector pass over it
                result = self._cycle()
                while result.redo:  # one more rejected record is known now: deliver the rest without it
                    result = self._cycle()
            return result

    def _cycle(self) -> CycleResult:
        started = time.monotonic()
        txn_id = self.next_txn_id()
        FAULTS.hit("begin")
        prepared = self._prepare(txn_id)
        if isinstance(prepared, CycleResult):
            return prepared  # empty, or aborted before the decision
        FAULTS.hit("after_prepare")
        undecided = self._decide(txn_id, prepared.next_offsets)
        if undecided is not None:
            return undecided
        FAULTS.hit("after_decide")
        return self._commit(txn_id, prepared, started)

    def _prepare(self, txn_id: str) -> Prepared | CycleResult:
        """Begin, flush and prepare on every sink; any failure aborts them all (nothing is decided yet)."""
        batch: Batch | None = None
        touched: frozenset[TopicPartition] = frozenset()
        try:
            self.fanout.begin(txn_id)
            # Right after a handoff, flush what is there at once (until the first records arrive, for at
            # most one interval): the new owner resumes promptly.
            resuming = time.monotonic() < self._resuming_until
            # Without transforms or a dead-letter sink the records go to the sinks as they are read (each
            # slice once, in order: ``write`` * n of the contract), so a sink can write while the rest is read.
            incremental = getattr(self.source, "incremental", False)
            streamed = incremental and self.transforms is None and self.dead_letter is None and not self._tolerance.poison
            batch = self._poll(resuming, incremental, streamed)
            metrics.CONSUMED.labels(self.connector).inc(len(batch.records) + len(batch.failed))
            if batch.records:
                self._resuming_until = 0.0
            FAULTS.hit("flush")
            records, failed = self._tolerance.split(batch)
            if not records and not failed:
                if batch.error is not None:
                    self._fail(batch.error)
                    return CycleResult(CycleOutcome.FATAL, txn_id, error=batch.error)
                return CycleResult(CycleOutcome.EMPTY, txn_id)
            ranges, counts = txn_ranges(records, self.grants, failed)  # as read: a router may rename topics
            touched = frozenset(r.tp for r in ranges)
            check_not_behind(self.connector, ranges, self.grants)
            if self.transforms is not None:
                records = self._tolerance.transform(self.transforms, records, failed, owned=batch.fresh)
            if not streamed:
                self.fanout.write(records)
            if failed:
                self._tolerance.report(failed, txn_id, self.grants)
            manifest = TxnManifest(txn_id, self.connector, ranges)
            t_prepare = time.monotonic()
            self.fanout.pre_commit(manifest)
            metrics.STEP_SECONDS.labels(self.connector, "prepare").observe(time.monotonic() - t_prepare)
            return Prepared(batch, records, counts, {r.tp: r.next_offset for r in manifest.ranges})
        except Exception as exc:  # noqa: BLE001 - every failure before the decision aborts
            if isinstance(exc, FencedError):  # a resource holds a newer epoch: a zombie there, as at the decision
                return self._fenced(txn_id, PartitionsFenced(self.connector, touched or self.grants, str(exc)),
                                    refused_by=getattr(exc, "component", None) or "a sink")
            if batch is not None and self._tolerance.rejected(exc, batch):
                self.fanout.abort(txn_id)
                self._position()  # rewind to the decision: the batch is read again, without the record
                return CycleResult(CycleOutcome.ABORTED, txn_id, error=exc, redo=True)
            return self._abort_cycle(txn_id, exc)

    def _poll(self, resuming: bool, incremental: bool, stream: bool) -> Batch:
        """The cycle's records. An ``incremental`` source (one that can tell it has read everything
        available) ends the flush then, once the cycle is ``commit_min_interval_s`` old (not at once: a
        trickle would make a transaction per record); with ``stream`` it hands them to the sinks as it
        reads them.

        ``resuming`` (right after a handoff): an incremental source ends the flush once it has read
        everything available and is :data:`RESUME_S` old, or holds a full batch - what is there, at
        once. Other sources flush for :data:`RESUME_S`. (A fixed short flush cut a backlog into a
        first transaction of whatever 0.1 s had read - 20,000 of 1M records, an extra small Iceberg
        snapshot and data file - while an idle topic or a trickle ends as soon either way.)"""
        s = self.settings
        if not incremental:
            return self.source.poll_batch(s.max_records, s.max_bytes, min(s.commit_interval_s, RESUME_S) if resuming
                                          else s.commit_interval_s)
        flush_s = s.commit_interval_s
        min_s = min(s.commit_min_interval_s, RESUME_S) if resuming else s.commit_min_interval_s
        # A caught-up batch of at least half a full one commits at once, however young: it makes no small
        # file, and the last part of a backlog does not wait out a long commit.interval.ms.
        fill = (max(1, s.max_records // 2), max(1, s.max_bytes // 2))
        if not stream:
            return self.source.poll_batch(s.max_records, s.max_bytes, flush_s,  # type: ignore[call-arg]
                                          min_s=min_s, min_fill=fill)
        # A sink that takes the records alone, untransformed, may have them decoded into its rows.
        only = self.fanout.sinks[0] if len(self.fanout.sinks) == 1 else None
        rows, native = getattr(only, "row_decoder", None), getattr(only, "native_row_target", None)
        return self.source.poll_batch(s.max_records, s.max_bytes, flush_s,  # type: ignore[call-arg]
                                      min_s=min_s, on_chunk=self.fanout.write, rows=rows, native=native, min_fill=fill)

    def _decide(self, txn_id: str, next_offsets: dict[TopicPartition, int]) -> CycleResult | None:
        """The single commit point. None when the txn is decided (the grants then hold the decision);
        otherwise the cycle's outcome, with the sinks aborted where the txn is known not to be decided."""
        t_decide = time.monotonic()
        try:
            new_grants = self.log.decide(self.connector, txn_id, next_offsets, self.grants)
        except PartitionsFenced as exc:
            return self._fenced(txn_id, exc)
        except CommitStateUnknownError as exc:
            settled = settle_unknown(self.log, self.connector, txn_id, next_offsets, self.grants,
                                     wait_s=self.settings.unknown_decision_wait_s, sleep=self.sleep)
            if settled.outcome is Settlement.CANNOT_TELL:
                self.logger.bind(txn=txn_id).error("decision_unknown_left_for_recovery", error=str(exc))
                self._drop(frozenset(self.grants))
                return CycleResult(CycleOutcome.FENCED, txn_id, error=exc)
            if settled.outcome is Settlement.NOT_DECIDED:
                if settled.overtaken:  # a newer epoch took the partitions while we were away: fenced
                    return self._fenced(txn_id, PartitionsFenced(self.connector, settled.overtaken),
                                        after="unknown outcome")
                return self._abort_cycle(txn_id, exc)
            new_grants = settled.grants
        except Exception as exc:  # noqa: BLE001 - refused before sending: nothing decided
            return self._abort_cycle(txn_id, exc)
        metrics.STEP_SECONDS.labels(self.connector, "decide").observe(time.monotonic() - t_decide)
        self.grants.update(new_grants)
        self._tolerance.decided(next_offsets)
        return None

    def _commit(self, txn_id: str, prepared: Prepared, started: float) -> CycleResult:
        """The decision stands: commit every sink, retrying in place; then the cycle is delivered."""
        batch = prepared.batch
        t_commit = time.monotonic()
        try:
            self.fanout.commit(txn_id)
        except FatalError as exc:
            self._fail(exc)
            metrics.CYCLES.labels(self.connector, CycleOutcome.FATAL.value).inc()
            return CycleResult(CycleOutcome.FATAL, txn_id, len(batch.records), batch.nbytes, error=exc)
        FAULTS.hit("after_commit")
        metrics.STEP_SECONDS.labels(self.connector, "commit").observe(time.monotonic() - t_commit)
        self.source.commit_offsets(prepared.next_offsets)
        for tp, c in prepared.counts.items():
            self.delivered[tp] = self.delivered.get(tp, 0) + c
        self.last_commit.update(dict.fromkeys(prepared.next_offsets, time.monotonic()))
        n, nbytes = len(prepared.records), batch.nbytes
        metrics.CYCLES.labels(self.connector, CycleOutcome.SUCCEEDED.value).inc()
        metrics.RECORDS.labels(self.connector).inc(n)
        metrics.BYTES.labels(self.connector).inc(nbytes)
        metrics.CYCLE_SECONDS.labels(self.connector).observe(time.monotonic() - started)
        self._backoff.reset()
        self.logger.bind(txn=txn_id).info("cycle_committed", records=n, bytes=nbytes,
                                           partitions=len(prepared.next_offsets))
        self._report_lag()
        if batch.error is not None:
            # Everything before the bad record is delivered; nothing at or after it is.
            self._fail(batch.error)
            return CycleResult(CycleOutcome.FATAL, txn_id, n, nbytes, error=batch.error)
        return CycleResult(CycleOutcome.SUCCEEDED, txn_id, n, nbytes)

    def _report_lag(self, every_s: float = 5.0, *, fresh: bool = False) -> None:
        """``fresh``: ask the broker (idle or paused: nothing is being fetched, so the watermark the
        last fetch carried is stale); otherwise use that cached watermark (no round trip in a cycle)."""
        now = time.monotonic()
        if now - self._lag_at < every_s:
            return
        self._lag_at = now
        self.lag = self.source.lag(fresh=fresh)

    # ------------------------------------------------------------------ when a cycle fails
    def _abort_cycle(self, txn_id: str, exc: BaseException) -> CycleResult:
        self.fanout.abort(txn_id)
        if outcome_of(exc) is Outcome.FATAL:
            self._fail(exc)
            metrics.CYCLES.labels(self.connector, CycleOutcome.FATAL.value).inc()
            return CycleResult(CycleOutcome.FATAL, txn_id, error=exc)
        self.logger.warning("cycle_aborted", txn=txn_id, error=str(exc), error_class=type(exc).__name__)
        metrics.CYCLES.labels(self.connector, CycleOutcome.ABORTED.value).inc()
        self._unrecovered |= set(self.grants)  # whatever blocked us may be an orphaned prepared txn
        self._position()
        return CycleResult(CycleOutcome.ABORTED, txn_id, error=exc)

    def _fenced(self, txn_id: str, exc: PartitionsFenced, **why: str) -> CycleResult:
        """A newer epoch holds some of the txn's partitions: abort it and let those partitions go."""
        metrics.FENCED.labels(self.connector).inc()
        self.logger.bind(txn=txn_id).warning("decision_fenced", partitions=sorted(map(str, exc.partitions)), **why)
        self.fanout.abort(txn_id)
        self._drop(exc.partitions)
        return CycleResult(CycleOutcome.FENCED, txn_id, error=exc)

    # ------------------------------------------------------------------ the txn id
    def next_txn_id(self) -> str:
        """``connector.worker.generation.counter``: stable, unique, and never reset on restart.

        The generation is a fresh ZooKeeper sequence number at every acquisition, plus a random
        suffix: the sequence is unique only within one cluster's ZooKeeper path, while the sinks
        (a PostgreSQL database, a bucket) may be shared by several clusters that register the
        same connector name - a repeated id would look "already committed" there."""
        if self._generation is None:
            self._generation = f"{self.log.new_generation(self.connector)}-{secrets.token_hex(3)}"
            self._counter = 0
        self._counter += 1
        return f"{self.connector}.{self.worker_id}.{self._generation}.{self._counter}"
