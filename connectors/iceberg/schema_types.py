"""Iceberg columns from a record's registered schema (Avro, Protobuf, JSON Schema), and what a new version needs.

Values read with a Schema Registry converter reach the sink as JSON-like values (a decimal as its
text, a timestamp as ISO 8601 text, bytes as ``\\x`` hex): typed from those values, a decimal would
become a string column. The writer's schema says what each field is, so ``auto.create`` makes the
table from it (:func:`fields_of`, :func:`table_schema`), the values are turned back into their types
(:mod:`.typed_values`), and ``auto.evolve`` compares each new version with the table
(:func:`compare`): optional fields to add, promotions Iceberg allows, and the changes it cannot take.

Nested values map in every format: Avro records, arrays and maps, JSON Schema objects and arrays,
Protobuf messages, repeated and map fields become Iceberg structs, lists and maps (the JSON Schema and
Protobuf rules: :mod:`.nested_types`); ``auto.evolve`` adds a new optional nested field where it belongs.
A union of several types, and a recursive type, become a string column holding its JSON text (what the
PostgreSQL sink makes ``jsonb``); a string column also takes any nested field as its JSON text.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common.schema_walk import (
    MAX_DEPTH,
    SchemaField,
    avro_resolve,
    avro_unwrap,
    record_fields,
)
from eosink.connectors.iceberg.nested_types import PROTO_TYPES, Nest, Path, json_type, proto_type

_AVRO_PRIMITIVES: dict[str, IcebergType] = {
    "int": IntegerType(), "long": LongType(), "float": FloatType(), "double": DoubleType(), "boolean": BooleanType(),
    "string": StringType(), "bytes": BinaryType(), "enum": StringType(),
}
_AVRO_LOGICAL: dict[str, IcebergType] = {
    "timestamp-millis": TimestamptzType(), "timestamp-micros": TimestamptzType(),
    "local-timestamp-millis": TimestampType(), "local-timestamp-micros": TimestampType(),
    "date": DateType(), "time-millis": TimeType(), "time-micros": TimeType(), "uuid": UUIDType(),
}
#: A column of the key's type takes values of the field's type without loss (no promotion needed).
_WIDER: dict[type, tuple[type, ...]] = {IntegerType: (LongType,), FloatType: (DoubleType,)}


@dataclass(frozen=True, slots=True)
class FieldType:
    """The column one schema field maps to."""

    name: str
    type: IcebergType
    nullable: bool
    defaulted: bool
    source: str  # the field's type as the schema says it, for messages
    #: Paths (column name first) of the nested fields that have a default: ``auto.evolve`` adds such a field
    #: when a version brings it, even one that version makes required (rows already there get null).
    nested_defaults: frozenset[Path] = frozenset()


#: Columns of a schema's fields, by field name (in the schema's order).
Fields = dict[str, FieldType]


def fields_of(schema: WriterSchema) -> Fields | None:
    """The columns of a record schema's fields; None for a schema that is not typed here (see
    :func:`~eosink.connectors.common.schema_walk.record_fields`), whose values keep the JSON inference."""
    found = record_fields(schema)
    if found is None:
        return None
    ids = itertools.count(10_000)  # nested field ids: unique in the schema; the catalog assigns fresh ones
    out: Fields = {}
    for f in found.fields:
        nest, at = Nest(ids), (f.name,)
        if found.format == "avro":
            if f.type == "null":
                continue  # a field always null has no column
            ftype, source = _avro_type(f.type, found.named, nest, at)
        elif found.format == "jsonschema":
            ftype, source = json_type(f.type, found.root, nest, at)
        elif found.root is not None:
            ftype, source = proto_type(found.root.fields_by_name[f.name], nest, at)
        else:
            ftype, source = _proto_flat(f)
        out[f.name] = FieldType(f.name, ftype, f.nullable, f.defaulted, source, frozenset(nest.defaulted))
    return out


def _proto_flat(f: SchemaField) -> tuple[IcebergType, str]:
    """A Protobuf field without the pool's descriptors (nothing resolves its message types): nested values as JSON text."""
    if f.type.label == 3 or f.type.type in (10, 11):
        return StringType(), "repeated" if f.type.label == 3 else "message"
    return PROTO_TYPES.get(f.type.type, (StringType(), f"type {f.type.type}"))


