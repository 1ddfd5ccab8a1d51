"""Record and transaction types shared by the engine (``worker/``) and every connector."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import Message

from eosink.connectors.api import formats
from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common import jsoncodec

#: Header set by ``spark_jobs`` on every outbox record: ``job/run/partition/sequence``.
ID_HEADER = "eosink.id"
#: Header carrying the Spark run id.
RUN_HEADER = "eosink.run"


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(slots=True)
class SinkRecord:
    """One committed outbox record, as a connector sees it.

    ``value`` is the decoded value (per the connector's ``value.converter``); ``raw_value`` keeps
    the bytes as they were on the topic so a sink that stores JSON can write them without
    re-encoding. Once transforms change a JSON value, ``raw_value`` is the new value's compact JSON
    where they could write it natively (``eosink.worker.transforms.chain``), else None: it is never
    stale.
    """

    topic: str
    partition: int
    offset: int
    #: The key as ``key.converter`` decoded it: bytes (the default ``bytes`` converter), str, or a
    #: JSON value (``json``); transforms such as ValueToKey may make it a dict.
    key: Any
    value: Any
    raw_value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    #: The writer's schema of a value read with a Schema Registry converter (one shared object per
    #: schema id), else None: what a sink creating or evolving a table types its columns from.
    value_schema: WriterSchema | None = None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> str | None:
        return header_in(self.headers, name)

    @property
    def record_id(self) -> str:
        """Stable id: the publisher's id header, else topic/partition/offset."""
        return self.id_with(self.headers)

    def id_with(self, headers: Sequence[tuple[str, bytes]]) -> str:
        """:attr:`record_id` from ``headers`` already read (each read of a deferred record's is a call)."""
        return header_in(headers, ID_HEADER) or f"{self.topic}/{self.partition}/{self.offset}"


def header_in(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    """The first header called ``name``, as text."""
    for k, v in headers:
        if k == name:
            return v.decode() if isinstance(v, bytes) else v
    return None


#: The ``value`` a :class:`LazyJsonRecord` holds until something reads it.
UNDECODED: Any = type("Undecoded", (), {"__repr__": lambda self: "UNDECODED", "__slots__": ()})()
_value_slot = SinkRecord.__dict__["value"]  # the slots' own descriptors, under DeferredRecord's properties
_get_value, _set_value = _value_slot.__get__, _value_slot.__set__
_headers_slot = SinkRecord.__dict__["headers"]
_get_headers, _set_headers = _headers_slot.__get__, _headers_slot.__set__
#: ``value_slot(record)``: what the record's value slot holds - for a :class:`DeferredRecord`, the sink's
#: row or ``UNDECODED``, nothing decoded; the descriptor's own getter, mapped over a batch at C speed.
value_slot: Callable[[SinkRecord], Any] = _get_value


def settled_headers(r: SinkRecord) -> tuple[tuple[str, bytes], ...]:
    """The record's headers, converted from the consumer's message its slot holds if not yet."""
    h = _get_headers(r)
    if h.__class__ is Message:
        pairs = h.headers()  # the message's own copy of librdkafka's headers
        h = tuple(pairs) if pairs else ()
        _set_headers(r, h)
    return h


class DeferredRecord(SinkRecord):
    """A record read from Kafka whose value is built only if something reads it.

    Decoding a JSON value is the largest single cost of reading a record: a sink that does not need
    it in full gets records whose value slot holds what it asked for instead (a subclass says what;
    :class:`eosink.connectors.api.rows.RowRecord` also defers its headers, whose slot then holds the
    consumer's message). In every other respect it is the plain record: reading ``value`` decodes
    ``raw_value`` as the connector's converter would (``value.converter=json`` without schemas, the
    only converter this is used with) and makes it a plain :class:`SinkRecord` holding the value (its
    headers converted), as does assigning a value; equality, ``repr``, copies and pickles are those
    of the plain record with the value decoded.
    """

    __slots__ = ()

    @property
    def value(self) -> Any:
        v = jsoncodec.decode_value(self.raw_value)
        _set_value(self, v)
        self._plain()
        return v

    @value.setter
    def value(self, v: Any) -> None:
        _set_value(self, v)
        self._plain()

    def _plain(self) -> None:
        """Become the plain record (the value slot holds the value now): headers converted first."""
        try:
            settled_headers(self)
        except AttributeError:
            pass  # being constructed (``dataclasses.replace``): its headers are assigned next
        self.__class__ = SinkRecord  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        self.value  # noqa: B018 - decoded: now a plain SinkRecord, compared as one
        return self == other

    def __repr__(self) -> str:
        self.value  # noqa: B018
        return repr(self)

    __hash__ = None  # type: ignore[assignment]  # as SinkRecord's (a mutable dataclass)

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy or pickle is the plain record, value decoded."""
        value = self.value
        return (SinkRecord, (self.topic, self.partition, self.offset, self.key, value, self.raw_value, self.headers,
                             self.timestamp_ms))


class LazyJsonRecord(DeferredRecord):
    """A record whose value is a JSON object or array, checked as it was read but not decoded yet.

    A sink that only copies such a value's bytes (``raw_value``: JSON Lines, HTTP bodies) never
    needs the decoded value, and decoding it is the larger part of reading a JSON record: with
    ``value.converter=json``, no transforms, and sinks that all say ``reads_values = False``, the
    source checks each value with :func:`eosink.connectors.common.jsoncodec.is_json_container` -
    the same refusals as decoding, naming the same record - and makes this record instead of
    decoding it; its value slot holds ``UNDECODED``. Since reading or assigning the value makes it a
    plain record, ``r.__class__ is LazyJsonRecord`` always means "``raw_value`` is the topic's bytes of
    a JSON object or array, and nothing has read or changed the value" (see :func:`copied_json`).
    """

    __slots__ = ()


def copied_json(r: SinkRecord) -> bytes | None:
    """The bytes a sink may copy as the record's JSON: the topic's own, when the value is a JSON
    object or array read from them (None otherwise: :func:`json_document` encodes it)."""
    if r.__class__ is LazyJsonRecord:
        return r.raw_value
    raw = r.raw_value
    return raw if raw is not None and isinstance(r.value, (dict, list)) else None


_class = operator.attrgetter("__class__")
_value = operator.attrgetter("value")


def values_of_types(records: Sequence[SinkRecord], types: frozenset[type]) -> bool:
    """Whether every record's value is exactly one of ``types`` (e.g. ``dict`` and ``list``), told without
    decoding a :class:`LazyJsonRecord`: its bytes are a JSON object or array, so it counts as either -
    a caller asking for objects only must refuse arrays itself. C loops (map, set) for the usual batch."""
    classes = set(map(_class, records))
    if LazyJsonRecord not in classes:
        return set(map(type, map(_value, records))) <= types
    if len(classes) == 1:
        return True
    return set(map(type, (r.value for r in records if r.__class__ is not LazyJsonRecord))) <= types


def key_json(r: SinkRecord) -> bytes:
    """The record's key as JSON for an envelope: bytes as their UTF-8 text, anything else as JSON."""
    k = r.key
    if k is None:
        return b"null"
    if isinstance(k, bytes):
        k = k.decode("utf-8", "replace")
    return json.dumps(k, separators=(",", ":"), default=str).encode()


def json_document(r: SinkRecord, *, component: str, needs: str) -> bytes:
    """The record's value as one JSON document: the topic's own bytes for objects and arrays (no
    re-encoding), compact JSON for anything else. Raw bytes (``value.converter=bytes``) have no
    JSON form: a RecordError naming the record and ``needs`` (what the sink requires)."""
    raw = copied_json(r)
    if raw is not None:
        return raw
    v = r.value
    if isinstance(v, (bytes, bytearray)):
        raise RecordError(f"value is raw bytes (value.converter=bytes); {needs}",
                          topic=r.topic, partition=r.partition, offset=r.offset, component=component)
    return jsoncodec.encode(v)  # json.dumps' compact bytes, natively where msgspec writes the same


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What one transaction covers of one partition, and under which epoch it was prepared."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    epoch: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class TxnManifest:
    """Everything recovery needs to tie a prepared transaction back to the decision log.

    Each sink stores it durably at ``pre_commit`` and returns it from ``recover()``.
    """

    txn_id: str
    connector: str
    ranges: tuple[PartitionRange, ...] = field(default_factory=tuple)

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return frozenset(r.tp for r in self.ranges)

    def epoch_of(self, tp: TopicPartition) -> int | None:
        for r in self.ranges:
            if r.tp == tp:
                return r.epoch
        return None

    @classmethod
    def covering(cls, txn_id: str, connector: str, records: Sequence[SinkRecord], epoch: int) -> TxnManifest:
        """The manifest of a transaction holding ``records``, every partition at ``epoch``: per
        partition its first and last offset (what a sink's own tests and benchmarks prepare)."""
        lo: dict[tuple[str, int], int] = {}
        hi: dict[tuple[str, int], int] = {}
        for r in records:
            k = (r.topic, r.partition)
            lo[k], hi[k] = min(lo.get(k, r.offset), r.offset), max(hi.get(k, r.offset), r.offset)
        return cls(txn_id, connector, tuple(PartitionRange(t, p, lo[(t, p)], hi[(t, p)], epoch) for t, p in sorted(lo)))

    def to_json(self) -> str:
        return json.dumps(
            {
                "txn": self.txn_id,
                "connector": self.connector,
                "ranges": [[r.topic, r.partition, r.first_offset, r.last_offset, r.epoch] for r in self.ranges],
                "format": formats.MANIFEST,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "a stored manifest") -> TxnManifest:
        """The manifest ``text`` holds; :class:`~eosink.connectors.api.formats.NewerFormatError` when a newer
        eosink wrote it in a format this one does not read (``where``: the place, for that error)."""
        d = json.loads(text)
        formats.check(formats.version_of(d), formats.MANIFEST, "the transaction manifest", where, component="manifest")
        return cls(
            txn_id=d["txn"],
            connector=d["connector"],
            ranges=tuple(PartitionRange(t, int(p), int(a), int(b), int(e)) for t, p, a, b, e in d["ranges"]),
        )
