"""Kafka locked down: SASL/SCRAM over TLS, deny-by-default ACLs, and the least privileges of each principal.

Against the secure stack (``secure_stack``): a real worker process delivers a transactional outbox
topic into the filesystem sink with only ``eosink-worker``'s grants, and the Spark publisher's
partition path publishes with only ``eosink-publisher``'s. Then each grant of
:data:`eosink.worker.stack.kafka_acl.GRANTS` is removed in turn: the failure names the librdkafka
error and the missing permission in one line, and once the grant is back every id is in the sink
once, none missing, nothing from an aborted transaction, nothing left prepared.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import secure_kafka_client
from tests.procs import WorkerProcess, wait_until
from tests.spark_fixtures import spark  # noqa: F401 - a fixture

pytestmark = pytest.mark.secure

PARTITIONS = 3
BAD_EVERY = 25  # every 25th committed record is not JSON: it goes to the dead-letter topic


# -- clients of the secure stack ----------------------------------------------------------------------


def client(role: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of ``role``: the stack's non-secret client settings plus its user and password."""
    return {**secure_kafka_client(role), "log_level": 0, **extra}


@pytest.fixture(scope="module")
def admin_conf(secure_kafka_admin) -> dict[str, Any]:
    return {**secure_kafka_admin, "log_level": 0}


@pytest.fixture
def topics(secure_make_topic) -> Any:
    """``topics(name, partitions)`` creates a topic as admin; all are deleted after the test."""
    return lambda name, partitions=1: secure_make_topic(partitions, name)


@pytest.fixture
def without(admin_conf) -> Iterator[Any]:
    """``without(grant)`` deletes one ACL of the table; it is restored after the test whatever happens."""
    from eosink.worker.stack import kafka_acl

    removed: list[Any] = []

    def remove(grant: Any) -> None:
        kafka_acl.delete(admin_conf, [grant])
        removed.append(grant)
        time.sleep(1.0)  # ACL changes reach the authorizer through the metadata log

    yield remove
    kafka_acl.create(admin_conf, removed)


def restore(admin_conf: dict[str, Any], grant: Any) -> None:
    from eosink.worker.stack import kafka_acl

    kafka_acl.create(admin_conf, [grant])
    time.sleep(1.0)


