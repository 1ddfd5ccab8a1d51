"""Avro values in Confluent's wire format: the schema from the DataFrame, registered once, encoded in the JVM.

An ``Outbox(format="avro")`` value is ``0x00``, the 4-byte big-endian schema id, then the Avro binary
of the row's value columns: what confluent-kafka's ``AvroDeserializer``, Kafka Connect's
``AvroConverter`` and eosink's own registry converter read. The three steps and why each is where it is:

* **The schema** is derived on the driver from the Catalyst type of the value struct
  (:func:`avro_schema`), so it is exactly what Spark's ``to_avro`` can write for it: a nullable column
  becomes a union with ``null`` (default ``null``), a decimal ``bytes`` with the ``decimal`` logical
  type and its precision and scale, a timestamp ``long`` ``timestamp-micros`` (Spark's own
  resolution, so nothing is rounded). A type with no Avro mapping is refused before anything else
  happens, naming the column.
* **The schema id** comes from the registry once per driver process and schema
  (:mod:`eosink.spark_jobs.registry`).
* **The bytes** are made by Spark's ``to_avro`` (package ``spark-avro``) with the 5-byte header
  prepended by ``concat``: no Python code runs per row, and the tasks receive a plain binary column
  as for JSON, so the transaction, the ledger and the C produce loop are the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs.errors import UnsupportedTypeError
from eosink.spark_jobs.registry import header, registry_config, schema_id

#: Where the record's name lives; the name itself is the topic's (Avro compatibility compares full names).
NAMESPACE = "eosink.outbox"

_PRIMITIVES: dict[type[DataType], Any] = {
    BooleanType: "boolean", ByteType: "int", ShortType: "int", IntegerType: "int", LongType: "long",
    FloatType: "float", DoubleType: "double", StringType: "string", BinaryType: "bytes", NullType: "null",
    DateType: {"type": "int", "logicalType": "date"},
    TimestampType: {"type": "long", "logicalType": "timestamp-micros"},
    TimestampNTZType: {"type": "long", "logicalType": "local-timestamp-micros"},
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def record_name(topic: str) -> str:
    """The topic as an Avro name: other characters become ``_``, a leading digit gets a ``_`` before it."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", topic)
    return name if _NAME.fullmatch(name) else f"_{name}"


def avro_schema(struct: StructType, name: str) -> dict[str, Any]:
    """The Avro record for the value struct; nested records are named after their path (names must be unique)."""
    return _record(struct, name, NAMESPACE, "")


def _record(struct: StructType, name: str, namespace: str, path: str) -> dict[str, Any]:
    fields = []
    for f in struct.fields:
        column = f"{path}{f.name}"
        if not _NAME.fullmatch(f.name):
            raise UnsupportedTypeError(column, "an Avro field name is [A-Za-z_][A-Za-z0-9_]*; rename the column")
        avro = _type(f.dataType, f.nullable, f.name, f"{namespace}.{name}", column)
        fields.append({"name": f.name, "type": avro, **({"default": None} if isinstance(avro, list) else {})})
    return {"type": "record", "name": name, "namespace": namespace, "fields": fields}


def _type(dtype: DataType, nullable: bool, name: str, namespace: str, column: str) -> Any:
    avro = _non_null(dtype, name, namespace, column)
    return ["null", avro] if nullable and avro != "null" else avro


def _non_null(dtype: DataType, name: str, namespace: str, column: str) -> Any:
    if type(dtype) in _PRIMITIVES:
        return _PRIMITIVES[type(dtype)]
    if isinstance(dtype, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dtype.precision, "scale": dtype.scale}
    if isinstance(dtype, StructType):
        return _record(dtype, name, namespace, f"{column}.")
    if isinstance(dtype, ArrayType):
        return {"type": "array", "items": _type(dtype.elementType, dtype.containsNull, f"{name}_item", namespace,
                                                f"{column}[]")}
    if isinstance(dtype, MapType):
        if not isinstance(dtype.keyType, StringType):
            raise UnsupportedTypeError(column, f"an Avro map has string keys, this one has {dtype.keyType.simpleString()} "
                                               "keys (cast them to string, or use an array of structs)")
        return {"type": "map", "values": _type(dtype.valueType, dtype.valueContainsNull, f"{name}_value", namespace,
                                               f"{column}{{}}")}
    raise UnsupportedTypeError(column, f"Spark type {dtype.simpleString()} has no Avro mapping (cast it in the "
                                       "query: e.g. to string, or to a number of units)")


def avro_value(value: Column, struct: StructType, topic: str, registry: str | Mapping[str, str] | None,
               subject: str | None) -> Column:
    """The value column of an Avro outbox: Confluent's 5-byte header + ``to_avro`` of the value struct."""
    schema = json.dumps(avro_schema(struct, record_name(topic)), separators=(",", ":"))
    sid = schema_id(registry_config(registry, topic), subject or f"{topic}-value", schema)
    try:
        from pyspark.sql.avro.functions import to_avro

        encoded = to_avro(value, schema)
    except TypeError as exc:  # py4j: 'JavaPackage' object is not callable - the class is not on the classpath
        raise ConfigError(f"Outbox('{topic}', format='avro') needs Spark's spark-avro package on the classpath "
                          "(build_session(kafka_jars=True), or spark.jars / --packages "
                          f"org.apache.spark:spark-avro_2.13): {exc}", key="format", source="publish_outbox") from None
    return F.concat(F.lit(header(sid)), encoded)
