"""The commit cycle of one connector on one worker: begin, flush, prepare, decide, commit.

State of a task (transitions in the spirit of kazoo's ``SetPartitioner``)::

    UNASSIGNED --assign(partitions)--> RECOVERING --all new partitions resolved--> RUNNING
    RUNNING --cycle fenced on some partitions--> RUNNING with the rest (UNASSIGNED if none left)
    RUNNING --new partitions--> RECOVERING --> RUNNING
    RECOVERING/RUNNING --fatal outcome or bad record--> FAILED        (operator restarts it)
    any --stop()--> STOPPED                         (partitions released for a prompt handoff)

Outcomes of a cycle follow the failure table of ARCHITECTURE.md:

=================================  ==========  =============================================
fails at                           outcome     what happens
=================================  ==========  =============================================
begin / flush / prepare            ABORTED     abort every sink, rewind to the decision, retry
decide: a compare-and-set failed   FENCED      abort, drop those partitions
decide: refused before sending     ABORTED     abort; retry when connected
decide: outcome unknown            (resolved)  read the log once reconnected: txn named ->
                                               commit, else abort; session lost -> leave it
                                               prepared for the next owner's recovery
commit                             FATAL       after retries in place; the decision stands and
                                               recovery (restart or next owner) commits it
=================================  ==========  =============================================

Recovery runs on every newly acquired partition after the epoch bump and before consuming:
a prepared txn named in the decision log is committed, one that a newer epoch has fenced is
aborted, anything else is left and reported, and its partitions are not consumed.
"""

from __future__ import annotations

import enum
import itertools
import operator
import random
import secrets
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from eosink.connectors.api.errors import (
    CommitStateUnknownError,
    EosinkError,
    FatalError,
    FencedError,
    Outcome,
    RecordError,
    RetryableError,
    outcome_of,
)
from eosink.connectors.api.records import PartitionRange, SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine.decision import DecisionLog, Grant, PartitionsFenced
from eosink.worker.engine.faults import FAULTS
from eosink.worker.logging import get_logger
from eosink.worker.engine.source import Batch, FailedRecord, RecordSource, gc_paused

log = get_logger("eosink.worker.engine.task")


class TaskState(str, enum.Enum):
    UNASSIGNED = "UNASSIGNED"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class CycleOutcome(str, enum.Enum):
    SUCCEEDED = "succeeded"
    EMPTY = "empty"
    ABORTED = "aborted"
    FENCED = "fenced"
    FATAL = "fatal"


@dataclass
class CycleResult:
    outcome: CycleOutcome
    txn_id: str | None = None
    records: int = 0
    nbytes: int = 0
    error: BaseException | None = None
    #: A sink rejected a record under errors.tolerance=all: redo the cycle at once without it.
    redo: bool = False


@dataclass
class TaskSettings:
    commit_interval_s: float = 1.0
    max_records: int = 200_000
    max_bytes: int = 64 * 1024 * 1024
    commit_retries: int = 8
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 10.0
    #: How long to wait for ZooKeeper to come back before leaving an unknown decision to recovery.
    unknown_decision_wait_s: float = 30.0
    #: Re-run recovery over the held partitions this often (and after every aborted cycle), so a
    #: txn a zombie prepared after our recovery, then failed to abort, is found and aborted.
    recovery_interval_s: float = 60.0
    #: ``errors.tolerance=all``: a bad record goes to the dead-letter sink and the partition moves on.
    tolerate_errors: bool = False
    #: ``errors.log.enable`` / ``errors.log.include.messages``.
    log_errors: bool = False
    log_error_messages: bool = False
    #: ``errors.retry.timeout``: a task whose cycles keep failing with retryable errors this long
    #: fails (the reason in its status); negative = retry forever.
    retry_timeout_s: float = -1.0


@dataclass
class Unresolved:
    """A prepared txn recovery could not decide: reported, and its partitions are held back."""

    txn_id: str
    partitions: frozenset[TopicPartition]
    reason: str


