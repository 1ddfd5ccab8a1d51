"""PostgreSQL columns from a record's registered schema (Avro, Protobuf, JSON Schema), as Confluent's JDBC sink makes them.

Values read with a Schema Registry converter reach the sink as JSON-like values (a decimal as its
text, a timestamp as ISO 8601 text, bytes as ``\\x`` hex): typed from those values, a decimal would
become a ``text`` column. The writer's schema says what the field is, so ``auto.create`` and
``auto.evolve`` take the column types from it (:func:`columns_of`) and the values land exactly in
them (PostgreSQL parses each text into its type). :func:`compare` tells what a new schema version
needs of an existing table: columns to add, and the changes no ALTER can make safely.

Protobuf: the fields of a schema's only top-level message (a schema of several keeps the JSON inference,
as the message a record holds is then told by its own indexes). Every proto3 field has a value in the
decoded record (its default when unset) and so a NOT NULL column, but a message field, which is null when
unset; every field counts as defaulted, so a new one is added to an existing table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common.schema_walk import SchemaField, avro_resolve, json_kinds, json_source, record_fields
from eosink.connectors.postgres.schema import GENERATED, Table

_AVRO_PRIMITIVES: dict[str, tuple[str, str]] = {
    "int": ("integer", "int4"), "long": ("bigint", "int8"), "float": ("real", "float4"),
    "double": ("double precision", "float8"), "boolean": ("boolean", "bool"), "string": ("text", "text"),
    "bytes": ("bytea", "bytea"), "enum": ("text", "text"), "fixed": ("bytea", "bytea"),
    "record": ("jsonb", "jsonb"), "array": ("jsonb", "jsonb"), "map": ("jsonb", "jsonb"),
}
_AVRO_LOGICAL: dict[str, tuple[str, str]] = {
    "timestamp-millis": ("timestamptz", "timestamptz"), "timestamp-micros": ("timestamptz", "timestamptz"),
    "local-timestamp-millis": ("timestamp", "timestamp"), "local-timestamp-micros": ("timestamp", "timestamp"),
    "date": ("date", "date"), "time-millis": ("time", "time"), "time-micros": ("time", "time"), "uuid": ("uuid", "uuid"),
}
_JSON_TYPES: dict[str, tuple[str, str]] = {
    "integer": ("bigint", "int8"), "number": ("double precision", "float8"), "boolean": ("boolean", "bool"),
    "string": ("text", "text"), "object": ("jsonb", "jsonb"), "array": ("jsonb", "jsonb"),
}
_JSON_FORMATS: dict[str, tuple[str, str]] = {"date-time": ("timestamptz", "timestamptz"), "date": ("date", "date"),
                                             "uuid": ("uuid", "uuid")}
#: The column types (pg_type names, domains resolved) that take a field's values without a silent loss. A
#: narrower integer column is one (a value out of its range is refused by the server, naming the record, as
#: before typed tables), a float4 column for a double, a date column for a timestamp are not (they round).
ACCEPTS: dict[str, frozenset[str]] = {
    "int4": frozenset({"int2", "int4", "int8", "numeric", "float8"}),
    "int8": frozenset({"int2", "int4", "int8", "numeric"}),
    "float4": frozenset({"float4", "float8", "numeric"}), "float8": frozenset({"float8", "numeric"}),
    "bool": frozenset({"bool"}), "text": frozenset({"text", "varchar", "bpchar"}),
    "bytea": frozenset({"bytea", "text"}), "numeric": frozenset({"numeric", "text"}),
    # (jsonb: a Protobuf Timestamp's column in a table made when its values were {seconds, nanos} objects)
    "timestamptz": frozenset({"timestamptz", "text", "jsonb", "json"}), "timestamp": frozenset({"timestamp", "text"}),
    "date": frozenset({"date", "text"}), "time": frozenset({"time", "text"}), "uuid": frozenset({"uuid", "text"}),
    "jsonb": frozenset({"jsonb", "json"}),
}
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")


@dataclass(frozen=True, slots=True)
class FieldColumn:
    """The column one schema field maps to."""

    name: str
    sqltype: str  # in DDL: numeric(10,2), timestamptz
    typname: str  # the pg_type name the column then has: numeric, timestamptz
    #: The field may be null (a union with null, a JSON Schema field not required or typed null).
    nullable: bool
    #: The field has a default: a writer of an older version did not write it, a reader gets the default.
    defaulted: bool
    source: str  # the field's type as the schema says it, for messages

    @property
    def ddl(self) -> str:
        """The column's type in ``CREATE TABLE``: NOT NULL for a field that can never be null."""
        return self.sqltype if self.nullable else f"{self.sqltype} NOT NULL"


