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

from tests.spark_fixtures import assert_exactly_once, read_topic, spark  # noqa: F401
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
            ) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [sys.executable, str(REPO / "tests" / "stream_driver.py"), engine, stack.kafka_bootstrap, source, outbox, job,
           str(ck)] + (["--fault", fault] if fault else [])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


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
    driver = _driver(engine, stack, source, outbox, unique, ck, to_option(fault))
    try:
        deadline = time.monotonic() + 180
        while not committed.exists():
            assert driver.poll() is None, driver.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "batch 1's partition 0 never committed"
            time.sleep(0.2)
        time.sleep(1.0)  # partitions 1 and 2 are now inside their transactions
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
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
