"""Streaming DataFrames into outboxes, exactly once per input row, whatever happens to the query.

Both streaming publishers are exercised: ``ds`` (``df.writeStream.format("eosink")``, the Python Data
Source API) and ``fn`` (``publish_outbox_stream``, a micro-batch per ``foreachBatch``). The input is a
Kafka topic read read_committed by spark-sql-kafka, a replayable source: a restarted query replays
its last uncommitted micro-batch from the offsets in its checkpoint. Every test counts what a
read_committed consumer sees in the outbox, read to the log end: every input row once, nothing from
an aborted attempt, and nothing left open (a transaction left open would stop the read below the
end, and the read fails rather than waits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.spark_fixtures import HandRun, assert_exactly_once, read_topic, spark  # noqa: F401
from tests.stream_driver import source_frame, start

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
LEDGER = "__eosink_publish_ledger"


def keys(lo: int, hi: int) -> list[str]:
    return [f"k-{i:06d}" for i in range(lo, hi)]


def produce(bootstrap: str, topic: str, lo: int, hi: int) -> None:
    """Rows ``lo..hi`` into the source topic: key ``k-…``, a JSON value."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for k in keys(lo, hi):
        p.produce(topic, json.dumps({"k": k, "n": int(k[2:])}).encode(), k.encode())
    assert p.flush(30) == 0


def drain(spark, engine, stack, source, outbox, job, checkpoint, fault=None, timeout_s=120):  # noqa: F811
    """Run the query until the source is drained (availableNow); the query, terminated."""
    q = start(spark, engine, stack.kafka_bootstrap, source, outbox, job, str(checkpoint), fault)
    assert q.awaitTermination(timeout_s), "the query did not drain its source in time"
    return q


def entries(bootstrap: str, job: str) -> dict[str, dict]:
    """The job's committed ledger records by key suffix ``{query}.{batch}/{partition|run}``."""
    prefix = f"{job}/"
    return {r.key[len(prefix):]: r.json() for r in read_topic(bootstrap, LEDGER) if r.key and r.key.startswith(prefix)}


def batch(ledger: dict[str, dict], batch_id: int) -> dict[str, dict]:
    """The records of one micro-batch by key suffix (``{partition}.{content}`` or ``run``)."""
    return {k.split("/")[1]: e for k, e in ledger.items() if k.split("/")[0].endswith(f".{batch_id}")}


def batches_in(ledger: dict[str, dict]) -> dict[int, set[str]]:
    """Batch id -> the ledger suffixes (partitions, ``run``) it has."""
    out: dict[int, set[str]] = {}
    for key in ledger:
        run, _, part = key.rpartition("/")
        out.setdefault(int(run.rpartition(".")[2]), set()).add(part)
    return out


# -- the happy path, and the query stopped and started again -----------------------------------


@pytest.mark.parametrize("engine", ["ds", "fn"])
def test_every_row_once_across_a_stop_and_a_restart_from_the_checkpoint(spark, stack, make_topic, unique, tmp_path,  # noqa: F811
                                                                          engine):
    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 250)
    first = drain(spark, engine, stack, source, outbox, unique, tmp_path / "ck")
    produce(stack.kafka_bootstrap, source, 250, 400)
    second = drain(spark, engine, stack, source, outbox, unique, tmp_path / "ck")
    assert first.id == second.id, "the restart resumed the same query from its checkpoint"

    recs = read_topic(stack.kafka_bootstrap, outbox)
    assert_exactly_once(recs, keys(0, 400))
    assert recs[0].json() == {"k": recs[0].key, "n": int(recs[0].key[2:])}
    ledger = entries(stack.kafka_bootstrap, unique)
    by_batch = batches_in(ledger)
    assert len(by_batch) >= 4  # at most 100 rows a batch
    assert all("run" in parts for parts in by_batch.values()), "every batch completed has its run marker"
    assert sum(e["records"] for k, e in ledger.items() if k.endswith("/run")) == 400
    for r in recs:  # eosink.id = job/{query id}.{batch}/{partition}-{fingerprint}/seq, eosink.run = {query id}.{batch}
        assert r.id.startswith(f"{unique}/{first.id}.") and r.headers["eosink.run"] == r.id.split("/")[1]


