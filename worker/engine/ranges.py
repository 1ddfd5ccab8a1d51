"""What a cycle's batch covers: one offset range per partition, checked against the decision log.

The ranges are the txn's manifest (what recovery ties back to the decision) and give the offsets
the decision records; they are worked out once per cycle from up to hundreds of thousands of
records, so the walk over them is built for speed. The check that a batch does not start behind
the decision is the one guard against a consumer that goes back: the decision fences other
owners, not this one.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence

from eosink.connectors.api.errors import RetryableError
from eosink.connectors.api.records import PartitionRange, SinkRecord, TopicPartition
from eosink.worker import metrics
from eosink.worker.engine.batch import FailedRecord
from eosink.worker.engine.decision import Grant

_topic_partition = operator.attrgetter("topic", "partition")


def txn_ranges(records: Sequence[SinkRecord], grants: Mapping[TopicPartition, Grant],
               failed: Sequence[FailedRecord] = ()) -> tuple[tuple[PartitionRange, ...], dict[TopicPartition, int]]:
    """The txn's range per partition - over the bad records too, so the decision moves past them -
    and how many good records each partition delivers.

    A poll hands over each partition's records in runs of a fetch response each (thousands), in
    offset order: ``groupby`` walks them in C, so this costs a few Python steps per run, not per record.
    """
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    count: dict[tuple[str, int], int] = {}
    for k, group in itertools.groupby(records, _topic_partition):
        run = list(group)
        c = count.get(k)
        if c is None:
            first[k] = run[0].offset
            count[k] = len(run)
        else:
            count[k] = c + len(run)
        last[k] = run[-1].offset
    for f in failed:
        k = (f.topic, f.partition)
        first[k] = min(first.get(k, f.offset), f.offset)
        last[k] = max(last.get(k, f.offset), f.offset)
    ranges = tuple(PartitionRange(t, p, first[(t, p)], last[(t, p)], grants[TopicPartition(t, p)].epoch)
                   for t, p in sorted(first))
    return ranges, {TopicPartition(t, p): n for (t, p), n in count.items()}


def check_not_behind(connector: str, ranges: Sequence[PartitionRange], grants: Mapping[TopicPartition, Grant]) -> None:
    """Refuse a batch that starts before what the decision log already holds for a partition.

    The decision's compare-and-set fences other owners, not this one: if the consumer ever
    handed over records this owner has already decided, deciding them again would deliver
    them twice. It happened once in a rolling-restart test: after an assignment change the
    consumer served a partition again from its first assignment's logical offset
    (OFFSET_BEGINNING) instead of the offset just assigned. The cycle aborts, which repositions
    the consumer at the decision, and the next cycle reads on from there."""
    for r in ranges:
        decided = grants[r.tp].next_offset
        if decided is not None and r.first_offset < decided:
            metrics.STALE_BATCHES.labels(connector).inc()
            raise RetryableError(f"the consumer went back on {r.tp}: it handed over offset {r.first_offset}, "
                                 f"but the decision log already holds everything before {decided}; "
                                 "repositioning at the decision", component="kafka-consumer")
