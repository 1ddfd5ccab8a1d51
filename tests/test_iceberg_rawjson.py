"""The Iceberg sink's raw-JSON fast path (``connectors/iceberg/rawjson.py``) against the dict path (``arrow.to_arrow``).

The promise pinned here: whenever the fast path returns a table, the dict path returns the same
table - the same schema, and the same values down to the sign of a zero - and whenever the dict
path refuses a batch, the fast path returns None (so the sink takes the dict path and its error
naming topic, partition, offset and column). No services needed: pure conversion.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyiceberg")

import pyarrow as pa  # noqa: E402
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.types import (  # noqa: E402
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)

from eosink.connectors.api.errors import RecordError  # noqa: E402
from eosink.connectors.api.records import SinkRecord  # noqa: E402
from eosink.connectors.iceberg import arrow as ia  # noqa: E402
from eosink.connectors.iceberg import rawjson as rj  # noqa: E402

TOPIC = "orders"
ORDER: list[tuple[str, IcebergType]] = [("id", LongType()), ("user", StringType()), ("amount", DoubleType()), ("paid", BooleanType()),
                                        ("qty", IntegerType())]


def schema(fields: Sequence[tuple[str, IcebergType]] = ORDER, kafka: bool = True, required: Sequence[str] = ()) -> Schema:
    s = ia.new_schema(fields, kafka)
    if not required:
        return s
    return Schema(*(NestedField(f.field_id, f.name, f.field_type, required=f.required or f.name in required) for f in s.fields))


def recs(raws: Sequence[bytes], topics: Sequence[str] = (TOPIC,)) -> list[SinkRecord]:
    """Records whose value is what the worker's json converter decodes from each raw value."""
    return [SinkRecord(topics[i % len(topics)], i % 3, 100 + i, None, json.loads(raw), raw) for i, raw in enumerate(raws)]


def dumped(values: Sequence[Any], **kw: Any) -> list[bytes]:
    return [json.dumps(v, **kw).encode() for v in values]


def exact(table: pa.Table) -> list[list[str]]:
    """Every value by repr (tells -0.0 from 0.0, which ``Table.equals`` does not)."""
    return [[repr(x) for x in col.to_pylist()] for col in table.columns]


def compare(s: Schema, records: list[SinkRecord], kafka: bool = True, expect_fast: bool | None = None) -> pa.Table | None:
    """Both paths on ``records``; the fast one must equal the dict one or step aside. Returns the fast table."""
    values = ia.check_values(records)
    try:
        slow: pa.Table | None = ia.to_arrow(s, records, values, kafka)
    except RecordError as exc:
        assert exc.offset is not None and exc.column is not None  # the dict path names the culprit
        slow = None
    fast = rj.to_arrow(s, records, kafka)
    if fast is not None:
        assert slow is not None, "the fast path accepted a batch the dict path refuses"
        assert fast.schema == slow.schema
        assert exact(fast) == exact(slow)
    if expect_fast is not None:
        assert (fast is not None) is expect_fast
    return fast


def order(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"user_{i}", "amount": i * 1.25, "paid": i % 2 == 0, "qty": i % 7}


def test_plain_records_take_the_fast_path_with_kafka_columns() -> None:
    records = recs(dumped([order(i) for i in range(50)]))
    table = compare(schema(), records, expect_fast=True)
    assert table is not None and table.num_rows == 50
    assert table.column("__offset").to_pylist() == [100 + i for i in range(50)]
    assert table.column("__topic").to_pylist() == [TOPIC] * 50


def test_several_topics_and_no_kafka_columns() -> None:
    records = recs(dumped([order(i) for i in range(10)]), topics=("a", "b"))
    compare(schema(), records, expect_fast=True)
    compare(schema(kafka=False), records, kafka=False, expect_fast=True)


def test_many_blocks_keep_the_records_in_order() -> None:
    """More bytes than one reader block: the threads' blocks must come back in record order."""
    records = recs(dumped([{**order(i), "user": "x" * (i % 500)} for i in range(20_000)]))
    assert sum(len(r.raw_value or b"") for r in records) > 2 * rj.BLOCK_SIZE
    compare(schema(), records, expect_fast=True)


