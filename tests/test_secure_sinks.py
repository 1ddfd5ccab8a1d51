"""The PostgreSQL and S3 sinks against the locked-down stack, as their least-privilege principals.

PostgreSQL: role ``eosink_sink`` over TLS with scram-sha-256, owner of schema ``eosink_sink`` and
nothing else. MinIO: user ``eosink-sink`` over TLS, whose policy allows one bucket and the actions
the sink calls. Each sink is driven through its two-phase API the way the engine drives it
(``tests/sinkkit.py``); a "crash" is a sink dropped between ``pre_commit`` and ``commit``.

The grant-removal tests take away one privilege, run the sink into the refusal, and check that the
error names the privilege and the object, that nothing is half-visible and nothing stays prepared;
then they restore the privilege, finish the way the engine would (recover, commit what was decided,
redeliver what was not) and count: every id once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import psycopg
import pytest
from psycopg import sql

from eosink.connectors.api.config import MASK
from eosink.connectors.api.errors import EosinkError, FatalError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.postgres.sink import PostgresSink
from eosink.connectors.s3.sink import S3Sink
from eosink.worker.control.config import parse_connector, resolve_providers
from eosink.worker.stack import Endpoints, s3_secure
from eosink.worker.stack.secure import SINK_BUCKET, Material
from tests.sinkkit import prepare, records

pytestmark = pytest.mark.secure

SINK_ROLE = "eosink_sink"
SINK_SCHEMA = "eosink_sink"


# -- PostgreSQL ----------------------------------------------------------------------------------
def sink_url(stack: Endpoints, material: Material, sslmode: str = "verify-full", rootcert: str | None = None) -> str:
    """The sink's DSN as a connector config would hold it: no password, no pgpass - TLS settings only."""
    port = stack.postgres_port
    root = f"&sslrootcert={rootcert or material.ca_cert}" if sslmode.startswith("verify") else ""
    return f"postgresql://{SINK_ROLE}@127.0.0.1:{port}/eosink?sslmode={sslmode}{root}"


@pytest.fixture
def pg_admin(secure_stack: Endpoints) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(secure_stack.postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_pg_sink(secure_stack: Endpoints, secure_material: Material, unique: str) -> Iterator[Callable[..., PostgresSink]]:
    """Opened sinks as ``eosink_sink``, the password through a ``${file:...}`` reference, as a worker resolves it."""
    made: list[PostgresSink] = []

    def make(**overrides: Any) -> PostgresSink:
        registered = {"connector.class": "postgres", "topics": "orders", "connection.url": sink_url(secure_stack, secure_material),
                      "connection.password": secure_material.reference("postgres.sink"), **overrides}
        parsed = parse_connector(unique, registered)  # as the worker running it: ${file:...} resolved here
        assert parsed.masked()["connection.password"] == MASK
        sink = parsed.create_sinks()[0]
        assert isinstance(sink, PostgresSink)
        made.append(sink)
        sink.open()
        return sink

    yield make
    for s in made:
        s.close()
    with psycopg.connect(secure_stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(sql.Identifier(SINK_SCHEMA), sql.Identifier(SINK_ROLE)))
        for x in conn.tpc_recover():
            if x.gtrid.startswith(f"eosink:{unique}"):
                conn.tpc_rollback(x)
        for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s)",
                                    (SINK_SCHEMA, unique)).fetchall():
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(SINK_SCHEMA, name)))


def pg_ids(admin: psycopg.Connection[Any], table: str) -> list[int]:
    query = sql.SQL("SELECT (id)::int FROM {} ORDER BY 1").format(sql.Identifier(SINK_SCHEMA, table))
    return [r[0] for r in admin.execute(query).fetchall()]


