"""What a task holds, and the state that puts it in: partitions acquired, recovered, dropped; a failure.

:class:`~eosink.worker.engine.types.TaskState` lists the transitions; all but STOPPED (at shutdown)
are made here. A held partition is consumed only once it is recovered (``recovery.py``) and while
no unresolved txn blocks it, so the source is positioned again whenever that set changes.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from eosink.connectors.api.errors import EosinkError, Outcome, outcome_of
from eosink.connectors.api.records import TopicPartition
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker.engine.batch import RecordSource
from eosink.worker.engine.decision import DecisionLog, Grant
from eosink.worker.engine.fanout import SinkFanout
from eosink.worker.engine.faults import FAULTS
from eosink.worker.engine.recovery import recover
from eosink.worker.engine.tolerance import Tolerance
from eosink.worker.engine.types import TaskSettings, TaskState, Unresolved


class PartitionHolder:
    """The partitions one connector's task holds: acquired (an epoch bump), recovered before they are
    consumed, released, or dropped when fenced. A part of :class:`~eosink.worker.engine.task.SinkTask`,
    whose constructor sets every attribute declared here."""

    connector: str
    log: DecisionLog
    settings: TaskSettings
    source: RecordSource
    sinks: list[TwoPhaseCommitSink]
    logger: Any
    on_fenced: Callable[[frozenset[TopicPartition]], None] | None
    on_change: Callable[[], None] | None
    state: TaskState
    trace: str | None
    grants: dict[TopicPartition, Grant]
    unresolved: dict[str, Unresolved]
    delivered: dict[TopicPartition, int]
    last_commit: dict[TopicPartition, float]
    _unrecovered: set[TopicPartition]
    _generation: str | None
    _resuming_until: float
    _recovered_at: float
    _lock: threading.RLock
    _tolerance: Tolerance
    fanout: SinkFanout
    #: Why the last recovery (or opening a sink before it) could not finish: a retryable error, shown in /status.
    recovery_error: BaseException | None

    # ------------------------------------------------------------------ assignment and recovery
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
                    self.last_commit.pop(tp, None)
                self._tolerance.keep_only(wanted)
            new = wanted - set(self.grants)
            if new:
                self.grants.update(self.log.acquire(self.connector, new))
                self._generation = None  # a new generation for txns after every acquisition
                self._resuming_until = time.monotonic() + self.settings.commit_interval_s
                self._unrecovered |= new
                self.last_commit.update(dict.fromkeys(new, time.monotonic()))  # freshness counts from the handoff
                self.logger.info("partitions_acquired", partitions=sorted(str(tp) for tp in new),
                                 epochs={str(tp): self.grants[tp].epoch for tp in new})
            if self.state in (TaskState.UNASSIGNED, TaskState.RUNNING, TaskState.RECOVERING):
                held = TaskState.RUNNING if self.grants else TaskState.UNASSIGNED
                self.state = TaskState.RECOVERING if self._unrecovered else held
            if self.state is not TaskState.FAILED:
                self._recover_pending()
                self._position()

    def active_partitions(self) -> list[TopicPartition]:
        blocked = {tp for u in self.unresolved.values() for tp in u.partitions}
        return sorted(tp for tp in self.grants if tp not in self._unrecovered and tp not in blocked)

    def _position(self) -> None:
        active = self.active_partitions()
        self.source.assign({tp: self.grants[tp].next_offset for tp in active})

    def _recover_pending(self) -> bool:
        """Recover newly acquired partitions; True when all are resolved (or reported)."""
        if not self._unrecovered:
            return True
        FAULTS.hit("recover")
        targets = set(self._unrecovered)
        try:
            self.fanout.open()  # a sink that could not open yet (its server full or away) recovers nothing
            recover(self.connector, self.sinks, self.log, self.grants, targets, self.unresolved, self.logger)
        except Exception as exc:  # noqa: BLE001 - classified below
            if outcome_of(exc) is Outcome.FATAL:
                self.recovery_error = None  # a fatal one is the task's trace already
                self._fail(exc)
            else:
                self.recovery_error = exc
                self.logger.warning("recovery_retry", error=str(exc))
            return False
        self.recovery_error = None
        self._unrecovered -= targets
        self._recovered_at = time.monotonic()
        if not self._unrecovered and self.state is TaskState.RECOVERING:
            self.state = TaskState.RUNNING if self.grants else TaskState.UNASSIGNED
        return True

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

    # ------------------------------------------------------------------ a failure
    def _fail(self, exc: BaseException) -> None:
        self.state = TaskState.FAILED
        if isinstance(exc, EosinkError):
            self.trace = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        else:
            self.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if self.on_change is not None:
            self.on_change()
        self.logger.error("task_failed", error=str(exc), error_class=type(exc).__name__)
