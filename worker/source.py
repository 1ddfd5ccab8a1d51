"""Where records come from: a read_committed Kafka consumer with a batch poll.

The engine (``worker.task``) sees only :class:`RecordSource`, so the deterministic model tests
can drive the same commit cycle from an in-memory source.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors.errors import FatalError, RecordError, RetryableError
from connectors.records import SinkRecord, TopicPartition


@dataclass
class Batch:
    records: list[SinkRecord] = field(default_factory=list)
    nbytes: int = 0
    #: The first record that could not be converted; nothing at or after it is in ``records``.
    error: RecordError | None = None


class RecordSource(Protocol):
    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """Replace the assignment; ``None`` means "from the reset policy" (nothing decided yet)."""

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch: ...

    def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None: ...

    def lag(self) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...


def _json(raw: bytes | None) -> Any:
    return None if raw is None else json.loads(raw)


def _string(raw: bytes | None) -> Any:
    return None if raw is None else raw.decode("utf-8")


def _bytes(raw: bytes | None) -> Any:
    return raw


CONVERTERS: dict[str, Callable[[bytes | None], Any]] = {"json": _json, "string": _string, "bytes": _bytes}

_gc_lock = threading.Lock()
_gc_holders = 0
_gc_disabled_here = False


def _pause_gc() -> None:
    """Pause the cyclic garbage collector while a batch is built (paired with :func:`_resume_gc`).

    A batch is up to ``max_records`` freshly allocated containers (a ``SinkRecord`` and the decoded
    value's dicts per record) that all survive the batch: with the collector on, its generation
    thresholds (700 allocations) keep re-scanning that growing young heap, and the full collections
    it provokes rescan everything alive - measured at ~40% of a poll of 200-byte JSON records.
    Building a batch creates no reference cycle, so pausing leaks nothing: reference counting still
    frees everything; the collector runs again as soon as the last concurrent poll (one per task
    thread) is done, and collects whatever cycles other threads made meanwhile.
    """
    global _gc_holders, _gc_disabled_here
    with _gc_lock:
        if _gc_holders == 0:
            _gc_disabled_here = gc.isenabled()
            if _gc_disabled_here:
                gc.disable()
        _gc_holders += 1


def _resume_gc() -> None:
    global _gc_holders, _gc_disabled_here
    with _gc_lock:
        _gc_holders -= 1
        if _gc_holders == 0 and _gc_disabled_here:
            _gc_disabled_here = False
            gc.enable()


class KafkaSource:
    """A confluent-kafka consumer with a manual assignment (ZooKeeper assigns, not the group).

    ``group.id`` is still set (``eosink-<connector>``), so offsets committed best effort after
    each cycle show up in ordinary Kafka tooling as consumer lag.
    """

    def __init__(
        self,
        connector: str,
        bootstrap: str,
        *,
        value_converter: str = "json",
        reset: str = "earliest",
        overrides: Mapping[str, Any] | None = None,
        fetch_batch: int = 10_000,
    ) -> None:
        from confluent_kafka import Consumer

        self.connector = connector
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": f"eosink-{connector}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": reset,
            "enable.partition.eof": False,
            "statistics.interval.ms": 0,
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 200_000,
        }
        conf.update(overrides or {})
        self.consumer = Consumer(conf)
        try:
            self.decode = CONVERTERS[value_converter]
        except KeyError:
            raise FatalError(f"unknown value.converter {value_converter!r}; one of {', '.join(CONVERTERS)}") from None
        self.fetch_batch = fetch_batch
        self._pending: list[Any] = []
        self._assigned: list[TopicPartition] = []

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        from confluent_kafka import OFFSET_INVALID
        from confluent_kafka import TopicPartition as KTP

        self._pending = []
        self._assigned = sorted(positions)
        self.consumer.assign(
            [KTP(tp.topic, tp.partition, OFFSET_INVALID if off is None else off) for tp, off in sorted(positions.items())]
        )

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch:
        _pause_gc()
        try:
            return self._poll_batch(max_records, max_bytes, timeout_s)
        finally:
            _resume_gc()

    def _poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch:
        from confluent_kafka import KafkaError

        batch = Batch()
        out = batch.records
        decode = self.decode
        deadline = time.monotonic() + timeout_s
        nbytes = 0
        while len(out) < max_records and nbytes < max_bytes:
            if self._pending:
                msgs, self._pending = self._pending, []
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._assigned:
                    break
                msgs = self.consumer.consume(num_messages=min(self.fetch_batch, max_records - len(out)), timeout=remaining)
            for i, m in enumerate(msgs):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    self._pending = []
                    if err.fatal():
                        raise FatalError(f"consumer error: {err}", component="kafka-consumer")
                    raise RetryableError(f"consumer error: {err}", component="kafka-consumer")
                raw = m.value()
                try:
                    value = decode(raw)
                except (ValueError, UnicodeDecodeError) as exc:
                    self._pending = []
                    batch.error = RecordError(
                        f"value cannot be decoded as {decode.__name__.strip('_')}: {exc}",
                        topic=m.topic(), partition=m.partition(), offset=m.offset(), component="converter",
                    )
                    batch.nbytes = nbytes
                    return batch
                headers = m.headers()
                out.append(
                    SinkRecord(m.topic(), m.partition(), m.offset(), m.key(), value, raw,
                               tuple(headers) if headers else (), m.timestamp()[1])
                )
                if raw is not None:
                    nbytes += len(raw)
                if len(out) >= max_records or nbytes >= max_bytes:
                    self._pending = msgs[i + 1:]
                    break
        batch.nbytes = nbytes
        return batch

    def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP

        try:
            self.consumer.commit(offsets=[KTP(tp.topic, tp.partition, off) for tp, off in offsets.items()], asynchronous=True)
        except KafkaException:
            pass  # best effort: the decision log, not the group, is the source of truth

    def lag(self) -> dict[TopicPartition, int]:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP

        out = {}
        try:
            positions = self.consumer.position([KTP(tp.topic, tp.partition) for tp in self._assigned])
        except KafkaException:
            return out
        for p in positions:
            try:
                _, high = self.consumer.get_watermark_offsets(p, timeout=1, cached=False)
            except KafkaException:
                continue
            if p.offset >= 0 and high >= 0:
                out[TopicPartition(p.topic, p.partition)] = max(0, high - p.offset)
        return out

    def close(self) -> None:
        try:
            self.consumer.close()
        except RuntimeError:
            pass
