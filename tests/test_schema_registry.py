"""Confluent's converters against the real Schema Registry (Apicurio, the stack's) and a real worker.

Avro, Protobuf and JSON Schema values written by confluent-kafka's serializers reach PostgreSQL
once each, typed; bad input (no magic byte, an unknown schema id, a payload that does not match
its schema) is named and dead-lettered or fails the task; a registry stopped mid-delivery holds
delivery back until it returns, and nothing is lost or doubled.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import RegistryServer

AVRO_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "blob", "type": "bytes"}, {"name": "note", "type": ["null", "string"], "default": None}]}
#: v1 plus a field with a default: BACKWARD compatible, a new schema id.
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
JSON_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id", "name"]}
AT = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
CLASSES = {"avro": "io.confluent.connect.avro.AvroConverter", "protobuf": "io.confluent.connect.protobuf.ProtobufConverter",
           "jsonschema": "io.confluent.connect.json.JsonSchemaConverter"}
TABLES = {"avro": "id bigint, name text, amount numeric(10,2), at timestamptz, blob bytea, note text",
          "protobuf": "id bigint, name text, amount double precision, blob bytea",
          "jsonschema": "id bigint, name text"}


@contextlib.contextmanager
def front_of(registry: RegistryServer, refuse: Callable[[Any], tuple[int, bytes] | None]) -> Iterator[str]:
    """A real HTTP front of the registry: ``refuse(request handler)`` answers a request itself (status, JSON
    body), or None passes it to the registry. Yields the front's Confluent API URL."""
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    upstream = registry.url.split("/apis")[0]

    class Front(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            answer = refuse(self)
            if answer is None:
                with urllib.request.urlopen(upstream + self.path, timeout=10) as got:
                    answer = (200, got.read())
            self.send_response(answer[0])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer[1])))
            self.end_headers()
            self.wfile.write(answer[1])

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    finally:
        server.shutdown()
        server.server_close()


def serializer(fmt: str, url: str, topic: str, schema: dict[str, Any] | None = None) -> Callable[[int], bytes]:
    """``i -> bytes`` of record i in ``fmt``, written by confluent-kafka's serializer (which registers the schema)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url, "timeout": 30})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        avro = AvroSerializer(client, json.dumps(schema or AVRO_V1))
        return lambda i: avro({"id": i, "name": f"n{i}", "amount": decimal.Decimal(i) / 100 + 1, "at": AT,
                               "blob": bytes([i % 256, 0, 255]), "note": None if i % 2 else "even"}, ctx)
    if fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        order = _order_class()
        proto = ProtobufSerializer(order, client, {"use.deprecated.format": False})
        return lambda i: proto(order(id=i, name=f"n{i}", amount=i + 0.5, blob=bytes([i % 256, 0, 255])), ctx)
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    js = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    return lambda i: js({"id": i, "name": f"n{i}"}, ctx)


def _order_class() -> Any:
    """``shop.Order`` (int64 id, string name, double amount, bytes blob) built from a descriptor, as protoc would."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    fdp = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    msg = fdp.message_type.add(name="Order")
    for number, (name, kind) in enumerate([("id", 3), ("name", 9), ("amount", 1), ("blob", 12)], 1):
        msg.field.add(name=name, number=number, type=kind, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def connector(fmt: str, url: str, topic: str, table: str, **extra: str) -> dict[str, str]:
    return {"connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": table, "value.converter": CLASSES[fmt], "value.converter.schema.registry.url": url,
            "commit.interval.ms": "300", **extra}


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "jsonschema"])
def test_each_format_reaches_postgres_once_and_typed(registry: RegistryServer, stack, make_topic, unique, pg, tmp_path,
                                                     fmt: str) -> None:
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids, produce

    topic = make_topic(3)
    pg.execute(f'CREATE TABLE "{unique}" ({TABLES[fmt]})')
    encode = serializer(fmt, registry.url, topic)
    produce(stack.kafka_bootstrap, topic, [(i % 3, encode(i)) for i in range(300)])
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), connector(fmt, registry.url, topic, unique))
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= 300, 90, "300 rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    ids = pg_ids(pg, unique)
    assert sorted(ids) == list(range(300)), "not every record exactly once"
    columns = ", ".join(c.split()[0] for c in TABLES[fmt].split(", "))
    row = pg.execute(f'SELECT {columns} FROM "{unique}" WHERE id = 7').fetchone()
    if fmt == "avro":
        assert row == (7, "n7", decimal.Decimal("1.07"), AT, bytes([7, 0, 255]), None)
    elif fmt == "protobuf":
        assert row == (7, "n7", 7.5, bytes([7, 0, 255]))
    else:
        assert row == (7, "n7")