# -- task failures inside a micro-batch ----------------------------------------------------------


@pytest.mark.parametrize("engine", ["ds", "fn"])
def test_tasks_failing_after_and_before_their_commit_are_retried_without_duplicates(spark, stack, make_topic, unique,  # noqa: F811
                                                                                       tmp_path, engine):
    from eosink.spark_jobs.faults import FailAt, Hooks, InBatches, to_option

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 300)
    # In batch 1: partition 0 dies right after its commit, partition 1's Python worker is killed after
    # flushing its records and ledger entry, before committing (its transaction is left open).
    fault = InBatches(Hooks((FailAt("after_commit", partitions=frozenset({0})),
                             FailAt("before_commit", partitions=frozenset({1}), crash=True))), frozenset({1}))
    q = drain(spark, engine, stack, source, outbox, unique, tmp_path / "ck", to_option(fault))
    assert q.exception() is None

    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 300))
    in_log = read_topic(stack.kafka_bootstrap, outbox, isolation="read_uncommitted")
    assert len(in_log) > 300, "the crashed attempt's records are in the log, invisible to read_committed"
    attempts = {e["partition"]: e["attempt"] for e in batch(entries(stack.kafka_bootstrap, unique), 1).values()
                if e["partition"] is not None}
    assert attempts[0] == 0 and attempts[1] == 1, attempts


# -- the source replaying a batch after a restart ----------------------------------------------


def test_a_batch_replayed_after_its_commit_log_entry_was_lost_publishes_nothing(spark, stack, make_topic, unique,  # noqa: F811
                                                                                 tmp_path):
    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 200)
    ck = tmp_path / "ck"
    drain(spark, "ds", stack, source, outbox, unique, ck)
    last = max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    for lost in (str(last), f".{last}.crc"):  # as if the driver had died after the sink's commit, before Spark's
        (ck / "commits" / lost).unlink(missing_ok=True)
    replay = drain(spark, "ds", stack, source, outbox, unique, ck)
    assert [json.loads(p.json)["batchId"] for p in replay.recentProgress] == [last], "Spark replayed the batch"

    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 200))


# -- the driver killed mid-batch, the query restarted from its checkpoint ---------------------


def _driver(engine: str, stack, source: str, outbox: str, job: str, ck: Path, fault: str | None = None,  # noqa: ANN001
            *more: str) -> subprocess.Popen:
    """``tests/stream_driver.py`` in a process group of its own; ``more``: its further options."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [sys.executable, str(REPO / "tests" / "stream_driver.py"), engine, stack.kafka_bootstrap, source, outbox, job,
           str(ck)] + (["--fault", fault] if fault else []) + list(more)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_when(driver: subprocess.Popen, signal_file: Path) -> None:
    """SIGKILL the driver's process group a second after ``signal_file`` appears (a task committed)."""
    try:
        deadline = time.monotonic() + 180
        while not signal_file.exists():
            assert driver.poll() is None, driver.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"{signal_file.name} never appeared"
            time.sleep(0.2)
        time.sleep(1.0)  # the other partitions are now inside their transactions
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)


@pytest.mark.parametrize("engine", ["ds", "fn"])
def test_driver_killed_after_some_tasks_committed_then_restarted_publishes_each_row_once(stack, make_topic, unique,
                                                                                         tmp_path, engine):
    from eosink.spark_jobs.faults import Hooks, InBatches, SleepAt, TouchAt, to_option

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 300)
    ck, committed = tmp_path / "ck", tmp_path / "partition-0-committed"
    # Batch 1: partition 0 commits and says so; partitions 1 and 2 stall in the middle of their transactions.
    fault = InBatches(Hooks((TouchAt("after_commit", str(committed), partitions=frozenset({0})),
                             SleepAt("after_first_batch", 300, partitions=frozenset({1, 2})))), frozenset({1}))
    _kill_when(_driver(engine, stack, source, outbox, unique, ck, to_option(fault)), committed)
    assert not (ck / "commits" / "1").exists(), "Spark had not recorded batch 1: it must be replayed"

    restarted_at_ms = int(time.time() * 1000)
    restarted = _driver(engine, stack, source, outbox, unique, ck)
    out, _ = restarted.communicate(timeout=240)
    done = [ln for ln in out.splitlines() if ln.startswith("DONE ")]
    assert restarted.returncode == 0 and done, out[-3000:]
    assert json.loads(done[-1][5:])[0] == 1, "the restarted query began by replaying batch 1"

    # Read to the log end: the killed driver's open transactions were aborted by the replay (else this stalls).
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 300))
    batch1 = batch(entries(stack.kafka_bootstrap, unique), 1)
    assert "run" in batch1, "batch 1 completed in the restarted query"
    killed = [e for e in batch1.values() if e["partition"] is not None and e["published_at_ms"] < restarted_at_ms]
    assert len(killed) == 1 and killed[0]["rows"] > 0, "the killed driver's commit of one partition was kept, once"