#: Columns of a schema's fields, by field name (in the schema's order); None: the schema is not typed here.
Columns = dict[str, FieldColumn]


def columns_of(schema: WriterSchema) -> Columns | None:
    """The columns of a record schema's fields; None for a schema this module does not type (Protobuf
    of several messages, a value that is no record/object), whose values keep the JSON inference."""
    found = record_fields(schema)
    if found is None:
        return None
    if found.format == "avro":
        fields = (_avro_field(f, found.named) for f in found.fields)
        return {fc.name: fc for fc in fields if fc.sqltype != "null"}  # a field always null has no column
    if found.format == "jsonschema":
        return {f.name: _json_field(f) for f in found.fields}
    return {f.name: _proto_field(f) for f in found.fields}


#: FieldDescriptorProto.Type -> column: unsigned 64-bit integers need numeric(20,0), unsigned 32-bit a bigint.
_PROTO_TYPES: dict[int, tuple[str, str, str]] = {
    1: ("double precision", "float8", "double"), 2: ("real", "float4", "float"), 3: ("bigint", "int8", "int64"),
    4: ("numeric(20,0)", "numeric", "uint64"), 5: ("integer", "int4", "int32"), 6: ("numeric(20,0)", "numeric", "fixed64"),
    7: ("bigint", "int8", "fixed32"), 8: ("boolean", "bool", "bool"), 9: ("text", "text", "string"),
    11: ("jsonb", "jsonb", "message"), 12: ("bytea", "bytea", "bytes"), 13: ("bigint", "int8", "uint32"),
    14: ("text", "text", "enum"), 15: ("integer", "int4", "sfixed32"), 16: ("bigint", "int8", "sfixed64"),
    17: ("integer", "int4", "sint32"), 18: ("bigint", "int8", "sint64"),
}


def _proto_field(f: SchemaField) -> FieldColumn:
    if f.type.label == 3:  # repeated, maps too: a list or an object
        return FieldColumn(f.name, "jsonb", "jsonb", f.nullable, f.defaulted, "repeated")
    if f.type.type == 11 and f.type.type_name == ".google.protobuf.Timestamp":  # read as its ISO 8601 text
        return FieldColumn(f.name, "timestamptz", "timestamptz", f.nullable, f.defaulted, "google.protobuf.Timestamp")
    sqltype, typname, source = _PROTO_TYPES.get(f.type.type, ("jsonb", "jsonb", f"type {f.type.type}"))
    return FieldColumn(f.name, sqltype, typname, f.nullable, f.defaulted, source)


def _avro_field(f: SchemaField, named: Mapping[str, Any]) -> FieldColumn:
    sqltype, typname, source = _avro_type(f.type, named)
    return FieldColumn(f.name, sqltype, typname, f.nullable, f.defaulted, source)


