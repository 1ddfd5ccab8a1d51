"""PostgreSQL tables typed from the registered schema, against the stack's real Schema Registry and PostgreSQL.

``auto.create`` makes each Avro field's column as Confluent's JDBC sink does (a decimal a numeric, a
timestamp a timestamptz, bytes a bytea, a non-nullable field NOT NULL) and the values land exactly;
``auto.evolve`` adds the column of a new optional field exactly once while two workers deliver; a
change the table cannot take stops the task naming the subject, both versions and the field.
"""

from __future__ import annotations

import datetime
import decimal
import json
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import RegistryServer
from tests.test_schema_registry import connector

AT = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
AT_MICROS = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
ID = uuid.UUID("8f0c6a5e-3b1d-4c2a-9e7f-0123456789ab")
ALL_TYPES = {"type": "record", "name": "Everything", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "ratio", "type": "float"},
    {"name": "score", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "name", "type": "string"},
    {"name": "blob", "type": "bytes"},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 8}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "clock_micros", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
#: Column, type as PostgreSQL prints it, and whether it may be null.
ALL_COLUMNS = [
    ("id", "bigint", False), ("qty", "integer", False), ("ratio", "real", False), ("score", "double precision", False),
    ("ok", "boolean", False), ("name", "text", False), ("blob", "bytea", False), ("digest", "bytea", False),
    ("amount", "numeric(20,8)", False), ("at", "timestamp with time zone", False),
    ("at_micros", "timestamp with time zone", False), ("day", "date", False), ("clock", "time without time zone", False),
    ("clock_micros", "time without time zone", False), ("ref", "uuid", False), ("address", "jsonb", False),
    ("tags", "jsonb", False), ("attrs", "jsonb", False), ("state", "text", False), ("note", "text", True),
    ("__topic", "text", True), ("__partition", "integer", True), ("__offset", "bigint", True),
]
ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}}]}
#: v1 plus an optional decimal (JSON inference would make it text) and an optional field always null.
ORDER_V2 = {**ORDER_V1, "fields": [
    *ORDER_V1["fields"],
    {"name": "discount", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 3}],
     "default": None},
    {"name": "coupon", "type": ["null", "string"], "default": None}]}


def everything(i: int) -> dict[str, Any]:
    return {"id": i, "qty": -i, "ratio": 0.5, "score": 1 / 3, "ok": i % 2 == 0, "name": f"n{i}",
            "blob": bytes([i % 256, 0, 255]), "digest": b"\x00\x01\xfe\xff",
            "amount": decimal.Decimal("123456789012.12345678") + i, "at": AT, "at_micros": AT_MICROS,
            "day": datetime.date(2026, 2, 28), "clock": datetime.time(23, 59, 58, 123000),
            "clock_micros": datetime.time(1, 2, 3, 456789), "ref": ID, "address": {"city": "Lyon"}, "tags": ["a", "b"],
            "attrs": {"k": 2**40}, "state": "PAID", "note": None if i % 2 else "even"}


def avro(url: str, topic: str, schema: dict[str, Any]) -> Any:
    """``value -> bytes`` by confluent-kafka's AvroSerializer, which registers ``schema`` under ``<topic>-value``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = AvroSerializer(SchemaRegistryClient({"url": url, "timeout": 30}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda value: ser(value, ctx)


def columns(pg, table: str) -> list[tuple[str, str, bool]]:
    return [(name, sqltype, not notnull) for name, sqltype, notnull in pg.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (f'"{table}"',))]


def deliver_all(stack, registry: RegistryServer, unique: str, topic: str, fmt: str, count: int, pg, tmp_path) -> None:
    """One worker delivers the topic's ``count`` records into table ``unique``; each id must be there once."""
    from tests.restkit import pg_ids

    deliver(stack, unique, connector(fmt, registry.url, topic, unique), lambda: pg_ids(pg, unique), count, tmp_path)


def deliver(stack, unique: str, config: dict[str, str], delivered: Callable[[], list[int]], count: int, tmp_path) -> None:
    """One worker delivers ``count`` records through connector ``config``; ``delivered()`` (the ids in the
    sink) must then hold each id once."""
    from tests.procs import WorkerProcess, register, wait_until

    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), config)
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(delivered()) >= count, 120, f"{count} rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert sorted(delivered()) == list(range(count)), "not every record exactly once"


def prepared(pg, connector_name: str) -> list[str]:
    return [r[0] for r in pg.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector_name}.%",))]


