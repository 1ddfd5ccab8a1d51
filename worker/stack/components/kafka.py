"""Kafka 4.x in KRaft combined mode (broker + controller, node 1), from ``jvm/kafka/pom.xml``."""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from eosink.worker.stack import jvm, proc
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST, port

PORT_ENV = "EOSINK_KAFKA_PORT"
CONTROLLER_PORT_ENV = "EOSINK_KAFKA_CONTROLLER_PORT"
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
    name = "kafka"
    ready_timeout_s = 90.0
    stop_timeout_s = 30.0

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
        return {PORT_ENV: port(PORT_ENV), CONTROLLER_PORT_ENV: port(CONTROLLER_PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.address()}

    def address(self) -> str:
        return f"{HOST}:{port(PORT_ENV)}"


    def launch(self) -> int:
        classpath = jvm.classpath("kafka", self.name)
        java = jvm.java(self.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(self._properties())
        self.log4j_file.write_text(LOG4J2)
        common = ["-XX:-UsePerfData", "-Djava.awt.headless=true",
                  f"-Dlog4j2.configurationFile={self.log4j_file}", "-cp", classpath]
        if not (self.log_dir / "meta.properties").exists():
            self._format([java, "-Xmx256m", *common])
        argv = [java, "-Xms256m", "-Xmx1g", *common, "kafka.Kafka", str(self.properties_file)]
        return proc.spawn(argv, self.log_path, cwd=self.data_dir)

    def _cluster_id(self) -> str:
        """Made once and kept, so the log dir (formatted with it) stays valid across restarts."""
        path = self.data_dir / "cluster-id"
        if not path.exists():
            path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode() + "\n")
        return path.read_text().strip()

    def _format(self, java_argv: list[str]) -> None:
        # A static quorum (controller.quorum.voters) needs neither --standalone nor
        # --initial-controllers; --ignore-formatted makes a repeated format harmless.
        argv = [*java_argv, "kafka.tools.StorageTool", "format", "-t", self._cluster_id(),
                "-c", str(self.properties_file), "--ignore-formatted"]
        with open(self.log_path, "ab") as log:
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=self.data_dir, timeout=FORMAT_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise self.fail(f"formatting the log dir {self.log_dir} took over {FORMAT_TIMEOUT_S}s") from None
        if done.returncode != 0:
            raise self.fail(f"formatting the log dir {self.log_dir} failed (exit {done.returncode})")

    def _properties(self) -> str:
        broker, controller = port(PORT_ENV), port(CONTROLLER_PORT_ENV)
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{controller}",
            "listeners": f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{broker}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # One broker: every internal topic has one replica, and few partitions start fast.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "transaction.max.timeout.ms": "900000",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def probe(self) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 0: librdkafka would print every refused connection while the broker boots.
        admin = AdminClient({"bootstrap.servers": self.address(), "log_level": 0})
        metadata = admin.list_topics(timeout=2)
        if not metadata.brokers:
            raise RuntimeError("metadata lists no brokers yet")

    def verify(self) -> None:
        """A broker can answer metadata yet be unable to do transactions (no __transaction_state
        leader yet, or a bad min.isr); the sink needs transactions, so prove them once per start."""
        from confluent_kafka import KafkaException, Producer

        deadline = time.monotonic() + TRANSACTIONS_TIMEOUT_S
        producer = Producer({"bootstrap.servers": self.address(), "transactional.id": PROBE_TRANSACTIONAL_ID,
                             "log_level": 0})
        while True:
            remaining = deadline - time.monotonic()
            try:
                producer.init_transactions(max(1.0, min(remaining, 30.0)))
                return
            except KafkaException as e:
                error = e.args[0]
                if not error.retriable() or time.monotonic() >= deadline:
                    raise self.fail(f"the broker answers metadata but init_transactions() failed: {error}") from None
            time.sleep(0.5)