# -- the query stopped in the middle of a batch -------------------------------------------------


@pytest.mark.parametrize("engine", ["ds", "fn"])
def test_a_query_stopped_mid_batch_leaves_no_transaction_open(spark, stack, make_topic, unique, tmp_path, engine):  # noqa: F811
    from eosink.spark_jobs.faults import Hooks, InBatches, SleepAt, TouchAt, to_option

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 300)
    inside = tmp_path / "inside-a-transaction"
    stall = InBatches(Hooks((TouchAt("after_first_batch", str(inside)), SleepAt("after_first_batch", 300))), frozenset({1}))
    # A 10-minute transaction timeout: only the publisher's own abort can end the stalled transactions in time.
    q = start(spark, engine, stack.kafka_bootstrap, source, outbox, unique, str(tmp_path / "ck"), to_option(stall),
              transaction_timeout_ms=600_000)
    deadline = time.monotonic() + 120
    while not inside.exists():
        assert time.monotonic() < deadline and q.isActive, "batch 1 never began its transactions"
        time.sleep(0.2)
    time.sleep(0.5)
    q.stop()

    # A read_committed read reaches the log end now: nothing of batch 1 is left open (else it stops at the LSO).
    stopped = read_topic(stack.kafka_bootstrap, outbox, timeout_s=60)
    assert len(read_topic(stack.kafka_bootstrap, outbox, isolation="read_uncommitted")) > len(stopped)
    drain(spark, engine, stack, source, outbox, unique, tmp_path / "ck")
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 300))


# -- a replay that splits its rows differently ---------------------------------------------------


def test_a_replay_with_another_partition_count_is_refused_before_it_publishes(spark, stack, make_topic, unique,  # noqa: F811
                                                                              tmp_path):
    from pyspark.errors import StreamingQueryException

    from eosink.spark_jobs import Outbox, publish_outbox_stream
    from eosink.spark_jobs.faults import FailAt, InBatches

    source, outbox = make_topic(3), make_topic(2)
    produce(stack.kafka_bootstrap, source, 0, 100)
    ck = str(tmp_path / "ck")

    def run(partitions: int, fault=None):  # noqa: ANN001, ANN202
        df = source_frame(spark, stack.kafka_bootstrap, source, 1000)
        q = publish_outbox_stream(df, Outbox(outbox, value="value"), key="k", job=unique, checkpoint=ck, kafka=stack.kafka_bootstrap,
                                  trigger={"availableNow": True}, partitions=partitions, fault_hook=fault)
        try:
            assert q.awaitTermination(120)
        except StreamingQueryException:
            pass  # q.exception() says why
        return q

    # Batch 0 in 4 partitions by key; partition 3 fails every attempt, so the batch (and the query) fails
    # with partitions 0-2 committed.
    failed = run(4, InBatches(FailAt("before_commit", attempts=frozenset(range(8)), partitions=frozenset({3})),
                              frozenset({0})))
    assert "InjectedFault" in str(failed.exception())
    published = read_topic(stack.kafka_bootstrap, outbox)
    assert published and len(published) < 100

    refused = run(3)  # the replay of batch 0 would split the same rows in 3
    err = str(refused.exception())
    assert "PartitioningChangedError" in err and "4 partitions" in err and "partitions=N" in err, err
    assert len(read_topic(stack.kafka_bootstrap, outbox)) == len(published), "the refused replay published nothing"

    run(4)  # the same partitioning: only partition 3 publishes
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 100))


