"""The Iceberg sink's records-to-Arrow conversion (``connectors/iceberg/arrow.py``): values pyarrow itself refuses
with an error that names no record must become RecordErrors naming topic, partition, offset and column; the
key-count shortcut that tells a batch needs no new column must answer as the full key comparison does.

No services needed: pure conversion.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyiceberg")

from pyiceberg.types import DoubleType, FloatType, IcebergType, LongType, StringType  # noqa: E402

from eosink.connectors.api.errors import RecordError  # noqa: E402
from eosink.connectors.api.records import SinkRecord  # noqa: E402
from eosink.connectors.iceberg import arrow as ia  # noqa: E402


def convert(column: IcebergType, raws: list[bytes]) -> Any:
    records = [SinkRecord("t", 0, 10 + i, None, json.loads(raw), raw) for i, raw in enumerate(raws)]
    schema = ia.new_schema([("id", LongType()), ("x", column)], kafka=True)
    return ia.to_arrow(schema, records, ia.check_values(records), True)


@pytest.mark.parametrize("column, good, bad", [
    (DoubleType(), 2**53, 2**53 + 1),
    (DoubleType(), -(2**53), 2**64),
    (FloatType(), 2**24, 2**24 + 1),
])
def test_integer_a_float_column_cannot_hold_exactly_is_named(column: IcebergType, good: int, bad: int) -> None:
    assert convert(column, [b'{"x": %d}' % good]).column("x").to_pylist() == [float(good)]
    with pytest.raises(RecordError, match=rf"t\[0\]@11, column 'x': value {bad} is out of range for column type {column}"):
        convert(column, [b'{"x": 1.5}', b'{"x": %d}' % bad])


@pytest.mark.parametrize("raw", [b'{"x": "ok \\ud800"}', b'{"x": "ok \xed\xa0\x80"}', b'{"x": {"y": "\\udc00"}}'])
def test_lone_surrogate_is_named(raw: bytes) -> None:
    """``json.loads`` keeps a lone surrogate (escaped, or UTF-8-encoded as bytes); UTF-8 has no encoding for it."""
    with pytest.raises(RecordError, match=r"t\[0\]@11, column 'x': .*lone UTF-16 surrogate"):
        convert(StringType(), [b'{"x": "fine \\u00e9"}', raw])


_COLUMNS = [("id", LongType()), ("x", StringType())]
_values = st.lists(st.dictionaries(st.sampled_from(["id", "x", "extra", "__offset"]),
                                   st.one_of(st.none(), st.integers(0, 9)), max_size=4),
                   min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(_values, st.booleans())
def test_all_fields_have_columns_is_the_key_comparison(values: list[dict[str, Any]], kafka: bool) -> None:
    """The key count shortcut answers exactly what comparing every key with the columns answers."""
    values = [{k: (str(v) if k == "x" and v is not None else v) for k, v in d.items()} for d in values]
    records = [SinkRecord("t", 0, i, None, v, json.dumps(v).encode()) for i, v in enumerate(values)]
    schema = ia.new_schema(_COLUMNS, kafka)
    table = ia.to_arrow(schema, records, values, kafka, unknown_ok=True)
    expected = not ia.field_names(values) - {f.name for f in schema.fields}
    assert ia.all_fields_have_columns(table, values, kafka) is expected