def _avro_type(t: Any, named: Mapping[str, Any], depth: int = 0) -> tuple[str, str, str]:
    """(sqltype, typname, how the schema names it) of one Avro type (never a nullable union: see avro_unwrap)."""
    if isinstance(t, list):
        return ("jsonb", "jsonb", "a union") if t != "null" else ("null", "null", "null")
    if isinstance(t, str):
        if t == "null":
            return "null", "null", "null"
        if t in _AVRO_PRIMITIVES:
            return (*_AVRO_PRIMITIVES[t], t)
        resolved = avro_resolve(t, named)
        return _avro_type(resolved, named, depth + 1) if resolved is not t and depth < 8 else ("jsonb", "jsonb", t)
    if not isinstance(t, dict):
        return "jsonb", "jsonb", str(t)
    kind, logical = t.get("type"), t.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        p, s = int(t.get("precision", 0)), int(t.get("scale", 0))
        return f"numeric({p},{s})", "numeric", f"decimal({p},{s})"
    if isinstance(logical, str) and logical in _AVRO_LOGICAL:
        return (*_AVRO_LOGICAL[logical], logical)
    if kind in ("record", "error", "enum", "fixed", "array", "map"):
        return (*_AVRO_PRIMITIVES["record" if kind == "error" else kind], kind)
    return _avro_type(kind, named, depth + 1)


def _json_field(f: SchemaField) -> FieldColumn:
    sub = f.type
    kinds = [k for k in json_kinds(sub) if k != "null"]
    if len(kinds) != 1:
        sqltype, typname = "jsonb", "jsonb"
    elif kinds[0] == "string" and sub.get("format") in _JSON_FORMATS:
        sqltype, typname = _JSON_FORMATS[str(sub["format"])]
    else:
        sqltype, typname = _JSON_TYPES.get(kinds[0], ("jsonb", "jsonb"))
    return FieldColumn(f.name, sqltype, typname, f.nullable, f.defaulted, json_source(sub))


@dataclass(slots=True)
class Comparison:
    """What a schema needs of an existing table."""

    #: Fields the table has no column for, which may be added (nullable, or with a default).
    add: list[FieldColumn]
    #: (field or column name, why) of every change the table cannot take.
    conflicts: list[tuple[str, str]]


def compare(table: Table, columns: Columns, exempt: Iterable[str]) -> Comparison:
    """The columns ``columns`` needs added to ``table`` and what conflicts: a column whose type cannot
    take the field's values, a new field neither nullable nor defaulted (rows already there have no
    value for it), a NOT NULL column without a default that no field fills (``exempt``: columns filled
    otherwise - the Kafka coordinates, the key's fields)."""
    add: list[FieldColumn] = []
    conflicts: list[tuple[str, str]] = []
    for name, fc in columns.items():
        col = table.columns.get(name)
        if col is None:
            if fc.nullable or fc.defaulted:
                add.append(fc)
            else:
                conflicts.append((name, f"new field '{name}' is {fc.source}, neither nullable nor with a default: "
                                        f"the rows already in {table.display} have no value for it"))
        elif col.kind != GENERATED and not _takes(col.typname, col.sqltype, fc):
            conflicts.append((name, f"field '{name}' is {fc.source} but column '{name}' of {table.display} is {col.sqltype}, "
                                    "which cannot take its values"))
    skip = set(exempt)
    for name, col in table.columns.items():
        if col.notnull and not col.has_default and col.kind != GENERATED and name not in columns and name not in skip:
            conflicts.append((name, f"column '{name}' of {table.display} is NOT NULL without a default, "
                                    f"and the schema has no field '{name}' to fill it"))
    return Comparison(add, conflicts)


def _takes(typname: str, sqltype: str, fc: FieldColumn) -> bool:
    if typname not in ACCEPTS.get(fc.typname, frozenset({fc.typname})):
        return False
    if typname == "numeric" and fc.typname == "numeric":
        want, have = _NUMERIC.fullmatch(fc.sqltype), _NUMERIC.fullmatch(sqltype.replace(" ", ""))
        if want and have:  # no rounding: as many digits after the point (too few before it overflows, loudly)
            return int(have.group(2)) >= int(want.group(2))
    return True
