"""The ``eosink`` format: ``df.write.format("eosink")`` and ``df.writeStream.format("eosink")``.

Spark's Python Data Source API (PySpark 4.1): the writer's ``write`` runs in every task on Arrow
batches (the publisher's C loop takes them as they are), ``commit``/``abort`` on the driver. Both
writers publish exactly as :func:`~eosink.spark_jobs.publisher.publish_outbox` does, one Kafka
transaction per partition with its ledger entry (:func:`~eosink.spark_jobs.task.publish_partition`);
the options are in :mod:`eosink.spark_jobs.sink_options`. ``register(spark)`` makes the format
known to a session (``build_session`` does it).

Where the driver work happens, and why it differs from ``publish_outbox``:

* A batch write: Spark builds the writer once, on the driver, before any task, and ships that very
  object to the tasks and back to ``commit``. The writer does ``publish_outbox``'s checks and ledger
  read when it is built; ``commit`` writes the run marker.
* A streaming write: Spark builds a writer per micro-batch twice on the driver, once to ship to the
  tasks and once to call ``commit``/``abort`` with the batch id, and never tells the first one the
  batch id or the query id (only the tasks learn them, from the local properties Spark gives a
  micro-batch's jobs). So the shipped writer does the broker checks and reads the job's ledger
  incrementally when it is pickled, for every run the job's ledger keeps
  (:mod:`eosink.spark_jobs.ledger_index`), ending the job's open transactions first when a run was
  started and not completed (a replay is coming) or this process has not planned for the job yet;
  each task picks its own run (``{query id}.{batch id}``) from that and publishes by content
  (:mod:`eosink.spark_jobs.stream_task`). ``commit`` writes the batch's run marker; ``abort`` ends
  the transactions of the partitions whose task did not report.

Spark 4.1 accepts only append mode from a Python data source in a stream (it refuses update mode
itself); complete mode is refused here (an outbox would deliver the whole result every batch). For
update mode, or to have a replay with another partition count refused before any task publishes, use
``publish_outbox_stream``; a format task checks a replay's regrouped rows itself before it commits
(:mod:`eosink.spark_jobs.replay_check`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs import worker_overheads
from eosink.spark_jobs.errors import PublishError
from eosink.spark_jobs.faults import for_batch
from eosink.spark_jobs.fencing import fence
from eosink.spark_jobs.ledger import RunState, read_run
from eosink.spark_jobs.ledger_index import StreamRun, run_states
from eosink.spark_jobs.naming import stream_run_id, stream_transactional_id, transactional_id
from eosink.spark_jobs.publisher import native_enabled, preflight
from eosink.spark_jobs.replay_check import ReplayScan, plan_scan
from eosink.spark_jobs.runs import finish_run
from eosink.spark_jobs.sink_options import SOURCE, SinkSettings, adapt, parse
from eosink.spark_jobs.task import PartitionResult, TaskSpec, publish_partition

log = logging.getLogger("eosink.spark")

NAME = "eosink"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def register(spark: SparkSession) -> None:
    """Make ``format("eosink")`` known to ``spark`` (idempotent)."""
    spark.dataSource.register(EosinkDataSource)


class EosinkDataSource(DataSource):
    """``format("eosink")``: a batch or streaming writer into outbox topics, exactly once per row."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        worker_overheads.install()  # runs in a Python worker Spark reuses for every query's planning
        if overwrite:
            raise ConfigError("an outbox is append-only: write with mode('append'), not mode('overwrite')", key="mode",
                              source=SOURCE)
        return BatchWriter(parse(self.options, schema, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        worker_overheads.install()  # the same worker plans every micro-batch of the query
        if overwrite:
            raise ConfigError("outputMode('complete') would publish the whole result table again every micro-batch; "
                              "use outputMode('append') (or publish_outbox_stream(output_mode='update'))",
                              key="outputMode", source=SOURCE)
        return StreamWriter(parse(self.options, schema, streaming=True))


@dataclass
class PartitionMessage(WriterCommitMessage):
    """What a task tells the driver's ``commit``: its result, and the query id of a micro-batch."""

    result: PartitionResult
    query_id: str | None = None


def _template(settings: SinkSettings, **fields: Any) -> TaskSpec:
    base: dict[str, Any] = dict(
        job=settings.job, run_id=settings.run_id or "", producer_config=settings.producer_config,
        outboxes=settings.outboxes, ledger_topic=settings.ledger_topic, ledger_since=0, known_published=frozenset(),
        transaction_timeout_ms=settings.transaction_timeout_ms, ledger_timeout_s=settings.ledger_timeout_s,
        native_produce=native_enabled(), extra_headers=settings.headers,
    )
    return TaskSpec(**{**base, **fields})


def _task() -> tuple[Any, int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "write() runs in a Spark task"
    return ctx, ctx.partitionId(), ctx.attemptNumber()


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("eosink")``: ``publish_outbox``'s run, checks and ledger read done when built."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self.started = time.monotonic()
        preflight(settings.producer_config, settings.topics, settings.ledger_topic, settings.transaction_timeout_ms,
                  settings.connect_timeout_s)
        assert settings.run_id is not None
        self.state = read_run(settings.producer_config, settings.ledger_topic, settings.job, settings.run_id,
                              settings.ledger_timeout_s)
        self.spec = _template(settings, ledger_since=self.state.end_offset, known_published=frozenset(self.state.entries),
                              pending=self.state.pending, complete=self.state.marker is not None,
                              fault_hook=settings.fault_hook)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionMessage:
        _, partition, attempt = _task()
        return PartitionMessage(publish_partition(self.spec, partition, attempt, adapt(iterator, self.settings.cast_to_string)))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.state.marker is not None:
            log.info("run %s/%s was already complete; nothing published", self.spec.job, self.spec.run_id)
            return
        results = [m.result for m in messages if isinstance(m, PartitionMessage)]
        result = finish_run(self.spec, self.state, results, self.started, self.started)
        log.info("run %s/%s: %s records published", self.spec.job, self.spec.run_id, result.records)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        failed = [transactional_id(self.spec.job, self.spec.run_id, p) for p, m in enumerate(messages) if m is None]
        fence(self.spec.producer_config, failed, self.spec.transaction_timeout_ms)


_CHECKED: set[Any] = set()
_FENCED: set[Any] = set()
_LOCK = threading.Lock()


_SCANS: dict[Any, ReplayScan] = {}


def _scan(s: SinkSettings, ident: Any, run_id: str, run: StreamRun) -> ReplayScan:
    """Where a replay of ``run_id`` finds the run's committed records (:mod:`eosink.spark_jobs.replay_check`).

    Measured after the job's earlier transactions were ended, and kept while the run's committed entries stay
    the same: a run left incomplete by an abandoned query is in every micro-batch's view, and must not cost one."""
    key = (ident, run_id, tuple(sorted(run.contents)), tuple(sorted(run.indices)), run.pending)
    with _LOCK:
        scan = _SCANS.get(key)
    if scan is None or run.pending:
        scan = plan_scan(s.producer_config, s.topics, run.contents.values(), bool(run.pending), s.ledger_timeout_s)
        with _LOCK:
            _SCANS[key] = scan
    return scan


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("eosink")``: one run per micro-batch (see the module doc for who does what)."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        #: Filled when the writer is pickled for the tasks: every kept run's state, and where their ledger reads begin.
        self.runs: dict[str, StreamRun] | None = None
        self.since = 0
        self.scans: dict[str, ReplayScan] = {}

    def __getstate__(self) -> dict[str, Any]:
        if self.runs is None:
            self._prepare()
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        worker_overheads.install()  # unpickled in the query's commit worker too, once per micro-batch
        self.__dict__.update(state)

    def _prepare(self) -> None:
        """On the driver, once per micro-batch: the broker checks (once per process) and the job's ledger.

        The writer does not know which run its tasks will have, so before the first batch this process plans
        for the job, and whenever a run of the job was started and not completed (a replay is coming), it ends
        every transaction of the job's transactional.ids up to the highest partition index the ledger shows
        (:mod:`eosink.spark_jobs.stream_task` says why a replay needs that)."""
        s = self.settings
        ident = (tuple(sorted((k, str(v)) for k, v in s.producer_config.items())), tuple(s.topics), s.ledger_topic,
                 s.transaction_timeout_ms)
        with _LOCK:
            if ident not in _CHECKED:
                preflight(s.producer_config, s.topics, s.ledger_topic, s.transaction_timeout_ms, s.connect_timeout_s)
                _CHECKED.add(ident)
        runs, since = run_states(s.producer_config, s.ledger_topic, s.job, None, s.ledger_timeout_s)
        started = sorted(r for r, run in runs.items() if run.marker is None and run.started)
        fencing = (ident, s.job, tuple(started))
        with _LOCK:
            fresh = fencing not in _FENCED
        if fresh:
            upper = max([1, *(p + 1 for run in runs.values() for p in run.indices),
                         *(run.marker.num_partitions or 0 for run in runs.values() if run.marker is not None)])
            refused = fence(s.producer_config, [stream_transactional_id(s.job, p) for p in range(upper)],
                            s.transaction_timeout_ms)
            if refused:
                raise PublishError(f"could not end the open transactions of {', '.join(refused)} of job '{s.job}'; "
                                   "publishing now could duplicate rows an earlier attempt still commits")
            with _LOCK:
                _FENCED.add(fencing)
            if started:
                runs, since = run_states(s.producer_config, s.ledger_topic, s.job, None, s.ledger_timeout_s)
        self.scans = {r: _scan(s, ident, r, run) for r, run in runs.items() if run.marker is None and (run.contents or run.pending)}
        self.runs, self.since = runs, since

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionMessage:
        ctx, partition, attempt = _task()
        query_id, batch_id = ctx.getLocalProperty(QUERY_ID_PROPERTY), ctx.getLocalProperty(BATCH_ID_PROPERTY)
        assert query_id and batch_id is not None and self.runs is not None, "a micro-batch task of a shipped writer"
        run_id = stream_run_id(query_id, int(batch_id))
        run = self.runs.get(run_id) or StreamRun(end_offset=self.since)
        spec = _template(
            self.settings, run_id=run_id, ledger_since=self.since, published_content=run.contents,
            pending={-1: run.pending}, complete=run.marker is not None, stream=True,
            entry_extra={"query_id": query_id, "batch_id": int(batch_id)},
            fault_hook=for_batch(self.settings.fault_hook, int(batch_id)), replay=self.scans.get(run_id),
        )
        result = publish_partition(spec, partition, attempt, adapt(iterator, self.settings.cast_to_string))
        return PartitionMessage(result, query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        parts = [m for m in messages if isinstance(m, PartitionMessage)]
        query_id = next((m.query_id for m in parts if m.query_id), None)
        if query_id is None or all(m.result.records < 0 for m in parts):
            return  # a batch without partitions, or the replay of one whose run marker is in the ledger
        s = self.settings
        run_id = stream_run_id(query_id, batchId)
        spec = _template(s, run_id=run_id, stream=True, entry_extra={"query_id": query_id, "batch_id": batchId})
        now = time.monotonic()
        result = finish_run(spec, RunState({}, {}, None, 0), [m.result for m in parts], now, now)
        log.info("micro-batch %s of %s: %s records published", batchId, s.job, result.records)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        failed = [stream_transactional_id(self.settings.job, p) for p, m in enumerate(messages) if m is None]
        fence(self.settings.producer_config, failed, self.settings.transaction_timeout_ms)
