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

from eosink.worker.stack import secure
from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import HOST, StackLayout, count_from_env, port, read_count, write_count

BROKERS_ENV = "EOSINK_KAFKA_BROKERS"
PORT_ENV = "EOSINK_KAFKA_PORT"
CONTROLLER_PORT_ENV = "EOSINK_KAFKA_CONTROLLER_PORT"
# The port clients are told to use (advertised.listeners), when they reach the broker through a
# port forward or a proxy; node i advertises this + 2*(i-1). Unset: the port it listens on.
ADVERTISED_PORT_ENV = "EOSINK_KAFKA_ADVERTISED_PORT"
MAX_BROKERS = 9
PORT_STRIDE = 2

#: The secure stack's client and inter-broker mechanism (credentials live in the KRaft metadata log).
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The mechanism of the secure stack's controller listener (see :func:`secure_settings` for why not SCRAM).
CONTROLLER_MECHANISM = "PLAIN"
#: The roles of :data:`secure.USERS` that get a SCRAM credential at format time.
SCRAM_ROLES = ("kafka.admin", "kafka.worker", "kafka.publisher")
ADMIN_ROLE = "kafka.admin"


def broker_count(layout: StackLayout, requested: int | None = None) -> int:
    """The node count to act on: the argument, else the env var, else the recorded count, else 1."""
    if requested is None:
        requested = count_from_env(BROKERS_ENV, "brokers")
    if requested is None:
        return recorded_count(layout) or 1
    if not 1 <= requested <= MAX_BROKERS:
        raise StackError(f"--kafka-brokers/{BROKERS_ENV}={requested} is outside 1..{MAX_BROKERS}")
    return requested


def count_file(layout: StackLayout) -> Path:
    return layout.data_dir("kafka") / "brokers"


def recorded_count(layout: StackLayout) -> int | None:
    return read_count(count_file(layout))


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
    write_count(count_file(layout), count)


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


def keystore_file(layout: StackLayout) -> Path:
    """The broker's PEM keystore: the server key and certificate in one file (what ``ssl.keystore.type=PEM``
    with ``ssl.keystore.location`` reads), made from ``server.key`` + ``server.pem`` of the stack's secrets."""
    return secure.material(layout).directory / "kafka-keystore.pem"


def write_keystore(layout: StackLayout) -> Path:
    m = secure.material(layout)
    path = keystore_file(layout)
    data = m.server_key.read_bytes().rstrip(b"\n") + b"\n" + m.server_cert.read_bytes()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def client_settings(layout: StackLayout) -> dict[str, str]:
    """What a client of the secure stack sets besides its user name and password (never a secret)."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM_MECHANISM,
            "ssl.ca.location": str(secure.material(layout).ca_cert)}


def client_config(layout: StackLayout, role: str) -> dict[str, str]:
    """librdkafka settings of the secure stack's principal ``role`` (``kafka.admin``, ``kafka.worker``,
    ``kafka.publisher``): the client settings plus its user name and password; empty when open."""
    if not layout.secure:
        return {}
    m = secure.material(layout)
    return {**client_settings(layout), "sasl.username": m.user(role), "sasl.password": m.password(role)}


def admin_client_config(layout: StackLayout) -> dict[str, str]:
    """librdkafka settings of the stack's own admin connection (probes, ACL provisioning); empty when open."""
    return client_config(layout, ADMIN_ROLE)


def secure_settings(layout: StackLayout, node: int) -> dict[str, str]:
    """The settings that lock a node down: SASL_SSL everywhere, ACLs that deny by default.

    Passwords never appear in server.properties: the JAAS entries name them with ``${file:...}``
    references into ``credentials.properties``, resolved by the broker's FileConfigProvider.

    The controller listener cannot use SCRAM: SCRAM credentials live in the metadata log the
    controllers themselves serve, so a controller could not authenticate anyone before it has read
    it (Kafka refuses SCRAM there). It uses SASL PLAIN over TLS with one static JAAS user, ``admin``
    (the super user): a connection to the quorum port without that password is refused at the
    handshake, so the controller listener is no unauthenticated back door and no ``User:ANONYMOUS``
    super user is needed.
    """
    m = secure.material(layout)
    admin, admin_password = m.user(ADMIN_ROLE), m.reference(ADMIN_ROLE)
    scram_jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{admin}" '
                  f'password="{admin_password}";')
    plain_jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{admin}" '
                  f'password="{admin_password}" user_{admin}="{admin_password}";')
    return {
        "listeners": f"SASL_SSL://{HOST}:{broker_port(layout, node)},CONTROLLER://{HOST}:{controller_port(layout, node)}",
        "advertised.listeners": f"SASL_SSL://{HOST}:{advertised_port(layout, node)}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
        "config.providers": "file",
        "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_jaas,
        "sasl.mechanism.controller.protocol": CONTROLLER_MECHANISM,
        "listener.name.controller.sasl.enabled.mechanisms": CONTROLLER_MECHANISM,
        "listener.name.controller.plain.sasl.jaas.config": plain_jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore_file(layout)),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(m.ca_cert),
        "ssl.client.auth": "none",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{admin}",
    }


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
    if layout.secure:
        settings.update(secure_settings(layout, node))
    return "".join(f"{key}={value}\n" for key, value in settings.items())
