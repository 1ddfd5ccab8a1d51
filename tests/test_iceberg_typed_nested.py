"""Nested JSON Schema and Protobuf values as Iceberg structs, lists and maps, against the stack's real Schema
Registry, PostgreSQL (the SQL catalog), MinIO (the warehouse) and a real worker.

A JSON Schema object with properties becomes a struct, an array with items a list, an object of only
``additionalProperties`` a map; a Protobuf message a struct, a repeated field a list, a map field a map, a
well-known type the struct of its fields. The values read back equal the producer's (dates, timestamps,
uuids, bytes and unsigned 64-bit integers inside them too); a recursive type stays its JSON text; a version
adding an optional nested field adds it to the struct; an incompatible nested change stops the task naming
the subject, both versions and the field's path.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import RegistryServer
from tests.test_schema_registry import CLASSES

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import Catalog  # noqa: E402

from tests.test_iceberg_typed_schema import _nested, catalog, iceberg_connector, ids, rows  # noqa: E402, F401 - catalog: the fixture

SINCE = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
REF = uuid.UUID("8f0c6a5e-3b1d-4c2a-9e7f-0123456789ab")
TREE = {"name": "root", "kids": [{"name": "leaf", "kids": []}]}
#: An order: a struct (one field optional), a list of structs with typed scalars, a map, a recursive tree.
ORDER_JSON: dict[str, Any] = {
    "type": "object", "required": ["id", "address", "lines"],
    "definitions": {"Node": {"type": "object", "properties": {
        "name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/Node"}}}}},
    "properties": {
        "id": {"type": "integer"},
        # Closed (no additional properties): a version adding an optional property is then BACKWARD compatible.
        "address": {"type": "object", "required": ["city"], "additionalProperties": False, "properties": {
            "city": {"type": "string"}, "since": {"type": "string", "format": "date-time"}}},
        "lines": {"type": "array", "items": {"type": "object", "required": ["sku", "price"], "additionalProperties": False,
                                             "properties": {
            "sku": {"type": "string"}, "price": {"type": "number"}, "day": {"type": "string", "format": "date"},
            "ref": {"type": "string", "format": "uuid"}}}},
        "attrs": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
        "tree": {"$ref": "#/definitions/Node"}}}
#: Column, type (a nested field followed by ? is optional), required.
ORDER_JSON_COLUMNS = [
    ("id", "long", True), ("address", "struct<city: string, since?: timestamptz>", True),
    ("lines", "list<struct<sku: string, price: double, day?: date, ref?: uuid>>", True),
    ("attrs", "map<string, long?>", False), ("tree", "string", False),
    ("__topic", "string", True), ("__partition", "int", True), ("__offset", "long", True),
]


def order_json(i: int) -> dict[str, Any]:
    """Order ``i`` as the producer writes it (JSON: timestamps, dates and uuids as text)."""
    address: dict[str, Any] = {"city": "Lyon"} if i % 2 else {"city": "Lyon", "since": SINCE.isoformat()}
    return {"id": i, "address": address, "lines": [{"sku": "a", "price": 1.25 + i, "day": "2026-02-28", "ref": str(REF)}],
            "attrs": {"k": 2**40 + i, "none": None}, "tree": TREE}


def order_json_read(i: int) -> dict[str, Any]:
    """Order ``i`` as it reads back from the table: typed values, a map as (key, value) pairs, the tree as text."""
    return {"id": i, "address": {"city": "Lyon", "since": None if i % 2 else SINCE},
            "lines": [{"sku": "a", "price": 1.25 + i, "day": datetime.date(2026, 2, 28), "ref": REF}],
            "attrs": [("k", 2**40 + i), ("none", None)], "tree": TREE}


def json_serializer(url: str, topic: str, schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    """``value -> bytes`` by confluent-kafka's JSONSerializer, which registers ``schema`` under ``<topic>-value``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": url, "timeout": 30}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda value: ser(value, ctx)