def test_avro_decimal_timestamp_bytes_and_every_field_type_create_typed_columns_and_land_exactly(
        registry: RegistryServer, stack, make_topic, unique, pg, tmp_path) -> None:
    from tests.restkit import produce

    topic = make_topic(2)
    encode = avro(registry.url, topic, ALL_TYPES)
    produce(stack.kafka_bootstrap, topic, [(i % 2, encode(everything(i))) for i in range(50)])
    deliver_all(stack, registry, unique, topic, "avro", 50, pg, tmp_path)
    assert columns(pg, unique) == ALL_COLUMNS
    names = ", ".join(f'"{c}"' for c, _, _ in ALL_COLUMNS[:20])
    row = pg.execute(f'SELECT {names} FROM "{unique}" WHERE id = 8').fetchone()
    want = everything(8)
    want["ratio"], want["score"] = 0.5, 1 / 3
    assert dict(zip([c for c, _, _ in ALL_COLUMNS[:20]], row)) == want


def test_a_new_optional_avro_field_adds_its_column_exactly_once_with_two_workers_delivering(
        registry: RegistryServer, stack, make_topic, unique, pg, tmp_path) -> None:
    from tests.procs import register, wait_until
    from tests.restkit import pg_ids, produce, start_worker, wait_tasks_on

    topic = make_topic(4)
    name = unique.replace("_", "-")
    v1, v2 = avro(registry.url, topic, ORDER_V1), avro(registry.url, topic, ORDER_V2)
    amount = decimal.Decimal("12345678.91")

    def committed_by(worker: str) -> int:
        return pg.execute("SELECT count(*) FROM eosink_committed_txns WHERE txn_id LIKE %s",
                          (f"{name}.{worker}.%",)).fetchone()[0]

    # Both workers are members before the connector exists, so its partitions are split between them from the start.
    workers = [start_worker(stack, unique, f"w{n}", tmp_path) for n in (1, 2)]
    register(stack.zookeeper_hosts, unique, name, connector("avro", registry.url, topic, unique, **{"tasks.max": "2"}))
    try:
        wait_tasks_on(workers[0].url, name, {"w1", "w2"})
        for start in range(0, 2000, 200):  # ten transactions; the producer switches to v2 half way, mid-delivery
            if start == 1000:
                wait_until(lambda: committed_by("w1") and committed_by("w2"), 90, "both workers delivering v1")
            produce(stack.kafka_bootstrap, topic, [
                (i % 4, v1({"id": i, "amount": amount}) if start < 1000 else
                 v2({"id": i, "amount": amount, "discount": decimal.Decimal(i) / 1000, "coupon": None}))
                for i in range(start, start + 200)])
        wait_until(lambda: len(pg_ids(pg, unique)) >= 2000, 120, "2000 rows")
        wait_until(lambda: not prepared(pg, name), 30, "no prepared transaction left")
    finally:
        for w in workers:
            assert w.stop() == 0, w.log_text()[-3000:]
    ids = pg_ids(pg, unique)
    assert sorted(ids) == list(range(2000)), "not every record exactly once"
    assert not prepared(pg, name)
    assert columns(pg, unique) == [("id", "bigint", False), ("amount", "numeric(10,2)", False),
                                   ("__topic", "text", True), ("__partition", "integer", True),
                                   ("__offset", "bigint", True), ("discount", "numeric(8,3)", True),
                                   ("coupon", "text", True)]
    wrong = pg.execute(f'SELECT count(*) FROM "{unique}" WHERE amount <> %s OR coupon IS NOT NULL OR '
                       "discount IS DISTINCT FROM (CASE WHEN id < 1000 THEN NULL ELSE id / 1000.0 END)",
                       (amount,)).fetchone()[0]
    assert wrong == 0, "a value did not land exactly"
    v2_by = dict(pg.execute(f"""SELECT split_part(o.txn_id, '.', 2), count(*) FROM "{unique}" t JOIN eosink_offsets o
                                ON o.connector = %s AND o.partition = t.__partition WHERE t.id >= 1000 GROUP BY 1""",
                            (name,)).fetchall())
    assert set(v2_by) == {"w1", "w2"}, f"both workers held partitions with v2 records to the end: {v2_by}"


def _compatibility_none(url: str, subject: str) -> None:
    """This subject takes any new version: the registry's BACKWARD would refuse the change under test."""
    req = urllib.request.Request(f"{url}/config/{subject}", data=json.dumps({"compatibility": "NONE"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="PUT")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def incompatible_versions(url: str, topic: str, change: str) -> tuple[bytes, bytes, list[int]]:
    """A record of ORDER_V1 and one of a version the table of v1 cannot take (``change``: ``type``, ``required``
    or ``removed``), each registering its version under ``<topic>-value``; and their schema ids."""
    first = avro(url, topic, ORDER_V1)({"id": 1, "amount": decimal.Decimal("1.50")})  # registers version 1
    _compatibility_none(url, f"{topic}-value")
    if change == "type":
        schema = {**ORDER_V1, "fields": [ORDER_V1["fields"][0], {"name": "amount", "type": "string"}]}
        second = avro(url, topic, schema)({"id": 2, "amount": "a lot"})
    elif change == "required":
        schema = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "region", "type": "string"}]}
        second = avro(url, topic, schema)({"id": 2, "amount": decimal.Decimal("2.50"), "region": "eu"})
    else:
        schema = {**ORDER_V1, "fields": ORDER_V1["fields"][:1]}
        second = avro(url, topic, schema)({"id": 2})
    return first, second, [int.from_bytes(v[1:5], "big") for v in (first, second)]


