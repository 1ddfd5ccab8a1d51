"""The exactly-once Spark outbox publisher against real Spark and the real Kafka of the stack.

Every test reads back with a read_committed consumer to the log end and counts by key and by
``eosink.id``: each expected record exactly once, nothing missing, nothing from an aborted
transaction. Failures are injected with :mod:`eosink.spark_jobs.faults` hooks (off by default).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eosink.worker.stack.proc import free_port
from tests.spark_fixtures import assert_exactly_once, ledger, read_topic, spark  # noqa: F401

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
N = 400  # rows per test DataFrame; 4 partitions of 100


def frame(spark, n: int = N, partitions: int = 4):  # noqa: F811 - the fixture is passed in
    """``k-000000``.. in ``partitions`` contiguous ranges (partition p = rows [p*n/P, (p+1)*n/P))."""
    from pyspark.sql import functions as F

    return spark.range(0, n, 1, numPartitions=partitions).select(
        F.format_string("k-%06d", F.col("id")).alias("k"),
        F.col("id"),
        (F.col("id") * 3).alias("amount"),
        (F.col("id") % 2 == 0).alias("even"),
        F.lit("x" * 40).alias("pad"),
    )


def keys(lo: int, hi: int) -> list[str]:
    return [f"k-{i:06d}" for i in range(lo, hi)]


def publish(spark, stack, topic, unique, run_id="r1", **kw):  # noqa: F811
    from eosink.spark_jobs import publish_outbox

    kw.setdefault("key", "k")
    df = kw.pop("df", None) or frame(spark)
    return publish_outbox(df, topic, job=unique, run_id=run_id, kafka=stack.kafka_bootstrap, **kw)


# -- the happy path --------------------------------------------------------------------------


def test_every_row_once_with_stable_ids_two_outboxes_one_transaction(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs import Outbox

    rows_topic, events_topic = make_topic(3), make_topic(2)
    res = publish(
        spark, stack, [Outbox(rows_topic), Outbox(events_topic, value=["k", "amount"], when="even")], unique,
        headers={"source": "test"},
    )
    assert (res.status, res.published_partitions, res.records) == ("published", 4, N + N // 2)
    assert res.topics == {rows_topic: N, events_topic: N // 2}

    rows, events = read_topic(stack.kafka_bootstrap, rows_topic), read_topic(stack.kafka_bootstrap, events_topic)
    assert_exactly_once(rows, keys(0, N))
    assert_exactly_once(events, keys(0, N)[::2])
    assert rows[0].json().keys() == {"k", "id", "amount", "even", "pad"}
    assert events[0].json().keys() == {"k", "amount"}
    for r in rows + events:
        job, run, part, seq = r.id.split("/")
        assert (job, run, r.headers["eosink.run"], r.headers["source"]) == (unique, "r1", "r1", "test")
        assert int(part) == int(r.key[2:]) * 4 // N  # the Spark partition the row came from
    # sequences are dense per partition across both topics: 0..count-1
    by_part: dict[str, list[int]] = {}
    for r in rows + events:
        _, _, part, seq = r.id.split("/")
        by_part.setdefault(part, []).append(int(seq))
    assert {p: sorted(s) for p, s in by_part.items()} == {p: list(range(len(s))) for p, s in by_part.items()}

    entries = ledger(stack.kafka_bootstrap, unique, "r1")
    assert sorted(entries) == ["0", "1", "2", "3", "run"]
    assert sum(entries[p]["records"] for p in "0123") == N + N // 2
    assert entries["1"]["topics"] == {rows_topic: 100, events_topic: 50}
    assert entries["run"]["num_partitions"] == 4 and entries["run"]["records"] == N + N // 2

    from eosink.spark_jobs.task import STEPS

    # Where the time went: the driver's steps and every task's add up to no more than their totals.
    assert set(res.steps) == {"checks", "job", "finish"} and min(res.steps.values()) >= 0
    assert sum(res.steps.values()) <= res.seconds + 1e-3
    for p in res.partitions:
        assert set(p.steps) == set(STEPS) and min(p.steps.values()) >= 0, p
        assert p.steps["write"] > 0 and sum(p.steps.values()) <= p.seconds + 1e-3, p


# -- failures and retries --------------------------------------------------------------------


def test_task_failing_after_commit_is_retried_without_duplicates(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.faults import FailAt

    topic = make_topic(2)
    res = publish(spark, stack, topic, unique, fault_hook=FailAt("after_commit"))  # attempt 0 of every partition
    # Spark retried every partition; each retry found its partition in the ledger and wrote nothing.
    assert [(p.attempt, p.status) for p in res.partitions] == [(1, "committed_by_earlier_attempt")] * 4
    assert res.records == N
    assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), keys(0, N))
    assert {e["attempt"] for k, e in ledger(stack.kafka_bootstrap, unique, "r1").items() if k != "run"} == {0}


def test_task_failing_before_commit_is_never_visible(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.faults import FailAt

    topic = make_topic(1)
    # Partition 1's first attempt flushes its records and ledger entry, then its Python worker dies
    # without aborting (a crashed executor); the retry's init_transactions aborts that transaction.
    crash = FailAt("before_commit", partitions=frozenset({1}), crash=True)
    res = publish(spark, stack, topic, unique, fault_hook=crash, ledger_timeout_s=20)
    assert res.partitions[1].attempt == 1 and res.records == N
    # The crashed transaction held the ledger's LSO until the retry aborted it; the other
    # partitions' ledger checks must not have waited for it (no LedgerError, no retry).
    assert [p.attempt for p in res.partitions] == [0, 1, 0, 0]

    assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), keys(0, N))
    in_log = read_topic(stack.kafka_bootstrap, topic, isolation="read_uncommitted")
    assert len(in_log) == N + 100, "the aborted attempt's records are in the log (and invisible above)"
    assert ledger(stack.kafka_bootstrap, unique, "r1")["1"]["attempt"] == 1


def test_job_failing_for_good_publishes_no_half_partition_and_rerun_completes(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.errors import PublishError
    from eosink.spark_jobs.faults import FailAt

    topic = make_topic(2)
    always = frozenset(range(4))
    with pytest.raises(PublishError, match="InjectedFault: injected fault at before_commit .*same run_id"):
        publish(spark, stack, topic, unique, fault_hook=FailAt("before_commit", always, frozenset({2})))
    # The failed job left partitions 0, 1, 3 committed (maybe) and nothing at all of partition 2.
    after_failure = read_topic(stack.kafka_bootstrap, topic)
    assert not {r.key for r in after_failure} & set(keys(200, 300))
    assert "run" not in ledger(stack.kafka_bootstrap, unique, "r1")

    res = publish(spark, stack, topic, unique)  # the same run id: only what is missing
    assert res.published_partitions >= 1 and 2 in [p.partition for p in res.partitions if p.status == "published"]
    assert res.run_records == N
    assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), keys(0, N))


def test_rerun_same_run_id_publishes_nothing_new_run_id_publishes_a_new_set(spark, stack, make_topic, unique):  # noqa: F811
    topic = make_topic(2)
    first = publish(spark, stack, topic, unique, run_id="r1")
    again = publish(spark, stack, topic, unique, run_id="r1")
    assert (first.records, again.status, again.records, again.run_records) == (N, "already_published", 0, N)
    assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), keys(0, N))

    second = publish(spark, stack, topic, unique, run_id="r2")
    assert second.records == N
    recs = read_topic(stack.kafka_bootstrap, topic)
    for run in ("r1", "r2"):
        assert_exactly_once([r for r in recs if r.headers["eosink.run"] == run], keys(0, N))
    assert len(recs) == 2 * N


# -- attempts driven by hand: fencing and the ledger check -----------------------------------


def _spec(stack, unique, topic):
    from eosink.spark_jobs.kafka_checks import admin_client, cluster_metadata, ensure_ledger_topic
    from eosink.spark_jobs.ledger import LedgerReader
    from eosink.spark_jobs.naming import LEDGER_TOPIC
    from eosink.spark_jobs.outbox import CompiledOutbox
    from eosink.spark_jobs.publisher import producer_config
    from eosink.spark_jobs.task import TaskSpec

    conf = producer_config(stack.kafka_bootstrap)
    admin = admin_client(conf)
    ensure_ledger_topic(admin, cluster_metadata(admin, stack.kafka_bootstrap), LEDGER_TOPIC)
    reader = LedgerReader(conf, LEDGER_TOPIC)
    since = reader.end_offset(10)
    reader.close()
    return TaskSpec(
        job=unique, run_id="r1", producer_config=conf, outboxes=(CompiledOutbox(topic, 0, 1, None, ()),),
        ledger_topic=LEDGER_TOPIC, ledger_since=since, known_published=frozenset(), transaction_timeout_ms=60_000,
        ledger_timeout_s=30,
    )


def _batch(lo: int, hi: int):
    import pyarrow as pa

    ks = keys(lo, hi)
    return pa.record_batch([pa.array(ks), pa.array([k.encode() for k in ks], pa.binary())], names=["k", "v"])


def test_zombie_attempt_is_fenced_by_a_newer_attempt(stack, make_topic, unique):
    from eosink.spark_jobs.errors import TransactionFencedError
    from eosink.spark_jobs.task import PartitionPublisher

    topic = make_topic(1)
    spec = _spec(stack, unique, topic)
    a = PartitionPublisher(spec, 0, attempt=0)
    assert a.open() is None
    a.write(_batch(0, 50))  # A is mid-transaction ... and stalls (GC pause, lost executor)
    b = PartitionPublisher(spec, 0, attempt=1)
    assert b.open() is None  # B's init_transactions bumps the epoch: A is now a zombie
    with pytest.raises(TransactionFencedError) as fenced:
        a.write(_batch(50, 100))
        a.commit()  # A wakes up and tries to finish
    assert f"eosink-{unique}-r1-0" in str(fenced.value)
    a.close()
    b.write(_batch(0, 100))
    done = b.commit()
    assert done.records == 100 and set(done.steps) == {"open", "write", "commit"}
    c = PartitionPublisher(spec, 0, attempt=2)
    assert c.open() is not None, "a later attempt finds the partition in the ledger"
    c.close()
    recs = read_topic(stack.kafka_bootstrap, topic)
    assert_exactly_once(recs, keys(0, 100))
    assert len(read_topic(stack.kafka_bootstrap, topic, isolation="read_uncommitted")) >= 100


def test_produce_loop_gives_the_garbage_collector_back_when_it_fails(stack, make_topic, unique):
    """The loop pauses the cyclic collector; a failing produce() must not leave the worker without it."""
    import gc

    from eosink.spark_jobs.task import PartitionPublisher

    class Refusing:
        def produce(self, *args, **kwargs):
            raise RuntimeError("refused")

        def poll(self, timeout):
            return 0

    pub = PartitionPublisher(_spec(stack, unique, make_topic(1)), 0, attempt=0)
    pub._producer, pub._in_txn, pub._began_at = Refusing(), True, time.monotonic()  # type: ignore[assignment]
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="refused"):
        pub.write(_batch(0, 10))
    assert gc.isenabled()
    pub._in_txn, pub._producer = False, None


def test_ledger_check_reads_to_the_log_end_not_the_last_stable_offset(stack, make_topic, unique):
    """An unrelated open transaction on the ledger holds the LSO below A's committed entry; B's
    check must wait for it instead of concluding "not published" (which would duplicate)."""
    from confluent_kafka import Producer

    from eosink.spark_jobs.task import PartitionPublisher

    topic = make_topic(1)
    spec = _spec(stack, unique, topic)
    a = PartitionPublisher(spec, 0, attempt=0)
    assert a.open() is None
    a.write(_batch(0, 20))
    other = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-other"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(spec.ledger_topic, b"{}", f"{unique}-other/x/0".encode(), partition=0)
    other.flush(10)  # in the log, open: the LSO of the ledger stops here
    a.commit()  # A's entry lands behind the open transaction
    a.close()

    seen: dict[str, object] = {}
    b = PartitionPublisher(spec, 0, attempt=1)
    t = threading.Thread(target=lambda: seen.setdefault("entry", b.open()))
    t.start()
    t.join(2.0)
    assert t.is_alive(), "B answered while the ledger's LSO was held back: it cannot have seen A's entry"
    other.abort_transaction(30)
    t.join(30)
    assert not t.is_alive()
    b.close()
    assert seen["entry"] is not None and seen["entry"].records == 20
    assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), keys(0, 20))


# -- bad input -------------------------------------------------------------------------------


def test_missing_key_column_names_it_and_lists_the_columns(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.errors import MissingColumnError

    topic = make_topic(1)
    with pytest.raises(MissingColumnError) as err:
        publish(spark, stack, topic, unique, key="customer_id")
    assert "customer_id" in str(err.value) and "k, id, amount, even, pad" in str(err.value)
    assert read_topic(stack.kafka_bootstrap, topic) == []
    assert ledger(stack.kafka_bootstrap, unique, "r1") == {}


def test_unreachable_broker_names_the_bootstrap_servers(spark, unique):  # noqa: F811
    from eosink.spark_jobs import publish_outbox
    from eosink.spark_jobs.errors import BrokerUnreachableError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(BrokerUnreachableError) as err:
        publish_outbox(frame(spark), "t", key="k", job=unique, run_id="r1", kafka=dead, connect_timeout_s=3)
    assert dead in str(err.value)


def test_transaction_timeout_above_the_broker_maximum_is_refused(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.errors import TransactionTimeoutError

    with pytest.raises(TransactionTimeoutError, match="transaction.max.timeout.ms=900000"):
        publish(spark, stack, make_topic(1), unique, transaction_timeout_ms=900_001)


def test_partition_longer_than_its_transaction_budget_fails_clearly(spark, stack, make_topic, unique):  # noqa: F811
    from eosink.spark_jobs.errors import TaskTooLongError
    from eosink.spark_jobs.faults import SleepAt

    topic = make_topic(1)
    slow = SleepAt("after_first_batch", 1.3, attempts=frozenset(range(4)))
    with pytest.raises(TaskTooLongError, match=f"eosink-{unique}-r1-0") as err:
        publish(spark, stack, topic, unique, df=frame(spark, 40, 1), transaction_timeout_ms=1500, fault_hook=slow)
    assert "transaction.timeout.ms=1500" in str(err.value)
    assert read_topic(stack.kafka_bootstrap, topic) == []


# -- speculative execution -------------------------------------------------------------------

SPECULATION_DRIVER = textwrap.dedent(
    """
    import json, sys
    from eosink.spark_jobs import Outbox, publish_outbox
    from eosink.spark_jobs.faults import Hooks, SleepAt, TouchAt, WaitAt
    from eosink.spark_jobs.jobs.orders import ORDER_COLUMNS, orders_frame
    from eosink.spark_jobs.session import build_session

    master, bootstrap, orders_topic, events_topic, job, committed_flag = sys.argv[1:7]
    spark = build_session("eosink-speculation", master=master, conf={
        "spark.ui.enabled": "false", "spark.speculation": "true", "spark.speculation.multiplier": "1",
        "spark.speculation.quantile": "0.1", "spark.speculation.minTaskRuntime": "100ms",
        "spark.speculation.interval": "100ms", "spark.task.maxFailures": "4",
        "spark.executor.memory": "512m", "spark.cores.max": "4"})
    spark.sparkContext.setLogLevel("ERROR")
    # Nothing fails. Partition 0's first attempt stalls mid-transaction, so its speculative copy
    # fences it and publishes. Partition 1's first attempt stalls after its commit; its copy waits
    # for that commit before fencing (Spark may launch the copy earlier on a loaded machine), then
    # finds the partition in the ledger and publishes nothing.
    p1 = frozenset({1})
    slow = Hooks((SleepAt("after_first_batch", 10, partitions=frozenset({0})),
                  TouchAt("after_commit", committed_flag, partitions=p1),
                  SleepAt("after_commit", 10, partitions=p1),
                  WaitAt("before_init", committed_flag, 120, attempts=frozenset({1, 2, 3}), partitions=p1)))
    res = publish_outbox(
        orders_frame(spark, 400, 4),
        [Outbox(orders_topic, key="order_id", value=ORDER_COLUMNS), Outbox(events_topic, key="order_id", value="event")],
        key="order_id", job=job, run_id="r1", kafka=bootstrap, fault_hook=slow)
    print("RESULT " + json.dumps({"records": res.records,
                                  "partition_attempts": [[p.partition, p.attempt, p.status] for p in res.partitions]}))
    spark.stop()
    """
)


@pytest.fixture
def standalone_cluster(tmp_path) -> Iterator[str]:
    """A Spark standalone master and two workers on 127.0.0.2 and 127.0.0.3.

    Spark never runs a speculative copy on a host that already runs an attempt of the task, and
    ``local[N]`` and ``local-cluster`` have one host ("speculation" there never launches a copy;
    tried). Two workers bound to different loopback addresses are two hosts on one machine.
    """
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = []

    def start(name: str, *args: str, host: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            [str(spark_home / "bin" / "spark-class"), *args],
            env={**env, "SPARK_LOCAL_IP": host}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        procs.append(p)
        return p

    start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
          "--webui-port", "0", host="127.0.0.1")
    for i in (2, 3):
        start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", f"127.0.0.{i}", "--cores", "2",
              "--memory", "1g", "--webui-port", "0", "--work-dir", str(tmp_path / f"work{i}"), master_url,
              host=f"127.0.0.{i}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = [(tmp_path / f"worker{i}.log").read_text(errors="replace") for i in (2, 3)]
        if all("Successfully registered with master" in log for log in logs):
            break
        time.sleep(0.5)
    else:
        pytest.fail("standalone workers did not register: " + (tmp_path / "worker2.log").read_text()[-2000:])
    try:
        yield master_url
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_speculative_execution_publishes_each_partition_once(standalone_cluster, stack, make_topic, unique, tmp_path):
    orders_topic, events_topic = make_topic(2), make_topic(2)
    script = tmp_path / "speculation_driver.py"
    script.write_text(SPECULATION_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, str(script), standalone_cluster, stack.kafka_bootstrap, orders_topic, events_topic, unique,
         str(tmp_path / "partition-1-committed")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["records"] == 800
    attempts = {p: (a, s) for p, a, s in result["partition_attempts"]}
    # No failure was injected, so an attempt number above 0 can only be a speculative copy.
    assert attempts[0] == (1, "published"), f"speculative copy of partition 0 did not win: {attempts}"
    assert attempts[1][0] == 1 and attempts[1][1] == "committed_by_earlier_attempt", attempts
    entries = ledger(stack.kafka_bootstrap, unique, "r1")
    assert entries["0"]["attempt"] == 1 and entries["1"]["attempt"] == 0

    expected = [f"o-{i:08d}" for i in range(400)]
    assert_exactly_once(read_topic(stack.kafka_bootstrap, orders_topic), expected)
    assert_exactly_once(read_topic(stack.kafka_bootstrap, events_topic), expected)
