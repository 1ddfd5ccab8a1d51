"""What a task tolerates under ``errors.*``: bad records, and cycles that keep failing.

**errors.tolerance** - which records are bad, and where they go.

A bad record is one the source could not decode, one a transform failed on (stage
``TRANSFORMATION``), or one a sink rejected (a :class:`RecordError` naming its topic, partition
and offset). Without ``errors.tolerance=all`` it fails the task at
that record (the source or the cycle raises it). With it, the record goes to the dead-letter sink
*in the same cycle* as the good records around it, so it is reported exactly once, and the
partition moves on. A record a sink rejects part way through a cycle cannot be taken out of that
cycle, so it is remembered here as poison, the cycle is aborted and redone, and the redone cycle
routes it to the dead-letter sink (see ``eosink.worker.engine.deadletter``).

**errors.retry.timeout** - how long a task retries cycles that abort on retryable errors
before it fails with the last error as its reason, instead of retrying quietly forever.

Both are policy over the cycle's outcomes, with memory across cycles; keeping them here keeps
``cycle.py`` about the cycle itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from eosink.connectors.api.errors import (
    CommitStateUnknownError,
    CoordinatorUnavailableError,
    FatalError,
    FencedError,
    RecordError,
)
from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine.batch import Batch, FailedRecord
from eosink.worker.engine.decision import Grant
from eosink.worker.engine.types import CycleOutcome, CycleResult, TaskSettings
from eosink.worker.transforms import STAGE, TransformChain, TransformError


class Tolerance:
    """One task's bad records: those sinks rejected (poison), and the reporting of every bad one."""

    def __init__(self, connector: str, settings: TaskSettings, dead_letter: TwoPhaseCommitSink | None,
                 logger: Any) -> None:
        self.connector = connector
        self.settings = settings
        #: errors.tolerance=all: the last sink, with ``report(failed)`` (see eosink.worker.engine.deadletter).
        self.dead_letter = dead_letter
        self.logger = logger
        #: Records a sink rejected, by (topic, partition, offset): routed to the dead-letter sink when met again.
        self.poison: dict[tuple[str, int, int], RecordError] = {}

    def split(self, batch: Batch) -> tuple[list[SinkRecord], list[FailedRecord]]:
        """The records for the sinks, and the bad ones: undecodable, or rejected by a sink before."""
        if not self.poison:
            return batch.records, batch.failed
        poison = self.poison
        records: list[SinkRecord] = []
        failed = list(batch.failed)
        for r in batch.records:
            error = poison.get((r.topic, r.partition, r.offset))
            if error is None:
                records.append(r)
            else:
                failed.append(FailedRecord.of(r, error))
        return records, failed

    def transform(self, chain: TransformChain, records: list[SinkRecord],
                  failed: list[FailedRecord], *, owned: bool = False) -> list[SinkRecord]:
        """``records`` through the connector's transforms. A record a stage drops is left out (its
        offset is still covered by the txn's ranges); one a stage fails on goes to ``failed`` under
        errors.tolerance=all, and otherwise fails the cycle naming the record and the stage. ``owned``:
        nothing else reads the records' values (a fresh batch), which the chain may then edit in place."""
        tolerate = self.settings.tolerate_errors and self.dead_letter is not None
        out: list[SinkRecord] = []
        append, apply = out.append, chain.runner(owned=owned)
        for r in records:
            try:
                t = apply(r)
            except TransformError as exc:
                if not tolerate:
                    raise
                failed.append(FailedRecord.of(r, exc, stage=STAGE))
                continue
            if t is not None:
                append(t)
        return out

    def rejected(self, exc: BaseException, batch: Batch) -> bool:
        """Under errors.tolerance=all: is ``exc`` a sink rejecting one record of this batch? Then it is
        remembered as poison (the redone cycle routes it to the dead-letter sink) and True."""
        if not (self.settings.tolerate_errors and self.dead_letter is not None and isinstance(exc, RecordError)):
            return False
        key = (exc.topic, exc.partition, exc.offset)
        if key in self.poison or not any((r.topic, r.partition, r.offset) == key for r in batch.records):
            return False  # not a record of this batch (or rejected again after routing it): fail as before
        self.poison[key] = exc
        self.logger.warning("record_rejected_by_sink", topic=exc.topic, partition=exc.partition, offset=exc.offset,
                            error=str(exc), action="redo the cycle without it; it goes to the dead-letter topic")
        return True

    def report(self, failed: list[FailedRecord], txn_id: str, grants: Mapping[TopicPartition, Grant]) -> None:
        """Hand the cycle's bad records to the dead-letter sink (errors.tolerance=all), or fail the cycle."""
        if self.dead_letter is None or not self.settings.tolerate_errors:
            raise failed[0].error  # cannot happen with a valid config: tolerance=all requires a dead-letter topic
        self.dead_letter.report(failed)  # type: ignore[attr-defined]
        for f in failed:
            metrics.TOLERATED.labels(self.connector, f.stage).inc()
            if self.settings.log_errors:
                extra = {"key": f.key, "value": f.value} if self.settings.log_error_messages else {}
                self.logger.warning("record_tolerated", txn=txn_id, topic=f.topic, partition=f.partition,
                                    offset=f.offset, epoch=grants[TopicPartition(f.topic, f.partition)].epoch,
                                    stage=f.stage, error_class=type(f.error).__name__, error=str(f.error), **extra)

    def keep_only(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget the poison of partitions the task no longer holds (their next owner meets it afresh)."""
        if self.poison:
            held = set(partitions)
            self.poison = {k: v for k, v in self.poison.items() if (k[0], k[1]) in held}

    def decided(self, next_offsets: Mapping[TopicPartition, int]) -> None:
        """Forget the poison a decision has moved past: those records are never read again."""
        if self.poison:
            self.poison = {k: v for k, v in self.poison.items()
                           if k[2] >= next_offsets.get(TopicPartition(k[0], k[1]), -1)}


class RetryTimeout:
    """errors.retry.timeout: give up once cycles have kept aborting on retryable errors that long.

    Fencing and a ZooKeeper that is away are not the sink's errors and never count."""

    def __init__(self, timeout_s: float) -> None:
        #: Negative: retry forever.
        self.timeout_s = timeout_s
        self.failing_since: float | None = None
        #: The last error of the cycles failing in a row, and since when (any cause, for /status).
        self.last_error: BaseException | None = None
        self.shown_since: float | None = None

    def retrying(self, exc: BaseException) -> None:
        """A retry inside a cycle (a decided commit): shown in /status like a failed cycle's error."""
        self.last_error = exc
        if self.shown_since is None:
            self.shown_since = time.monotonic()

    def describe(self) -> str | None:
        """``<error> (retrying for N s)`` while cycles keep failing, else None (for /status)."""
        since, exc = self.shown_since, self.last_error
        if since is None or exc is None:
            return None
        return f"{exc} (retrying for {time.monotonic() - since:.0f} s)"

    def gave_up(self, result: CycleResult) -> FatalError | None:
        """The error to fail the task with, once the timeout has run out; None while it has not."""
        if result.outcome is not CycleOutcome.ABORTED or result.redo:
            if result.outcome in (CycleOutcome.SUCCEEDED, CycleOutcome.EMPTY):
                self.failing_since = self.shown_since = self.last_error = None
            return None
        exc = result.error
        now = time.monotonic()
        self.last_error = exc
        if self.shown_since is None:
            self.shown_since = now
        if isinstance(exc, (FencedError, CommitStateUnknownError, CoordinatorUnavailableError)):
            return None  # shown in /status, never counted towards the timeout
        if self.failing_since is None:
            self.failing_since = now
        timeout = self.timeout_s
        if timeout >= 0 and now - self.failing_since >= timeout:
            return FatalError(f"gave up after retrying for {now - self.failing_since:.1f} s "
                              f"(errors.retry.timeout={int(timeout * 1000)} ms); last error: {exc}",
                              component=getattr(exc, "component", None))
        return None