def _avro_type(t: Any, named: Mapping[str, Any], nest: Nest, at: Path, depth: int = 0) -> tuple[IcebergType, str]:
    """(Iceberg type, how the schema names it) of one Avro type without its null branch, ``at`` its path."""
    t = avro_resolve(t, named)
    if isinstance(t, list) or depth > MAX_DEPTH:
        return StringType(), "a union"  # of several types: its JSON text
    if isinstance(t, str):
        return _AVRO_PRIMITIVES.get(t, StringType()), t
    if not isinstance(t, dict):
        return StringType(), str(t)
    kind, logical = t.get("type"), t.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        p, s = int(t.get("precision", 0)), int(t.get("scale", 0))
        return DecimalType(p, s), f"decimal({p},{s})"
    if isinstance(logical, str) and logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical], logical
    if kind == "fixed":
        return FixedType(int(t["size"])), f"fixed({t['size']})"
    if kind in ("record", "error"):
        fields = []
        for f in t.get("fields", ()):
            inner, nullable = avro_unwrap(f.get("type"))
            ftype = _avro_type(inner, named, nest, (*at, f["name"]), depth + 1)[0] if inner != "null" else StringType()
            fields.append(nest.field(at, f["name"], ftype, required=not nullable, defaulted="default" in f))
        return StructType(*fields), f"record {t.get('name')}"
    if kind == "array":
        inner, nullable = avro_unwrap(t.get("items"))
        element = _avro_type(inner, named, nest, (*at, "element"), depth + 1)[0]
        return ListType(next(nest.ids), element, element_required=not nullable), "array"
    if kind == "map":
        inner, nullable = avro_unwrap(t.get("values"))
        value = _avro_type(inner, named, nest, (*at, "value"), depth + 1)[0]
        return MapType(next(nest.ids), StringType(), next(nest.ids), value, value_required=not nullable), "map"
    if kind == "enum":
        return StringType(), "enum"
    return _avro_type(kind, named, nest, at, depth + 1)


def table_schema(fields: Iterable[FieldType], kafka_fields: Iterable[tuple[str, IcebergType]]) -> Schema:
    """A new table's schema: the schema's fields (required where they can never be null), then the Kafka
    coordinates (required)."""
    cols = [NestedField(i, f.name, f.type, required=not f.nullable) for i, f in enumerate(fields, 1)]
    cols += [NestedField(len(cols) + i, n, t, required=True) for i, (n, t) in enumerate(kafka_fields, 1)]
    return Schema(*cols)


@dataclass(slots=True)
class Comparison:
    """What a schema needs of an existing table; nested fields are named by their path from the column."""

    #: Columns and nested fields the table lacks, which may be added (nullable, or with a default), with their type.
    add: list[tuple[Path, IcebergType]]
    #: Columns to widen as Iceberg allows (int -> long, float -> double, a decimal's precision), with the new type.
    promote: list[tuple[Path, IcebergType]]
    #: Required columns (struct fields, list elements, map values) the field may now leave null: they become optional.
    relax: list[Path]
    #: (field or column name, why) of every change the table cannot take.
    conflicts: list[tuple[str, str]]

    @property
    def changes(self) -> bool:
        return bool(self.add or self.promote or self.relax)


def compare(schema: Schema, fields: Fields, exempt: Iterable[str], display: str) -> Comparison:
    """The changes ``fields`` needs of a table of ``schema``, and what conflicts: a column whose type cannot
    take the field's values and which Iceberg cannot promote, a new field neither nullable nor defaulted
    (rows already in the table have no value for it), a required column no field fills (``exempt``: the
    Kafka coordinates) - at the top level and, the same way, inside structs, lists and maps."""
    out = Comparison([], [], [], [])
    columns = {f.name: f for f in schema.fields}
    for name, ft in fields.items():
        col = columns.get(name)
        if col is None:
            if ft.nullable or ft.defaulted:
                out.add.append(((name,), ft.type))
            else:
                out.conflicts.append((name, f"new field '{name}' is {ft.source}, neither nullable nor with a default: "
                                            f"the rows already in {display} have no value for it"))
            continue
        if isinstance(col.field_type, (StructType, ListType, MapType)) and type(col.field_type) is type(ft.type):
            _nested((name,), col.field_type, ft.type, ft.nested_defaults, display, out)
        elif not takes(col.field_type, ft.type):
            promoted = _promotion(col.field_type, ft.type)
            if promoted is None:
                out.conflicts.append((name, f"field '{name}' is {ft.source} ({ft.type}) but column '{name}' of {display} is "
                                            f"{col.field_type}, which cannot take its values and Iceberg cannot promote to it"))
            else:
                out.promote.append(((name,), promoted))
        if col.required and ft.nullable:
            out.relax.append((name,))
    skip = set(exempt)
    for name, col in columns.items():
        if col.required and name not in fields and name not in skip:
            out.conflicts.append((name, f"column '{name}' of {display} is required, and the schema has no field '{name}' to fill it"))
    return out


