"""A PostgreSQL that is full (SQLSTATE 53300): retried with a status naming the database and the limit.

A private PostgreSQL with ``max_connections = 8`` (the shared stack's is never touched): first one
sink meets it full, then real workers run connectors while other clients hold all its slots, and
a producer publishes. Every connector shows in ``GET /connectors/<name>/status`` as
retrying, naming ``host:port/dbname`` and ``max_connections``; once the other clients go, every
connector delivers every committed id exactly once through the workers' pools (4 slots for 5
connectors on 2 workers), no task failed and no prepared transaction is left.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from eosink.connectors.api.errors import RetryableError
from eosink.connectors.postgres.sink import PostgresSink
from tests.faultkit import PARTITIONS, PrivateStack, Publisher
from tests.pgkit import assert_every_id_once, private_postgres
from tests.procs import WorkerProcess, free_port, register, wait_until
from tests.sinkkit import prepare, records

LIMIT = 8


@pytest.fixture(scope="module")
def small_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """A private PostgreSQL restarted with max_connections = LIMIT."""
    with private_postgres(tmp_path_factory.mktemp("pg") / "home", max_connections=LIMIT) as pg:
        yield pg


def _where(pg: PrivateStack) -> str:
    info = psycopg.conninfo.conninfo_to_dict(pg.endpoints().postgres_dsn)
    return f"{info['host']}:{info['port']}/{info['dbname']}"


def _fill(dsn: str) -> list[psycopg.Connection[Any]]:
    """Connections until the server refuses one: it is full."""
    held: list[psycopg.Connection[Any]] = []
    for _ in range(LIMIT + 5):
        try:
            held.append(psycopg.connect(dsn, autocommit=True))
        except psycopg.OperationalError as exc:
            assert "too many clients" in str(exc), exc
            return held
    raise AssertionError(f"{len(held)} connections and the server still takes more (max_connections = {LIMIT}?)")


def test_postgres_out_of_connections_at_open_is_retryable_naming_the_database_and_the_limit(
        small_pg: PrivateStack, unique: str) -> None:
    dsn = small_pg.endpoints().postgres_dsn
    held = _fill(dsn)
    sink = PostgresSink(unique, {"connection.url": dsn, "auto.create": True})
    try:
        with pytest.raises(RetryableError) as none_open:  # no connection of its own to read the limit on
            sink.open()
        text = str(none_open.value)
        assert _where(small_pg) in text and "limit: max_connections" in text and "too many clients" in text, text
        held.pop().close()  # room for one: the autocommit connection opens; the two-phase one is refused below

        def opened() -> bool:  # a closed connection's slot frees when its backend has exited
            try:
                sink.open()
                return True
            except RetryableError:
                return False

        wait_until(opened, 20, "the sink's autocommit connection to open", interval=0.2)
        txn = f"{unique}.w.1.1"
        with pytest.raises(RetryableError) as full:
            prepare(sink, txn, records(f"{unique}_t", [{"id": i} for i in range(5)]))
        text = str(full.value)  # the limit's value when an idle connection could read it
        assert "limit: max_connections" in text and _where(small_pg) in text and "too many clients" in text, text
        sink.abort(txn)  # what the engine does with a cycle whose prepare failed
        assert sink._tx is None and sink._ac is None, "an aborted cycle kept a lease"
        held.pop().close()

        def prepared() -> bool:
            try:
                prepare(sink, txn, records(f"{unique}_t", [{"id": i} for i in range(5)]))
                return True
            except RetryableError:
                sink.abort(txn)
                return False

        wait_until(prepared, 20, "the prepare to get its connection", interval=0.2)
        sink.commit(txn)
        assert sink.recover() == []
        while held:
            held.pop().close()
        with psycopg.connect(dsn) as c:
            assert c.execute(f'SELECT count(*), count(DISTINCT id) FROM "{unique}_t"').fetchone() == (5, 5)
    finally:
        sink.close()
        for c in held:
            c.close()


def _status(w: WorkerProcess, name: str) -> dict[str, Any]:
    """The connector's status as a REST client reads it; {} while the worker's REST API is not up yet."""
    try:
        with urllib.request.urlopen(f"{w.url}/connectors/{name}/status", timeout=5) as r:
            return dict(json.loads(r.read()))
    except OSError:
        return {}


def test_postgres_out_of_connections_is_retried_with_a_status_naming_the_database_and_the_limit(
        small_pg: PrivateStack, stack: Any, unique: str, make_topic: Any, tmp_path: Any) -> None:
    dsn = small_pg.endpoints().postgres_dsn
    topic = make_topic(PARTITIONS)
    # 5 connectors of one task on 2 workers; other clients hold all of the server's slots: nothing can
    # deliver (one free slot would let a cycle through now and then, prepared and committed over one
    # connection in turn, which clears its connector's retrying status).
    names = [f"{unique}_{i}".replace("_", "-") for i in range(5)]
    for name in names:
        register(stack.zookeeper_hosts, unique, name, {
            "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": name.replace("-", "_"), "commit.interval.ms": "250"})
    held = _fill(dsn)
    ends = type("Endpoints", (), {"kafka_bootstrap": stack.kafka_bootstrap, "zookeeper_hosts": stack.zookeeper_hosts,
                                  "postgres_dsn": dsn})()
    # Pools sized to the server, as the docs ask (workers x --postgres-pool-size within its free slots): a busy
    # worker keeps its pool's connections, so one sized past them could keep the other worker waiting.
    workers = [WorkerProcess(ends, unique, wid, tmp_path, rest_port=free_port(), extra_args=["--postgres-pool-size", "2"])
               for wid in ("w1", "w2")]
    publisher = Publisher(stack.kafka_bootstrap, topic, per_txn=50, pause=0.2)
    admin: psycopg.Connection[Any] | None = None
    try:
        publisher.start()
        seen: dict[str, str] = {}

        def starved() -> bool:
            for name in names:
                for w in workers:
                    for task in _status(w, name).get("tasks", []):
                        if "no connection slot left" in task.get("retrying", ""):
                            seen[name] = task["retrying"]
                            assert task["state"] != "FAILED", task
            return len(seen) == len(names)

        wait_until(starved, 120, "every connector's status to show it retrying for a connection slot", interval=1.0)
        text = next(iter(seen.values()))
        assert _where(small_pg) in text and "max_connections" in text and "(retrying for" in text, text
        admin = held.pop()  # the test's own; the other clients go, their slots are the workers'
        while held:
            held.pop().close()
        time.sleep(3)  # publishing goes on once there is room
        publisher.stop()
        committed, aborted = publisher.committed, publisher.aborted

        def count(name: str) -> int:
            assert admin is not None
            table = name.replace("-", "_")
            if not admin.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:  # type: ignore[index]
                return 0
            return int(admin.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])  # type: ignore[index]

        wait_until(lambda: all(count(n) >= len(committed) for n in names), 150,
                   f"every connector to deliver {len(committed)} records", interval=1.0)
        time.sleep(1.5)  # a few more commit intervals: anything extra would show now
        assert_every_id_once(admin, [n.replace("-", "_") for n in names], committed, aborted)
        assert admin.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == [], "a prepared transaction left"
        wait_until(lambda: not any(t.get("retrying") for w in workers for n in names for t in _status(w, n).get("tasks", [])),
                   30, "the retrying status to clear once connections are free")
        for w in workers:
            assert '"task_failed"' not in w.log_path.read_text(errors="replace"), f"a task failed: see {w.log_path}"
        print(f"OUT-OF-CONNECTIONS {len(seen)} of {len(names)} connectors retried; e.g. {text[:300]}")
    finally:
        publisher.stopping.set()
        for w in workers:
            w.stop()
        for c in held:
            c.close()
        if admin is not None:
            admin.close()
