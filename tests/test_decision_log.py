"""The ZooKeeper decision log against a real ZooKeeper: the compare-and-set is the fence."""

from __future__ import annotations

import pytest

from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import PartitionsFenced, ZooKeeperDecisionLog
from eosink.worker.engine.zk import ZkSession

TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]


@pytest.fixture
def sessions(stack, unique):
    made = [ZkSession(stack.zookeeper_hosts, unique, session_timeout=4).start() for _ in range(2)]
    yield made
    for s in made:
        s.stop()


def test_live_zombie_decision_is_refused_after_a_newer_epoch_acquires(sessions):
    a, b = ZooKeeperDecisionLog(sessions[0], "a"), ZooKeeperDecisionLog(sessions[1], "b")
    ga = a.acquire("c", TPS)
    ga = a.decide("c", "c.a.1.1", {tp: 10 for tp in TPS}, ga)
    gb = b.acquire("c", [TPS[1]])  # only one of the two partitions moves
    assert gb[TPS[1]].epoch == ga[TPS[1]].epoch + 1 and gb[TPS[1]].next_offset == 10
    with pytest.raises(PartitionsFenced) as info:
        a.decide("c", "c.a.1.2", {tp: 20 for tp in TPS}, ga)  # a's session is alive: only the CAS stops it
    assert TPS[1] in info.value.partitions
    entries = a.read("c", TPS)
    assert entries[TPS[0]].txn == "c.a.1.1" and entries[TPS[0]].next_offset == 10, "a failed multi-op applied in part"
    assert entries[TPS[1]].owner == "b"


def test_decision_writes_every_partition_and_returns_the_new_versions(sessions):
    a = ZooKeeperDecisionLog(sessions[0], "a")
    g = a.acquire("c", TPS)
    for i in range(3):
        g = a.decide("c", f"c.a.1.{i}", {tp: i for tp in TPS}, g)
    assert {e.txn for e in a.read("c", TPS).values()} == {"c.a.1.2"}


def test_generations_increase_and_never_repeat(sessions):
    a, b = ZooKeeperDecisionLog(sessions[0], "a"), ZooKeeperDecisionLog(sessions[1], "b")
    gens = [a.new_generation("c"), b.new_generation("c"), a.new_generation("c")]
    assert gens == sorted(gens) and len(set(gens)) == 3


def test_decision_refused_before_sending_while_suspended(sessions, monkeypatch):
    from eosink.connectors.api.errors import RetryableError

    a = ZooKeeperDecisionLog(sessions[0], "a")
    g = a.acquire("c", TPS)
    monkeypatch.setattr(sessions[0], "can_decide", lambda: False)
    with pytest.raises(RetryableError, match="suspended"):
        a.decide("c", "c.a.1.1", {tp: 1 for tp in TPS}, g)
    # Nor read: kazoo would hold the request until the connection is back (a whole cut, not a timeout).
    with pytest.raises(RetryableError, match="suspended; decision log not read"):
        a.read("c", TPS)
    assert {e.txn for e in ZooKeeperDecisionLog(sessions[1], "b").read("c", TPS).values()} == {None}
