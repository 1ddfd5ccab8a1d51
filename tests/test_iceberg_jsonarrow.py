"""The Iceberg sink's parse of JSON bytes straight into Arrow (``connectors/iceberg/jsonarrow.py``) never
decides anything the checked dicts-to-Arrow path would decide otherwise: where it returns a table, the
checked path makes the same table of the same records, bit for bit; where the checked path refuses a
record, it returns None (and the sink takes the checked path, which names the record). And it is really
taken for ordinary batches, so the property is not met by always falling back.

No services needed: pure conversion.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyiceberg")

import pyarrow as pa  # noqa: E402
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.types import BooleanType, DoubleType, IntegerType, LongType, NestedField, StringType  # noqa: E402

from eosink.connectors.api.errors import RecordError  # noqa: E402
from eosink.connectors.api.records import LazyJsonRecord, SinkRecord  # noqa: E402
from eosink.connectors.iceberg import arrow as ia  # noqa: E402
from eosink.connectors.iceberg import jsonnative  # noqa: E402
from eosink.connectors.iceberg.jsonarrow import from_json  # noqa: E402
from eosink.worker.engine.converters import json_checked  # noqa: E402


@pytest.fixture(autouse=True)
def reader_only() -> Any:
    """Arrow's reader, not the C parser that comes first (``test_iceberg_jsonnative.py`` pins that one)."""
    saved, jsonnative.enabled = jsonnative.enabled, False
    yield
    jsonnative.enabled = saved


COLUMNS = (("n", LongType()), ("x", DoubleType()), ("s", StringType()), ("b", BooleanType()))


def schema_of(required: str | None = None, kafka: bool = True) -> Schema:
    fields = [NestedField(i + 1, name, t, required=name == required) for i, (name, t) in enumerate(COLUMNS)]
    if kafka:
        fields += [NestedField(len(fields) + i + 1, n, t, required=True) for i, (n, t) in enumerate(ia.KAFKA_FIELDS)]
    return Schema(*fields)


def checked(schema: Schema, records: list[SinkRecord], kafka: bool = True) -> pa.Table | RecordError:
    try:
        return ia.to_arrow(schema, records, ia.check_values(records), kafka, topics={r.topic for r in records})
    except RecordError as exc:
        return exc


def exact(table: pa.Table) -> list[dict[str, Any]]:
    """Rows with every float as its bits: -0.0 and 0.0 differ here."""
    return [{k: struct.pack("<d", v) if type(v) is float else v for k, v in row.items()} for row in table.to_pylist()]


def records_of(raws: list[bytes], topics: tuple[str, ...] = ("orders",)) -> list[SinkRecord]:
    out = []
    for i, raw in enumerate(raws):
        out.append(SinkRecord(topics[i % len(topics)], i % 3, 100 + i, None, json.loads(raw), raw))
    return out


def assert_same_or_declined(schema: Schema, raws: list[bytes], kafka: bool = True) -> pa.Table | None:
    records = records_of(raws)
    fast = from_json(schema, records, kafka, {r.topic for r in records})
    if fast is not None:
        slow = checked(schema, records, kafka)
        assert isinstance(slow, pa.Table), f"parsed a batch the checked path refuses: {slow}"
        assert fast.schema == slow.schema
        assert exact(fast) == exact(slow)
    return fast


scalar = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.sampled_from([0, -0.0, 0.0, 2**53, 2**53 + 1, -(2**63), 2**63 - 1, 2**63, 1e300, 5e-324, 0.1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "\U0001f600", "\x00", "é", "\u2028", '"\\/']),
)
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=4)
field = st.sampled_from(["n", "x", "s", "b", "n", "x", "s", "b", "other", "__offset"])


@st.composite
def raw_values(draw: Any) -> bytes:
    """One record's JSON: mostly objects of the table's fields, any JSON value in them, spelled
    several ways (escaped or not, spaces and newlines, a key twice, -0 as an integer)."""
    if draw(st.integers(0, 30)) == 0:
        return json.dumps(draw(value)).encode()  # not an object at all (most often)
    obj = draw(st.dictionaries(field, value, max_size=5))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (",\n", ":\n ")])))
    trick = draw(st.integers(0, 12))
    if trick == 0 and obj:
        key = draw(st.sampled_from(sorted(obj)))
        text = text[:-1] + ("," if len(obj) else "") + f'{json.dumps(key)}:{json.dumps(draw(value))}' + "}"
    elif trick == 1 and "x" not in obj:
        text = text[:-1] + (", " if obj else "") + '"x": -0}'
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: only its escape can send it
        return json.dumps(obj).encode()


