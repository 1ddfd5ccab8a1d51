"""Avro values decoded straight into a sink's native rows (:class:`~eosink.connectors.api.rows.NativeRowTarget`).

Read through the converter, an Avro value costs fastavro's ``schemaless_reader`` (a ``read()`` call on a
``BytesIO`` per field, a dict, logical types built as Python objects), then the text of each decimal,
timestamp and bytes value, which the server parses again: about 4x the CPU of decoding the same record
as JSON into the PostgreSQL sink's rows. Here the decoder of one writer's schema is generated once,
for one row target, as straight-line Python over the value's bytes: each field read in place and
made the value the sink's binary COPY takes as it is (an int, a str, a :class:`~decimal.Decimal`, an
aware datetime, bytes; a string stays its UTF-8 bytes, which binary COPY sends as they are), the row
a plain tuple. Where the C extension :mod:`eosink.worker.native` is built, the same decoder runs
compiled (a "program" of the fields' kinds, ~4x faster than the generated Python, which stays its
reference and the fallback), and so does the per-record look-up of the writer's schema.

It gives exactly the values fastavro gives (the decimal built in the same context, the timestamp
from the same epoch; a string's bytes), or refuses: a writer's schema with another field, order or type than the
target's columns take natively gets no decoder, and a payload it would have to guess about (a
negative length, an unknown union branch, bytes left over, invalid UTF-8) raises ``ValueError``;
the source then decodes that record with the converter, as without any of this.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any

from eosink.connectors.api.records import _set_value
from eosink.connectors.api.rows import NativeRowTarget, RowRecord
from eosink.worker import native

Row = tuple[Any, ...]
RowDecode = Callable[[bytes], Row]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_INT64 = 2**63
#: Avro type (primitive, or primitive/logical type) -> the pg_type names of the columns that take its value natively.
_COLUMNS: dict[str, frozenset[str]] = {
    "long": frozenset({"int8"}), "int": frozenset({"int8"}), "boolean": frozenset({"bool"}),
    "double": frozenset({"float8"}), "string": frozenset({"text", "varchar"}), "bytes": frozenset({"bytea"}),
    "bytes/decimal": frozenset({"numeric"}), "long/timestamp-millis": frozenset({"timestamptz"}),
    "long/timestamp-micros": frozenset({"timestamptz"}),
}


def _unrolled_varint() -> Callable[[bytes, int], tuple[int, int]]:
    """``(raw, p) -> (value, position after it)``: a zigzag long of up to 10 bytes at ``p``, its bytes read one
    by one without a loop (measured a third faster than a loop for the 3 bytes of an id)."""

    def level(i: int) -> list[str]:  # byte i has been read into b and n; lines at depth i + 1
        ind = "    " * (i + 1)
        if i == 9:
            return [f"{ind}if b & 0x80:", f"{ind}    raise ValueError('a long longer than 10 bytes')",
                    f"{ind}v = (n >> 1) ^ -(n & 1)", f"{ind}if not -_INT64 <= v < _INT64:",
                    f"{ind}    raise ValueError('a long beyond 64 bits')", f"{ind}return v, p + 10"]
        return [f"{ind}if b & 0x80:", f"{ind}    b = raw[p + {i + 1}]", f"{ind}    n |= (b & 0x7F) << {7 * (i + 1)}",
                *level(i + 1), f"{ind}return (n >> 1) ^ -(n & 1), p + {i + 1}"]

    env: dict[str, Any] = {"_INT64": _INT64}
    exec("\n".join(["def varint(raw, p):", "    b = raw[p]", "    n = b & 0x7F", *level(0)]), env)  # noqa: S102 - constants only
    varint: Callable[[bytes, int], tuple[int, int]] = env["varint"]
    return varint


_varint = _unrolled_varint()


def _kind(avro_type: Any) -> tuple[str, Any] | None:
    """(key of :data:`_COLUMNS`, the type's dict or name) of a non-union type, None for one not covered."""
    if isinstance(avro_type, str):
        return (avro_type, avro_type) if avro_type in _COLUMNS else None
    if not isinstance(avro_type, dict):
        return None
    base, logical = avro_type.get("type"), avro_type.get("logicalType")
    key = base if logical is None else f"{base}/{logical}"
    if logical == "decimal" and not isinstance(avro_type.get("precision"), int):
        return None
    return (key, avro_type) if key in _COLUMNS and isinstance(base, str) else None


def _long(v: str, ind: str) -> list[str]:
    return [f"{ind}b = raw[p]", f"{ind}if b < 128:", f"{ind}    {v} = (b >> 1) ^ -(b & 1)", f"{ind}    p += 1",
            f"{ind}else:", f"{ind}    {v}, p = _varint(raw, p)"]


def _sized(ind: str) -> list[str]:
    """Where a string or bytes value starts (``s``) and ends (``q``): its length is most often one byte."""
    return [f"{ind}b = raw[p]", f"{ind}if b < 128 and not b & 1:", f"{ind}    s = p + 1", f"{ind}    q = s + (b >> 1)",
            f"{ind}else:", f"{ind}    n, s = _varint(raw, p)", f"{ind}    if n < 0:",
            f"{ind}        raise ValueError('negative length')", f"{ind}    q = s + n"]


def _value(i: int, key: str, t: Any, ind: str, env: dict[str, Any]) -> list[str]:
    """Lines that read field ``i``'s value into ``v{i}``."""
    v = f"v{i}"
    if key in ("long", "int"):
        return _long(v, ind)
    if key == "boolean":
        return [f"{ind}b = raw[p]", f"{ind}p += 1", f"{ind}if b > 1:", f"{ind}    raise ValueError('boolean')",
                f"{ind}{v} = b == 1"]
    if key == "double":
        return [f"{ind}{v} = _double(raw, p)[0]", f"{ind}p += 8"]
    if key == "string":  # its UTF-8 bytes, checked here only when not ASCII: invalid UTF-8 is the converter's to refuse
        return [*_sized(ind), f"{ind}{v} = raw[s:q]", f"{ind}if not {v}.isascii():", f"{ind}    {v}.decode()", f"{ind}p = q"]
    if key == "bytes":
        return [*_sized(ind), f"{ind}{v} = raw[s:q]", f"{ind}p = q"]
    if key == "bytes/decimal":  # as fastavro: the unscaled int in a context of the schema's precision
        env[f"ctx{i}"] = ctx = decimal.Context(prec=t["precision"])
        env[f"dec{i}"] = ctx.create_decimal
        return [*_sized(ind), f"{ind}{v} = dec{i}(int.from_bytes(raw[s:q], 'big', signed=True)).scaleb({-int(t.get('scale', 0))}, ctx{i})",
                f"{ind}p = q"]
    micros = "n" if key == "long/timestamp-micros" else "n * 1000"  # as fastavro: epoch + timedelta
    return [*_long("n", ind), f"{ind}{v} = _EPOCH + _td(0, 0, {micros})"]


def _fields(parsed: Any, target: NativeRowTarget) -> list[tuple[str, Any, int]] | None:
    """(key of :data:`_COLUMNS`, the type, the null branch's index or -1) of each field of the fastavro-parsed
    writer's schema ``parsed``, or None when it is no record of exactly the target's columns (names, order)
    with types they take natively."""
    fields = parsed.get("fields") if isinstance(parsed, dict) and parsed.get("type") == "record" else None
    if fields is None or [f.get("name") for f in fields] != [name for name, _ in target.columns]:
        return None
    out = []
    for f, (_, typname) in zip(fields, target.columns):
        t = f.get("type")
        null_at = -1
        if isinstance(t, list):
            if len(t) != 2 or "null" not in t:
                return None
            null_at = t.index("null")
            t = t[1 - null_at]
        kind = _kind(t)
        if kind is None or typname not in _COLUMNS[kind[0]]:
            return None
        out.append((kind[0], kind[1], null_at))
    return out


def compile_decoder(parsed: Any, target: NativeRowTarget, header: bytes = bytes(5)) -> RowDecode | None:
    """The row decoder of the fastavro-parsed writer's schema ``parsed`` for ``target``, or None when the
    schema is no record of exactly the target's columns (names, order) with types they take natively.

    The C decoder (:mod:`eosink.worker.native`) where it is built and enabled, ``header`` the 5 bytes of
    the values its ``many`` takes; else the generated Python decoder, its reference."""
    fields = _fields(parsed, target)
    if fields is None:
        return None
    program = native.program(header, [
        (native.KINDS[key], null_at, decimal.Context(prec=t["precision"]) if key == "bytes/decimal" else None,
         -int(t.get("scale", 0)) if key == "bytes/decimal" else None) for key, t, null_at in fields])
    if program is not None:
        c_decode: RowDecode = program
        return c_decode
    return _python_decoder(fields)


def _python_decoder(fields: list[tuple[str, Any, int]]) -> RowDecode:
    """The decoder of :func:`compile_decoder` generated as Python.

    The generated source holds only field indexes, constants of this module and ints from the schema
    (a decimal's scale): nothing of a field's name or any other text of the schema."""
    env: dict[str, Any] = {"_varint": _varint, "_EPOCH": _EPOCH, "_td": datetime.timedelta,
                           "_double": struct.Struct("<d").unpack_from}
    body = ["def decode(raw):", "    p = 5"]
    for i, (key, t, null_at) in enumerate(fields):
        if null_at < 0:
            body += _value(i, key, t, "    ", env)
        else:  # the branch index, a zigzag long: 0 -> byte 0, 1 -> byte 2
            body += ["    b = raw[p]", "    p += 1", f"    if b == {2 * null_at}:", f"        v{i} = None",
                     f"    elif b == {2 * (1 - null_at)}:", *_value(i, key, t, "        ", env),
                     "    else:", "        raise ValueError('union branch')"]
    body += ["    if p != len(raw):", "        raise ValueError('bytes left over, or too few')",
             f"    return ({''.join(f'v{i}, ' for i in range(len(fields)))})"]
    exec("\n".join(body), env)  # noqa: S102 - generated from the constants above (see the docstring)
    inner: RowDecode = env["decode"]

    def decode(raw: bytes) -> Row:
        try:
            return inner(raw)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - IndexError, struct.error, OverflowError: not this row
            raise ValueError(f"{type(exc).__name__}: {exc}") from None

    return decode


def _refuse(raw: bytes) -> Row:
    raise ValueError("this writer's schema has no native row decoder for the target")


class AvroRows:
    """The engine's side for one source with ``value.converter=avro``: ``rows()`` (once per fetched slice)
    gives a function decoding a value's bytes into the target's row, or None when the sink offers none.

    A decoder is built once per writer's schema id and kept while the sink's target stays the same
    object; the converter (``registry``, a :class:`~eosink.worker.engine.registry_converters.RegistryDecoder`)
    is told the writer's schema of each record decoded so, which the source hands on with the record.
    """

    def __init__(self, registry: Any, target_of: Callable[[], NativeRowTarget | None]) -> None:
        self.registry = registry
        self.target_of = target_of
        self._target: NativeRowTarget | None = None
        self._by_header: dict[bytes, tuple[RowDecode, Any]] = {}
        self.record_class = _record_class(registry)

    def __call__(self) -> RowDecode | None:
        target = self.target_of()
        if target is None:
            return None
        if target is not self._target:
            self._target, self._by_header = target, {}
        by_header, registry, build = self._by_header, self.registry, self._build
        in_c = native.rows(by_header, registry, lambda raw: build(raw, target))  # the closure below, in C
        if in_c is not None:
            c_decode: RowDecode = in_c
            return c_decode

        def decode(raw: bytes) -> Row:
            entry = by_header.get(raw[:5])
            if entry is None:
                entry = build(raw, target)
            fn, registry.schema = entry
            return fn(raw)

        return decode

    def _build(self, raw: bytes, target: NativeRowTarget) -> tuple[RowDecode, Any]:
        if len(raw) < 5 or raw[0] != 0:
            raise ValueError("not in Confluent's wire format")  # the converter names what is wrong
        parsed, writer = self.registry.avro_schema(int.from_bytes(raw[1:5], "big"))
        header = bytes(raw[:5])
        entry = self._by_header[header] = (compile_decoder(parsed, target, header) or _refuse, writer)
        return entry


def _record_class(registry: Any) -> type[RowRecord]:
    """The :class:`RowRecord` of one Avro converter: its ``raw_value`` holds the Avro bytes while the value
    slot holds the row; reading ``value`` decodes them with the converter and makes it the plain record
    the converter alone would have made (``raw_value`` None, as for every Avro record)."""

    class AvroRowRecord(RowRecord):
        __slots__ = ()

        @property
        def value(self) -> Any:
            v = registry(self.raw_value)
            self.value = v
            return v

        @value.setter
        def value(self, v: Any) -> None:
            _set_value(self, v)
            self.raw_value = None
            self._plain()

    return AvroRowRecord
