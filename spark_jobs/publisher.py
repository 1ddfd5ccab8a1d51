"""``publish_outbox``: publish a DataFrame into Kafka outbox topics exactly once per run.

The guarantee, for a given ``(job, run_id)``: every row of the DataFrame is visible to a
read_committed consumer exactly once in each outbox topic it is routed to, however often Spark
retries or speculates a task and however often the whole run is re-submitted with the same run id.
Each Spark partition is one Kafka transaction (records of every outbox + a ledger entry); see
:mod:`eosink.spark_jobs.task` for why this is exactly-once and :mod:`eosink.spark_jobs.ledger` for the ledger.

A failed call (bad input, unreachable broker, a partition that keeps failing) raises a classified
:mod:`eosink.spark_jobs.errors` error. Partitions that committed before the failure are in the ledger,
the others published nothing; re-running with the *same* run id publishes exactly the missing ones.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer
from pyspark.sql import DataFrame

from eosink.spark_jobs import kafka_checks
from eosink.spark_jobs import native as native_produce
from eosink.spark_jobs.arrow_map import map_in_arrow
from eosink.spark_jobs.errors import PartitioningChangedError, PublishError, from_task_failure
from eosink.spark_jobs.ledger import RunState, entry_value, read_run
from eosink.spark_jobs.naming import LEDGER_TOPIC, run_marker_key, validate_name
from eosink.spark_jobs.outbox import Outbox, normalize, project
from eosink.spark_jobs.summary import SUMMARY_DDL, make_task_function, result_of
from eosink.spark_jobs.task import NEW_IN_THIS_CALL, FaultHook, PartitionResult, TaskSpec

log = logging.getLogger("eosink.spark")

DEFAULT_TRANSACTION_TIMEOUT_MS = 120_000

# Throughput-oriented defaults; anything in ``kafka=`` overrides them. ``murmur2_random`` is the
# Java client's partitioner, so a key lands on the same partition as with Spark's own Kafka sink.
DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 512 * 1024,
    "partitioner": "murmur2_random",
    "compression.type": "lz4",
    # Nothing reads per-record delivery reports (a failed delivery fails the transaction's commit):
    # without this, each delivered record goes back to the task as a report to serve (~3% of its CPU).
    "delivery.report.only.error": True,
}


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


def producer_config(kafka: str | Mapping[str, Any]) -> dict[str, Any]:
    """Defaults + the caller's config; ``kafka`` may be just the bootstrap servers string."""
    user = {"bootstrap.servers": kafka} if isinstance(kafka, str) else dict(kafka)
    if not user.get("bootstrap.servers"):
        raise PublishError("kafka config needs bootstrap.servers")
    for forbidden in ("transactional.id", "transaction.timeout.ms"):
        if forbidden in user:
            raise PublishError(
                f"do not set {forbidden} in kafka=...; the publisher derives transactional.id per "
                "partition and takes transaction_timeout_ms= as an argument"
            )
    return {**DEFAULT_PRODUCER_CONFIG, **user}


