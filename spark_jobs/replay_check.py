"""A replayed micro-batch whose rows are grouped differently: publish only what is provably missing, or refuse.

A micro-batch partition is known by its content (:mod:`eosink.spark_jobs.stream_task`): a replay that
puts the same rows in the same groups finds every committed group by its identity. A replay that
*regroups* the rows (the Kafka source's ``minPartitions`` changed, or the partition count of a
stateless shuffle) has partitions whose content matches no committed entry although some of their
rows were committed by the earlier attempt, inside another group. Without a check they would be
published again.

So a task of a replay of a partly committed batch (the driver saw committed entries of the run, or
entries it could not decide yet: :class:`ReplayScan` is then in its spec) holds its rows instead of
producing them as they arrive, and when its content matches no committed entry it reads every record
the run has committed so far (read_committed, header ``eosink.run`` = the run id) and compares them
with its own records by a 64-bit hash of (topic, key, value):

* no common hash: the rows are disjoint from everything committed; all are published;
* every committed group (the records of one earlier entry, known by their ``eosink.id`` prefix
  ``{job}/{run}/{index}-{fingerprint}/``) that shares a record with this partition lies wholly inside
  it, and each row's records are either all in those groups or none: the partition is a union of
  committed groups and new rows, and only the new rows are published (the ledger entry keeps the
  whole content, so a later replay with this grouping finds it);
* anything else (a committed group split between this partition and others): the transaction is
  aborted and the task fails with :class:`~eosink.spark_jobs.errors.ReplayRegroupedError`. It
  commits nothing (its siblings in the replay may commit theirs).

A batch therefore completes in a grouping that holds every committed group whole in one partition:
the first attempt's, as long as each group a regrouped replay committed lies inside one of its
partitions (the Kafka source's ``minPartitions`` splits an offset range, it never joins two). A
replay that mixes rows of several earlier partitions (a hash repartition into another count) can
commit groups straddling the first attempt's; the batch is then refused in every grouping, never
published twice nor lost (the README's safe plans say to use ``publish_outbox_stream(partitions=N)``
for such plans).

Why this is sound: the driver measures, after it has ended every transaction of the job's earlier
attempts (:mod:`eosink.spark_jobs.fencing`), where the run's committed records can be in each outbox
partition: from the first offset whose timestamp is at or after the earliest committed entry's
``published_at_ms`` minus its transaction timeout and :data:`CLOCK_SLACK_MS` (a committed record was
produced inside its transaction, which the coordinator aborts past its timeout; an entry written
before entries recorded their timeout counts the brokers' ``transaction.max.timeout.ms``; with an
entry the driver could not decide, or one without a timestamp, from the partition's beginning), up
to the log end it measured then. Every record of an earlier attempt is below that end, and the tasks of this replay
begin their transactions after it, so the read waits for no sibling. A hash collision can only make
a disjoint row look committed: the partition then refuses (or, inside a whole committed group,
skips a row that is one of that group's rows only if the group is identical in every hash), never
publishes twice. The one loss the check cannot see is the content identity's own: a committed
group that appears a second time, whole, in another partition of the same batch (rows identical in
key and value bytes) counts as published once.

Cost: nothing unless the run has committed entries when the batch starts, i.e. only a replay of a
partly committed micro-batch pays: the driver's offset lookups, and in each task whose content is
new the read of the run's committed records (from about one transaction timeout before the first
commit to the end) and a hash per record.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from eosink.connectors.api.records import ID_HEADER, RUN_HEADER
from eosink.spark_jobs.errors import LedgerError
from eosink.spark_jobs.kafka_checks import admin_client, broker_max_transaction_timeout_ms, client_config, cluster_metadata
from eosink.spark_jobs.ledger import LEDGER_READER_GROUP, LedgerEntry
from eosink.spark_jobs.outbox import CompiledOutbox

#: Wall clocks of executors and brokers may differ by this much (record timestamps against published_at_ms).
CLOCK_SLACK_MS = 120_000


@dataclass(frozen=True)
class ReplayScan:
    """Where the run's committed records are: ``(topic, partition, start offset, end offset)`` per outbox partition."""

    ranges: tuple[tuple[str, int, int, int], ...] = field(default_factory=tuple)


def _consumer(kafka: Mapping[str, Any]) -> Consumer:
    return Consumer({**client_config(kafka), "group.id": LEDGER_READER_GROUP, "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10,
                     "isolation.level": "read_committed", "auto.offset.reset": "earliest"})


