"""Iceberg types of JSON Schema and Protobuf fields, nested objects and messages included.

A JSON Schema ``object`` with ``properties`` is a struct of them, one with only an ``additionalProperties``
schema a ``map<string, ...>``, an ``array`` with ``items`` a list; a Protobuf message is a struct of its
fields, a ``repeated`` field a list, a ``map<k, v>`` field a map - the shapes the converter decodes them
to (:mod:`eosink.worker.engine.registry_converters`), so each value fits its column as Avro's do.

What has no single shape stays a ``string`` column of its JSON text, as before: a union of several types
(``type: [string, integer]``, ``oneOf``), an object that is both a struct and a map (``properties`` and an
``additionalProperties`` schema), a schema without ``type``, a ``$ref`` outside the document, a message
without fields (Parquet cannot write an empty struct), and a recursive type - a message that contains
itself, a ``$ref`` that leads back to itself (``google.protobuf.Struct``, a tree) - wherever it appears:
its depth is the value's, not the schema's.

Nullability follows the top level's rules (:mod:`eosink.connectors.common.schema_walk`): a JSON Schema
property is required when ``required`` names it and it is not typed ``null``, an array's elements and a
map's values when their schema is not typed ``null``; every Protobuf field is required but a message
(null when unset), list elements and map values are never null. Which nested fields have a default is
kept (:attr:`Nest.defaulted`): ``auto.evolve`` adds a new nested field that has one even when the
version makes it required, as it does a top-level one; every Protobuf field counts as having one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    UUIDType,
)

from eosink.connectors.common.schema_walk import json_kinds, json_source

#: A field's path from its column: ``("address", "city")``, ``("items", "element", "sku")``, as pyiceberg's
#: ``UpdateSchema`` takes nested columns.
Path = tuple[str, ...]

JSON_TYPES: dict[str, IcebergType] = {"integer": LongType(), "number": DoubleType(), "boolean": BooleanType(),
                                      "string": StringType()}
JSON_FORMATS: dict[str, IcebergType] = {"date-time": TimestamptzType(), "date": DateType(), "uuid": UUIDType()}
#: FieldDescriptorProto.Type -> column: unsigned 64-bit integers need decimal(20,0).
PROTO_TYPES: dict[int, tuple[IcebergType, str]] = {
    1: (DoubleType(), "double"), 2: (FloatType(), "float"), 3: (LongType(), "int64"), 4: (DecimalType(20, 0), "uint64"),
    5: (IntegerType(), "int32"), 6: (DecimalType(20, 0), "fixed64"), 7: (LongType(), "fixed32"), 8: (BooleanType(), "bool"),
    9: (StringType(), "string"), 12: (BinaryType(), "bytes"), 13: (LongType(), "uint32"), 14: (StringType(), "enum"),
    15: (IntegerType(), "sfixed32"), 16: (LongType(), "sfixed64"), 17: (IntegerType(), "sint32"), 18: (LongType(), "sint64"),
}


@dataclass(slots=True)
class Nest:
    """What building one schema's nested types collects: fresh field ids (unique in the schema; a catalog
    assigns its own), and the paths of nested fields that have a default."""

    ids: Iterator[int]
    defaulted: set[Path] = field(default_factory=set)
    #: Message full names / ``$ref`` targets already known to be (or not to be) recursive.
    _cyclic: dict[str, bool] = field(default_factory=dict)

    def field(self, at: Path, name: str, ftype: IcebergType, *, required: bool, defaulted: bool) -> NestedField:
        if defaulted:
            self.defaulted.add((*at, name))
        return NestedField(next(self.ids), name, ftype, required=required)


# -- JSON Schema ------------------------------------------------------------------------------------
def json_type(sub: Any, root: Any, nest: Nest, at: Path) -> tuple[IcebergType, str]:
    """(Iceberg type, how the schema names it) of one JSON Schema property, ``at`` its path; ``root`` the
    document its local ``$ref`` s point into."""
    sub = _deref(sub, root, nest)
    if sub is None:
        return StringType(), "a recursive or unresolved $ref"
    kinds = [k for k in json_kinds(sub) if k != "null"]
    if len(kinds) != 1:
        return StringType(), json_source(sub)  # a union of several types, or any: its JSON text
    kind = kinds[0]
    if kind == "string" and sub.get("format") in JSON_FORMATS:
        return JSON_FORMATS[str(sub["format"])], json_source(sub)
    if kind == "object":
        props, extra = sub.get("properties"), sub.get("additionalProperties")
        if isinstance(props, dict) and props and not isinstance(extra, dict) and not sub.get("patternProperties"):
            required = set(sub.get("required") or ())
            fields = []
            for name, p in props.items():
                ftype = json_type(p, root, nest, (*at, name))[0]
                nullable = name not in required or "null" in json_kinds(_deref(p, root, nest) or {})
                fields.append(nest.field(at, name, ftype, required=not nullable, defaulted=isinstance(p, dict) and "default" in p))
            return StructType(*fields), "object"
        if isinstance(extra, dict) and not props and not sub.get("patternProperties"):
            value = json_type(extra, root, nest, (*at, "value"))[0]
            optional = "null" in json_kinds(_deref(extra, root, nest) or {})
            return MapType(next(nest.ids), StringType(), next(nest.ids), value, value_required=not optional), "object (map)"
        return StringType(), "object"
    if kind == "array":
        items = sub.get("items")
        if isinstance(items, dict):
            element = json_type(items, root, nest, (*at, "element"))[0]
            optional = "null" in json_kinds(_deref(items, root, nest) or {})
            return ListType(next(nest.ids), element, element_required=not optional), "array"
        return StringType(), "array"
    return JSON_TYPES.get(kind, StringType()), json_source(sub)


def _deref(sub: Any, root: Any, nest: Nest) -> Mapping[str, Any] | None:
    """``sub`` with its local ``$ref`` followed (``#/$defs/Address``); None for a ``$ref`` that leads back to
    itself or points outside the document, whose values are kept as JSON text."""
    if not isinstance(sub, dict):
        return {}
    seen: list[str] = []
    while isinstance(sub, dict) and isinstance(sub.get("$ref"), str):
        ref = sub["$ref"]
        target = _pointer(root, ref)
        if target is None or ref in seen or _cyclic_ref(ref, root, nest):
            return None
        seen.append(ref)
        sub = target
    return sub if isinstance(sub, dict) else {}


def _pointer(root: Any, ref: str) -> Any:
    """The schema a local JSON pointer (``#``, ``#/definitions/A``) names; None for any other reference."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _refs(node: Any) -> Iterator[str]:
    """Every ``$ref`` written inside ``node`` (not followed)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _cyclic_ref(ref: str, root: Any, nest: Nest) -> bool:
    """Whether the schema ``ref`` names refers back to itself, directly or through others."""
    key = f"$ref:{ref}"
    if key not in nest._cyclic:
        todo, seen = list(_refs(_pointer(root, ref))), set()
        while todo and ref not in seen:
            r = todo.pop()
            if r not in seen:
                seen.add(r)
                todo.extend(_refs(_pointer(root, r)))
        nest._cyclic[key] = ref in seen
    return nest._cyclic[key]


# -- Protobuf ---------------------------------------------------------------------------------------
def proto_type(fd: Any, nest: Nest, at: Path) -> tuple[IcebergType, str]:
    """(Iceberg type, how the schema names it) of one Protobuf field, a pool ``FieldDescriptor``."""
    msg = fd.message_type
    if msg is not None and msg.GetOptions().map_entry:
        key, value = msg.fields_by_name["key"], msg.fields_by_name["value"]
        vtype, vsource = _proto_single(value, nest, (*at, "value"))
        if vtype is None:
            return StringType(), f"map of the recursive {vsource}"
        ktype, ksource = PROTO_TYPES.get(key.type, (StringType(), "string"))
        return MapType(next(nest.ids), ktype, next(nest.ids), vtype, value_required=True), f"map<{ksource}, {vsource}>"
    if fd.is_repeated:
        etype, esource = _proto_single(fd, nest, (*at, "element"))
        if etype is None:
            return StringType(), f"repeated recursive {esource}"
        return ListType(next(nest.ids), etype, element_required=True), f"repeated {esource}"
    ftype, source = _proto_single(fd, nest, at)
    return (StringType(), f"recursive {source}") if ftype is None else (ftype, source)


def _proto_single(fd: Any, nest: Nest, at: Path) -> tuple[IcebergType | None, str]:
    """The type of one value of ``fd`` (an element, for a repeated field); None for a recursive message."""
    msg = fd.message_type
    if msg is None:
        return PROTO_TYPES.get(fd.type, (StringType(), f"type {fd.type}"))
    source = f"message {msg.full_name}"
    if msg.full_name == "google.protobuf.Timestamp":  # the converter reads it as ISO 8601 text
        return TimestamptzType(), source
    if _cyclic_message(msg, nest):
        return None, source
    if not msg.fields:
        return StringType(), source  # an empty struct has no Parquet form: '{}' as text
    fields = [nest.field(at, f.name, proto_type(f, nest, (*at, f.name))[0], required=not _nullable(f), defaulted=True)
              for f in msg.fields]
    return StructType(*fields), source


def _nullable(fd: Any) -> bool:
    """The decoder leaves an unset message field None; every other field has a value (its default)."""
    return fd.message_type is not None and not fd.is_repeated


def _cyclic_message(msg: Any, nest: Nest) -> bool:
    """Whether ``msg`` contains itself, through any chain of message fields (map values and lists too)."""
    name = msg.full_name
    if name not in nest._cyclic:
        todo, seen = [f.message_type for f in msg.fields if f.message_type is not None], set()
        while todo:
            m = todo.pop()
            if m.full_name not in seen:
                seen.add(m.full_name)
                todo.extend(f.message_type for f in m.fields if f.message_type is not None)
        nest._cyclic[name] = name in seen
    return nest._cyclic[name]
