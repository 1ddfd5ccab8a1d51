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
* **The schema id** comes from the registry once per driver process and schema: looked up under the
  subject (``<topic>-value``, Confluent's TopicNameStrategy), registered when absent (the registry's
  compatibility rule decides; a refusal names the subject and carries the registry's message). Ids
  never change for a given schema, so a streaming query asks once, not every micro-batch.
* **The bytes** are made by Spark's ``to_avro`` (package ``spark-avro``) with the 5-byte header
  prepended by ``concat``: no Python code runs per row, and the tasks receive a plain binary column
  as for JSON, so the transaction, the ledger and the C produce loop are the same.
"""

from __future__ import annotations

import json
import re
import threading
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
from eosink.spark_jobs.errors import RegistryUnreachableError, SchemaRejectedError, UnsupportedTypeError

FORMATS = ("json", "avro")
#: The keys of a ``registry=`` mapping: Kafka Connect's converter keys (without ``value.converter.``).
REGISTRY_KEYS = ("schema.registry.url", "basic.auth.credentials.source", "basic.auth.user.info")
#: Where the record's name lives; the name itself is the topic's (Avro compatibility compares full names).
NAMESPACE = "eosink.outbox"
MAGIC = b"\x00"

_PRIMITIVES: dict[type[DataType], Any] = {
    BooleanType: "boolean", ByteType: "int", ShortType: "int", IntegerType: "int", LongType: "long",
    FloatType: "float", DoubleType: "double", StringType: "string", BinaryType: "bytes", NullType: "null",
    DateType: {"type": "int", "logicalType": "date"},
    TimestampType: {"type": "long", "logicalType": "timestamp-micros"},
    TimestampNTZType: {"type": "long", "logicalType": "local-timestamp-micros"},
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_ids: dict[tuple[str, str, str], int] = {}
_ids_lock = threading.Lock()


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


def registry_config(registry: str | Mapping[str, str] | None, topic: str) -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` config from ``Outbox(registry=...)``: a URL, or a mapping of
    Connect's keys (``schema.registry.url``, ``basic.auth.credentials.source``, ``basic.auth.user.info``)."""
    from eosink.worker.engine.registry_converters import client_config

    settings: Mapping[str, str] = {"schema.registry.url": registry} if isinstance(registry, str) else (registry or {})
    unknown = sorted(set(settings) - set(REGISTRY_KEYS))
    if unknown:
        raise ConfigError(f"Outbox('{topic}', registry=...) has unknown key(s) {', '.join(unknown)}; the keys are "
                          f"{', '.join(REGISTRY_KEYS)}", key="registry", source="publish_outbox")
    url = str(settings.get("schema.registry.url") or "").rstrip("/")
    if not url:
        raise ConfigError(f"Outbox('{topic}', format='avro') needs registry= (the schema.registry.url of a schema "
                          "registry with Confluent's API, or a mapping holding it)", key="registry",
                          source="publish_outbox")
    return client_config(url, settings)


def schema_id(conf: Mapping[str, Any], subject: str, schema: str, timeout_s: float = 10.0) -> int:
    """The id of ``schema`` under ``subject``: looked up, registered when absent; cached per process."""
    url = str(conf["url"])
    cache_key = (url, subject, schema)
    with _ids_lock:
        if cache_key in _ids:
            return _ids[cache_key]
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        client = SchemaRegistryClient({**conf, "timeout": timeout_s, "max.retries": 1})
    except ValueError as exc:  # credentials both in the URL and in basic.auth.user.info, or no ':' in them
        raise ConfigError(f"the schema registry settings are not usable: {exc}", key="registry",
                          source="publish_outbox") from None
    avro = Schema(schema, "AVRO")
    try:
        try:
            found = client.lookup_schema(subject, avro).schema_id
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:  # 40401 no such subject, 40403 not under it: register it
                raise
            found = client.register_schema(subject, avro)
    except SchemaRegistryError as exc:
        if exc.http_status_code >= 500:
            raise RegistryUnreachableError(url, f"HTTP {exc.http_status_code}: {exc.error_message}") from None
        raise SchemaRejectedError(subject, url, f"HTTP {exc.http_status_code} (error code {exc.error_code}): "
                                                f"{exc.error_message}") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, timeout, DNS: the registry is not reachable
        raise RegistryUnreachableError(url, f"{type(exc).__name__}: {exc}") from None
    if found is None:
        raise SchemaRejectedError(subject, url, "the registry answered without a schema id")
    with _ids_lock:
        _ids[cache_key] = int(found)
    return int(found)


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
    return F.concat(F.lit(MAGIC + sid.to_bytes(4, "big")), encoded)