@dataclass
class TaskStatus:
    state: TaskState
    partitions: list[str] = field(default_factory=list)
    trace: str | None = None
    unresolved: list[Unresolved] = field(default_factory=list)
    #: Records delivered per partition since this task acquired it, and the last measured lag.
    delivered: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    paused: bool = False


class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.attempt = initial, maximum, 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


_topic_partition = operator.attrgetter("topic", "partition")


def _ranges(records: Sequence[SinkRecord], grants: dict[TopicPartition, Grant],
            failed: Sequence[FailedRecord] = ()) -> tuple[tuple[PartitionRange, ...], dict[TopicPartition, int]]:
    """The txn's range per partition - over the bad records too, so the decision moves past them -
    and how many good records each partition delivers.

    A poll hands over each partition's records in runs of a fetch response each (thousands), in
    offset order: ``groupby`` walks them in C, so this costs a few Python steps per run, not per record.
    """
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    count: dict[tuple[str, int], int] = {}
    for k, group in itertools.groupby(records, _topic_partition):
        run = list(group)
        c = count.get(k)
        if c is None:
            first[k] = run[0].offset
            count[k] = len(run)
        else:
            count[k] = c + len(run)
        last[k] = run[-1].offset
    for f in failed:
        k = (f.topic, f.partition)
        first[k] = min(first.get(k, f.offset), f.offset)
        last[k] = max(last.get(k, f.offset), f.offset)
    ranges = tuple(PartitionRange(t, p, first[(t, p)], last[(t, p)], grants[TopicPartition(t, p)].epoch) for t, p in sorted(first))
    return ranges, {TopicPartition(t, p): n for (t, p), n in count.items()}


