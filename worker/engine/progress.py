"""How far a Kafka source has read: caught up or not, the lag per partition, and the stall watch's samples.

:class:`~eosink.worker.engine.source.KafkaSource` reads; this mixin answers where it stands, from the
consumer's positions and the watermarks librdkafka caches from every fetch (no broker round trip inside
a cycle). The early commit of a caught-up cycle (``commit.min.interval.ms``) and the stall behind an
open transaction (:mod:`eosink.worker.engine.stall`) are both judged from here.
"""

from __future__ import annotations

from typing import Any

from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.stall import StallWatch


class SourceProgress:
    """Mixed into :class:`~eosink.worker.engine.source.KafkaSource`, which sets these attributes."""

    consumer: Any
    _assigned: list[TopicPartition]
    _at_end: set[tuple[str, int]]
    _pending: list[Any]
    _start: dict[TopicPartition, int]
    _from_start: bool
    stalls: StallWatch

    def caught_up(self) -> bool:
        """Has everything available been read? Nothing fetched is waiting in this source, and every
        assigned partition is at its end: it reported its end (librdkafka's end-of-partition event:
        position at the last stable offset, read_committed) with no record since, or its position has
        reached the high watermark the last fetch saw.

        The second test is for a steady trickle of transactions: librdkafka emits no end-of-partition
        event when a fetch ends on a transaction's commit marker, so a partition that received a
        transaction in every poll slice never reported its end, and every cycle waited out its whole
        ``commit.interval.ms`` (measured: 10 records committed every 100 ms, 0 end events in 60 polls,
        the position at the high watermark after each). Both tests are local: the watermark is the one
        cached from the last fetch."""
        if not self._assigned or self._pending:
            return False
        if len(self._at_end) >= len(self._assigned):
            return True
        from confluent_kafka import TopicPartition as KTP

        rest = [KTP(tp.topic, tp.partition) for tp in self._assigned if tp not in self._at_end]
        for tp in self.consumer.position(rest):
            if tp.offset < 0 or tp.offset < self.consumer.get_watermark_offsets(tp, cached=True)[1]:
                return False  # never read (no position yet), or records (or an open transaction) ahead
        return True

    def lag(self, *, fresh: bool = False) -> dict[TopicPartition, int]:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP

        out: dict[TopicPartition, int] = {}
        samples: dict[TopicPartition, tuple[int, int]] = {}
        try:
            positions = self.consumer.position([KTP(tp.topic, tp.partition) for tp in self._assigned])
        except KafkaException:
            return out
        for p in positions:
            try:
                # Cached: the watermarks the last fetch response carried, no broker round trip (used inside
                # cycles); fresh: asked of the broker (idle or paused tasks) - which answers a read_committed
                # consumer with the last stable offset, so a stall is judged on the fetched high watermark.
                fetched = self.consumer.get_watermark_offsets(p, cached=True)
                low, high = self.consumer.get_watermark_offsets(p, timeout=1, cached=False) if fresh else fetched
            except KafkaException:
                continue
            tp = TopicPartition(p.topic, p.partition)
            # Before its first message librdkafka reports no position: the assigned offset, or the log's
            # start for a partition no decision names yet (consumer.auto.offset.reset=earliest).
            position = p.offset if p.offset >= 0 else self._start.get(tp, low if self._from_start else -1)
            if position >= 0 and high >= 0:
                out[tp] = max(0, high - position)
            if position >= 0 and fetched[1] >= 0:
                samples[tp] = (position, fetched[1])
        self.stalls.observe(samples)  # the same samples tell a stall behind an open transaction (engine.stall)
        return out
