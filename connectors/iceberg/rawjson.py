"""The Iceberg sink's fast path: Arrow columns parsed straight from the records' JSON bytes.

:func:`eosink.connectors.iceberg.arrow.to_arrow` builds each column from the decoded dicts: a Python
step per record and column (~0.8 us per record for 9 fields). Here the records' ``raw_value`` bytes
(the topic's own JSON, present with ``value.converter=json``) are joined into newline-delimited JSON
and parsed by pyarrow's JSON reader against the table's own schema, in C++ and on pyarrow's threads.

The rule: :func:`to_arrow` returns either exactly the table ``arrow.to_arrow`` would return, or
``None``, and the caller then takes that path (with its errors naming topic, partition, offset and
column). It never raises a record error itself. It takes only what it can prove identical:

* only columns of type boolean, int, long, double and string (anything else: ``None``); the Kafka
  coordinate columns are built from the records exactly as ``arrow.to_arrow`` builds them;
* the reader refuses what the dict path refuses or would convert differently: a field with no
  column (``unexpected_field_behavior="error"``), a key given twice, a string for a number, a number
  for a string or boolean, a fraction or an exponent for an integer column, an integer out of the
  column's range, an object or array anywhere (the dict path writes those into string columns as
  their JSON text), an escaped lone UTF-16 surrogate (``\\ud800``);
* a double column holding NaN, -0.0 or a magnitude of 2**53 or more goes back too: there an integer
  literal converts differently (``-0`` is 0.0 from a Python int but -0.0 parsed as a double; integers
  beyond 2**53 are refused by pyarrow's int-to-double conversion), and such values are rare;
* a string column that is not strict UTF-8: the reader copies string bytes unchecked, and
  ``json.loads`` turns UTF-8-encoded surrogates (``ED A0 80``) into a lone surrogate the dict path refuses;
* a null or missing value in a required column, a record without raw bytes, raw bytes with a line
  break inside (the reader splits lines on it) or a row count other than the record count: ``None``.

Every value must be a JSON object (:func:`~eosink.connectors.iceberg.arrow.check_values` ran first) whose
``raw_value`` is its JSON encoding, which the worker guarantees (``SinkRecord``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import BooleanType, DoubleType, IntegerType, LongType, StringType

from eosink.connectors.api.records import SinkRecord
from eosink.connectors.iceberg import arrow as ia

#: Column types whose JSON parse is the dict path's conversion (see the module's docstring).
_PARSED = (BooleanType, IntegerType, LongType, DoubleType, StringType)
#: Doubles from this magnitude on may have been integers pyarrow converts differently (or refuses).
_EXACT_DOUBLE = float(2**53)
_NEGATIVE_ZERO_BITS = -(2**63)  # -0.0 seen as an int64
#: pyarrow's JSON reader parses blocks of this size on its threads (measured: 1 MiB was fastest here).
BLOCK_SIZE = 1 << 20


def to_arrow(schema: Schema, records: Sequence[SinkRecord], kafka: bool, topics: set[str] | None = None) -> pa.Table | None:
    """``arrow.to_arrow(schema, records, values, kafka, topics=topics)`` from the raw bytes, or None."""
    n = len(records)
    kafka_names = ia.KAFKA_NAMES if kafka else frozenset()
    value_fields = [f for f in schema.fields if f.name not in kafka_names]
    if n == 0 or not all(isinstance(f.field_type, _PARSED) for f in value_fields):
        return None
    raws = [r.raw_value for r in records]
    if None in raws:
        return None
    buf = b"\n".join(raws)  # type: ignore[arg-type]  # None was ruled out just above
    if buf.count(b"\n") != n - 1:
        return None  # a line break inside a record: the reader would split it
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    explicit = pa.schema([arrow_schema.field(f.name) for f in value_fields])
    try:
        parsed = pj.read_json(pa.py_buffer(buf), read_options=pj.ReadOptions(use_threads=True, block_size=BLOCK_SIZE),
                              parse_options=pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="error"))
    except Exception:  # noqa: BLE001 - anything the reader refuses is for the dict path to judge and name
        return None
    if parsed.num_rows != n:
        return None
    ascii_only = buf.isascii()  # the reader does not check UTF-8; ASCII needs no check (and is the usual case)
    if topics is None:
        topics = {r.topic for r in records} if kafka else set()
    columns: list[pa.Array | pa.ChunkedArray] = []
    for f, af in zip(schema.fields, arrow_schema):
        if f.name in kafka_names:
            columns.append(ia.kafka_column(f, af, records, topics))
            continue
        col = parsed.column(f.name)
        if col.type != af.type or (f.required and col.null_count) or (isinstance(f.field_type, DoubleType) and _unsure(col)):
            return None
        if isinstance(f.field_type, StringType) and not ascii_only and not _valid_utf8(col):
            return None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=arrow_schema)


def _valid_utf8(col: pa.ChunkedArray) -> bool:
    """Strict UTF-8 (surrogates encoded as bytes, which ``json.loads`` lets through, are not)."""
    try:
        col.validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


def _unsure(col: pa.ChunkedArray) -> bool:
    """NaN, -0.0 or a magnitude >= 2**53 in a double column (see the module's docstring)."""
    if col.null_count == len(col):
        return False
    if pc.any(pc.is_nan(col)).as_py():
        return True
    big = pc.max(pc.abs(col)).as_py()
    if big is not None and big >= _EXACT_DOUBLE:
        return True
    return any(pc.any(pc.equal(chunk.view(pa.int64()), _NEGATIVE_ZERO_BITS)).as_py() for chunk in col.chunks)
