"""The streaming driver's own costs: what it does before a micro-batch's tasks run, and how long that takes.

The exactly-once behaviour of the streaming publishers is in ``test_spark_stream.py``; these tests
pin what makes the driver's share of a micro-batch (and of a query start) short.
"""

from __future__ import annotations

import time

import pytest

from eosink.spark_jobs.fencing import fence
from tests.spark_fixtures import assert_exactly_once, read_topic, spark  # noqa: F401
from tests.stream_driver import source_frame
from tests.test_spark_stream import keys, produce

pytestmark = pytest.mark.spark


def test_fencing_does_not_wait_for_librdkafkas_500ms_coordinator_retry(stack, unique):
    """With sparse connections each fencing producer asked for its coordinator before any broker was up, and
    librdkafka asked again only 500 ms later: every query start paid it. Best of three, for a loaded machine."""
    conf = {"bootstrap.servers": stack.kafka_bootstrap}
    took = []
    for attempt in range(3):
        began = time.monotonic()
        assert fence(conf, [f"eosink-{unique}-{attempt}-{p}" for p in range(4)], 30_000) == []
        took.append(time.monotonic() - began)
    assert min(took) < 0.4, f"fencing 4 transactional.ids took {min(took):.2f} s at best"


def test_a_micro_batch_repartitioned_by_key_runs_one_spark_job_not_two(spark, stack, make_topic, unique,  # noqa: F811
                                                                       tmp_path):
    """The partition count is read before any task publishes. With adaptive execution (on in the session Spark
    gives a micro-batch) reading it ran the batch's source read and shuffle as a job of its own, and the publish
    job ran them again."""
    from eosink.spark_jobs import Outbox, publish_outbox_stream

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 300)
    results: list = []
    q = publish_outbox_stream(source_frame(spark, stack.kafka_bootstrap, source, 100), Outbox(outbox, value="value"),
                              key="k", job=unique, checkpoint=str(tmp_path / "ck"), kafka=stack.kafka_bootstrap,
                              trigger={"availableNow": True}, partitions=2, on_batch=results.append)
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert len(results) >= 3 and all(r.published_partitions == 2 for r in results)
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(str(q.runId))  # a query's jobs are in its run's group
    assert len(jobs) == len(results), f"{len(jobs)} Spark jobs for {len(results)} micro-batches"
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 300))
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true", "the query's own session is changed, not the caller's"


def test_the_ledger_read_from_offset_0_is_done_before_the_first_micro_batch(stack, unique):
    """A driver process reads a job's ledger records from offset 0 once: ``publish_outbox_stream`` starts that
    read while Spark starts the query, and the first micro-batch reads only what was written since."""
    from eosink.spark_jobs.ledger_index import job_ledger
    from eosink.spark_jobs.naming import LEDGER_TOPIC
    from eosink.spark_jobs.stream import prefetch_ledger
    from eosink.spark_jobs.task import TaskSpec

    conf = {"bootstrap.servers": stack.kafka_bootstrap}
    spec = TaskSpec(job=unique, run_id="", producer_config=conf, outboxes=(), ledger_topic=LEDGER_TOPIC, ledger_since=0,
                    known_published=frozenset(), transaction_timeout_ms=30_000)
    prefetch_ledger(spec).join(60)
    assert job_ledger(conf, LEDGER_TOPIC, unique).pos > 0, "the job's ledger was not read ahead"


def test_a_micro_batch_hands_its_tasks_arrow_batches_without_a_per_row_byte_count(spark, stack, make_topic,  # noqa: F811
                                                                                 unique, tmp_path):
    """Spark checks its Arrow byte cap by measuring the batch after every row it adds, unless the cap is Int.MaxValue:
    sessions eosink builds have it so, a micro-batch of a session without it gets it (on the query's own session, not
    the caller's), and a cap set by the caller is kept."""
    from eosink.spark_jobs import Outbox, publish_outbox_stream
    from eosink.spark_jobs.session import ARROW_MAX_BYTES, ARROW_NO_BYTE_CAP

    assert spark.conf.get(ARROW_MAX_BYTES) == ARROW_NO_BYTE_CAP, "build_session leaves the per-row byte count on"
    source = make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 100)
    try:
        for caller, expected in ((None, ARROW_NO_BYTE_CAP), ("1m", "1m")):
            if caller is None:
                spark.conf.unset(ARROW_MAX_BYTES)
            else:
                spark.conf.set(ARROW_MAX_BYTES, caller)
            seen: list[str] = []

            def look(batch, seen=seen):
                if batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId"):  # not the start's check
                    seen.append(batch.sparkSession.conf.get(ARROW_MAX_BYTES))
                return batch

            outbox = make_topic(2)
            q = publish_outbox_stream(source_frame(spark, stack.kafka_bootstrap, source, 100),
                                      Outbox(outbox, value="value"), key="k", job=f"{unique}-{caller or 'unset'}",
                                      checkpoint=str(tmp_path / f"ck-{caller}"), kafka=stack.kafka_bootstrap,
                                      trigger={"availableNow": True}, transform=look)
            assert q.awaitTermination(120)
            assert q.exception() is None
            assert seen and set(seen) == {expected}, f"caller's cap {caller}: the micro-batches had {seen}"
            assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 100))
            if caller is None:
                assert not spark.conf._jconf.contains(ARROW_MAX_BYTES), "the caller's session was changed"
    finally:
        spark.conf.set(ARROW_MAX_BYTES, ARROW_NO_BYTE_CAP)
