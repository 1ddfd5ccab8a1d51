"""Executor side: one Spark partition published in one Kafka transaction, at most once per run.

Why the order of operations makes it exactly-once
-------------------------------------------------
Every attempt of partition *p* of run *r* of job *j* (Spark retry, speculative copy, a zombie
that wakes up late, a whole re-run with the same run id) uses the same transactional.id
``eosink-j-r-p`` and writes the ledger key ``j/r/p`` as the last record of its transaction.

1. ``init_transactions()`` first. The transaction coordinator serialises everything per
   transactional.id: it bumps the producer epoch, which fences every earlier attempt (their
   produce/commit now fail with PRODUCER_FENCED / INVALID_PRODUCER_EPOCH), and before it answers
   it *completes* any transaction of an earlier attempt that is already in PrepareCommit and
   *aborts* any that is still open. When it returns, no earlier attempt can commit any more and
   every earlier attempt that did commit has its commit markers written.
2. Only then read the ledger up to the log end measured after step 1 (how, without waiting on
   unrelated transactions, is in :mod:`eosink.spark_jobs.ledger`). An earlier attempt either committed,
   and then its entry is below that end and seen, so this attempt publishes nothing; or it did
   not, and then it never will.
3. Publish records + ledger entry in one transaction and commit. A later attempt repeats 1-2.

Checking *before* ``init_transactions()`` would leave a window in which an earlier attempt, not
yet fenced, commits after the check: both would publish. Hence the docstring's insistence.
Records of aborted or fenced attempts stay in the log but are invisible to read_committed
consumers, which is what eosink's sinks use.

Stable ``eosink.id`` headers (``job/run/partition/sequence``) are a second line of defence for
sinks; they are identical across attempts as long as the partition's rows and their order are
deterministic (Spark's own retry contract). The exactly-once guarantee above does not depend on it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException, Producer

from eosink.spark_jobs import kafka_checks, worker_overheads
from eosink.spark_jobs import native as native_produce
from eosink.spark_jobs.errors import (
    COMPONENT,
    AuthorizationError,
    PublishError,
    TaskTooLongError,
    TransactionFencedError,
)
from eosink.spark_jobs.ledger import LedgerEntry, entry_value, lookup_committed
from eosink.spark_jobs.naming import ledger_key, record_id_prefix, stream_transactional_id, transactional_id
from eosink.spark_jobs.outbox import CompiledOutbox
from eosink.spark_jobs.produce import ProduceLoops, plain_outbox
from eosink.spark_jobs.replay_check import ReplayScan
from eosink.spark_jobs.txn_errors import classify
from eosink.worker.engine.kafka_errors import authorization_error

FaultHook = Callable[[str, int, int], None]
"""Test-only: called as ``hook(point, partition, attempt)`` at the points below; may raise."""

FAULT_POINTS = ("before_init", "after_init", "after_check", "after_first_batch", "before_commit", "after_commit")

PUBLISHED = "published"  # this attempt committed the partition
COMMITTED_BY_EARLIER_ATTEMPT = "committed_by_earlier_attempt"  # same call, an earlier attempt committed
SKIPPED = "skipped"  # an earlier call with the same run id committed it
NEW_IN_THIS_CALL = (PUBLISHED, COMMITTED_BY_EARLIER_ATTEMPT)
EMPTY = "empty"  # a micro-batch partition without rows: nothing to publish, no transaction (TaskSpec.stream)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, built on the driver and shipped (pickled) with the closure."""

    job: str
    run_id: str
    producer_config: dict[str, Any]
    outboxes: tuple[CompiledOutbox, ...]
    ledger_topic: str
    ledger_since: int
    known_published: frozenset[int]
    transaction_timeout_ms: int
    pending: dict[int, tuple[int, ...]] = field(default_factory=dict)  # undecided entry offsets < ledger_since
    num_partitions: int | None = None
    init_timeout_s: float = 30.0
    ledger_timeout_s: float = 60.0
    budget_fraction: float = 0.8
    fault_hook: FaultHook | None = None
    extra_headers: tuple[tuple[str, bytes], ...] = field(default_factory=tuple)
    call_id: str = ""  # one per publish_outbox call: tells "an earlier attempt of this call" apart
    #: The C produce loop where it applies (the driver's EOSINK_PUBLISHER_NATIVE=0 turns it off).
    native_produce: bool = True
    #: A micro-batch of a streaming query (:mod:`eosink.spark_jobs.stream_task`): one transactional.id per
    #: (job, partition), a partition known by its content, not its index; without rows, no transaction.
    stream: bool = False
    #: Streaming: the contents of the run committed before this attempt, by identity (see stream_task).
    published_content: dict[str, LedgerEntry] = field(default_factory=dict)
    #: Fields added to the partition's ledger entry (a micro-batch's query id and batch id).
    entry_extra: dict[str, Any] = field(default_factory=dict)
    #: The run's marker is in the ledger: every row of it is published, no task writes anything.
    complete: bool = False
    #: Streaming, a replay of a partly committed batch: where the run's committed records are (replay_check).
    replay: ReplayScan | None = None

    @property
    def bootstrap(self) -> str:
        return str(self.producer_config.get("bootstrap.servers"))


