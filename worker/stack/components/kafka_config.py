"""How many Kafka nodes the stack runs, which ports each uses, and each node's server.properties.

One node (the default) is the fast local stack: every internal topic has one replica. Three or
more nodes make a cluster that survives the loss of a broker: every node runs in KRaft combined
mode (broker and controller in one JVM) and all of them are voters of one static quorum. Combined
mode rather than separate controllers because on a small machine a JVM is the costly part:
three processes instead of four or six, and killing one node still leaves a controller majority
(2 of 3) and an in-sync majority of every partition (RF 3, ``min.insync.replicas=2``), which is
exactly the fault the multi-broker stack exists to show.

Ports: node ``i`` (1-based) listens for clients on ``EOSINK_KAFKA_PORT + 2*(i-1)`` and for the
quorum on ``EOSINK_KAFKA_CONTROLLER_PORT + 2*(i-1)``; with the defaults node 1 is 19092/19093,
node 2 19094/19095, node 3 19096/19097, so a single-node stack keeps its ports.

The node count comes from the ``--kafka-brokers`` flag, else ``EOSINK_KAFKA_BROKERS``, else the
count recorded in ``<stack>/kafka/brokers`` by the last ``up``, else 1. The record lets ``down``
and ``status`` find every node without the flag; a home formatted for one count refuses another
(KRaft's static voter set lives in the log dirs).
"""

from __future__ import annotations

import os
from pathlib import Path

from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import HOST, StackLayout, port

BROKERS_ENV = "EOSINK_KAFKA_BROKERS"
PORT_ENV = "EOSINK_KAFKA_PORT"
CONTROLLER_PORT_ENV = "EOSINK_KAFKA_CONTROLLER_PORT"
# The port clients are told to use (advertised.listeners), when they reach the broker through a
# port forward or a proxy; node i advertises this + 2*(i-1). Unset: the port it listens on.
ADVERTISED_PORT_ENV = "EOSINK_KAFKA_ADVERTISED_PORT"
MAX_BROKERS = 9
PORT_STRIDE = 2


def broker_count(layout: StackLayout, requested: int | None = None) -> int:
    """The node count to act on: the argument, else the env var, else the recorded count, else 1."""
    if requested is None:
        raw = os.environ.get(BROKERS_ENV, "")
        if raw:
            try:
                requested = int(raw)
            except ValueError:
                raise StackError(f"{BROKERS_ENV}={raw!r} is not a whole number of brokers") from None
    if requested is None:
        return recorded_count(layout) or 1
    if not 1 <= requested <= MAX_BROKERS:
        raise StackError(f"--kafka-brokers/{BROKERS_ENV}={requested} is outside 1..{MAX_BROKERS}")
    return requested


def count_file(layout: StackLayout) -> Path:
    return layout.data_dir("kafka") / "brokers"


def recorded_count(layout: StackLayout) -> int | None:
    try:
        return int(count_file(layout).read_text().strip())
    except (OSError, ValueError):
        return None


def record_count(layout: StackLayout, count: int) -> None:
    """Remember the count; refuse to change it once node 1's log dir is formatted for another."""
    previous = recorded_count(layout)
    formatted = (layout.data_dir("kafka") / "data" / "meta.properties").exists()
    if formatted and (previous or 1) != count:
        raise StackError(
            f"the Kafka under {layout.data_dir('kafka')} was formatted for {previous or 1} broker(s), not {count}; "
            f"run `eosink stack down`, remove {layout.root}/kafka*, and `eosink stack up --kafka-brokers {count}` "
            "(or use another EOSINK_HOME)"
        )
    path = count_file(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{count}\n")


def broker_port(layout: StackLayout, node: int) -> int:
    return layout.port(PORT_ENV) + PORT_STRIDE * (node - 1)


def controller_port(layout: StackLayout, node: int) -> int:
    return layout.port(CONTROLLER_PORT_ENV) + PORT_STRIDE * (node - 1)


def advertised_port(layout: StackLayout, node: int) -> int:
    if os.environ.get(ADVERTISED_PORT_ENV):
        return port(ADVERTISED_PORT_ENV) + PORT_STRIDE * (node - 1)
    return broker_port(layout, node)


def bootstrap(layout: StackLayout, nodes: int) -> str:
    """Every node's client address: a client that lists them all survives any one being down."""
    return ",".join(f"{HOST}:{advertised_port(layout, n)}" for n in range(1, nodes + 1))


def properties(layout: StackLayout, node: int, nodes: int, log_dir: Path) -> str:
    """server.properties for ``node`` of ``nodes``; one node keeps the single-replica settings."""
    replicas = str(min(nodes, 3))
    min_isr = "1" if nodes == 1 else "2"
    voters = ",".join(f"{n}@{HOST}:{controller_port(layout, n)}" for n in range(1, nodes + 1))
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{HOST}:{broker_port(layout, node)},CONTROLLER://{HOST}:{controller_port(layout, node)}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{advertised_port(layout, node)}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        # One node: every internal topic has one replica. Several: three replicas, two in sync
        # for a write, so acks=all producers and transactions go on while any one node is down.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "transaction.max.timeout.ms": "900000",
    }
    if nodes > 1:
        settings["default.replication.factor"] = replicas
        settings["min.insync.replicas"] = min_isr
        # A restarted node must take its partitions' leadership back, or one node ends up
        # leading everything; the default 5-minute check is longer than a fault test.
        settings["leader.imbalance.check.interval.seconds"] = "10"
    return "".join(f"{key}={value}\n" for key, value in settings.items())