def prepared(admin: psycopg.Connection[Any], unique: str) -> list[str]:
    return [r[0] for r in admin.execute("SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"eosink:{unique}",))]


def manifests(admin: psycopg.Connection[Any], unique: str) -> list[str]:
    query = sql.SQL("SELECT txn_id FROM {} WHERE connector = %s").format(sql.Identifier(SINK_SCHEMA, "eosink_txn_manifest"))
    return [r[0] for r in admin.execute(query, (unique,)).fetchall()]


def ids(start: int, stop: int, topic: str) -> list[SinkRecord]:
    return records(topic, [{"id": i} for i in range(start, stop)], start=start)


def test_postgres_sink_role_is_no_superuser_and_reaches_neither_public_nor_other_databases(
        secure_stack: Endpoints, secure_material: Material, pg_admin: psycopg.Connection[Any]) -> None:
    row = pg_admin.execute("SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles "
                           "WHERE rolname = %s", (SINK_ROLE,)).fetchone()
    assert row == (False, False, False, False, False)
    owner = pg_admin.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s", (SINK_SCHEMA,)).fetchone()
    assert owner == (SINK_ROLE,)
    password = secure_material.password("postgres.sink")
    with psycopg.connect(sink_url(secure_stack, secure_material), password=password, autocommit=True) as conn:
        assert conn.execute("SELECT current_schema(), ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (SINK_SCHEMA, True)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.eosink_probe (id int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE ROLE eosink_probe")
    other = sink_url(secure_stack, secure_material).replace("/eosink?", "/postgres?")
    with pytest.raises(psycopg.OperationalError, match="CONNECT privilege"):
        psycopg.connect(other, password=password)


def test_postgres_sink_role_delivers_exactly_once_across_a_crash_between_pre_commit_and_commit(
        make_pg_sink: Callable[..., PostgresSink], pg_admin: psycopg.Connection[Any], unique: str) -> None:
    topic, table = f"{unique}.orders", f"{unique}_orders"
    sink = make_pg_sink()
    prepare(sink, f"{unique}.w.1.1", ids(0, 5, topic))
    sink.commit(f"{unique}.w.1.1")
    prepare(sink, f"{unique}.w.1.2", ids(5, 10, topic))
    sink.close()  # the worker dies: its transaction stays prepared, invisible
    assert pg_ids(pg_admin, table) == list(range(5))
    assert prepared(pg_admin, unique) == [f"eosink:{unique}.w.1.2"]

    survivor = make_pg_sink()
    assert [m.txn_id for m in survivor.recover()] == [f"{unique}.w.1.2"]
    survivor.commit(f"{unique}.w.1.2")
    prepare(survivor, f"{unique}.w.1.1", ids(0, 5, topic))  # a replay of a committed txn is a no-op
    survivor.commit(f"{unique}.w.1.1")
    assert pg_ids(pg_admin, table) == list(range(10))
    assert prepared(pg_admin, unique) == [] and manifests(pg_admin, unique) == []
    owner = pg_admin.execute("SELECT tableowner FROM pg_tables WHERE schemaname = %s AND tablename = %s", (SINK_SCHEMA, table)).fetchone()
    assert owner == (SINK_ROLE,)


@pytest.mark.parametrize(("revoke", "grant", "named"), [
    ("REVOKE INSERT ON {table} FROM {role}", "GRANT INSERT ON {table} TO {role}", "INSERT on table {schema}.{name}"),
    ("REVOKE USAGE ON SCHEMA {schema_id} FROM {role}", "GRANT USAGE ON SCHEMA {schema_id} TO {role}", "USAGE on schema {schema}"),
    ("REVOKE UPDATE ON {offsets} FROM {role}", "GRANT UPDATE ON {offsets} TO {role}", "UPDATE on table {schema}.eosink_offsets"),
], ids=["insert-on-target", "usage-on-schema", "update-on-the-fence-table"])
def test_postgres_revoked_privilege_is_named_with_its_object_and_nothing_is_written_or_left_prepared(
        make_pg_sink: Callable[..., PostgresSink], pg_admin: psycopg.Connection[Any], unique: str,
        revoke: str, grant: str, named: str) -> None:
    topic, table = f"{unique}.orders", f"{unique}_orders"
    sink = make_pg_sink()
    prepare(sink, f"{unique}.w.1.1", ids(0, 5, topic))
    sink.commit(f"{unique}.w.1.1")
    names = {"table": sql.Identifier(SINK_SCHEMA, table).as_string(pg_admin), "role": SINK_ROLE,
             "offsets": sql.Identifier(SINK_SCHEMA, "eosink_offsets").as_string(pg_admin),
             "schema_id": sql.Identifier(SINK_SCHEMA).as_string(pg_admin), "schema": SINK_SCHEMA, "name": table}
    pg_admin.execute(revoke.format(**names))  # type: ignore[arg-type] - built from identifiers quoted above
    try:
        with pytest.raises(FatalError) as refused:
            prepare(sink, f"{unique}.w.1.2", ids(5, 10, topic))
        message = str(refused.value)
        assert named.format(**names) in message and SINK_ROLE in message and "permission denied" in message
        assert len(message.splitlines()) == 1
        assert prepared(pg_admin, unique) == []
        assert pg_ids(pg_admin, table) == list(range(5))  # nothing of the refused txn is visible
    finally:
        pg_admin.execute(grant.format(**names))  # type: ignore[arg-type]
    sink.close()
    again = make_pg_sink()  # the engine aborted the txn and redelivers its records
    assert [m.txn_id for m in again.recover()] == []
    again.abort(f"{unique}.w.1.2")
    prepare(again, f"{unique}.w.1.3", ids(5, 10, topic))
    again.commit(f"{unique}.w.1.3")
    assert pg_ids(pg_admin, table) == list(range(10))
    assert prepared(pg_admin, unique) == [] and manifests(pg_admin, unique) == []


def test_postgres_revoked_create_on_the_schema_names_it_when_a_new_topic_needs_a_table_and_nothing_is_written(
        make_pg_sink: Callable[..., PostgresSink], pg_admin: psycopg.Connection[Any], unique: str) -> None:
    sink = make_pg_sink()
    prepare(sink, f"{unique}.w.1.1", ids(0, 3, f"{unique}.a"))
    sink.commit(f"{unique}.w.1.1")
    schema = sql.Identifier(SINK_SCHEMA)
    pg_admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema, sql.Identifier(SINK_ROLE)))
    try:
        with pytest.raises(FatalError, match=f"lacks CREATE on schema {SINK_SCHEMA}"):
            prepare(sink, f"{unique}.w.1.2", ids(0, 3, f"{unique}.b"))  # a new topic: auto.create
        assert prepared(pg_admin, unique) == []
        exists = pg_admin.execute("SELECT to_regclass(%s)", (f"{SINK_SCHEMA}.{unique}_b",)).fetchone()
        assert exists == (None,)
    finally:
        pg_admin.execute(sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(schema, sql.Identifier(SINK_ROLE)))
    sink.abort(f"{unique}.w.1.2")
    prepare(sink, f"{unique}.w.1.3", ids(0, 3, f"{unique}.b"))
    sink.commit(f"{unique}.w.1.3")
    assert pg_ids(pg_admin, f"{unique}_a") == [0, 1, 2] and pg_ids(pg_admin, f"{unique}_b") == [0, 1, 2]
    assert prepared(pg_admin, unique) == [] and manifests(pg_admin, unique) == []


