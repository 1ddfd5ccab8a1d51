"""What a poll hands the commit cycle: a batch of records, the records it could not convert, and the
protocol every record source follows (:class:`eosink.worker.engine.source.KafkaSource`, and the
in-memory sources of the model tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import SinkRecord, TopicPartition

#: A cycle carries at most this many failed records (they are listed in one ZooKeeper znode).
MAX_FAILED_PER_BATCH = 1000


@dataclass
class FailedRecord:
    """A record that could not be delivered, kept as it was on the topic for the dead-letter topic.

    ``stage`` is Kafka Connect's name for where it failed: ``VALUE_CONVERTER`` (undecodable) or
    ``TASK_PUT`` (a sink rejected it).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    error: RecordError
    stage: str = "VALUE_CONVERTER"

    @classmethod
    def of(cls, record: SinkRecord, error: RecordError, stage: str = "TASK_PUT") -> FailedRecord:
        return cls(record.topic, record.partition, record.offset, record.key, record.raw_value, record.headers,
                   record.timestamp_ms, error, stage)


@dataclass
class Batch:
    records: list[SinkRecord] = field(default_factory=list)
    nbytes: int = 0
    #: The first record that could not be converted; nothing at or after it is in ``records``.
    error: RecordError | None = None
    #: With ``errors.tolerance=all``: records that could not be converted, in the batch's range
    #: (``records`` holds the others, the batch goes on past them).
    failed: list[FailedRecord] = field(default_factory=list)
    #: The records (and their values) were made for this batch alone: the transforms may edit them
    #: in place (``TransformChain.apply_owned``) instead of copying them.
    fresh: bool = False


class RecordSource(Protocol):
    """Where a task's records come from.

    A source may also offer ``poll_batch(..., min_s=..., on_chunk=..., rows=..., native=...)`` and say so with a
    true ``incremental`` attribute (:class:`KafkaSource` does; the in-memory sources of the model tests
    need not): ``min_s`` ends a poll early once it has read everything available and is that old,
    ``on_chunk`` receives the batch's records in slices while it is still being read, and ``rows``
    is a sink's row decoder (:class:`eosink.connectors.api.rows.RowDecoding`), which it may use, and
    ``native`` its target for native rows (:class:`eosink.connectors.api.rows.NativeRowDecoding`).
    """

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """Replace the assignment; ``None`` means "from the reset policy" (nothing decided yet)."""

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch: ...

    def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None: ...

    def lag(self, *, fresh: bool = False) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...
