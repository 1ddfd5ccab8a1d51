"""Iceberg tables typed from the registered schema, against the stack's real Schema Registry, PostgreSQL (the
SQL catalog), MinIO (the warehouse) and real worker processes.

``auto.create`` makes each Avro field's Iceberg column (a decimal a decimal(p,s), a timestamp a timestamptz, a
nested record a struct, a non-nullable field required) and the values land exactly; ``auto.evolve`` adds the
column of a new optional field exactly once while two workers deliver; a change the table cannot take stops the
task naming the subject, both versions and the field.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import RegistryServer
from tests.test_postgres_typed_schema import (
    ALL_TYPES,
    ORDER_V1,
    ORDER_V2,
    avro,
    deliver,
    everything,
    incompatible_versions,
    trace_of_failure,
)
from tests.test_schema_registry import CLASSES

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import Catalog, load_catalog  # noqa: E402

from eosink.connectors.iceberg.sink import SUMMARY_TXN  # noqa: E402
from tests.test_iceberg_sink import BUCKET, CATALOG, sql_uri  # noqa: E402

#: Column, Iceberg type as pyiceberg prints it, required: what ALL_TYPES must become.
ALL_ICEBERG = [
    ("id", "long", True), ("qty", "int", True), ("ratio", "float", True), ("score", "double", True),
    ("ok", "boolean", True), ("name", "string", True), ("blob", "binary", True), ("digest", "fixed[4]", True),
    ("amount", "decimal(20, 8)", True), ("at", "timestamptz", True), ("at_micros", "timestamptz", True),
    ("day", "date", True), ("clock", "time", True), ("clock_micros", "time", True), ("ref", "uuid", True),
    ("address", "struct<city: string>", True), ("tags", "list<string>", True), ("attrs", "map<string, long>", True),
    ("state", "string", True), ("note", "string", False),
    ("__topic", "string", True), ("__partition", "int", True), ("__offset", "long", True),
]


def iceberg_connector(stack, url: str, topic: str, table: str, **extra: str) -> dict[str, str]:
    """An Iceberg connector reading Avro: SQL catalog in the stack's PostgreSQL, warehouse on its MinIO."""
    return {"connector.class": "iceberg", "topics": topic, "value.converter": CLASSES["avro"],
            "value.converter.schema.registry.url": url, "iceberg.catalog.uri": sql_uri(stack.postgres_dsn),
            "iceberg.catalog.name": CATALOG, "iceberg.table": f"eosink_typed.{table}",
            "iceberg.warehouse": f"s3://{BUCKET}/{table}", "s3.endpoint": stack.s3["endpoint_url"],
            "s3.access-key-id": stack.s3["aws_access_key_id"], "s3.secret-access-key": stack.s3["aws_secret_access_key"],
            "s3.region": stack.s3["region_name"], "commit.interval.ms": "500", **extra}


@pytest.fixture
def catalog(stack, unique) -> Iterator[Catalog]:
    """A reader of the connector's catalog (not the sink's), and the test's table dropped after it."""
    import boto3

    client = boto3.client("s3", **stack.s3)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    cat = load_catalog(CATALOG, type="sql", uri=sql_uri(stack.postgres_dsn), warehouse=f"s3://{BUCKET}/{unique}",
                       **{"s3.endpoint": stack.s3["endpoint_url"], "s3.access-key-id": stack.s3["aws_access_key_id"],
                          "s3.secret-access-key": stack.s3["aws_secret_access_key"], "s3.region": stack.s3["region_name"]})
    yield cat
    try:
        cat.drop_table(f"eosink_typed.{unique}")
    except Exception:  # noqa: BLE001 - the test may never have created it
        pass


def rows(cat: Catalog, table: str) -> list[dict[str, Any]]:
    return cat.load_table(f"eosink_typed.{table}").scan().to_arrow().to_pylist()


