"""S3 Parquet objects typed from the registered schema, against the stack's real Schema Registry, MinIO and a real
worker: an Avro decimal is a decimal128 column, a timestamp a timestamp[us, tz=UTC], bytes binary, and the values
are exactly the producer's.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import RegistryServer
from tests.test_postgres_typed_schema import ALL_TYPES, ORDER_V1, ORDER_V2, avro, deliver, everything
from tests.test_schema_registry import CLASSES

pytest.importorskip("pyiceberg")  # the Arrow types are pyiceberg's mapping of the Iceberg sink's

#: ALL_TYPES as Parquet columns: (Arrow type, nullable), pyiceberg's Arrow mapping of the Iceberg sink's types.
PARQUET = {
    "id": ("int64", False), "qty": ("int32", False), "ratio": ("float", False), "score": ("double", False),
    "ok": ("bool", False), "name": ("large_string", False), "blob": ("large_binary", False),
    "digest": ("fixed_size_binary[4]", False), "amount": ("decimal128(20, 8)", False),
    "at": ("timestamp[us, tz=UTC]", False), "at_micros": ("timestamp[us, tz=UTC]", False), "day": ("date32[day]", False),
    "clock": ("time64[us]", False), "clock_micros": ("time64[us]", False), "ref": ("extension<arrow.uuid>", False),
    "address": ("struct<city: large_string not null>", False), "tags": ("large_list<element: large_string not null>", False),
    "attrs": ("map<large_string, int64 ('attrs')>", False), "state": ("large_string", False), "note": ("large_string", True),
    "__topic": ("string", True), "__partition": ("int32", True), "__offset": ("int64", True),
}


def s3_connector(stack, url: str, topic: str, bucket: str) -> dict[str, str]:
    return {"connector.class": "s3", "topics": topic, "format": "parquet", "value.converter": CLASSES["avro"],
            "value.converter.schema.registry.url": url, "s3.bucket.name": bucket,
            "s3.endpoint.url": stack.s3["endpoint_url"], "s3.region": stack.s3["region_name"],
            "s3.path.style.access": "true", "aws.access.key.id": stack.s3["aws_access_key_id"],
            "aws.secret.access.key": stack.s3["aws_secret_access_key"], "commit.interval.ms": "300"}


def objects(client: Any, bucket: str, prefix: str) -> list[pa.Table]:
    import pyarrow.parquet as pq

    try:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    except client.exceptions.NoSuchBucket:
        return []
    return [pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()))
            for o in listed if o["Key"].endswith(".parquet")]


def test_avro_fields_make_typed_parquet_columns_with_exact_values(registry: RegistryServer, stack, make_topic, unique,
                                                                   tmp_path) -> None:
    import boto3

    from tests.restkit import produce

    client = boto3.client("s3", **stack.s3)
    bucket = unique.replace("_", "-")
    name = unique.replace("_", "-")
    topic = make_topic(2)
    encode = avro(registry.url, topic, ALL_TYPES)
    produce(stack.kafka_bootstrap, topic, [(i % 2, encode(everything(i))) for i in range(40)])

    def ids() -> list[int]:
        return sorted(i for t in objects(client, bucket, name) for i in t.column("id").to_pylist())

    deliver(stack, unique, s3_connector(stack, registry.url, topic, bucket), ids, 40, tmp_path)
    tables = objects(client, bucket, name)
    schema = tables[0].schema
    assert all(t.schema == schema for t in tables)
    assert {f.name: (str(f.type), f.nullable) for f in schema} == PARQUET
    row = next(r for t in tables for r in t.to_pylist() if r["id"] == 8)
    want = everything(8)
    want["attrs"] = list(want["attrs"].items())
    assert {k: row[k] for k in want} == want
    assert row["amount"] == decimal.Decimal("123456789020.12345678")
    assert row["at"] == datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]:
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)


def test_an_object_of_two_schema_versions_has_the_union_of_their_fields_nullable_where_a_version_lacks_one() -> None:
    """Pure: records of ORDER_V1 and ORDER_V2 in one object (no servers)."""
    import pyarrow.parquet as pq

    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.s3.encoding import encode_parquet

    v1, v2 = WriterSchema(1, "avro", json.dumps(ORDER_V1)), WriterSchema(2, "avro", json.dumps(ORDER_V2))
    recs = [SinkRecord("t", 0, 0, None, {"id": 1, "amount": "1.50"}, None),
            SinkRecord("t", 0, 1, None, {"id": 2, "amount": "2.50", "discount": "0.125", "coupon": None}, None)]
    recs[0].value_schema, recs[1].value_schema = v1, v2
    table = pq.read_table(io.BytesIO(encode_parquet(recs)))
    assert [(f.name, str(f.type), f.nullable) for f in table.schema][:4] == [
        ("id", "int64", False), ("amount", "decimal128(10, 2)", False), ("discount", "decimal128(8, 3)", True),
        ("coupon", "large_string", True)]
    assert table.column("discount").to_pylist() == [None, decimal.Decimal("0.125")]


@pytest.mark.parametrize("fmt", ["jsonschema", "protobuf"])
def test_nested_json_schema_and_protobuf_values_make_parquet_structs_lists_and_maps_with_exact_values(
        registry: RegistryServer, stack, make_topic, unique, tmp_path, fmt: str) -> None:
    import boto3

    from tests.restkit import produce
    from tests.test_iceberg_typed_nested import (
        ORDER_JSON,
        TREE,
        basket,
        basket_class,
        basket_read,
        json_serializer,
        order_json,
        order_json_read,
        proto_serializer,
    )

    client = boto3.client("s3", **stack.s3)
    bucket = name = unique.replace("_", "-")
    topic = make_topic(2)
    if fmt == "jsonschema":
        encode_json = json_serializer(registry.url, topic, ORDER_JSON)
        values = [encode_json(order_json(i)) for i in range(30)]
    else:
        encode_proto = proto_serializer(registry.url, topic, basket_class())
        values = [encode_proto(basket(i)) for i in range(30)]
    produce(stack.kafka_bootstrap, topic, [(i % 2, v) for i, v in enumerate(values)])

    def ids() -> list[int]:
        return sorted(i for t in objects(client, bucket, name) for i in t.column("id").to_pylist())

    deliver(stack, unique, {**s3_connector(stack, registry.url, topic, bucket), "value.converter": CLASSES[fmt]}, ids, 30,
            tmp_path)
    tables = objects(client, bucket, name)
    got = {r["id"]: r for t in tables for r in t.to_pylist()}
    types = {f.name: (str(f.type), f.nullable) for f in tables[0].schema}
    if fmt == "jsonschema":
        assert {k: types[k] for k in ("address", "lines", "attrs", "tree")} == NESTED_JSON_PARQUET
        for i in (7, 8):
            want = order_json_read(i)
            assert {k: got[i][k] for k in want if k != "tree"} == {k: v for k, v in want.items() if k != "tree"}
            assert json.loads(got[i]["tree"]) == TREE
    else:
        assert {k: types[k] for k in ("customer", "lines", "attrs", "slots", "at", "tree")} == NESTED_PROTOBUF_PARQUET
        for i in (6, 7, 8):
            assert basket_read(got[i]) == basket(i)
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]:
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)


#: The nested columns of ORDER_JSON and of shop.Basket as Parquet gives them back.
NESTED_JSON_PARQUET = {
    "address": ("struct<city: large_string not null, since: timestamp[us, tz=UTC]>", False),
    "lines": ("large_list<element: struct<sku: large_string not null, price: double not null, day: date32[day], "
              "ref: extension<arrow.uuid>> not null>", False),
    "attrs": ("map<large_string, int64 ('attrs')>", True), "tree": ("large_string", True),
}
NESTED_PROTOBUF_PARQUET = {
    "customer": ("struct<name: large_string not null, vip: bool not null>", True),
    "lines": ("large_list<element: struct<sku: large_string not null, qty: int32 not null, blob: large_binary not null, "
              "units: decimal128(20, 0) not null> not null>", False),
    "attrs": ("map<large_string, int64 ('attrs')>", False), "slots": ("map<int32, large_string ('slots')>", False),
    "at": ("timestamp[us, tz=UTC]", True), "tree": ("large_string", True),
}


def test_an_object_of_two_versions_has_the_union_of_their_nested_fields() -> None:
    """Pure: JSON Schema records of ORDER_JSON and of a version whose address has a new optional ``zip``, in one object."""
    import pyarrow.parquet as pq

    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.s3.encoding import encode_parquet
    from tests.test_iceberg_typed_nested import ORDER_JSON, order_json

    v2_doc = json.loads(json.dumps(ORDER_JSON))
    v2_doc["properties"]["address"]["properties"]["zip"] = {"type": ["string", "null"]}
    v1, v2 = WriterSchema(1, "jsonschema", json.dumps(ORDER_JSON)), WriterSchema(2, "jsonschema", json.dumps(v2_doc))
    recs = [SinkRecord("t", 0, 0, None, order_json(0), None),
            SinkRecord("t", 0, 1, None, {**order_json(1), "address": {"city": "Nice", "zip": "06000"}}, None)]
    recs[0].value_schema, recs[1].value_schema = v1, v2
    table = pq.read_table(io.BytesIO(encode_parquet(recs)))
    assert str(table.schema.field("address").type) == ("struct<city: large_string not null, since: timestamp[us, tz=UTC], "
                                                       "zip: large_string>")
    assert table.column("address").to_pylist() == [
        {"city": "Lyon", "since": datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC), "zip": None},
        {"city": "Nice", "since": None, "zip": "06000"}]


def test_an_object_of_two_protobuf_versions_has_the_union_of_their_nested_message_fields() -> None:
    """Pure: shop.Basket records, and records of a version whose Customer has an ``email`` (required, as every
    proto3 scalar: the object's struct gets it nullable, the v1 rows null), decoded as the converter does."""
    import pyarrow.parquet as pq
    from google.protobuf import descriptor_pb2

    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.schemas import WriterSchema
    from eosink.connectors.s3.encoding import encode_parquet
    from eosink.worker.engine.registry_converters import _message_dict, jsonable
    from tests.test_iceberg_typed_nested import basket, basket_class

    recs = []
    for n, cls in enumerate((basket_class(), basket_class(email=True))):
        fdp = descriptor_pb2.FileDescriptorProto()
        cls.DESCRIPTOR.file.CopyToProto(fdp)
        schema = WriterSchema(n + 1, "protobuf", "", parsed=fdp, descriptor=cls.DESCRIPTOR.file)
        value = basket(1) if n == 0 else {**basket(2), "customer": {"name": "c2", "vip": True, "email": "c2@x"}}
        recs.append(SinkRecord("t", 0, n, None, jsonable(_message_dict(cls(**value))), None))
        recs[-1].value_schema = schema
    table = pq.read_table(io.BytesIO(encode_parquet(recs)))
    assert str(table.schema.field("customer").type) == ("struct<name: large_string not null, vip: bool not null, "
                                                        "email: large_string>")
    assert table.column("customer").to_pylist() == [{"name": "c1", "vip": False, "email": None},
                                                    {"name": "c2", "vip": True, "email": "c2@x"}]
    assert table.column("lines").to_pylist()[1][0]["units"] == decimal.Decimal(2**64 - 3)
