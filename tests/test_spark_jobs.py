"""The Spark jobs (orders, balance alerts) through ``eosink spark run``, ``python -m`` and
``spark-submit``, reading Parquet/CSV/JSON paths and a Kafka topic with read_committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from tests.spark_fixtures import assert_exactly_once, read_topic, spark  # noqa: F401

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent


def order_ids(n: int) -> list[str]:
    return [f"o-{i:08d}" for i in range(n)]


def test_orders_job_via_cli_two_outboxes_and_rerun(spark, stack, make_topic, unique, capsys):  # noqa: F811
    from eosink.spark_jobs.cli import main

    orders, events = make_topic(3), make_topic(3)
    argv = ["run", "orders", "--bootstrap", stack.kafka_bootstrap, "--topic", orders, "--events-topic", events,
            "--n", "300", "--run-id", "r1", "--job", unique, "--no-create-topics"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["orders"], first["events"], first["status"]) == (300, 300, "published")
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["status"], again["records"]) == ("already_published", 0)

    rows, evts = read_topic(stack.kafka_bootstrap, orders), read_topic(stack.kafka_bootstrap, events)
    assert_exactly_once(rows, order_ids(300))
    assert_exactly_once(evts, order_ids(300))
    by_key = {r.key: r.json() for r in rows}
    for e in evts:  # the event of an order always travels with the order itself
        ev = e.json()
        assert ev["type"] == "order_created" and by_key[ev["order_id"]]["amount"] == ev["amount"]


def test_cli_rejects_unknown_job(capsys):
    from eosink.spark_jobs.cli import main

    assert main(["run", "nope"]) == 2
    assert "unknown job" in capsys.readouterr().err


def _transactions(n: int = 600, users: int = 12) -> list[dict]:
    """Users u-000..u-002 end above 10000.0; the rest stay small."""
    out = []
    for i in range(n):
        user = i % users
        amount = 300.0 if user < 3 else ((i % 7) - 3) * 5.0
        out.append({"txn_id": f"t-{i:06d}", "user_id": f"u-{user:03d}", "amount": amount,
                    "ts": f"2024-01-01T00:{(i // 60) % 60:02d}:{i % 60:02d}Z"})
    return out


def _expected(txns: list[dict], threshold: float = 10_000.0) -> tuple[dict[str, float], set[str]]:
    bal: dict[str, float] = defaultdict(float)
    for t in txns:
        bal[t["user_id"]] += t["amount"]
    return dict(bal), {u for u, b in bal.items() if b > threshold}


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_balance_alerts_from_files(spark, stack, make_topic, unique, tmp_path, fmt):  # noqa: F811
    from eosink.spark_jobs.jobs import balance_alerts

    txns = _transactions()
    balances, high = _expected(txns)
    assert high == {"u-000", "u-001", "u-002"}
    src = tmp_path / f"txns.{fmt}"
    if fmt == "json":
        src.write_text("\n".join(json.dumps(t) for t in txns))
    else:
        rows = [(t["txn_id"], t["user_id"], t["amount"], datetime.fromisoformat(t["ts"])) for t in txns]
        df = spark.createDataFrame(rows, schema=balance_alerts.TRANSACTION_SCHEMA)
        (df.coalesce(1).write.option("header", "true").csv(str(src)) if fmt == "csv" else df.write.parquet(str(src)))
    alerts, bals = make_topic(2), make_topic(2)
    res = balance_alerts.run(spark, run_id="r1", bootstrap=stack.kafka_bootstrap, alerts_topic=alerts,
                             balances_topic=bals, source=str(src), job=unique, create_topics=False)
    assert (res["alerts"], res["balances"]) == (3, 12)
    alert_recs = read_topic(stack.kafka_bootstrap, alerts)
    assert_exactly_once(alert_recs, sorted(high))
    for r in alert_recs:
        a = r.json()
        assert a["balance"] == pytest.approx(balances[r.key]) and a["message"].startswith("High balance detected: ")
    assert_exactly_once(read_topic(stack.kafka_bootstrap, bals), sorted(balances))


def test_balance_alerts_from_kafka_reads_only_committed_transactions(spark, stack, make_topic, unique):  # noqa: F811
    from confluent_kafka import Producer

    from eosink.spark_jobs.jobs import balance_alerts

    source = make_topic(2)
    txns = _transactions()
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-src"})
    p.init_transactions(30)
    p.begin_transaction()
    for t in txns:
        p.produce(source, json.dumps(t).encode(), t["user_id"].encode())
    p.commit_transaction(30)
    p.begin_transaction()  # an aborted upstream transaction that would raise an alert for u-011
    p.produce(source, json.dumps({"txn_id": "t-bogus", "user_id": "u-011", "amount": 1e6,
                                  "ts": "2024-01-01T01:00:00Z"}).encode(), b"u-011")
    p.flush(10)
    p.abort_transaction(30)

    alerts = make_topic(1)
    res = balance_alerts.run(spark, run_id="r1", bootstrap=stack.kafka_bootstrap, alerts_topic=alerts,
                             source=f"kafka:{source}", job=unique, create_topics=False)
    assert res["alerts"] == 3
    assert_exactly_once(read_topic(stack.kafka_bootstrap, alerts), ["u-000", "u-001", "u-002"])


def test_orders_job_with_spark_submit(stack, make_topic, unique):
    """``spark-submit spark_jobs/jobs/orders.py`` as a data engineer runs it: the script is a file
    path, not a module, and imports ``eosink.*`` from the interpreter eosink is installed in."""
    import pyspark

    orders = make_topic(2)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run(
        [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", str(REPO / "spark_jobs" / "jobs" / "orders.py"),
         "--bootstrap", stack.kafka_bootstrap, "--topic", orders, "--n", "120", "--run-id", "r1", "--job", unique,
         "--no-create-topics"],
        env=env, capture_output=True, text=True, timeout=180, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["orders"] == 120
    assert_exactly_once(read_topic(stack.kafka_bootstrap, orders), order_ids(120))