def test_postgres_unix_socket_refuses_the_sink_role_and_lets_only_the_servers_os_account_be_admin(
        secure_stack: Endpoints, secure_material: Material) -> None:
    from eosink.worker.stack.components.postgres import Postgres
    from eosink.worker.stack.layout import StackLayout

    server = Postgres(StackLayout.for_home(secure_material.directory.parent.parent))
    socket_dir, port = str(server.base_dir / "socket"), secure_stack.postgres_port
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
        psycopg.connect(host=socket_dir, port=port, dbname="eosink", user=SINK_ROLE,
                        password=secure_material.password("postgres.sink"))
    with pytest.raises(psycopg.OperationalError, match="Peer authentication failed"):  # we are not the server's OS account
        psycopg.connect(host=socket_dir, port=port, dbname="eosink", user="eosink",
                        password=secure_material.password("postgres.admin"))


def test_postgres_sink_role_cannot_finish_a_transaction_another_role_prepared(
        secure_stack: Endpoints, secure_material: Material, pg_admin: psycopg.Connection[Any], unique: str) -> None:
    xid = pg_admin.xid(0, f"eosink:{unique}.admin", "")
    admin_tx = psycopg.connect(secure_stack.postgres_dsn)
    admin_tx.tpc_begin(xid)
    admin_tx.execute("SELECT 1")
    admin_tx.tpc_prepare()
    admin_tx.close()
    try:
        with psycopg.connect(sink_url(secure_stack, secure_material), password=secure_material.password("postgres.sink"),
                             autocommit=True) as conn:
            assert [x.gtrid for x in conn.tpc_recover() if x.gtrid.startswith(f"eosink:{unique}")]  # listed to all ...
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied to finish prepared transaction"):
                conn.tpc_rollback(xid)  # ... finished by its owner only
    finally:
        pg_admin.tpc_rollback(xid)