def publish_outbox(
    df: DataFrame,
    topic: str | Outbox | Sequence[str | Outbox],
    *,
    key: str | None = None,
    job: str,
    run_id: str,
    kafka: str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    partitions: int | None = None,
    ledger_topic: str = LEDGER_TOPIC,
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
    connect_timeout_s: float = 15.0,
    ledger_timeout_s: float = 60.0,
    fault_hook: FaultHook | None = None,
) -> PublishResult:
    """Publish every row of ``df`` to ``topic`` (one or several outboxes) exactly once per run.

    ``key`` names the key column (its value as a utf-8 string is the record key); ``job`` and
    ``run_id`` identify the run: the same run id never publishes twice, a new one publishes anew.
    ``kafka`` is the bootstrap servers string or a librdkafka producer config. ``headers`` are
    constant extra headers; every record also carries ``eosink.id`` and ``eosink.run``.
    ``partitions`` repartitions by the key first (one transaction per partition: use it to keep
    each transaction well under ``transaction_timeout_ms``; it also fixes the partitioning of a
    run, which a resumed run must keep). ``fault_hook`` is for tests only.
    """
    started = time.monotonic()
    validate_name(job, "job")
    validate_name(run_id, "run_id")
    outboxes = normalize(topic)
    if partitions is not None:
        if partitions < 1:
            raise PublishError(f"partitions must be >= 1, got {partitions}")
        part_key = key or outboxes[0].key
        df = (df.repartition(partitions, df[part_key]) if part_key is not None and part_key in df.columns
              else df.repartition(partitions))
    projected, compiled = project(df, outboxes, key)  # MissingColumnError before touching Kafka
    conf = producer_config(kafka)
    bootstrap = str(conf["bootstrap.servers"])

    admin, watch = kafka_checks.connect(conf)
    metadata = kafka_checks.cluster_metadata(admin, bootstrap, connect_timeout_s, watch)
    kafka_checks.check_topics_exist(metadata, [ob.topic for ob in compiled], bootstrap, admin, conf)
    broker_max = kafka_checks.broker_max_transaction_timeout_ms(admin, metadata, connect_timeout_s)
    kafka_checks.check_transaction_timeout(transaction_timeout_ms, broker_max)
    kafka_checks.ensure_ledger_topic(admin, metadata, ledger_topic, kafka=conf)

    state = read_run(conf, ledger_topic, job, run_id, ledger_timeout_s)
    if state.marker is not None:
        log.info("run %s/%s is already complete in the ledger; publishing nothing", job, run_id)
        checked = time.monotonic() - started
        return PublishResult(
            job, run_id, "already_published", 0, state.marker.num_partitions or len(state.entries), 0, {},
            state.marker.records, checked, steps={"checks": checked},
        )
    _check_partitioning(job, run_id, state, partitions)

    spec = TaskSpec(
        job=job,
        run_id=run_id,
        producer_config=conf,
        outboxes=tuple(compiled),
        ledger_topic=ledger_topic,
        ledger_since=state.end_offset,
        known_published=frozenset(state.entries),
        pending=state.pending,
        transaction_timeout_ms=transaction_timeout_ms,
        num_partitions=partitions,
        ledger_timeout_s=ledger_timeout_s,
        fault_hook=fault_hook,
        call_id=uuid.uuid4().hex,
        native_produce=os.environ.get(native_produce.ENV, "1") != "0",
        extra_headers=tuple((k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in (headers or {}).items()),
    )
    job_started = time.monotonic()
    try:
        rows = map_in_arrow(projected, make_task_function(spec), SUMMARY_DDL).collect()
    except Exception as e:  # noqa: BLE001 - re-raised as a classified error, the task's own if it was ours
        note = (
            f" [publish of job '{job}' run '{run_id}' failed; partitions committed so far are in the ledger and "
            "a re-run with the same run_id publishes only the missing ones]"
        )
        original = from_task_failure(e)
        if original is None:
            raise PublishError(f"the Spark job failed: {_root_cause(e)}{note}") from e
        original.message += note
        original.args = (original.message,)
        raise original from e
    results = [result_of(r) for r in rows]
    job_ended = time.monotonic()
    results.sort(key=lambda r: r.partition)
    n = len(results)
    stale = sorted(p for p in state.entries if p >= n)
    if stale:
        raise PartitioningChangedError(job, run_id, max(stale) + 1, n)

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
    _write_run_marker(conf, ledger_topic, job, run_id, n, run_records, _sum_topics(run_topic_maps))
    ended = time.monotonic()
    return PublishResult(
        job, run_id, "published", len(published), n - len(published), sum(r.records for r in published), topics,
        run_records, ended - started, results,
        {"checks": job_started - started, "job": job_ended - job_started, "finish": ended - job_ended},
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


def _check_partitioning(job: str, run_id: str, state: RunState, partitions: int | None) -> None:
    """A resumed run must keep its partitioning; refuse before publishing when we can tell."""
    if not state.entries or partitions is None:
        return
    recorded = {e.num_partitions for e in state.entries.values() if e.num_partitions is not None}
    if recorded and recorded != {partitions}:
        raise PartitioningChangedError(job, run_id, max(recorded), partitions)
    if max(state.entries) >= partitions:
        raise PartitioningChangedError(job, run_id, max(state.entries) + 1, partitions)


def _write_run_marker(
    conf: Mapping[str, Any], topic: str, job: str, run_id: str, n: int, records: int, topics: Mapping[str, int]
) -> None:
    """The run is complete: let the next call with this run id return without starting a job.

    Written outside any transaction after every partition committed; losing it only costs the
    shortcut (the tasks would each find their entry), so a failure here is logged, not raised.
    """
    # Not idempotent on purpose: an idempotent producer spends ~0.5 s acquiring a producer id
    # before its first send, and a duplicated marker is harmless (same key, same value, compacted).
    producer = Producer({**kafka_checks.client_config(conf), "acks": "all", "linger.ms": 0})
    try:
        producer.produce(
            topic,
            entry_value(job, run_id, None, records, topics, num_partitions=n, complete=True),
            run_marker_key(job, run_id),
            partition=0,
        )
        if producer.flush(30) != 0:
            log.warning("run marker for %s/%s not confirmed; the next re-run will check per partition", job, run_id)
    except KafkaException as e:
        log.warning("cannot write run marker for %s/%s: %s", job, run_id, e)
