"""The batch's JSON bytes parsed straight into the table's Arrow columns (Arrow's own JSON reader).

The checked path (:func:`eosink.connectors.iceberg.arrow.to_arrow`) builds every column from
decoded dicts: ~0.75 us per record of 9 fields, most of a cycle. Every record also carries the
bytes it had on the topic (``raw_value``, the JSON of its value), and Arrow's C++ reader turns
those into typed columns on every core in ~0.36 us of CPU per record, with nothing decoded in
Python at all (the engine then leaves values undecoded for this sink: ``reads_values = False``).

:func:`from_json` first asks the C parser (:mod:`.jsonnative`), which reads the same bytes straight
into Arrow buffers in one pass and skips the Python passes this reader needs around it (the join,
the object and UTF-8 checks, the coordinate columns, the float checks below); where it declines (or
is not built, or ``EOSINK_ICEBERG_NATIVE=0``) the reader runs as described here, then the checked path.

**It never decides anything.** :func:`from_json` returns a table only when it is *exactly* what
the checked path makes of the same records, and None otherwise; the caller then takes the checked
path, whose result and errors (naming topic, partition, offset and column) are those of a batch
that never tried. Measured differences between the reader and the checked path, and how each one
falls back:

* a column type other than long, double, string or boolean (what ``auto.create`` makes): not tried;
* a field with no column, a duplicate key, a value of another JSON type than its column's (an
  object or array for a string column, which the checked path stores as JSON text; a number for a
  boolean; a float for a long), a long beyond 64 bits, a lone surrogate, a top-level array:
  the reader refuses;
* a double column: the reader rounds integers a double cannot hold (the checked path refuses
  them), reads ``-0`` as -0.0 (the checked path: 0.0) and takes ``NaN``: any value of magnitude
  2**53 or more, any -0.0 and any NaN in a double column falls back;
* a required column with a null or missing value: falls back;
* non-ASCII bytes: the reader does not validate UTF-8 inside strings, so the batch's bytes are
  decoded once first (the engine hands over only values that passed that check, but a sink
  promising exactly what was sent checks rather than trusts);
* a value that is not a JSON object (checked before the reader sees it, without decoding one);
* a record without its bytes (``raw_value`` None: a transform that could not re-encode, a
  ``schemas.enable`` envelope), or any count of rows other than the records': falls back.

``tests/test_iceberg_jsonarrow.py`` pins this with a hypothesis property against the checked path.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import BooleanType, DoubleType, LongType, StringType

from eosink.connectors.api.records import SinkRecord, values_of_types
from eosink.connectors.iceberg import jsonnative
from eosink.connectors.iceberg.arrow import KAFKA_NAMES, kafka_column, kafka_column_built

#: Column types the reader converts exactly as the checked path does (see the module docs).
_PARSED = (LongType, DoubleType, StringType, BooleanType)
#: The smallest magnitude at which a double may be a rounded integer the checked path refuses.
_EXACT_DOUBLE = float(2**53)
_raw = attrgetter("raw_value")
_OBJECTS = frozenset({dict})


def _block_size(n: int) -> int:
    """Blocks of 256 KB to 1 MB: one per thread and a few more (a value longer than a block fails and falls back)."""
    return min(1 << 20, max(1 << 18, n // 8))


def _doubles_exact(col: pa.ChunkedArray) -> bool:
    """No value the checked path would have made otherwise: none of magnitude >= 2**53, no NaN, no -0.0."""
    if col.null_count == len(col):
        return True
    if pc.any(pc.is_nan(col)).as_py():
        return False
    top = pc.max(pc.abs(col)).as_py()
    if top is None or top >= _EXACT_DOUBLE:
        return False
    zeros = pc.filter(col, pc.equal(col, 0.0))
    # 1 / -0.0 is -inf: a -0 the record spelled as an integer would have been +0.0 on the checked path.
    return len(zeros) == 0 or not pc.any(pc.less(pc.divide(1.0, zeros), 0.0)).as_py()


def from_json(schema: Schema, records: Sequence[SinkRecord], kafka: bool, topics: set[str]) -> pa.Table | None:
    """The records as an Arrow table with exactly ``schema``'s columns, parsed from their JSON bytes (in C
    where :mod:`.jsonnative` can, else by Arrow's reader); None where the checked path must judge the
    batch (see the module docs)."""
    if not records:
        return None
    value_fields = [f for f in schema.fields if not (kafka and f.name in KAFKA_NAMES)]
    if not value_fields or not all(isinstance(f.field_type, _PARSED) for f in value_fields):
        return None
    if kafka and not all(kafka_column_built(f) for f in schema.fields if f.name in KAFKA_NAMES):
        return None  # (before the parse: a table like that would parse every batch for nothing)
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    native = jsonnative.from_json(schema, arrow_schema, records, kafka, topics)
    if native is not None:
        return native
    # Every value a JSON object (an undecoded one is an object or an array, which the reader refuses):
    # not left to the reader, which takes a top-level ``null`` as a row of nulls and crashes the process
    # on one that starts its input (pyarrow 26; the checked path refuses a null value as a tombstone).
    if not values_of_types(records, _OBJECTS):
        return None
    try:
        body = b"\n".join(map(_raw, records))
    except TypeError:  # a record without its bytes
        return None
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    explicit = pa.schema([arrow_schema.field(f.name).with_nullable(True) for f in value_fields])
    try:
        parsed = pj.read_json(
            pa.BufferReader(body),
            read_options=pj.ReadOptions(use_threads=True, block_size=_block_size(len(body))),
            parse_options=pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="error", newlines_in_values=False),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    n = len(records)
    if parsed.num_rows != n or parsed.schema.names != explicit.names:
        return None
    for f in value_fields:
        col = parsed.column(f.name)
        if f.required and col.null_count:
            return None
        if isinstance(f.field_type, DoubleType) and not _doubles_exact(col):
            return None
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for f, af in zip(schema.fields, arrow_schema):
        if not (kafka and f.name in KAFKA_NAMES):
            arrays.append(parsed.column(f.name))
            continue
        coords = kafka_column(f, af.type, records, topics)
        assert coords is not None  # (built: checked above)
        arrays.append(coords)
    return pa.Table.from_arrays(arrays, schema=arrow_schema)
