"""Avro values decoded straight into native rows give exactly what the converter's dict path gives.

The native decoder (:mod:`eosink.worker.engine.avro_rows`) is generated per writer's schema; whatever
bytes it takes, its row must be the values fastavro reads (same types, same decimals and instants) and,
turned into text as the converter turns them, the dict path's values; whatever it is not sure of it
refuses, and the converter decides.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from eosink.connectors.api.rows import NativeRowTarget
from eosink.worker.engine.avro_rows import compile_decoder
from eosink.worker.engine.registry_converters import _avro, jsonable

HEADER = b"\x00\x00\x00\x00\x07"
DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
#: (field type, column type, values of it)
FIELDS: dict[str, tuple[Any, str, st.SearchStrategy[Any]]] = {
    "long": ("long", "int8", st.integers(-(2**63), 2**63 - 1)),
    "int": ("int", "int8", st.integers(-(2**31), 2**31 - 1)),
    "string": ("string", "text", st.text()),
    "varchar": ("string", "varchar", st.text(max_size=5)),
    "boolean": ("boolean", "bool", st.booleans()),
    "double": ("double", "float8", st.floats(allow_nan=False)),
    "bytes": ("bytes", "bytea", st.binary()),
    "decimal": (DECIMAL, "numeric", st.decimals(min_value=-(10**8) + 1, max_value=10**8 - 1, places=2)),
    "wide-decimal": ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}, "numeric",
                     st.integers(-(10**38) + 1, 10**38 - 1).map(lambda n: decimal.Decimal(n).scaleb(-9))),
    "millis": ({"type": "long", "logicalType": "timestamp-millis"}, "timestamptz",
               st.integers(-(10**13), 10**13).map(lambda ms: datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
                                                  + datetime.timedelta(milliseconds=ms))),
    "micros": ({"type": "long", "logicalType": "timestamp-micros"}, "timestamptz",
               st.integers(-(10**16), 10**16).map(lambda us: datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
                                                  + datetime.timedelta(microseconds=us))),
}


@st.composite
def schemas_and_records(draw: st.DrawFn) -> tuple[dict[str, Any], NativeRowTarget, list[dict[str, Any]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=7))
    fields, columns, values = [], [], []
    for i, kind in enumerate(kinds):
        avro_type, typname, strategy = FIELDS[kind]
        nullable = draw(st.sampled_from([None, "first", "last"]))
        t = avro_type if nullable is None else ["null", avro_type] if nullable == "first" else [avro_type, "null"]
        fields.append({"name": f"f{i}_{kind}", "type": t})
        columns.append((f"f{i}_{kind}", typname))
        values.append(strategy if nullable is None else st.none() | strategy)
    schema = {"type": "record", "name": "R", "fields": fields}
    records = draw(st.lists(st.tuples(*values), min_size=1, max_size=5))
    return schema, NativeRowTarget(tuple(columns)), [dict(zip((c for c, _ in columns), r)) for r in records]


def encode(parsed: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(HEADER)
    schemaless_writer(buf, parsed, record)
    return buf.getvalue()


def dict_path(schema: dict[str, Any]) -> Any:
    decode, parsed = _avro(SimpleNamespace(schema_str=json.dumps(schema)), {})
    return decode, parsed


@settings(max_examples=300, deadline=None)
@given(schemas_and_records())
def test_a_native_row_is_the_values_fastavro_reads_and_as_text_the_dict_paths_values(
        case: tuple[dict[str, Any], NativeRowTarget, list[dict[str, Any]]]) -> None:
    schema, target, records = case
    decode_dict, parsed = dict_path(schema)
    row_of = compile_decoder(parsed, target)
    assert row_of is not None
    names = [c for c, _ in target.columns]
    for record in records:
        raw = encode(parsed, record)
        row = row_of(raw)
        buf = io.BytesIO(raw[5:])
        native = schemaless_reader(buf, parsed, None)
        want = [x.encode() if type(x) is str else x for x in (native[n] for n in names)]  # a string: its UTF-8 bytes
        assert [(type(x), x) for x in row] == [(type(x), x) for x in want]
        as_dict = decode_dict(raw)
        text = [x.decode() if x is not None and t in ("text", "varchar") else x for x, (_, t) in zip(row, target.columns)]
        assert tuple(None if x is None else jsonable(x) for x in text) == tuple(as_dict[n] for n in names)


@settings(max_examples=200, deadline=None)
@given(schemas_and_records(), st.data())
def test_damaged_bytes_are_refused_or_read_exactly_as_fastavro_reads_them(
        case: tuple[dict[str, Any], NativeRowTarget, list[dict[str, Any]]], data: st.DataObject) -> None:
    schema, target, records = case
    _, parsed = dict_path(schema)
    row_of = compile_decoder(parsed, target)
    assert row_of is not None
    raw = encode(parsed, records[0])
    cut = data.draw(st.integers(5, len(raw)))
    damaged = raw[:cut] + data.draw(st.binary(max_size=4)) if data.draw(st.booleans()) else raw[:cut] + raw[cut + 1:]
    try:
        row = row_of(damaged)
    except ValueError:
        return
    buf = io.BytesIO(damaged[5:])
    native = schemaless_reader(buf, parsed, None)  # the native decoder took it: so must fastavro, identically
    assert buf.tell() == len(damaged) - 5
    assert list(row) == [x.encode() if type(x) is str else x for x in (native[c] for c, _ in target.columns)]


ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "amount", "type": DECIMAL},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "blob", "type": "bytes"},
    {"name": "note", "type": ["null", "string"]}]}
ORDER_COLUMNS = (("id", "int8"), ("name", "text"), ("amount", "numeric"), ("at", "timestamptz"), ("blob", "bytea"),
                 ("note", "text"))


@pytest.mark.parametrize(("columns", "why"), [
    (ORDER_COLUMNS[:5], "a field without a column"),
    (ORDER_COLUMNS[1:2] + ORDER_COLUMNS[:1] + ORDER_COLUMNS[2:], "another order"),
    ((("id", "int4"),) + ORDER_COLUMNS[1:], "an int4 column for a long (binary would truncate)"),
    (ORDER_COLUMNS[:2] + (("amount", "text"),) + ORDER_COLUMNS[3:], "a decimal into text"),
    (ORDER_COLUMNS[:3] + (("at", "timestamp"),) + ORDER_COLUMNS[4:], "an instant into a timestamp without zone"),
])
def test_a_schema_the_columns_do_not_take_natively_gets_no_decoder(columns: Any, why: str) -> None:
    assert compile_decoder(parse_schema(ORDER), NativeRowTarget(columns)) is None, why


def test_the_order_record_decodes_into_its_row() -> None:
    parsed = parse_schema(ORDER)
    at = datetime.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=datetime.UTC)
    raw = encode(parsed, {"id": 300, "name": "ü", "amount": decimal.Decimal("-12.34"), "at": at, "blob": b"\x00\xff",
                          "note": None})
    row_of = compile_decoder(parsed, NativeRowTarget(ORDER_COLUMNS))
    assert row_of is not None
    assert row_of(raw) == (300, "ü".encode(), decimal.Decimal("-12.34"), at, b"\x00\xff", None)
    with pytest.raises(ValueError):
        row_of(raw + b"\x00")
    with pytest.raises(ValueError):
        row_of(raw[:-1])
    invalid = raw.replace("ü".encode(), b"\xc3\x28")  # not UTF-8: the converter refuses it, naming the record
    with pytest.raises(ValueError):
        row_of(invalid)


def test_a_native_row_record_read_becomes_the_plain_record_the_converter_makes() -> None:
    """Only the sink that offered the target reads the row; anything reading ``value`` gets the converter's
    dict, and the record is then the plain one (``raw_value`` None, as for every Avro record)."""
    from eosink.connectors.api.records import SinkRecord
    from eosink.connectors.api.rows import row_of
    from eosink.worker.engine.avro_rows import AvroRows

    decode_dict, parsed = dict_path(ORDER)
    target = NativeRowTarget(ORDER_COLUMNS)
    registry = SimpleNamespace(schema=None, avro_schema=lambda schema_id: (parsed, f"writer {schema_id}"))
    rows = AvroRows(lambda raw: decode_dict(raw), lambda: target)
    rows.registry = registry
    at = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
    value = {"id": 7, "name": "n", "amount": decimal.Decimal("1.50"), "at": at, "blob": b"\x01", "note": "x"}
    raw = encode(parse_schema(ORDER), value)
    decode = rows()
    assert decode is not None
    row = decode(raw)
    assert registry.schema == "writer 7"  # the writer's schema the source hands on with the record
    rec = SinkRecord("t", 0, 5, None, row, raw, (), 0)
    rec.__class__ = rows.record_class
    assert row_of(rec) == (7, b"n", decimal.Decimal("1.50"), at, b"\x01", b"x")
    assert rec.value == decode_dict(raw) == {**value, "amount": "1.50", "at": at.isoformat(), "blob": "\\x01"}
    assert type(rec) is SinkRecord and rec.raw_value is None