def _nested(path: Path, column: IcebergType, field: IcebergType, defaults: frozenset[Path], display: str,
            out: Comparison) -> None:
    """:func:`compare` inside a struct, list or map column: ``path`` names where (``address.city``)."""
    at = ".".join(path)
    if isinstance(column, StructType) and isinstance(field, StructType):
        have = {f.name: f for f in column.fields}
        for sub in field.fields:
            inner, col = (*path, sub.name), have.get(sub.name)
            if col is None:
                if not sub.required or inner in defaults:
                    out.add.append((inner, sub.field_type))
                else:
                    out.conflicts.append((".".join(inner), f"new field '{'.'.join(inner)}' is {sub.field_type}, neither "
                                          f"nullable nor with a default: the rows already in {display} have no value for it"))
                continue
            _nested(inner, col.field_type, sub.field_type, defaults, display, out)
            if col.required and not sub.required:
                out.relax.append(inner)
        named = {f.name for f in field.fields}
        out.conflicts.extend((f"{at}.{c.name}", f"field '{at}.{c.name}' of {display} is required, and the schema has no "
                              f"field '{at}.{c.name}' to fill it") for c in column.fields if c.required and c.name not in named)
        return
    if isinstance(column, ListType) and isinstance(field, ListType):
        _nested((*path, "element"), column.element_type, field.element_type, defaults, display, out)
        if column.element_required and not field.element_required:
            out.relax.append((*path, "element"))
        return
    if isinstance(column, MapType) and isinstance(field, MapType):
        _nested((*path, "key"), column.key_type, field.key_type, defaults, display, out)
        _nested((*path, "value"), column.value_type, field.value_type, defaults, display, out)
        if column.value_required and not field.value_required:
            out.relax.append((*path, "value"))
        return
    if not takes(column, field):
        promoted = _promotion(column, field)
        if promoted is None:
            out.conflicts.append((at, f"field '{at}' is {field} but column '{at}' of {display} is {column}, which "
                                      "cannot take its values and Iceberg cannot promote to it"))
        else:
            out.promote.append((path, promoted))


def takes(column: IcebergType, field: IcebergType) -> bool:
    """Whether a column of type ``column`` holds every value of ``field`` exactly (field ids aside); a string
    column holds a struct, list or map as its JSON text, and a timestamp as its ISO 8601 text (a table created
    while they were typed so: a Protobuf ``google.protobuf.Timestamp`` was a message)."""
    if isinstance(column, StringType) and isinstance(field, (StructType, ListType, MapType, TimestamptzType)):
        return True
    if isinstance(column, DecimalType) and isinstance(field, DecimalType):
        return column.scale == field.scale and column.precision >= field.precision
    if isinstance(column, StructType) and isinstance(field, StructType):
        have = {f.name: f for f in column.fields}
        return all(f.name in have and takes(have[f.name].field_type, f.field_type) and (f.required or not have[f.name].required)
                   for f in field.fields) and all(not f.required or f.name in {g.name for g in field.fields} for f in column.fields)
    if isinstance(column, ListType) and isinstance(field, ListType):
        return takes(column.element_type, field.element_type) and (field.element_required or not column.element_required)
    if isinstance(column, MapType) and isinstance(field, MapType):
        return (takes(column.key_type, field.key_type) and takes(column.value_type, field.value_type)
                and (field.value_required or not column.value_required))
    return column == field or isinstance(column, _WIDER.get(type(field), ()))


def widest(a: IcebergType, b: IcebergType) -> IcebergType | None:
    """A type whose column takes the values of both ``a`` and ``b`` (one object of several schema versions):
    structs of the fields of both, a field one of them lacks optional; None when neither takes the other."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        theirs = {f.name: f for f in b.fields}
        fields = []
        for f in a.fields:
            g = theirs.pop(f.name, None)
            t = f.field_type if g is None else widest(f.field_type, g.field_type)
            if t is None:
                return None
            fields.append(NestedField(f.field_id, f.name, t, required=f.required and g is not None and g.required))
        fields += [NestedField(g.field_id, g.name, g.field_type, required=False) for g in theirs.values()]
        return StructType(*fields)
    if isinstance(a, ListType) and isinstance(b, ListType):
        element = widest(a.element_type, b.element_type)
        return None if element is None else ListType(a.element_id, element, a.element_required and b.element_required)
    if isinstance(a, MapType) and isinstance(b, MapType):
        key, value = widest(a.key_type, b.key_type), widest(a.value_type, b.value_type)
        if key is None or value is None:
            return None
        return MapType(a.key_id, key, a.value_id, value, a.value_required and b.value_required)
    return a if takes(a, b) else b if takes(b, a) else None


def _promotion(column: IcebergType, field: IcebergType) -> IcebergType | None:
    """The type Iceberg's schema evolution may widen ``column`` to so it takes ``field``; None if there is none."""
    if isinstance(column, IntegerType) and isinstance(field, LongType):
        return LongType()
    if isinstance(column, FloatType) and isinstance(field, DoubleType):
        return DoubleType()
    if isinstance(column, DecimalType) and isinstance(field, DecimalType) and column.scale == field.scale:
        return DecimalType(field.precision, field.scale)
    return None