def _bad_records(url: str, topic: str) -> tuple[list[bytes], dict[int, str]]:
    """Good and bad Avro values, and for each bad one's position the words its error names."""
    encode = serializer("avro", url, topic)
    good = encode(1)
    schema_id = int.from_bytes(good[1:5], "big")
    values = [good, b'{"id": 2}', b"\x00\x7f\xff\xff\x01" + good[5:], good[:5] + b"\x02", encode(5)]
    return values, {1: "wire format", 2: "schema id 2147483393", 3: f"schema id {schema_id}"}


def test_bad_input_is_dead_lettered_naming_the_schema_id(registry: RegistryServer, stack, make_topic, unique, pg,
                                                         tmp_path) -> None:
    from confluent_kafka import Consumer

    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids, produce

    topic = make_topic(1)
    dlq = f"{topic}-dlq"
    pg.execute(f'CREATE TABLE "{unique}" ({TABLES["avro"]})')
    values, named = _bad_records(registry.url, topic)
    produce(stack.kafka_bootstrap, topic, [(0, v) for v in values])
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), connector(
        "avro", registry.url, topic, unique, **{"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dlq}))
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= 2, 90, "the good records")
        c = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": unique, "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed"})
        c.subscribe([dlq])
        dead: list[Any] = []
        wait_until(lambda: bool(dead.extend(m for m in c.consume(10, 1) if m.error() is None)) or len(dead) >= 3, 60,
                   "three dead letters")
        c.close()
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert sorted(pg_ids(pg, unique)) == [1, 5]
    assert len(dead) == 3
    for m in dead:
        h = {k: v.decode() for k, v in m.headers()}
        offset = int(h["__connect.errors.offset"])
        assert m.value() == values[offset]
        assert h["__connect.errors.stage"] == "VALUE_CONVERTER"
        assert named[offset] in h["__connect.errors.exception.message"], h


def test_bad_input_without_tolerance_fails_the_task_naming_offset_and_schema_id(registry: RegistryServer, stack, make_topic,
                                                                                unique, pg, tmp_path) -> None:
    from tests.procs import wait_until
    from tests.restkit import call, pg_ids, produce, start_worker

    topic = make_topic(1)
    pg.execute(f'CREATE TABLE "{unique}" ({TABLES["avro"]})')
    values, named = _bad_records(registry.url, topic)
    produce(stack.kafka_bootstrap, topic, [(0, values[0]), (0, values[2])])
    w = start_worker(stack, unique, "w1", tmp_path)
    status = f"/connectors/{unique}/status"
    try:
        call(w.url, "POST", "/connectors", {"name": unique, "config": connector("avro", registry.url, topic, unique,
                                                                               **{"connection.url": stack.postgres_dsn})})
        wait_until(lambda: call(w.url, "GET", status)[1]["connector"]["state"] == "FAILED", 60, "the task to fail")
        trace = call(w.url, "GET", status)[1]["tasks"][0]["trace"]
    finally:
        w.stop()
    assert f"{topic}[0]@1" in trace and named[2] in trace, trace
    assert pg_ids(pg, unique) == [1], "what came before the bad record is delivered, nothing at or after it"


@pytest.mark.chaos
def test_registry_stopped_mid_delivery_holds_delivery_until_it_returns(registry: RegistryServer, stack, make_topic, unique,
                                                                        pg, tmp_path) -> None:
    from eosink.worker.stack import start_component, stop_component
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids, produce

    topic = make_topic(2)
    pg.execute(f'CREATE TABLE "{unique}" ({TABLES["avro"]}, channel text)')
    v1, v2 = serializer("avro", registry.url, topic), serializer("avro", registry.url, topic, AVRO_V2)
    first = [(i % 2, v1(i)) for i in range(100)]
    later = [(i % 2, v2(i)) for i in range(100, 300)]  # a schema id the worker has not fetched yet
    produce(stack.kafka_bootstrap, topic, first)
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), connector("avro", registry.url, topic, unique))
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= 100, 90, "the first 100 rows")
        stop_component("registry", registry.home)
        try:
            produce(stack.kafka_bootstrap, topic, later)
            wait_until(lambda: "schema registry at" in w.log_text() and "not reachable" in w.log_text(), 60,
                       "the worker to name the unreachable registry")
            assert len(pg_ids(pg, unique)) == 100, "records of an unknown schema id delivered without their schema"
        finally:
            start_component("registry", registry.home)
        wait_until(lambda: len(pg_ids(pg, unique)) >= 300, 120, "all 300 rows after the registry returned")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    ids = pg_ids(pg, unique)
    assert sorted(ids) == list(range(300)), "not every record exactly once"
    assert registry.url.split("/apis")[0] in w.log_path.read_text(), "the retryable error names the registry's address"
    channels = dict(pg.execute(f'SELECT channel, count(*) FROM "{unique}" GROUP BY channel').fetchall())
    assert channels == {None: 100, "web": 200}