@dataclass
class PartitionResult:
    partition: int
    attempt: int
    status: str  # PUBLISHED, COMMITTED_BY_EARLIER_ATTEMPT or SKIPPED
    records: int
    topics: dict[str, int]
    seconds: float
    transactional_id: str
    #: Seconds per step of the attempt (see :data:`STEPS`), for finding where a slow task's time went.
    steps: dict[str, float] = field(default_factory=dict)
    #: Records produced by the C loop (:mod:`eosink.spark_jobs.native`); the others by the Python loop.
    c_rows: int = 0


#: ``open``: producer, init_transactions (fencing) and the ledger check; ``input``: waiting for Spark to
#: hand over the rows (the JVM's encoding and the Arrow transfer); ``write``: the produce loop; ``commit``:
#: ledger entry, flush and commit_transaction.
STEPS = ("open", "input", "write", "commit")


class PartitionPublisher(ProduceLoops):
    """One attempt at one partition: ``open()``, ``write()`` Arrow batches, ``commit()``.

    Used by the Spark task (:func:`publish_partition`) and directly by tests that need to drive
    two attempts by hand (the zombie test).
    """

    def __init__(self, spec: TaskSpec, partition: int, attempt: int) -> None:
        self.spec = spec
        self.partition = partition
        self.attempt = attempt
        self.tid = (stream_transactional_id(spec.job, partition) if spec.stream
                    else transactional_id(spec.job, spec.run_id, partition))
        self._prefix = record_id_prefix(spec.job, spec.run_id, partition)
        self._run = spec.run_id.encode()
        self._producer: Producer | None = None
        #: The C produce loop on that producer (None: the Python loop; see eosink.spark_jobs.native).
        self._native: native_produce.NativeLoop | None = None
        self._in_txn = False
        #: Committed (or nothing begun because an earlier attempt committed): nothing left for close() to abort.
        self._clean = False
        self._began_at = 0.0
        self._started_at = time.monotonic()
        self.seq = 0
        self.c_rows = 0  # of which produced by the C loop
        self.counts: dict[str, int] = {ob.topic: 0 for ob in spec.outboxes}
        self.watch = kafka_checks.watch(spec.producer_config)
        #: Whether the ledger entry was produced in the open transaction (the topics it wrote, for errors).
        self._ledger_written = False
        self.steps: dict[str, float] = {}

    def _took(self, step: str, since: float) -> None:
        self.steps[step] = self.steps.get(step, 0.0) + time.monotonic() - since

    def _fail(self, e: KafkaException, during: str) -> Exception:
        """The classified error of a failed call: a refused login / TLS handshake, an ACL refusal, or the call's.

        A topic the transaction may not write fails it with TOPIC_AUTHORIZATION_FAILED, which does not say
        which topic; its records only fail as purged. Per-record delivery reports would tell, but
        confluent-kafka still serves them after it has set a fatal error (a fenced producer) to be raised,
        and the flush then fails with a SystemError instead of the fencing: so the error names the topics the
        transaction wrote, one of which is refused."""
        seen = self.watch.seen
        if seen is not None:
            return seen
        err = e.args[0]
        if err.name() == "TOPIC_AUTHORIZATION_FAILED":
            written = [t for t, n in self.counts.items() if n] + ([self.spec.ledger_topic] if self._ledger_written else [])
            refused = authorization_error(err, self.spec.producer_config, "WRITE", " or ".join(written) or "?",
                                          component=COMPONENT, cls=AuthorizationError)
            if refused is not None:
                return refused
        return classify(e, self.tid, self.spec.bootstrap, during, self.spec.producer_config)

    # -- lifecycle ---------------------------------------------------------------------------

    def _hook(self, point: str) -> None:
        if self.spec.fault_hook is not None:
            self.spec.fault_hook(point, self.partition, self.attempt)

    def open(self) -> LedgerEntry | None:
        """Fence earlier attempts, then check the ledger. Returns the committed entry if the
        partition is already published (then nothing must be written), else ``None``."""
        spec = self.spec
        if spec.complete or self.partition in spec.known_published:
            # The driver saw it committed; committed is forever, no need to touch the coordinator.
            return LedgerEntry(spec.job, spec.run_id, self.partition, -1)
        self._hook("before_init")
        began = time.monotonic()
        self._start_producer()
        self._hook("after_init")
        entry = self._committed_entry()
        self._took("open", began)
        self._hook("after_check")
        return entry

    def _start_producer(self) -> None:
        """A transactional producer for this attempt's transactional.id, ``init_transactions`` done (fencing)."""
        spec = self.spec
        conf = {
            **spec.producer_config,
            "transactional.id": self.tid,
            "transaction.timeout.ms": spec.transaction_timeout_ms,
        }
        conf["message.timeout.ms"] = min(int(conf.get("message.timeout.ms", 300_000)), spec.transaction_timeout_ms)
        self.watch.install(conf)
        try:
            self._producer = Producer(conf)
        except KafkaException as e:
            raise PublishError(f"invalid producer configuration for '{self.tid}': {e.args[0].str()}") from None
        self._native = native_produce.loop_for(self._producer) if spec.native_produce and plain_outbox(spec) else None
        try:
            # A broker connection first: librdkafka asks for the transaction coordinator at once and, with no
            # broker up yet (a busy executor), retries only 500 ms later - measured here in about half of the tasks.
            self._producer.list_topics(timeout=spec.init_timeout_s)
            self._producer.init_transactions(spec.init_timeout_s)
        except KafkaException as e:
            try:
                self._producer.poll(0)  # serve the error callback: a refused login shows only there
            except KafkaException:
                pass  # a producer in a fatal state raises that state again: the error at hand says it
            raise self._fail(e, "init_transactions") from None

    def _ledger_key(self) -> str:
        return ledger_key(self.spec.job, self.spec.run_id, self.partition)

    def _committed_entry(self) -> LedgerEntry | None:
        """The ledger's committed entry for this partition (asked only once earlier attempts are fenced)."""
        spec = self.spec
        return lookup_committed(spec.producer_config, spec.ledger_topic, self._ledger_key(), spec.ledger_since,
                                spec.ledger_timeout_s, pending=spec.pending.get(self.partition, ()))

    def _entry_extra(self) -> dict[str, Any]:
        """Fields the ledger entry adds to the spec's."""
        return {}

    def _begin(self) -> None:
        assert self._producer is not None, "open() first"
        try:
            self._producer.begin_transaction()
        except KafkaException as e:
            raise self._fail(e, "begin_transaction") from None
        self._in_txn = True
        self._began_at = time.monotonic()

    def write(self, batch: pa.RecordBatch) -> None:
        """Produce one Arrow batch of projected columns into the open transaction."""
        began = time.monotonic()
        if not self._in_txn:
            self._begin()
        if batch.num_rows:
            self._produce(batch)
        self._took("write", began)
        self._check_budget()

    def _check_budget(self) -> None:
        """Abort before the coordinator does: its abort would surface later as a confusing error."""
        if not self._in_txn:
            return
        elapsed = time.monotonic() - self._began_at
        if elapsed * 1000 > self.spec.transaction_timeout_ms * self.spec.budget_fraction:
            self.abort()
            raise TaskTooLongError(self.tid, elapsed, self.spec.transaction_timeout_ms, self.seq)

    def commit(self) -> PartitionResult:
        """Write the ledger entry last, flush, commit. Raises a classified error on failure."""
        began = time.monotonic()
        if not self._in_txn:
            self._begin()  # an empty partition still records that it is done
        self._check_budget()
        spec = self.spec
        producer = self._producer
        assert producer is not None
        try:
            self._ledger_written = True
            producer.produce(
                spec.ledger_topic,
                entry_value(
                    spec.job,
                    spec.run_id,
                    self.partition,
                    self.seq,
                    self.counts,
                    attempt=self.attempt,
                    num_partitions=spec.num_partitions,
                    transactional_id=self.tid,
                    call_id=spec.call_id,
                    published_at_ms=int(time.time() * 1000),
                    **spec.entry_extra,
                    **self._entry_extra(),
                ),
                self._ledger_key(),
                partition=0,
            )
            producer.flush(spec.transaction_timeout_ms / 1000)
            self._hook("before_commit")
            self._commit_with_retries()
        except KafkaException as e:
            err = self._fail(e, "commit_transaction")
            self._abort_quietly(err)
            raise err from None
        self._in_txn = False
        self._clean = True
        self._took("commit", began)
        self._hook("after_commit")
        return PartitionResult(
            self.partition,
            self.attempt,
            PUBLISHED,
            self.seq,
            dict(self.counts),
            time.monotonic() - self._started_at,
            self.tid,
            dict(self.steps),
            self.c_rows,
        )

    def _commit_with_retries(self, tries: int = 5) -> None:
        """librdkafka's contract: a retriable commit error means "call commit again"."""
        assert self._producer is not None
        for i in range(tries):
            try:
                self._producer.commit_transaction(self.spec.transaction_timeout_ms / 1000)
                return
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or err.txn_requires_abort() or err.fatal() or i == tries - 1:
                    raise
                time.sleep(0.2 * (i + 1))

    def _abort_quietly(self, why: Exception) -> None:
        if isinstance(why, TransactionFencedError):
            return  # a fenced producer cannot abort; the newer epoch already did
        try:
            self.abort()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass

    def abort(self) -> None:
        if self._producer is not None and self._in_txn:
            self._in_txn = False
            try:
                self._producer.abort_transaction(30)
            except KafkaException as e:
                raise self._fail(e, "abort_transaction") from None

    def close(self) -> None:
        """Drop the producer; an open transaction is aborted (or left to the next attempt's init)."""
        if self._producer is not None:
            if self._in_txn:
                self._abort_quietly(PublishError("closing"))
            producer, self._producer, self._native = self._producer, None, None
            # After a commit, destroyed here rather than whenever the last reference goes (librdkafka's
            # teardown blocks its caller). Not after a failure: close() would end the failed transaction
            # again, warn or raise, and hide the error the task is failing with.
            close = getattr(producer, "close", None)  # (confluent-kafka >= 2.13)
            if close is not None and self._clean:
                try:
                    close()
                except KafkaException:
                    pass  # the task's outcome is decided; a teardown error changes nothing in Kafka

    def empty(self) -> PartitionResult:
        """No rows: nothing written, not even a ledger entry (a replay of an empty partition has nothing to repeat)."""
        self._clean = True
        return PartitionResult(self.partition, self.attempt, EMPTY, 0, {}, time.monotonic() - self._started_at, self.tid,
                               dict(self.steps))

    def skipped(self, entry: LedgerEntry) -> PartitionResult:
        """Nothing written; ``records``/``topics`` are what the committed attempt published
        (``-1`` when the driver already knew, it has the numbers)."""
        same_call = bool(self.spec.call_id) and entry.call_id == self.spec.call_id
        self._clean = not self._in_txn
        return PartitionResult(
            self.partition,
            self.attempt,
            COMMITTED_BY_EARLIER_ATTEMPT if same_call else SKIPPED,
            entry.records,
            dict(entry.topics),
            time.monotonic() - self._started_at,
            self.tid,
            dict(self.steps),
        )


def publish_partition(spec: TaskSpec, partition: int, attempt: int, batches: Iterator[pa.RecordBatch]) -> PartitionResult:
    """One Spark task: open (fence + ledger check), write every batch, commit."""
    worker_overheads.install()  # the worker's next tasks: no re-read of pyspark.zip, a shorter gc.collect()
    pub: PartitionPublisher
    if spec.stream:
        from eosink.spark_jobs.stream_task import StreamPartitionPublisher

        pub = StreamPartitionPublisher(spec, partition, attempt)
    else:
        pub = PartitionPublisher(spec, partition, attempt)
    rows = iter(batches)
    try:
        if spec.stream:
            waited = time.monotonic()
            head = next((b for b in rows if b.num_rows), None)
            pub._took("input", waited)
            if head is None:
                return pub.empty()
            rows = itertools.chain([head], rows)
        done = pub.open()
        if done is not None:
            return pub.skipped(done)
        first = True
        while True:
            waited = time.monotonic()
            batch = next(rows, None)
            pub._took("input", waited)
            if batch is None:
                break
            pub.write(batch)
            if first:
                pub._hook("after_first_batch")
                first = False
        return pub.commit()
    finally:
        pub.close()
