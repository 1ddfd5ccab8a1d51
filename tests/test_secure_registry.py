"""The Schema Registry of the locked-down stack (``eosink stack up --secure``): HTTPS with the stack's CA,
HTTP basic auth on every path, its schemas in PostgreSQL as a role of its own over TLS, and an Avro
topic delivered through a real worker that holds the registry's credentials, each record once.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.conftest import SECURE_HOME

pytestmark = pytest.mark.secure

AVRO = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}}]}


@pytest.fixture(scope="module")
def reg(secure_stack) -> dict[str, Any]:
    """endpoints.json's ``registry`` entry of the secure stack."""
    entry = secure_stack.raw.get("registry")
    assert entry is not None, f"the secure stack under {SECURE_HOME} names no registry in its endpoints file"
    return dict(entry)


def client(reg: dict[str, Any], material: Any, *, ca: bool = True, user_info: str | None = "") -> Any:
    """confluent-kafka's client as a connector's converter would build it (``user_info=""``: the stack's own)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf: dict[str, Any] = {"url": reg["url"], "timeout": 10, "max.retries": 0}
    if ca:
        conf["ssl.ca.location"] = reg["ca_file"]
    if user_info is not None:
        conf["basic.auth.user.info"] = user_info or f"{reg['user']}:{material.password('registry')}"
    return SchemaRegistryClient(conf)


def status_of(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10, context=context) as a:
            return int(a.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_secure_registry_refuses_a_client_without_credentials(reg, secure_material, unique) -> None:
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    schema = Schema(json.dumps(AVRO), "AVRO")
    for user_info in (None, f"{reg['user']}:wrong-{unique}", f"eosink-worker:{secure_material.password('registry')}"):
        anonymous = client(reg, secure_material, user_info=user_info)
        for call in (anonymous.get_subjects, lambda c=anonymous: c.register_schema(f"{unique}-value", schema)):
            with pytest.raises(SchemaRegistryError) as refused:
                call()
            assert refused.value.http_status_code == 401, f"{user_info!r}: {refused.value}"
    # Every path the app serves, not only the Confluent API: Apicurio's own API and the ccompat config too.
    context = ssl.create_default_context(cafile=reg["ca_file"])
    base = reg["url"].removesuffix("/apis/ccompat/v7")
    for path in ("/apis/registry/v3/search/artifacts", "/apis/registry/v2/search/artifacts", "/apis/ccompat/v7/config", "/"):
        assert status_of(base + path, context) == 401, f"{base + path} answered without credentials"
    owner = client(reg, secure_material)
    assert owner.register_schema(f"{unique}-value", schema) > 0
    assert f"{unique}-value" in owner.get_subjects()


def test_the_secure_registry_refuses_a_client_that_does_not_trust_its_ca_or_speaks_plain_http(reg, secure_material) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    untrusting = client(reg, secure_material, ca=False)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED") as refused:
        untrusting.get_subjects()
    assert not isinstance(refused.value, SchemaRegistryError), "an HTTP answer came without a verified certificate"
    plain = client({**reg, "url": reg["url"].replace("https://", "http://")}, secure_material)
    with pytest.raises(Exception, match="without sending a response") as unanswered:
        plain.get_subjects()
    assert not isinstance(unanswered.value, SchemaRegistryError), "the registry answered plain HTTP"
    assert isinstance(client(reg, secure_material).get_subjects(), list), "the same client trusting the CA is served"


def test_the_secure_registry_is_in_status_keeps_its_secrets_off_its_command_line_and_defaults_to_backward(
        reg, secure_material, unique) -> None:
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from eosink.worker.stack import status

    [entry] = status(["registry"], home=SECURE_HOME)
    assert entry.state == "running" and entry.address.startswith("https://"), entry
    with open(f"/proc/{entry.pid}/cmdline", "rb") as f:
        cmdline = f.read().decode(errors="replace")  # what `ps` shows every local user
    for role in ("registry", "postgres.registry"):
        assert secure_material.password(role) not in cmdline, f"{role}'s password is on the registry's command line"
    assert reg["converter"]["basic.auth.user.info"].startswith(f"{reg['user']}:${{file:")
    owner = client(reg, secure_material)
    assert owner.get_compatibility() == "BACKWARD"
    subject = f"{unique}-value"
    owner.register_schema(subject, Schema(json.dumps(AVRO), "AVRO"))
    breaking = {**AVRO, "fields": [*AVRO["fields"], {"name": "channel", "type": "string"}]}  # no default: not BACKWARD
    with pytest.raises(SchemaRegistryError) as refused:
        owner.register_schema(subject, Schema(json.dumps(breaking), "AVRO"))
    assert refused.value.http_status_code == 409


def test_the_secure_registry_stores_its_schemas_as_a_role_of_its_own_over_tls(secure_stack, secure_material) -> None:
    import psycopg

    from eosink.worker.stack.components.registry import DATABASE

    admin_dsn = secure_stack.postgres_dsn
    with psycopg.connect(admin_dsn.replace("/eosink?", f"/{DATABASE}?"), autocommit=True) as conn:
        sessions = conn.execute("SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                                "WHERE a.datname = %s AND a.pid <> pg_backend_pid()", (DATABASE,)).fetchall()
        assert sessions and all(user == "eosink_registry" and tls for user, tls in sessions), sessions
        rights = conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles "
                              "WHERE rolname = 'eosink_registry'").fetchone()
        assert rights == (False, False, False, False, False)
        owners = conn.execute("SELECT DISTINCT schemaname, tableowner FROM pg_tables WHERE tableowner = 'eosink_registry'"
                              ).fetchall()
        assert owners == [("eosink_registry", "eosink_registry")]
    registry_password = secure_material.password("postgres.registry")
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        psycopg.connect(admin_dsn.replace("eosink@", "eosink_registry@"), password=registry_password, connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        psycopg.connect(secure_stack.raw["postgres"]["sink_dsn"].replace("/eosink?", f"/{DATABASE}?"), connect_timeout=5)


def test_an_avro_topic_on_the_secure_stack_reaches_the_secure_postgres_once_through_a_worker_holding_the_registry_credentials(
        secure_stack, secure_material, reg, unique, tmp_path, secure_zookeeper_env, secure_kafka_env, secure_make_topic,
        secure_kafka_admin) -> None:
    """A worker with Connect's converter keys as endpoints.json hands them out (the password a ``${file:...}``
    reference): every id of an Avro topic in the sink's table once, its decimal exact."""
    import decimal

    import psycopg
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from eosink.worker.engine.zk import ZkCredentials
    from tests.procs import WorkerProcess, register, wait_until

    count = 600
    topic = secure_make_topic(3, f"outbox.{unique}")
    avro = AvroSerializer(client(reg, secure_material), json.dumps(AVRO))
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({**secure_kafka_admin, "transactional.id": f"eosink-outbox.test-{unique}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, avro({"id": i, "name": f"n{i}", "amount": decimal.Decimal(i) / 100 + 1}, ctx), partition=i % 3)
    producer.commit_transaction(30)
    sink_dsn = secure_stack.raw["postgres"]["sink_dsn"]
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{unique}" (id bigint, name text, amount numeric(10,2))')
    config = {"connector.class": "postgres", "topics": topic, "connection.url": sink_dsn, "table.name.format": unique,
              "value.converter": "io.confluent.connect.avro.AvroConverter", "commit.interval.ms": "300",
              **{f"value.converter.{k}": v for k, v in reg["converter"].items()}}
    register(secure_stack.zookeeper_hosts, unique, unique.replace("_", "-"), config,
             credentials=ZkCredentials(secure_material.user("zookeeper"), secure_material.password("zookeeper")),
             ca_file=str(secure_material.ca_cert))

    def ids() -> list[int]:
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            return [r[0] for r in conn.execute(f'SELECT id FROM "{unique}"')]

    w = WorkerProcess(secure_stack, unique, "w1", tmp_path, extra_env={**secure_kafka_env, **secure_zookeeper_env})
    try:
        wait_until(lambda: len(ids()) >= count, 120, f"{count} rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    delivered = ids()
    assert sorted(delivered) == list(range(count)), f"{len(delivered) - len(set(delivered))} doubled, " \
                                                    f"{count - len(set(delivered))} missing"
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        assert conn.execute(f'SELECT name, amount FROM "{unique}" WHERE id = 7').fetchone() == ("n7", decimal.Decimal("1.07"))
    assert secure_material.password("registry") not in w.log_text(), "the registry's password is in the worker's log"


def test_the_secure_registry_answers_at_once_after_its_postgresql_restarts(reg, secure_material, unique) -> None:
    """Its pooled connections die with the server; each is validated before use and replaced, so the first
    request after the restart is served (unvalidated, ~20 requests failed with 500 first, and a later
    ``stack up`` refused the registry as unhealthy)."""
    from confluent_kafka.schema_registry import Schema

    from eosink.worker.stack import start_component, stop_component

    owner = client(reg, secure_material)
    assert owner.get_subjects() is not None  # the pool holds live connections now
    stop_component("postgres", SECURE_HOME)
    start_component("postgres", SECURE_HOME)
    for n in range(5):
        assert owner.register_schema(f"{unique}-{n}-value", Schema(json.dumps(AVRO), "AVRO")) > 0
