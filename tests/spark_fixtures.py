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
