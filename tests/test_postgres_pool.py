"""The worker's PostgreSQL pool against the stack's real PostgreSQL: the properties the sinks rely on.

Each test makes a pool of its own (not the process-wide one) so the counts are its alone.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from eosink.connectors.api.errors import RetryableError
from eosink.connectors.postgres import pool as pgpool
from eosink.connectors.postgres.sink import PostgresSink
from eosink.worker import metrics
from tests.sinkkit import prepare, records


def _connector(dsn: str) -> Any:
    def connect(autocommit: bool) -> psycopg.Connection[Any]:
        return psycopg.connect(dsn, autocommit=autocommit)
    return connect


def test_a_holder_of_every_two_phase_connection_still_gets_an_autocommit_one(stack: Any) -> None:
    """Two-phase leases stop short of the size: a cycle holding one always gets the autocommit
    connection it needs to finish, even when every other two-phase connection is taken."""
    p = pgpool.Pool("test", 5)
    connect = _connector(stack.postgres_dsn)
    held = [p.lease(False, connect, "eosink/t") for _ in range(p.size - p.reserve)]
    try:
        assert p.lease(False, connect, "eosink/t", wait=False) is None, "a two-phase lease past size - reserve"
        ac = p.lease(True, connect, "eosink/t", wait=False)
        assert ac is not None, "no autocommit connection for a holder of a two-phase one"
        assert ac.execute("SELECT 1").fetchone() == (1,)
        p.release(ac, True)
    finally:
        for c in held:
            assert c is not None
            p.release(c, False)
        p.close_idle()
    assert p.stats()["open"] == 0


def test_a_lease_that_cannot_wait_is_refused_while_others_queue_and_waiters_are_served_in_order(stack: Any) -> None:
    p = pgpool.Pool("test", 2)  # one two-phase connection (reserve 1)
    connect = _connector(stack.postgres_dsn)
    first = p.lease(False, connect, "eosink/a")
    assert first is not None
    served: list[str] = []

    def waiter(name: str) -> None:
        c = p.lease(False, connect, f"eosink/{name}")
        assert c is not None
        served.append(name)
        time.sleep(0.05)
        p.release(c, False)

    threads = []
    for name in ("b", "c"):
        threads.append(threading.Thread(target=waiter, args=(name,)))
        threads[-1].start()
        time.sleep(0.2)  # b queues before c
    p.release(first, False)
    assert p.lease(False, connect, "eosink/d", wait=False) is None, "a lease that cannot wait jumped the queue"
    for t in threads:
        t.join(10)
    assert served == ["b", "c"], served
    p.close_idle()


def test_a_connection_killed_while_idle_is_replaced_at_its_next_lease(stack: Any, unique: str) -> None:
    p = pgpool.Pool("test", 3)
    connect = _connector(stack.postgres_dsn)
    c = p.lease(True, connect, f"eosink/{unique}")
    assert c is not None
    pid = c.info.backend_pid
    p.release(c, True)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    time.sleep(0.2)
    again = p.lease(True, connect, f"eosink/{unique}-other")  # the name changes: the dead one is found at once
    assert again is not None and again.info.backend_pid != pid
    assert again.execute("SELECT current_setting('application_name')").fetchone() == (f"eosink/{unique}-other",)
    p.release(again, True)
    p.close_idle()


def test_a_full_pool_makes_a_waiting_lease_retryable_naming_the_database_and_the_size(
        stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgpool, "LEASE_TIMEOUT_S", 0.5)
    p = pgpool.Pool("db.example:5432/app", 2)
    connect = _connector(stack.postgres_dsn)
    held = p.lease(False, connect, "eosink/t")
    try:
        with pytest.raises(RetryableError) as waited:
            p.lease(False, connect, "eosink/t")
        text = str(waited.value)
        assert "db.example:5432/app" in text and "all 2 connections" in text and "--postgres-pool-size" in text, text
    finally:
        assert held is not None
        p.release(held, False)
        p.close_idle()


def test_many_sinks_of_one_worker_share_its_pool_and_deliver_exactly_once(
        stack: Any, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve sinks on twelve threads through a pool of 4 connections: each writes its batches once."""
    monkeypatch.setattr(pgpool, "_POOLS", {})
    monkeypatch.setattr(pgpool, "_size", 4)
    sinks = [PostgresSink(f"{unique}_{i}", {"connection.url": stack.postgres_dsn, "auto.create": True,
                                            "lock.timeout.ms": 30000}) for i in range(12)]
    failures: list[BaseException] = []

    def run(sink: PostgresSink) -> None:
        try:
            sink.open()
            for cycle in range(5):
                txn = f"{sink.connector}.w.1.{cycle}"
                prepare(sink, txn, records(f"{sink.connector}_t", [{"id": cycle * 10 + i} for i in range(10)], start=cycle * 10))
                sink.commit(txn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            sink.close()

    threads = [threading.Thread(target=run, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    [shared] = pgpool._POOLS.values()
    assert shared.stats()["open"] <= 4
    with psycopg.connect(stack.postgres_dsn) as c:
        for s in sinks:
            table = f"{s.connector}_t"
            assert c.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"').fetchone() == (50, 50), table
        assert c.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{unique}%",)).fetchone() == (0,)
    families = {f.name: f for f in metrics.LIVE.collect()}
    assert [(s.labels["database"], s.value) for s in families["eosink_postgres_pool_size"].samples] == [(shared.where, 4)]
    states = {s.labels["state"]: s.value for s in families["eosink_postgres_pool_connections"].samples}
    assert states["autocommit"] == states["transaction"] == 0 and 0 < states["idle"] <= 4, states
    shared.close_idle()


def test_connections_idle_past_the_timeout_are_closed_and_their_slots_given_back(stack: Any, unique: str) -> None:
    p = pgpool.Pool("test", 4)
    connect = _connector(stack.postgres_dsn)
    leased = [p.lease(True, connect, f"eosink/{unique}") for _ in range(3)]
    for c in leased:
        assert c is not None
        p.release(c, True)
    fresh = p.lease(True, connect, f"eosink/{unique}")  # the newest idle one: it stays in use
    assert fresh is not None
    time.sleep(0.3)
    assert p.reap(0.2) == 2, p.stats()
    p.release(fresh, True)
    assert p.reap(0.2) == 0, "a connection released just now was closed"
    with psycopg.connect(stack.postgres_dsn) as admin:
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"eosink/{unique}",)).fetchone()
        assert row == (1,), row
    p.close_idle()