def basket_class(email: bool = False) -> Any:
    """``shop.Basket``: a message field (Customer; ``email``: with one more field), a repeated message with
    int32, bytes and uint64 fields, map<string, int64>, map<int32, string>, a google.protobuf.Timestamp, and a
    recursive Node; built from a descriptor as protoc would."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass

    fdp = descriptor_pb2.FileDescriptorProto(name="shop/basket.proto", package="shop", syntax="proto3",
                                             dependency=["google/protobuf/timestamp.proto"])
    msg = fdp.message_type.add(name="Basket")
    customer = msg.nested_type.add(name="Customer")
    customer.field.add(name="name", number=1, type=9, label=1)
    customer.field.add(name="vip", number=2, type=8, label=1)
    if email:
        customer.field.add(name="email", number=3, type=9, label=1)
    line = msg.nested_type.add(name="Line")
    for number, (name, kind) in enumerate([("sku", 9), ("qty", 5), ("blob", 12), ("units", 4)], 1):
        line.field.add(name=name, number=number, type=kind, label=1)
    for entry_name, key_kind, value_kind in (("AttrsEntry", 9, 3), ("SlotsEntry", 5, 9)):
        entry = msg.nested_type.add(name=entry_name, options=descriptor_pb2.MessageOptions(map_entry=True))
        entry.field.add(name="key", number=1, type=key_kind, label=1)
        entry.field.add(name="value", number=2, type=value_kind, label=1)
    node = msg.nested_type.add(name="Node")
    node.field.add(name="name", number=1, type=9, label=1)
    node.field.add(name="kids", number=2, type=11, label=3, type_name=".shop.Basket.Node")
    for number, (name, kind, label, type_name) in enumerate([
            ("id", 3, 1, ""), ("customer", 11, 1, ".shop.Basket.Customer"), ("lines", 11, 3, ".shop.Basket.Line"),
            ("attrs", 11, 3, ".shop.Basket.AttrsEntry"), ("slots", 11, 3, ".shop.Basket.SlotsEntry"),
            ("at", 11, 1, ".google.protobuf.Timestamp"), ("tree", 11, 1, ".shop.Basket.Node")], 1):
        msg.field.add(name=name, number=number, type=kind, label=label, **({"type_name": type_name} if type_name else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName("shop.Basket"))


BASKET_COLUMNS = [
    ("id", "long", True), ("customer", "struct<name: string, vip: boolean>", False),
    ("lines", "list<struct<sku: string, qty: int, blob: binary, units: decimal(20, 0)>>", True),
    ("attrs", "map<string, long>", True), ("slots", "map<int, string>", True),
    ("at", "timestamptz", False), ("tree", "string", False),
    ("__topic", "string", True), ("__partition", "int", True), ("__offset", "long", True),
]
AT_SECONDS, AT_NANOS = 1767323045, 678901000


def basket(i: int) -> dict[str, Any]:
    """Basket ``i`` as the message's fields (every third without a customer)."""
    value: dict[str, Any] = {"id": i, "lines": [{"sku": "a", "qty": -i, "blob": bytes([i % 256, 0, 255]), "units": 2**64 - 1 - i}],
                             "attrs": {"k": 2**40 + i}, "slots": {1: "one", 2: f"two{i}"},
                             "at": {"seconds": AT_SECONDS, "nanos": AT_NANOS}, "tree": TREE}
    if i % 3:
        value["customer"] = {"name": f"c{i}", "vip": i % 2 == 0}
    return value


