"""The driver side of one run: its Spark job over the partitions, and what the run leaves in the ledger.

A run is a ``publish_outbox`` call's ``(job, run_id)`` or one micro-batch of a streaming query; both
are planned the same way (a :class:`~eosink.spark_jobs.task.TaskSpec` after the ledger was read),
run as one ``mapInArrow`` job (:func:`run_tasks`) and finished the same way (:func:`finish_run`: the
partitioning check against the ledger, the counts and the run marker).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from pyspark.sql import DataFrame

from eosink.spark_jobs.arrow_map import map_in_arrow
from eosink.spark_jobs.errors import PartitioningChangedError, PublishError, from_task_failure
from eosink.spark_jobs.ledger import RunState, entry_value, write_plain
from eosink.spark_jobs.naming import run_marker_key
from eosink.spark_jobs.summary import SUMMARY_DDL, make_task_function, result_of
from eosink.spark_jobs.task import NEW_IN_THIS_CALL, PartitionResult, TaskSpec

log = logging.getLogger("eosink.spark")


@dataclass
class PublishResult:
    """What one ``publish_outbox`` call did.

    ``records``/``topics`` count what *this call* made visible; ``run_records`` counts the whole run
    (including partitions published by an earlier call with the same run id).
    """

    job: str
    run_id: str
    status: str  # "published" (this call committed something or finished the run) or "already_published"
    published_partitions: int
    skipped_partitions: int
    records: int
    topics: dict[str, int]
    run_records: int
    seconds: float
    partitions: list[PartitionResult] = field(default_factory=list)
    #: Driver-side seconds: ``checks`` (input, broker and ledger checks before the Spark job), ``job`` (the
    #: Spark job: every task, see ``partitions[i].steps``), ``finish`` (the run marker).
    steps: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("partitions")
        return d


def run_tasks(projected: DataFrame, spec: TaskSpec, note: str) -> list[PartitionResult]:
    """Publish every partition of ``projected`` (one task each); the results by partition.

    A failed job is re-raised as the task's own eosink error when it was one, else as a
    :class:`PublishError` with the innermost cause; ``note`` (what a retry publishes) is appended.
    """
    try:
        rows = map_in_arrow(projected, make_task_function(spec), SUMMARY_DDL).collect()
    except Exception as e:  # noqa: BLE001 - re-raised as a classified error, the task's own if it was ours
        note = f" [{note}]"
        original = from_task_failure(e)
        if original is None:
            raise PublishError(f"the Spark job failed: {_root_cause(e)}{note}") from e
        original.message += note
        original.args = (original.message,)
        raise original from e
    return sorted((result_of(r) for r in rows), key=lambda r: r.partition)


def finish_run(
    spec: TaskSpec, state: RunState, results: list[PartitionResult], started: float, job_started: float,
    advice: str = PartitioningChangedError.BATCH_ADVICE,
) -> PublishResult:
    """Every partition is committed: check the ledger saw no partition this run no longer has, write the
    run marker, count. ``started``/``job_started``: when the call and its Spark job began (monotonic)."""
    job_ended = time.monotonic()
    n = len(results)
    stale = sorted(p for p in state.entries if p >= n)
    if stale:
        raise PartitioningChangedError(spec.job, spec.run_id, max(stale) + 1, n, advice)

    published = [r for r in results if r.status in NEW_IN_THIS_CALL]
    topics = _sum_topics(r.topics for r in published)
    run_records, run_topic_maps = 0, []
    for r in results:
        earlier = state.entries.get(r.partition)
        if r.records < 0 and earlier is not None:
            run_records += max(earlier.records, 0)
            run_topic_maps.append(earlier.topics)
        else:
            run_records += max(r.records, 0)
            run_topic_maps.append(r.topics)
    _write_run_marker(spec.producer_config, spec.ledger_topic, spec.job, spec.run_id, n, run_records,
                      _sum_topics(run_topic_maps), spec.entry_extra)
    ended = time.monotonic()
    return PublishResult(
        spec.job, spec.run_id, "published", len(published), n - len(published), sum(r.records for r in published),
        topics, run_records, ended - started, results,
        {"checks": job_started - started, "job": job_ended - job_started, "finish": ended - job_ended},
    )


def already_published(job: str, run_id: str, state: RunState, started: float) -> PublishResult:
    """The result of a run whose marker is in the ledger: nothing to do, not even a Spark job."""
    assert state.marker is not None
    log.info("run %s/%s is already complete in the ledger; publishing nothing", job, run_id)
    checked = time.monotonic() - started
    return PublishResult(
        job, run_id, "already_published", 0, state.marker.num_partitions or len(state.entries), 0, {},
        state.marker.records, checked, steps={"checks": checked},
    )


_CAUSE = re.compile(r"^\s*((?:[\w.]+\.)?\w*(?:Error|Exception|Fault)): (.+)$", re.MULTILINE)


def _root_cause(exc: BaseException) -> str:
    """The innermost ``SomeError: message`` line of a Spark failure (the Python task's, if any)."""
    text = str(exc)
    python_side = text.rfind("Traceback (most recent call last)")
    matches = _CAUSE.findall(text[python_side:] if python_side >= 0 else text)
    if matches:
        name, message = matches[-1]
        return f"{name}: {message.strip()}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _sum_topics(maps: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for t, c in m.items():
            out[t] = out.get(t, 0) + c
    return out


def check_partitioning(job: str, run_id: str, state: RunState, partitions: int | None,
                       advice: str = PartitioningChangedError.BATCH_ADVICE) -> None:
    """A resumed run must keep its partitioning; refuse before publishing when we can tell."""
    if not state.entries or partitions is None:
        return
    recorded = {e.num_partitions for e in state.entries.values() if e.num_partitions is not None}
    if recorded and recorded != {partitions}:
        raise PartitioningChangedError(job, run_id, max(recorded), partitions, advice)
    if max(state.entries) >= partitions:
        raise PartitioningChangedError(job, run_id, max(state.entries) + 1, partitions, advice)


def _write_run_marker(
    conf: Mapping[str, Any], topic: str, job: str, run_id: str, n: int, records: int, topics: Mapping[str, int],
    extra: Mapping[str, Any],
) -> None:
    """The run is complete: let the next call with this run id return without starting a job.

    Written outside any transaction after every partition committed; losing it only costs the
    shortcut (the tasks would each find their entry), so a failure here is logged, not raised.
    """
    try:
        value = entry_value(job, run_id, None, records, topics, num_partitions=n, complete=True, **extra)
        if not write_plain(conf, topic, run_marker_key(job, run_id), value):
            log.warning("run marker for %s/%s not confirmed; the next re-run will check per partition", job, run_id)
    except KafkaException as e:
        log.warning("cannot write run marker for %s/%s: %s", job, run_id, e)
