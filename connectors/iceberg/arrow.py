"""Records to Arrow for the Iceberg sink (:mod:`eosink.connectors.iceberg.sink`): schema inference, type checks.

Every check runs on the whole batch *before* a byte is written, so a record that does not fit
fails the prepare with a :class:`~eosink.connectors.api.errors.RecordError` naming its topic, partition,
offset and column, and leaves nothing behind.

Why the checks are ours and not pyarrow's: ``pa.array([1.5], pa.int64())`` silently truncates to
1 and ``pa.array([True], pa.float64())`` gives 1.0. A sink that promises exactly what was sent
cannot let either through, so number columns get their Python types checked first (one
``set(map(type, column))`` per column, C speed). String and boolean columns go straight to pyarrow,
which refuses every other Python type for them; only then is the column looked at in Python
(objects/arrays become JSON text, anything else is located and named).

Mapping of JSON values (``auto.create`` / ``auto.evolve``):

=================  ================  ==============================================
JSON               Iceberg           accepted later in that column
=================  ================  ==============================================
true/false         boolean           bool
integer            long              int (not bool)
number             double            int, float (not bool)
string             string            str; objects/arrays as their JSON text
object / array     string (JSON)     same as string
=================  ================  ==============================================

A column of another type (a table created by someone else: int, float, date, timestamp,
decimal, struct, list, ...) gets what pyarrow converts strictly: ints into int columns with a range
check, strings parsed into dates/timestamps/decimals, objects into structs.

Records read with a Schema Registry converter carry their writer's schema: their tables are typed
from it (:mod:`.schema_types`), and their values' text forms are turned back into the columns' types
first (``typed=True``, :mod:`.typed_values`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
)

from eosink.connectors.api.errors import ConfigError, RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.iceberg.typed_values import arrow_array, convert_column

COMPONENT = "iceberg"
#: Columns carrying the Kafka coordinates (``fields.kafka``).
KAFKA_FIELDS: tuple[tuple[str, IcebergType], ...] = (("__topic", StringType()), ("__partition", IntegerType()), ("__offset", LongType()))
KAFKA_NAMES = frozenset(n for n, _ in KAFKA_FIELDS)

_NONE = type(None)
_INFERRED: dict[type, IcebergType] = {bool: BooleanType(), int: LongType(), float: DoubleType(), str: StringType(),
                                      dict: StringType(), list: StringType()}
#: Python types a column of each simple Iceberg type takes (exact types: bool is not an int here).
_ALLOWED: dict[type, frozenset[type]] = {
    BooleanType: frozenset({bool, _NONE}),
    IntegerType: frozenset({int, _NONE}),
    LongType: frozenset({int, _NONE}),
    FloatType: frozenset({int, float, _NONE}),
    DoubleType: frozenset({int, float, _NONE}),
    StringType: frozenset({str, dict, list, _NONE}),
}
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: The integers pyarrow converts into a float column (it refuses those a float cannot hold exactly).
_EXACT: dict[type, tuple[int, int]] = {DoubleType: (-(2**53), 2**53), FloatType: (-(2**24), 2**24)}


def _json_text(v: Any) -> Any:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False) if type(v) in (dict, list) else v


def _type_name(t: type) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number", _NONE: "null"}
    return names.get(t, t.__name__)


def check_values(records: Sequence[SinkRecord]) -> list[dict[str, Any]]:
    """The decoded values, refusing anything that is not a JSON object (tombstones included)."""
    values = [r.value for r in records]
    if set(map(type, values)) != {dict}:
        for r, v in zip(records, values):
            if type(v) is not dict:
                what = "a null value (tombstone): deletes are not supported" if v is None else f"a JSON {_type_name(type(v))}"
                raise RecordError(f"value is {what}; the Iceberg sink needs a JSON object per record",
                                  topic=r.topic, partition=r.partition, offset=r.offset, component=COMPONENT)
    return values


def field_names(values: Sequence[dict[str, Any]]) -> set[str]:
    """Every key of every value (``set().union`` walks the dicts in C)."""
    return set().union(*values) if values else set()


def infer_fields(records: Sequence[SinkRecord], values: Sequence[dict[str, Any]], names: Sequence[str],
                 kafka: bool = True) -> list[tuple[str, IcebergType]]:
    """Iceberg types for new columns from the batch: a field null in every record gets no column.

    Integers and floats mixed in one field make a double; any other mix is refused on the first
    record whose type differs from the field's first non-null value.
    """
    out: list[tuple[str, IcebergType]] = []
    for name in names:
        if kafka and name in KAFKA_NAMES:
            r = records[next(i for i, v in enumerate(values) if name in v)]
            raise RecordError(f"field '{name}' collides with a Kafka coordinate column (set fields.kafka=false to use it)",
                              topic=r.topic, partition=r.partition, offset=r.offset, column=name, component=COMPONENT)
        col = [v.get(name) for v in values]
        kinds = set(map(type, col)) - {_NONE}
        if not kinds:
            continue
        if kinds <= {int, float}:
            out.append((name, DoubleType() if float in kinds else LongType()))
            continue
        first = next(type(x) for x in col if x is not None)
        expected = _INFERRED.get(first)
        if expected is None:  # pragma: no cover - decoded JSON has no other types
            raise AssertionError(first)
        allowed = _ALLOWED[type(expected)]
        for r, x in zip(records, col):
            if type(x) not in allowed:
                raise RecordError(f"is a JSON {_type_name(type(x))} but earlier records of the batch made it {expected}",
                                  topic=r.topic, partition=r.partition, offset=r.offset, column=name, component=COMPONENT)
        out.append((name, expected))
    return out


def all_fields_have_columns(table: pa.Table, values: Sequence[dict[str, Any]], kafka: bool) -> bool:
    """Whether every key of every value is a column of ``table``, the Arrow that :func:`to_arrow` made of them.

    Cheap when no value holds an explicit null: a non-null cell of a value column is a key present in
    its record, so as many non-null cells as keys in all the values leaves no key without a column
    (one C-level ``len`` per value). Otherwise the keys are compared (:func:`field_names`).
    """
    cells = sum(len(c) - c.null_count for name, c in zip(table.column_names, table.columns) if not (kafka and name in KAFKA_NAMES))
    return cells == sum(map(len, values)) or not field_names(values) - set(table.column_names)


def new_schema(fields: Sequence[tuple[str, IcebergType]], kafka: bool) -> Schema:
    """A schema for ``auto.create``: the value fields (optional), then the Kafka coordinates (required)."""
    cols = [NestedField(i + 1, n, t, required=False) for i, (n, t) in enumerate(fields)]
    if kafka:
        cols += [NestedField(len(cols) + i + 1, n, t, required=True) for i, (n, t) in enumerate(KAFKA_FIELDS)]
    return Schema(*cols)


_TRANSFORM = re.compile(r"^\s*(?:(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([^()\s,]+)\s*\)|([^()\s,]+))\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses: the config's LIST parser cut ``bucket(4, id)`` in two."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def check_partition_fields(specs: Sequence[str]) -> None:
    """Refuse at configuration time what would only fail at the first write.

    pyiceberg computes every transform but identity with the optional ``pyiceberg-core`` package.
    """
    for spec in _split_top_level(",".join(specs)):
        m = _TRANSFORM.match(spec)
        if not m:
            raise ConfigError(f"cannot parse partition field {spec!r}; use col, bucket(N, col), truncate(W, col), "
                              "year(col), month(col), day(col) or hour(col)", key="iceberg.partition.fields")
        if m.group(1):
            try:
                import pyiceberg_core  # noqa: F401
            except ImportError:
                raise ConfigError(f"{spec!r}: pyiceberg computes {m.group(1)}() partitions with the pyiceberg-core package, which "
                                  "is not installed (pip install 'pyiceberg[pyiceberg-core]'); identity partitions work without it",
                                  key="iceberg.partition.fields") from None


def partition_spec(specs: Sequence[str], schema: Schema) -> PartitionSpec:
    """``iceberg.partition.fields``: ``col``, ``bucket(16, col)``, ``truncate(4, col)``, ``day(col)``..."""
    fields: list[PartitionField] = []
    for i, spec in enumerate(_split_top_level(",".join(specs))):
        m = _TRANSFORM.match(spec)
        if not m:
            raise ConfigError(f"cannot parse partition field {spec!r}; use col, bucket(N, col), truncate(W, col), "
                              "year(col), month(col), day(col) or hour(col)", key="iceberg.partition.fields")
        fn, arg, col = (m.group(1), m.group(2), m.group(3)) if m.group(3) else (None, None, m.group(4))
        try:
            source = schema.find_field(col)
        except ValueError:
            raise ConfigError(f"partition source column {col!r} is not in the table's schema "
                              f"({', '.join(f.name for f in schema.fields)}); it must be a field of the records "
                              "(non-null in the first batch) or a Kafka coordinate", key="iceberg.partition.fields") from None
        transform: Transform[Any, Any]
        name = col
        if fn is None:
            transform = IdentityTransform()
        elif fn in ("bucket", "truncate") and arg:
            transform = BucketTransform(int(arg)) if fn == "bucket" else TruncateTransform(int(arg))
            name = f"{col}_{fn}"
        elif fn in ("year", "month", "day", "hour") and not arg:
            transform = {"year": YearTransform, "month": MonthTransform, "day": DayTransform, "hour": HourTransform}[fn]()
            name = f"{col}_{fn}"
        else:
            raise ConfigError(f"unknown partition transform in {spec!r}", key="iceberg.partition.fields")
        if not transform.can_transform(source.field_type):
            raise ConfigError(f"{spec!r}: {fn or 'identity'} cannot partition column {col!r} of type {source.field_type}",
                              key="iceberg.partition.fields")
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=name))
    return PartitionSpec(*fields)


def _locate(records: Sequence[SinkRecord], col: list[Any], name: str, message: str, bad: Any) -> RecordError:
    for r, x in zip(records, col):
        if bad(x):
            # replace(), not format(): the message may quote pyarrow errors that contain braces
            text = message.replace("{got}", _type_name(type(x))).replace("{value}", repr(x)[:60])
            return RecordError(text, topic=r.topic,
                               partition=r.partition, offset=r.offset, column=name, component=COMPONENT)
    raise AssertionError("no offending record found")  # pragma: no cover


def _unencodable(x: Any) -> bool:
    """A str UTF-8 cannot encode: JSON's escapes can spell a lone UTF-16 surrogate (``"\\ud800"``)."""
    if type(x) is not str:
        return False
    try:
        x.encode()
        return False
    except UnicodeEncodeError:
        return True


