"""The leader's Kafka admin client is made before the first connector needs it (real ZooKeeper and Kafka)."""

from __future__ import annotations

from eosink.connectors.api.records import TopicPartition
from eosink.worker.control.membership import Membership, TopicPartitions
from eosink.worker.engine.zk import ZkSession


def test_the_leader_connects_to_kafka_before_the_first_connector_so_its_assignment_does_not_wait_for_it(
        stack, make_topic, unique):
    """An assignment round of a leader without connectors makes the admin client (librdkafka connects as it
    is made); the first connector's round then only asks for the metadata, on the same client."""
    topic = make_topic(partitions=2)
    session = ZkSession(stack.zookeeper_hosts, unique, session_timeout=4).start()
    partitions = TopicPartitions(stack.kafka_bootstrap, {})
    try:
        membership = Membership(session, "w1", partitions)
        membership.register(None)
        assert membership.is_leader()
        membership.lead({})
        made = partitions._admin
        assert made is not None, "no admin client before the first connector: its assignment round would make it"
        assert partitions([topic]) == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert partitions._admin is made
    finally:
        session.stop()
