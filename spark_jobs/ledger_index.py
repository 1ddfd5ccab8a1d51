"""One job's ledger records, read once per process and then only their tail: the micro-batch driver's view.

``publish_outbox`` reads the whole ledger once per call (:func:`eosink.spark_jobs.ledger.read_run`).
A streaming query plans a run per micro-batch, often one a second, so the same full read per batch
would grow with the ledger for ever. :class:`JobLedger` keeps, per process, the offsets of one job's
records read so far and reads only what was written since on the next batch; it answers the same
question as ``read_run`` (a :class:`~eosink.spark_jobs.ledger.RunState`: committed partitions,
undecided entries, the run marker, the end offset the tasks read on from) under the same rules
(nothing below the last stable offset is waited for; see the ledger module).

What it keeps is bounded: the records of the job only (other jobs' are read past), and for a
streaming query only the micro-batches from its latest complete one on. Spark never replays a batch
older than its last one with a run marker (a marker is written by the batch's own driver commit, after
every partition committed, so Spark's commit log holds every earlier batch), so older ones are dropped.
A new process (a restarted driver) reads the job's records from offset 0 once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from eosink.spark_jobs.kafka_checks import client_config
from eosink.spark_jobs.ledger import LedgerEntry, LedgerReader, RunState
from eosink.spark_jobs.naming import RUN_MARKER, parse_stream_run_id


class JobLedger:
    """The ledger records of ``job`` (one topic, one cluster), refreshed from where the last read stopped."""

    def __init__(self, kafka: Mapping[str, Any], topic: str, job: str) -> None:
        self.reader = LedgerReader(kafka, topic)
        self.prefix = f"{job}/"
        self.job = job
        self.pos = 0
        self.lock = threading.Lock()
        #: run id -> partition -> offsets of its entries (committed or not)
        self.entries: dict[str, dict[int, list[int]]] = {}
        #: run id -> the run marker's value (written outside transactions: never aborted)
        self.markers: dict[str, bytes] = {}
        #: (run id, partition) -> the committed entry's value; offsets found not committed
        self.committed: dict[tuple[str, int], bytes] = {}
        self.decided: set[int] = set()

    def refresh(self, timeout_s: float) -> int:
        """Read what was written since the last call; returns the new end offset."""
        found, end = self.reader.scan(self.pos, timeout_s, prefix=self.prefix)
        for key, records in found.items():
            run_id, _, suffix = key[len(self.prefix):].rpartition("/")
            if suffix == RUN_MARKER:
                self.markers[run_id] = records[-1][1]
            elif suffix.isdigit():
                self.entries.setdefault(run_id, {}).setdefault(int(suffix), []).extend(o for o, _ in records)
        self.pos = end
        self._forget_completed_batches()
        return end

    def _forget_completed_batches(self) -> None:
        """Drop the micro-batches of a query before its latest one with a marker (never replayed)."""
        latest: dict[str, int] = {}
        for run_id in self.markers:
            parsed = parse_stream_run_id(run_id)
            if parsed is not None:
                latest[parsed[0]] = max(latest.get(parsed[0], -1), parsed[1])
        if not latest:
            return
        for run_id in [r for r in {*self.entries, *self.markers} if _older(r, latest)]:
            for p, offsets in self.entries.pop(run_id, {}).items():
                self.committed.pop((run_id, p), None)
                self.decided.difference_update(offsets)
            self.markers.pop(run_id, None)

    def state(self, run_id: str, end: int, timeout_s: float) -> RunState:
        """``run_id``'s committed partitions, undecided entries (above the LSO) and marker, as of ``end``."""
        marker = self.markers.get(run_id)
        offsets = self.entries.get(run_id, {})
        undecided = {p: [o for o in offs if o not in self.decided] for p, offs in offsets.items()}
        if any(undecided.values()):
            lso = self.reader.stable_offset(timeout_s)
            below = {f"{self.prefix}{run_id}/{p}": [o for o in offs if o < lso] for p, offs in undecided.items()}
            for key, value in self.reader.committed(below, timeout_s).items():  # all below the LSO: never waits
                self.committed[(run_id, int(key.rpartition("/")[2]))] = value
            self.decided.update(o for offs in below.values() for o in offs)
        entries = {p: LedgerEntry.from_bytes(v) for (r, p), v in self.committed.items() if r == run_id}
        pending = {p: tuple(o for o in offs if o not in self.decided) for p, offs in offsets.items() if p not in entries}
        return RunState(
            entries=entries,
            pending={p: offs for p, offs in pending.items() if offs},
            marker=LedgerEntry.from_bytes(marker) if marker is not None else None,
            end_offset=end,
        )

    def runs(self) -> list[str]:
        """The run ids it keeps (every run of the job but the completed micro-batches it dropped)."""
        return sorted({*self.entries, *self.markers})


def _older(run_id: str, latest_complete: Mapping[str, int]) -> bool:
    parsed = parse_stream_run_id(run_id)
    return parsed is not None and parsed[0] in latest_complete and parsed[1] < latest_complete[parsed[0]]


_JOBS: dict[tuple[Any, ...], JobLedger] = {}
_JOBS_LOCK = threading.Lock()


def job_ledger(kafka: Mapping[str, Any], topic: str, job: str) -> JobLedger:
    """This process's :class:`JobLedger` for ``job`` (created on first use)."""
    ident = (tuple(sorted((k, str(v)) for k, v in client_config(kafka).items())), topic, job)
    with _JOBS_LOCK:
        ledger = _JOBS.get(ident)
        if ledger is None:
            ledger = _JOBS[ident] = JobLedger(kafka, topic, job)
        return ledger


def run_states(kafka: Mapping[str, Any], topic: str, job: str, run_ids: list[str] | None, timeout_s: float,
               ) -> tuple[dict[str, RunState], int]:
    """The state of each of ``run_ids`` (``None``: every run the job's ledger keeps) and the end offset
    after a refresh: what the tasks of the next run read the ledger on from."""
    ledger = job_ledger(kafka, topic, job)
    with ledger.lock:
        end = ledger.refresh(timeout_s)
        wanted = ledger.runs() if run_ids is None else run_ids
        return {r: ledger.state(r, end, timeout_s) for r in wanted}, end