# -- contents moved between indices by a replay (driven by hand, no Spark) -------------------


def test_a_replay_that_moves_contents_between_indices_publishes_each_content_once(stack, make_topic, unique):
    """What the Kafka source does to a replayed batch: the rows of index 0 come back at index 1, and
    index 0 gets rows that were never published. Each content is published once, record ids stay unique."""
    from eosink.spark_jobs.naming import stream_run_id
    from eosink.spark_jobs.task import PUBLISHED, SKIPPED, publish_partition

    hand = HandRun(stack.kafka_bootstrap, unique, make_topic(1), stream_run_id("q", 7))
    rows, spec, outbox = hand.rows, hand.spec, hand.outbox

    first = publish_partition(spec(), 0, 0, iter([rows(0, 50)]))  # the first attempt: only index 0 committed
    assert first.status == PUBLISHED
    replay = spec()
    moved = publish_partition(replay, 1, 0, iter([rows(30, 50), rows(0, 30)]))  # the same rows, another order
    new = publish_partition(replay, 0, 0, iter([rows(50, 90)]))
    assert (moved.status, new.status) == (SKIPPED, PUBLISHED)

    recs = read_topic(stack.kafka_bootstrap, outbox)
    assert_exactly_once(recs, keys(0, 90))  # (and every eosink.id once)


# -- bad input: refused before anything is published, naming the option or column -----------


def _failure(query) -> str:  # noqa: ANN001 - a StreamingQuery
    from pyspark.errors import StreamingQueryException

    try:
        assert query.awaitTermination(120), "the query was expected to fail"
    except StreamingQueryException as e:
        return str(e)
    return str(query.exception())


def test_a_streaming_dataframe_given_to_the_batch_api_and_the_reverse_are_refused(spark, stack, unique, tmp_path):  # noqa: F811
    from eosink.connectors.api.errors import ConfigError
    from eosink.spark_jobs import publish_outbox, publish_outbox_stream

    stream = spark.readStream.format("rate").load()
    with pytest.raises(ConfigError, match="publish_outbox_stream") as err:
        publish_outbox(stream, "t", key="value", job=unique, run_id="r1", kafka=stack.kafka_bootstrap)
    assert err.value.key == "df"
    with pytest.raises(ConfigError, match=r"publish_outbox\(df") as err:
        publish_outbox_stream(spark.range(3), "t", key="id", job=unique, checkpoint=str(tmp_path), kafka=stack.kafka_bootstrap)
    assert err.value.key == "df"