def basket_read(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the basket table comparable with :func:`basket`: maps as dicts (Protobuf does not keep their
    order), the unsigned integers as ints after checking they read back as decimals, the tree parsed, the
    Timestamp as its seconds and nanos."""
    out = {k: row[k] for k in ("id", "customer", "lines", "attrs", "slots", "at", "tree")}
    if out["customer"] is None:
        del out["customer"]
    assert all(type(line["units"]) is decimal.Decimal for line in out["lines"]), out
    out["lines"] = [{**line, "units": int(line["units"])} for line in out["lines"]]
    out["attrs"], out["slots"] = dict(out["attrs"]), dict(out["slots"])
    out["tree"] = json.loads(out["tree"])
    at = out["at"]  # a timestamptz column: the Timestamp to the microsecond, back as seconds and nanos
    assert at.tzinfo is not None, at
    out["at"] = {"seconds": int(at.timestamp()), "nanos": at.microsecond * 1000}
    return out


def proto_serializer(url: str, topic: str, cls: Any) -> Callable[[dict[str, Any]], bytes]:
    """``fields -> bytes`` by confluent-kafka's ProtobufSerializer (which registers the message's schema)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = ProtobufSerializer(cls, SchemaRegistryClient({"url": url, "timeout": 30}), {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda value: ser(cls(**value), ctx)


def shapes(cat: Catalog, table: str) -> list[tuple[str, str, bool]]:
    return [(f.name, shape(f.field_type), f.required) for f in cat.load_table(f"eosink_typed.{table}").schema().fields]


def shape(t: Any) -> str:
    """A type without field ids, an optional nested field, element or value marked ``?``."""
    return _nested(t, marked=True)


def deliver_in_two(stack, unique: str, config: dict[str, str], first: list[tuple[int, bytes]],
                   second: list[tuple[int, bytes]], delivered: Callable[[], list[int]], tmp_path) -> None:
    """One worker delivers ``first``, then ``second`` (produced once the first is in the table)."""
    from tests.procs import wait_until
    from tests.restkit import call, produce, start_worker

    produce(stack.kafka_bootstrap, config["topics"], first)
    w = start_worker(stack, unique, "w1", tmp_path)
    try:
        call(w.url, "POST", "/connectors", {"name": unique, "config": config})
        wait_until(lambda: len(delivered()) >= len(first), 90, "the first records")
        produce(stack.kafka_bootstrap, config["topics"], second)
        wait_until(lambda: len(delivered()) >= len(first) + len(second), 90, "every record")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]


def test_json_schema_objects_arrays_and_maps_become_iceberg_structs_lists_and_maps_with_exact_values(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:  # noqa: F811
    from tests.restkit import produce
    from tests.test_postgres_typed_schema import deliver

    topic = make_topic(2)
    encode = json_serializer(registry.url, topic, ORDER_JSON)
    produce(stack.kafka_bootstrap, topic, [(i % 2, encode(order_json(i))) for i in range(30)])
    config = iceberg_connector(stack, registry.url, topic, unique, **{"value.converter": CLASSES["jsonschema"]})
    deliver(stack, unique, config, lambda: ids(catalog, unique), 30, tmp_path)
    assert shapes(catalog, unique) == ORDER_JSON_COLUMNS
    got = {r["id"]: r for r in rows(catalog, unique)}
    for i in (7, 8):
        want = order_json_read(i)
        assert {k: got[i][k] for k in want if k != "tree"} == {k: v for k, v in want.items() if k != "tree"}
        assert isinstance(got[i]["tree"], str) and json.loads(got[i]["tree"]) == TREE, "the recursive tree is its JSON text"


def test_protobuf_messages_repeated_and_map_fields_become_iceberg_structs_lists_and_maps_with_exact_values(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:  # noqa: F811
    from tests.restkit import produce
    from tests.test_postgres_typed_schema import deliver

    topic = make_topic(2)
    encode = proto_serializer(registry.url, topic, basket_class())
    produce(stack.kafka_bootstrap, topic, [(i % 2, encode(basket(i))) for i in range(30)])
    config = iceberg_connector(stack, registry.url, topic, unique, **{"value.converter": CLASSES["protobuf"]})
    deliver(stack, unique, config, lambda: ids(catalog, unique), 30, tmp_path)
    assert shapes(catalog, unique) == BASKET_COLUMNS
    got = {r["id"]: r for r in rows(catalog, unique)}
    for i in (6, 7, 8):  # 6: no customer, a null struct
        assert basket_read(got[i]) == basket(i)


def test_a_new_optional_nested_json_schema_field_is_added_to_its_iceberg_struct(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:  # noqa: F811
    topic = make_topic(1)
    v2_schema = json.loads(json.dumps(ORDER_JSON))
    v2_schema["properties"]["address"]["properties"]["zip"] = {"type": ["string", "null"]}
    v2_schema["properties"]["lines"]["items"]["properties"]["note"] = {"type": "string"}
    v1, v2 = json_serializer(registry.url, topic, ORDER_JSON), json_serializer(registry.url, topic, v2_schema)
    first = [(0, v1(order_json(i))) for i in range(10)]
    second = [(0, v2({**order_json(i), "address": {"city": "Nice", "zip": f"06{i:03}"},
                      "lines": [{**order_json(i)["lines"][0], "note": f"n{i}"}]})) for i in range(10, 20)]
    config = iceberg_connector(stack, registry.url, topic, unique, **{"value.converter": CLASSES["jsonschema"]})
    deliver_in_two(stack, unique, config, first, second, lambda: ids(catalog, unique), tmp_path)
    assert ids(catalog, unique) == list(range(20))
    columns = dict((n, t) for n, t, _ in shapes(catalog, unique))
    assert columns["address"] == "struct<city: string, since?: timestamptz, zip?: string>"
    assert columns["lines"] == "list<struct<sku: string, price: double, day?: date, ref?: uuid, note?: string>>"
    assert len(catalog.load_table(f"eosink_typed.{unique}").schemas()) == 2, "one schema change"
    got = {r["id"]: r for r in rows(catalog, unique)}
    assert got[3]["address"] == {"city": "Lyon", "since": None, "zip": None}
    assert got[3]["lines"][0]["note"] is None
    assert got[13]["address"] == {"city": "Nice", "since": None, "zip": "06013"}
    assert got[13]["lines"][0]["note"] == "n13"


def test_a_new_nested_protobuf_field_is_added_to_its_iceberg_struct(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:  # noqa: F811
    topic = make_topic(1)
    v1, v2 = proto_serializer(registry.url, topic, basket_class()), proto_serializer(registry.url, topic, basket_class(True))
    first = [(0, v1(basket(i))) for i in range(1, 10)]
    second = [(0, v2({**basket(i), "customer": {"name": f"c{i}", "vip": True, "email": f"c{i}@x"}})) for i in range(10, 20)]
    config = iceberg_connector(stack, registry.url, topic, unique, **{"value.converter": CLASSES["protobuf"]})
    deliver_in_two(stack, unique, config, first, second, lambda: ids(catalog, unique), tmp_path)
    assert ids(catalog, unique) == list(range(1, 20))
    columns = {n: (t, required) for n, t, required in shapes(catalog, unique)}
    # Required in v2 (a proto3 scalar always has a value) but defaulted: added optional, the v1 rows have none.
    assert columns["customer"] == ("struct<name: string, vip: boolean, email?: string>", False)
    got = {r["id"]: r for r in rows(catalog, unique)}
    assert got[4]["customer"] == {"name": "c4", "vip": True, "email": None}
    assert got[14]["customer"] == {"name": "c14", "vip": True, "email": "c14@x"}


def test_an_incompatible_nested_change_fails_the_iceberg_task_naming_subject_versions_and_field_path(
        registry: RegistryServer, stack, make_topic, unique, catalog: Catalog, tmp_path) -> None:  # noqa: F811
    from tests.test_postgres_typed_schema import _compatibility_none, trace_of_failure

    topic = make_topic(1)
    subject = f"{topic}-value"
    first = json_serializer(registry.url, topic, ORDER_JSON)(order_json(1))
    _compatibility_none(registry.url, subject)
    v2_schema = json.loads(json.dumps(ORDER_JSON))
    v2_schema["properties"]["address"]["properties"]["city"] = {"type": "integer"}
    second = json_serializer(registry.url, topic, v2_schema)({**order_json(2), "address": {"city": 75}})
    schema_ids = [int.from_bytes(v[1:5], "big") for v in (first, second)]
    config = iceberg_connector(stack, registry.url, topic, unique, **{"value.converter": CLASSES["jsonschema"]})
    trace = trace_of_failure(stack, unique, topic, config, first, second, lambda: ids(catalog, unique), tmp_path)
    for words in (f"subject '{subject}' version 2 (schema id {schema_ids[1]})", f"version 1 (schema id {schema_ids[0]})",
                  "'address.city'", "FatalError", f"eosink_typed.{unique}"):
        assert words in trace, (words, trace)
    assert ids(catalog, unique) == [1], "nothing of the incompatible version is written"


def test_nested_json_schema_and_protobuf_types_map_without_servers() -> None:
    """Pure: what has no single shape stays JSON text, an undeclared key in a struct is a bad value, not a dropped one."""
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.iceberg import schema_types as ist
    from eosink.connectors.iceberg.typed_values import convert_column

    doc = {"type": "object", "properties": {
        "union": {"type": ["object", "integer"]}, "both": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                          "additionalProperties": {"type": "string"}},
        "bare": {"type": "object"}, "items_any": {"type": "array"}, "outside": {"$ref": "other.json#/A"},
        "self": {"$ref": "#"}, "open": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
    fields = ist.fields_of(WriterSchema(5, "jsonschema", json.dumps(doc)))
    assert fields is not None
    assert {n: shape(f.type) for n, f in fields.items()} == {
        "union": "string", "both": "string", "bare": "string", "items_any": "string", "outside": "string", "self": "string",
        "open": "struct<a?: long>"}
    assert convert_column([{"a": 1}], fields["open"].type) == [{"a": 1}]
    with pytest.raises(ValueError, match="'b' is no field"):
        convert_column([{"a": 1, "b": 2}], fields["open"].type)


def test_nested_fields_evolve_inside_lists_and_maps_and_a_nested_conflict_names_its_path(tmp_path) -> None:
    """No servers (a SQLite catalog, a local warehouse): versions adding a field to a list's element struct and
    to a map's value struct, making a map value's field optional and widening a nested Avro int to long, each
    evolve the table by the field's path; a nested type change stops the task naming that path."""
    from pyiceberg.catalog import load_catalog

    from eosink.connectors.api.errors import FatalError
    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.iceberg.tables import Tables

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}"}
    tables = Tables("local", props, auto_create=True, auto_evolve=True, kafka=False, partition_fields=(), table_props={},
                    attempts=3)

    def line(extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}, **(extra or {})}}

    def doc(line_extra: dict[str, Any] | None, unit: bool, sku: str = "string") -> dict[str, Any]:
        value = {"type": "object", "required": [] if unit else ["n"],
                 "properties": {"n": {"type": "integer"}, **({"unit": {"type": "string"}} if unit else {})}}
        items = line(line_extra)
        items["properties"]["sku"] = {"type": sku}
        return {"type": "object", "required": ["id"], "properties": {
            "id": {"type": "integer"}, "lines": {"type": "array", "items": items},
            "attrs": {"type": "object", "additionalProperties": value}}}

    def ensure(ident: str, schema: WriterSchema, value: dict[str, Any]) -> Any:
        rec = SinkRecord("t", 0, 0, None, value, None)
        rec.value_schema = schema
        return tables.ensure(ident, [rec], [value])[0]

    v1 = WriterSchema(1, "jsonschema", json.dumps(doc(None, False)))
    v2 = WriterSchema(2, "jsonschema", json.dumps(doc({"qty": {"type": "integer"}}, True)))
    ensure("shop.orders", v1, {"id": 1, "lines": [{"sku": "a"}], "attrs": {"k": {"n": 1}}})
    table = ensure("shop.orders", v2, {"id": 2, "lines": [{"sku": "a", "qty": 3}], "attrs": {"k": {"unit": "kg"}}})
    assert [(f.name, shape(f.field_type)) for f in table.schema().fields] == [
        ("id", "long"), ("lines", "list<struct<sku: string, qty?: long>>"),
        ("attrs", "map<string, struct<n?: long, unit?: string>>")]
    assert len(load_catalog("local", **props).load_table("shop.orders").schemas()) == 2, "one schema change"

    record = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, {"name": "inner", "type": {
        "type": "record", "name": "Inner", "fields": [{"name": "q", "type": "int"}]}}]}
    wider = json.loads(json.dumps(record))
    wider["fields"][1]["type"]["fields"][0]["type"] = "long"
    ensure("shop.avro", WriterSchema(3, "avro", json.dumps(record)), {"id": 1, "inner": {"q": 1}})
    table = ensure("shop.avro", WriterSchema(4, "avro", json.dumps(wider)), {"id": 2, "inner": {"q": 2**40}})
    assert shape(table.schema().find_field("inner").field_type) == "struct<q: long>"

    v3 = WriterSchema(5, "jsonschema", json.dumps(doc({"qty": {"type": "integer"}}, True, sku="integer")))
    with pytest.raises(FatalError) as err:
        ensure("shop.orders", v3, {"id": 3, "lines": [{"sku": 4}], "attrs": {}})
    assert "field 'lines.element.sku' is long but column 'lines.element.sku' of shop.orders is string" in str(err.value)


def test_a_string_column_takes_a_nested_field_as_its_json_text(tmp_path) -> None:
    """No servers: a table whose ``address`` is a string column (made by hand, or before nested values were
    typed) takes a schema whose address is an object: no conflict, the object lands as its JSON text."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.iceberg import arrow as ia
    from eosink.connectors.iceberg.tables import Tables

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}"}
    cat = load_catalog("local", **props)
    cat.create_namespace("shop")
    cat.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=True),
                                           NestedField(2, "address", StringType(), required=False)))
    tables = Tables("local", props, auto_create=True, auto_evolve=True, kafka=False, partition_fields=(), table_props={},
                    attempts=3)
    value = {"id": 1, "address": {"city": "Lyon"}}
    rec = SinkRecord("t", 0, 0, None, value, None)
    rec.value_schema = WriterSchema(1, "jsonschema", json.dumps({"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "address": {"type": "object", "properties": {"city": {"type": "string"}}}}}))
    table = tables.ensure("shop.orders", [rec], [value])[0]
    assert len(table.schemas()) == 1, "the table is unchanged"
    assert ia.to_arrow(table.schema(), [rec], [value], False, typed=True).column("address").to_pylist() == ['{"city":"Lyon"}']