@pytest.mark.parametrize(("url", "password", "names"), [
    ("plain", "right", "sslmode"),
    ("verified", "wrong", "connection.password"),
    ("system-ca", "right", "sslrootcert"),
], ids=["without-tls", "wrong-password", "untrusted-certificate"])
def test_postgres_connection_without_tls_with_a_wrong_password_or_an_untrusted_ca_is_refused_in_one_line(
        secure_stack: Endpoints, secure_material: Material, unique: str, url: str, password: str, names: str) -> None:
    dsn = {"plain": sink_url(secure_stack, secure_material, "disable"),
           "verified": sink_url(secure_stack, secure_material),
           "system-ca": sink_url(secure_stack, secure_material, rootcert="/etc/ssl/certs/ca-certificates.crt")}[url]
    secret = secure_material.password("postgres.sink") if password == "right" else "not-the-password"
    sink = PostgresSink(unique, {"connection.url": dsn, "connection.password": secret})
    with pytest.raises(EosinkError) as refused:
        sink.open()
    message = str(refused.value)
    assert isinstance(refused.value, FatalError) and refused.value.component == "postgres"
    assert names in message and len(message.splitlines()) == 1
    assert secret not in message


# -- S3 (MinIO) ------------------------------------------------------------------------------------
def s3_config(stack: Endpoints, material: Material, **overrides: Any) -> dict[str, Any]:
    return {"s3.bucket.name": SINK_BUCKET, "s3.endpoint.url": stack.s3["endpoint_url"], "s3.region": stack.s3["region_name"],
            "s3.path.style.access": True, "aws.ca.bundle": str(material.ca_cert), "s3.max.attempts": 1,
            "aws.access.key.id": material.user("s3.sink"),
            "aws.secret.access.key": resolve_providers(material.reference("s3.sink"), key="aws.secret.access.key"),
            **overrides}


@pytest.fixture
def s3_root(secure_stack: Endpoints, secure_material: Material) -> Any:
    """The MinIO root user's client: the test's view of the bucket (the sink never runs as it)."""
    return boto3.client("s3", **secure_stack.s3, aws_access_key_id=secure_material.user("s3.root"),
                        aws_secret_access_key=secure_material.password("s3.root"))


@pytest.fixture
def make_s3_sink(secure_stack: Endpoints, secure_material: Material, unique: str, s3_root: Any
                 ) -> Iterator[Callable[..., S3Sink]]:
    made: list[S3Sink] = []
    connector = unique.replace("_", "-")

    def make(**overrides: Any) -> S3Sink:
        config = {**s3_config(secure_stack, secure_material, **overrides), "aws.secret.access.key": secure_material.reference("s3.sink")}
        parsed = parse_connector(connector, {"connector.class": "s3", "topics": "orders", **config})  # ${file:...} resolved here
        assert parsed.masked()["aws.secret.access.key"] == MASK
        sink = parsed.create_sinks()[0]
        assert isinstance(sink, S3Sink)
        made.append(sink)
        sink.open()
        return sink

    yield make
    for s in made:
        try:
            s.close()
        except EosinkError:
            pass
    api = s3_secure.admin(secure_material, secure_stack.s3["endpoint_url"], secure_stack.s3["region_name"])
    api.add_policy(s3_secure.SINK_POLICY, s3_secure.policy_document())
    for u in s3_root.list_multipart_uploads(Bucket=SINK_BUCKET).get("Uploads", []):
        if connector in u["Key"]:
            s3_root.abort_multipart_upload(Bucket=SINK_BUCKET, Key=u["Key"], UploadId=u["UploadId"])
    for key in s3_keys(s3_root, ""):
        if connector in key:
            s3_root.delete_object(Bucket=SINK_BUCKET, Key=key)