def trace_of_failure(stack, unique: str, topic: str, config: dict[str, str], first: bytes, second: bytes,
                     delivered: Callable[[], list[int]], tmp_path) -> str:
    """One worker delivers ``first``, then meets ``second``: the failed task's trace."""
    from tests.procs import wait_until
    from tests.restkit import call, produce, start_worker

    produce(stack.kafka_bootstrap, topic, [(0, first)])
    w = start_worker(stack, unique, "w1", tmp_path)
    status = f"/connectors/{unique}/status"
    try:
        call(w.url, "POST", "/connectors", {"name": unique, "config": config})
        wait_until(lambda: delivered() == [1], 90, "the v1 record")
        produce(stack.kafka_bootstrap, topic, [(0, second)])
        wait_until(lambda: call(w.url, "GET", status)[1]["connector"]["state"] == "FAILED", 90, "the task to fail")
        return str(call(w.url, "GET", status)[1]["tasks"][0]["trace"])
    finally:
        w.stop()


@pytest.mark.parametrize("change, field", [
    ("type", "amount"),  # amount: decimal -> string, which its numeric column cannot take
    ("required", "region"),  # a new field neither nullable nor with a default
    ("removed", "amount"),  # a field dropped whose column is NOT NULL without a default
])
def test_an_incompatible_avro_change_fails_the_task_naming_subject_versions_and_field(
        registry: RegistryServer, stack, make_topic, unique, pg, tmp_path, change: str, field: str) -> None:
    from tests.restkit import pg_ids

    topic = make_topic(1)
    subject = f"{topic}-value"
    first, second, ids = incompatible_versions(registry.url, topic, change)
    config = connector("avro", registry.url, topic, unique, **{"connection.url": stack.postgres_dsn})
    trace = trace_of_failure(stack, unique, topic, config, first, second, lambda: pg_ids(pg, unique), tmp_path)
    for words in (f"subject '{subject}' version 2 (schema id {ids[1]})", f"version 1 (schema id {ids[0]})",
                  f"'{field}'", "FatalError"):
        assert words in trace, (words, trace)
    assert pg_ids(pg, unique) == [1], "nothing of the incompatible version is written"
    assert not prepared(pg, unique.replace("_", "-"))


def test_json_schema_date_time_uuid_and_required_fields_create_timestamptz_uuid_and_not_null_columns(
        registry: RegistryServer, stack, make_topic, unique, pg, tmp_path) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.restkit import produce

    topic = make_topic(1)
    schema = {"type": "object", "required": ["id", "at"], "properties": {
        "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
        "ref": {"type": ["string", "null"], "format": "uuid"}, "score": {"type": "number"}, "doc": {"type": "object"}}}
    js = JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": registry.url, "timeout": 30}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce(stack.kafka_bootstrap, topic, [(0, js({"id": i, "at": AT_MICROS.isoformat(), "ref": str(ID), "score": 0.25,
                                                   "doc": {"k": [i]}}, ctx)) for i in range(20)])
    deliver_all(stack, registry, unique, topic, "jsonschema", 20, pg, tmp_path)
    assert columns(pg, unique)[:5] == [("id", "bigint", False), ("at", "timestamp with time zone", False),
                                       ("ref", "uuid", True), ("score", "double precision", True), ("doc", "jsonb", True)]
    assert pg.execute(f'SELECT at, ref, score, doc FROM "{unique}" WHERE id = 3').fetchone() == (AT_MICROS, ID, 0.25, {"k": [3]})


def test_protobuf_scalar_fields_create_typed_not_null_columns(registry: RegistryServer, stack, make_topic, unique, pg,
                                                              tmp_path) -> None:
    from tests.restkit import produce
    from tests.test_schema_registry import serializer

    topic = make_topic(1)
    encode = serializer("protobuf", registry.url, topic)  # shop.Order: int64 id, string name, double amount, bytes blob
    produce(stack.kafka_bootstrap, topic, [(0, encode(i)) for i in range(20)])
    deliver_all(stack, registry, unique, topic, "protobuf", 20, pg, tmp_path)
    assert columns(pg, unique)[:4] == [("id", "bigint", False), ("name", "text", False),
                                       ("amount", "double precision", False), ("blob", "bytea", False)]
    assert pg.execute(f'SELECT id, name, amount, blob FROM "{unique}" WHERE id = 7').fetchone() == (7, "n7", 7.5,
                                                                                                bytes([7, 0, 255]))
