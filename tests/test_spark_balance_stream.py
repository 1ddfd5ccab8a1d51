"""``eosink spark run balance_alerts --stream``, end to end: a Kafka topic of transactions, running balances
in update mode, every balance change and every threshold crossing counted read_committed in the outboxes.

The source topic has one partition and the query reads 10 records a micro-batch, so the batches are
known in advance and the expected outboxes are computed here, batch by batch, from the same rows.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest
from confluent_kafka import Producer

from tests.spark_fixtures import read_topic, spark  # noqa: F401

pytestmark = pytest.mark.spark

THRESHOLD = 1000.0
PER_BATCH = 10


def transactions(lo: int, hi: int) -> list[dict]:
    from eosink.spark_jobs.jobs.balance_stream import sample_transactions

    return sample_transactions(lo, hi)


def expected(rows: list[dict]) -> tuple[Counter, Counter]:
    from eosink.spark_jobs.jobs.balance_stream import expected_outboxes

    return expected_outboxes(rows, PER_BATCH, THRESHOLD)


def test_balance_alerts_stream_publishes_every_balance_change_and_every_crossing_once(spark, stack, make_topic, unique,  # noqa: F811
                                                                                      tmp_path):
    from eosink.spark_jobs.faults import FailAt, InBatches
    from eosink.spark_jobs.jobs import balance_alerts, balance_stream
    from eosink.spark_jobs.jobs._common import add_common_arguments

    source, alerts, balances = make_topic(1), make_topic(2), make_topic(2)
    rows = transactions(0, 60)
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    for r in rows[:40]:
        p.produce(source, json.dumps(r).encode(), r["user_id"].encode())
    assert p.flush(30) == 0

    # The first 4 micro-batches, every partition of batch 1 failing once right after its commit (Spark retries).
    first = balance_stream.run_stream(
        spark, bootstrap=stack.kafka_bootstrap, source_topic=source, alerts_topic=alerts, balances_topic=balances,
        checkpoint=str(tmp_path / "ck"), threshold=THRESHOLD, job=unique, available_now=True,
        max_offsets_per_trigger=PER_BATCH, fault_hook=InBatches(FailAt("after_commit"), frozenset({1})))
    assert first["micro_batches"] == 4

    for r in rows[40:]:
        p.produce(source, json.dumps(r).encode(), r["user_id"].encode())
    assert p.flush(30) == 0
    parser = argparse.ArgumentParser()  # the rest as `eosink spark run balance_alerts --stream ...` would run it
    add_common_arguments(parser)
    balance_alerts.add_arguments(parser)
    args = parser.parse_args(["--stream", "--source", f"kafka:{source}", "--alerts-topic", alerts, "--balances-topic",
                              balances, "--checkpoint", str(tmp_path / "ck"), "--available-now", "--threshold",
                              str(THRESHOLD), "--max-offsets-per-trigger", str(PER_BATCH), "--job", unique,
                              "--bootstrap", stack.kafka_bootstrap])
    second = balance_alerts.run_from_args(spark, args)
    assert second["micro_batches"] == 2 and second["query_id"] == first["query_id"]

    changes, crossings = expected(rows)
    seen_changes = Counter((v["user_id"], v["balance"], v["transactions"])
                           for v in (r.json() for r in read_topic(stack.kafka_bootstrap, balances)))
    seen_alerts = Counter((v["user_id"], v["balance"]) for v in (r.json() for r in read_topic(stack.kafka_bootstrap, alerts)))
    assert seen_changes == changes
    assert seen_alerts == crossings and set(crossings) == {("u-0", 1200.0), ("u-1", 1200.0)}
    assert first["balances"] + second["balances"] == sum(changes.values())
