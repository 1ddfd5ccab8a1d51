"""The values of a Schema Registry converter turned back into their types, for Iceberg's typed columns.

The converter hands sinks JSON-like values (:mod:`eosink.worker.engine.registry_converters`): a
decimal as its exact text, timestamps as ISO 8601 with ``+00:00``, dates and times as ISO text, a
uuid as its text, bytes and fixed as PostgreSQL's hex text ``\\x0a1b``. A column typed from the
schema (:mod:`.schema_types`) needs the value itself: :func:`converter` gives, per column type, the
function that turns that text into what pyarrow puts exactly into the column (a ``Decimal``, an
aware ``datetime``, ``bytes``...), nested structs, lists and maps included. pyarrow then refuses
what does not fit (a decimal with more places than the column's scale, bytes of another size than
a fixed column's) instead of rounding, and the sink names the record.

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
    value is already that (numbers, booleans, and structures of only those)."""
    scalar = _SCALARS.get(type(ftype))
    if scalar is not None:
        return scalar
    if isinstance(ftype, it.StructType):
        inner = [(f.name, converter(f.field_type)) for f in ftype.fields]
        if not any(c for _, c in inner):
            return None
        return lambda x: {k: (x.get(k) if c is None or x.get(k) is None else c(x[k])) for k, c in inner} if type(x) is dict else x
    if isinstance(ftype, it.ListType):
        element = converter(ftype.element_type)
        if element is None:
            return None
        return lambda x: [None if v is None else element(v) for v in x] if type(x) is list else x
    if isinstance(ftype, it.MapType):
        value = converter(ftype.value_type)
        return lambda x: [(k, v if v is None or value is None else value(v)) for k, v in x.items()] if type(x) is dict else x
    return None


def convert_column(col: list[Any], ftype: it.IcebergType) -> list[Any]:
    """``col`` (one column's values of a batch, None for null) as ``ftype`` takes them; raises ValueError
    (or TypeError, or decimal's InvalidOperation) at the first value not of the form the converter writes."""
    conv = converter(ftype)
    if conv is None:
        return col
    return [None if x is None else conv(x) for x in col]
