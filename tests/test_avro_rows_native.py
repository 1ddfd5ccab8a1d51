"""The C row decoder (:mod:`eosink.worker.native`) gives exactly what the generated Python decoder gives.

Both are built from the same writer's schema and target; for random schemas of every field kind they
cover (nullable or not, the null branch first or last) and random values, fastavro's encoding must
decode into equal tuples of the same types, and for damaged bytes (cut, grown, bytes flipped, a union
index out of range) both must refuse, or both give the same row. ``many`` must be the per-value decoder
run over a list, stopping at the first value it refuses or of another header.
"""

from __future__ import annotations

import datetime
import decimal
import io
import struct
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from eosink.connectors.api.rows import NativeRowTarget
from eosink.worker import native
from eosink.worker.engine.avro_rows import compile_decoder
from tests.test_avro_rows import FIELDS, HEADER

pytestmark = pytest.mark.skipif(not native.available(), reason="the C extension is not built (or EOSINK_AVRO_NATIVE=0)")

#: Besides the values a datetime holds: a timestamp field also takes a bare long, any long, as its epoch offset
#: (the first and last instant a datetime holds and one beyond each; millis whose microseconds pass 64 bits).
EDGES: dict[str, st.SearchStrategy[Any]] = {
    "long": st.sampled_from([0, -1, 63, -64, 64, 2**63 - 1, -(2**63), 2**62, -(2**62) - 1]),
    "millis": st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-62135596800000, -62135596800001, 253402300799999,
                                                                    253402300800000, 2**64 // 1000 + 1,
                                                                    -(2**64 // 1000) - 1]),
    "micros": st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-62135596800000000, -62135596800000001,
                                                                    253402300799999999, 253402300800000000]),
    "string": st.text(st.characters(codec="utf-8"), min_size=1),
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, NativeRowTarget, list[tuple[Any, ...]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=0, max_size=8))
    fields, columns, values = [], [], []
    for i, kind in enumerate(kinds):
        avro_type, typname, strategy = FIELDS[kind]
        if kind in EDGES:
            strategy = strategy | EDGES[kind]
        nullable = draw(st.sampled_from([None, "first", "last"]))
        t = avro_type if nullable is None else ["null", avro_type] if nullable == "first" else [avro_type, "null"]
        fields.append({"name": f"f{i}", "type": t})
        columns.append((f"f{i}", typname))
        values.append(strategy if nullable is None else st.none() | strategy)
    parsed = parse_schema({"type": "record", "name": "R", "fields": fields})
    return parsed, NativeRowTarget(tuple(columns)), draw(st.lists(st.tuples(*values), min_size=1, max_size=4))


def encode(parsed: Any, target: NativeRowTarget, values: tuple[Any, ...]) -> bytes:
    buf = io.BytesIO()
    buf.write(HEADER)
    schemaless_writer(buf, parsed, dict(zip((c for c, _ in target.columns), values)))
    return buf.getvalue()


def both(parsed: Any, target: NativeRowTarget) -> tuple[Any, Any]:
    """(the C decoder, the Python decoder) of one schema and target."""
    c = compile_decoder(parsed, target, HEADER)
    native.enabled = False
    try:
        py = compile_decoder(parsed, target, HEADER)
    finally:
        native.enabled = True
    assert c is not None and py is not None and type(c) is not type(py)
    return c, py


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        row = decode(raw)
    except ValueError:
        return "refused", None
    return "row", typed(row)


def typed(row: tuple[Any, ...]) -> list[tuple[type, Any]]:
    """Each value with its type; a float as its bits (a NaN is not equal to itself, its bits are), a decimal and
    an instant as their repr (equal decimals may differ in exponent, equal instants in time zone)."""
    return [(type(x), struct.pack("<d", x) if type(x) is float else repr(x) if type(x) in (decimal.Decimal, datetime.datetime)
             else x) for x in row]


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_c_decoder_gives_the_python_decoders_rows(case: tuple[Any, NativeRowTarget, list[Any]]) -> None:
    parsed, target, records = case
    c, py = both(parsed, target)
    for values in records:
        try:
            raw = encode(parsed, target, values)
        except (ValueError, OverflowError):
            continue  # (an instant fastavro cannot write)
        assert outcome(c, raw) == outcome(py, raw)


@st.composite
def damage(draw: st.DrawFn, raw: bytes) -> bytes:
    how = draw(st.sampled_from(["cut", "append", "flip", "union", "long"]))
    if how == "long":  # a byte replaced by a 10-byte varint, its last byte past 64 bits or not
        at = draw(st.integers(5, len(raw)))
        return raw[:at] + b"\xff" * 9 + bytes([draw(st.sampled_from([0, 1, 2, 3, 0x7F, 0x80]))]) + raw[at + 1:]
    if how == "cut":
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if how == "append":
        return raw + draw(st.binary(min_size=1, max_size=3))
    body = bytearray(raw)
    if len(body) == 5:
        return raw + b"\x00"
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(5, len(body) - 1))
        body[at] = draw(st.sampled_from([1, 3, 4, 0x7F, 0x80, 0xC3, 0xED, 0xFF])) if how == "union" \
            else body[at] ^ draw(st.integers(1, 255))
    return bytes(body)


