"""A replayed micro-batch whose rows come back in other groups: refused, never published twice.

``writeStream.format("eosink")`` cannot see a micro-batch's partition count before its tasks publish,
so a replay after a driver kill with another Kafka ``minPartitions`` reaches the tasks. Each task of a
replay of a partly committed batch checks a content it does not find against the run's committed
records (``spark_jobs/replay_check.py``): disjoint rows are published, a partition that is a union of
committed groups and new rows publishes the new rows, anything else aborts with
``ReplayRegroupedError``. Every test reads the outbox read_committed to the log end.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.spark_fixtures import HandRun, assert_exactly_once, read_topic
from tests.test_spark_stream import _driver, _kill_when, batch, entries, keys, produce

pytestmark = pytest.mark.spark


def test_replay_with_other_min_partitions_is_refused_not_duplicated(stack, make_topic, unique, tmp_path):  # noqa: ANN001
    from eosink.spark_jobs.faults import Hooks, InBatches, SleepAt, TouchAt, to_option

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 300)
    ck, committed = tmp_path / "ck", tmp_path / "partition-0-committed"
    # Batch 1 (one partition per source partition): partition 0 commits, partitions 1 and 2 stall in their transactions.
    fault = InBatches(Hooks((TouchAt("after_commit", str(committed), partitions=frozenset({0})),
                             SleepAt("after_first_batch", 300, partitions=frozenset({1, 2})))), frozenset({1}))
    _kill_when(_driver("ds", stack, source, outbox, unique, ck, to_option(fault)), committed)
    assert not (ck / "commits" / "1").exists(), "Spark had not recorded batch 1: it must be replayed"

    # The replay splits every source partition's offset range in two: partition 0's committed rows in two groups.
    regrouped = _driver("ds", stack, source, outbox, unique, ck, None, "--min-partitions", "6")
    out, _ = regrouped.communicate(timeout=300)
    recs = read_topic(stack.kafka_bootstrap, outbox)
    seen = Counter(r.key for r in recs)
    twice = sorted(k for k, n in seen.items() if n > 1)
    assert not twice, f"{len(twice)} rows published twice by the regrouped replay, e.g. {twice[:5]}"
    assert max(Counter(r.id for r in recs).values()) == 1 and set(seen) <= set(keys(0, 300))
    assert regrouped.returncode != 0, out[-3000:]
    assert "ReplayRegroupedError" in out and "micro-batch 1 of query" in out, out[-3000:]
    assert "minPartitions" in out and "publish_outbox_stream(partitions=N)" in out, out[-3000:]

    # The grouping of the attempt that committed: the batch completes, and so does the query.
    restarted = _driver("ds", stack, source, outbox, unique, ck)
    out, _ = restarted.communicate(timeout=300)
    assert restarted.returncode == 0 and "DONE " in out, out[-3000:]
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 300))
    assert "run" in batch(entries(stack.kafka_bootstrap, unique), 1), "batch 1 completed"


# -- the check driven by hand (no Spark): which replayed partitions publish what -------------------


def test_a_regrouped_replay_publishes_disjoint_rows_and_refuses_a_split_group(stack, make_topic, unique):  # noqa: ANN001
    from eosink.spark_jobs.errors import ReplayRegroupedError
    from eosink.spark_jobs.naming import stream_run_id
    from eosink.spark_jobs.task import PUBLISHED, SKIPPED, publish_partition

    hand = HandRun(stack.kafka_bootstrap, unique, make_topic(2), stream_run_id("q", 3))
    rows, spec, outbox = hand.rows, hand.spec, hand.outbox

    # The first attempt groups the rows as 0-50 | 50-100 and commits only the first group.
    assert publish_partition(spec(), 0, 0, iter([rows(0, 50)])).status == PUBLISHED
    # A replay in other groups: 0-25 splits the committed group (refused), 50-70 and 70-100 are new (published).
    replay = spec()
    assert replay.replay is not None and replay.replay.ranges
    with pytest.raises(ReplayRegroupedError, match=r"partition 0: 25 rows .*minPartitions"):
        publish_partition(replay, 0, 0, iter([rows(0, 25)]))
    assert publish_partition(replay, 1, 0, iter([rows(50, 70)])).status == PUBLISHED
    assert publish_partition(replay, 2, 0, iter([rows(70, 100)])).status == PUBLISHED
    # The first attempt's grouping again: 0-50 is known by its content; 50-100 holds both new groups whole plus nothing
    # else, so it publishes no record; then a group holding a committed group and new rows publishes only the new ones.
    again = spec()
    assert publish_partition(again, 1, 0, iter([rows(0, 50)])).status == SKIPPED
    whole = publish_partition(again, 0, 0, iter([rows(70, 100), rows(50, 70)]))
    assert (whole.status, whole.records) == (PUBLISHED, 0)
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 100))
    more = spec()
    grown = publish_partition(more, 4, 0, iter([rows(100, 120), rows(0, 50)]))
    assert (grown.status, grown.records) == (PUBLISHED, 20)
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 120))


def test_which_rows_a_replayed_partition_publishes():
    """The decision alone: disjoint, a union of whole committed groups and new rows, or a split group."""
    from eosink.spark_jobs.replay_check import new_rows

    groups = {"j/r/0-a": Counter({1: 1, 2: 1}), "j/r/1-b": Counter({3: 2})}
    assert new_rows([[7], [8]], groups) == [True, True]
    assert new_rows([[1], [9], [2]], groups) == [False, True, False]
    assert new_rows([[3], [1], [3], [2], [3]], groups) == [False, False, False, False, True]  # a third 3: new
    assert new_rows([[1], [9]], groups) is None  # group 0-a split
    assert new_rows([[3], [9]], groups) is None  # group 1-b holds 3 twice, this partition once
    assert new_rows([[1, 5], [2, 6]], groups) is None  # rows whose records are committed in part


def test_where_a_replay_looks_for_the_committed_records_of_old_and_new_entries(stack, make_topic):  # noqa: ANN001
    from eosink.spark_jobs.ledger import LedgerEntry
    from eosink.spark_jobs.publisher import producer_config
    from eosink.spark_jobs.replay_check import plan_scan

    outbox = make_topic(2)
    produce(stack.kafka_bootstrap, outbox, 0, 40)
    conf = producer_config(stack.kafka_bootstrap)
    old = LedgerEntry("j", "q.1", 0, 10)  # an entry that does not say when it was published
    full = plan_scan(conf, [outbox], [old], False, 30)
    assert sorted((p, start) for _, p, start, _ in full.ranges) == [(0, 0), (1, 0)]
    assert sum(stop for *_, stop in full.ranges) == 40
    now = int(time.time() * 1000)
    older = LedgerEntry("j", "q.1", 0, 10, published_at_ms=now)  # no timeout: the brokers' maximum is assumed
    assert sorted((p, start) for _, p, start, _ in plan_scan(conf, [outbox], [older], False, 30).ranges) == [(0, 0), (1, 0)]
    recent = LedgerEntry("j", "q.1", 0, 10, published_at_ms=int(time.time() * 1000) + 3_600_000, transaction_timeout_ms=1)
    assert plan_scan(conf, [outbox], [recent], False, 30).ranges == ()  # nothing produced that late
