"""The batch's JSON bytes parsed straight into Arrow buffers in C (``_json_columns.c``), in one pass.

Why: Arrow's JSON reader (:mod:`.jsonarrow`) is fast, but what surrounds it is not: joining the
records' bytes into one document, checking every value is an object, checking the UTF-8, the
Kafka coordinate columns built from Python lists, and the float columns' exactness checks, each a
pass over the batch - together more Python than the reader's own parse. Here one C call reads each
record's bytes (and partition and offset) and, with the GIL released, writes the value columns'
Arrow buffers directly: int64/float64 values, large_string offsets and bytes, boolean bitmaps,
validity bitmaps; ``pa.Array.from_buffers`` wraps them without a copy.

Like the reader, it never decides anything: it returns a table only where it is exactly what the
checked path (:func:`eosink.connectors.iceberg.arrow.to_arrow`) makes of the same records, and None
for everything else (the list is in ``_json_columns.c``'s header; it declines more than the checked
path refuses - an escaped key, a float that overflows - since declining only costs time). The caller
then tries Arrow's reader, then the checked path, whose errors name the record.

Its string columns' scratch buffers are kept between batches (up to 64 MB, see ``_json_columns.c``):
fresh ones of a few MB each cost a page fault every 4 KB, a noticeable part of the parse.

Where the extension is not built (no C compiler at install) or ``EOSINK_ICEBERG_NATIVE=0`` (or
:data:`enabled` set False, as tests do), :func:`from_json` returns None and the reader runs as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import pyarrow as pa
from pyiceberg.schema import Schema

from eosink.connectors.api.records import LazyJsonRecord, SinkRecord
from eosink.connectors.iceberg.arrow import KAFKA_NAMES, kafka_column, kafka_column_built

try:
    from eosink.connectors.iceberg import _json_columns  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: Arrow's reader
    _json_columns = None

ENV = "EOSINK_ICEBERG_NATIVE"
#: Whether :func:`from_json` parses in C (read once from the environment; tests set it).
enabled: bool = _json_columns is not None and os.environ.get(ENV, "1") != "0"
#: Arrow type of a value column -> the C parser's kind of column.
_KINDS = {pa.int64(): 0, pa.float64(): 1, pa.large_string(): 2, pa.bool_(): 3}
#: Column names the C parser matches against a key's raw bytes: none it would have to see escaped.
_PLAIN_NAME = re.compile(rb'[^"\\\x00-\x1f]*')


def available() -> bool:
    """Whether the extension is built and enabled."""
    return enabled and _json_columns is not None


def from_json(schema: Schema, arrow_schema: pa.Schema, records: Sequence[SinkRecord], kafka: bool,
              topics: set[str]) -> pa.Table | None:
    """The records as an Arrow table of ``arrow_schema`` (``schema``'s), parsed in C; None where the
    C parser declines or is not available (see the module docs)."""
    if not available() or not records:
        return None
    coord = {f.name: af.type for f, af in zip(schema.fields, arrow_schema) if kafka and f.name in KAFKA_NAMES}
    values = [(f, af) for f, af in zip(schema.fields, arrow_schema) if f.name not in coord]
    kinds = bytes(_KINDS.get(af.type, 255) for _, af in values)
    names = tuple(f.name.encode() for f, _ in values)
    if not values or 255 in kinds or not all(map(_PLAIN_NAME.fullmatch, names)):
        return None
    if not all(kafka_column_built(f) for f in schema.fields if f.name in coord):
        return None
    width = 4 if coord.get("__partition") == pa.int32() else 8
    parsed = _json_columns.parse(records if isinstance(records, list) else list(records),
                                 names, kinds,
                                 bytes(f.required for f, _ in values), SinkRecord, LazyJsonRecord, width if coord else 0)
    if parsed is None:
        return None
    columns, partitions, offsets = parsed
    n = len(records)
    built: dict[str, pa.Array] = {}
    for (f, af), (nulls, validity, data, offs) in zip(values, columns):
        bufs = [None if validity is None else pa.py_buffer(validity)]
        bufs += [pa.py_buffer(data)] if offs is None else [pa.py_buffer(offs), pa.py_buffer(data)]
        built[f.name] = pa.Array.from_buffers(af.type, n, bufs, null_count=nulls)
    for name, t in coord.items():
        if name == "__partition" or (name == "__offset" and t == pa.int64()):
            buf = partitions if name == "__partition" else offsets
            built[name] = pa.Array.from_buffers(t, n, [None, pa.py_buffer(buf)], null_count=0)
        else:
            built[name] = kafka_column(schema.find_field(name), t, records, topics)
    return pa.Table.from_arrays([built[f.name] for f in schema.fields], schema=arrow_schema)
