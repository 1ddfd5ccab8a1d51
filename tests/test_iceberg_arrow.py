"""The Iceberg sink's records-to-Arrow checks (``connectors/iceberg/arrow.py``) on values pyarrow itself refuses
with an error that names no record: each must become a RecordError naming topic, partition, offset and column.

No services needed: pure conversion.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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
