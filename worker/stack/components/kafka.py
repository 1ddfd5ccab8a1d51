"""Kafka 4.x in KRaft combined mode (broker + controller per node), from ``jvm/kafka/pom.xml``.

One node by default; ``--kafka-brokers N`` / ``EOSINK_KAFKA_BROKERS=N`` runs N nodes, each its own
component (``kafka``, ``kafka-2``, ``kafka-3``: own data dir, log and pid file, so a test can kill
and restart one broker with the stack's own code). Why combined mode, the ports and the
replication settings: see :mod:`kafka_config`.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
import uuid
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from eosink.worker.stack import jvm, proc, secure
from eosink.worker.stack.components import kafka_config
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.components.kafka_config import CONTROLLER_PORT_ENV, PORT_ENV
from eosink.worker.stack.layout import HOST, StackLayout

FORMAT_TIMEOUT_S = 120
PROBE_TRANSACTIONAL_ID = "eosink-stack-probe"
TRANSACTIONS_TIMEOUT_S = 60.0

# Console appender on stdout: spawn() sends stdout and stderr to kafka.log, so log4j output and
# anything the JVM itself prints (bad flags, OOM) end up in one file.
LOG4J2 = """\
status = warn
# Kafka's own shutdown hook logs the clean shutdown; log4j's hook would silence it first.
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
# Per-partition chatter at INFO drowns the lines that explain a failure.
logger.log.name = kafka.log
logger.log.level = WARN
logger.storage.name = org.apache.kafka.storage
logger.storage.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class Kafka(Component):
    """Node 1 of the cluster (the only node by default); :func:`node_class` makes the others."""

    name = "kafka"
    node_id: ClassVar[int] = 1
    ready_timeout_s = 90.0
    stop_timeout_s = 30.0

    def __init__(self, layout: StackLayout, nodes: int | None = None) -> None:
        super().__init__(layout)
        self.nodes = kafka_config.broker_count(layout, nodes)

    @property
    def cluster_dir(self) -> Path:
        """Node 1's data dir holds what all nodes share (the cluster id, the node count)."""
        return self.layout.data_dir(Kafka.name)

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.data_dir / "log4j2.properties"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "data"

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: kafka_config.broker_port(self.layout, self.node_id),
                CONTROLLER_PORT_ENV: kafka_config.controller_port(self.layout, self.node_id)}

    def endpoint(self) -> dict[str, Any]:
        """Where clients connect; on a secure stack also ``client``: the non-secret settings every client
        adds (protocol, mechanism, CA) - user names and passwords stay in ``credentials.properties``."""
        entry: dict[str, Any] = {"bootstrap_servers": kafka_config.bootstrap(self.layout, self.nodes)}
        if self.nodes > 1:
            entry["brokers"] = self.nodes
        if self.layout.secure:
            entry["client"] = kafka_config.client_settings(self.layout)
        return entry

    def _client(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings of the stack's own clients: the super user on a secure stack."""
        return {"log_level": 0, **kafka_config.admin_client_config(self.layout), **extra}

    def address(self) -> str:
        return f"{HOST}:{kafka_config.broker_port(self.layout, self.node_id)}"

    def launch(self) -> int:
        classpath = jvm.classpath("kafka", self.name)
        java = jvm.java(self.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(self._properties())
        self.log4j_file.write_text(LOG4J2)
        if self.layout.secure:
            kafka_config.write_keystore(self.layout)
        common = ["-XX:-UsePerfData", "-Djava.awt.headless=true",
                  f"-Dlog4j2.configurationFile={self.log4j_file}", "-cp", classpath]
        if not (self.log_dir / "meta.properties").exists():
            self._format([java, "-Xmx256m", *common])
        argv = [java, "-Xms256m", "-Xmx1g", *common, "kafka.Kafka", str(self.properties_file)]
        return proc.spawn(argv, self.log_path, cwd=self.data_dir)

    def _cluster_id(self) -> str:
        """Made once and kept, so the log dir (formatted with it) stays valid across restarts."""
        path = self.cluster_dir / "cluster-id"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            # The nodes of a multi-broker stack start concurrently: the first to link its id wins and
            # every node reads that one (a check-then-write race gave nodes different cluster ids,
            # and their quorum refused each other's votes: INCONSISTENT_CLUSTER_ID).
            tmp = path.with_name(f".cluster-id.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(new_cluster_id() + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        return path.read_text().strip()

    def _format(self, java_argv: list[str]) -> None:
        # A static quorum (controller.quorum.voters) needs neither --standalone nor
        # --initial-controllers; --ignore-formatted makes a repeated format harmless.
        argv = [*java_argv, "kafka.tools.StorageTool", "format", "-t", self._cluster_id(),
                "-c", str(self.properties_file), "--ignore-formatted"]
        if self.layout.secure:
            # KRaft keeps SCRAM credentials in the metadata log: written here, into the bootstrap
            # records, they exist before the first broker authenticates (inter-broker uses admin's).
            # Only a salted hash is stored; the clear password is on this short-lived command line.
            m = secure.material(self.layout)
            for role in kafka_config.SCRAM_ROLES:
                argv += ["--add-scram", f"{kafka_config.SCRAM_MECHANISM}=[name={m.user(role)},password={m.password(role)}]"]
        with open(self.log_path, "ab") as log:
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=self.data_dir, timeout=FORMAT_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise self.fail(f"formatting the log dir {self.log_dir} took over {FORMAT_TIMEOUT_S}s") from None
        if done.returncode != 0:
            raise self.fail(f"formatting the log dir {self.log_dir} failed (exit {done.returncode})")

    def _properties(self) -> str:
        return kafka_config.properties(self.layout, self.node_id, self.nodes, self.log_dir)

    def probe(self) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 0: librdkafka would print every refused connection while the broker boots.
        admin = AdminClient(self._client(**{"bootstrap.servers": self.address()}))
        metadata = admin.list_topics(timeout=2)
        if self.node_id not in metadata.brokers:
            raise RuntimeError(f"metadata does not list broker {self.node_id} yet")

    def verify(self) -> None:
        """A broker can answer metadata yet be unable to do transactions (no __transaction_state
        leader yet, or a bad min.isr); the sink needs transactions, so prove them once per start."""
        from confluent_kafka import KafkaException, Producer

        deadline = time.monotonic() + TRANSACTIONS_TIMEOUT_S
        if self.nodes > 1:
            self._await_majority(deadline)
        # One probe id per node: nodes verifying at once must not fence each other's probe.
        txn_id = PROBE_TRANSACTIONAL_ID if self.node_id == 1 else f"{PROBE_TRANSACTIONAL_ID}-{self.node_id}"
        producer = Producer(self._client(**{"bootstrap.servers": kafka_config.bootstrap(self.layout, self.nodes),
                                            "transactional.id": txn_id}))
        while True:
            remaining = deadline - time.monotonic()
            try:
                producer.init_transactions(max(1.0, min(remaining, 30.0)))
                break
            except KafkaException as e:
                error = e.args[0]
                if not error.retriable() or time.monotonic() >= deadline:
                    raise self.fail(f"the broker answers metadata but init_transactions() failed: {error}") from None
            time.sleep(0.5)
        if self.layout.secure and self.node_id == 1:
            self._apply_acls()

    def _apply_acls(self) -> None:
        """The least-privilege grants of :mod:`eosink.worker.stack.kafka_acl`, as the super user (idempotent)."""
        from eosink.worker.stack import kafka_acl

        try:
            kafka_acl.apply(self._client(**{"bootstrap.servers": kafka_config.bootstrap(self.layout, self.nodes)}))
        except Exception as e:  # noqa: BLE001 - one line naming what failed, whatever the client raised
            raise self.fail(f"applying the least-privilege ACLs failed: {e}") from None

    def _await_majority(self, deadline: float) -> None:
        """Transactions need ``min.insync.replicas`` (2) live nodes: nodes that start together wait
        for each other here; a node restarted into a running cluster finds them at once."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self._client(**{"bootstrap.servers": self.address()}))
        needed = 2
        seen = 0
        while time.monotonic() < deadline:
            try:
                seen = len(admin.list_topics(timeout=5).brokers)
            except Exception:  # noqa: BLE001 - not answering yet: ask again
                seen = 0
            if seen >= needed:
                return
            time.sleep(0.5)
        raise self.fail(f"node {self.node_id} runs but only {seen} of {self.nodes} brokers are registered after "
                        f"{TRANSACTIONS_TIMEOUT_S:.0f}s; transactions need {needed} (see the other kafka-* logs)")


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes them (URL-safe base64 of 16 bytes), never starting with '-'.

    One id in 64 would start with '-', and the storage tool reads ``-t -xyz...`` as an unknown flag
    (seen here: ``stack up`` failed formatting). Kafka's own ``Uuid.randomUuid()`` draws again for
    the same reason.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


@cache
def node_class(node: int) -> type[Kafka]:
    """The component class for node ``node``: ``Kafka`` itself for 1, ``kafka-<n>`` otherwise."""
    if node == 1:
        return Kafka
    return type(f"KafkaNode{node}", (Kafka,), {"name": f"kafka-{node}", "node_id": node,
                                               "__doc__": f"Node {node} of a multi-broker Kafka."})


def nodes(layout: StackLayout, count: int | None = None) -> list[Kafka]:
    """Every node of the stack's Kafka, node 1 first."""
    total = kafka_config.broker_count(layout, count)
    return [node_class(n)(layout, total) for n in range(1, total + 1)]


def node_names(layout: StackLayout, count: int | None = None) -> list[str]:
    total = kafka_config.broker_count(layout, count)
    return [node_class(n).name for n in range(1, total + 1)]
