"""The schema -> column mapping and the comparison auto.evolve acts on (pure functions, no servers)."""

from __future__ import annotations

import json
from typing import Any

from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres import schema_types as pgt


def writer(doc: dict[str, Any], fmt: str = "avro") -> WriterSchema:
    return WriterSchema(7, fmt, json.dumps(doc))


def test_avro_named_type_references_nullable_unions_and_defaults_map_like_their_definitions() -> None:
    doc = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "price", "type": {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal",
                                   "precision": 18, "scale": 4}},
        {"name": "refund", "type": ["null", "Money"], "default": None},
        {"name": "other", "type": ["null", "shop.Money"]},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["A"]}, "default": "A"},
        {"name": "choice", "type": ["int", "string"]},
        {"name": "nothing", "type": "null"},
    ]}
    cols = pgt.columns_of(writer(doc))
    assert cols is not None
    assert {n: (c.ddl, c.defaulted) for n, c in cols.items()} == {
        "price": ("numeric(18,4) NOT NULL", False), "refund": ("numeric(18,4)", True), "other": ("numeric(18,4)", False),
        "state": ("text NOT NULL", True), "choice": ("jsonb NOT NULL", False)}


def test_json_schema_formats_and_required_fields_map_to_typed_and_not_null_columns() -> None:
    doc = {"type": "object", "required": ["id", "at"], "properties": {
        "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
        "ref": {"type": ["string", "null"], "format": "uuid"}, "score": {"type": "number"}, "doc": {"type": "object"}}}
    cols = pgt.columns_of(writer(doc, "jsonschema"))
    assert cols is not None
    assert {n: c.ddl for n, c in cols.items()} == {"id": "bigint NOT NULL", "at": "timestamptz NOT NULL", "ref": "uuid",
                                                  "score": "double precision", "doc": "jsonb"}


def test_non_record_schemas_are_left_to_the_json_inference() -> None:
    assert pgt.columns_of(writer({"type": "array", "items": "long"})) is None


def _table(*columns: pgs.Column) -> pgs.Table:
    return pgs.Table(None, "orders", {c.name: c for c in columns})


def test_compare_adds_optional_fields_and_names_every_change_the_table_cannot_take() -> None:
    doc = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "int"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "region", "type": "string"},
        {"name": "flag", "type": "string"}]}
    cols = pgt.columns_of(writer(doc))
    assert cols is not None
    table = _table(pgs.Column("id", "int8", pgs.INT8, True, "bigint"),  # wider: fine
                   pgs.Column("amount", "numeric", pgs.NUMERIC, False, "numeric(12,1)"),  # 1 decimal < 2: rounds
                   pgs.Column("flag", "bool", pgs.BOOL, False, "boolean"),
                   pgs.Column("gone", "text", pgs.TEXT, True, "text"),
                   pgs.Column("__offset", "int8", pgs.INT8, True, "bigint"),
                   pgs.Column("kept", "text", pgs.TEXT, True, "text", has_default=True))
    found = pgt.compare(table, cols, ["__offset"])
    assert [fc.name for fc in found.add] == ["note"]
    assert [name for name, _ in found.conflicts] == ["amount", "region", "flag", "gone"]
    assert "decimal(12,2)" in found.conflicts[0][1] and "numeric(12,1)" in found.conflicts[0][1]
    for fits in ("numeric(14,3)", "numeric(8,2)", "numeric"):  # fewer integer digits overflow loudly, never round
        table = _table(pgs.Column("amount", "numeric", pgs.NUMERIC, False, fits))
        assert not pgt.compare(table, {"amount": cols["amount"]}, []).conflicts, fits


def test_protobuf_fields_of_the_only_top_level_message_map_to_columns_and_messages_may_be_null() -> None:
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto(name="o.proto", package="shop", syntax="proto3")
    msg = fdp.message_type.add(name="Order")
    for number, (name, kind, label) in enumerate([("id", 3, 1), ("big", 4, 1), ("note", 11, 1), ("tags", 9, 3),
                                                  ("state", 14, 1)], 1):
        msg.field.add(name=name, number=number, type=kind, label=label)
    one = WriterSchema(3, "protobuf", "", parsed=fdp)
    cols = pgt.columns_of(one)
    assert cols is not None
    assert {n: c.ddl for n, c in cols.items()} == {"id": "bigint NOT NULL", "big": "numeric(20,0) NOT NULL",
                                                  "note": "jsonb", "tags": "jsonb NOT NULL", "state": "text NOT NULL"}
    assert all(c.defaulted for c in cols.values()), "a new proto3 field has a default: its column may be added"
    fdp.message_type.add(name="Other")
    assert pgt.columns_of(WriterSchema(4, "protobuf", "", parsed=fdp)) is None, "which message a record holds is its own"
