"""A partition stalled behind an open transaction is seen, shown in /status and the metrics, and cleared.

A producer killed mid-transaction leaves the partition's last stable offset where its transaction began;
every read_committed consumer waits there until the broker aborts it, while later transactions commit
behind it. These tests hold such a transaction open for real (a transactional producer that never
commits) and look at what the worker's source reports.
"""

from __future__ import annotations

import time

from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.source import KafkaSource
from eosink.worker.engine.stall import StallWatch

TP = TopicPartition("t", 0)


def test_a_position_that_stands_while_the_watermark_moves_is_a_stall_and_moving_again_ends_it():
    w = StallWatch()
    w.observe({TP: (10, 10)}, now=0.0)
    w.observe({TP: (10, 10)}, now=5.0)
    assert w.stalled(now=6.0) == {}  # idle: nothing ahead of the position
    w.observe({TP: (10, 12)}, now=7.0)
    assert w.stalled(now=8.0) == {}  # records ahead, the watermark has not moved since: a consumer catching up
    w.observe({TP: (10, 15)}, now=9.0)
    assert w.stalled(now=10.0) == {TP: 3.0}  # stood at 10 since 7.0 while the watermark moved
    w.observe({TP: (16, 16)}, now=11.0)
    assert w.stalled(now=12.0) == {}  # the transaction ended: the position moved
    w.observe({TP: (16, 20)}, now=13.0)
    w.observe({TP: (16, 25)}, now=14.0)
    w.observe({}, now=15.0)
    assert w.stalled(now=15.0) == {}  # a partition no longer held is forgotten


def test_an_open_transaction_stalls_the_partition_until_it_is_aborted(stack, make_topic, unique):
    from confluent_kafka import Producer

    topic = make_topic(partitions=1)
    left_open = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-open"})
    left_open.init_transactions(30)
    left_open.begin_transaction()
    left_open.produce(topic, b'{"id": "open"}')
    left_open.flush(30)
    later = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-later"})
    later.init_transactions(30)
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json")
    tp = TopicPartition(topic, 0)
    try:
        src.assign({tp: 0})
        stalled: dict[TopicPartition, float] = {}
        for i in range(20):
            later.begin_transaction()
            later.produce(topic, b'{"id": %d}' % i)
            later.commit_transaction(30)
            assert src.poll_batch(1000, 10_000_000, 0.3).records == []  # nothing passes the open transaction
            src.lag()
            stalled = src.stalls.stalled()
            if stalled:
                break
        assert tp in stalled, "a partition behind an open transaction was not seen stalling"

        left_open.abort_transaction(30)
        deadline, records = time.monotonic() + 30, []
        while time.monotonic() < deadline and len(records) < 1:
            records += src.poll_batch(1000, 10_000_000, 0.5).records
        src.lag()
        assert records and records[0].value == {"id": 0}  # the later transactions, the aborted record never
        assert src.stalls.stalled() == {}
    finally:
        src.close()


def test_a_worker_shows_a_partition_stalled_behind_an_open_transaction_in_status_and_metrics(
        stack, make_topic, unique, tmp_path):
    """What the operator sees: ``/status`` names the partition and the seconds, ``/metrics`` carries
    ``eosink_partition_stalled_seconds`` for it (the alert rule EosinkStalledBehindOpenTransaction reads it),
    and both clear once the transaction ends."""
    from confluent_kafka import Producer

    from tests.metricskit import scrape, value
    from tests.procs import register, wait_until
    from tests.restkit import call, start_worker

    topic = make_topic(partitions=1)
    name = unique.replace("_", "-")
    register(stack.zookeeper_hosts, unique, name, {"connector.class": "filesystem", "topics": topic,
                                                   "file.path": str(tmp_path / "out"), "commit.interval.ms": "300"})
    left_open = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-open"})
    left_open.init_transactions(30)
    later = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-later"})
    later.init_transactions(30)
    w = start_worker(stack, unique, "w1", tmp_path)
    try:
        left_open.begin_transaction()
        left_open.produce(topic, b'{"id": "open"}')
        left_open.flush(30)

        def stalled() -> dict | None:
            later.begin_transaction()
            later.produce(topic, b'{"id": 1}')
            later.commit_transaction(30)
            parts = call(w.url, "GET", f"/connectors/{name}/status")[1]["tasks"][0].get("partitions", [])
            return next((p for p in parts if "stalled_behind_open_transaction_s" in p), None)

        wait_until(stalled, 60, "the status to show the partition stalled behind the open transaction")
        assert value(scrape(w.url), "eosink_partition_stalled_seconds", connector=name, topic=topic, partition="0") is not None

        left_open.abort_transaction(30)

        def cleared() -> bool:
            parts = call(w.url, "GET", f"/connectors/{name}/status")[1]["tasks"][0].get("partitions", [])
            return bool(parts) and all("stalled_behind_open_transaction_s" not in p for p in parts) and \
                value(scrape(w.url), "eosink_partition_stalled_seconds", connector=name, topic=topic, partition="0") is None

        wait_until(cleared, 60, "the stall to clear once the transaction was aborted")
    finally:
        w.stop()