class SinkTask:
    """Runs commit cycles for one connector over the partitions this worker holds."""

    def __init__(
        self,
        connector: str,
        worker_id: str,
        sinks: Sequence[TwoPhaseCommitSink],
        source: RecordSource,
        decision_log: DecisionLog,
        settings: TaskSettings | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        on_fenced: Callable[[frozenset[TopicPartition]], None] | None = None,
        on_change: Callable[[], None] | None = None,
        dead_letter: TwoPhaseCommitSink | None = None,
    ) -> None:
        self.connector = connector
        self.worker_id = worker_id
        self.sinks = list(sinks)
        #: errors.tolerance=all: the last sink, with ``report(failed)`` (see eosink.worker.engine.deadletter).
        self.dead_letter = dead_letter
        if dead_letter is not None:
            self.sinks.append(dead_letter)
        #: Records a sink rejected, by (topic, partition, offset): routed to the dead-letter sink when met again.
        self._poison: dict[tuple[str, int, int], RecordError] = {}
        self.paused = False
        self.delivered: dict[TopicPartition, int] = {}
        self.lag: dict[TopicPartition, int] = {}
        self._failing_since: float | None = None
        self.source = source
        self.log = decision_log
        self.settings = settings or TaskSettings()
        self.sleep = sleep
        self.on_fenced = on_fenced
        #: Called (from the task thread) when partitions or state change, so the worker publishes
        #: the new status at once instead of at its next poll.
        self.on_change = on_change
        self.state = TaskState.UNASSIGNED
        self.trace: str | None = None
        self.grants: dict[TopicPartition, Grant] = {}
        self._unrecovered: set[TopicPartition] = set()
        self.unresolved: dict[str, Unresolved] = {}
        self._abort_pending: list[str] = []
        self._generation: str | None = None
        self._counter = 0
        self._backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        self._lock = threading.RLock()
        self._desired: set[TopicPartition] | None = None
        self._lag_at = 0.0
        self._resuming_until = 0.0
        self._recovered_at = time.monotonic()
        self.logger = structlog.get_logger("eosink.worker.engine.task").bind(connector=connector, worker=worker_id)

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        for sink in self.sinks:
            sink.open()

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                self.logger.warning("sink_close_failed", sink=type(sink).__name__, error=str(exc))
        self.source.close()

    def status(self) -> TaskStatus:
        """A snapshot, without the cycle lock: the worker's loop calls this every round and must
        not wait for the cycle in flight (up to ``commit.interval.ms``) to end. ``list(dict)`` and
        ``dict.copy()`` are atomic under the GIL, so the copies are consistent per field."""
        grants = list(self.grants)
        delivered, lag = self.delivered.copy(), self.lag.copy()
        return TaskStatus(self.state, sorted(str(tp) for tp in grants), self.trace, list(self.unresolved.values()),
                          {str(tp): delivered.get(tp, 0) for tp in grants},
                          {str(tp): n for tp, n in lag.items() if tp in grants}, self.paused)

    def _fail(self, exc: BaseException) -> None:
        self.state = TaskState.FAILED
        self.trace = "".join(traceback.format_exception_only(type(exc), exc)).strip() if isinstance(exc, EosinkError) else "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
        metrics.TASK_FAILED.labels(self.connector).set(1)
        if self.on_change is not None:
            self.on_change()
        self.logger.error("task_failed", error=str(exc), error_class=type(exc).__name__)

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

    # ------------------------------------------------------------------ assignment + recovery
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Hold exactly ``partitions``: release what is gone, acquire (epoch bump) and recover what is new."""
        wanted = set(partitions)
        with self._lock:
            gone = {tp: g for tp, g in self.grants.items() if tp not in wanted}
            if gone:
                self.log.release(self.connector, gone)
                for tp in gone:
                    self.grants.pop(tp)
                    self._unrecovered.discard(tp)
                    self.delivered.pop(tp, None)
                self._poison = {k: v for k, v in self._poison.items() if (k[0], k[1]) in wanted}
            new = wanted - set(self.grants)
            if new:
                self.grants.update(self.log.acquire(self.connector, new))
                self._generation = None  # a new generation for txns after every acquisition
                self._resuming_until = time.monotonic() + self.settings.commit_interval_s
                self._unrecovered |= new
                self.logger.info("partitions_acquired", partitions=sorted(str(tp) for tp in new),
                                 epochs={str(tp): self.grants[tp].epoch for tp in new})
            if self.state in (TaskState.UNASSIGNED, TaskState.RUNNING, TaskState.RECOVERING):
                self.state = TaskState.RECOVERING if self._unrecovered else (TaskState.RUNNING if self.grants else TaskState.UNASSIGNED)
            if self.state is not TaskState.FAILED:
                self._recover_pending()
                self._position()

    def _position(self) -> None:
        active = self.active_partitions()
        self.source.assign({tp: self.grants[tp].next_offset for tp in active})

    def active_partitions(self) -> list[TopicPartition]:
        blocked = {tp for u in self.unresolved.values() for tp in u.partitions}
        return sorted(tp for tp in self.grants if tp not in self._unrecovered and tp not in blocked)

    def _recover_pending(self) -> bool:
        """Recover newly acquired partitions; True when all are resolved (or reported)."""
        if not self._unrecovered:
            return True
        FAULTS.hit("recover")
        targets = set(self._unrecovered)
        try:
            found: dict[str, tuple[TxnManifest, list[TwoPhaseCommitSink]]] = {}
            for sink in self.sinks:
                for m in sink.recover():
                    if m.partitions & targets or not m.ranges:
                        found.setdefault(m.txn_id, (m, []))[1].append(sink)
            for txn_id, (m, holders) in sorted(found.items()):
                self._resolve(m, holders, targets)
        except Exception as exc:  # noqa: BLE001 - classified below
            if outcome_of(exc) is Outcome.FATAL:
                self._fail(exc)
            else:
                self.logger.warning("recovery_retry", error=str(exc))
            return False
        self._unrecovered -= targets
        self._recovered_at = time.monotonic()
        metrics.UNRESOLVED.labels(self.connector).set(len(self.unresolved))
        if not self._unrecovered and self.state is TaskState.RECOVERING:
            self.state = TaskState.RUNNING if self.grants else TaskState.UNASSIGNED
        return True

    def _resolve(self, m: TxnManifest, holders: list[TwoPhaseCommitSink], targets: set[TopicPartition]) -> None:
        lg = self.logger.bind(txn=m.txn_id)
        if not m.ranges:
            self._report(m.txn_id, frozenset(targets), "prepared txn without a manifest: cannot tell which partitions it covers")
            return
        entries = self.log.read(self.connector, m.partitions)
        if any(e.txn == m.txn_id for e in entries.values()):
            for sink in holders:
                sink.recover_and_commit(m)
            metrics.RECOVERED.labels(self.connector, "commit").inc()
            lg.info("recovered_commit", reason="decision log names the txn")
            self.unresolved.pop(m.txn_id, None)
            return
        fenced_by_us = [tp for tp in m.partitions & set(self.grants) if (m.epoch_of(tp) or 0) < self.grants[tp].epoch]
        if fenced_by_us:
            for sink in holders:
                sink.recover_and_abort(m)
            metrics.RECOVERED.labels(self.connector, "abort").inc()
            lg.info("recovered_abort", reason="not decided, and its epoch is fenced", partitions=[str(tp) for tp in fenced_by_us])
            self.unresolved.pop(m.txn_id, None)
            return
        self._report(m.txn_id, m.partitions & targets, "not in the decision log and not fenced by this worker's epoch")

    def _report(self, txn_id: str, partitions: frozenset[TopicPartition], reason: str) -> None:
        self.unresolved[txn_id] = Unresolved(txn_id, partitions, reason)
        self.logger.error("prepared_txn_unresolved", txn=txn_id, partitions=sorted(map(str, partitions)), reason=reason)

    # ------------------------------------------------------------------ the cycle
    def run_cycle(self) -> CycleResult:
        with self._lock:
            if self.state is TaskState.FAILED or self.state is TaskState.STOPPED or self.paused:
                return CycleResult(CycleOutcome.EMPTY)
            if self._abort_pending and not self._retry_aborts():
                return CycleResult(CycleOutcome.ABORTED)
            if time.monotonic() - self._recovered_at > self.settings.recovery_interval_s:
                self._unrecovered |= set(self.grants)
            if self._unrecovered:
                if not self._recover_pending():
                    return CycleResult(CycleOutcome.ABORTED)
                self._position()
            if not self.active_partitions():
                return CycleResult(CycleOutcome.EMPTY)
            with gc_paused():  # a batch is born and dies within its cycle: no collector pass over it
                result = self._cycle()
                while result.redo:  # one more rejected record is known now: deliver the rest without it
                    result = self._cycle()
            return result

    def _cycle(self) -> CycleResult:
        s = self.settings
        started = time.monotonic()
        txn_id = self.next_txn_id()
        lg = self.logger.bind(txn=txn_id)
        FAULTS.hit("begin")
        batch: Batch | None = None
        # -- begin + flush ------------------------------------------------------------------
        try:
            for sink in self.sinks:
                sink.begin_transaction(txn_id)
            # Right after a handoff, flush what is there at once (in short flushes until the first
            # records arrive, for at most one interval): the new owner resumes promptly.
            resuming = time.monotonic() < self._resuming_until
            flush_s = min(s.commit_interval_s, 0.1) if resuming else s.commit_interval_s
            batch = self.source.poll_batch(s.max_records, s.max_bytes, flush_s)
            if batch.records:
                self._resuming_until = 0.0
            FAULTS.hit("flush")
            records, failed = self._split(batch)
            if not records and not failed:
                if batch.error is not None:
                    self._fail(batch.error)
                    return CycleResult(CycleOutcome.FATAL, txn_id, error=batch.error)
                return CycleResult(CycleOutcome.EMPTY, txn_id)
            ranges, counts = _ranges(records, self.grants, failed)
            self._check_not_behind(ranges)
            for sink in self.sinks:
                sink.write(records)
            if failed:
                self._tolerate(failed, txn_id)
            # -- prepare ------------------------------------------------------------------------
            manifest = TxnManifest(txn_id, self.connector, ranges)
            t_prepare = time.monotonic()
            for i, sink in enumerate(self.sinks):
                sink.pre_commit(manifest)
                if i == 0:
                    FAULTS.hit("pre_commit")  # one sink prepared, the others not yet
            metrics.STEP_SECONDS.labels(self.connector, "prepare").observe(time.monotonic() - t_prepare)
        except Exception as exc:  # noqa: BLE001 - every failure before the decision aborts
            if batch is not None and self._rejected(exc, batch):
                self._abort_sinks(txn_id)
                self._position()  # rewind to the decision: the batch is read again, without the record
                return CycleResult(CycleOutcome.ABORTED, txn_id, error=exc, redo=True)
            return self._abort_cycle(txn_id, exc)
        FAULTS.hit("after_prepare")
        # -- decide: the single commit point ------------------------------------------------
        next_offsets = {r.tp: r.next_offset for r in manifest.ranges}
        t_decide = time.monotonic()
        try:
            new_grants = self.log.decide(self.connector, txn_id, next_offsets, self.grants)
        except PartitionsFenced as exc:
            metrics.FENCED.labels(self.connector).inc()
            lg.warning("decision_fenced", partitions=sorted(map(str, exc.partitions)))
            self._abort_sinks(txn_id)
            self._drop(exc.partitions)
            return CycleResult(CycleOutcome.FENCED, txn_id, error=exc)
        except CommitStateUnknownError as exc:
            decided = self._resolve_unknown(txn_id, next_offsets)
            if decided is None:
                lg.error("decision_unknown_left_for_recovery", error=str(exc))
                self._drop(frozenset(self.grants))
                return CycleResult(CycleOutcome.FENCED, txn_id, error=exc)
            if not decided:
                overtaken = self._overtaken(next_offsets)
                if overtaken:  # a newer epoch took the partitions while we were away: fenced
                    metrics.FENCED.labels(self.connector).inc()
                    lg.warning("decision_fenced", partitions=sorted(map(str, overtaken)), after="unknown outcome")
                    self._abort_sinks(txn_id)
                    self._drop(overtaken)
                    return CycleResult(CycleOutcome.FENCED, txn_id, error=PartitionsFenced(self.connector, overtaken))
                return self._abort_cycle(txn_id, exc)
            # A set_data bumps the entry's version by exactly one: our write is the one that landed.
            new_grants = {tp: Grant(tp, self.grants[tp].epoch, off, txn_id, self.grants[tp].version + 1) for tp, off in next_offsets.items()}
        except Exception as exc:  # noqa: BLE001 - refused before sending: nothing decided
            return self._abort_cycle(txn_id, exc)
        metrics.STEP_SECONDS.labels(self.connector, "decide").observe(time.monotonic() - t_decide)
        self.grants.update(new_grants)
        if self._poison:
            self._poison = {k: v for k, v in self._poison.items() if k[2] >= next_offsets.get(TopicPartition(k[0], k[1]), -1)}
        FAULTS.hit("after_decide")
        # -- commit: the decision stands; retry in place ----------------------------------------
        t_commit = time.monotonic()
        for i, sink in enumerate(self.sinks):
            if not self._commit_with_retries(sink, txn_id):
                return CycleResult(CycleOutcome.FATAL, txn_id, len(batch.records), batch.nbytes, error=RuntimeError(self.trace))
            if i == 0:
                FAULTS.hit("mid_commit")
        FAULTS.hit("after_commit")
        metrics.STEP_SECONDS.labels(self.connector, "commit").observe(time.monotonic() - t_commit)
        self.source.commit_offsets(next_offsets)
        # -- done ---------------------------------------------------------------------------
        for tp, c in counts.items():
            self.delivered[tp] = self.delivered.get(tp, 0) + c
        n, nbytes = len(records), batch.nbytes
        metrics.CYCLES.labels(self.connector, CycleOutcome.SUCCEEDED.value).inc()
        metrics.RECORDS.labels(self.connector).inc(n)
        metrics.BYTES.labels(self.connector).inc(nbytes)
        metrics.CYCLE_SECONDS.labels(self.connector).observe(time.monotonic() - started)
        self._backoff.reset()
        lg.info("cycle_committed", records=n, bytes=nbytes, partitions=len(next_offsets))
        self._report_lag()
        if batch.error is not None:
            # Everything before the bad record is delivered; nothing at or after it is.
            self._fail(batch.error)
            return CycleResult(CycleOutcome.FATAL, txn_id, n, nbytes, error=batch.error)
        return CycleResult(CycleOutcome.SUCCEEDED, txn_id, n, nbytes)

    def _check_not_behind(self, ranges: Sequence[PartitionRange]) -> None:
        """Refuse a batch that starts before what the decision log already holds for a partition.

        The decision's compare-and-set fences other owners, not this one: if the consumer ever
        handed over records this owner has already decided, deciding them again would deliver
        them twice. It happened once in a rolling-restart test: after an assignment change the
        consumer served a partition again from its first assignment's logical offset
        (OFFSET_BEGINNING) instead of the offset just assigned. Aborting repositions the consumer
        at the decision (``_position``) and the cycle reads on from there."""
        for r in ranges:
            decided = self.grants[r.tp].next_offset
            if decided is not None and r.first_offset < decided:
                metrics.STALE_BATCHES.labels(self.connector).inc()
                raise RetryableError(f"the consumer went back on {r.tp}: it handed over offset {r.first_offset}, but the "
                                     f"decision log already holds everything before {decided}; repositioning at the decision",
                                     component="kafka-consumer")

    def _split(self, batch: Batch) -> tuple[list[SinkRecord], list[FailedRecord]]:
        """The records for the sinks, and the bad ones: undecodable, or rejected by a sink before."""
        if not self._poison:
            return batch.records, batch.failed
        poison = self._poison
        records, failed = [], list(batch.failed)
        for r in batch.records:
            error = poison.get((r.topic, r.partition, r.offset))
            if error is None:
                records.append(r)
            else:
                failed.append(FailedRecord.of(r, error))
        return records, failed

    def _rejected(self, exc: BaseException, batch: Batch) -> bool:
        """Under errors.tolerance=all: is ``exc`` a sink rejecting one record of this batch? Then it is
        remembered as poison (the redone cycle routes it to the dead-letter sink) and True."""
        if not (self.settings.tolerate_errors and self.dead_letter is not None and isinstance(exc, RecordError)):
            return False
        key = (exc.topic, exc.partition, exc.offset)
        if key in self._poison or not any((r.topic, r.partition, r.offset) == key for r in batch.records):
            return False  # not a record of this batch (or rejected again after routing it): fail as before
        self._poison[key] = exc
        self.logger.warning("record_rejected_by_sink", topic=exc.topic, partition=exc.partition, offset=exc.offset,
                            error=str(exc), action="redo the cycle without it; it goes to the dead-letter topic")
        return True

    def _tolerate(self, failed: list[FailedRecord], txn_id: str) -> None:
        """Hand the cycle's bad records to the dead-letter sink (errors.tolerance=all), or fail the cycle."""
        if self.dead_letter is None or not self.settings.tolerate_errors:
            raise failed[0].error  # cannot happen with a valid config: tolerance=all requires a dead-letter topic
        self.dead_letter.report(failed)  # type: ignore[attr-defined]
        for f in failed:
            metrics.TOLERATED.labels(self.connector, f.stage).inc()
            if self.settings.log_errors:
                extra = {"key": f.key, "value": f.value} if self.settings.log_error_messages else {}
                self.logger.warning("record_tolerated", txn=txn_id, topic=f.topic, partition=f.partition, offset=f.offset,
                                    epoch=self.grants[TopicPartition(f.topic, f.partition)].epoch, stage=f.stage,
                                    error_class=type(f.error).__name__, error=str(f.error), **extra)

    def _report_lag(self, every_s: float = 5.0, *, fresh: bool = False) -> None:
        """``fresh``: ask the broker (idle or paused: nothing is being fetched, so the watermark the
        last fetch carried is stale); otherwise use that cached watermark (no round trip in a cycle)."""
        now = time.monotonic()
        if now - self._lag_at < every_s:
            return
        self._lag_at = now
        self.lag = self.source.lag(fresh=fresh)
        for tp, lag in self.lag.items():
            metrics.LAG.labels(self.connector, tp.topic, str(tp.partition)).set(lag)

    def _abort_cycle(self, txn_id: str, exc: BaseException) -> CycleResult:
        self._abort_sinks(txn_id)
        if outcome_of(exc) is Outcome.FATAL:
            self._fail(exc)
            metrics.CYCLES.labels(self.connector, CycleOutcome.FATAL.value).inc()
            return CycleResult(CycleOutcome.FATAL, txn_id, error=exc)
        self.logger.warning("cycle_aborted", txn=txn_id, error=str(exc), error_class=type(exc).__name__)
        metrics.CYCLES.labels(self.connector, CycleOutcome.ABORTED.value).inc()
        self._unrecovered |= set(self.grants)  # whatever blocked us may be an orphaned prepared txn
        self._position()
        return CycleResult(CycleOutcome.ABORTED, txn_id, error=exc)

    def _abort_sinks(self, txn_id: str) -> None:
        """Abort on every sink (abort is idempotent); remember failures and retry them first."""
        for sink in self.sinks:
            try:
                sink.abort(txn_id)
            except Exception as exc:  # noqa: BLE001 - retried before the next cycle
                self.logger.warning("abort_failed", txn=txn_id, sink=type(sink).__name__, error=str(exc))
                if txn_id not in self._abort_pending:
                    self._abort_pending.append(txn_id)

    def _retry_aborts(self) -> bool:
        pending, self._abort_pending = self._abort_pending, []
        for txn_id in pending:
            self._abort_sinks(txn_id)
        return not self._abort_pending

    def _commit_with_retries(self, sink: TwoPhaseCommitSink, txn_id: str) -> bool:
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        for attempt in range(self.settings.commit_retries + 1):
            try:
                sink.commit(txn_id)
                return True
            except Exception as exc:  # noqa: BLE001 - classified
                if outcome_of(exc) is Outcome.FATAL or attempt == self.settings.commit_retries:
                    self._fail(FatalError(
                        f"commit of decided txn {txn_id} failed on {type(sink).__name__}: {exc}; "
                        "the decision stands: recovery commits it on restart or by the next owner",
                        component=type(sink).__name__,
                    ))
                    metrics.CYCLES.labels(self.connector, CycleOutcome.FATAL.value).inc()
                    return False
                self.logger.warning("commit_retry", txn=txn_id, attempt=attempt + 1, error=str(exc))
                self.sleep(backoff.next())
        return False

    def _resolve_unknown(self, txn_id: str, next_offsets: dict[TopicPartition, int]) -> bool | None:
        """Read the decision log once reconnected: True decided, False not, None cannot tell in time."""
        deadline = time.monotonic() + self.settings.unknown_decision_wait_s
        while time.monotonic() < deadline:
            try:
                entries = self.log.read(self.connector, next_offsets)
            except Exception:  # noqa: BLE001 - not reconnected yet
                self.sleep(0.2)
                continue
            if all(e.txn == txn_id for e in entries.values()):
                return True
            return False
        return None

    def _overtaken(self, partitions: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
        try:
            entries = self.log.read(self.connector, partitions)
        except Exception:  # noqa: BLE001 - cannot tell: not fenced as far as we know
            return frozenset()
        return frozenset(tp for tp, e in entries.items() if e.epoch > self.grants[tp].epoch)

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        dropped = frozenset(partitions)
        for tp in dropped:
            self.grants.pop(tp, None)
            self._unrecovered.discard(tp)
        self._position()
        if not self.grants and self.state is not TaskState.FAILED:
            self.state = TaskState.UNASSIGNED
        if self.on_fenced is not None:
            self.on_fenced(dropped)

    # ------------------------------------------------------------------ loop
    def request_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """Thread-safe: the task thread applies it right after the flush in progress, which it
        cuts short (the consumer is not thread-safe, so only the task thread touches it)."""
        wanted = set(partitions)
        if wanted != set(self.grants) or self._desired is not None:
            self._desired = wanted
            self.interrupt()

    def interrupt(self) -> None:
        """End the flush in progress early: the cycle commits what it has (stop, handoff)."""
        wake = getattr(self.source, "interrupt", None)
        if wake is not None:
            wake.set()

    def run(self, stop: threading.Event) -> None:
        """Cycle until ``stop`` is set; the cycle in flight completes first (graceful SIGTERM)."""
        structlog.contextvars.bind_contextvars(connector=self.connector)
        wake = getattr(self.source, "interrupt", None)
        while not stop.is_set():
            if wake is not None:
                wake.clear()
            try:
                desired, self._desired = self._desired, None
                if desired is not None and self.state is not TaskState.FAILED:
                    self.assign(desired)
                    if self.on_change is not None:
                        self.on_change()
                result = self.run_cycle()
            except Exception as exc:  # noqa: BLE001 - a bug or an unexpected failure: fail loudly
                self._fail(exc)
                result = CycleResult(CycleOutcome.FATAL, error=exc)
            self._check_retry_timeout(result)
            if result.outcome is CycleOutcome.EMPTY and self.state is TaskState.RUNNING:
                self._report_lag(fresh=True)  # idle or paused: keep the lag in /status current (at most every 5 s)
            if result.outcome is CycleOutcome.ABORTED and self.state is not TaskState.FAILED:
                stop.wait(self._backoff.next())
            elif result.outcome is CycleOutcome.EMPTY and (self.state is not TaskState.RUNNING or not self.active_partitions()):
                stop.wait(min(0.5, self.settings.commit_interval_s))
            elif self.state is TaskState.FAILED:
                stop.wait(0.5)
        self.shutdown()

    def _check_retry_timeout(self, result: CycleResult) -> None:
        """errors.retry.timeout: fail the task once cycles have kept aborting on retryable errors that long.

        Fencing and a ZooKeeper that is away are not the sink's errors and never count."""
        if result.outcome is not CycleOutcome.ABORTED or result.redo:
            if result.outcome in (CycleOutcome.SUCCEEDED, CycleOutcome.EMPTY):
                self._failing_since = None
            return
        exc = result.error
        if isinstance(exc, FencedError) or getattr(exc, "component", None) in ("decision-log", "zookeeper"):
            return
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        timeout = self.settings.retry_timeout_s
        if timeout >= 0 and now - self._failing_since >= timeout:
            with self._lock:
                self._fail(FatalError(f"gave up after retrying for {now - self._failing_since:.1f} s "
                                      f"(errors.retry.timeout={int(timeout * 1000)} ms); last error: {exc}",
                                      component=getattr(exc, "component", None)))

    def shutdown(self) -> None:
        with self._lock:
            if self._abort_pending:
                self._retry_aborts()
            if self.grants and self.state is not TaskState.FAILED:
                self.log.release(self.connector, self.grants)
            self.grants.clear()
            self.state = TaskState.STOPPED