def ids(cat: Catalog, table: str) -> list[int]:
    try:
        t = cat.load_table(f"eosink_typed.{table}")
    except Exception:  # noqa: BLE001 - not created yet
        return []
    return sorted(t.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def columns(cat: Catalog, table: str) -> list[tuple[str, str, bool]]:
    return [(f.name, str(f.field_type).replace("required ", "").replace("optional ", "") if f.field_type.is_primitive
             else _nested(f.field_type), f.required) for f in cat.load_table(f"eosink_typed.{table}").schema().fields]


def _nested(t: Any, marked: bool = False) -> str:
    """A nested type without its field ids: ``struct<city: string>``, ``list<string>``, ``map<string, long>``;
    ``marked``: an optional struct field, list element or map value followed by ``?`` (``struct<zip?: string>``)."""
    from pyiceberg.types import ListType, MapType, StructType

    def mark(optional: bool) -> str:
        return "?" if marked and optional else ""

    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"{f.name}{mark(not f.required)}: {_nested(f.field_type, marked)}" for f in t.fields) + ">"
    if isinstance(t, ListType):
        return f"list<{_nested(t.element_type, marked)}{mark(not t.element_required)}>"
    if isinstance(t, MapType):
        return f"map<{_nested(t.key_type, marked)}, {_nested(t.value_type, marked)}{mark(not t.value_required)}>"
    return str(t)


def test_avro_decimal_and_timestamp_fields_create_decimal_and_timestamptz_iceberg_columns_with_exact_values(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:
    from tests.restkit import produce

    topic = make_topic(2)
    encode = avro(registry.url, topic, ALL_TYPES)
    produce(stack.kafka_bootstrap, topic, [(i % 2, encode(everything(i))) for i in range(50)])
    deliver(stack, unique, iceberg_connector(stack, registry.url, topic, unique), lambda: ids(catalog, unique), 50, tmp_path)
    assert columns(catalog, unique) == ALL_ICEBERG
    got = next(r for r in rows(catalog, unique) if r["id"] == 8)
    want = everything(8)
    want["attrs"] = list(want["attrs"].items())  # an Arrow map reads back as (key, value) pairs
    assert {k: got[k] for k in want} == want
    assert isinstance(got["amount"], decimal.Decimal) and got["amount"] == decimal.Decimal("123456789020.12345678")
    assert got["at"] == datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)


