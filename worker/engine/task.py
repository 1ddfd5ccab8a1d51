"""One connector's task on one worker: what it is made of, and the thread that runs its cycles.

The worker builds a :class:`SinkTask` per connector it runs and hands it partitions; the task's
thread applies them between cycles and cycles until it is stopped. What a cycle does is in
``cycle.py``, what the task holds and the states that puts it in, in ``holding.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from eosink.connectors.api.errors import Outcome, outcome_of
from eosink.connectors.api.records import TopicPartition
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine import gcpause, snapshot
from eosink.worker.engine.batch import RecordSource
from eosink.worker.engine.cycle import CycleRunner
from eosink.worker.engine.decision import DecisionLog
from eosink.worker.engine.fanout import SinkFanout
from eosink.worker.engine.tolerance import RetryTimeout, Tolerance
from eosink.worker.engine.types import Backoff, CycleOutcome, CycleResult, TaskSettings, TaskState, TaskStatus
from eosink.worker.logging import get_logger
from eosink.worker.transforms import TransformChain

log = get_logger("eosink.worker.engine.task")


class SinkTask(CycleRunner):
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
        transforms: TransformChain | None = None,
    ) -> None:
        self.connector = connector
        self.worker_id = worker_id
        #: errors.tolerance=all: the last sink, with ``report(failed)`` (see eosink.worker.engine.deadletter).
        self.dead_letter = dead_letter
        #: The connector's Single Message Transforms (``transforms=...``); empty: records go as decoded.
        self.transforms = transforms or None
        self.paused = False
        self.pause_applied = False
        self.delivered = {}
        self.lag = {}
        #: When a cycle last committed each held partition (monotonic): the freshness metric.
        self.last_commit = {}
        self.source = source
        self.log = decision_log
        self.settings = settings or TaskSettings()
        self.sleep = sleep
        self.on_fenced = on_fenced
        #: Called (from the task thread) when partitions or state change, so the worker publishes
        #: the new status at once instead of at its next poll.
        self.on_change = on_change
        self.state = TaskState.UNASSIGNED
        self.trace = None
        self.grants = {}
        self._unrecovered = set()
        self.recovery_error = None
        self.unresolved = {}
        self._generation = None
        self._counter = 0
        self._backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        self._lock = threading.RLock()
        self._desired: set[TopicPartition] | None = None
        self._lag_at = 0.0
        self._resuming_until = 0.0
        self._recovered_at = time.monotonic()
        self.logger = log.bind(connector=connector, worker=worker_id)
        self.fanout = SinkFanout([*sinks, *([dead_letter] if dead_letter is not None else [])], self.settings,
                                 self.logger, sleep)
        self.sinks = self.fanout.sinks
        if self.transforms is None and not any(s.reads_values for s in self.sinks):
            defer = getattr(source, "defer_json_decoding", None)  # (KafkaSource's; model tests' sources decode)
            if defer is not None:
                defer()
        self._tolerance = Tolerance(connector, self.settings, dead_letter, self.logger)
        self.retry_timeout = RetryTimeout(self.settings.retry_timeout_s)
        self.fanout.on_retry = self.retry_timeout.retrying

    # ------------------------------------------------------------------ lifecycle and loop
    def open(self) -> None:
        """Open the sinks. One that cannot open for now (a retryable error: its server is full or away)
        is opened again before the task recovers its partitions; /status shows the error meanwhile."""
        try:
            self.fanout.open()
        except Exception as exc:
            if outcome_of(exc) is not Outcome.RETRYABLE:
                raise
            self.recovery_error = exc
            self.retry_timeout.retrying(exc)
            self.logger.warning("sink_open_retry", error=str(exc), error_class=type(exc).__name__)
        metrics.track_task(self)

    def close(self) -> None:
        metrics.untrack_task(self)
        self.fanout.close()
        self.source.close()

    def run(self, stop: threading.Event) -> None:
        """Cycle until ``stop`` is set; the cycle in flight completes first (graceful SIGTERM)."""
        structlog.contextvars.bind_contextvars(connector=self.connector)
        self.fanout.stopping = stop  # a commit being retried gives up when the worker stops
        wake = getattr(self.source, "interrupt", None)
        busy = gcpause.Hold()
        try:
            while not stop.is_set():
                if wake is not None:
                    wake.clear()
                busy.set(True)  # (held through the cycle: its own pause ends inside it)
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
                # Cycles that deliver back to back keep the collector paused between them (see gcpause.Hold).
                busy.set(result.outcome is CycleOutcome.SUCCEEDED and result.records > 0)
                gave_up = self.retry_timeout.gave_up(result)  # errors.retry.timeout
                if gave_up is not None:
                    with self._lock:
                        self._fail(gave_up)
                if result.outcome is CycleOutcome.EMPTY and self.state is TaskState.RUNNING:
                    self._report_lag(fresh=True)  # idle or paused: keep the lag in /status current (at most every 5 s)
                if result.outcome is CycleOutcome.ABORTED and self.state is not TaskState.FAILED:
                    self._idle(stop, wake, self._backoff.next())  # an interrupt (ZooKeeper back, a new assignment) ends it
                elif result.outcome is CycleOutcome.EMPTY and (
                        self.state is not TaskState.RUNNING or not self.active_partitions()):
                    self._idle(stop, wake, min(0.5, self.settings.commit_interval_s))
                elif self.state is TaskState.FAILED:
                    stop.wait(0.5)
        finally:
            busy.set(False)
        self.shutdown()

    @staticmethod
    def _idle(stop: threading.Event, wake: threading.Event | None, seconds: float) -> None:
        """Nothing to do: wait ``seconds``, but not past a stop or a wake-up (:meth:`interrupt`: a new
        assignment). The task thread starts before its first assignment arrives; sleeping through
        it cost every new connector half a second before its first record."""
        if wake is None:
            stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set() and not wake.wait(min(0.05, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return

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

    def shutdown(self) -> None:
        with self._lock:
            if self.fanout.abort_pending:
                self.fanout.retry_aborts()
            if self.grants and self.state is not TaskState.FAILED:
                self.log.release(self.connector, self.grants)
            self.grants.clear()
            self.state = TaskState.STOPPED

    # ------------------------------------------------------------------ status
    def status(self) -> TaskStatus:
        """A snapshot for ``/status``, taken without the cycle lock (see :func:`snapshot.status_of`)."""
        return snapshot.status_of(self)

    def gauges(self) -> dict[str, Any]:
        """The live state the metrics read at scrape time (see :func:`snapshot.gauges_of`)."""
        return snapshot.gauges_of(self)
