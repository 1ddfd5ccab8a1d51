"""The Spark side of a partition's publish: the function ``mapInArrow`` runs, and the one row it returns.

Each task publishes its partition (:func:`eosink.spark_jobs.task.publish_partition`) and hands the
driver one summary row; the driver rebuilds the :class:`~eosink.spark_jobs.task.PartitionResult`
from it (:func:`result_of`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from eosink.spark_jobs.task import PartitionResult, TaskSpec, publish_partition

SUMMARY_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("status", pa.string()),
        ("records", pa.int64()),
        ("topics", pa.string()),
        ("seconds", pa.float64()),
        ("transactional_id", pa.string()),
        ("steps", pa.string()),
        ("c_rows", pa.int64()),
    ]
)
SUMMARY_DDL = (
    "partition int, attempt int, status string, records long, topics string, seconds double, transactional_id string, "
    "steps string, c_rows long"
)


def summary_batch(result: PartitionResult) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "partition": result.partition,
                "attempt": result.attempt,
                "status": result.status,
                "records": result.records,
                "topics": json.dumps(result.topics, sort_keys=True),
                "seconds": result.seconds,
                "transactional_id": result.transactional_id,
                "steps": json.dumps(result.steps),
                "c_rows": result.c_rows,
            }
        ],
        schema=SUMMARY_SCHEMA,
    )


def make_task_function(spec: TaskSpec) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function handed to ``DataFrame.mapInArrow``: one summary row per partition."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        yield summary_batch(publish_partition(spec, partition, attempt, batches))

    return run


def result_of(row: Any) -> PartitionResult:
    """The :class:`PartitionResult` of one summary row (a collected ``Row``)."""
    return PartitionResult(row.partition, row.attempt, row.status, row.records, json.loads(row.topics), row.seconds,
                           row.transactional_id, json.loads(row.steps), row.c_rows)