def test_a_missing_checkpoint_location_is_named(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.connectors.api.errors import ConfigError
    from eosink.spark_jobs import publish_outbox_stream

    source, outbox = make_topic(1), make_topic(1)
    df = source_frame(spark, stack.kafka_bootstrap, source, 100)
    with pytest.raises(ConfigError, match="checkpoint=") as err:
        publish_outbox_stream(df, outbox, key="k", job=unique, checkpoint=None, kafka=stack.kafka_bootstrap)
    assert err.value.key == "checkpoint"
    with pytest.raises(Exception, match="checkpointLocation"):  # Spark's own check, for the format
        (df.writeStream.format("eosink").option("topic", outbox).option("key", "k").option("job", unique)
         .option("kafka.bootstrap.servers", stack.kafka_bootstrap).start())


def test_output_modes_the_writer_cannot_honour_are_refused(spark, stack, make_topic, unique, tmp_path):  # noqa: F811
    from eosink.connectors.api.errors import ConfigError
    from eosink.spark_jobs import publish_outbox_stream

    source, outbox = make_topic(1), make_topic(1)
    produce(stack.kafka_bootstrap, source, 0, 10)
    counts = source_frame(spark, stack.kafka_bootstrap, source, 100).groupBy("k").count()
    with pytest.raises(ConfigError, match="update") as err:
        publish_outbox_stream(counts, outbox, key="k", job=unique, checkpoint=str(tmp_path / "a"),
                              kafka=stack.kafka_bootstrap, output_mode="complete")
    assert err.value.key == "output_mode"
    counts = counts.selectExpr("k", "CAST(count AS STRING) AS value")
    for mode, said in (("complete", "outputMode('complete')"), ("update", "does not support Update mode")):
        query = (counts.writeStream.format("eosink").outputMode(mode).option("topic", outbox).option("key", "k")
                 .option("job", unique).option("kafka.bootstrap.servers", stack.kafka_bootstrap)
                 .option("checkpointLocation", str(tmp_path / mode)).trigger(availableNow=True).start())
        assert said in _failure(query)
    assert read_topic(stack.kafka_bootstrap, outbox) == []


def test_a_missing_outbox_topic_is_named(spark, stack, make_topic, unique, tmp_path):  # noqa: F811
    from eosink.spark_jobs import publish_outbox_stream
    from eosink.spark_jobs.errors import TopicMissingError

    source = make_topic(1)
    produce(stack.kafka_bootstrap, source, 0, 10)
    df = source_frame(spark, stack.kafka_bootstrap, source, 100)
    with pytest.raises(TopicMissingError, match=f"{unique}_nowhere"):
        publish_outbox_stream(df, f"{unique}_nowhere", key="k", job=unique, checkpoint=str(tmp_path / "a"),
                              kafka=stack.kafka_bootstrap)
    query = (df.writeStream.format("eosink").option("topic", f"{unique}_nowhere").option("key", "k").option("job", unique)
             .option("kafka.bootstrap.servers", stack.kafka_bootstrap).option("checkpointLocation", str(tmp_path / "b"))
             .trigger(availableNow=True).start())
    failure = _failure(query)
    assert "TopicMissingError" in failure and f"{unique}_nowhere" in failure


def test_a_missing_key_column_and_a_value_column_to_encode_are_named(spark, stack, make_topic, unique, tmp_path):  # noqa: F811
    from eosink.spark_jobs import publish_outbox_stream
    from eosink.spark_jobs.errors import MissingColumnError

    source, outbox = make_topic(1), make_topic(1)
    produce(stack.kafka_bootstrap, source, 0, 10)
    df = source_frame(spark, stack.kafka_bootstrap, source, 100)
    with pytest.raises(MissingColumnError, match="'user_id'.*available columns: k, value"):
        publish_outbox_stream(df, outbox, key="user_id", job=unique, checkpoint=str(tmp_path / "a"),
                              kafka=stack.kafka_bootstrap)

    def sink(frame, name: str, key: str):  # noqa: ANN001, ANN202
        return (frame.writeStream.format("eosink").option("topic", outbox).option("key", key).option("job", unique)
                .option("kafka.bootstrap.servers", stack.kafka_bootstrap)
                .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())

    failure = _failure(sink(df, "b", "user_id"))
    assert "MissingColumnError" in failure and "'user_id'" in failure
    failure = _failure(sink(df.selectExpr("k", "length(value) AS value"), "c", "k"))
    assert "value column 'value' is int" in failure and "to_json" in failure
    assert read_topic(stack.kafka_bootstrap, outbox) == []


# -- the batch side of the format ---------------------------------------------------------------


def test_batch_write_format_publishes_once_per_run_id_through_a_retry_and_a_rerun(spark, stack, make_topic, unique):  # noqa: F811
    from pyspark.sql import functions as F

    from eosink.spark_jobs.faults import FailAt, to_option

    outbox = make_topic(2)
    df = spark.range(0, 200, 1, numPartitions=4).select(F.format_string("k-%06d", "id").alias("k"),
                                                         F.to_json(F.struct("id")).alias("value"))

    def write(mode: str = "append", **options: str) -> None:
        w = (df.write.format("eosink").mode(mode).option("topic", outbox).option("key", "k").option("job", unique)
             .option("run_id", "r1").option("kafka.bootstrap.servers", stack.kafka_bootstrap))
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    write(fault_hook=to_option(FailAt("after_commit", partitions=frozenset({1}))))  # partition 1 is retried
    write()  # the same run id again: every partition is in the ledger
    assert_exactly_once(read_topic(stack.kafka_bootstrap, outbox), keys(0, 200))
    marker = entries(stack.kafka_bootstrap, unique)["r1/run"]
    assert (marker["num_partitions"], marker["records"]) == (4, 200)
    with pytest.raises(Exception, match=r"mode\('append'\)"):
        write(mode="overwrite")
