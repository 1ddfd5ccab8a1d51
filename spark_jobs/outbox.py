"""What goes to which outbox topic, and the DataFrame projection the tasks consume.

The encoding work (key to utf-8 bytes, row to JSON, or to Avro or JSON Schema in Confluent's wire
format) is done by Spark's JVM (``to_json``, ``to_avro``: :mod:`eosink.spark_jobs.avro`,
:mod:`eosink.spark_jobs.json_schema`) before the data reaches Python,
and the Python side receives plain Arrow binary columns through ``mapInArrow``:
per record it only calls ``Producer.produce``. That is the fast path; there is no per-row Python
serialisation, no ``Row`` objects and no pickling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs.avro import avro_value
from eosink.spark_jobs.errors import MissingColumnError
from eosink.spark_jobs.json_schema import json_schema_value

#: An outbox's value format: JSON, or a Schema Registry format in Confluent's wire format.
FORMATS = ("json", "avro", "json-schema")
_REGISTRY_FORMATS = {"avro": avro_value, "json-schema": json_schema_value}

# Nulls are written as JSON null rather than dropped: sinks see the same fields in every record.
JSON_OPTIONS = {"ignoreNullFields": "false"}


@dataclass(frozen=True)
class Outbox:
    """One outbox topic of a publish; several of them share one transaction per partition.

    * ``key``: column whose value (as a utf-8 string) is the record key; ``None`` uses the
      ``key=`` of :func:`publish_outbox`.
    * ``value``: ``None`` = JSON object of all columns of the row; a list of names = JSON object of
      those columns; one name = that column as it is when it is a string or binary column
      (pre-encoded, the fastest path), JSON when it is a struct, map or array, else ``{name: value}``.
    * ``when``: a boolean column; only rows where it is true go to this topic (e.g. alerts only for
      high balances). Rows where it is false or null are skipped.
    * ``headers``: constant extra headers for every record of this topic.
    * ``format``: ``"json"`` (above), ``"avro"`` or ``"json-schema"``: the same columns as an Avro record
      or a JSON object in Confluent's wire format (a struct column passed alone is the record itself; a
      single other column a record of one field), its schema derived from the columns and registered
      under ``subject``.
    * ``registry``: with ``format="avro"`` or ``"json-schema"``, the schema registry: its URL (``schema.registry.url``) or a
      mapping of Connect's keys ``schema.registry.url``, ``basic.auth.credentials.source``,
      ``basic.auth.user.info``.
    * ``subject``: the registry subject; ``None`` = ``<topic>-value`` (Confluent's TopicNameStrategy).
    """

    topic: str
    key: str | None = None
    value: str | Sequence[str] | None = None
    when: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    format: str = "json"
    registry: str | Mapping[str, str] | None = None
    subject: str | None = None


@dataclass(frozen=True)
class CompiledOutbox:
    """An :class:`Outbox` resolved against the projected columns (what the task needs)."""

    topic: str
    key_col: int
    value_col: int
    when_col: int | None
    headers: tuple[tuple[str, bytes], ...]


def _require(df: DataFrame, name: str, role: str) -> None:
    if name not in df.columns:
        raise MissingColumnError(name, list(df.columns), role=role)


def _value_expr(df: DataFrame, ob: Outbox) -> Column:
    if ob.format not in FORMATS:
        raise ConfigError(f"Outbox('{ob.topic}', format={ob.format!r}): one of {', '.join(FORMATS)}", key="format",
                          source="publish_outbox")
    encode = _REGISTRY_FORMATS.get(ob.format)
    if encode is not None:
        struct, struct_type = _value_struct(df, ob)
        return encode(struct, struct_type, ob.topic, ob.registry, ob.subject)
    if ob.registry is not None or ob.subject is not None:
        raise ConfigError(f"Outbox('{ob.topic}') has registry= or subject= but writes JSON: add format='avro' or "
                          "format='json-schema'", key="format", source="publish_outbox")
    return _json_expr(df, ob.value)


def _value_struct(df: DataFrame, ob: Outbox) -> tuple[Column, StructType]:
    """The value as a struct (nullable fields stay nullable) and its Catalyst type, read from the plan."""
    value = ob.value
    if value is None:
        struct = F.struct(*[df[c] for c in df.columns])
    elif isinstance(value, str):
        _require(df, value, "value")
        dtype = df.schema[value].dataType
        struct = (F.struct(*[df[value][f.name].alias(f.name) for f in dtype.fields]) if isinstance(dtype, StructType)
                  else F.struct(df[value]))
    else:
        for c in value:
            _require(df, c, "value")
        struct = F.struct(*[df[c] for c in value])
    struct_type = df.select(struct.alias("v")).schema["v"].dataType
    assert isinstance(struct_type, StructType)
    return struct, struct_type


def _json_expr(df: DataFrame, value: str | Sequence[str] | None) -> Column:
    if value is None:
        return F.to_json(F.struct(*[df[c] for c in df.columns]), JSON_OPTIONS).cast("binary")
    if isinstance(value, str):
        _require(df, value, "value")
        dtype = df.schema[value].dataType
        if isinstance(dtype, (StringType, BinaryType)):
            return df[value].cast("binary")
        if isinstance(dtype, (StructType, MapType, ArrayType)):
            return F.to_json(df[value], JSON_OPTIONS).cast("binary")
        return F.to_json(F.struct(df[value]), JSON_OPTIONS).cast("binary")
    names = list(value)
    for c in names:
        _require(df, c, "value")
    return F.to_json(F.struct(*[df[c] for c in names]), JSON_OPTIONS).cast("binary")


def normalize(topic: str | Outbox | Sequence[str | Outbox]) -> list[Outbox]:
    """``publish_outbox``'s ``topic`` argument as a list of :class:`Outbox`."""
    items = [topic] if isinstance(topic, (str, Outbox)) else list(topic)
    out = [Outbox(t) if isinstance(t, str) else t for t in items]
    if not out:
        raise ValueError("publish_outbox needs at least one outbox topic")
    return out


def project(df: DataFrame, outboxes: Sequence[Outbox], default_key: str | None) -> tuple[DataFrame, list[CompiledOutbox]]:
    """Validate the columns and build the ``key/value/when`` columns of every outbox.

    Raises :class:`MissingColumnError` (naming the column and listing the available ones) before
    anything touches Kafka.
    """
    exprs: list[Column] = []
    compiled: list[CompiledOutbox] = []
    for i, ob in enumerate(outboxes):
        key = ob.key or default_key
        if key is None:
            raise MissingColumnError("(none given)", list(df.columns), role="key")
        _require(df, key, "key")
        # utf-8 bytes made in the JVM: the task hands them to the client as they are
        exprs.append(df[key].cast("string").cast("binary").alias(f"__eo_k{i}"))
        exprs.append(_value_expr(df, ob).alias(f"__eo_v{i}"))
        if ob.when is not None:
            _require(df, ob.when, "when")
            exprs.append(F.coalesce(df[ob.when].cast("boolean"), F.lit(False)).alias(f"__eo_w{i}"))
        headers = tuple((k, v.encode() if isinstance(v, str) else bytes(v)) for k, v in ob.headers.items())
        compiled.append(CompiledOutbox(ob.topic, -1, -1, None, headers))
    projected = df.select(*exprs)
    names = projected.columns
    resolved = []
    for i, c in enumerate(compiled):
        when_name = f"__eo_w{i}"
        resolved.append(
            CompiledOutbox(
                topic=c.topic,
                key_col=names.index(f"__eo_k{i}"),
                value_col=names.index(f"__eo_v{i}"),
                when_col=names.index(when_name) if when_name in names else None,
                headers=c.headers,
            )
        )
    return projected, resolved


def repartition_by_key(df: DataFrame, partitions: int | None, key: str | None, outboxes: Sequence[Outbox]) -> DataFrame:
    """``df`` in ``partitions`` partitions by the hash of the key column (round robin without one): a split
    that depends on the rows only, which a resumed run or a replayed micro-batch must repeat."""
    if partitions is None:
        return df
    if partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}", key="partitions", source="publish_outbox")
    part_key = key or outboxes[0].key
    return (df.repartition(partitions, df[part_key]) if part_key is not None and part_key in df.columns
            else df.repartition(partitions))
