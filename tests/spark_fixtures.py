"""One SparkSession per pytest session, and read-back helpers that count what consumers see.

Import the fixture into a test module with ``from tests.spark_fixtures import spark  # noqa: F401``.
Read-back always reads every partition *to its log end* (the high watermark, not the last stable
offset), so a count is final: nothing committed later than the read can be missing from it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.task.maxFailures": "4",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
}


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """``local[2,4]``: two cores, and four attempts per task (plain ``local[2]`` never retries a
    task, whatever ``spark.task.maxFailures`` says). Carries the spark-sql-kafka jars."""
    from eosink.spark_jobs.session import build_session

    session = build_session("eosink-tests", master="local[2,4]", kafka_jars=True, conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def id(self) -> str:
        return self.headers.get("eosink.id", "")

    def json(self) -> dict:
        return json.loads(self.value or b"null")


def read_topic(bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout_s: float = 30.0) -> list[Rec]:
    """Every record of ``topic`` visible at ``isolation``, read to the log end of each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    base = {"bootstrap.servers": bootstrap, "group.id": "eosink-test-reader", "enable.auto.commit": False}
    probe = Consumer({**base, "isolation.level": "read_uncommitted"})
    parts = sorted(probe.list_topics(topic, timeout=10).topics[topic].partitions)
    ends = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts}
    probe.close()
    pending = {p for p, end in ends.items() if end > 0}
    out: list[Rec] = []
    if not pending:
        return out
    c = Consumer({**base, "isolation.level": isolation, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    c.assign([TopicPartition(topic, p, 0) for p in pending])
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: partitions {sorted(pending)} not read to their end in {timeout_s}s")
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    pending.discard(m.partition())
                continue
            out.append(
                Rec(
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    m.key().decode() if m.key() is not None else None,
                    m.value(),
                    {k: v.decode() for k, v in (m.headers() or [])},
                )
            )
            if m.offset() + 1 >= ends[m.partition()]:
                pending.discard(m.partition())
    finally:
        c.close()
    return out


def ledger(bootstrap: str, job: str, run_id: str, topic: str = "__eosink_publish_ledger") -> dict[str, dict]:
    """The committed ledger values of one run, by key suffix (``"0"``, ``"1"``, ..., ``"run"``)."""
    prefix = f"{job}/{run_id}/"
    out: dict[str, dict] = {}
    for r in read_topic(bootstrap, topic):
        if r.key and r.key.startswith(prefix):
            out[r.key[len(prefix) :]] = r.json()
    return out


def assert_exactly_once(records: Iterable[Rec], expected_keys: Iterable[str]) -> None:
    """Every expected key exactly once, nothing else, and every ``eosink.id`` unique."""
    records = list(records)
    keys = Counter(r.key for r in records)
    expected = Counter(expected_keys)
    dupes = {k: n for k, n in keys.items() if n > 1}
    assert not dupes, f"duplicated keys: {dict(list(dupes.items())[:10])} ({len(dupes)} in all)"
    missing = expected - keys
    extra = keys - expected
    assert not missing, f"{sum(missing.values())} keys missing, e.g. {list(missing)[:5]}"
    assert not extra, f"{sum(extra.values())} unexpected keys, e.g. {list(extra)[:5]}"
    ids = Counter(r.id for r in records)
    assert "" not in ids, "a record without an eosink.id header"
    assert max(ids.values(), default=1) == 1, "duplicated eosink.id headers"


class HandRun:
    """One micro-batch run published partition by partition without Spark: the tests that drive replays by hand.

    ``spec()`` plans the batch as both streaming drivers do: what the ledger holds of the run, and where its
    committed records are when it has some (a replay)."""

    def __init__(self, bootstrap: str, job: str, outbox: str, run_id: str) -> None:
        from eosink.spark_jobs.kafka_checks import admin_client, cluster_metadata, ensure_ledger_topic
        from eosink.spark_jobs.naming import LEDGER_TOPIC
        from eosink.spark_jobs.publisher import producer_config

        self.conf = producer_config(bootstrap)
        admin = admin_client(self.conf)
        ensure_ledger_topic(admin, cluster_metadata(admin, bootstrap), LEDGER_TOPIC)
        self.job, self.outbox, self.run_id = job, outbox, run_id

    @staticmethod
    def rows(lo: int, hi: int) -> Any:
        """Rows ``k-{lo}`` .. as an Arrow batch of a key column and a binary value column (the key's bytes)."""
        import pyarrow as pa

        ks = [f"k-{i:06d}" for i in range(lo, hi)]
        return pa.record_batch([pa.array(ks), pa.array([k.encode() for k in ks], pa.binary())], names=["k", "v"])

    def spec(self) -> Any:
        from eosink.spark_jobs.ledger_index import run_states
        from eosink.spark_jobs.naming import LEDGER_TOPIC
        from eosink.spark_jobs.outbox import CompiledOutbox
        from eosink.spark_jobs.replay_check import plan_scan
        from eosink.spark_jobs.task import TaskSpec

        states, end = run_states(self.conf, LEDGER_TOPIC, self.job, [self.run_id], 30)
        run = states[self.run_id]
        replay = plan_scan(self.conf, [self.outbox], run.contents.values(), bool(run.pending), 30) \
            if run.contents or run.pending else None
        return TaskSpec(job=self.job, run_id=self.run_id, producer_config=self.conf,
                        outboxes=(CompiledOutbox(self.outbox, 0, 1, None, ()),), ledger_topic=LEDGER_TOPIC,
                        ledger_since=end, known_published=frozenset(), transaction_timeout_ms=30_000, ledger_timeout_s=30,
                        stream=True, published_content=run.contents, pending={-1: run.pending}, replay=replay)