_STRICT = (StringType, BooleanType)  # pa.array refuses every other Python type for these: no pre-check needed


def _convert(records: Sequence[SinkRecord], col: list[Any], field: NestedField, arrow_type: pa.DataType) -> pa.Array:
    name, ftype = field.name, field.field_type
    if isinstance(ftype, _STRICT):
        # The common case, at C speed: pyarrow converts only str (bool) into a string (boolean)
        # array and raises for anything else, which then takes the checked path below.
        try:
            arr = pa.array(col, type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError):
            pass
        else:
            if field.required and arr.null_count:
                raise _locate(records, col, name, "is missing or null but the column is required", lambda x: x is None)
            return arr
    kinds = set(map(type, col))
    if field.required and _NONE in kinds:
        raise _locate(records, col, name, "is missing or null but the column is required", lambda x: x is None)
    allowed = _ALLOWED.get(type(ftype))
    if allowed is not None:
        if not kinds <= allowed:
            raise _locate(records, col, name, f"is a JSON {{got}} ({{value}}), which does not fit column type {ftype}",
                          lambda x: type(x) not in allowed)
        if isinstance(ftype, StringType) and (dict in kinds or list in kinds):
            col = [_json_text(x) for x in col]
        try:
            return pa.array(col, type=arrow_type)
        except UnicodeEncodeError:
            raise _locate(records, col, name, "{value} holds a lone UTF-16 surrogate, which has no UTF-8 encoding",
                          _unencodable) from None
        except (pa.ArrowInvalid, OverflowError):  # ints beyond the column's range: pyarrow checks them
            lo, hi = _INT32 if isinstance(ftype, IntegerType) else _EXACT.get(type(ftype), _INT64)
            raise _locate(records, col, name, f"value {{value}} is out of range for column type {ftype}",
                          lambda x: type(x) is int and not lo <= x <= hi) from None
    # Other column types (a table created elsewhere): pyarrow converts; strings are parsed.
    try:
        if kinds <= {str, _NONE} and not pa.types.is_string(arrow_type) and not pa.types.is_large_string(arrow_type):
            return pa.array(col, type=pa.string()).cast(arrow_type)
        return arrow_array(col, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
        def bad(x: Any) -> bool:
            try:
                if isinstance(x, str):
                    pa.array([x], type=pa.string()).cast(arrow_type)
                else:
                    arrow_array([x], arrow_type)
                return False
            except Exception:  # noqa: BLE001 - any failure marks the offending value
                return True

        raise _locate(records, col, name, f"{{value}} does not convert to column type {ftype} ({exc})", bad) from None


def kafka_column(field: NestedField, arrow_type: pa.DataType, records: Sequence[SinkRecord], topics: set[str]) -> pa.Array | None:
    """A Kafka coordinate column (``__topic``, ``__partition``, ``__offset``) of the types ``auto.create``
    makes, from the engine's own values (pyarrow's range check is all they need; one topic is one
    repeated value); None for another column type, which takes the checked conversion."""
    if not kafka_column_built(field):
        return None
    if field.name == "__topic":
        if len(topics) == 1:
            return pa.repeat(pa.scalar(next(iter(topics)), arrow_type), len(records))
        return pa.array([r.topic for r in records], type=arrow_type)
    return pa.array([r.partition for r in records] if field.name == "__partition" else [r.offset for r in records],
                    type=arrow_type)


def kafka_column_built(field: NestedField) -> bool:
    """Whether :func:`kafka_column` builds this coordinate column (its type is one ``auto.create`` makes)."""
    return isinstance(field.field_type, StringType if field.name == "__topic" else (IntegerType, LongType))


def to_arrow(schema: Schema, records: Sequence[SinkRecord], values: Sequence[dict[str, Any]], kafka: bool,
             unknown_ok: bool = False, topics: set[str] | None = None, typed: bool = False) -> pa.Table:
    """An Arrow table with exactly the table's columns, or a RecordError before anything is written.

    A value field the table has no column for is refused (``unknown_ok`` is for callers that
    evolved the schema and know every field has a column now). ``topics``: the batch's topics, when
    the caller already knows them (one topic is one repeated value, not a column built per record).
    ``typed``: the values are a Schema Registry converter's, whose text forms typed columns parse
    (:mod:`.typed_values`).
    """
    if not unknown_ok:
        names = {f.name for f in schema.fields}
        extra = field_names(values) - names
        if extra:
            name = sorted(extra)[0]
            raise _locate(records, [v.get(name, _MISSING) for v in values], name,
                          "has no column in the table (auto.evolve is off)", lambda x: x is not _MISSING)
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    arrays: list[pa.Array] = []
    n = len(values)
    if topics is None:
        topics = {r.topic for r in records} if kafka else set()
    for f, af in zip(schema.fields, arrow_schema):
        # One column at a time with C-level map(dict.get): measured faster than comprehensions and
        # than an itemgetter + zip(*rows) transpose of the whole batch.
        if kafka and f.name in KAFKA_NAMES:
            coords = kafka_column(f, af.type, records, topics)
            if coords is not None:
                arrays.append(coords)
                continue
            col: list[Any] = [getattr(r, f.name[2:]) for r in records]  # another column type: checked as values are
        else:
            col = list(map(dict.get, values, repeat(f.name, n)))
            if typed:
                col = _typed(records, col, f)
        arrays.append(_convert(records, col, f, af.type))
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


_MISSING = object()


def _typed(records: Sequence[SinkRecord], col: list[Any], field: NestedField) -> list[Any]:
    """The column's registry-converted values as its type takes them, or a RecordError naming the first that is not."""
    try:
        return convert_column(col, field.field_type)
    except (ValueError, TypeError, AttributeError, ArithmeticError) as exc:
        def bad(x: Any) -> bool:
            try:
                convert_column([x], field.field_type)
                return False
            except (ValueError, TypeError, AttributeError, ArithmeticError):
                return True

        raise _locate(records, col, field.name, f"{{value}} is not a value of column type {field.field_type} ({exc})", bad) from None
