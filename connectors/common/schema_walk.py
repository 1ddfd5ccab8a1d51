"""Walking a registered schema's top-level fields, for every sink that types a table from it.

The PostgreSQL sink (:mod:`eosink.connectors.postgres.schema_types`) and the Iceberg sink
(:mod:`eosink.connectors.iceberg.schema_types`) map the same fields to different column types; what a
field *is* - its type with named types resolved, whether it may be null, whether it has a default -
is read here once, so both sinks agree on nullability and on which schemas they type at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.schemas import WriterSchema

#: How deep named Avro types are followed (a recursive type would otherwise never end).
MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class SchemaField:
    """One top-level field of a record schema."""

    name: str
    #: Avro: the type without its ``null`` branch (a list for a union of several other types);
    #: JSON Schema: the property's schema; Protobuf: the ``FieldDescriptorProto``.
    type: Any
    #: The field may be null (a union with null, a JSON Schema field not required or typed null,
    #: a Protobuf message field).
    nullable: bool
    #: The field has a default: a writer of an older version did not write it, a reader gets the default.
    defaulted: bool


@dataclass(frozen=True, slots=True)
class RecordFields:
    """The fields of a schema a sink types columns from, with what resolving them needs."""

    format: str
    fields: list[SchemaField]
    #: Avro: every named type (record, enum, fixed) the schema defines, by full and short name.
    named: Mapping[str, Any]
    #: JSON Schema: the whole document (what a ``$ref`` points into); Protobuf: the message's ``Descriptor``
    #: in the converter's pool (its nested and imported message types resolved), None when not at hand.
    root: Any = None


def record_fields(schema: WriterSchema) -> RecordFields | None:
    """The top-level fields of an Avro record, a JSON Schema object with properties, or the only
    top-level message of a Protobuf schema; None for any other schema, whose values stay typed as JSON
    (with several Protobuf messages, the one a record holds is told by its own indexes)."""
    if schema.format == "avro":
        doc = schema.document
        if not isinstance(doc, dict) or doc.get("type") != "record":
            return None
        named: dict[str, Any] = {}
        avro_names(doc, doc.get("namespace"), named)
        return RecordFields("avro", [_avro_field(f) for f in doc.get("fields", ())], named)
    if schema.format == "jsonschema":
        doc = schema.document
        if not isinstance(doc, dict) or doc.get("type") != "object" or not isinstance(doc.get("properties"), dict):
            return None
        required = set(doc.get("required") or ())
        return RecordFields("jsonschema", list(_json_fields(doc["properties"], required)), {}, doc)
    if schema.format == "protobuf" and schema.parsed is not None and len(schema.parsed.message_type) == 1:
        # Every proto3 field has a value in the decoded record (its default when unset), but a message field.
        top = schema.parsed.message_type[0]
        fields = [SchemaField(f.name, f, f.type == 11 and f.label != 3, f.label != 2) for f in top.field]
        found = schema.descriptor.message_types_by_name.get(top.name) if schema.descriptor is not None else None
        return RecordFields("protobuf", fields, {}, found)
    return None


def _avro_field(f: Mapping[str, Any]) -> SchemaField:
    t, nullable = avro_unwrap(f.get("type"))
    return SchemaField(f["name"], t, nullable, "default" in f)


def avro_unwrap(t: Any) -> tuple[Any, bool]:
    """An Avro type without its ``null`` branch, and whether it had one; a union of several other types
    stays a list, a union of ``null`` alone becomes ``"null"``."""
    if not isinstance(t, list):
        return t, t == "null"
    branches = [b for b in t if b != "null"]
    nullable = len(branches) < len(t)
    return (branches[0] if len(branches) == 1 else (branches or "null")), nullable


def avro_resolve(t: Any, named: Mapping[str, Any], depth: int = 0) -> Any:
    """A type named by reference (``"Money"``, ``"shop.Money"``) as its definition; any other as it is."""
    while isinstance(t, str) and t in named and depth < MAX_DEPTH:
        t, depth = named[t], depth + 1
    return t


def avro_names(t: Any, namespace: str | None, named: dict[str, Any]) -> None:
    """Every named type (record, enum, fixed) defined in ``t``, by full and short name: fields may refer to them."""
    if isinstance(t, list):
        for branch in t:
            avro_names(branch, namespace, named)
    elif isinstance(t, dict):
        kind = t.get("type")
        if kind in ("record", "error", "enum", "fixed") and isinstance(t.get("name"), str):
            ns = t.get("namespace", namespace)
            short = t["name"].rsplit(".", 1)[-1]
            named[short] = t
            named[t["name"] if "." in t["name"] or not ns else f"{ns}.{t['name']}"] = t
            namespace = ns
        for f in t.get("fields", ()) if kind in ("record", "error") else ():
            avro_names(f.get("type"), namespace, named)
        for inner in ("items", "values"):
            if inner in t:
                avro_names(t[inner], namespace, named)
        if isinstance(kind, (dict, list)):
            avro_names(kind, namespace, named)


def _json_fields(properties: Mapping[str, Any], required: set[str]) -> Iterator[SchemaField]:
    for name, sub in properties.items():
        sub = sub if isinstance(sub, dict) else {}
        kinds = json_kinds(sub)
        nullable = "null" in kinds or name not in required
        yield SchemaField(name, sub, nullable, "default" in sub)


def json_kinds(sub: Mapping[str, Any]) -> list[str]:
    """The JSON Schema ``type`` of a property as a list (``null`` included, if there)."""
    kinds = sub.get("type")
    return [kinds] if isinstance(kinds, str) else list(kinds or [])


def json_source(sub: Mapping[str, Any]) -> str:
    """How a message names a JSON Schema property's type: ``string (date-time)``, ``integer``, ``any``."""
    kinds = [k for k in json_kinds(sub) if k != "null"]
    return "/".join(kinds) + (f" ({sub['format']})" if sub.get("format") else "") if kinds else "any"


def incompatible(schema: WriterSchema, topic: str, before: WriterSchema | None, target: str,
                 conflicts: Iterable[tuple[str, str]], alter: str) -> str:
    """Why a task stops at a schema version its table cannot take: the subject and both versions (the one the
    table matched: ``before``, else the version registered before), every conflicting field, and what to do."""
    subject = f"{topic}-value"
    old = before.describe(subject) if before is not None and before is not schema else schema.previous(subject)
    since = f" (the table matched {old})" if old else ""
    return (f"{schema.describe(subject)} of topic {topic} is incompatible with {target}{since}: "
            + "; ".join(why for _, why in conflicts)
            + f". {alter}, or register a compatible version; the task resumes from the same record once restarted")