def s3_keys(client: Any, prefix: str) -> list[str]:
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=SINK_BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def s3_ids(client: Any, connector: str) -> list[int]:
    """Every id a reader sees under the connector's data prefix (objects of whole txns only)."""
    found: list[int] = []
    for key in s3_keys(client, connector + "/"):
        body = client.get_object(Bucket=SINK_BUCKET, Key=key)["Body"].read()
        found += [json.loads(line)["id"] for line in body.splitlines() if line]
    return sorted(found)


def open_uploads(client: Any, connector: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=SINK_BUCKET).get("Uploads", []) if connector in u["Key"]]


def test_s3_sink_user_delivers_exactly_once_across_a_crash_between_pre_commit_and_commit_and_cannot_leave_its_bucket(
        make_s3_sink: Callable[..., S3Sink], s3_root: Any, secure_stack: Endpoints, secure_material: Material, unique: str) -> None:
    from botocore.exceptions import ClientError

    sink = make_s3_sink()
    connector = sink.connector
    prepare(sink, f"{connector}.w.1.1", ids(0, 5, "orders"))
    sink.commit(f"{connector}.w.1.1")
    prepare(sink, f"{connector}.w.1.2", ids(5, 10, "orders"))
    # the worker dies here: its upload stays open, invisible
    assert s3_ids(s3_root, connector) == list(range(5))
    survivor = make_s3_sink()
    assert [m.txn_id for m in survivor.recover()] == [f"{connector}.w.1.2"]
    survivor.commit(f"{connector}.w.1.2")
    prepare(survivor, f"{connector}.w.1.1", ids(0, 5, "orders"))  # redelivered: completes onto the same key, same bytes
    survivor.commit(f"{connector}.w.1.1")
    survivor.close()
    assert s3_ids(s3_root, connector) == list(range(10))
    assert open_uploads(s3_root, connector) == []

    as_sink = boto3.client("s3", **secure_stack.s3, aws_access_key_id=secure_material.user("s3.sink"),
                           aws_secret_access_key=secure_material.password("s3.sink"))
    other = f"eosink-other-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ClientError, match="AccessDenied"):
        as_sink.create_bucket(Bucket=other)
    with pytest.raises(ClientError, match="AccessDenied"):
        as_sink.delete_bucket(Bucket=SINK_BUCKET)


def _drive(make: Callable[..., S3Sink], connector: str, decided: dict[str, bool]) -> None:
    """The engine's moves up to a crash: A committed, B aborted by decision, C redelivers B and the
    worker dies after its pre_commit; a new instance recovers and commits C. ``decided`` records
    each txn whose pre_commit returned, with its decision (the engine decides only then)."""
    sink = make()
    prepare(sink, f"{connector}.w.1.A", ids(0, 2, "orders"))
    decided["A"] = True
    sink.commit(f"{connector}.w.1.A")
    prepare(sink, f"{connector}.w.1.B", ids(2, 4, "orders"))
    decided["B"] = False
    sink.abort(f"{connector}.w.1.B")
    prepare(sink, f"{connector}.w.1.C", ids(2, 4, "orders"))
    decided["C"] = True
    survivor = make()
    for m in survivor.recover():
        survivor.commit(m.txn_id) if decided.get(m.txn_id.rsplit(".", 1)[-1]) else survivor.abort(m.txn_id)
    survivor.close()
    sink.close()