def test_avro_keys_fill_the_primary_key_and_upserts_keep_the_latest(registry: RegistryServer, stack, make_topic, unique, pg,
                                                                   tmp_path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.procs import WorkerProcess, register, wait_until

    topic = make_topic(1)
    pg.execute(f'CREATE TABLE "{unique}" (id bigint PRIMARY KEY, name text, amount numeric(10,2), at timestamptz, '
               'blob bytea, note text)')
    key_schema = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
    keys = AvroSerializer(SchemaRegistryClient({"url": registry.url, "timeout": 30}), json.dumps(key_schema))
    key_ctx = SerializationContext(topic, MessageField.KEY)
    values = serializer("avro", registry.url, topic)
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-keys"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(60):  # ids 0..19, each written three times: the last value (i = id + 40) wins
        p.produce(topic, key=keys({"id": i % 20}, key_ctx), value=values(i), partition=0)
    p.commit_transaction(30)
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), connector(
        "avro", registry.url, topic, unique, **{"key.converter": CLASSES["avro"], "key.converter.schema.registry.url": registry.url,
                                                 "pk.mode": "record_key", "insert.mode": "upsert"}))
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: pg.execute(f"SELECT count(*) FROM \"{unique}\" WHERE name = 'n' || (id + 40)").fetchone()[0] >= 20,
                   90, "the last value of every key")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    rows = pg.execute(f'SELECT id, name FROM "{unique}" ORDER BY id').fetchall()
    assert rows == [(i, f"n{i + 40}") for i in range(20)]


def test_basic_auth_user_info_reaches_the_registry_and_a_refusal_is_named(registry: RegistryServer, make_topic) -> None:
    """The registry behind a front that demands basic auth (the stack's registry has none): the converter's
    USER_INFO credentials are sent with every request; wrong ones are a retryable error naming the registry."""
    import base64

    from eosink.connectors.api.errors import RetryableError
    from eosink.worker.engine.registry_converters import RegistryDecoder

    expected = "Basic " + base64.b64encode(b"reader:s3cret").decode()

    def unauthorized(request: Any) -> tuple[int, bytes] | None:
        if request.headers.get("Authorization") != expected:
            return 401, b'{"error_code": 401, "message": "Unauthorized"}'
        return None

    with front_of(registry, unauthorized) as front:
        value = serializer("avro", registry.url, make_topic(1))(3)
        auth = {"basic.auth.credentials.source": "USER_INFO", "basic.auth.user.info": "reader:s3cret"}
        assert RegistryDecoder("avro", front, auth)(value)["name"] == "n3"
        with pytest.raises(RetryableError, match=f"schema registry at {front} refused") as refused:
            RegistryDecoder("avro", front, {**auth, "basic.auth.user.info": "reader:wrong"})(value)
        assert "s3cret" not in str(refused.value) and "wrong" not in str(refused.value)