def test_encodings_of_the_same_values_agree() -> None:
    """Spacing, key order, escapes, non-ASCII text, msgspec's float spelling: the same table."""
    values = [{"id": -5, "user": "zoë \"q\" \\ / \t\n ☃ 😀", "amount": 1e-7, "paid": False, "qty": -2147483648},
              {"qty": 2147483647, "amount": 123456789.125, "user": "", "id": 9223372036854775807},
              {"id": -9223372036854775808, "amount": 3, "user": None},
              {}]
    for raws in (dumped(values), dumped(values, ensure_ascii=False), dumped(values, indent=None, separators=(" , ", " : ")),
                 [msgspec.json.encode(v) for v in values], [b'{"\\u0069d": 7, "user": "\\ud83d\\ude00"}'] * 4):
        compare(schema(), recs(raws), expect_fast=True)


@pytest.mark.parametrize("raw, why", [
    (b'{"id": 1.0}', "a fraction in a long column (the dict path refuses the float)"),
    (b'{"id": 1e2}', "an exponent in a long column"),
    (b'{"id": true}', "a boolean in a long column"),
    (b'{"id": "1"}', "a string in a long column"),
    (b'{"id": 9223372036854775808}', "beyond int64"),
    (b'{"qty": 2147483648}', "beyond int32"),
    (b'{"amount": true}', "a boolean in a double column"),
    (b'{"amount": "1.5"}', "a string in a double column"),
    (b'{"amount": -0}', "integer -0 in a double column: 0.0 from a Python int, -0.0 parsed"),
    (b'{"amount": -0.0}', "-0.0 itself goes back too (rare)"),
    (b'{"amount": 9007199254740993}', "an integer pyarrow will not convert to double exactly"),
    (b'{"amount": 100000000000000000000000000000}', "an integer beyond int64 in a double column"),
    (b'{"amount": 1e400}', "infinity"),
    (b'{"amount": NaN}', "NaN"),
    (b'{"amount": -Infinity}', "-Infinity"),
    (b'{"user": 5}', "a number in a string column"),
    (b'{"user": {"a": 1}}', "an object in a string column (the dict path writes its JSON text)"),
    (b'{"user": [1, 2]}', "an array in a string column"),
    (b'{"user": "\\ud800"}', "a lone surrogate"),
    (b'{"user": "\xed\xa0\x80"}', "a surrogate as bytes"),
    (b'{"paid": 1}', "a number in a boolean column"),
    (b'{"other": 1}', "a field with no column"),
    (b'{"other": null}', "a null field with no column (the dict path refuses it when auto.evolve finds no type)"),
    (b'{"id": 1, "id": 2}', "a key twice (json.loads keeps the last)"),
    (b'{"__offset": 1}', "a field named like a Kafka column"),
    (b'{"id":\n1}', "a line break inside the record"),
    (b'\xef\xbb\xbf{"id": 1}', "a byte order mark"),
])
def test_what_the_fast_path_leaves_to_the_dict_path(raw: bytes, why: str) -> None:
    good = dumped([order(i) for i in range(5)])
    records = recs(good[:2] + [raw] + good[2:])
    assert compare(schema(), records) is None, why


def test_columns_it_does_not_parse_go_to_the_dict_path() -> None:
    for extra in (("day", DateType()), ("at", TimestampType()), ("ratio", FloatType())):
        s = schema([*ORDER, extra])
        assert compare(s, recs(dumped([order(i) for i in range(3)]))) is None, extra


def test_null_in_a_required_column_goes_to_the_dict_path_and_its_error() -> None:
    s = schema(required=["user"])
    records = recs(dumped([order(0), {"id": 1}]))
    assert compare(s, records) is None
    with pytest.raises(RecordError, match=r"@101, column .user."):
        ia.to_arrow(s, records, ia.check_values(records), True)


def test_a_record_without_raw_bytes_goes_to_the_dict_path() -> None:
    records = recs(dumped([order(i) for i in range(3)]))
    records[1].raw_value = None
    assert compare(schema(), records) is None


def test_empty_batch() -> None:
    assert rj.to_arrow(schema(), [], True) is None


_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**65), max_value=2**65),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
_value = st.dictionaries(st.sampled_from([n for n, _ in ORDER] + ["other"]), st.one_of(_scalars, st.lists(_scalars, max_size=2)),
                         max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_value, min_size=1, max_size=6), st.booleans())
def test_property_fast_path_equals_dict_path(values: list[dict[str, Any]], compact: bool) -> None:
    """Any batch of JSON objects over the table's fields (any JSON types, bad ones included)."""
    if compact:
        raws = [msgspec.json.encode(v) if all(not isinstance(x, float) or math.isfinite(x) for x in v.values())
                else json.dumps(v).encode() for v in values]
    else:
        raws = dumped(values)
    compare(schema(), recs(raws))
