"""The publish ledger: which (job, run, partition) has committed, written inside the same transaction.

Layout: a compacted topic (default ``__eosink_publish_ledger``) with one partition. Key
``{job}/{run_id}/{partition}``, value JSON ``{"job", "run_id", "partition", "records", "topics", ...}``.
A task writes its entry as the *last* record of its transaction, so the entry is committed if and
only if the partition's outbox records are. After a run succeeded the driver adds a run marker
``{job}/{run_id}/run``, outside any transaction (it is only a shortcut, see ``publisher``).

Answering "is key K committed?" correctly, and without stalling
----------------------------------------------------------------
The question is asked right after ``init_transactions()`` of K's transactional.id, which has
completed or aborted every earlier transaction that could contain K (see :mod:`eosink.spark_jobs.task`).
So every record of K in the log is now *decided*, and every committed one lies below the log end
(high watermark) measured at that moment. Two steps:

1. **Candidates** - read ``read_uncommitted`` up to that high watermark and note the offsets of K's
   records. None (the normal case for a first attempt) means K was never written, committed or
   not: the answer is "no" at once.
2. **Resolution** - only if there are candidates, read ``read_committed`` from the first to past the
   last candidate offset: K is committed iff a read_committed consumer delivers one of them.

A read_committed consumer cannot read past the last stable offset (LSO), which *any* open
transaction on the ledger partition holds back. Reading "read_committed to the end" in step 1,
the obvious design, made every task wait on every other task's open transaction; worse, a task
that crashed between writing its ledger entry and committing held the LSO until its own retry ran
``init_transactions`` - and that retry could be queued behind the very tasks stuck waiting (this
was observed here: the tests ran into the 60 s ledger timeout). With candidates first, only a
partition that already has an entry of its own in the log waits, and only for transactions that
began before that entry. Stopping at the LSO instead of waiting would be wrong: an entry committed
behind an older open transaction would be missed and the partition published twice (the test
``test_ledger_check_reads_to_the_log_end_not_the_last_stable_offset`` guards this).

Cost, and the trade-off taken
-----------------------------
A scan from offset 0 is O(ledger size). It happens once per ``publish_outbox`` call, on the driver,
which hands every task its end offset, the partitions of the run it saw committed and any
candidates it could not resolve yet (above the LSO; the driver never waits). A task then reads only
the tail written since the driver's scan, and each Python worker process keeps that tail
(:class:`_TailCache`) across tasks, since Spark reuses workers: per task the cost is the entries
written since the previous task in the same process, typically a handful. The price is memory for
the tail's keys (the cache resets above ``_TAIL_CACHE_MAX`` keys) and a driver scan that grows with
the ledger; the compacted topic keeps one record per partition ever published, ~200 bytes each (a
million partitions is ~200 MB to read once per call; delete old runs with tombstones if it ever
matters). Caching is sound: a decided record never changes its fate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from eosink.connectors.common.jsoncodec import decode, encode
from eosink.spark_jobs.errors import COMPONENT, AuthorizationError, LedgerError
from eosink.spark_jobs.kafka_checks import client_config, watch
from eosink.spark_jobs.naming import RUN_MARKER, run_prefix
from eosink.worker.engine.kafka_errors import authorization_error

_TAIL_CACHE_MAX = 200_000
#: The ledger readers' group.id: the Python client requires one; it never joins nor commits (assign() only).
LEDGER_READER_GROUP = "eosink-ledger-reader"


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
    published_at_ms: int | None = None
    transaction_timeout_ms: int | None = None  # a micro-batch entry's (where a replay looks for its records)

    @classmethod
    def from_bytes(cls, raw: bytes) -> LedgerEntry:
        d = decode(raw)
        return cls(
            job=d["job"],
            run_id=d["run_id"],
            partition=d.get("partition"),
            records=int(d.get("records", 0)),
            topics=dict(d.get("topics") or {}),
            num_partitions=d.get("num_partitions"),
            call_id=d.get("call_id"),
            published_at_ms=d.get("published_at_ms"),
            transaction_timeout_ms=d.get("transaction_timeout_ms"),
        )


def entry_value(
    job: str, run_id: str, partition: int | None, records: int, topics: Mapping[str, int], **extra: Any
) -> bytes:
    """The JSON value of a ledger record (the team's fields first, then ours), in the project's native codec."""
    doc = {"job": job, "run_id": run_id, "partition": partition, "records": records, "topics": dict(topics)}
    doc.update(extra)
    return encode(doc)


class LedgerReader:
    """The two reads of the module doc over partition 0 of the ledger topic."""

    def __init__(self, kafka: Mapping[str, Any], topic: str) -> None:
        base = client_config(kafka)
        self._settings = base
        self._watch = watch(base)
        self.topic = topic
        self._tp = TopicPartition(topic, 0)
        common = {
            **base,
            "group.id": LEDGER_READER_GROUP,  # never joins or commits; assign() only
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "earliest",
        }
        self._uncommitted = Consumer(self._watch.install({**common, "isolation.level": "read_uncommitted"}))
        self._committed = Consumer(self._watch.install({**common, "isolation.level": "read_committed"}))

    def _refused(self, err: Any) -> Exception | None:
        """A refused login / TLS handshake, or READ refused on the ledger by the ACLs: fatal, said once."""
        seen = self._watch.seen
        if seen is not None:
            return seen
        if err is not None and err.name() == "GROUP_AUTHORIZATION_FAILED":
            # The reader never joins nor commits, but librdkafka looks up its group's coordinator anyway.
            return authorization_error(err, self._settings, "DESCRIBE", LEDGER_READER_GROUP, component=COMPONENT,
                                       cls=AuthorizationError)
        return authorization_error(err, self._settings, "READ", self.topic, component=COMPONENT, cls=AuthorizationError)

    def _watermark(self, consumer: Consumer, what: str, timeout_s: float) -> int:
        try:
            _, high = consumer.get_watermark_offsets(self._tp, timeout=timeout_s, cached=False)
        except KafkaException as e:
            refused = self._refused(e.args[0])
            if refused is not None:
                raise refused from None
            raise LedgerError(f"cannot read the {what} of ledger topic '{self.topic}': {e.args[0].str()}") from None
        return int(high)

    def end_offset(self, timeout_s: float = 15.0) -> int:
        """The log end (high watermark): what a read_uncommitted ListOffsets answers."""
        return self._watermark(self._uncommitted, "end offset", timeout_s)

    def stable_offset(self, timeout_s: float = 15.0) -> int:
        """The last stable offset: a read_committed consumer's ListOffsets answers that, not the end."""
        return self._watermark(self._committed, "last stable offset", timeout_s)

    def _read(
        self, consumer: Consumer, start: int, stop: int, timeout_s: float, why: str
    ) -> Iterable[tuple[int, str | None, bytes | None]]:
        """``(offset, key, value)`` from ``start`` until the fetch position passes ``stop - 1``."""
        if start >= stop:
            return
        deadline = time.monotonic() + timeout_s
        consumer.assign([TopicPartition(self.topic, 0, start)])
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LedgerError(
                        f"ledger topic '{self.topic}' could not be read to offset {stop} within {timeout_s:.0f}s "
                        f"({why})"
                    )
                msg = consumer.poll(min(remaining, 1.0))
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = msg.offset()
                        if eof is not None and eof >= stop:
                            return
                        continue  # read_committed stopped at the LSO below ``stop``: wait for it
                    refused = self._refused(err)
                    if refused is not None:
                        raise refused
                    raise LedgerError(f"reading ledger topic '{self.topic}': {err.str()}")
                offset = msg.offset()
                if offset is None:  # only a message that did not come from a partition lacks one
                    raise LedgerError(f"reading ledger topic '{self.topic}': a record without an offset")
                key = msg.key()
                yield offset, key.decode() if key is not None else None, msg.value()
                if offset + 1 >= stop:
                    return
        finally:
            consumer.unassign()

    def scan(self, start: int, timeout_s: float, prefix: str = "") -> tuple[dict[str, list[tuple[int, bytes]]], int]:
        """Step 1: every record (committed or not) in ``[start, end)`` by key, and ``end``; only keys
        that start with ``prefix`` are kept (one job's, say, so a long ledger is read but not held)."""
        end = self.end_offset(timeout_s)
        found: dict[str, list[tuple[int, bytes]]] = {}
        for offset, key, value in self._read(self._uncommitted, start, end, timeout_s, "read_uncommitted"):
            if key is not None and value is not None and key.startswith(prefix):
                found.setdefault(key, []).append((offset, value))
        return found, max(start, end)

    def committed(self, candidates: Mapping[str, Iterable[int]], timeout_s: float) -> dict[str, bytes]:
        """Step 2: which of these ``key -> offsets`` are committed (the committed value, by key).

        Waits for the LSO to pass the last candidate, i.e. only for transactions that began
        before it; every candidate must already be decided (the callers make sure of that).
        """
        wanted = {(off, key) for key, offs in candidates.items() for off in offs}
        if not wanted:
            return {}
        lo, hi = min(o for o, _ in wanted), max(o for o, _ in wanted) + 1
        out: dict[str, bytes] = {}
        why = "an open transaction that began before a candidate entry holds the LSO back; it ends at its "
        why += "transaction.timeout.ms at the latest"
        for offset, key, value in self._read(self._committed, lo, hi, timeout_s, why):
            if (offset, key) in wanted and key is not None and value is not None:
                out[key] = value
        return out

    def close(self) -> None:
        for c in (self._committed, self._uncommitted):
            try:
                c.close()
            except RuntimeError:
                pass


@dataclass
class RunState:
    """What the driver learnt about one run from a full ledger scan (without ever waiting)."""

    entries: dict[int, LedgerEntry]  # committed partitions
    pending: dict[int, tuple[int, ...]]  # partition -> entry offsets not decided yet (above the LSO)
    marker: LedgerEntry | None
    end_offset: int


def read_run(kafka: Mapping[str, Any], topic: str, job: str, run_id: str, timeout_s: float) -> RunState:
    """Driver side, once per publish: this run's committed partitions, undecided ones and marker."""
    reader = LedgerReader(kafka, topic)
    try:
        found, end = reader.scan(0, timeout_s)
        prefix = run_prefix(job, run_id)
        marker = None
        offsets: dict[int, list[int]] = {}
        for key, records in found.items():
            if not key.startswith(prefix):
                continue
            suffix = key[len(prefix) :]
            if suffix == RUN_MARKER:  # written without a transaction: never aborted
                marker = LedgerEntry.from_bytes(records[-1][1])
            elif suffix.isdigit():
                offsets[int(suffix)] = [o for o, _ in records]
        lso = reader.stable_offset(timeout_s)
        decided = {prefix + str(p): [o for o in offs if o < lso] for p, offs in offsets.items()}
        committed = reader.committed(decided, timeout_s)  # all below the LSO: never waits
    finally:
        reader.close()
    entries = {int(k[len(prefix) :]): LedgerEntry.from_bytes(v) for k, v in committed.items()}
    pending = {
        p: tuple(o for o in offs if o >= lso) for p, offs in offsets.items() if p not in entries and max(offs) >= lso
    }
    return RunState(entries=entries, pending=pending, marker=marker, end_offset=end)


class _TailCache:
    """Records seen in ``[start, pos)`` of the ledger by key, kept per Python worker process."""

    def __init__(self, reader: LedgerReader, start: int) -> None:
        self.reader = reader
        self.start = start
        self.pos = start
        self.offsets: dict[str, list[int]] = {}
        self.committed: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def reset(self, start: int) -> None:
        self.start = self.pos = start
        self.offsets = {}
        self.committed = {}


_TAILS: dict[tuple[Any, ...], _TailCache] = {}
_TAILS_LOCK = threading.Lock()


def lookup_committed(
    kafka: Mapping[str, Any],
    topic: str,
    key: str,
    since_offset: int,
    timeout_s: float,
    pending: Iterable[int] = (),
) -> LedgerEntry | None:
    """Executor side, after ``init_transactions()``: the committed entry for ``key``, or ``None``.

    The driver decided everything of ``key`` below ``since_offset`` except ``pending`` (offsets it
    saw undecided); this reads only the tail since then, incrementally across the tasks this
    process runs, and resolves ``key``'s candidates.
    """
    ident = (tuple(sorted((k, str(v)) for k, v in client_config(kafka).items())), topic)
    with _TAILS_LOCK:
        tail = _TAILS.get(ident)
        if tail is None:
            tail = _TAILS[ident] = _TailCache(LedgerReader(kafka, topic), since_offset)
    with tail.lock:
        if since_offset < tail.start or since_offset > tail.pos or len(tail.offsets) > _TAIL_CACHE_MAX:
            tail.reset(since_offset)
        if key not in tail.committed:
            found, end = tail.reader.scan(tail.pos, timeout_s)
            for k, records in found.items():
                tail.offsets.setdefault(k, []).extend(o for o, _ in records)
            tail.pos = max(tail.pos, end)
            candidates = sorted(set(pending) | set(tail.offsets.get(key, ())))
            if candidates:
                tail.committed.update(tail.reader.committed({key: candidates}, timeout_s))
        raw = tail.committed.get(key)
    return LedgerEntry.from_bytes(raw) if raw is not None else None


_PLAIN_PRODUCERS: dict[tuple[tuple[str, str], ...], Producer] = {}


def write_plain(kafka: Mapping[str, Any], topic: str, key: str, value: bytes, timeout_s: float = 30.0) -> bool:
    """One record written outside any transaction (a run marker, a fence record); whether it was confirmed.

    One producer per process and cluster (a streaming driver writes one or two a micro-batch). Not
    idempotent on purpose: an idempotent producer spends ~0.5 s acquiring a producer id before its
    first send, and a duplicated record is harmless (same key, same value, compacted)."""
    settings = client_config(kafka)
    ident = tuple(sorted((k, str(v)) for k, v in settings.items()))
    producer = _PLAIN_PRODUCERS.get(ident)
    if producer is None:
        producer = _PLAIN_PRODUCERS[ident] = Producer({**settings, "acks": "all", "linger.ms": 0})
    producer.produce(topic, value, key, partition=0)
    return producer.flush(timeout_s) == 0
