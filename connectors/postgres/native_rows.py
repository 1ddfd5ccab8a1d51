"""Native rows for the PostgreSQL sink's streamed COPY: Avro values as Python objects, in binary COPY.

Values read through the Avro converter reach a sink as JSON-like dicts, a decimal, a timestamp and bytes
as text: their table (typed from the writer's schema) has numeric, timestamptz and bytea columns, so the
COPY is in text and the server parses each value again. Once a stream of such records has run, the sink
offers the engine its columns (:class:`~eosink.connectors.api.rows.NativeRowTarget`): values whose
writer's schema has exactly those fields are then decoded straight into tuples of the values psycopg's
binary dumpers take as they are (:mod:`eosink.worker.engine.avro_rows`), and COPYed in binary.
The server still checks each value against its column (a numeric's precision, NOT NULL), as in text.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eosink.connectors.api.rows import NativeRowTarget
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres.schema import KAFKA_COLUMN_NAMES, Table

#: Column types (pg_type names) whose binary COPY input takes the native value of an Avro field exactly:
#: the field types each takes are in :data:`eosink.worker.engine.avro_rows._COLUMNS`. Not int2/int4 (psycopg
#: truncates out-of-range ints silently in binary) nor float4 (a double would round).
NATIVE_TYPNAMES = frozenset({"int8", "bool", "float8", "text", "varchar", "numeric", "timestamptz", "bytea"})


#: A string arrives as its UTF-8 bytes: binary COPY's text and bytea fields are both the bytes themselves, so
#: they go through psycopg's bytes dumper with no decode and encode again; the server checks them as text
#: (invalid UTF-8 or a NUL is refused, as the str would be), on a connection whose client encoding is UTF-8
#: (:func:`utf8`).
_COPY_TYPES = {"text": "bytea", "varchar": "bytea"}


def utf8(conn: Any) -> bool:
    """The connection's client encoding is UTF-8: the bytes of an Avro string are then its text as is."""
    return str(conn.info.encoding).replace("-", "").lower() == "utf8"


def native_shape(table: Table, keys: tuple[str, ...], kafka: bool) -> pgc.Shape | None:
    """The binary COPY shape for native rows of ``keys`` (every one a column of ``table`` of a type in
    :data:`NATIVE_TYPNAMES`), or None."""
    if not keys or any(k not in table.columns or table.columns[k].typname not in NATIVE_TYPNAMES for k in keys):
        return None
    shape = pgc.Shape.of(table, keys, kafka)
    if kafka and not all(pgc.kafka_binary_ok(table.columns[c]) for c in KAFKA_COLUMN_NAMES):
        return None
    types = tuple(_COPY_TYPES.get(table.columns[k].typname, table.columns[k].typname) for k in keys) + shape.types[len(keys):]
    return dataclasses.replace(shape, binary=True, types=types, row_type=None, decode=None, native=True)


def target_of(shape: pgc.Shape) -> NativeRowTarget:
    """What the engine decodes rows of ``shape`` for: its columns and their types, in order."""
    return NativeRowTarget(tuple((c, shape.table.columns[c].typname) for c in shape.cols))