def publish(conf: dict[str, Any], topic: str, tid: str, *, txns: int = 6, per_txn: int = 40) -> tuple[set[str], set[str], set[str]]:
    """Transactions into ``topic``, every third aborted; every BAD_EVERY-th committed record is not JSON.

    Returns (committed good ids, aborted ids, committed bad ids)."""
    from confluent_kafka import Producer

    p = Producer({**conf, "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(30)
    good: set[str] = set()
    aborted: set[str] = set()
    bad: set[str] = set()
    n = 0
    for t in range(txns):
        p.begin_transaction()
        ids: list[tuple[str, bool]] = []
        for _ in range(per_txn):
            rid = f"{tid}-{n}"
            is_bad = n % BAD_EVERY == BAD_EVERY - 1
            value = f"not json {rid}".encode() if is_bad else json.dumps({"id": rid}).encode()
            p.produce(topic, key=rid.encode(), value=value, partition=n % PARTITIONS)
            ids.append((rid, is_bad))
            n += 1
        if t % 3 == 2:
            p.flush(30)
            p.abort_transaction(30)
            aborted |= {rid for rid, _ in ids}
        else:
            p.commit_transaction(30)
            good |= {rid for rid, b in ids if not b}
            bad |= {rid for rid, b in ids if b}
    return good, aborted, bad


def read_keys(conf: dict[str, Any], topic: str) -> list[str]:
    """Every key of ``topic`` as a read_committed consumer sees it, to the log end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conf, "group.id": f"test-{uuid.uuid4().hex}", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        tps = [TopicPartition(topic, p, 0) for p in md.partitions]
        c.assign(tps)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
        done = {p for p, end in ends.items() if end == 0}
        keys: list[str] = []
        deadline = time.monotonic() + 30
        while len(done) < len(ends) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == -191:  # _PARTITION_EOF
                    done.add(m.partition())
                continue
            keys.append(m.key().decode())
        return keys
    finally:
        c.close()


# -- the worker ------------------------------------------------------------------------------------


class SecureWorkerRun:
    """One outbox topic, its dead-letter topic, a filesystem connector, and worker processes as ``eosink-worker``."""

    def __init__(self, stack: Any, material: Any, admin_conf: dict[str, Any], topics: Any, unique: str, tmp: Path,
                 env: dict[str, str]) -> None:
        self.stack, self.material, self.admin_conf, self.tmp = stack, material, admin_conf, tmp
        self.base_env = env
        self.cluster = unique
        self.connector = unique.replace("_", "-")
        self.topic = topics(f"outbox.{unique}", PARTITIONS)
        self.dlq = topics(f"dlq.{unique}", 1)
        self.out = tmp / "out"
        self.good, self.aborted, self.bad = publish(admin_conf, self.topic, f"test-{unique}")
        self.workers: list[WorkerProcess] = []

    def session(self) -> Any:
        """A ZooKeeper session of the cluster's owner (the secure stack's ZooKeeper wants TLS and credentials)."""
        from eosink.worker.engine.zk import ZkCredentials, ZkSession

        owner = ZkCredentials(self.material.user("zookeeper"), self.material.password("zookeeper"))
        return ZkSession(self.stack.zookeeper_hosts, self.cluster, credentials=owner,
                         ca_file=str(self.material.ca_cert)).start(create_root=True)  # as `eosink cluster init` does

    def register(self) -> None:
        from eosink.worker.control.config import parse_connector
        from eosink.worker.control.store import ConnectorStore

        config = {"connector.class": "filesystem", "topics": self.topic, "file.path": str(self.out),
                  "commit.interval.ms": "200", "batch.max.records": "50",
                  "errors.tolerance": "all", "errors.deadletterqueue.topic.name": self.dlq}
        parse_connector(self.connector, config, resolve=False)  # the same validation as the CLI and the REST API
        session = self.session()
        try:
            ConnectorStore(session).put(self.connector, config)
        finally:
            session.stop()

    def start(self, **env: str) -> WorkerProcess:
        w = WorkerProcess(self.stack, self.cluster, f"w{len(self.workers)}", self.tmp, extra_env={**self.base_env, **env})
        self.workers.append(w)
        return w

    def statuses(self) -> list[dict[str, Any]]:
        session = self.session()
        zk = session.client
        try:
            base = f"/eosink/{self.cluster}/status/{self.connector}"
            return [json.loads(zk.get(f"{base}/{w}")[0]) for w in (zk.get_children(base) if zk.exists(base) else [])]
        finally:
            session.stop()

    def delivered(self) -> list[str]:
        """Every id the sink made visible (readers read only committed/*.jsonl), duplicates included."""
        ids: list[str] = []
        for path in sorted((self.out / self.connector / "committed").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                value = json.loads(line)["value"]
                ids.append((json.loads(value) if isinstance(value, str) else value)["id"])
        return ids

    def prepared(self) -> list[str]:
        return sorted(p.name for p in (self.out / self.connector / "prepared").glob("*"))

    def assert_exactly_once(self) -> None:
        ids = self.delivered()
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates in the sink"
        assert set(ids) == self.good, (f"missing {len(self.good - set(ids))}, from aborted transactions "
                                       f"{len(set(ids) & self.aborted)}, bad records {len(set(ids) & self.bad)}")
        assert self.prepared() == [], f"left prepared: {self.prepared()}"
        dead = read_keys(self.admin_conf, self.dlq)
        assert sorted(dead) == sorted(self.bad), f"dead-letter topic: {len(dead)} records for {len(self.bad)} bad ones"

    def stop_all(self) -> None:
        for w in self.workers:
            w.stop()


@pytest.fixture
def worker_run(secure_stack, secure_material, admin_conf, topics, unique, tmp_path, secure_kafka_env,
               secure_zookeeper_env) -> Iterator[SecureWorkerRun]:
    run = SecureWorkerRun(secure_stack, secure_material, admin_conf, topics, unique, tmp_path,
                          {**secure_zookeeper_env, **secure_kafka_env})
    try:
        yield run
    finally:
        run.stop_all()


def test_worker_with_only_its_grants_delivers_exactly_once_and_dead_letters_bad_records(worker_run):
    run = worker_run
    run.register()
    run.start()
    wait_until(lambda: set(run.delivered()) >= run.good, 120, f"delivery of {len(run.good)} ids (statuses {run.statuses()})")
    wait_until(lambda: len(read_keys(run.admin_conf, run.dlq)) >= len(run.bad), 60, "the dead-letter records")
    run.assert_exactly_once()


def _worker_grants() -> list[Any]:
    from eosink.worker.stack import kafka_acl

    return [pytest.param(g, id=g.key) for g in kafka_acl.GRANTS if g.principal == kafka_acl.WORKER]


#: What the one-line error names when a worker grant is missing: the librdkafka error and the resource.
WORKER_REFUSALS = {
    ("TOPIC", "READ"): ("TOPIC_AUTHORIZATION_FAILED: eosink-worker may not READ topic outbox.",),
    ("GROUP", "READ"): ("GROUP_AUTHORIZATION_FAILED: eosink-worker may not READ group eosink-",),
    ("TOPIC", "WRITE"): ("TOPIC_AUTHORIZATION_FAILED: eosink-worker may not WRITE topic dlq.",),
    ("TRANSACTIONAL_ID", "WRITE"): ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED: eosink-worker may not WRITE transactional.id eosink-dlq.",),
}


@pytest.mark.parametrize("grant", _worker_grants())
def test_worker_without_one_grant_fails_naming_it_and_delivers_exactly_once_after_it_is_restored(worker_run, without, grant):
    run = worker_run
    without(grant)
    run.register()
    first = run.start()
    expected = WORKER_REFUSALS[(grant.resource_type, grant.operation)]

    def failed() -> bool:
        return any(s.get("state") == "FAILED" and all(e in (s.get("trace") or "") for e in expected) for s in run.statuses())

    wait_until(failed, 45, f"a FAILED task naming {expected}")
    trace = next(s["trace"] for s in run.statuses() if s.get("state") == "FAILED")
    assert len(trace.strip().splitlines()) == 1, f"not one line: {trace!r}"
    assert run.material.password("kafka.worker") not in first.log_text()
    ids = run.delivered()
    assert len(ids) == len(set(ids)) and set(ids) <= run.good, "a refused worker made something wrong visible"

    restore(run.admin_conf, grant)
    first.stop()
    run.start()
    wait_until(lambda: set(run.delivered()) >= run.good, 120, f"delivery after the grant is back (statuses {run.statuses()})")
    wait_until(lambda: len(read_keys(run.admin_conf, run.dlq)) >= len(run.bad), 60, "the dead-letter records")
    run.assert_exactly_once()


def test_worker_with_a_wrong_password_exits_naming_sasl_username_and_password(worker_run):
    run = worker_run
    w = run.start(EOSINK_KAFKA_SASL_PASSWORD="not-the-password", EOSINK_STARTUP_TIMEOUT="10")
    assert w.wait(60) != 0
    text = w.log_path.read_text(errors="replace")
    assert "SASL authentication failed for user eosink-worker" in text and "sasl.username / sasl.password" in text, text[-2000:]
    assert "Traceback" not in text


def test_worker_trusting_another_ca_exits_naming_ssl_ca_location(worker_run, tmp_path):
    from eosink.worker.stack import secure

    other = secure.Material(tmp_path / "other-ca")
    other.directory.mkdir()
    secure._write_ca(other)
    run = worker_run
    w = run.start(EOSINK_KAFKA_SSL_CA_LOCATION=str(other.ca_cert), EOSINK_STARTUP_TIMEOUT="10")
    assert w.wait(60) != 0
    text = w.log_path.read_text(errors="replace")
    assert "ssl.ca.location" in text and "TLS handshake" in text, text[-2000:]
    assert "Traceback" not in text


# -- refusals at the door ------------------------------------------------------------------------------


def _metadata(conf: dict[str, Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(conf).list_topics(timeout=5)


def test_client_without_tls_or_with_a_wrong_password_is_refused(secure_stack, secure_material):
    from confluent_kafka import KafkaException

    good = client("kafka.worker")
    assert _metadata(good).brokers  # the same settings with the right password and TLS work
    for conf in ({"bootstrap.servers": secure_stack.kafka_bootstrap, "log_level": 0},
                 {**good, "security.protocol": "SASL_PLAINTEXT"},
                 {**good, "sasl.password": "wrong"},
                 {**good, "sasl.username": "admin"}):
        with pytest.raises(KafkaException):
            _metadata(conf)


def test_controller_listener_refuses_clients_without_the_admin_password(secure_stack, secure_material):
    from confluent_kafka import KafkaException

    from eosink.worker.stack.components import kafka_config
    from eosink.worker.stack.layout import StackLayout
    from tests.conftest import SECURE_HOME

    port = kafka_config.controller_port(StackLayout.for_home(SECURE_HOME), 1)
    worker = client("kafka.worker", **{"bootstrap.servers": f"127.0.0.1:{port}"})
    for conf in ({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}, worker, {**worker, "sasl.mechanism": "PLAIN"}):
        with pytest.raises(KafkaException):
            _metadata(conf)


def test_preflight_names_the_setting_for_a_wrong_password_and_a_wrong_ca(secure_stack, secure_material, tmp_path):
    from eosink.worker.control.preflight import check_kafka
    from eosink.worker.engine.kafka_errors import KafkaAuthenticationError, KafkaTlsError
    from eosink.worker.stack import secure

    good = client("kafka.worker")
    settings = {k: v for k, v in good.items() if k not in ("bootstrap.servers", "log_level")}
    check_kafka(secure_stack.kafka_bootstrap, settings, 10)
    with pytest.raises(KafkaAuthenticationError, match="sasl.username / sasl.password") as e:
        check_kafka(secure_stack.kafka_bootstrap, {**settings, "sasl.password": "wrong"}, 10)
    assert "wrong" not in str(e.value)
    other = secure.Material(tmp_path / "other-ca")
    other.directory.mkdir()
    secure._write_ca(other)
    with pytest.raises(KafkaTlsError, match="ssl.ca.location"):
        check_kafka(secure_stack.kafka_bootstrap, {**settings, "ssl.ca.location": str(other.ca_cert)}, 10)


# -- the publisher ---------------------------------------------------------------------------------------


def _publisher_grants() -> list[Any]:
    from eosink.worker.stack import kafka_acl

    return [pytest.param(g, id=g.key) for g in kafka_acl.GRANTS if g.principal == kafka_acl.PUBLISHER]


def publish_partitions(conf: dict[str, Any], topic: str, job: str, run_id: str, partitions: int, per_partition: int) -> int:
    """What ``publish_outbox`` does, without Spark: the driver's checks and ledger read, then one
    transaction per partition (:class:`PartitionPublisher`, the task's own code). Returns records published."""
    import pyarrow as pa

    from eosink.spark_jobs import kafka_checks
    from eosink.spark_jobs.ledger import read_run
    from eosink.spark_jobs.naming import LEDGER_TOPIC
    from eosink.spark_jobs.outbox import CompiledOutbox
    from eosink.spark_jobs.publisher import producer_config
    from eosink.spark_jobs.task import PartitionPublisher, TaskSpec, publish_partition

    conf = producer_config(conf)
    admin, watch = kafka_checks.connect(conf)
    md = kafka_checks.cluster_metadata(admin, conf["bootstrap.servers"], 15, watch)
    kafka_checks.check_topics_exist(md, [topic], conf["bootstrap.servers"], admin, conf)
    kafka_checks.ensure_ledger_topic(admin, md, LEDGER_TOPIC, kafka=conf)
    state = read_run(conf, LEDGER_TOPIC, job, run_id, 30)
    spec = TaskSpec(job=job, run_id=run_id, producer_config=conf, outboxes=(CompiledOutbox(topic, 0, 1, None, ()),),
                    ledger_topic=LEDGER_TOPIC, ledger_since=state.end_offset, known_published=frozenset(state.entries),
                    pending=state.pending, transaction_timeout_ms=60_000, ledger_timeout_s=30, num_partitions=partitions)
    assert PartitionPublisher  # the class publish_partition drives
    published = 0
    for p in range(partitions):
        ks = [f"{job}/{p}/{i}" for i in range(per_partition)]
        batch = pa.record_batch([pa.array(ks), pa.array([json.dumps({"id": k}).encode() for k in ks], pa.binary())],
                                names=["k", "v"])
        result = publish_partition(spec, p, 0, iter([batch]))
        published += max(result.records, 0) if result.status == "published" else 0
    return published


def expected_ids(job: str, partitions: int, per_partition: int) -> list[str]:
    return sorted(f"{job}/{p}/{i}" for p in range(partitions) for i in range(per_partition))


def test_publisher_with_only_its_grants_publishes_every_record_once(secure_stack, secure_material, admin_conf, topics, unique):
    topic = topics(f"outbox.{unique}", 2)
    conf = client("kafka.publisher")
    job = f"outbox.{unique}"
    assert publish_partitions(conf, topic, job, "r1", 3, 20) == 60
    assert publish_partitions(conf, topic, job, "r1", 3, 20) == 0, "a re-run with the same run id published again"
    assert sorted(read_keys(admin_conf, topic)) == expected_ids(job, 3, 20)


PUBLISHER_REFUSALS = {
    ("TOPIC", "WRITE", "PREFIXED"): "TOPIC_AUTHORIZATION_FAILED: eosink-publisher may not WRITE topic outbox.",
    ("TRANSACTIONAL_ID", "WRITE", "PREFIXED"):
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: eosink-publisher may not WRITE transactional.id eosink-outbox.",
    # The broker's answer does not say which topic of the transaction was refused: the error names the
    # topics it wrote (the outbox passed the driver's check, so the ledger is the one).
    ("TOPIC", "WRITE", "LITERAL"): "TOPIC_AUTHORIZATION_FAILED: eosink-publisher may not WRITE topic outbox.",
    ("TOPIC", "READ", "LITERAL"): "TOPIC_AUTHORIZATION_FAILED: eosink-publisher may not READ topic __eosink_publish_ledger",
    ("GROUP", "DESCRIBE", "LITERAL"): "GROUP_AUTHORIZATION_FAILED: eosink-publisher may not DESCRIBE group eosink-ledger-reader",
}


@pytest.mark.parametrize("grant", _publisher_grants())
def test_publisher_without_one_grant_is_refused_naming_it_and_writes_nothing(secure_stack, secure_material, admin_conf, topics,
                                                                             unique, without, grant):
    from eosink.connectors.api.errors import FatalError
    from eosink.spark_jobs.errors import AuthorizationError

    topic = topics(f"outbox.{unique}", 2)
    conf = client("kafka.publisher")
    job = f"outbox.{unique}"
    without(grant)
    with pytest.raises(AuthorizationError) as refused:
        publish_partitions(conf, topic, job, "r1", 3, 20)
    assert isinstance(refused.value, FatalError)
    message = str(refused.value)
    assert PUBLISHER_REFUSALS[(grant.resource_type, grant.operation, grant.pattern_type)] in message, message
    assert grant.name in message, message
    assert len(message.splitlines()) == 1 and secure_material.password("kafka.publisher") not in message
    assert read_keys(admin_conf, topic) == [], "a refused publish made records visible"

    restore(admin_conf, grant)
    assert publish_partitions(conf, topic, job, "r1", 3, 20) == 60
    assert sorted(read_keys(admin_conf, topic)) == expected_ids(job, 3, 20)


def test_publisher_with_a_wrong_password_fails_naming_sasl_password_and_publishes_nothing(secure_stack, secure_material,
                                                                                          admin_conf, topics, unique):
    from eosink.spark_jobs.errors import AuthenticationError

    topic = topics(f"outbox.{unique}", 1)
    conf = {**client("kafka.publisher"), "sasl.password": "not-the-password"}
    with pytest.raises(AuthenticationError, match=r"eosink-publisher .*sasl\.username / sasl\.password") as e:
        publish_partitions(conf, topic, f"outbox.{unique}", "r1", 1, 5)
    assert "not-the-password" not in str(e.value) and len(str(e.value).splitlines()) == 1
    assert read_keys(admin_conf, topic) == []


def test_no_password_in_the_broker_config_its_log_or_endpoints(secure_stack, secure_material):
    from eosink.worker.stack.layout import StackLayout
    from tests.conftest import SECURE_HOME

    layout = StackLayout.for_home(SECURE_HOME)
    texts = {path: path.read_text(errors="replace") for path in (
        layout.data_dir("kafka") / "server.properties", layout.log_file("kafka"), layout.endpoints_file)}
    for role in ("kafka.admin", "kafka.worker", "kafka.publisher"):
        secret = secure_material.password(role)
        for path, text in texts.items():
            assert secret not in text, f"the {role} password is in {path}"
    assert secure_stack.raw["kafka"]["client"] == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": str(secure_material.ca_cert)}


@pytest.mark.spark
def test_spark_publish_outbox_as_the_publisher_publishes_every_row_once_and_a_rerun_nothing(
        spark, secure_stack, secure_material, admin_conf, topics, unique):  # noqa: F811 - the fixture
    """The whole Spark path with only the publisher's grants: driver checks, tasks on executors, the run marker."""
    from pyspark.sql import functions as F

    from eosink.spark_jobs import publish_outbox

    topic = topics(f"outbox.{unique}", 2)
    conf = {k: v for k, v in client("kafka.publisher").items() if k != "log_level"}
    df = spark.range(0, 200, 1, numPartitions=4).select(F.format_string("k-%04d", F.col("id")).alias("k"), F.col("id"))
    job = f"outbox.{unique}"
    first = publish_outbox(df, topic, key="k", job=job, run_id="r1", kafka=conf)
    assert (first.status, first.records) == ("published", 200)
    again = publish_outbox(df, topic, key="k", job=job, run_id="r1", kafka=conf)
    assert (again.status, again.records) == ("already_published", 0)
    assert sorted(read_keys(admin_conf, topic)) == [f"k-{i:04d}" for i in range(200)]


def test_the_security_page_lists_exactly_the_kafka_grants_the_stack_applies() -> None:
    """The docs' Kafka table is the code's table: a grant added, dropped or changed without the docs fails here."""
    from eosink.worker.stack import kafka_acl

    page = (Path(__file__).resolve().parent.parent / "docs" / "operations" / "security.md").read_text()
    assert kafka_acl.table() in page
