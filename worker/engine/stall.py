"""Stalls behind an open transaction: a partition whose last stable offset stands while its high watermark moves.

A read_committed consumer reads up to the partition's last stable offset (LSO): the first offset of the
oldest transaction still open. A producer that died mid-transaction (a killed Spark driver or executor)
leaves its transaction open until the broker aborts it at its ``transaction.timeout.ms``; meanwhile every
read_committed consumer of the partition waits at that offset, however many transactions commit after it.
Nothing fails, so nothing else would show it: the lag grows, and the freshness alert fires minutes later
without saying why.

The consumer cannot read the LSO, but it reads everything below it quickly, so its position *is* the LSO
to within a fetch; the high watermark it knows from every fetch. A partition is stalled from the moment its
position stood still while the high watermark moved past it, and stays stalled until the position moves.
A large transaction that simply takes a while to commit (a Spark task publishing its whole partition)
stalls the same way, briefly: the metric gives the seconds, and the alert rule waits longer than a
publisher's transaction may take.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from eosink.connectors.api.records import TopicPartition


@dataclass
class _Seen:
    position: int
    high: int
    since: float  # when records were first seen waiting at this position
    stalled: bool = False  # the high watermark has moved since


class StallWatch:
    """Fed (position, high watermark) samples per partition; answers which partitions stall, since when.

    Samples come from the task's lag measurements (every few seconds while cycles run, from the
    watermark the last fetch carried), so watching costs no request of its own."""

    def __init__(self) -> None:
        self._seen: dict[TopicPartition, _Seen] = {}

    def observe(self, samples: Mapping[TopicPartition, tuple[int, int]], now: float | None = None) -> None:
        """Record each partition's (position, high watermark); partitions not sampled are forgotten."""
        now = time.monotonic() if now is None else now
        for tp in [tp for tp in self._seen if tp not in samples]:
            del self._seen[tp]
        for tp, (position, high) in samples.items():
            seen = self._seen.get(tp)
            if seen is None or position != seen.position or high <= position:
                self._seen[tp] = _Seen(position, high, now)  # moved, or nothing ahead of it: not stalled
            elif seen.high <= position:
                seen.high, seen.since = high, now  # records arrived after an idle sample: the wait starts here
            elif high > seen.high:
                seen.stalled, seen.high = True, high  # records were waiting, more came, the position did not move

    def stalled(self, now: float | None = None) -> dict[TopicPartition, float]:
        """Seconds each stalled partition has stood at its position so far (only partitions that stall)."""
        now = time.monotonic() if now is None else now
        return {tp: max(0.0, now - s.since) for tp, s in list(self._seen.items()) if s.stalled}