def test_protobuf_scalar_fields_create_required_typed_iceberg_columns_with_exact_values(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:
    from tests.restkit import produce
    from tests.test_schema_registry import serializer

    topic = make_topic(1)
    encode = serializer("protobuf", registry.url, topic)  # shop.Order: int64 id, string name, double amount, bytes blob
    produce(stack.kafka_bootstrap, topic, [(0, encode(i)) for i in range(20)])
    config = {**iceberg_connector(stack, registry.url, topic, unique), "value.converter": CLASSES["protobuf"]}
    deliver(stack, unique, config, lambda: ids(catalog, unique), 20, tmp_path)
    assert columns(catalog, unique)[:4] == [("id", "long", True), ("name", "string", True), ("amount", "double", True),
                                            ("blob", "binary", True)]
    got = next(r for r in rows(catalog, unique) if r["id"] == 7)
    assert (got["name"], got["amount"], got["blob"]) == ("n7", 7.5, bytes([7, 0, 255]))


def test_a_new_optional_avro_field_adds_its_iceberg_column_exactly_once_with_two_workers_delivering(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:
    from tests.procs import register, wait_until
    from tests.restkit import produce, start_worker, wait_tasks_on

    topic = make_topic(4)
    name = unique.replace("_", "-")
    v1, v2 = avro(registry.url, topic, ORDER_V1), avro(registry.url, topic, ORDER_V2)
    amount = decimal.Decimal("12345678.91")
    # Both workers are members before the connector exists, so its partitions are split between them from the start.
    workers = [start_worker(stack, unique, f"w{n}", tmp_path) for n in (1, 2)]
    register(stack.zookeeper_hosts, unique, name, iceberg_connector(stack, registry.url, topic, unique, **{"tasks.max": "2"}))
    try:
        wait_tasks_on(workers[0].url, name, {"w1", "w2"})
        produce(stack.kafka_bootstrap, topic, [(i % 4, v1({"id": i, "amount": amount})) for i in range(400)])
        wait_until(lambda: len(ids(catalog, unique)) >= 400, 120, "the v1 rows")
        # v2 on every partition at once: both workers meet the new version in the same moments.
        produce(stack.kafka_bootstrap, topic, [
            (i % 4, v2({"id": i, "amount": amount, "discount": decimal.Decimal(i) / 1000, "coupon": None}))
            for i in range(400, 800)])
        wait_until(lambda: len(ids(catalog, unique)) >= 800, 120, "800 rows")
    finally:
        for w in workers:
            assert w.stop() == 0, w.log_text()[-3000:]
    assert ids(catalog, unique) == list(range(800)), "not every record exactly once"
    assert columns(catalog, unique) == [("id", "long", True), ("amount", "decimal(10, 2)", True), ("__topic", "string", True),
                                        ("__partition", "int", True), ("__offset", "long", True),
                                        ("discount", "decimal(8, 3)", False), ("coupon", "string", False)]
    table = catalog.load_table(f"eosink_typed.{unique}")
    assert len(table.schemas()) == 2, "the columns were added in one schema change, once"
    for r in rows(catalog, unique):
        assert r["amount"] == amount and r["coupon"] is None, r
        assert r["discount"] == (None if r["id"] < 400 else decimal.Decimal(r["id"]) / 1000), r
    evolved = table.schema().schema_id
    by = {s.summary[SUMMARY_TXN].split(".")[1] for s in table.snapshots() if s.schema_id == evolved and s.summary}
    assert by == {"w1", "w2"}, f"both workers committed v2 rows into the evolved table: {by}"


@pytest.mark.parametrize("change, field", [
    ("type", "amount"),  # amount: decimal -> string, which Iceberg cannot promote a decimal column to
    ("required", "region"),  # a new field neither nullable nor with a default
    ("removed", "amount"),  # a field dropped whose column is required
])
def test_an_incompatible_avro_change_fails_the_iceberg_task_naming_subject_versions_and_field(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path, change: str, field: str) -> None:
    topic = make_topic(1)
    subject = f"{topic}-value"
    first, second, schema_ids = incompatible_versions(registry.url, topic, change)
    trace = trace_of_failure(stack, unique, topic, iceberg_connector(stack, registry.url, topic, unique), first, second,
                             lambda: ids(catalog, unique), tmp_path)
    for words in (f"subject '{subject}' version 2 (schema id {schema_ids[1]})", f"version 1 (schema id {schema_ids[0]})",
                  f"'{field}'", "FatalError", f"eosink_typed.{unique}"):
        assert words in trace, (words, trace)
    assert ids(catalog, unique) == [1], "nothing of the incompatible version is written"
    assert len(catalog.load_table(f"eosink_typed.{unique}").schemas()) == 1, "the table is unchanged"


def test_json_schema_fields_map_to_iceberg_types_and_a_text_that_is_no_decimal_is_a_record_error() -> None:
    """Pure functions: the JSON Schema mapping, and a text that is no decimal named as a bad record, not a crash."""
    import json

    from eosink.connectors.api.errors import RecordError
    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.iceberg import arrow as ia
    from eosink.connectors.iceberg import schema_types as ist

    doc = {"type": "object", "required": ["id", "at"], "properties": {
        "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
        "ref": {"type": ["string", "null"], "format": "uuid"}, "score": {"type": "number"}, "doc": {"type": "object"}}}
    fields = ist.fields_of(WriterSchema(3, "jsonschema", json.dumps(doc)))
    assert fields is not None
    assert {n: (str(f.type), f.nullable) for n, f in fields.items()} == {
        "id": ("long", False), "at": ("timestamptz", False), "ref": ("uuid", True), "score": ("double", True),
        "doc": ("string", True)}
    order = ist.fields_of(WriterSchema(4, "avro", json.dumps(ORDER_V1)))
    assert order is not None
    schema = ist.table_schema(order.values(), ia.KAFKA_FIELDS)
    recs = [SinkRecord("t", 0, n, None, {"id": n, "amount": a}, None) for n, a in enumerate(["1.50", "1.5x"])]
    with pytest.raises(RecordError) as err:
        ia.to_arrow(schema, recs, [r.value for r in recs], True, typed=True)
    assert "t[0]@1" in str(err.value) and "'amount'" in str(err.value) and "'1.5x'" in str(err.value), str(err.value)
    table = ia.to_arrow(schema, recs[:1], [recs[0].value], True, typed=True)
    assert table.column("amount").to_pylist() == [decimal.Decimal("1.50")]
