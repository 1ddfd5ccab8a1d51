"""The outbox as the audit sees it: each partition's committed records over its window, read_committed.

Reading read_committed is what makes the source the truth: a record of an aborted Kafka
transaction, and a transaction marker, occupy an offset that the consumer never returns, so an
offset a sink holds and the source lacks is *foreign* by construction.

Only what the tally needs is kept per record: its offset (an ``array`` of 8 bytes), its
``eosink.id`` header (for naming culprits), and - only when a reader asks - its key and value
(for "last record per key") or a digest of its value (8 bytes, to compare a JSON Lines line with
its record).
"""

from __future__ import annotations

import bisect
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from eosink.connectors.api.audit import Window
from eosink.connectors.api.errors import EosinkError, RetryableError
from eosink.connectors.api.records import ID_HEADER, TopicPartition

#: How long a partition that returns nothing (its window ends on markers or aborted records) is
#: waited for before its position is checked against the high watermark.
_IDLE_S = 2.0


class SourceUnreadable(RetryableError):
    """Kafka did not hand over a partition's window in time (or refused): the audit cannot tell."""


class SourceIndex:
    """The committed records of every partition under audit (implements ``SourceView``)."""

    def __init__(self, keep_records: bool, digest: Callable[[bytes | None], int] | None = None) -> None:
        self.keep_records = keep_records
        self.digest = digest
        self._digests: dict[TopicPartition, array[int]] = {}
        self._offsets: dict[TopicPartition, array[int]] = {}
        self._ids: dict[TopicPartition, list[str | None]] = {}
        self._records: dict[TopicPartition, list[tuple[int, bytes | None, bytes | None]]] = {}
        self.seconds = 0.0

    def add(self, tp: TopicPartition, offset: int, rid: str | None, key: bytes | None, value: bytes | None) -> None:
        self._offsets.setdefault(tp, array("q")).append(offset)
        self._ids.setdefault(tp, []).append(rid)
        if self.keep_records:
            self._records.setdefault(tp, []).append((offset, key, value))
        if self.digest is not None:
            self._digests.setdefault(tp, array("q")).append(self.digest(value))

    def offsets(self, tp: TopicPartition) -> Sequence[int]:
        return self._offsets.get(tp, array("q"))

    def digests(self, tp: TopicPartition) -> Sequence[int]:
        return self._digests.get(tp, array("q"))

    def keyed(self, tp: TopicPartition) -> Iterable[tuple[int, bytes | None, bytes | None]]:
        return self._records.get(tp, [])

    def id_of(self, tp: TopicPartition, offset: int) -> str | None:
        """The id of the committed record at ``offset`` (its ``eosink.id`` header, else
        ``topic/partition/offset`` as :attr:`SinkRecord.record_id` has it), None when there is none."""
        offs = self._offsets.get(tp)
        if offs is None:
            return None
        i = bisect.bisect_left(offs, offset)
        if i == len(offs) or offs[i] != offset:
            return None
        return self._ids[tp][i] or f"{tp.topic}/{tp.partition}/{offset}"

    @property
    def records(self) -> int:
        return sum(len(o) for o in self._offsets.values())


def _id_of(headers: list[tuple[str, bytes | str | None]] | None) -> str | None:
    for k, v in headers or ():
        if k == ID_HEADER:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return None


def read(bootstrap: str, kafka: Mapping[str, Any], windows: Mapping[TopicPartition, Window], *,
         keep_records: bool = False, digest: Callable[[bytes | None], int] | None = None,
         timeout_s: float = 600.0) -> SourceIndex:
    """Every committed record of each partition's ``[first, end)``; a partition whose window is empty
    is not read; ``digest``: kept of each record's value (see ``SourceView.digests``). Raises
    :class:`SourceUnreadable` when a window cannot be read to its end in time."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KTP

    index = SourceIndex(keep_records, digest)
    values = keep_records or digest is not None
    todo = {tp: w for tp, w in windows.items() if w.end > w.first}
    if not todo:
        return index
    t0 = time.perf_counter()
    consumer = Consumer({**kafka, "bootstrap.servers": bootstrap, "group.id": f"eosink-audit-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest",  # a window starting before the log: from its start
                         "fetch.queue.backoff.ms": 20, "queued.min.messages": 200_000, "log_level": 3})
    try:
        consumer.assign([KTP(tp.topic, tp.partition, w.first) for tp, w in todo.items()])
        deadline = time.monotonic() + timeout_s
        last_seen = {tp: time.monotonic() for tp in todo}
        add = index.add
        while todo:
            if time.monotonic() > deadline:
                raise SourceUnreadable(f"reading {', '.join(map(str, todo))} took longer than {timeout_s:.0f} s",
                                       component="audit")
            done: set[TopicPartition] = set()
            for m in consumer.consume(10_000, 0.05):  # returns at the timeout when fewer are queued
                err = m.error()
                tp = TopicPartition(str(m.topic()), int(m.partition() or 0))
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(tp)
                        continue
                    if err.retriable():
                        continue
                    raise SourceUnreadable(f"Kafka at {bootstrap}: {err}", component="audit")
                w = todo.get(tp)
                if w is None:
                    continue
                off = int(m.offset() or 0)
                last_seen[tp] = time.monotonic()
                if off >= w.end:
                    done.add(tp)
                    continue
                headers: Any = m.headers()  # a list as consumed (a dict only when producing)
                add(tp, off, _id_of(headers), m.key() if keep_records else None, m.value() if values else None)
                if off == w.end - 1:
                    done.add(tp)
            for tp, pos in _positions(consumer, todo, last_seen):
                if pos >= todo[tp].end:
                    done.add(tp)
            if done:
                consumer.incremental_unassign([KTP(tp.topic, tp.partition) for tp in done if tp in todo])
                for tp in done:
                    todo.pop(tp, None)
    except EosinkError:
        raise
    except Exception as exc:  # noqa: BLE001 - librdkafka's KafkaException and friends: the audit cannot tell
        raise SourceUnreadable(f"Kafka at {bootstrap}: {exc}", component="audit") from exc
    finally:
        consumer.close()
    index.seconds = time.perf_counter() - t0
    return index


def _positions(consumer: Any, todo: Mapping[TopicPartition, Window],
               last_seen: Mapping[TopicPartition, float]) -> Iterable[tuple[TopicPartition, int]]:
    """The consumer's position of each partition still read: a window that ends on a transaction
    marker (or on aborted records) returns no record at its end, but the position passes it."""
    from confluent_kafka import TopicPartition as KTP

    out = []
    for k in consumer.position([KTP(tp.topic, tp.partition) for tp in todo]):
        tp = TopicPartition(k.topic, k.partition)
        if k.offset >= 0 and k.offset >= todo[tp].end:
            out.append((tp, k.offset))
        elif time.monotonic() - last_seen[tp] > _IDLE_S:
            # Nothing for a while: when the log ends at or before the window's end, all there is was read.
            _low, high = consumer.get_watermark_offsets(KTP(tp.topic, tp.partition), timeout=10, cached=False)
            if high <= todo[tp].end:
                out.append((tp, todo[tp].end))
    return out
