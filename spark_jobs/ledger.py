"""The publish ledger: which (job, run, partition) has committed, written inside the same transaction.

Layout: a compacted topic (default ``__eosink_publish_ledger``) with one partition. Key
``{job}/{run_id}/{partition}``, value JSON ``{"job", "run_id", "partition", "records", "topics", ...}``.
A task writes its entry as the *last* record of its transaction, so the entry is committed if and
only if the partition's outbox records are. After a run succeeded the driver adds a run marker
``{job}/{run_id}/run`` (outside any transaction: it is only a shortcut, see ``publisher``).

Reading it correctly
--------------------
"Is key K committed?" must be answered from a ``read_committed`` consumer that has read *to the
end*. The end is the log end offset (high watermark) queried *after* ``init_transactions()``, and it
must be reached by the consumer's fetch position, not by its last message: a read_committed consumer
stops at the last stable offset (LSO), which an unrelated open transaction on the ledger partition
(another task about to commit) holds back. Stopping at the LSO would miss an entry committed just
behind such a transaction and publish the partition twice; so :meth:`LedgerReader.scan` waits until
the fetch position (reported by the partition-EOF event) reaches the high watermark. Entries are
written immediately before ``commit_transaction()``, so other tasks hold the LSO back for
milliseconds, not for the length of their partition.

Cost, and the trade-off taken
-----------------------------
A scan from offset 0 is O(ledger size). It happens once per ``publish_outbox`` call, on the driver,
which passes its end offset and the partitions of the run it already saw committed to every task.
A task then only reads the tail written since the driver's scan, and each Python worker process
keeps that tail (:class:`_TailCache`) across tasks, since Spark reuses workers: per task the cost is
the entries committed since the previous task in the same process, typically a handful. The price
is memory for the tail's keys (bounded: the cache resets above ``_TAIL_CACHE_MAX`` keys) and a
driver scan that grows with the ledger; the compacted topic keeps one record per partition ever
published, which is ~150 bytes each (a million partitions is ~150 MB to read once per job; prune
old runs with tombstones if that ever matters). Caching is sound because a committed entry never
becomes uncommitted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from spark_jobs.errors import LedgerError
from spark_jobs.kafka_checks import client_config
from spark_jobs.naming import RUN_MARKER, run_prefix

_TAIL_CACHE_MAX = 200_000


@dataclass(frozen=True)
class LedgerEntry:
    """One committed ledger record: a partition entry, or the run marker (``partition is None``)."""

    job: str
    run_id: str
    partition: int | None
    records: int
    topics: dict[str, int] = field(default_factory=dict)
    num_partitions: int | None = None
    call_id: str | None = None

    @classmethod
    def from_bytes(cls, raw: bytes) -> LedgerEntry:
        d = json.loads(raw)
        return cls(
            job=d["job"],
            run_id=d["run_id"],
            partition=d.get("partition"),
            records=int(d.get("records", 0)),
            topics=dict(d.get("topics") or {}),
            num_partitions=d.get("num_partitions"),
            call_id=d.get("call_id"),
        )


def entry_value(
    job: str, run_id: str, partition: int | None, records: int, topics: Mapping[str, int], **extra: Any
) -> bytes:
    """The JSON value of a ledger record (the team's fields first, then ours)."""
    doc = {"job": job, "run_id": run_id, "partition": partition, "records": records, "topics": dict(topics)}
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode()


class LedgerReader:
    """Reads committed ledger records from one offset up to the log end (see the module doc)."""

    def __init__(self, kafka: Mapping[str, Any], topic: str) -> None:
        base = client_config(kafka)
        self.topic = topic
        self.bootstrap = str(base.get("bootstrap.servers"))
        self._tp = TopicPartition(topic, 0)
        common = {
            **base,
            "group.id": "eosink-ledger-reader",  # never joins or commits; assign() only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",
        }
        self._committed = Consumer({**common, "isolation.level": "read_committed", "enable.partition.eof": True})
        # A read_committed consumer's ListOffsets answers the LSO; the log end needs read_uncommitted.
        self._uncommitted = Consumer({**common, "isolation.level": "read_uncommitted"})

    def end_offset(self, timeout_s: float) -> int:
        try:
            _, high = self._uncommitted.get_watermark_offsets(self._tp, timeout=timeout_s, cached=False)
        except KafkaException as e:
            raise LedgerError(f"cannot read the end offset of ledger topic '{self.topic}': {e.args[0].str()}") from None
        return int(high)

    def scan(self, start: int, timeout_s: float) -> tuple[dict[str, bytes], int]:
        """Committed ``key -> value`` in ``[start, end)`` and ``end``, the log end at call time."""
        deadline = time.monotonic() + timeout_s
        end = self.end_offset(timeout_s)
        found: dict[str, bytes] = {}
        if start >= end:
            return found, max(start, end)
        self._committed.assign([TopicPartition(self.topic, 0, start)])
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LedgerError(
                        f"ledger topic '{self.topic}' could not be read to offset {end} within {timeout_s:.0f}s "
                        "(an open transaction holds its last stable offset back; it ends at its "
                        "transaction.timeout.ms at the latest)"
                    )
                msg = self._committed.poll(min(remaining, 1.0))
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= end:
                            break
                        continue  # stopped at the LSO below the end: wait for it to move
                    raise LedgerError(f"reading ledger topic '{self.topic}': {err.str()}")
                key = msg.key()
                if key is not None:
                    found[key.decode()] = msg.value()
                if msg.offset() + 1 >= end:
                    break
        finally:
            self._committed.unassign()
        return found, end

    def close(self) -> None:
        for c in (self._committed, self._uncommitted):
            try:
                c.close()
            except RuntimeError:
                pass


@dataclass
class RunState:
    """What the driver learnt about one run from a full ledger scan."""

    entries: dict[int, LedgerEntry]
    marker: LedgerEntry | None
    end_offset: int


def read_run(kafka: Mapping[str, Any], topic: str, job: str, run_id: str, timeout_s: float) -> RunState:
    """Full scan (driver side, once per publish): this run's committed partitions and marker."""
    reader = LedgerReader(kafka, topic)
    try:
        found, end = reader.scan(0, timeout_s)
    finally:
        reader.close()
    prefix = run_prefix(job, run_id)
    entries: dict[int, LedgerEntry] = {}
    marker = None
    for key, value in found.items():
        if not key.startswith(prefix) or value is None:
            continue
        suffix = key[len(prefix) :]
        if suffix == RUN_MARKER:
            marker = LedgerEntry.from_bytes(value)
        elif suffix.isdigit():
            entries[int(suffix)] = LedgerEntry.from_bytes(value)
    return RunState(entries=entries, marker=marker, end_offset=end)


class _TailCache:
    """Keys committed in ``[start, pos)`` of the ledger, kept per Python worker process."""

    def __init__(self, reader: LedgerReader, start: int) -> None:
        self.reader = reader
        self.start = start
        self.pos = start
        self.keys: dict[str, bytes] = {}
        self.lock = threading.Lock()


_TAILS: dict[tuple[Any, ...], _TailCache] = {}
_TAILS_LOCK = threading.Lock()


def lookup_committed(
    kafka: Mapping[str, Any], topic: str, key: str, since_offset: int, timeout_s: float
) -> LedgerEntry | None:
    """Executor side: the committed entry for ``key`` at or after ``since_offset``, or ``None``.

    The caller already knows the entries before ``since_offset`` (the driver's scan); this reads
    only the tail, incrementally across the tasks this process runs.
    """
    ident = (tuple(sorted((k, str(v)) for k, v in client_config(kafka).items())), topic)
    with _TAILS_LOCK:
        tail = _TAILS.get(ident)
        if tail is None:
            tail = _TAILS[ident] = _TailCache(LedgerReader(kafka, topic), since_offset)
    with tail.lock:
        if since_offset < tail.start or since_offset > tail.pos or len(tail.keys) > _TAIL_CACHE_MAX:
            tail.start = tail.pos = since_offset
            tail.keys = {}
        found, end = tail.reader.scan(tail.pos, timeout_s)
        tail.keys.update(found)
        tail.pos = max(tail.pos, end)
        raw = tail.keys.get(key)
    return LedgerEntry.from_bytes(raw) if raw is not None else None
