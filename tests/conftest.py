"""Session fixtures over the real local stack (``eosink stack up``; ``make test`` starts it).

Every test gets unique topic, table and ZooKeeper names from :func:`unique`, so tests never
collide with each other or with an earlier run against the same stack.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("EOSINK_HOME", str(REPO / ".eosink"))


@pytest.fixture(scope="session")
def stack():
    """The endpoints of the running stack; fails with the command to run when it is down."""
    from eosink.worker.stack import load_endpoints

    return load_endpoints()


#: Where a registry runs for the tests when the open stack has none (a stack started before the stack
#: had one): its own home, on the stack's PostgreSQL; stopped again at the end of the session.
REGISTRY_HOME = Path(os.environ.get("EOSINK_REGISTRY_HOME") or Path(__file__).resolve().parent.parent / ".eosink-registry")


@dataclass(frozen=True)
class RegistryServer:
    """A running Schema Registry: its Confluent-compatible ``url`` and the stack ``home`` that runs it
    (for ``stop_component("registry", home)`` / ``start_component``)."""

    url: str
    home: Path | None


@pytest.fixture(scope="session")
def registry(stack) -> Iterator[RegistryServer]:
    """The stack's Schema Registry, else one started here on the stack's PostgreSQL (and stopped after)."""
    import urllib.request

    from eosink.worker.stack import down, load_endpoints, up

    if stack.registry_url is not None:
        try:
            with urllib.request.urlopen(stack.registry_url + "/subjects", timeout=5):
                pass
        except OSError:
            pass
        else:
            yield RegistryServer(stack.registry_url, None)
            return
    up(["registry"], home=REGISTRY_HOME)
    try:
        url = load_endpoints(REGISTRY_HOME).registry_url
        assert url is not None
        yield RegistryServer(url, REGISTRY_HOME)
    finally:
        down(["registry"], home=REGISTRY_HOME)


#: The secure stack's home (``eosink stack up --secure``), beside the open stack's ``.eosink``.
SECURE_HOME = Path(os.environ.get("EOSINK_SECURE_HOME") or Path(__file__).resolve().parent.parent / ".eosink-secure")


@pytest.fixture(scope="session")
def secure_stack():
    """The endpoints of the locked-down stack, started here when it is not running (idempotent).

    Its material (CA, passwords) is ``secure_material``; its ports are the open stack's + 100.
    """
    from eosink.worker.stack import load_endpoints, up

    up(home=SECURE_HOME, secure=True)
    return load_endpoints(SECURE_HOME)


@pytest.fixture(scope="session")
def secure_material(secure_stack):
    """Paths of the secure stack's CA, server certificate and ``credentials.properties``."""
    from eosink.worker.stack import secure
    from eosink.worker.stack.layout import StackLayout

    return secure.material(StackLayout.for_home(SECURE_HOME))


@pytest.fixture(scope="session")
def secure_zookeeper_env(secure_material) -> dict[str, str]:
    """What a worker needs for the secure stack's ZooKeeper (``WorkerProcess(extra_env=...)``): TLS against the stack's
    CA, and the credentials of cluster principal ``zookeeper`` (the password as a ``${file:...}`` reference)."""
    return {"EOSINK_ZOOKEEPER_USER": secure_material.user("zookeeper"),
            "EOSINK_ZOOKEEPER_PASSWORD": secure_material.reference("zookeeper"),
            "EOSINK_ZOOKEEPER_CA_FILE": str(secure_material.ca_cert)}


def secure_kafka_client(role: str, home: Path = SECURE_HOME) -> dict[str, str]:
    """librdkafka settings of principal ``role`` (``kafka.admin``, ``kafka.worker``, ``kafka.publisher``) on the secure stack."""
    from eosink.worker.stack import load_endpoints
    from eosink.worker.stack.components.kafka_config import client_config
    from eosink.worker.stack.layout import StackLayout

    return {"bootstrap.servers": load_endpoints(home).kafka_bootstrap, **client_config(StackLayout.for_home(home), role)}


@pytest.fixture(scope="session")
def secure_kafka_admin(secure_stack) -> dict[str, str]:
    """librdkafka settings of the secure stack's Kafka super user ``admin`` (topics, ACLs, test producers)."""
    return secure_kafka_client("kafka.admin")


def kafka_worker_env(home: Path = SECURE_HOME) -> dict[str, str]:
    """``EOSINK_KAFKA_*`` variables that make a worker ``eosink-worker`` over SASL_SSL on the secure stack at ``home``.

    With its grants it reads topics named ``outbox.*`` and writes dead letters to ``dlq.*`` (see ``kafka_acl``)."""
    settings = secure_kafka_client("kafka.worker", home)
    return {"EOSINK_KAFKA_" + k.upper().replace(".", "_"): v for k, v in settings.items() if k != "bootstrap.servers"}


@pytest.fixture(scope="session")
def secure_kafka_env(secure_stack) -> dict[str, str]:
    """What a worker needs for the secure stack's Kafka (``WorkerProcess(extra_env=...)``): see :func:`kafka_worker_env`."""
    return kafka_worker_env()


@pytest.fixture
def unique(request) -> str:
    """A short name unique to this test invocation, safe for topics, tables and znodes."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:24].strip("_")
    return f"t_{base}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def kafka_admin(stack):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": stack.kafka_bootstrap})


@contextmanager
def topic_maker(admin, unique: str) -> Iterator:
    """``make(partitions=1, name=None) -> name`` creating topics through ``admin``; all deleted on exit."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []

    def make(partitions: int = 1, name: str | None = None) -> str:
        topic = name or f"{unique}_{len(created)}"
        fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        fs[topic].result(30)
        created.append(topic)
        return topic

    yield make
    if created:
        for f in admin.delete_topics(created).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - cleanup only; the topic names are unique anyway
                pass


@pytest.fixture
def make_topic(kafka_admin, unique) -> Iterator:
    """``make_topic(partitions=3) -> name``: creates a topic, deleted after the test."""
    with topic_maker(kafka_admin, unique) as make:
        yield make


@pytest.fixture
def secure_make_topic(secure_kafka_admin, unique) -> Iterator:
    """``make_topic`` on the secure stack, as its Kafka super user (a least-privilege principal may not create topics)."""
    from confluent_kafka.admin import AdminClient

    with topic_maker(AdminClient({**secure_kafka_admin, "log_level": 0}), unique) as make:
        yield make


@pytest.fixture
def pg(stack) -> Iterator:
    """An autocommit psycopg connection to the stack's database."""
    import psycopg

    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def zk(stack) -> Iterator:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=stack.zookeeper_hosts, timeout=10)
    client.start(timeout=20)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def rigs(kafka_admin) -> Iterator[list]:
    """Fault rigs (:class:`tests.faultkit.Rig`) a test appends: stopped at the end (workers first, so
    a volume under them can be unmounted), and their topics deleted."""
    made: list = []
    yield made
    for r in made:
        r.stop()
    topics = [r.topic for r in made]
    if topics:
        for f in kafka_admin.delete_topics(topics).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - a private Kafka is gone already; names are unique anyway
                pass
