"""Every sink of a connector, driven as one: each phase of the cycle called on all of them.

A connector may deliver into several sinks (a fan-out: PostgreSQL and S3 and files) in one
transaction, plus the dead-letter sink under ``errors.tolerance=all``. The cycle decides once for
all of them, so each phase must reach every sink: prepare on all before the decision, commit on
all after it (retried in place: the decision stands whatever a sink says), abort on all on every
abort path (remembered and retried when a sink cannot abort now). Keeping the loops here leaves
``cycle.py`` with the cycle's decisions, not its plumbing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from eosink.connectors.api.errors import FatalError, Outcome, outcome_of
from eosink.connectors.api.records import SinkRecord, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker.engine.faults import FAULTS
from eosink.worker.engine.types import Backoff, TaskSettings


class SinkFanout:
    """The sinks of one task, in order; the dead-letter sink (if any) is the last."""

    def __init__(self, sinks: Sequence[TwoPhaseCommitSink], settings: TaskSettings, logger: Any,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.sinks = list(sinks)
        self.settings = settings
        self.logger = logger
        self.sleep = sleep
        #: Txns some sink could not abort yet: aborted again before the next cycle.
        self.abort_pending: list[str] = []
        #: Set when the task stops: a commit being retried gives up (recovery finishes it).
        self.stopping = threading.Event()
        #: Called with each retryable commit error (the task shows it in its status).
        self.on_retry: Callable[[BaseException], None] | None = None
        self._opened: set[int] = set()

    def __iter__(self) -> Iterator[TwoPhaseCommitSink]:
        return iter(self.sinks)

    def open(self) -> None:
        """Open every sink not open yet, in order; one that raises is opened again at the next call."""
        for sink in self.sinks:
            if id(sink) not in self._opened:
                sink.open()
                self._opened.add(id(sink))

    @property
    def opened(self) -> bool:
        """Every sink opened (a retryable failure to open one - a server full or away - leaves it for later)."""
        return len(self._opened) == len(self.sinks)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                self.logger.warning("sink_close_failed", sink=type(sink).__name__, error=str(exc))

    def begin(self, txn_id: str) -> None:
        for sink in self.sinks:
            sink.begin_transaction(txn_id)

    def write(self, records: list[SinkRecord]) -> None:
        for sink in self.sinks:
            sink.write(records)

    def pre_commit(self, manifest: TxnManifest) -> None:
        for i, sink in enumerate(self.sinks):
            sink.pre_commit(manifest)
            if i == 0:
                FAULTS.hit("pre_commit")  # one sink prepared, the others not yet

    def commit(self, txn_id: str) -> None:
        """Commit on every sink, each retried in place; raises :class:`FatalError` when one gives up."""
        for i, sink in enumerate(self.sinks):
            self._commit_with_retries(sink, txn_id)
            if i == 0:
                FAULTS.hit("mid_commit")

    def _commit_with_retries(self, sink: TwoPhaseCommitSink, txn_id: str) -> None:
        """A decided txn's commit is idempotent and must happen: retryable errors are retried for at
        least ``commit_retries`` attempts and ``commit_retry_min_s`` seconds (a sink restarting,
        an endpoint away for a while), unless the task is stopping; then the task fails and the
        decision is left to recovery (on restart, or by the partitions' next owner)."""
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                sink.commit(txn_id)
                return
            except Exception as exc:  # noqa: BLE001 - classified
                spent = attempt >= self.settings.commit_retries and \
                    time.monotonic() - started >= self.settings.commit_retry_min_s
                if outcome_of(exc) is Outcome.FATAL or spent or self.stopping.is_set():
                    raise FatalError(
                        f"commit of decided txn {txn_id} failed on {type(sink).__name__}: {exc}; "
                        "the decision stands: recovery commits it on restart or by the next owner",
                        component=getattr(exc, "component", None) or type(sink).__name__,
                    ) from exc
                attempt += 1
                self.logger.warning("commit_retry", txn=txn_id, attempt=attempt, error=str(exc))
                if self.on_retry is not None:
                    self.on_retry(exc)
                self.sleep(backoff.next())

    def abort(self, txn_id: str) -> None:
        """Abort on every sink (abort is idempotent); remember failures and retry them first."""
        for sink in self.sinks:
            try:
                sink.abort(txn_id)
            except Exception as exc:  # noqa: BLE001 - retried before the next cycle
                self.logger.warning("abort_failed", txn=txn_id, sink=type(sink).__name__, error=str(exc))
                if txn_id not in self.abort_pending:
                    self.abort_pending.append(txn_id)

    def retry_aborts(self) -> bool:
        """Abort again what could not be aborted; True when nothing is left pending."""
        pending, self.abort_pending = self.abort_pending, []
        for txn_id in pending:
            self.abort(txn_id)
        return not self.abort_pending
