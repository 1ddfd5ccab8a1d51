"""One job's ledger records, read once per process and then only their tail: the micro-batch driver's view.

``publish_outbox`` reads the whole ledger once per call (:func:`eosink.spark_jobs.ledger.read_run`).
A streaming query plans a run per micro-batch, often one a second, so the same full read per batch
would grow with the ledger for ever. :class:`JobLedger` keeps, per process, the offsets of one job's
records read so far and reads only what was written since on the next batch; it answers the same
question as ``read_run`` (a :class:`StreamRun`: committed contents, undecided entries, the run
marker, the end offset the tasks read on from) under the same rules (nothing below the last stable
offset is waited for; see the ledger module).

What it keeps is bounded: the records of the job only (other jobs' are read past), and for a
streaming query only the micro-batches from its latest complete one on. Spark never replays a batch
older than its last one with a run marker (a marker is written by the batch's own driver commit, after
every partition committed, so Spark's commit log holds every earlier batch), so older ones are dropped.
A new process (a restarted driver) reads the job's records from offset 0 once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eosink.spark_jobs.kafka_checks import client_config
from eosink.spark_jobs.ledger import LedgerEntry, LedgerReader
from eosink.spark_jobs.naming import RUN_MARKER, parse_stream_run_id


@dataclass
class StreamRun:
    """What the ledger holds of one micro-batch (see :mod:`eosink.spark_jobs.stream_task` for identities)."""

    contents: dict[str, LedgerEntry] = field(default_factory=dict)  # committed entries by content identity
    indices: set[int] = field(default_factory=set)  # partition indices with an entry, committed or not
    num_partitions: set[int] = field(default_factory=set)  # the partition counts the entries recorded
    pending: tuple[int, ...] = ()  # offsets of entries not decided yet (above the last stable offset)
    marker: LedgerEntry | None = None
    end_offset: int = 0

    @property
    def started(self) -> bool:
        """An earlier attempt of the batch wrote something (its replay must fence before it checks)."""
        return bool(self.indices or self.pending)


class JobLedger:
    """The micro-batch records of ``job`` (one topic, one cluster), refreshed from where the last read stopped."""

    def __init__(self, kafka: Mapping[str, Any], topic: str, job: str) -> None:
        self.reader = LedgerReader(kafka, topic)
        self.prefix = f"{job}/"
        self.job = job
        self.pos = 0
        self.lock = threading.Lock()
        #: run id -> key suffix ``{partition}.{identity}`` -> offsets of its entries (committed or not)
        self.entries: dict[str, dict[str, list[int]]] = {}
        #: run id -> the run marker's value (written outside transactions: never aborted)
        self.markers: dict[str, bytes] = {}
        #: (run id, key suffix) -> the committed entry's value; offsets found not committed
        self.committed: dict[tuple[str, str], bytes] = {}
        self.decided: set[int] = set()

    def refresh(self, timeout_s: float) -> int:
        """Read what was written since the last call; returns the new end offset."""
        found, end = self.reader.scan(self.pos, timeout_s, prefix=self.prefix)
        for key, records in found.items():
            run_id, _, suffix = key[len(self.prefix):].rpartition("/")
            if suffix == RUN_MARKER:
                self.markers[run_id] = records[-1][1]
            elif suffix.partition(".")[0].isdigit():
                self.entries.setdefault(run_id, {}).setdefault(suffix, []).extend(o for o, _ in records)
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

    def state(self, run_id: str, end: int, timeout_s: float) -> StreamRun:
        """``run_id``'s committed contents, undecided entries and marker, as of ``end``."""
        marker = self.markers.get(run_id)
        offsets = self.entries.get(run_id, {})
        undecided = {s: [o for o in offs if o not in self.decided] for s, offs in offsets.items()}
        if any(undecided.values()):
            lso = self.reader.stable_offset(timeout_s)
            below = {f"{self.prefix}{run_id}/{s}": [o for o in offs if o < lso] for s, offs in undecided.items()}
            for key, value in self.reader.committed(below, timeout_s).items():  # all below the LSO: never waits
                self.committed[(run_id, key.rpartition("/")[2])] = value
            self.decided.update(o for offs in below.values() for o in offs)
        entries = {s: LedgerEntry.from_bytes(v) for (r, s), v in self.committed.items() if r == run_id}
        return StreamRun(
            contents={s.partition(".")[2]: e for s, e in entries.items()},
            indices={int(s.partition(".")[0]) for s in offsets},
            num_partitions={e.num_partitions for e in entries.values() if e.num_partitions is not None},
            pending=tuple(o for s, offs in offsets.items() if s not in entries for o in offs if o not in self.decided),
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
               ) -> tuple[dict[str, StreamRun], int]:
    """The state of each of ``run_ids`` (``None``: every run the job's ledger keeps) and the end offset
    after a refresh: what the tasks of the next run read the ledger on from."""
    ledger = job_ledger(kafka, topic, job)
    with ledger.lock:
        end = ledger.refresh(timeout_s)
        wanted = ledger.runs() if run_ids is None else run_ids
        return {r: ledger.state(r, end, timeout_s) for r in wanted}, end
