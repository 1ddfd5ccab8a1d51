"""Records decoded straight into a sink's typed row, their JSON value built only if something reads it.

Decoding a JSON object into a dict is the largest single cost of reading a record, and building and
freeing the dict and its keys costs as much again as a flat typed struct would: a sink that knows the
fields its rows take (the PostgreSQL sink, once it knows a table's columns) may offer the engine a
row decoder (:class:`RowDecoding`), and the source then decodes each JSON value with it into a
:class:`msgspec.Struct` of exactly those fields and types. A record it decodes becomes a
:class:`RowRecord`; a record it refuses (another field, a missing one, another type, not an object,
not JSON at all) is decoded by the connector's converter exactly as without it, and refused,
dead-lettered or delivered as before.

A :class:`RowRecord` is a :class:`~eosink.connectors.api.records.DeferredRecord`, a
:class:`SinkRecord` in every respect: reading ``value`` decodes ``raw_value`` with the converter the
source would have used (the same dict, keys in the topic's order) and makes it a plain
:class:`SinkRecord` holding it, as does assigning a value. Only the sink that offered the decoder
looks at the row, with :func:`row_of`. Its headers are converted only when read, too: the PostgreSQL
sink never reads them, and for the publisher's two headers per outbox record, converting them,
keeping and freeing them cost ~0.7 us per record end to end (3.75 against 2.9-3.2 us of worker CPU
per record, ``bench/bench_e2e.py --outbox-headers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from eosink.connectors.api.records import DeferredRecord, SinkRecord, settled_headers, value_slot

_set_headers = SinkRecord.__dict__["headers"].__set__  # the slot's own, under RowRecord's property


class RowRecord(DeferredRecord):
    """A record whose value slot holds the sink's typed row for its JSON object, and whose headers
    slot may hold the consumer's message until the headers are read (see the module)."""

    __slots__ = ()

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return settled_headers(self)

    @headers.setter
    def headers(self, h: tuple[tuple[str, bytes], ...]) -> None:
        _set_headers(self, h)


#: ``row_of(record)``: the typed row a :class:`RowRecord` holds, else the record's ``value`` (the slot
#: itself: nothing is decoded). The slot descriptor's own getter, mapped over a batch at C speed.
row_of: Callable[[SinkRecord], Any] = value_slot


class RowDecoding(Protocol):
    """What a sink offers the engine to decode JSON values into its rows.

    ``row_decoder()`` is asked once per fetched slice of records: a function taking a record's value
    bytes and returning the row (raising ``ValueError`` or ``TypeError`` for anything the row type does
    not take exactly), or None when the sink has no row type now. The engine asks only when the sink
    is the task's only sink, nothing transforms the records, and ``value.converter=json`` without
    schemas (so that ``raw_value`` is the value's own encoding).
    """

    def row_decoder(self) -> Callable[[bytes], Any] | None: ...


@dataclass(frozen=True, eq=False, slots=True)
class NativeRowTarget:
    """The columns a sink's rows have, for a converter with a schema of its own to decode into (Avro).

    ``columns``: (name, pg_type name) of each column, in the order of the row's values. A record whose
    writer's schema has exactly these fields, in this order, each of a type that column takes natively
    (see :mod:`eosink.worker.engine.avro_rows`), is decoded straight into a plain tuple of native values
    (int, bool, float, :class:`~decimal.Decimal`, aware :class:`~datetime.datetime`, bytes, and a
    string's UTF-8 bytes): no dict, and no text the server parses again. Identity is the object: the sink hands out a new one
    whenever its rows change, and a decoder is built once per writer's schema and target.
    """

    columns: tuple[tuple[str, str], ...]


class NativeRowDecoding(Protocol):
    """What a sink offers the engine to decode values of a converter with schemas into its rows.

    ``native_row_target()`` is asked once per fetched slice of records, as ``row_decoder`` is, and
    only under the same conditions but with ``value.converter=avro``: the target, or None when the
    sink takes no native rows now. A record decoded so holds a plain tuple in its value slot
    (:func:`row_of`) and its ``value`` is the converter's dict, decoded again if anything reads it.
    """

    def native_row_target(self) -> NativeRowTarget | None: ...