def test_protobuf_nested_messages_enums_repeated_and_maps_become_plain_values(registry: RegistryServer, make_topic) -> None:
    """The second message of a file (message index 1), with a nested message, an enum, a repeated field and a map."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    from eosink.worker.engine.registry_converters import RegistryDecoder

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/shipment.proto", package="shop", syntax="proto3")
    fdp.message_type.add(name="Unused").field.add(name="x", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    msg = fdp.message_type.add(name="Shipment")
    state = msg.enum_type.add(name="State")
    state.value.add(name="NEW", number=0)
    state.value.add(name="SENT", number=1)
    address = msg.nested_type.add(name="Address")
    address.field.add(name="city", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry = msg.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(name="state", number=2, type=f.TYPE_ENUM, label=f.LABEL_OPTIONAL, type_name=".shop.Shipment.State")
    msg.field.add(name="to", number=3, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".shop.Shipment.Address")
    msg.field.add(name="from", number=4, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".shop.Shipment.Address")
    msg.field.add(name="parcels", number=5, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    msg.field.add(name="tags", number=6, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED, type_name=".shop.Shipment.TagsEntry")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    shipment = GetMessageClass(pool.FindMessageTypeByName("shop.Shipment"))
    topic = make_topic(1)
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    value = ProtobufSerializer(shipment, client, {"use.deprecated.format": False})(
        shipment(id=2**40, state=1, to={"city": "Lyon"}, parcels=[b"\x01", b"\xff"], tags={"fragile": 3}),
        SerializationContext(topic, MessageField.VALUE))
    assert RegistryDecoder("protobuf", registry.url)(value) == {
        "id": 2**40, "state": "SENT", "to": {"city": "Lyon"}, "from": None, "parcels": ["\\x01", "\\xff"],
        "tags": {"fragile": 3}}


def test_an_avro_schema_that_references_another_subject_decodes_with_the_referenced_types(registry: RegistryServer,
                                                                                           unique) -> None:
    """``shop.Money`` registered under a subject of its own; ``shop.Payment`` references it and uses it twice (the
    second use by name alone): both amounts come out as exact decimal text."""
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from confluent_kafka.schema_registry.common.avro import parse_schema_with_repo
    from fastavro import schemaless_writer

    from eosink.worker.engine.registry_converters import RegistryDecoder

    money = {"type": "record", "name": "Money", "namespace": "shop", "fields": [
        {"name": "units", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "currency", "type": "string"}]}
    payment = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": "shop.Money"}, {"name": "fee", "type": "shop.Money"}]}
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    money_subject = f"{unique}-money"
    client.register_schema(money_subject, Schema(json.dumps(money), "AVRO"))
    version = client.get_latest_version(money_subject).version
    payment_id = client.register_schema(f"{unique}-value", Schema(
        json.dumps(payment), "AVRO", [SchemaReference("shop.Money", money_subject, version)]))
    writer = parse_schema_with_repo(json.dumps(payment), {"shop.Money": money})
    buf = io.BytesIO()
    schemaless_writer(buf, writer, {"id": 7, "amount": {"units": decimal.Decimal("12.34"), "currency": "EUR"},
                                    "fee": {"units": decimal.Decimal("0.05"), "currency": "EUR"}})
    decode = RegistryDecoder("avro", registry.url)
    value = decode(b"\x00" + payment_id.to_bytes(4, "big") + buf.getvalue())
    assert value == {"id": 7, "amount": {"units": "12.34", "currency": "EUR"}, "fee": {"units": "0.05", "currency": "EUR"}}
    assert json.loads(json.dumps(value)) == value, "a decoded value JSON cannot hold"


def test_protobuf_import_unreachable_is_retryable_not_a_bad_record(registry: RegistryServer, make_topic, unique) -> None:
    """A Protobuf schema importing another registered file: while the registry fails the import's requests (a
    front answering 503 for them), decoding is a retryable error naming the registry, never a record error
    that would dead-letter the value; once they go through, the same decoder decodes it."""
    import threading
    import urllib.parse

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    from eosink.connectors.api.errors import RetryableError
    from eosink.worker.engine.registry_converters import RegistryDecoder

    f = descriptor_pb2.FieldDescriptorProto
    money_file = f"{unique}/money.proto"
    money = descriptor_pb2.FileDescriptorProto(name=money_file, package="shop", syntax="proto3")
    m = money.message_type.add(name="Money")
    m.field.add(name="units", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    m.field.add(name="currency", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    payment = descriptor_pb2.FileDescriptorProto(name=f"{unique}/payment.proto", package="shop", syntax="proto3",
                                                 dependency=[money_file])
    p = payment.message_type.add(name="Payment")
    p.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    p.field.add(name="amount", number=2, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".shop.Money")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(money)
    pool.Add(payment)
    cls = GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    value = ProtobufSerializer(cls, client, {"use.deprecated.format": False})(
        cls(id=7, amount={"units": 1234, "currency": "EUR"}), SerializationContext(make_topic(1), MessageField.VALUE))

    blocked = threading.Event()
    blocked.set()

    def unavailable(request: Any) -> tuple[int, bytes] | None:
        if blocked.is_set() and "money.proto" in urllib.parse.unquote(request.path):
            return 503, b'{"error_code": 50301, "message": "unavailable"}'
        return None

    with front_of(registry, unavailable) as front:
        decode = RegistryDecoder("protobuf", front)
        with pytest.raises(RetryableError, match=f"schema registry at {front} failed to hand out a schema referenced"):
            decode(value)
        blocked.clear()
        assert decode(value) == {"id": 7, "amount": {"units": 1234, "currency": "EUR"}}


def test_protobuf_timestamps_read_as_iso_text_and_type_timestamptz_columns(registry: RegistryServer, make_topic) -> None:
    """``google.protobuf.Timestamp`` set, unset and repeated: ISO 8601 text to the microsecond (as Connect's
    ProtobufConverter makes it a Timestamp, not a struct), and a ``timestamptz`` column in PostgreSQL and Iceberg;
    a table made while it was a message (jsonb, string) still takes it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass
    from pyiceberg.types import StringType, TimestamptzType

    from eosink.connectors.iceberg import schema_types as ist
    from eosink.connectors.postgres import schema_types as pst
    from eosink.worker.engine.registry_converters import RegistryDecoder

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/event.proto", package="shop", syntax="proto3",
                                             dependency=["google/protobuf/timestamp.proto"])
    msg = fdp.message_type.add(name="Event")
    msg.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    for n, name in ((2, "at"), (3, "due")):
        msg.field.add(name=name, number=n, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL, type_name=".google.protobuf.Timestamp")
    msg.field.add(name="seen", number=4, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED, type_name=".google.protobuf.Timestamp")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    event = GetMessageClass(pool.FindMessageTypeByName("shop.Event"))
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    value = ProtobufSerializer(event, client, {"use.deprecated.format": False})(
        event(id=1, at={"seconds": 1_767_323_045, "nanos": 678_901_234}, seen=[{"seconds": 0}, {"seconds": -1, "nanos": 5000}]),
        SerializationContext(make_topic(1), MessageField.VALUE))
    decode = RegistryDecoder("protobuf", registry.url)
    assert decode(value) == {"id": 1, "at": "2026-01-02T03:04:05.678901+00:00", "due": None,
                             "seen": ["1970-01-01T00:00:00+00:00", "1969-12-31T23:59:59.000005+00:00"]}
    assert decode.schema is not None
    columns = pst.columns_of(decode.schema)
    assert columns is not None and (columns["at"].sqltype, columns["at"].nullable) == ("timestamptz", True)
    assert columns["seen"].sqltype == "jsonb"
    fields = ist.fields_of(decode.schema)
    assert fields is not None and fields["at"].type == TimestamptzType() and fields["due"].nullable
    assert ist.takes(StringType(), fields["at"].type), "a string column of a table made while it was a message"
    assert "jsonb" in pst.ACCEPTS["timestamptz"]
