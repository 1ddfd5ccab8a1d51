"""Cast: fields of a map, or the whole key/value, to a primitive type, with Java's results.

Connect casts through Java's ``Number.byteValue()`` & co., so an out-of-range integer wraps
(``300`` as int8 is ``44``), a float truncates toward zero (and saturates at int32/int64), and a
string is parsed strictly (``Byte.parseByte``: out of range is an error, not a wrap). Floats to
float32 are rounded to single precision. Booleans print as ``true``/``false`` and bytes as base64,
as Connect prints them. Maps and arrays cannot be cast.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, non_empty
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.records import SinkRecord
from eosink.worker.transforms.base import BadRecord, MapTransform, type_name

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_INT_TEXT = re.compile(r"[+-]?[0-9]+")


def _wrap(n: int, bits: int) -> int:
    """Two's-complement narrowing, as Java's ``(byte)`` / ``(short)`` / ``(int)`` casts do."""
    m = 1 << bits
    n &= m - 1
    return n - m if n >= m >> 1 else n


def _float_to_int(x: float, bits: int) -> int:
    """Java's ``Double.intValue()`` (saturating, NaN is 0), then narrowed for int8/int16."""
    if math.isnan(x):
        return 0
    wide = 64 if bits == 64 else 32
    lo, hi = -(1 << (wide - 1)), (1 << (wide - 1)) - 1
    n = lo if x <= lo else hi if x >= hi else int(x)
    return _wrap(n, bits)


def _to_int(bits: int) -> Callable[[Any], int]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def cast(x: Any) -> int:
        t = type(x)
        if t is bool:
            return 1 if x else 0
        if t is int:
            return _wrap(x, bits)
        if t is float:
            return _float_to_int(x, bits)
        if t is str:
            if not _INT_TEXT.fullmatch(x) or not lo <= int(x) <= hi:
                raise BadRecord(f"value {x!r} is not a valid int{bits}")
            return int(x)
        raise BadRecord(f"cannot cast a value of type {type_name(x)} to int{bits}")

    return cast


def _f32(x: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _to_float(single: bool) -> Callable[[Any], float]:
    name = "float32" if single else "float64"

    def cast(x: Any) -> float:
        t = type(x)
        if t is bool:
            f = 1.0 if x else 0.0
        elif t is int or t is float:
            f = float(x)
        elif t is str:
            try:
                f = float(x.strip())
            except ValueError:
                raise BadRecord(f"value {x!r} is not a valid {name}") from None
        else:
            raise BadRecord(f"cannot cast a value of type {type_name(x)} to {name}")
        return _f32(f) if single else f

    return cast


def _to_boolean(x: Any) -> bool:
    t = type(x)
    if t is bool:
        return x
    if t is int or t is float:
        return _float_to_int(x, 64) != 0 if t is float else x != 0
    if t is str:
        return x.lower() == "true"
    raise BadRecord(f"cannot cast a value of type {type_name(x)} to boolean")


def _to_string(x: Any) -> str:
    t = type(x)
    if t is str:
        return x
    if t is bool:
        return "true" if x else "false"
    if t is int or t is float:
        return repr(x)
    if t is bytes or t is bytearray:
        return base64.b64encode(x).decode()
    raise BadRecord(f"cannot cast a value of type {type_name(x)} to string")


CASTS: dict[str, Callable[[Any], Any]] = {
    **{name: _to_int(bits) for name, bits in _INT_BITS.items()},
    "float32": _to_float(True),
    "float64": _to_float(False),
    "boolean": _to_boolean,
    "string": _to_string,
}


def parse_spec(key: str, spec: list[str]) -> tuple[Callable[[Any], Any] | None, dict[str, Callable[[Any], Any]]]:
    """``(whole-value cast or None, {field: cast})`` from ``field:type,...`` or a single ``type``."""
    whole: Callable[[Any], Any] | None = None
    fields: dict[str, Callable[[Any], Any]] = {}
    for item in spec:
        parts = [p.strip() for p in item.split(":")]
        if len(parts) > 2 or any(not p for p in parts):
            raise ConfigError(f"invalid cast {item!r}: expected field:type or a single type", key=key)
        type_ = parts[-1].lower()
        if type_ not in CASTS:
            raise ConfigError(f"cannot cast to {parts[-1]!r} in {item!r}: types are {', '.join(CASTS)}", key=key)
        if len(parts) == 1:
            whole = CASTS[type_]
        else:
            fields[parts[0]] = CASTS[type_]
    if whole is not None and len(spec) > 1:
        raise ConfigError("a cast of the entire value (a single type) must be the only cast in the spec", key=key)
    return whole, fields


class Cast(MapTransform):
    name = "Cast"
    sided = True
    doc = ("Cast fields (field:type,...) or the entire key/value (a single type) to int8, int16, int32, int64, "
           "float32, float64, boolean or string.")
    config_def = ConfigDef().define("spec", Type.LIST, doc="field1:type,field2:type, or one type for the whole "
                                    "value.", importance=Importance.HIGH, validator=non_empty)

    def __init__(self, config: Mapping[str, Any], *, on_key: bool = False) -> None:
        super().__init__(config, on_key=on_key)
        self._whole, fields = parse_spec("spec", config["spec"])
        self._fields = tuple(fields.items())

    json_preserving = True  # ints, floats, booleans, strings
    fresh = True

    def map(self, r: SinkRecord, v: Any) -> Any:
        if v is None:
            return v
        if self._whole is not None:
            return self._whole(v)
        if type(v) is not dict:
            raise self.not_a_map(v, "casting fields")
        new = v.copy()
        for f, cast in self._fields:
            x = v.get(f)
            try:
                new[f] = None if x is None else cast(x)  # an absent field comes out as null, as in Connect
            except BadRecord as exc:
                raise BadRecord(exc.message, f) from None
        return new