@pytest.mark.parametrize("action", [*s3_secure.SINK_BUCKET_ACTIONS, *s3_secure.SINK_OBJECT_ACTIONS])
def test_s3_policy_without_one_action_names_the_action_and_bucket_and_no_object_is_half_written(
        make_s3_sink: Callable[..., S3Sink], s3_root: Any, secure_stack: Endpoints, secure_material: Material,
        unique: str, action: str) -> None:
    connector = unique.replace("_", "-")
    api = s3_secure.admin(secure_material, secure_stack.s3["endpoint_url"], secure_stack.s3["region_name"])
    api.add_policy(s3_secure.SINK_POLICY, s3_secure.policy_document(
        bucket_actions=tuple(a for a in s3_secure.SINK_BUCKET_ACTIONS if a != action),
        object_actions=tuple(a for a in s3_secure.SINK_OBJECT_ACTIONS if a != action)))
    decided: dict[str, bool] = {}
    try:
        with pytest.raises(FatalError) as refused:
            _drive(make_s3_sink, connector, decided)
        message = str(refused.value)
        assert action in message and f"s3://{SINK_BUCKET}" in message and len(message.splitlines()) == 1
        assert secure_material.password("s3.sink") not in message
        visible = s3_ids(s3_root, connector)
        assert visible in ([], [0, 1], [0, 1, 2, 3])  # whole txns or nothing: never a part of one
    finally:
        api.add_policy(s3_secure.SINK_POLICY, s3_secure.policy_document())
    # Restored: a new instance finishes as the engine would: the decided txns per their decision,
    # the undecided ones aborted, the records of what did not commit redelivered.
    sink = make_s3_sink()
    for m in sink.recover():
        sink.commit(m.txn_id) if decided.get(m.txn_id.rsplit(".", 1)[-1]) else sink.abort(m.txn_id)
    for name, (start, stop) in (("A", (0, 2)), ("C", (2, 4))):
        if decided.get(name):
            sink.commit(f"{connector}.w.1.{name}")  # idempotent: a no-op when it already happened
        else:
            prepare(sink, f"{connector}.w.2.{name}", ids(start, stop, "orders"))
            sink.commit(f"{connector}.w.2.{name}")
    sink.close()
    assert s3_ids(s3_root, connector) == [0, 1, 2, 3]
    assert open_uploads(s3_root, connector) == []
    assert s3_keys(s3_root, f"__pending__/{connector}/") == []


@pytest.mark.parametrize("case", ["plain-http", "wrong-secret", "untrusted-certificate"])
def test_s3_connection_without_tls_with_a_wrong_secret_or_an_untrusted_ca_is_refused_in_one_line(
        secure_stack: Endpoints, secure_material: Material, unique: str, case: str) -> None:
    overrides: dict[str, Any] = {
        "plain-http": {"s3.endpoint.url": secure_stack.s3["endpoint_url"].replace("https://", "http://")},
        "wrong-secret": {"aws.secret.access.key": "not-the-secret-key"},
        "untrusted-certificate": {"aws.ca.bundle": None},
    }[case]
    expected = {"plain-http": (FatalError, "https:// s3.endpoint.url"), "wrong-secret": (FatalError, "aws.secret.access.key"),
                "untrusted-certificate": (FatalError, "aws.ca.bundle")}[case]
    sink = S3Sink(unique.replace("_", "-"), s3_config(secure_stack, secure_material, **overrides))
    with pytest.raises(EosinkError) as refused:
        sink.open()
    sink.close()
    message = str(refused.value)
    assert isinstance(refused.value, expected[0]) and refused.value.component == "s3"
    assert expected[1] in message and len(message.splitlines()) == 1
    assert secure_material.password("s3.sink") not in message and "not-the-secret-key" not in message


# -- Iceberg: SQL catalog in PostgreSQL as eosink_sink, warehouse in MinIO as eosink-sink ---------------
def iceberg_config(stack: Endpoints, material: Material, unique: str, **overrides: Any) -> dict[str, Any]:
    """The catalog through SQLAlchemy/psycopg2 (libpq): TLS verified, the password from the stack's pgpass."""
    pg = stack.raw["postgres"] if stack.raw else {}
    uri = (f"postgresql+psycopg2://{SINK_ROLE}@127.0.0.1:{stack.postgres_port}/eosink?sslmode=verify-full"
           f"&sslrootcert={material.ca_cert}&passfile={pg['passfile']}")
    return {"iceberg.catalog.uri": uri, "iceberg.catalog.name": "eosink", "iceberg.table": f"ns_{unique}.orders",
            "iceberg.warehouse": f"s3://{SINK_BUCKET}/{unique.replace('_', '-')}", "commit.interval.ms": 60_000,
            "s3.endpoint": stack.s3["endpoint_url"], "s3.region": stack.s3["region_name"], "s3.ca-bundle": str(material.ca_cert),
            "s3.access-key-id": material.user("s3.sink"),
            "s3.secret-access-key": resolve_providers(material.reference("s3.sink"), key="s3.secret-access-key"), **overrides}