@settings(max_examples=600, deadline=None)
@given(cases(), st.data())
def test_damaged_bytes_are_refused_by_both_or_read_alike(case: tuple[Any, NativeRowTarget, list[Any]],
                                                          data: st.DataObject) -> None:
    parsed, target, records = case
    c, py = both(parsed, target)
    try:
        raw = encode(parsed, target, records[0])
    except (ValueError, OverflowError):
        return
    damaged = data.draw(damage(raw))
    assert outcome(c, damaged) == outcome(py, damaged)


@settings(max_examples=150, deadline=None)
@given(cases(), st.data())
def test_many_is_the_decoder_over_a_list_to_the_first_value_it_refuses(case: tuple[Any, NativeRowTarget, list[Any]],
                                                                       data: st.DataObject) -> None:
    parsed, target, records = case
    c, py = both(parsed, target)
    values: list[Any] = []
    for record in records:
        try:
            raw = encode(parsed, target, record)
        except (ValueError, OverflowError):
            continue
        values.append(data.draw(st.sampled_from([raw, raw, raw[:-1], b"\x00\x00\x00\x00\x08" + raw[5:], None])))
    start = data.draw(st.integers(0, len(values)))
    rows, stop = c.many(values, start)
    expected = []
    for raw in values[start:]:
        if not isinstance(raw, bytes) or raw[:5] != HEADER or outcome(py, raw)[0] == "refused":
            break
        expected.append(outcome(py, raw)[1])
    assert stop == start + len(expected)
    assert [typed(row) for row in rows] == expected


def test_a_value_that_is_not_bytes_is_refused_as_the_wrong_type() -> None:
    c, _ = both(parse_schema({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}),
                NativeRowTarget((("a", "int8"),)))
    with pytest.raises(TypeError):
        c(bytearray(HEADER + b"\x02"))
    assert c(HEADER + b"\x02") == (1,)


@pytest.mark.parametrize("body", [
    b"\xff" * 9 + b"\x01", b"\xfe" + b"\xff" * 8 + b"\x01", b"\xff" * 9 + b"\x02", b"\xff" * 9 + b"\x03",
    b"\xff" * 9 + b"\x7f", b"\xff" * 9 + b"\x80\x00", b"\x80" * 9 + b"\x00", b"\x80\x00", b"\x80", b"",
])
@pytest.mark.parametrize("avro_type", ["long", {"type": "long", "logicalType": "timestamp-micros"},
                                       {"type": "long", "logicalType": "timestamp-millis"}])
def test_a_long_of_ten_bytes_is_read_to_64_bits_and_refused_beyond(body: bytes, avro_type: Any) -> None:
    typname = "int8" if avro_type == "long" else "timestamptz"
    c, py = both(parse_schema({"type": "record", "name": "R", "fields": [{"name": "a", "type": avro_type}]}),
                 NativeRowTarget((("a", typname),)))
    assert outcome(c, HEADER + body) == outcome(py, HEADER + body)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "a-cut", "b-cut", "other-id", "short", "no-magic", "not-bytes"]), max_size=12))
def test_the_c_rows_decoder_picks_and_hands_on_the_writers_schema_as_the_python_closure_does(picks: list[str]) -> None:
    """AvroRows' per-record decoder in C (``Rows``) against its Python closure: the same rows or refusals, the same
    ``registry.schema`` after each value, each writer's schema built once."""
    from types import SimpleNamespace

    from eosink.worker.engine.avro_rows import AvroRows

    a = parse_schema({"type": "record", "name": "A", "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "string"}]})
    b = parse_schema({"type": "record", "name": "B", "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "int"}]})
    target = NativeRowTarget((("x", "int8"), ("y", "text")))  # B's y (an int) has no native column here: B is refused
    ids = {7: a, 8: b}
    values = {"a": b"\x00\x00\x00\x00\x07\x02\x04hi", "b": b"\x00\x00\x00\x00\x08\x02\x04", "other-id": b"\x00\x00\x00\x00\x09\x02",
              "short": b"\x00\x00", "no-magic": b"\x01\x00\x00\x00\x07\x02\x04hi", "not-bytes": None}
    values["a-cut"], values["b-cut"] = values["a"][:-1], values["b"][:-1]

    def run() -> tuple[list[Any], list[int]]:
        built: list[int] = []

        def avro_schema(schema_id: int) -> tuple[Any, str]:
            built.append(schema_id)
            if schema_id not in ids:
                raise ValueError(f"no schema {schema_id}")
            return ids[schema_id], f"writer {schema_id}"

        registry = SimpleNamespace(schema=None, avro_schema=avro_schema)
        decode = AvroRows(registry, lambda: target)()
        assert decode is not None
        seen = []
        for pick in picks:
            try:
                seen.append(("row", decode(values[pick]), registry.schema))
            except (ValueError, TypeError) as exc:
                seen.append((type(exc).__name__, None, registry.schema))
        return seen, built

    in_c = run()
    native.enabled = False
    try:
        in_python = run()
    finally:
        native.enabled = True
    assert in_c == in_python
