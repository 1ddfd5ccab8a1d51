"""A PostgreSQL that is full (SQLSTATE 53300): retried with a status naming the database and the limit.

A private PostgreSQL with ``max_connections = 8`` (the shared stack's is never touched): first one
sink meets it full, then real workers run more connectors than it can serve while a producer
publishes. The connectors it cannot serve show in ``GET /connectors/<name>/status`` as retrying,
naming ``host:port/dbname`` and ``max_connections``; once the limit is raised (and that PostgreSQL
restarted) every connector delivers every committed id exactly once, and no prepared transaction
is left.
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
from tests.procs import WorkerProcess, free_port, register, wait_until

LIMIT = 8


def _restart(pg: PrivateStack) -> None:
    component = pg.component("postgres")
    argv = [str(component._bindir() / "pg_ctl"), "-D", str(component.pgdata), "-m", "fast", "-w", "stop"]
    assert component._run(argv) == 0, f"pg_ctl stop failed; see {component.log_path}"
    pg.restart("postgres")


@pytest.fixture(scope="module")
def small_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    """A private PostgreSQL restarted with max_connections = LIMIT."""
    with pytest.MonkeyPatch.context() as mp:
        pg = PrivateStack(tmp_path_factory.mktemp("pg") / "home", mp, postgres=True).start()
        try:
            with psycopg.connect(pg.endpoints().postgres_dsn, autocommit=True) as c:
                c.execute(f"ALTER SYSTEM SET max_connections = {LIMIT}")
            _restart(pg)
            yield pg
        finally:
            pg.stop()


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
    sink = PostgresSink(unique, {"connection.url": dsn})
    try:
        with pytest.raises(RetryableError) as none_open:  # no connection of its own to read the limit on
            sink.open()
        text = str(none_open.value)
        assert _where(small_pg) in text and "limit: max_connections" in text and "too many clients" in text, text
        held.pop().close()  # room for one: the autocommit connection opens, the two-phase one is refused
        refusals: list[str] = []

        def refused_with_one_open() -> bool:  # a closed connection's slot frees when its backend has exited
            with pytest.raises(RetryableError) as one_open:
                sink.open()
            refusals.append(str(one_open.value))
            return f"max_connections={LIMIT} " in refusals[-1]

        wait_until(refused_with_one_open, 20, "the sink's autocommit connection to open", interval=0.2)
        assert _where(small_pg) in refusals[-1] and "too many clients" in refusals[-1], refusals[-1]
        assert sink._ac is None, "a sink waiting for its second connection kept the first"
        held.pop().close()
        held.pop().close()

        def opened() -> bool:
            try:
                sink.open()  # both now
                return True
            except RetryableError:
                return False

        wait_until(opened, 20, "both connections to open", interval=0.2)
        assert sink.recover() == []
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
    # 5 connectors of one task (2 connections each) on 2 workers, against 8 slots, one of them the test's.
    names = [f"{unique}_{i}".replace("_", "-") for i in range(5)]
    for name in names:
        register(stack.zookeeper_hosts, unique, name, {
            "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": name.replace("-", "_"), "commit.interval.ms": "250"})
    admin = psycopg.connect(dsn, autocommit=True)
    ends = type("Endpoints", (), {"kafka_bootstrap": stack.kafka_bootstrap, "zookeeper_hosts": stack.zookeeper_hosts,
                                  "postgres_dsn": dsn})()
    workers = [WorkerProcess(ends, unique, wid, tmp_path, rest_port=free_port()) for wid in ("w1", "w2")]
    publisher = Publisher(stack.kafka_bootstrap, topic, per_txn=50, pause=0.2)
    try:
        publisher.start()
        seen: dict[str, str] = {}

        def starved() -> bool:
            for name in names:
                for task in _status(workers[0], name).get("tasks", []):
                    if "no connection slot left" in task.get("retrying", ""):
                        seen[name] = task["retrying"]
                        assert task["state"] != "FAILED", task
            return bool(seen)

        def count(name: str) -> int:
            table = name.replace("-", "_")
            if not admin.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:  # type: ignore[index]
                return 0
            return int(admin.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])  # type: ignore[index]

        wait_until(starved, 120, "a connector's status to show it retrying for a connection slot", interval=1.0)
        text = next(iter(seen.values()))
        assert _where(small_pg) in text and "max_connections" in text and "(retrying for" in text, text
        # The connectors that have their connections deliver meanwhile; the starved ones keep retrying.
        wait_until(lambda: any(count(n) > 0 for n in names), 60, "the connectors served to deliver", interval=1.0)
        seen.clear()
        wait_until(starved, 30, "the starved connectors to be still retrying", interval=1.0)
        admin.execute("ALTER SYSTEM SET max_connections = 40")
        admin.close()
        _restart(small_pg)
        time.sleep(3)  # publishing goes on after the limit is raised
        publisher.stop()
        committed, aborted = publisher.committed, publisher.aborted
        admin = psycopg.connect(dsn, autocommit=True)
        wait_until(lambda: all(count(n) >= len(committed) for n in names), 150,
                   f"every connector to deliver {len(committed)} records", interval=1.0)
        time.sleep(1.5)  # a few more commit intervals: anything extra would show now
        for name in names:
            ids = [r[0] for r in admin.execute(f'SELECT id FROM "{name.replace("-", "_")}"')]
            assert len(ids) == len(set(ids)), f"{name}: {len(ids) - len(set(ids))} duplicates"
            assert set(ids) == committed, f"{name}: missing {len(committed - set(ids))}, from aborted {len(set(ids) & aborted)}"
        assert admin.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == [], "a prepared transaction left"
        wait_until(lambda: not any(t.get("retrying") for n in names for t in _status(workers[0], n).get("tasks", [])),
                   30, "the retrying status to clear once connections are free")
        print(f"OUT-OF-CONNECTIONS {len(seen)} of {len(names)} connectors retried; e.g. {text[:300]}")
    finally:
        publisher.stopping.set()
        for w in workers:
            w.stop()
        admin.close()
