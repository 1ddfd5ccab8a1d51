"""``publish_outbox_stream``: a streaming DataFrame into Kafka outbox topics, exactly once per input row.

Structured Streaming runs a query as micro-batches. Before a batch runs, Spark writes its source
offsets to the checkpoint's offset log; after the sink returns, it records the batch in the commit
log. A restart replays the last batch that is in the first and not the second, with the same batch
id and the same source offsets. Each micro-batch here is one run of the batch publisher: run id
``{query id}.{batch id}`` (:func:`~eosink.spark_jobs.naming.stream_run_id`; the query id is kept in
the checkpoint), one Kafka transaction per partition with its ledger entry, a run marker when every
partition committed. A replayed batch therefore has the run id of the attempt it repeats, and only
the partitions missing from the ledger publish.

The micro-batch is published from ``foreachBatch`` on the driver, which knows the batch id and the
batch's partition count *before* any task runs: the count is recorded in every ledger entry and a
replay that splits its rows into another number of partitions is refused before it publishes
anything (:class:`~eosink.spark_jobs.errors.PartitioningChangedError`). ``foreachBatch`` is also what
makes update mode possible: Spark 4.1 refuses update mode for Python data sources (the ``eosink``
format, :mod:`eosink.spark_jobs.datasource`), whose writer only learns the batch id inside its tasks.

Streaming differs from ``publish_outbox`` in three ways, all for a query that runs for ever: one
transactional.id per (job, partition) instead of per run (the broker keeps every id for days), the
ledger read incrementally (:mod:`eosink.spark_jobs.ledger_index`), and a short default transaction
timeout, since a transaction left open by a killed driver holds back every read_committed consumer
of its outbox partitions until it ends; on a failed batch the driver also aborts what its tasks left
open (:mod:`eosink.spark_jobs.fencing`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from eosink.connectors.api.errors import ConfigError, EosinkError
from eosink.spark_jobs.errors import PartitioningChangedError, PublishError
from eosink.spark_jobs.faults import for_batch
from eosink.spark_jobs.fencing import fence
from eosink.spark_jobs.ledger import RunState
from eosink.spark_jobs.ledger_index import StreamRun, run_states
from eosink.spark_jobs.naming import LEDGER_TOPIC, stream_run_id, stream_transactional_id, validate_name
from eosink.spark_jobs.outbox import CompiledOutbox, Outbox, normalize, project, repartition_by_key
from eosink.spark_jobs.publisher import (
    DEFAULT_STREAM_TRANSACTION_TIMEOUT_MS,
    encode_headers,
    native_enabled,
    preflight,
    producer_config,
)
from eosink.spark_jobs.replay_check import plan_scan
from eosink.spark_jobs.runs import PublishResult, already_published, finish_run, run_tasks
from eosink.spark_jobs.session import uncap_arrow_batches
from eosink.spark_jobs.task import FaultHook, TaskSpec

log = logging.getLogger("eosink.spark")

OUTPUT_MODES = ("append", "update")
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the local property Spark sets on a micro-batch's jobs


def publish_outbox_stream(
    df: DataFrame,
    topic: str | Outbox | Sequence[str | Outbox],
    *,
    key: str | None = None,
    job: str,
    checkpoint: str | None,
    kafka: str | Mapping[str, Any],
    trigger: Mapping[str, Any] | None = None,
    output_mode: str = "append",
    partitions: int | None = None,
    headers: Mapping[str, str] | None = None,
    query_name: str | None = None,
    ledger_topic: str = LEDGER_TOPIC,
    transaction_timeout_ms: int = DEFAULT_STREAM_TRANSACTION_TIMEOUT_MS,
    connect_timeout_s: float = 15.0,
    ledger_timeout_s: float = 60.0,
    transform: Callable[[DataFrame], DataFrame] | None = None,
    on_batch: Callable[[PublishResult], None] | None = None,
    fault_hook: FaultHook | None = None,
) -> StreamingQuery:
    """Start a query publishing every row of the streaming ``df`` to ``topic`` (one or several outboxes).

    Arguments as :func:`~eosink.spark_jobs.publisher.publish_outbox`, except: ``job`` names the query
    (one running query per job; a new checkpoint gets new run ids by itself), ``checkpoint`` is the
    checkpoint location (required: it is what a restart resumes from), ``trigger`` the keyword of
    ``DataStreamWriter.trigger`` (``{"processingTime": "5 seconds"}``, ``{"availableNow": True}``),
    ``output_mode`` ``append`` or ``update`` (``complete`` re-sends every row of the result each
    batch, which an outbox would deliver again and again). ``partitions=N`` repartitions each
    micro-batch by the key, which makes its split a function of its rows (see the README's safe
    plans). The transaction timeout defaults to 30 s. ``transform`` turns each micro-batch (a batch
    DataFrame) into the rows to publish, for what a streaming plan cannot express (it must be
    deterministic: a replay must give the same rows). Each micro-batch is planned without adaptive
    query execution, whose partition coalescing could group a replay's rows differently. ``on_batch``
    is called on the driver with each micro-batch's :class:`~eosink.spark_jobs.runs.PublishResult`.
    Bad input raises before the query starts.
    """
    if not df.isStreaming:
        raise ConfigError("publish_outbox_stream takes a streaming DataFrame and this one is a batch one: publish it "
                          "with publish_outbox(df, ...) or df.write.format('eosink')", key="df",
                          source="publish_outbox_stream")
    validate_name(job, "job")
    if not checkpoint:
        raise ConfigError("publish_outbox_stream needs checkpoint= (a checkpoint location): a restart resumes from it, "
                          "and without it a replayed micro-batch could not be recognised", key="checkpoint",
                          source="publish_outbox_stream")
    if output_mode not in OUTPUT_MODES:
        raise ConfigError(f"output_mode={output_mode!r} cannot be published exactly once per row: one of {OUTPUT_MODES} "
                          "(complete mode re-sends the whole result every micro-batch)", key="output_mode",
                          source="publish_outbox_stream")
    outboxes = normalize(topic)
    plan = BatchPlan(outboxes, key, partitions, transform)
    # MissingColumnError before touching Kafka: the plan applied to an empty micro-batch of the stream's schema
    compiled = plan.project(df.sparkSession.createDataFrame([], df.schema))[1]
    conf = producer_config(kafka, streaming=True)
    preflight(conf, [ob.topic for ob in compiled], ledger_topic, transaction_timeout_ms, connect_timeout_s)
    template = TaskSpec(
        job=job, run_id="", producer_config=conf, outboxes=tuple(compiled), ledger_topic=ledger_topic, ledger_since=0,
        known_published=frozenset(), transaction_timeout_ms=transaction_timeout_ms, ledger_timeout_s=ledger_timeout_s,
        native_produce=native_enabled(), extra_headers=encode_headers(headers), stream=True,
    )
    prefetch_ledger(template)
    publisher = MicroBatchPublisher(template, plan, fault_hook, on_batch)
    writer = df.writeStream.foreachBatch(publisher).outputMode(output_mode).option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()


@dataclass(frozen=True)
class BatchPlan:
    """What a micro-batch becomes before it is published: transformed, repartitioned by key, projected."""

    outboxes: list[Outbox]
    key: str | None
    partitions: int | None
    transform: Callable[[DataFrame], DataFrame] | None

    def project(self, batch: DataFrame) -> tuple[DataFrame, list[CompiledOutbox]]:
        frame = self.transform(batch) if self.transform is not None else batch
        return project(repartition_by_key(frame, self.partitions, self.key, self.outboxes), self.outboxes, self.key)


def partition_count(df: DataFrame) -> int:
    """The number of partitions ``df``'s plan has: planned, not run (``df.rdd`` would record an SQL execution of its
    own and convert the rows for Python; with adaptive execution, both would run the plan's shuffles)."""
    return int(df._jdf.queryExecution().toRdd().getNumPartitions())


