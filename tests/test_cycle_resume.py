"""A new owner's first cycle on the real Kafka and ZooKeeper: it takes what is there at once - a backlog
whole (up to a batch), not whatever a fixed 0.1 s flush happened to read."""

from __future__ import annotations

import json
import time

from eosink.connectors import memory
from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.worker.engine import source
from eosink.worker.engine.decision import ZooKeeperDecisionLog
from eosink.worker.engine.source import KafkaSource
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings
from eosink.worker.engine.zk import ZkSession
from tests.restkit import produce


class _SlowFirstWrite(memory.MemorySink):
    """A sink whose first slice of a batch takes 0.3 s to write: a flush that ends by the clock ends
    right after it, one that ends when everything available is read goes on."""

    def __init__(self, connector: str, config: dict[str, str]) -> None:
        super().__init__(connector, config)
        self.slices = 0

    def write(self, records: list[SinkRecord]) -> None:
        self.slices += 1
        if self.slices == 1:
            time.sleep(0.3)
        super().write(records)


def test_a_new_owners_first_cycle_takes_the_whole_backlog_and_an_idle_one_ends_promptly(stack, make_topic, unique,
                                                                                          monkeypatch):
    monkeypatch.setattr(source, "CHUNK_RECORDS", 100)  # a slice to the sink every 100 records
    topic = make_topic(partitions=2)
    n = 2_000
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": i}).encode()) for i in range(n)])
    store = f"{unique}-store"
    memory.drop_store(store)
    sink = _SlowFirstWrite(unique, {"memory.store": store})
    session = ZkSession(stack.zookeeper_hosts, unique, session_timeout=4).start()
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json", fetch_batch=100)
    # A long interval: a cycle that waited it out (or gave up after 0.1 s) is told apart from one that ended
    # when it had read everything.
    task = SinkTask(unique, "w1", [sink], src, ZooKeeperDecisionLog(session, "w1"),
                    TaskSettings(commit_interval_s=30.0, commit_min_interval_s=30.0), sleep=lambda _s: None)
    try:
        task.open()
        task.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        t0 = time.monotonic()
        result = task.run_cycle()
        took = time.monotonic() - t0
        assert result.outcome is CycleOutcome.SUCCEEDED
        committed = memory.store(store).committed
        assert sorted(json.loads(r.raw_value)["id"] for r in committed) == list(range(n)), (
            f"the first cycle committed {len(committed)} of the {n} records waiting: the backlog was cut into a small txn")
        assert sink.slices > 1  # (the test can tell: the backlog came in several slices, the first one slow)
        assert took < 20, f"the first cycle took {took:.1f}s: it waited out commit.interval rather than ending caught up"

        # Caught up now and no longer resuming: a cycle runs its interval (min interval 30 s), so a second
        # handoff is what makes an idle cycle end promptly again.
        task.assign([])
        task.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        t0 = time.monotonic()
        assert task.run_cycle().outcome is CycleOutcome.EMPTY
        assert time.monotonic() - t0 < 10, "a new owner's cycle over an idle topic did not end promptly"
    finally:
        task.close()  # (closes the source too)
        session.stop()
