"""JSON Schema values in Confluent's wire format: the schema from the DataFrame, the JSON made in the JVM.

An ``Outbox(format="json-schema")`` value is ``0x00``, the 4-byte big-endian schema id, then the JSON
text of the row's value columns: what confluent-kafka's ``JSONDeserializer``, Kafka Connect's
``JsonSchemaConverter`` and eosink's own registry converter read (JSON Schema, unlike Protobuf, has
no message indexes after the id). Why each step is where it is:

* **The schema** (draft-07) is derived on the driver from the Catalyst type of the value struct
  (:func:`json_schema`), so that every value Spark's ``to_json`` writes for that type validates:
  integers ``integer``, floating point ``number``, a timestamp a ``string`` of ``format: date-time``
  (written with its offset and to the microsecond, Spark's own resolution), a date ``format: date``,
  binary a base64 ``string``, a struct an ``object`` with ``additionalProperties: false``, an array
  ``array``, a map with string keys an ``object`` of ``additionalProperties``. A non-nullable column is
  ``required``; a nullable one is typed with ``null`` too and not required, so that a new nullable
  column is a BACKWARD-compatible change (an optional property added to a closed content model).
  A decimal is refused, naming the column: JSON Schema has no exact decimal, and a ``number`` would
  type a sink's column as a double. A type with no JSON mapping is refused too.
* **The schema id**: :mod:`eosink.spark_jobs.registry`, as for Avro (schema type ``JSON``).
* **The bytes** are ``to_json`` of the struct with the 5-byte header prepended by ``concat``: no
  Python code runs per row, and the tasks receive a plain binary column as for JSON.

A NaN or an infinite double is written by ``to_json`` as a string, which the schema refuses: a reader
that validates (the worker does) treats that record as bad input (its dead-letter queue, or a failed
task naming it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eosink.spark_jobs.errors import UnsupportedTypeError
from eosink.spark_jobs.registry import header, registry_config, schema_id

DRAFT = "http://json-schema.org/draft-07/schema#"
#: ``to_json`` options of a JSON Schema outbox: nulls written (as for JSON outboxes), timestamps to the
#: microsecond with their offset (RFC 3339, what ``format: date-time`` means), local ones to the microsecond.
JSON_OPTIONS = {"ignoreNullFields": "false", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS", "dateFormat": "yyyy-MM-dd"}

_PRIMITIVES: dict[type[T.DataType], dict[str, Any]] = {
    T.BooleanType: {"type": "boolean"}, T.ByteType: {"type": "integer"}, T.ShortType: {"type": "integer"},
    T.IntegerType: {"type": "integer"}, T.LongType: {"type": "integer"}, T.FloatType: {"type": "number"},
    T.DoubleType: {"type": "number"}, T.StringType: {"type": "string"}, T.NullType: {"type": "null"},
    T.BinaryType: {"type": "string", "contentEncoding": "base64"},
    T.DateType: {"type": "string", "format": "date"},
    T.TimestampType: {"type": "string", "format": "date-time"},
    T.TimestampNTZType: {"type": "string"},
}


def json_schema(struct: T.StructType, title: str) -> dict[str, Any]:
    """The JSON Schema document of the value struct, titled after the topic."""
    return {"$schema": DRAFT, "title": title, **_object(struct, "")}


def _object(struct: T.StructType, path: str) -> dict[str, Any]:
    properties = {f.name: _type(f.dataType, f.nullable, f"{path}{f.name}") for f in struct.fields}
    required = [f.name for f in struct.fields if not f.nullable]
    return {"type": "object", "properties": properties, **({"required": required} if required else {}),
            "additionalProperties": False}


def _type(dtype: T.DataType, nullable: bool, column: str) -> dict[str, Any]:
    schema = _non_null(dtype, column)
    if not nullable or schema.get("type") == "null":
        return schema
    return {**schema, "type": [schema["type"], "null"]}


def _non_null(dtype: T.DataType, column: str) -> dict[str, Any]:
    if type(dtype) in _PRIMITIVES:
        return dict(_PRIMITIVES[type(dtype)])
    if isinstance(dtype, T.DecimalType):
        raise UnsupportedTypeError(column, f"JSON Schema has no exact decimal for {dtype.simpleString()} (cast it to "
                                           "string for its exact text or to double, or use format='avro', whose "
                                           "decimal keeps precision and scale)")
    if isinstance(dtype, T.StructType):
        return _object(dtype, f"{column}.")
    if isinstance(dtype, T.ArrayType):
        return {"type": "array", "items": _type(dtype.elementType, dtype.containsNull, f"{column}[]")}
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, T.StringType):
            raise UnsupportedTypeError(column, f"a JSON object has string keys, this map has {dtype.keyType.simpleString()} "
                                               "keys (cast them to string, or use an array of structs)")
        return {"type": "object", "additionalProperties": _type(dtype.valueType, dtype.valueContainsNull,
                                                                f"{column}{{}}")}
    raise UnsupportedTypeError(column, f"Spark type {dtype.simpleString()} has no JSON Schema mapping (cast it in "
                                       "the query: e.g. to string, or to a number of units)")


def json_schema_value(value: Column, struct: T.StructType, topic: str, registry: str | Mapping[str, str] | None,
                      subject: str | None) -> Column:
    """The value column of a JSON Schema outbox: Confluent's 5-byte header + ``to_json`` of the value struct."""
    schema = json.dumps(json_schema(struct, topic), separators=(",", ":"))
    sid = schema_id(registry_config(registry, topic, "json-schema"), subject or f"{topic}-value", schema, "JSON")
    return F.concat(F.lit(header(sid)), F.to_json(value, JSON_OPTIONS).cast("binary"))
