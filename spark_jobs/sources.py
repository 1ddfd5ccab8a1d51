"""Reading job inputs: Parquet, CSV or JSON paths, or a Kafka topic read with read_committed.

A Kafka source is named ``kafka:<topic>`` and read as a *batch* (earliest to latest offsets at
start; :func:`read_kafka_stream` reads it as a stream) with ``kafka.isolation.level=read_committed``,
so records of open or aborted transactions (an upstream eosink publisher's, for instance) never
enter a job. It needs the spark-sql-kafka jar
(``build_session(kafka_jars=True)``). The record value is JSON parsed with ``schema``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from eosink.connectors.api.errors import ConfigError

FORMATS = ("parquet", "csv", "json")


def infer_format(path: str) -> str:
    p = Path(path)
    candidates = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith((".", "_")))
    for q in candidates:
        suffix = q.suffix.lower().lstrip(".")
        if suffix in FORMATS:
            return suffix
        if suffix in ("jsonl", "ndjson"):
            return "json"
    raise ConfigError(f"cannot tell the format of {path!r}; pass fmt= one of {FORMATS}", key="source")


def read_kafka(spark: SparkSession, bootstrap: str, topic: str, schema: StructType) -> DataFrame:
    """The topic's committed records, value JSON parsed with ``schema`` (plus ``_kafka_*`` columns)."""
    raw = _committed(spark.read.format("kafka"), bootstrap, topic).option("endingOffsets", "latest").load()
    return _parsed(raw, schema)


def _committed(reader: Any, bootstrap: str, topic: str) -> Any:
    """A batch or stream reader of ``topic`` from its earliest offset, read_committed."""
    return (reader.option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed"))


def _parsed(raw: DataFrame, schema: StructType) -> DataFrame:
    parsed = F.from_json(F.col("value").cast("string"), schema)
    return raw.select(
        parsed.alias("v"),
        F.col("partition").alias("_kafka_partition"),
        F.col("offset").alias("_kafka_offset"),
    ).select("v.*", "_kafka_partition", "_kafka_offset")


def read_kafka_stream(spark: SparkSession, bootstrap: str, topic: str, schema: StructType,
                      max_offsets_per_trigger: int | None = None) -> DataFrame:
    """The topic as a stream of its committed records (from the earliest offset; a checkpoint resumes
    where it stopped), value JSON parsed with ``schema`` (plus ``_kafka_*`` columns)."""
    reader = _committed(spark.readStream.format("kafka"), bootstrap, topic)
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets_per_trigger)
    return _parsed(reader.load(), schema)


def read_source(
    spark: SparkSession,
    source: str,
    schema: StructType,
    *,
    fmt: str | None = None,
    bootstrap: str | None = None,
) -> DataFrame:
    """``source`` is a path (format from ``fmt`` or the file suffix) or ``kafka:<topic>``."""
    if source.startswith("kafka:"):
        if not bootstrap:
            raise ConfigError("reading a Kafka topic needs the bootstrap servers", key="bootstrap")
        return read_kafka(spark, bootstrap, source[len("kafka:") :], schema)
    fmt = fmt or infer_format(source)
    if fmt == "parquet":
        return spark.read.schema(schema).parquet(source)
    if fmt == "csv":
        return spark.read.schema(schema).option("header", "true").csv(source)
    if fmt == "json":
        return spark.read.schema(schema).json(source)
    raise ConfigError(f"unknown format {fmt!r}; one of {FORMATS}", key="fmt")
