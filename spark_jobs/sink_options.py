"""The ``eosink`` data source's options (strings, as Spark passes them) and its input columns.

Options mirror :func:`~eosink.spark_jobs.publisher.publish_outbox` (names are case-insensitive)::

    job                       required; [A-Za-z0-9._-]
    run_id                    batch writes only (required there): the idempotency key of the run
    topic                     one outbox topic, or
    outboxes                  JSON list of {"topic", "key", "value", "when", "headers"} (several outboxes,
                              one transaction per partition)
    key                       the key column of every outbox without its own "key"
    value                     the value column of ``topic`` (default: the column named "value")
    headers                   JSON object of constant extra headers
    kafka.bootstrap.servers   and any other kafka.<librdkafka setting> (the prefix is dropped)
    transaction_timeout_ms    default 120000 for a batch write, 30000 for a stream
    ledger_topic, connect_timeout_s, ledger_timeout_s

Unlike ``publish_outbox``, the data source cannot add columns to the plan it is given, so it sends
columns as they are, as Spark's own Kafka sink does: a value column must be string or binary (encode
in the query, e.g. ``to_json(struct(*)) AS value``, or call ``publish_outbox_stream``, which does it
in the JVM); a key column string, binary or integer (cast to its decimal string); a ``when`` column
boolean (null: false). Anything else is refused before a task starts, naming the option or column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs.errors import MissingColumnError
from eosink.spark_jobs.faults import from_option
from eosink.spark_jobs.naming import LEDGER_TOPIC, validate_name
from eosink.spark_jobs.outbox import CompiledOutbox
from eosink.spark_jobs.publisher import (
    DEFAULT_STREAM_TRANSACTION_TIMEOUT_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    encode_headers,
    producer_config,
)

SOURCE = "format('eosink')"
_BYTES = (StringType, BinaryType)
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


@dataclass(frozen=True)
class SinkSettings:
    """The options, checked against the DataFrame's schema; what the writers and their tasks need."""

    job: str
    run_id: str | None
    producer_config: dict[str, Any]
    outboxes: tuple[CompiledOutbox, ...]
    headers: tuple[tuple[str, bytes], ...]
    ledger_topic: str
    transaction_timeout_ms: int
    connect_timeout_s: float
    ledger_timeout_s: float
    #: Input columns whose integers are sent as their decimal strings (keys).
    cast_to_string: tuple[int, ...] = ()
    fault_hook: Any = field(default=None, compare=False)

    @property
    def topics(self) -> list[str]:
        return [ob.topic for ob in self.outboxes]


def parse(options: Mapping[str, str], schema: StructType, *, streaming: bool) -> SinkSettings:
    """The settings of one write; :class:`ConfigError` naming the option, :class:`MissingColumnError`
    naming the column."""
    opts = {k.lower(): v for k, v in options.items()}
    job = validate_name(_required(opts, "job"), "job")
    run_id = opts.get("run_id")
    if streaming and run_id is not None:
        raise ConfigError("a streaming write takes no run_id: each micro-batch's is made from the query id and its batch "
                          "id", key="run_id", source=SOURCE)
    if not streaming:
        run_id = validate_name(_required(opts, "run_id"), "run_id")
    kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
    if not kafka.get("bootstrap.servers"):
        raise ConfigError("option kafka.bootstrap.servers is required", key="kafka.bootstrap.servers", source=SOURCE)
    names = schema.fieldNames()
    outboxes, casts = [], set()
    for spec in _outbox_specs(opts):
        topic = spec.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"every outbox needs a topic, got {spec!r}", key="outboxes", source=SOURCE)
        key_col = _column(schema, spec.get("key") or opts.get("key"), "key", names)
        if not isinstance(schema[key_col].dataType, _BYTES):
            casts.add(names.index(key_col))
        value_col = _column(schema, spec.get("value") or "value", "value", names)
        when = spec.get("when")
        when_col = _column(schema, when, "when", names) if when is not None else None
        extra = spec.get("headers") or {}
        outboxes.append(CompiledOutbox(topic, names.index(key_col), names.index(value_col),
                                       names.index(when_col) if when_col is not None else None, encode_headers(extra)))
    default_timeout = DEFAULT_STREAM_TRANSACTION_TIMEOUT_MS if streaming else DEFAULT_TRANSACTION_TIMEOUT_MS
    return SinkSettings(
        job=job,
        run_id=run_id,
        producer_config=producer_config(kafka, streaming=streaming),
        outboxes=tuple(outboxes),
        headers=encode_headers(_json(opts, "headers", {})),
        ledger_topic=opts.get("ledger_topic", LEDGER_TOPIC),
        transaction_timeout_ms=_number(opts, "transaction_timeout_ms", default_timeout, int),
        connect_timeout_s=_number(opts, "connect_timeout_s", 15.0, float),
        ledger_timeout_s=_number(opts, "ledger_timeout_s", 60.0, float),
        cast_to_string=tuple(sorted(casts)),
        fault_hook=from_option(opts["fault_hook"]) if opts.get("fault_hook") else None,
    )


def adapt(batches: Any, cast_to_string: tuple[int, ...]) -> Any:
    """The input batches with integer key columns as strings (the produce loops take bytes and strings)."""
    if not cast_to_string:
        yield from batches
        return
    for batch in batches:
        cols = list(batch.columns)
        for i in cast_to_string:
            cols[i] = cols[i].cast(pa.string())
        yield pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


def _outbox_specs(opts: Mapping[str, str]) -> list[dict[str, Any]]:
    if "outboxes" in opts and "topic" in opts:
        raise ConfigError("give either topic or outboxes, not both", key="outboxes", source=SOURCE)
    if "outboxes" in opts:
        specs = _json(opts, "outboxes", None)
        if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
            raise ConfigError('outboxes must be a JSON list of objects like {"topic": "t", "key": "k", "value": "v"}',
                              key="outboxes", source=SOURCE)
        return specs
    return [{"topic": _required(opts, "topic"), "value": opts.get("value")}]


def _column(schema: StructType, name: Any, role: str, names: list[str]) -> str:
    if not isinstance(name, str) or name not in names:
        raise MissingColumnError(name if isinstance(name, str) else "(none given)", names, role=role)
    dtype: DataType = schema[name].dataType
    allowed: tuple[type, ...] = {"key": _BYTES + _INTEGERS, "value": _BYTES, "when": (BooleanType,)}[role]
    if not isinstance(dtype, allowed):
        wanted = {"key": "string, binary or integer", "value": "string or binary", "when": "boolean"}[role]
        hint = (" (encode it in the query, e.g. to_json(struct(...)), or use publish_outbox_stream, which does)"
                if role == "value" else "")
        raise ConfigError(f"{role} column '{name}' is {dtype.simpleString()}; the eosink sink sends a {wanted} column "
                          f"as it is{hint}", key=role, source=SOURCE)
    return name


def _required(opts: Mapping[str, str], name: str) -> str:
    value = opts.get(name)
    if not value:
        raise ConfigError(f"option {name} is required", key=name, source=SOURCE)
    return value


def _json(opts: Mapping[str, str], name: str, default: Any) -> Any:
    if name not in opts:
        return default
    try:
        return json.loads(opts[name])
    except ValueError as e:
        raise ConfigError(f"option {name} is not JSON: {e}", key=name, source=SOURCE) from None


def _number(opts: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    if name not in opts:
        return default
    try:
        return kind(opts[name])
    except ValueError:
        raise ConfigError(f"option {name} must be a number, got {opts[name]!r}", key=name, source=SOURCE) from None
