"""JSON values encoded straight into binary COPY rows in C (``_copy_rows.c``), for the streamed COPY.

Why: once a stream has run, the source decodes each JSON value into the table's typed row
(:func:`eosink.connectors.postgres.copy.row_type`), the sink turns it into a tuple, adds the Kafka
coordinates and psycopg encodes it field by field: about 1.5 us of Python per record end to end, the
largest share of the worker's CPU. Where the shape's columns are all ``int8``, ``bool``, ``float8`` or
text, the row decoder offered to the engine is instead :class:`Encoded`'s ``encode``: it parses the
value's JSON and writes the row's binary COPY fields in one C call (a ``bytes`` in the record's value
slot), and a slice of such records becomes one ``bytes`` - field counts, fields, coordinates - written
with one ``Copy.write`` (:func:`join`). The bytes are exactly psycopg's for the row the Python path
builds (``tests/test_copy_rows_native.py`` pins them); any value outside the plain cases (a missing or
extra field, another type, an int beyond bigint, an escaped key, a NUL, malformed JSON...) is refused,
decoded by the converter as without the encoder, and its batch goes the Python way, with the same
errors naming the record.

Where the extension is not built (no C compiler at install) or ``EOSINK_PG_NATIVE=0`` (or
:data:`enabled` set False, as tests do), :func:`encoded` returns None and the Python path runs as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres.schema import KAFKA_COLUMN_NAMES

if TYPE_CHECKING:
    from eosink.connectors.postgres.copy import Shape

try:
    from eosink.connectors.postgres import _copy_rows  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the Python path
    _copy_rows = None

ENV = "EOSINK_PG_NATIVE"
#: Whether :func:`encoded` builds C encoders (read once from the environment; tests set it).
enabled: bool = _copy_rows is not None and os.environ.get(ENV, "1") != "0"
#: Binary COPY's header (signature, flags, no extension) and trailer, written around a stream of joined rows.
SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
#: (column kind, COPY type) -> the C encoder's kind of field.
_KINDS = {(pgs.INT8, "int8"): 0, (pgs.BOOL, "bool"): 1, (pgs.FLOAT, "float8"): 2, (pgs.TEXT, "text"): 3}


def available() -> bool:
    """Whether the extension is built and enabled."""
    return enabled and _copy_rows is not None


@dataclass(frozen=True, eq=False, slots=True)
class Encoded:
    """A shape's C encoder: ``encode(raw) -> bytes`` (the row decoder the sink offers), and how
    :func:`join` completes its rows."""

    encode: Callable[[bytes], bytes]
    nfields: int
    #: 4 or 8: the ``__partition`` column's width; 0: no Kafka coordinate columns.
    partition_width: int


def encoded(shape: Shape, utf8: bool) -> Encoded | None:
    """The C encoder of ``shape``'s rows, or None: not available, not a binary COPY of typed rows, a
    column of a type it does not write, or a connection whose client encoding is not UTF-8 (psycopg
    would encode text in it)."""
    if not available() or not utf8 or not shape.binary or shape.row_type is None or shape.unknown or shape.native:
        return None
    kinds = []
    for name, copy_type in zip(shape.cols, shape.types):
        kind = _KINDS.get((shape.table.columns[name].kind, copy_type))
        if kind is None:
            return None
        kinds.append(kind)
    width = 0
    if shape.kafka:
        kafka_types = shape.types[len(shape.cols):]
        if len(kafka_types) != len(KAFKA_COLUMN_NAMES) or kafka_types[0] != "text" or kafka_types[2] != "int8":
            return None
        width = {"int4": 4, "int8": 8}.get(kafka_types[1], 0)
        if not width:
            return None
    names = tuple(c.encode() for c in shape.cols)
    return Encoded(_copy_rows.Encoder(tuple(kinds), names), len(kinds), width)


def join(enc: Encoded, rows: list[Any], recs: list[Any], ordinal: int | None) -> tuple[bytes, int]:
    """The binary COPY tuples of the leading ``rows`` that ``enc`` encoded (``bytes``), with ``recs``'
    coordinates (and the upsert stage's order columns from ``ordinal``), and how many."""
    joined: tuple[bytes, int] = _copy_rows.join(rows, recs, 0, enc.nfields, enc.partition_width,
                                                -1 if ordinal is None else ordinal)
    return joined