fitting = st.fixed_dictionaries({}, optional={
    "n": st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    "x": st.one_of(st.none(), st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
                   st.floats(allow_nan=False, allow_infinity=False, max_value=2.0**52, min_value=-(2.0**52)).filter(
                       lambda f: f != 0 or math.copysign(1, f) > 0)),
    "s": st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=["Cs"]))),
    "b": st.one_of(st.none(), st.booleans()),
})


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raws=st.lists(raw_values(), min_size=1, max_size=8), required=st.sampled_from([None, "n", "s"]))
@example(raws=[b'{"x": 9007199254740993}'], required=None)
@example(raws=[b'{"x": -0}'], required=None)
@example(raws=[b'{"n": 1, "n": 2}'], required=None)
@example(raws=[b'{"s": "\\ud800"}'], required=None)
@example(raws=[b'{"s": {"a": 1}}'], required=None)
@example(raws=[b'{"b": 1}'], required=None)
@example(raws=[b'{"n": 1.0}'], required=None)
@example(raws=[b'{"__offset": 1}'], required=None)
@example(raws=[b'{"x": 1}', b'[1]'], required=None)
@example(raws=[b'{"x": 1}'], required="s")
def test_parsed_batch_is_the_checked_batch_or_declined(raws: list[bytes], required: str | None) -> None:
    assert_same_or_declined(schema_of(required), raws)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(fitting, min_size=1, max_size=20), ensure_ascii=st.booleans())
def test_batch_that_fits_the_table_is_parsed_not_checked(values: list[dict[str, Any]], ensure_ascii: bool) -> None:
    raws = [json.dumps(v, ensure_ascii=ensure_ascii).encode() for v in values]
    assert assert_same_or_declined(schema_of(), raws) is not None


def test_undecoded_records_are_parsed_and_stay_undecoded() -> None:
    raws = [json.dumps({"n": i, "x": i / 4, "s": f"ü{i}", "b": i % 2 == 0}).encode() for i in range(2000)]
    records = []
    for i, raw in enumerate(raws):
        value = json_checked(raw)
        r = SinkRecord("orders", 1, i, None, value, raw)
        r.__class__ = LazyJsonRecord
        records.append(r)
    table = from_json(schema_of(), records, True, {"orders"})
    assert table is not None
    assert table.column("s")[1999].as_py() == "ü1999" and table.column("__offset")[5].as_py() == 5
    assert all(r.__class__ is LazyJsonRecord for r in records), "a value was decoded"


@pytest.mark.parametrize("raw", [
    b'{"s": "\xff"}',  # not UTF-8 (the engine never hands such bytes over; the sink checks anyway)
    b'{"s": "x"}\n{"s": "y"}',  # two documents in one record: the row count tells
])
def test_bytes_that_are_not_one_record_each_are_declined(raw: bytes) -> None:
    records = [SinkRecord("orders", 0, 0, None, {"s": "x"}, raw), SinkRecord("orders", 0, 1, None, {"s": "z"}, b'{"s":"z"}')]
    assert from_json(schema_of(), records, True, {"orders"}) is None


def test_record_without_its_bytes_and_other_column_types_are_declined() -> None:
    records = records_of([b'{"n": 1}', b'{"n": 2}'])
    records[1].raw_value = None
    assert from_json(schema_of(), records, True, {"orders"}) is None
    other = Schema(NestedField(1, "n", IntegerType(), required=False))
    assert from_json(other, records_of([b'{"n": 1}']), False, {"orders"}) is None
    assert from_json(schema_of(kafka=False), records_of([b'{"n": 1}']), False, {"orders"}) is not None


def test_several_topics_get_their_own_topic_column() -> None:
    records = records_of([b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'], topics=("a", "b"))
    table = from_json(schema_of(), records, True, {"a", "b"})
    assert table is not None and table.column("__topic").to_pylist() == ["a", "b", "a"]
