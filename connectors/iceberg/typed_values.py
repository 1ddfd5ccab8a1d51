"""The values of a Schema Registry converter turned back into their types, for Iceberg's typed columns.

The converter hands sinks JSON-like values (:mod:`eosink.worker.engine.registry_converters`): a
decimal as its exact text, timestamps as ISO 8601 with ``+00:00``, dates and times as ISO text, a
uuid as its text, bytes and fixed as PostgreSQL's hex text ``\\x0a1b``. A column typed from the
schema (:mod:`.schema_types`) needs the value itself: :func:`converter` gives, per column type, the
function that turns that text into what pyarrow puts exactly into the column (a ``Decimal``, an
aware ``datetime``, ``bytes``...), nested structs, lists and maps included, whichever format they
came in. pyarrow then refuses what does not fit (a decimal with more places than the column's scale,
bytes of another size than a fixed column's) instead of rounding, and the sink names the record;
:func:`arrow_array` builds what pyarrow cannot build directly (a uuid inside a struct or list).

Only records that carry their writer's schema take this path: a JSON topic's hex-looking string is
a string.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg import types as it

Convert = Callable[[Any], Any]


def _binary(x: Any) -> Any:
    if type(x) is str:
        if not x.startswith("\\x"):
            raise ValueError("bytes are expected as hex text \\x...")
        return bytes.fromhex(x[2:])
    return x


def _decimal(x: Any) -> Any:
    if type(x) is str:
        return decimal.Decimal(x)
    return decimal.Decimal(x) if type(x) is int else x  # Protobuf's unsigned 64-bit integers


def _timestamptz(x: Any) -> Any:
    if type(x) is str:
        at = datetime.datetime.fromisoformat(x)
        if at.tzinfo is None:
            raise ValueError("a timestamp with time zone needs its offset")
        return at
    return x


def _timestamp(x: Any) -> Any:
    return datetime.datetime.fromisoformat(x) if type(x) is str else x


def _date(x: Any) -> Any:
    return datetime.date.fromisoformat(x) if type(x) is str else x


def _time(x: Any) -> Any:
    return datetime.time.fromisoformat(x) if type(x) is str else x


def _uuid(x: Any) -> Any:
    return uuid.UUID(x).bytes if type(x) is str else x


def _json_text(x: Any) -> Any:
    """A string column holding what JSON Schema objects, Protobuf messages and Avro unions of several types are."""
    return x if type(x) is str else json.dumps(x, separators=(",", ":"), ensure_ascii=False)


_SCALARS: dict[type, Convert] = {
    it.BinaryType: _binary, it.FixedType: _binary, it.DecimalType: _decimal, it.TimestamptzType: _timestamptz,
    it.TimestampType: _timestamp, it.DateType: _date, it.TimeType: _time, it.UUIDType: _uuid, it.StringType: _json_text,
}


def converter(ftype: it.IcebergType) -> Convert | None:
    """The function turning a value of a column of ``ftype`` into what pyarrow takes exactly; None when the
    value is already that (numbers, booleans, and lists and maps of only those)."""
    scalar = _SCALARS.get(type(ftype))
    if scalar is not None:
        return scalar
    if isinstance(ftype, it.StructType):
        return _struct(ftype)
    if isinstance(ftype, it.ListType):
        element = converter(ftype.element_type)
        if element is None:
            return None
        return lambda x: [None if v is None else element(v) for v in x] if type(x) is list else x
    if isinstance(ftype, it.MapType):
        key = None if isinstance(ftype.key_type, it.StringType) else converter(ftype.key_type)
        value = converter(ftype.value_type)
        return lambda x: [(k if key is None else key(k), v if v is None or value is None else value(v))
                          for k, v in x.items()] if type(x) is dict else x
    return None


def _struct(ftype: it.StructType) -> Convert:
    """A struct's converter. It refuses a key the struct has no field for: pyarrow would drop it, and a JSON
    Schema object may hold properties its schema does not name (the other formats decode exactly the schema's)."""
    inner = [(f.name, converter(f.field_type)) for f in ftype.fields]
    names = frozenset(n for n, _ in inner)
    convert = any(c for _, c in inner)

    def struct(x: Any) -> Any:
        if type(x) is not dict:
            return x
        if not x.keys() <= names:
            raise ValueError(f"key {sorted(x.keys() - names)[0]!r} is no field of the struct ({', '.join(n for n, _ in inner)})")
        if not convert:
            return x
        return {k: (x.get(k) if c is None or x.get(k) is None else c(x[k])) for k, c in inner}

    return struct


def convert_column(col: list[Any], ftype: it.IcebergType) -> list[Any]:
    """``col`` (one column's values of a batch, None for null) as ``ftype`` takes them; raises ValueError
    (or TypeError, or decimal's InvalidOperation) at the first value not of the form the converter writes."""
    conv = converter(ftype)
    if conv is None:
        return col
    return [None if x is None else conv(x) for x in col]


def arrow_array(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """``pa.array(values, type=arrow_type)``, also where an extension type (a uuid) is nested: pyarrow builds
    those from Python values only at the top level, so a nested one is built as its storage, then cast."""
    storage = _storage(arrow_type)
    if storage is arrow_type:
        return pa.array(values, type=arrow_type)
    return pa.array(values, type=storage).cast(arrow_type)


def _storage(t: pa.DataType) -> pa.DataType:
    """``t`` with every extension type inside it replaced by its storage type; ``t`` itself when it nests none."""
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        inner = [f.with_type(_plain(f.type)) for f in fields]
        return t if all(a.type == b.type for a, b in zip(inner, fields)) else pa.struct(inner)
    if pa.types.is_map(t):
        key, item = t.key_field.with_type(_plain(t.key_type)), t.item_field.with_type(_plain(t.item_type))
        return t if key.type == t.key_type and item.type == t.item_type else pa.map_(key, item)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = t.value_field.with_type(_plain(t.value_type))
        return t if element.type == t.value_type else (pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element))
    return t


def _plain(t: pa.DataType) -> pa.DataType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else _storage(t)
