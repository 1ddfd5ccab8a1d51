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

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs import kafka_checks
from eosink.spark_jobs import native as native_produce
from eosink.spark_jobs.errors import PublishError
from eosink.spark_jobs.ledger import read_run
from eosink.spark_jobs.naming import LEDGER_TOPIC, validate_name
from eosink.spark_jobs.outbox import Outbox, normalize, project, repartition_by_key
from eosink.spark_jobs.runs import PublishResult, already_published, check_partitioning, finish_run, run_tasks
from eosink.spark_jobs.task import FaultHook, TaskSpec

DEFAULT_TRANSACTION_TIMEOUT_MS = 120_000
#: Streaming: a micro-batch partition is one transaction; a killed driver's open transactions block the
#: read_committed consumers of its outbox partitions for up to this long.
DEFAULT_STREAM_TRANSACTION_TIMEOUT_MS = 30_000

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


#: Streaming adds: every broker connected when the producer starts. With sparse connections (librdkafka's
#: default) a new transactional producer's first metadata request waited ~50 ms for its connection, and a
#: streaming task creates one producer every micro-batch (measured: list_topics 53 ms -> 2 ms).
STREAM_PRODUCER_CONFIG: dict[str, Any] = {"enable.sparse.connections": False}


def producer_config(kafka: str | Mapping[str, Any], *, streaming: bool = False) -> dict[str, Any]:
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
    return {**DEFAULT_PRODUCER_CONFIG, **(STREAM_PRODUCER_CONFIG if streaming else {}), **user}


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
    if df.isStreaming:
        raise ConfigError(
            "publish_outbox takes a batch DataFrame and this one is streaming: publish it with "
            "publish_outbox_stream(df, ...) or df.writeStream.format('eosink')", key="df", source="publish_outbox")
    validate_name(job, "job")
    validate_name(run_id, "run_id")
    outboxes = normalize(topic)
    df = repartition_by_key(df, partitions, key, outboxes)
    projected, compiled = project(df, outboxes, key)  # MissingColumnError before touching Kafka
    conf = producer_config(kafka)
    preflight(conf, [ob.topic for ob in compiled], ledger_topic, transaction_timeout_ms, connect_timeout_s)

    state = read_run(conf, ledger_topic, job, run_id, ledger_timeout_s)
    if state.marker is not None:
        return already_published(job, run_id, state, started)
    check_partitioning(job, run_id, state, partitions)

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
        native_produce=native_enabled(),
        extra_headers=encode_headers(headers),
    )
    job_started = time.monotonic()
    results = run_tasks(projected, spec, f"publish of job '{job}' run '{run_id}' failed; partitions committed so far "
                                          "are in the ledger and a re-run with the same run_id publishes only the missing ones")
    return finish_run(spec, state, results, started, job_started)


def native_enabled() -> bool:
    """Whether tasks may use the C produce loop: the driver's ``EOSINK_PUBLISHER_NATIVE=0`` turns it off."""
    return os.environ.get(native_produce.ENV, "1") != "0"


def encode_headers(headers: Mapping[str, str | bytes] | None) -> tuple[tuple[str, bytes], ...]:
    """Constant extra headers as the tasks send them."""
    return tuple((k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in (headers or {}).items())


def preflight(conf: Mapping[str, Any], topics: Sequence[str], ledger_topic: str, transaction_timeout_ms: int,
              connect_timeout_s: float) -> None:
    """The broker checks before any task starts: reachable, every outbox topic there, the transaction
    timeout within the broker's maximum, the ledger topic created if missing."""
    bootstrap = str(conf["bootstrap.servers"])
    admin, watch = kafka_checks.connect(conf)
    metadata = kafka_checks.cluster_metadata(admin, bootstrap, connect_timeout_s, watch)
    kafka_checks.check_topics_exist(metadata, topics, bootstrap, admin, conf)
    broker_max = kafka_checks.broker_max_transaction_timeout_ms(admin, metadata, connect_timeout_s)
    kafka_checks.check_transaction_timeout(transaction_timeout_ms, broker_max)
    kafka_checks.ensure_ledger_topic(admin, metadata, ledger_topic, kafka=conf)
