"""Record and transaction types shared by the engine (``worker/``) and every connector."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from eosink.connectors.api.errors import RecordError
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

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode() if isinstance(v, bytes) else v
        return None

    @property
    def record_id(self) -> str:
        """Stable id: the publisher's id header, else topic/partition/offset."""
        return self.header(ID_HEADER) or f"{self.topic}/{self.partition}/{self.offset}"


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
    v = r.value
    if r.raw_value is not None and isinstance(v, (dict, list)):
        return r.raw_value
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
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> TxnManifest:
        d = json.loads(text)
        return cls(
            txn_id=d["txn"],
            connector=d["connector"],
            ranges=tuple(PartitionRange(t, int(p), int(a), int(b), int(e)) for t, p, a, b, e in d["ranges"]),
        )