def prefetch_ledger(spec: TaskSpec) -> threading.Thread:
    """Read the job's ledger records in the background while Spark starts the query, so that the first micro-batch
    reads only its tail (:mod:`eosink.spark_jobs.ledger_index`: a process reads a job's records from offset 0 once).
    It only fills the process's cache: each batch still reads up to the log end after its fence. A failure is left
    to the first batch's own read, which raises it."""

    def read() -> None:
        try:
            run_states(spec.producer_config, spec.ledger_topic, spec.job, [], spec.ledger_timeout_s)
        except Exception as e:  # noqa: BLE001 - the first micro-batch reads again and raises
            log.debug("reading the ledger of job '%s' ahead of the first micro-batch failed: %s", spec.job, e)

    thread = threading.Thread(target=read, name=f"eosink-ledger-{spec.job}", daemon=True)
    thread.start()
    return thread


class MicroBatchPublisher:
    """The ``foreachBatch`` function: one micro-batch, one run (called on the driver, batch after batch)."""

    def __init__(self, template: TaskSpec, plan: BatchPlan, fault_hook: FaultHook | None = None,
                 on_batch: Callable[[PublishResult], None] | None = None) -> None:
        self.template = template
        self.plan = plan
        self.on_batch = on_batch
        self.fault_hook = fault_hook
        self.fenced = False  # the first batch of this query start ends what a killed driver left open
        #: The last batch's result (for logs and tests; the outboxes and the ledger are the record).
        self.last: PublishResult | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        spec = self.template
        query_id = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise ConfigError("MicroBatchPublisher runs as a streaming query's foreachBatch function", key="foreachBatch")
        run_id = stream_run_id(query_id, batch_id)
        # The partition count is read from the plan before any task runs. Adaptive execution (on in the session
        # Spark gives a micro-batch) could only tell it by running the batch's shuffles first, and would run them
        # again in the publish job; without it the count is the plan's, read without a Spark job. (The session is
        # the query's own: the setting does not reach the caller's.)
        batch.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
        uncap_arrow_batches(batch.sparkSession)  # no byte count after every row the JVM hands the tasks
        batch = self.plan.project(batch)[0]
        n = partition_count(batch)
        run, end = self._run(run_id, n)
        if run.marker is not None:  # committed in full; Spark's commit log missed it (a driver died in between)
            self._done(already_published(spec.job, run_id, RunState({}, {}, run.marker, end), started))
            return
        if run.num_partitions and run.num_partitions != {n}:
            raise PartitioningChangedError(spec.job, run_id, max(run.num_partitions), n, PartitioningChangedError.STREAM_ADVICE)
        spec = dataclasses.replace(
            spec, run_id=run_id, ledger_since=end, published_content=run.contents, pending={-1: run.pending},
            num_partitions=n, call_id=uuid.uuid4().hex, entry_extra={"query_id": query_id, "batch_id": batch_id},
            fault_hook=for_batch(self.fault_hook, batch_id),
            replay=plan_scan(spec.producer_config, [ob.topic for ob in spec.outboxes], run.contents.values(),
                             bool(run.pending), spec.ledger_timeout_s) if run.contents or run.pending else None,
        )
        job_started = time.monotonic()
        try:
            results = run_tasks(batch, spec, f"micro-batch {batch_id} of job '{spec.job}' failed; partitions committed "
                                             "so far are in the ledger and the batch, replayed when the query restarts "
                                             "from its checkpoint, publishes only the missing ones")
        except EosinkError:
            # Killed or failed tasks may have left transactions open: end them now rather than at their timeout.
            fence(spec.producer_config, [stream_transactional_id(spec.job, p) for p in range(n)], spec.transaction_timeout_ms)
            raise
        result = finish_run(spec, RunState({}, {}, None, end), results, started, job_started)
        log.info("micro-batch %s of %s: %s records in %s partitions", batch_id, spec.job, result.records,
                 result.published_partitions)
        self._done(result)

    def _done(self, result: PublishResult) -> None:
        self.last = result
        if self.on_batch is not None:
            self.on_batch(result)

    def _run(self, run_id: str, n: int) -> tuple[StreamRun, int]:
        """The ledger's view of the batch; before a replay of a started batch (and on the first batch of this query
        start), every transaction of the query's earlier attempts is ended first, so none can commit after the check."""
        spec = self.template
        states, end = run_states(spec.producer_config, spec.ledger_topic, spec.job, [run_id], spec.ledger_timeout_s)
        run = states[run_id]
        if run.marker is None and (run.started or not self.fenced):
            upper = max([n, *(p + 1 for p in run.indices), *run.num_partitions])
            refused = fence(spec.producer_config, [stream_transactional_id(spec.job, p) for p in range(upper)],
                            spec.transaction_timeout_ms)
            if refused:
                raise PublishError(f"could not end the open transactions of {', '.join(refused)} before micro-batch "
                                   f"{run_id} of job '{spec.job}'; publishing now could duplicate rows an earlier attempt "
                                   "still commits. Restart the query when the brokers answer")
            self.fenced = True
            states, end = run_states(spec.producer_config, spec.ledger_topic, spec.job, [run_id], spec.ledger_timeout_s)
            run = states[run_id]
        return run, end
