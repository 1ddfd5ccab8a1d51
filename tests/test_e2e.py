"""The first vertical slice, end to end on the real stack: a PySpark job publishes an outbox in
one Kafka transaction per task, a worker process delivers it into PostgreSQL and files through
two-phase commit, and PostgreSQL itself is counted. Records of an aborted Kafka transaction are
on the topic too, and must never arrive.
"""

from __future__ import annotations

import json

import pytest

from tests.procs import WorkerProcess, free_port, register, wait_until
from tests.spark_fixtures import spark  # noqa: F401 - session fixture

pytestmark = pytest.mark.spark


def _publish_aborted(bootstrap: str, topic: str, n: int) -> set[str]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"aborted-{topic}"})
    p.init_transactions(30)
    p.begin_transaction()
    ids = {f"aborted-{i}" for i in range(n)}
    for rid in ids:
        p.produce(topic, value=json.dumps({"order_id": rid, "customer": "nobody"}).encode())
    p.flush(30)
    p.abort_transaction(30)
    return ids


def test_spark_outbox_to_postgres_exactly_once_and_aborted_txn_never_arrives(spark, stack, make_topic, unique, pg, tmp_path):  # noqa: F811
    from eosink.spark_jobs.jobs import orders

    topic = make_topic(4)
    n = 5000
    aborted = _publish_aborted(stack.kafka_bootstrap, topic, 300)
    result = orders.run(spark, run_id=f"run-{unique}", bootstrap=stack.kafka_bootstrap, orders_topic=topic,
                        n_orders=n, partitions=4, create_topics=False)
    assert result["records"] == n
    _publish_aborted(stack.kafka_bootstrap, topic, 0)  # an empty aborted txn after the data: markers only

    connector = unique.replace("_", "-")
    register(stack.zookeeper_hosts, unique, connector, {
        "connector.class": "fanout", "topics": topic, "sinks": "db,files",
        "sinks.db.connector.class": "postgres", "sinks.db.connection.url": "${env:EOSINK_PG_DSN}",
        "sinks.db.table.name.format": unique,
        "sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(tmp_path / "out"),
        "commit.interval.ms": "300",
    })
    port = free_port()
    worker = WorkerProcess(stack, unique, "w-e2e", tmp_path, metrics_port=port)

    def delivered() -> int:
        if not pg.execute("SELECT to_regclass(%s)", (unique,)).fetchone()[0]:
            return 0
        return pg.execute(f'SELECT count(*) FROM "{unique}"').fetchone()[0]

    try:
        wait_until(lambda: delivered() >= n, 120, f"{n} rows in PostgreSQL")
        import urllib.request

        def scraped() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        wait_until(lambda: f'eosink_records_delivered_total{{connector="{connector}"}} {float(n)}' in scraped(), 30,
                   "the delivered count on /metrics")
        text = scraped()
        assert f'eosink_cycles_total{{connector="{connector}",outcome="succeeded"}}' in text
        assert "eosink_cycle_duration_seconds_bucket" in text and "eosink_prepared_unresolved" in text
        lag = f'eosink_consumer_lag{{connector="{connector}",partition="0",topic="{topic}"}} 0.0'
        wait_until(lambda: lag in scraped(), 30, "the consumer lag of partition 0 on /metrics, caught up")
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]

    ids = [r[0] for r in pg.execute(f'SELECT order_id FROM "{unique}"')]
    expected = {f"o-{i:08d}" for i in range(n)}
    assert len(ids) == len(set(ids)), "duplicates in PostgreSQL"
    assert set(ids) == expected, f"missing {len(expected - set(ids))}"
    assert not set(ids) & aborted, "a record of an aborted Kafka transaction reached PostgreSQL"
    files = [json.loads(line)["value"]["order_id"]
             for f in (tmp_path / "out" / connector / "committed").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(files) == sorted(expected)
    prepared = pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector}.%",)).fetchone()[0]
    assert prepared == 0


def test_connector_json_errors_name_the_problem(tmp_path):
    from eosink.connectors.api.errors import ConfigError
    from eosink.worker.control.config import load_connector_file

    cases = {
        "broken.json": ('{"name": "x", "config": {', "not valid JSON"),
        "noname.json": ('{"config": {"connector.class": "filesystem", "topics": "t", "file.path": "/tmp"}}', "'name'"),
        "noclass.json": ('{"name": "x", "config": {"topics": "t"}}', "key 'connector.class'"),
        "notopics.json": ('{"name": "x", "config": {"connector.class": "filesystem", "file.path": "/tmp"}}', "key 'topics'"),
        "badclass.json": ('{"name": "x", "config": {"connector.class": "nope", "topics": "t"}}', "unknown connector class"),
        "badint.json": ('{"name": "x", "config": {"connector.class": "filesystem", "topics": "t", "file.path": "/t",'
                        ' "commit.interval.ms": "soon"}}', "key 'commit.interval.ms'"),
        "nopath.json": ('{"name": "x", "config": {"connector.class": "filesystem", "topics": "t"}}', "key 'file.path'"),
        "noenv.json": ('{"name": "x", "config": {"connector.class": "filesystem", "topics": "t",'
                       ' "file.path": "${env:EOSINK_SURELY_UNSET}"}}', "EOSINK_SURELY_UNSET"),
    }
    for fname, (text, expect) in cases.items():
        path = tmp_path / fname
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_connector_file(path)
        assert expect in str(info.value) and fname in str(info.value), (fname, str(info.value))


def test_cli_apply_of_a_bad_file_prints_one_line_and_exits_nonzero(tmp_path, stack):
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "config": {"connector.class": "postgres"}}')
    r = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "connectors", "--zookeeper", stack.zookeeper_hosts,
                        "apply", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "key 'topics'" in r.stderr and "bad.json" in r.stderr, r.stderr
