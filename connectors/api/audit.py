"""The audit contract: how a sink is read back by itself, so its contents can be checked against the outbox.

Exactly-once is a claim about what a sink *holds*: every committed outbox record once, nothing else.
The engine (:mod:`eosink.worker.audit`) reads the source topics read_committed; a sink only has to
say, through an :class:`AuditReader`, at which Kafka coordinates it holds a record - once per copy
it holds, so a duplicate shows as the same offset twice. A sink whose data carries no coordinates
cannot be audited exactly, and its reader says so (:attr:`AuditReader.limit`) instead of guessing.

Nothing here imports the engine or a connector: a plugin implements this protocol with this
package alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from eosink.connectors.api.records import TopicPartition

#: The offset a reader gives a record it found in a partition but cannot place (more lines in an
#: object than its offsets hold records): counted as present but not in the source.
UNPLACED = -1
#: The partition a reader gives a record it cannot tie to any partition (a line with no coordinates
#: at all): counted as foreign, under this partition, in the sink's report.
NOWHERE = TopicPartition("", -1)


@dataclass(frozen=True, slots=True)
class Window:
    """The offsets of one partition under audit: ``[first, end)``; the source's committed records
    in it are the expected ones (``end`` is the decision log's ``next_offset`` or the range asked)."""

    first: int
    end: int


class SourceView(Protocol):
    """The committed outbox records under audit, as the engine read them (read_committed)."""

    def offsets(self, tp: TopicPartition) -> Sequence[int]:
        """The offsets of ``tp``'s committed records in its window, ascending."""
        ...

    def keyed(self, tp: TopicPartition) -> Iterable[tuple[int, bytes | None, bytes | None]]:
        """``(offset, key, value)`` of ``tp``'s committed records, ascending; only kept for a reader
        with :attr:`AuditReader.needs_records` set."""
        ...

    def digests(self, tp: TopicPartition) -> Sequence[int]:
        """The :func:`~eosink.connectors.common.jsonlines.line_digest` of the JSON Lines line each of
        ``tp``'s committed records is written as, aligned with :meth:`offsets`; kept only when a
        reader sets ``needs_digests = True`` (an optional attribute) and the engine can tell the line
        from the record (``value.converter`` json or string, no transforms): else empty."""
        ...


class AuditReader(Protocol):
    """One sink of a connector, read back by itself."""

    #: The sink's name in the report (the fan-out alias, or the connector class's alias).
    name: str
    #: None when the sink can be audited exactly; else why not, in words for an operator (the sink
    #: is then reported as not audited, never as clean).
    limit: str | None
    #: Whether :meth:`expected` needs the records' keys and values (the engine keeps them only then).
    needs_records: bool

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterable[tuple[TopicPartition, list[int]]]:
        """For each partition (in any number of chunks), the offset of every record the sink holds,
        repeated once per copy; :data:`UNPLACED` for a record that has no offset to give. Offsets
        outside the windows may be given: the engine ignores those before a window and counts those
        past it as in flight."""
        ...

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        """Which of the due offsets ``due`` must be present once: all of them, for a sink that keeps
        every record; the last record of each key, for one that keeps one row per key."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class NotAuditable:
    """The reader of a sink that cannot be read back (a third-party endpoint, values without
    coordinates): it names why, and reads nothing."""

    needs_records = False

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.limit: str | None = why

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterable[tuple[TopicPartition, list[int]]]:
        return ()

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        return None


__all__ = ["NOWHERE", "UNPLACED", "AuditReader", "NotAuditable", "SourceView", "Window"]