def plan_scan(kafka: Mapping[str, Any], topics: Iterable[str], committed: Iterable[LedgerEntry], undecided: bool,
              timeout_s: float) -> ReplayScan:
    """On the driver, after the job's earlier transactions were ended: where the run's committed records lie."""
    entries = list(committed)
    since: int | None = None
    if entries and not undecided and all(e.published_at_ms for e in entries):
        longest = 0
        if any(not e.transaction_timeout_ms for e in entries):  # written before entries said it: the broker's maximum
            admin = admin_client(kafka)
            longest = broker_max_transaction_timeout_ms(admin, cluster_metadata(admin, str(kafka.get("bootstrap.servers"))))
        since = min(int(e.published_at_ms or 0) - int(e.transaction_timeout_ms or longest) for e in entries) - CLOCK_SLACK_MS
    consumer = _consumer(kafka)
    ranges = []
    try:
        meta = consumer.list_topics(timeout=timeout_s)
        for topic in sorted(set(topics)):
            parts = sorted(meta.topics[topic].partitions)
            starts = {p: 0 for p in parts}
            if since is not None:
                found = consumer.offsets_for_times([TopicPartition(topic, p, max(since, 0)) for p in parts], timeout_s)
                starts = {tp.partition: tp.offset for tp in found}
            for p in parts:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
                start = max(int(low), int(starts[p])) if starts[p] >= 0 else int(high)  # -1: nothing that recent
                if start < high:
                    ranges.append((topic, p, start, int(high)))
    except KafkaException as e:
        raise LedgerError(f"cannot locate the committed records of a replayed micro-batch in {sorted(set(topics))}: "
                          f"{e.args[0].str()}") from None
    finally:
        consumer.close()
    return ReplayScan(tuple(ranges))


def record_hash(topic: str, key: bytes | None, value: bytes | None) -> int:
    """A 64-bit hash of one record as a consumer reads it (topic, key, value; null apart from empty)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(topic.encode() + b"\0")
    for part in (key, value):
        if part is None:
            h.update(b"\1")
        else:
            h.update(b"\2" + len(part).to_bytes(8, "little") + part)
    return int.from_bytes(h.digest(), "little")


def committed_groups(kafka: Mapping[str, Any], scan: ReplayScan, run_id: str, timeout_s: float,
                     ) -> dict[str, Counter[int]]:
    """Every committed record of ``run_id`` in the scan's ranges, hashed, by ``eosink.id`` prefix (one per entry)."""
    groups: dict[str, Counter[int]] = {}
    run = run_id.encode()
    consumer = _consumer(kafka)
    try:
        for topic, p, start, stop in scan.ranges:
            consumer.assign([TopicPartition(topic, p, start)])
            deadline = time.monotonic() + timeout_s
            while True:
                if time.monotonic() > deadline:
                    raise LedgerError(f"the committed records of run {run_id} in {topic}[{p}] could not be read to "
                                      f"offset {stop} within {timeout_s:.0f}s (an open transaction older than the "
                                      "replay holds them back; it ends at its transaction timeout at the latest)")
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if (msg.offset() or 0) >= stop:
                            break
                        continue
                    raise LedgerError(f"reading {topic}[{p}] for a replayed micro-batch: {err.str()}")
                if (msg.offset() or 0) >= stop:
                    break  # a record of this replay's own tasks, past the end the driver measured
                headers = dict(msg.headers() or [])
                if headers.get(RUN_HEADER) == run:
                    raw = headers.get(ID_HEADER) or b""
                    ident = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).rpartition("/")[0]
                    groups.setdefault(ident, Counter())[record_hash(topic, msg.key(), msg.value())] += 1
                if (msg.offset() or 0) + 1 >= stop:
                    break
            consumer.unassign()
    except KafkaException as e:
        raise LedgerError(f"reading the committed records of run {run_id}: {e.args[0].str()}") from None
    finally:
        consumer.close()
    return groups


def _binary(values: list[Any]) -> list[bytes | None]:
    return [v.encode() if isinstance(v, str) else v for v in values]


def row_records(outboxes: tuple[CompiledOutbox, ...], batch: pa.RecordBatch) -> list[list[int]]:
    """Per row of ``batch``, the hashes of the records it becomes (one per outbox it is routed to)."""
    cols = batch.columns
    per_outbox = []
    for ob in outboxes:
        whens = cols[ob.when_col].to_pylist() if ob.when_col is not None else None
        per_outbox.append((ob.topic, _binary(cols[ob.key_col].to_pylist()), _binary(cols[ob.value_col].to_pylist()),
                           whens))
    return [[record_hash(topic, ks[i], vs[i]) for topic, ks, vs, whens in per_outbox if whens is None or whens[i]]
            for i in range(batch.num_rows)]


def new_rows(rows: list[list[int]], groups: Mapping[str, Counter[int]]) -> list[bool] | None:
    """Which rows to publish (``True``), or ``None`` when the partition splits a committed group (refuse)."""
    committed: Counter[int] = Counter()
    for g in groups.values():
        committed.update(g)
    mine: Counter[int] = Counter(h for r in rows for h in r)
    touched = [g for g in groups.values() if any(h in mine for h in g)]
    if not touched:
        return [True] * len(rows)
    inside: Counter[int] = Counter()
    for g in touched:
        inside.update(g)
    if any(h in committed and h not in inside for h in mine) or any(n > mine[h] for h, n in inside.items()):
        return None  # a committed group lies partly elsewhere, or a hash is committed outside the whole groups here
    keep = []
    for r in rows:
        hits = [inside[h] > 0 for h in r]
        if r and all(hits):
            for h in r:
                inside[h] -= 1
            keep.append(False)
        elif any(hits):
            return None  # a row with some records committed and others not: not one of the committed rows
        else:
            keep.append(True)
    return None if any(n > 0 for n in inside.values()) else keep
