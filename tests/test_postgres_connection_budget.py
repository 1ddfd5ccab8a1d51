"""A hundred PostgreSQL connectors on three workers, against a PostgreSQL at its default max_connections.

A private PostgreSQL with ``max_connections = 100`` (the server's default) and
``max_prepared_transactions = 128`` (at least one per sink task, as the sink's docs ask). 100
connectors of one task each, every one into its own table, on three real workers while a
producer publishes, one worker SIGKILLed and restarted midway. Each worker's postgres sinks share
one pool for the database (``--postgres-pool-size``, default 20), so the cluster never needs more
than 3 x 20 connections; without the pool the 100 tasks would need 200 and half would wait.

Counted from the tables: every committed id once in each, none from an aborted transaction, no
prepared transaction left; no task failed and none waited for a connection slot; the connections
the workers held never passed their pools' sizes.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.faultkit import PARTITIONS, PrivateStack, Publisher
from tests.pgkit import assert_every_id_once, private_postgres
from tests.procs import WorkerProcess, register, wait_until

CONNECTORS = 100
WORKERS = ("w1", "w2", "w3")
POOL = 20  # the workers' default --postgres-pool-size


@pytest.fixture(scope="module")
def default_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """A private PostgreSQL at the server's default max_connections (100)."""
    with private_postgres(tmp_path_factory.mktemp("pg") / "home", max_connections=100,
                          max_prepared_transactions=CONNECTORS + 28) as pg:
        yield pg


class _Peak(threading.Thread):
    """Samples the connections eosink holds (``application_name`` ``eosink/...``) twice a second."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.peak, self.stopping = dsn, 0, threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self.stopping.wait(0.5):
                row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'eosink/%'").fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)


def test_a_hundred_postgres_connectors_on_three_workers_deliver_exactly_once_within_the_default_max_connections(
        default_pg: PrivateStack, stack: Any, unique: str, make_topic: Any, tmp_path: Path) -> None:
    dsn = default_pg.endpoints().postgres_dsn
    topic = make_topic(PARTITIONS)
    tables = [f"budget_{i}" for i in range(CONNECTORS)]
    for i, table in enumerate(tables):
        register(stack.zookeeper_hosts, unique, f"{unique}-{i}", {
            "connector.class": "postgres", "topics": topic, "tasks.max": "1", "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": table})
    ends = type("Endpoints", (), {"kafka_bootstrap": stack.kafka_bootstrap, "zookeeper_hosts": stack.zookeeper_hosts,
                                  "postgres_dsn": dsn})()
    workers = {w: WorkerProcess(ends, unique, w, tmp_path) for w in WORKERS}
    admin = psycopg.connect(dsn, autocommit=True)
    peak = _Peak(dsn)
    publisher = Publisher(stack.kafka_bootstrap, topic, per_txn=20, pause=0.2)

    def counts() -> list[int]:
        present = {r[0] for r in admin.execute("SELECT relname FROM pg_class WHERE relname LIKE 'budget_%' AND relkind = 'r'")}
        return [int(admin.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) if t in present else 0  # type: ignore[index]
                for t in tables]

    try:
        peak.start()
        publisher.start()
        def all_delivering() -> bool:
            assert publisher.failure is None, f"the publisher failed: {publisher.failure!r}"
            return min(counts()) > 0

        wait_until(all_delivering, 240, f"all {CONNECTORS} connectors to deliver", interval=2.0)
        workers["w3"].signal(signal.SIGKILL)  # mid-cycle for some of its ~33 tasks: prepared transactions left behind
        workers["w3"].wait(10)
        time.sleep(8)  # its tasks move to w1 and w2, which settle what it left
        workers["w3"] = WorkerProcess(ends, unique, "w3", tmp_path)
        time.sleep(8)
        publisher.stop()
        committed, aborted = publisher.committed, publisher.aborted
        assert committed, "nothing was published"
        wait_until(lambda: min(counts()) >= len(committed), 300,
                   f"every connector to deliver {len(committed)} records", interval=2.0)
        time.sleep(2)  # a few more commit intervals: anything extra would show now
        assert_every_id_once(admin, tables, committed, aborted)
        wait_until(lambda: admin.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,), 30,
                   "no prepared transaction left")
        logs = {w: p.log_path.read_text(errors="replace") for w, p in workers.items()}
        for w, text in logs.items():
            assert '"task_failed"' not in text, f"a task failed on {w}: see {workers[w].log_path}"
            assert "no connection slot left" not in text, f"a task waited for a connection slot on {w}: see {workers[w].log_path}"
        assert peak.peak <= len(WORKERS) * POOL, f"the workers held {peak.peak} connections, more than 3 pools of {POOL}"
        print(f"CONNECTION-BUDGET {CONNECTORS} connectors, {len(committed)} records each, "
              f"peak {peak.peak} eosink connections (max_connections 100)")
    finally:
        publisher.stopping.set()
        peak.stopping.set()
        for p in workers.values():
            p.stop(60)
        admin.close()