def test_iceberg_catalog_as_the_sink_role_and_warehouse_as_the_sink_user_deliver_exactly_once_across_a_crash(
        secure_stack: Endpoints, secure_material: Material, s3_root: Any, pg_admin: psycopg.Connection[Any], unique: str) -> None:
    from eosink.connectors.iceberg.sink import IcebergSink

    config = iceberg_config(secure_stack, secure_material, unique)
    sink = IcebergSink(unique, config)
    try:
        sink.open()
        prepare(sink, f"{unique}.w.1.1", ids(0, 3, "orders"))
        sink.commit(f"{unique}.w.1.1")
        prepare(sink, f"{unique}.w.1.2", ids(3, 6, "orders"))
        sink.close()  # the worker dies after pre_commit
        survivor = IcebergSink(unique, config)
        survivor.open()
        assert [m.txn_id for m in survivor.recover()] == [f"{unique}.w.1.2"]
        survivor.commit(f"{unique}.w.1.2")
        table = survivor.tables.catalog().load_table(f"ns_{unique}.orders")
        assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == list(range(6))
        owners = pg_admin.execute("SELECT DISTINCT schemaname, tableowner FROM pg_tables WHERE tablename LIKE 'iceberg%'").fetchall()
        assert owners == [(SINK_SCHEMA, SINK_ROLE)]  # the catalog lives in the sink role's own schema
        survivor.tables.catalog().drop_table(f"ns_{unique}.orders")
        survivor.tables.catalog().drop_namespace(f"ns_{unique}")
        survivor.close()
    finally:
        for key in s3_keys(s3_root, unique.replace("_", "-") + "/"):
            s3_root.delete_object(Bucket=SINK_BUCKET, Key=key)


def test_iceberg_s3_endpoint_with_an_untrusted_certificate_is_refused_at_open_naming_s3_ca_bundle(
        secure_stack: Endpoints, secure_material: Material, unique: str) -> None:
    from eosink.connectors.iceberg.sink import IcebergSink

    sink = IcebergSink(unique, iceberg_config(secure_stack, secure_material, unique, **{"s3.ca-bundle": None}))
    with pytest.raises(FatalError) as refused:
        sink.open()
    message = str(refused.value)
    assert refused.value.component == "iceberg" and "s3.ca-bundle" in message and "not trusted" in message
    assert len(message.splitlines()) == 1


def test_a_restart_of_postgres_and_minio_reasserts_the_sink_grants_and_policy_narrowed_by_hand(
        secure_stack: Endpoints, secure_material: Material) -> None:
    from botocore.exceptions import ClientError

    from eosink.worker.stack import start_component, stop_component

    home = secure_material.directory.parent.parent
    with psycopg.connect(secure_stack.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(sql.Identifier(SINK_SCHEMA), sql.Identifier(SINK_ROLE)))
    api = s3_secure.admin(secure_material, secure_stack.s3["endpoint_url"], secure_stack.s3["region_name"])
    api.add_policy(s3_secure.SINK_POLICY, s3_secure.policy_document(object_actions=("s3:GetObject",)))
    as_sink = boto3.client("s3", **secure_stack.s3, aws_access_key_id=secure_material.user("s3.sink"),
                           aws_secret_access_key=secure_material.password("s3.sink"))
    key = f"restart-probe-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ClientError, match="AccessDenied"):
        as_sink.put_object(Bucket=SINK_BUCKET, Key=key, Body=b"x")
    for name in ("postgres", "s3"):
        stop_component(name, home)
        start_component(name, home)
    with psycopg.connect(secure_stack.postgres_dsn, autocommit=True) as admin:
        row = admin.execute("SELECT has_schema_privilege(%s, %s, 'CREATE')", (SINK_ROLE, SINK_SCHEMA)).fetchone()
        assert row == (True,)
    as_sink.put_object(Bucket=SINK_BUCKET, Key=key, Body=b"x")
    as_sink.delete_object(Bucket=SINK_BUCKET, Key=key)
