"""The PostgreSQL sink against the stack's real PostgreSQL (``stack``/``pg``/``unique`` fixtures).

Every test uses names derived from ``unique`` (connector, topics, tables) and its teardown rolls
back any transaction its connectors left prepared, so tests never leak locks or GIDs into each
other. A "crash" is a sink closed (or simply dropped) between prepare and commit: its prepared
transaction survives on the server exactly as after a killed worker.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eosink.connectors.api.errors import ConfigError, FatalError, FencedError, RecordError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.postgres.sink import PostgresSink
from eosink.worker.stack import Endpoints
from eosink.worker.stack.proc import free_port
from tests.sinkkit import manifest_for as manifest
from tests.sinkkit import prepare, records

MakeSink = Callable[..., PostgresSink]
PG = psycopg.Connection[Any]


# -- helpers ------------------------------------------------------------------------------------
def cycle(sink: PostgresSink, txn: str, recs: Sequence[SinkRecord], epoch: int = 1) -> None:
    prepare(sink, txn, recs, epoch)
    sink.commit(txn)


def rows(pg: psycopg.Connection[Any], table: str, cols: str = "*", order: str = "__offset") -> list[tuple[Any, ...]]:
    return pg.execute(
        sql.SQL("SELECT {} FROM {} ORDER BY {}").format(sql.SQL(cols), sql.Identifier(table), sql.SQL(order))  # test-only constants
    ).fetchall()


def count(pg: psycopg.Connection[Any], table: str) -> int:
    row = pg.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def scalar(pg: PG, query: str, *params: Any) -> Any:
    row = pg.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def table_exists(pg: psycopg.Connection[Any], table: str) -> bool:
    row = pg.execute("SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(table).as_string(pg),)).fetchone()
    return bool(row and row[0])


def prepared_gids(pg: psycopg.Connection[Any], prefix: str) -> list[str]:
    return sorted(x.gtrid for x in pg.tpc_recover() if x.gtrid.startswith(f"eosink:{prefix}"))


def manifests_of(pg: psycopg.Connection[Any], connector: str) -> list[str]:
    return [r[0] for r in pg.execute("SELECT txn_id FROM eosink_txn_manifest WHERE connector = %s ORDER BY 1", (connector,))]


def column_types(pg: psycopg.Connection[Any], table: str) -> dict[str, str]:
    return dict(pg.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s", (table,)
    ).fetchall())


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture
def topic(unique: str) -> str:
    return f"{unique}.orders"


@pytest.fixture
def table(unique: str) -> str:
    return f"{unique}_orders"


@pytest.fixture
def make_sink(stack: Endpoints, unique: str) -> Iterator[MakeSink]:
    """``make_sink(config=None, connector=unique)``: an opened sink; everything it left is undone."""
    made: list[PostgresSink] = []

    def make(config: dict[str, Any] | None = None, connector: str | None = None, open_: bool = True) -> PostgresSink:
        sink = PostgresSink(connector or unique, {"connection.url": stack.postgres_dsn, **(config or {})})
        if open_:
            sink.open()
        made.append(sink)
        return sink

    yield make
    for s in made:
        s.close()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:  # not `pg`: a restart test kills it
        _undo(conn, unique)


def _undo(pg: psycopg.Connection[Any], unique: str) -> None:
    for x in pg.tpc_recover():
        if x.gtrid.startswith(f"eosink:{unique}"):
            try:
                pg.tpc_rollback(x)
            except psycopg.Error:
                pass
    for (name,) in pg.execute("SELECT tablename FROM pg_tables WHERE starts_with(tablename, %s)", (unique,)).fetchall():
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    pg.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{unique}_s")))
    for t in ("eosink_offsets", "eosink_committed_txns", "eosink_txn_manifest"):
        pg.execute(sql.SQL("DELETE FROM {} WHERE starts_with(connector, %s)").format(sql.Identifier(t)), (unique,))


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i}", "amount": 10.5 + i, "paid": i % 2 == 0, "items": [{"sku": "x", "n": i}], **extra}


# -- two-phase commit ---------------------------------------------------------------------------
def test_rows_invisible_until_commit_prepared(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    recs = records(topic, [order(i) for i in range(5)], partition=2, start=100)
    prepare(sink, f"{unique}.w1.1.1", recs, epoch=3)

    assert count(pg, table) == 0, "rows of a prepared transaction must be invisible"
    assert prepared_gids(pg, unique) == [f"eosink:{unique}.w1.1.1"]
    assert sink.read_offsets() == {}, "offsets are written inside the prepared transaction"
    assert manifests_of(pg, unique) == [f"{unique}.w1.1.1"], "recovery needs the manifest while prepared"

    sink.commit(f"{unique}.w1.1.1")
    got = rows(pg, table, "id, customer, amount, paid, items, __topic, __partition, __offset")
    assert got == [(i, f"c{i}", 10.5 + i, i % 2 == 0, [{"sku": "x", "n": i}], topic, 2, 100 + i) for i in range(5)]
    assert prepared_gids(pg, unique) == []
    assert manifests_of(pg, unique) == [], "COMMIT PREPARED deletes the manifest atomically"
    assert sink.read_offsets() == {TopicPartition(topic, 2): (3, 105)}
    assert scalar(pg, "SELECT count(*) FROM eosink_committed_txns WHERE txn_id = %s", f"{unique}.w1.1.1") == 1


def test_second_commit_prepared_decides_from_committed_txns_table(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(1)]))
    sink.commit(f"{unique}.w1.1.1")  # 42704 + proof of commit present: a replay, ok
    make_sink().commit(f"{unique}.w1.1.1")  # also from a fresh instance
    assert count(pg, table) == 1

    # The GID disappears the same way when someone rolls the transaction back: 42704 again,
    # but no proof of commit -> the decided txn is lost, which must stop the worker.
    prepare(sink, f"{unique}.w1.1.2", records(topic, [order(2)], start=1))
    pg.tpc_rollback(psycopg.Xid.from_string(f"eosink:{unique}.w1.1.2"))
    with pytest.raises(FatalError, match=rf"decided txn {unique}\.w1\.1\.2 is gone.*rolled back by someone.*operator must check"):
        sink.commit(f"{unique}.w1.1.2")
    assert count(pg, table) == 1


def test_abort_twice_and_abort_unknown_are_ok_and_discard_everything(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    prepare(sink, f"{unique}.w1.1.1", records(topic, [order(i) for i in range(3)]))
    sink.abort(f"{unique}.w1.1.1")
    sink.abort(f"{unique}.w1.1.1")
    sink.abort(f"{unique}.w1.9.9")  # never seen
    assert count(pg, table) == 0
    assert prepared_gids(pg, unique) == []
    assert manifests_of(pg, unique) == []
    assert sink.read_offsets() == {}
    # the partition is not poisoned: the next cycle commits
    cycle(sink, f"{unique}.w1.1.2", records(topic, [order(i) for i in range(3)]))
    assert count(pg, table) == 3


def test_abort_of_staged_unprepared_txn_drops_the_batch(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    sink.begin_transaction(f"{unique}.w1.1.2")
    sink.write(records(topic, [order(1)], start=1))
    sink.abort(f"{unique}.w1.1.2")
    sink.pre_commit(manifest(f"{unique}.w1.1.2", unique, []))  # the aborted batch must not come back
    sink.commit(f"{unique}.w1.1.2")
    assert count(pg, table) == 1


def test_prepare_is_idempotent_for_prepared_and_committed_txns(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    recs = records(topic, [order(i) for i in range(4)])
    prepare(sink, f"{unique}.w1.1.1", recs)
    prepare(sink, f"{unique}.w1.1.1", recs)  # already prepared: no second PREPARE (would be 42710)
    sink.commit(f"{unique}.w1.1.1")
    prepare(sink, f"{unique}.w1.1.1", recs)  # already committed: no duplicate rows
    sink.commit(f"{unique}.w1.1.1")
    assert count(pg, table) == 4
    assert manifests_of(pg, unique) == []


def test_empty_cycle_commits_and_commits_again(make_sink: MakeSink, pg: PG, unique: str) -> None:
    sink = make_sink()
    sink.begin_transaction(f"{unique}.w1.1.1")
    sink.pre_commit(TxnManifest(f"{unique}.w1.1.1", unique))
    sink.commit(f"{unique}.w1.1.1")
    sink.commit(f"{unique}.w1.1.1")
    assert prepared_gids(pg, unique) == []


def test_second_postgres_sink_of_a_connector_on_the_same_server_is_refused_not_skipped(
    make_sink: MakeSink, pg: PG, topic: str, unique: str
) -> None:
    # a fanout with two postgres sinks into one database: both would prepare GID eosink:<txn>
    orders = make_sink({"table.name.format": "${topic}"})
    audit = make_sink({"table.name.format": "${topic}_audit"})
    recs = records(topic, [order(0)])
    m = manifest(f"{unique}.w1.1.1", unique, recs)
    for sink in (orders, audit):
        sink.begin_transaction(m.txn_id)
        sink.write(recs)
    orders.pre_commit(m)
    with pytest.raises(ConfigError, match="only one postgres sink per PostgreSQL server"):
        audit.pre_commit(m)
    orders.pre_commit(m)  # the same sink replaying its prepare is still a no-op
    orders.abort(m.txn_id)
    assert prepared_gids(pg, unique) == []


def test_second_postgres_sink_of_a_connector_in_another_database_of_the_server_is_refused(
    make_sink: MakeSink, pg: PG, stack: Endpoints, topic: str, unique: str
) -> None:
    other_db = f"{unique}_db2"
    pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other_db)))
    try:
        url = conninfo_to_dict(stack.postgres_dsn)
        first = make_sink()
        second = make_sink({"connection.url": make_conninfo("", **{**url, "dbname": other_db})})
        recs = records(topic, [order(0)])
        prepare(first, f"{unique}.w1.1.1", recs)
        with pytest.raises(ConfigError, match="only one postgres sink per PostgreSQL server"):
            prepare(second, f"{unique}.w1.1.1", recs)  # GIDs are per server: PREPARE says 42710
        first.commit(f"{unique}.w1.1.1")
        second.close()
    finally:
        pg.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(other_db)))


# -- rows streamed into the open transaction ---------------------------------------------------
def prepare_in_slices(sink: PostgresSink, txn: str, recs: Sequence[SinkRecord], size: int, epoch: int = 1) -> TxnManifest:
    """What a cycle does when the engine hands the sinks its batch while still reading it."""
    m = manifest(txn, sink.connector, recs, epoch)
    sink.begin_transaction(txn)
    for i in range(0, len(recs), size):
        sink.write(recs[i:i + size])
    sink.pre_commit(m)
    return m


def test_slices_stream_into_one_invisible_transaction(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    recs = records(topic, [order(i) for i in range(1, 31)], start=1)
    txn = f"{unique}.w1.1.2"
    sink.begin_transaction(txn)
    sink.write(recs[:10])
    sink.write(recs[10:20])
    writing = scalar(pg, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                         " WHERE c.relname = %s AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()", table)
    assert writing == 1, "the slices are being copied before the prepare"
    assert count(pg, table) == 1, "streamed rows are invisible before the commit"
    sink.write(recs[20:])
    sink.pre_commit(manifest(txn, sink.connector, recs))
    assert prepared_gids(pg, unique) == [f"eosink:{txn}"] and count(pg, table) == 1
    sink.commit(txn)
    assert [r[0] for r in rows(pg, table, "id")] == list(range(31))
    assert sink.read_offsets() == {TopicPartition(topic, 0): (1, 31)}


def test_a_slice_streaming_cannot_take_is_written_at_prepare_once(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    """A new field in a later slice: the stream is given up, the column added, the whole batch
    written at prepare - each row once."""
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    recs = records(topic, [order(i) for i in range(1, 5)] + [order(5, note="new")] + [order(i) for i in range(6, 9)], start=1)
    cycle_txn = f"{unique}.w1.1.2"
    prepare_in_slices(sink, cycle_txn, recs, 3)
    sink.commit(cycle_txn)
    assert rows(pg, table, "id, note", order="id") == [(i, "new" if i == 5 else None) for i in range(9)]


def test_a_bad_value_in_a_streamed_slice_names_the_record_and_leaves_nothing(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    recs = records(topic, [order(i) for i in range(1, 7)] + [order(7, amount="x")], start=1)
    with pytest.raises(RecordError) as err:
        prepare_in_slices(sink, f"{unique}.w1.1.2", recs, 3)
    assert (err.value.offset, err.value.column) == (7, "amount")
    sink.abort(f"{unique}.w1.1.2")
    assert count(pg, table) == 1 and prepared_gids(pg, unique) == [] and manifests_of(pg, unique) == []
    cycle(sink, f"{unique}.w1.1.3", records(topic, [order(1)], start=1))  # the connection is fine afterwards
    assert count(pg, table) == 2


def test_abort_while_streaming_discards_the_rows(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    sink.begin_transaction(f"{unique}.w1.1.2")
    sink.write(records(topic, [order(i) for i in range(1, 6)], start=1))
    sink.abort(f"{unique}.w1.1.2")
    assert count(pg, table) == 1 and prepared_gids(pg, unique) == []
    cycle(sink, f"{unique}.w1.1.3", records(topic, [order(1)], start=1))
    assert [r[0] for r in rows(pg, table, "id")] == [0, 1]


def test_streamed_rows_lost_with_their_connection_are_written_again_at_prepare(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    """The server drops the open transaction with its connection: the prepare writes the batch on
    a new one instead of preparing a transaction without its rows."""
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    recs = records(topic, [order(i) for i in range(1, 11)], start=1)
    txn = f"{unique}.w1.1.2"
    m = manifest(txn, sink.connector, recs)
    sink.begin_transaction(txn)
    sink.write(recs[:5])
    sink.write(recs[5:])
    pid = scalar(pg, "SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                     " WHERE c.relname = %s AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()", table)
    assert scalar(pg, "SELECT pg_terminate_backend(%s)", pid)
    sink.pre_commit(m)
    sink.commit(txn)
    assert [r[0] for r in rows(pg, table, "id")] == list(range(11))
    assert prepared_gids(pg, unique) == []


def test_a_streamed_zombie_is_fenced_at_prepare(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    owner, zombie = make_sink(), make_sink()
    cycle(owner, f"{unique}.w2.2.1", records(topic, [order(i) for i in range(3)]), epoch=2)
    with pytest.raises(FencedError):
        prepare_in_slices(zombie, f"{unique}.w1.1.7", records(topic, [order(i) for i in range(3, 9)], start=3), 2, epoch=1)
    assert count(pg, table) == 3 and prepared_gids(pg, unique) == [] and manifests_of(pg, unique) == []


# -- fencing ------------------------------------------------------------------------------------
def test_stale_epoch_prepare_is_fenced(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    owner, zombie = make_sink(), make_sink()
    cycle(owner, f"{unique}.w2.2.1", records(topic, [order(i) for i in range(3)]), epoch=2)
    with pytest.raises(FencedError, match=rf"{topic}-0 \(epoch 1 < 2\)"):
        prepare(zombie, f"{unique}.w1.1.7", records(topic, [order(i) for i in range(3, 6)], start=3), epoch=1)
    assert count(pg, table) == 3
    assert prepared_gids(pg, unique) == []
    assert manifests_of(pg, unique) == []
    assert owner.read_offsets() == {TopicPartition(topic, 0): (2, 3)}
    # the same epoch keeps working, and a newer one takes over
    cycle(owner, f"{unique}.w2.2.2", records(topic, [order(3)], start=3), epoch=2)
    cycle(zombie, f"{unique}.w3.3.1", records(topic, [order(4)], start=4), epoch=3)
    assert owner.read_offsets() == {TopicPartition(topic, 0): (3, 5)}


def test_zombie_prepare_waits_for_newer_prepared_epoch_then_is_fenced(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    owner, zombie = make_sink(), make_sink()
    cycle(zombie, f"{unique}.w1.1.1", records(topic, [order(0)]), epoch=1)
    prepare(owner, f"{unique}.w2.2.1", records(topic, [order(1)], start=1), epoch=2)  # prepared, undecided
    outcome: list[BaseException | None] = []

    def zombie_cycle() -> None:
        try:
            prepare(zombie, f"{unique}.w1.1.2", records(topic, [order(1)], start=1), epoch=1)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            outcome.append(exc)

    t = threading.Thread(target=zombie_cycle)
    t.start()
    deadline = time.monotonic() + 8
    while not scalar(pg, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                     f"eosink/{unique}"):
        assert time.monotonic() < deadline and not outcome, f"the zombie never waited on the partition row: {outcome}"
        time.sleep(0.02)
    assert outcome == [], "the zombie must wait on the partition row the newer epoch holds"
    owner.commit(f"{unique}.w2.2.1")
    t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], FencedError), outcome
    assert rows(pg, table, "id, __offset") == [(0, 0), (1, 1)]
    assert prepared_gids(pg, unique) == []


def test_lock_held_by_undecided_prepared_txn_times_out_as_retryable(
    make_sink: MakeSink, pg: PG, topic: str, unique: str
) -> None:
    stranded = make_sink()
    prepare(stranded, f"{unique}.w1.1.1", records(topic, [order(0)]), epoch=1)  # never decided: holds the partition row
    waiting = make_sink({"lock.timeout.ms": 300})
    started = time.monotonic()
    with pytest.raises(RetryableError, match="lock.timeout.ms=300.*pg_prepared_xacts"):
        prepare(waiting, f"{unique}.w1.1.2", records(topic, [order(1)], start=1), epoch=1)
    assert time.monotonic() - started < 5
    assert prepared_gids(pg, unique) == [f"eosink:{unique}.w1.1.1"], "the waiting txn left nothing prepared"
    stranded.abort(f"{unique}.w1.1.1")
    prepare(waiting, f"{unique}.w1.1.2", records(topic, [order(1)], start=1), epoch=1)  # the next retry goes through


# -- recovery -----------------------------------------------------------------------------------
def test_recover_lists_exactly_prepared_txns_after_crash(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    crashed = make_sink()
    other = make_sink(connector=f"{unique}_other")
    cycle(crashed, f"{unique}.w1.1.1", records(topic, [order(0)]), epoch=4)
    m2 = prepare(crashed, f"{unique}.w1.1.2", records(topic, [order(1), order(2)], start=1), epoch=4)
    m3 = prepare(crashed, f"{unique}.w1.1.3", records(topic, [order(3)], partition=1, start=0), epoch=5)
    prepare(crashed, f"{unique}.w1.1.4", records(topic, [order(4)], partition=2), epoch=5)
    crashed.abort(f"{unique}.w1.1.4")
    prepare(other, f"{unique}_other.w1.1.1", records(f"{unique}.other", [order(9)]))
    crashed.close()  # the crash: prepared transactions outlive the session

    fresh = make_sink()
    found = fresh.recover()
    assert found == [m2, m3], "exactly the prepared txns of this connector, with ranges and epochs"
    fresh.recover_and_commit(found[0])
    fresh.recover_and_abort(found[1])
    assert fresh.recover() == []
    assert rows(pg, table, "id") == [(0,), (1,), (2,)]
    assert fresh.read_offsets() == {TopicPartition(topic, 0): (4, 3)}
    assert [m.txn_id for m in other.recover()] == [f"{unique}_other.w1.1.1"]


def test_recover_reports_prepared_gid_without_manifest_with_no_ranges(
    make_sink: MakeSink, pg: PG, stack: Endpoints, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    sink = make_sink()
    conn = psycopg.connect(stack.postgres_dsn)  # a GID of ours that no manifest describes
    conn.tpc_begin(f"eosink:{unique}.w7.7.7")
    conn.execute("SELECT 1")
    conn.tpc_prepare()
    conn.close()  # not `with`: its exit would commit(), which psycopg refuses after tpc_prepare()
    with caplog.at_level(logging.WARNING, logger="eosink.connectors.postgres.sink"):
        found = sink.recover()
    assert found == [TxnManifest(f"{unique}.w7.7.7", unique, ())]
    assert f"eosink:{unique}.w7.7.7 has no manifest" in caplog.text
    sink.recover_and_abort(found[0])
    assert sink.recover() == []


def test_commit_after_crash_between_prepare_and_commit_via_fresh_instance(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    crashed = make_sink()
    prepare(crashed, f"{unique}.w1.1.1", records(topic, [order(i) for i in range(3)]))
    del crashed  # not even closed: its connections linger, the prepared txn is detached from them
    fresh = make_sink()
    fresh.commit(f"{unique}.w1.1.1")
    fresh.commit(f"{unique}.w1.1.1")
    assert count(pg, table) == 3
    assert fresh.recover() == []


def test_connections_killed_between_cycles_reconnect_without_losing_a_cycle(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    killed = scalar(pg, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", f"eosink/{unique}")
    assert killed == 2
    cycle(sink, f"{unique}.w1.1.2", records(topic, [order(1)], start=1))
    assert count(pg, table) == 2


@pytest.mark.chaos
def test_postgres_restart_between_prepare_and_commit(
    make_sink: MakeSink, pg: PG, stack: Endpoints, topic: str, table: str, unique: str
) -> None:
    from eosink.worker.stack import start_component, stop_component

    sink = make_sink()
    prepare(sink, f"{unique}.w1.1.1", records(topic, [order(i) for i in range(3)]))
    stop_component("postgres")
    try:
        with pytest.raises(RetryableError):
            sink.commit(f"{unique}.w1.1.1")
    finally:
        start_component("postgres")
    sink.commit(f"{unique}.w1.1.1")  # the prepared transaction survived the restart
    sink.commit(f"{unique}.w1.1.1")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        assert count(conn, table) == 3
        assert prepared_gids(conn, unique) == []
    cycle(sink, f"{unique}.w1.1.2", records(topic, [order(3)], start=3))


# -- bad input ----------------------------------------------------------------------------------
def test_wrong_type_names_topic_partition_offset_and_column(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)], partition=3))  # amount: double precision
    bad = records(topic, [order(1), order(2), order(3, amount="12,50"), order(4)], partition=3, start=5)
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.2", bad)
    e = err.value
    assert (e.topic, e.partition, e.offset, e.column) == (topic, 3, 7, "amount")
    assert "str" in str(e) and "double precision" in str(e)
    assert count(pg, table) == 1, "nothing of the batch may become visible"
    assert prepared_gids(pg, unique) == [] and manifests_of(pg, unique) == []
    sink.abort(f"{unique}.w1.1.2")


@pytest.mark.parametrize(("field", "bad"), [("id", True), ("paid", 1), ("amount", False), ("customer", 7), ("customer", {"a": 1})])
def test_json_types_are_not_coerced_into_columns(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, field: str, bad: Any
) -> None:
    """psycopg's binary dumpers would take true as 1 for a bigint, or 1 as true for a boolean."""
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    with pytest.raises(RecordError, match="does not fit column") as err:
        prepare(sink, f"{unique}.w1.1.2", records(topic, [order(1), order(2, **{field: bad})], start=1))
    assert (err.value.offset, err.value.column) == (2, field)
    assert count(pg, table) == 1


@pytest.mark.parametrize(
    ("ddl", "value", "column"),
    [
        ("ts timestamptz", {"ts": "not a date"}, "ts"),  # text COPY; the server parses the text
        ("small integer", {"small": 2**40}, "small"),  # int4 range checked by the server
        ("code varchar(3)", {"code": "ABCD"}, "code"),
        ("doc jsonb", {"doc": float("nan")}, "doc"),  # NaN is not JSON
        ("name text NOT NULL", {"name": None}, "name"),
    ],
)
def test_value_refused_by_postgres_is_named_by_copy_line(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, ddl: str, value: Any, column: str
) -> None:
    base = ddl.split()[0]
    good = {"ts": "2024-01-01T00:00:00Z", "small": 1, "code": "ABC", "doc": {"a": 1}, "name": "n"}[base]
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint, {})").format(sql.Identifier(table), sql.SQL(ddl)))  # test constant
    sink = make_sink()
    recs = records(topic, [{"id": i, base: good} for i in range(5)] + [{"id": 5, **value}] + [{"id": 6, base: good}], start=40)
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.1", recs)
    assert (err.value.offset, err.value.column) == (45, column), str(err.value)
    assert count(pg, table) == 0
    assert prepared_gids(pg, unique) == []


def test_bigint_overflow_refused_client_side_in_binary_copy(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.1", records(topic, [order(0), order(1, id=2**70)]))
    assert (err.value.offset, err.value.column) == (1, "id")
    assert count(pg, table) == 0


def test_constraint_violation_without_line_is_found_by_bisection(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    # upsert: the staging COPY accepts the row, the INSERT ... ON CONFLICT refuses it (no line)
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, amount double precision CHECK (amount >= 0))")
               .format(sql.Identifier(table)))
    sink = make_sink({"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"})
    vals = [{"id": i, "amount": float(i)} for i in range(40)]
    vals[27] = {"id": 27, "amount": -1.0}
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.1", records(topic, vals, start=1000))
    assert err.value.offset == 1027 and "check constraint" in str(err.value), str(err.value)
    assert count(pg, table) == 0
    assert prepared_gids(pg, unique) == []


@pytest.mark.parametrize("value", [None, [1, 2], "text", 42])
def test_non_object_value_names_record(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, value: Any) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))
    with pytest.raises(RecordError, match="not a JSON object") as err:
        prepare(sink, f"{unique}.w1.1.2", records(topic, [order(1), value, order(3)], start=1))
    assert err.value.offset == 2
    assert count(pg, table) == 1


def test_multi_topic_batch_is_atomic_across_tables(make_sink: MakeSink, pg: PG, unique: str) -> None:
    sink = make_sink()
    a, b = f"{unique}.a", f"{unique}.b"
    recs = records(a, [order(0), order(1)]) + records(b, [order(0), order(1, paid="yes")])
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.1", recs)
    assert (err.value.topic, err.value.offset, err.value.column) == (b, 1, "paid")
    assert not table_exists(pg, f"{unique}_a") or count(pg, f"{unique}_a") == 0
    cycle(sink, f"{unique}.w1.1.2", records(a, [order(0), order(1)]) + records(b, [order(0)]))
    assert (count(pg, f"{unique}_a"), count(pg, f"{unique}_b")) == (2, 1)


def test_field_named_like_a_kafka_column_names_record(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    with pytest.raises(RecordError, match="collides with the Kafka coordinate columns") as err:
        prepare(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1}, {"id": 2, "__offset": 5}], start=3))
    assert (err.value.offset, err.value.column) == (4, "__offset")


# -- modes, schema ------------------------------------------------------------------------------
def test_column_altered_under_the_sink_is_reread_not_blamed_on_a_record(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [order(0)]))  # amount double precision: binary COPY
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN amount TYPE numeric(10,2)").format(sql.Identifier(table)))
    cycle(sink, f"{unique}.w1.1.2", records(topic, [order(1), order(2)], start=1))  # cached float8 would be refused
    assert rows(pg, table, "amount::text") == [("10.50",), ("11.50",), ("12.50",)]

def test_upsert_last_write_wins(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": ["id"]})
    batch1 = records(topic, [{"id": 1, "v": "a", "note": "keep"}, {"id": 2, "v": "b", "note": "x"}, {"id": 1, "v": "c", "note": "keep"}])
    # same key in two partitions: the higher offset wins even though it comes first in the batch
    batch1 += records(topic, [{"id": 3, "v": "p1@50", "note": "x"}], partition=1, start=50)
    batch1 += records(topic, [{"id": 3, "v": "p2@7", "note": "x"}], partition=2, start=7)
    cycle(sink, f"{unique}.w1.1.1", batch1)
    assert rows(pg, table, "id, v, note, __partition, __offset", "id") == [
        (1, "c", "keep", 0, 2), (2, "b", "x", 0, 1), (3, "p1@50", "x", 1, 50)
    ]
    cycle(sink, f"{unique}.w1.1.2", records(topic, [{"id": 1, "v": "d"}, {"id": 4, "v": "e", "note": "n"}], start=3))
    assert rows(pg, table, "id, v, note", "id") == [
        (1, "d", "keep"), (2, "b", "x"), (3, "p1@50", "x"), (4, "e", "n")
    ], "an absent field keeps the stored value on update"


def _stages(pg: PG, table: str) -> list[str]:
    """Staging tables of ``table`` any session can see (committed ones: none should ever be)."""
    rows = pg.execute(
        "SELECT relname FROM pg_class WHERE starts_with(relname, %s) AND strpos(relname, '__eosink_stage_') > 0", (table[:36],)
    ).fetchall()
    return [r[0] for r in rows]


def test_two_workers_upsert_concurrently_leave_no_staging_table(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    cfg = {"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"}
    a, b = make_sink(cfg), make_sink(cfg)
    cycle(a, f"{unique}.wa.1.0", records(topic, [{"id": 0, "v": "seed"}], partition=9))  # creates the table
    prepare(a, f"{unique}.wa.1.1", records(topic, [{"id": i, "v": "a"} for i in range(1, 50)], partition=0))
    prepare(b, f"{unique}.wb.1.1", records(topic, [{"id": i, "v": "b"} for i in range(50, 100)], partition=1))
    assert count(pg, table) == 1, "both batches sit prepared, invisible"
    assert _stages(pg, table) == [], "a prepared transaction's stage is created and dropped inside it"
    b.commit(f"{unique}.wb.1.1")
    a.abort(f"{unique}.wa.1.1")
    per_writer = pg.execute(sql.SQL("SELECT v, count(*) FROM {} GROUP BY v ORDER BY v").format(sql.Identifier(table))).fetchall()
    assert per_writer == [("b", 50), ("seed", 1)]
    assert _stages(pg, table) == [], "neither a commit nor an abort leaves a staging table"


def test_upsert_missing_pk_field_names_record(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "tenant,id"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"tenant": "t", "id": 1, "v": 1}]))
    with pytest.raises(RecordError, match="primary key field 'id' is missing") as err:
        prepare(sink, f"{unique}.w1.1.2", records(topic, [{"tenant": "t", "id": 2, "v": 2}, {"tenant": "t", "v": 3}], partition=5, start=9))
    assert (err.value.topic, err.value.partition, err.value.offset, err.value.column) == (topic, 5, 10, "id")
    with pytest.raises(RecordError, match="primary key field 'tenant' is null"):
        prepare(sink, f"{unique}.w1.1.3", records(topic, [{"tenant": None, "id": 2}]))
    assert count(pg, table) == 1


def test_upsert_record_key_json_object_and_scalar_keys(make_sink: MakeSink, pg: PG, unique: str) -> None:
    obj = make_sink({"insert.mode": "upsert", "pk.mode": "record_key"}, connector=f"{unique}_o")
    t1 = f"{unique}.objkey"
    cycle(obj, f"{unique}_o.w.1.1", records(t1, [{"v": 1}, {"v": 2}, {"v": 3}], keys=[b'{"k": "a"}', b'{"k": "b"}', b'{"k": "a"}']))
    assert rows(pg, f"{unique}_objkey", "k, v", "k") == [("a", 3), ("b", 2)]
    # a key that is not a JSON object fills one column: pk.fields[0] (plain text here, not JSON)
    scalar = make_sink({"insert.mode": "upsert", "pk.mode": "record_key", "pk.fields": "order_id"}, connector=f"{unique}_s")
    t2 = f"{unique}.scalarkey"
    cycle(scalar, f"{unique}_s.w.1.1", records(t2, [{"v": 1}, {"v": 2}, {"v": 3}], keys=[b"order-17", b"order-9", b"order-17"]))
    assert rows(pg, f"{unique}_scalarkey", "order_id, v", "order_id") == [("order-17", 3), ("order-9", 2)]
    assert column_types(pg, f"{unique}_scalarkey")["order_id"] == "text"
    with pytest.raises(RecordError, match="Kafka key is null") as err:
        prepare(scalar, f"{unique}_s.w.1.2", records(t2, [{"v": 4}], start=3, keys=[None]))
    assert err.value.offset == 3


def test_auto_create_infers_types_and_adds_kafka_columns(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink()
    vals = [{"b": True, "i": 1, "f": 1.5, "s": "x", "o": {"a": 1}, "l": [1], "n": None, "w": 1}, {"w": 2.5, "n": None}]
    cycle(sink, f"{unique}.w1.1.1", records(topic, vals))
    assert column_types(pg, table) == {
        "b": "boolean", "i": "bigint", "f": "double precision", "s": "text", "o": "jsonb", "l": "jsonb",
        "w": "double precision", "__topic": "text", "__partition": "integer", "__offset": "bigint",
    }, "null-only fields get no column; int then float widens to double precision"
    assert rows(pg, table, "w, b") == [(1.0, True), (2.5, None)]


def test_auto_evolve_adds_column(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink()
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"id": 0, "a": "x"}]))
    # the new field appears mid-batch: the running COPY stops, the column is added, the cycle redone
    cycle(sink, f"{unique}.w1.1.2",
          records(topic, [{"id": 1, "a": "y"}, {"id": 2, "a": "z", "extra": {"deep": True}}, {"id": 3, "a": "w"}], start=1))
    assert column_types(pg, table)["extra"] == "jsonb"
    assert rows(pg, table, "id, a, extra") == [(0, "x", None), (1, "y", None), (2, "z", {"deep": True}), (3, "w", None)]
    cycle(sink, f"{unique}.w1.1.3", records(topic, [{"id": 4, "a": "v", "n": 7}], start=4))  # new field in the first record
    assert column_types(pg, table)["n"] == "bigint"
    assert count(pg, table) == 5


def test_auto_evolve_disabled_names_record_with_unknown_field(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink({"auto.evolve": "false"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"id": 0}]))
    with pytest.raises(RecordError, match="no column 'surprise' and auto.evolve is false") as err:
        prepare(sink, f"{unique}.w1.1.2", records(topic, [{"id": 1}, {"id": 2, "surprise": 1}], start=1))
    assert (err.value.offset, err.value.column) == (2, "surprise")
    cycle(sink, f"{unique}.w1.1.3", records(topic, [{"id": 1, "surprise": None}], start=1))  # a null field is no data lost
    assert "surprise" not in column_types(pg, table)


def test_auto_create_disabled_names_setting(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({"auto.create": False})
    with pytest.raises(ConfigError, match=f"table {table} does not exist and auto.create is false") as err:
        prepare(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1}]))
    assert err.value.key == "auto.create"
    assert not table_exists(pg, table)


def test_missing_fields_get_column_default(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint, status text NOT NULL DEFAULT 'new', note text)").format(sql.Identifier(table)))
    sink = make_sink()
    vals = [{"id": 0, "status": "paid", "note": "a"}, {"id": 1, "note": "b"}, {"id": 2, "status": "paid"}, {"note": "d", "id": 3}]
    cycle(sink, f"{unique}.w1.1.1", records(topic, vals))
    assert rows(pg, table, "id, status, note") == [(0, "paid", "a"), (1, "new", "b"), (2, "paid", None), (3, "new", "d")]


def test_fields_kafka_false_writes_only_value_fields(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({"fields.kafka": "false"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1}, {"id": 2}]))
    assert set(column_types(pg, table)) == {"id"}
    assert rows(pg, table, "id", "id") == [(1,), (2,)]


def test_numeric_and_text_typed_columns_accept_json_numbers_and_strings(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id integer, price numeric(12,2), at timestamptz, u uuid)").format(sql.Identifier(table)))
    sink = make_sink()
    vals = [{"id": 1, "price": 3, "at": "2024-05-01T10:00:00Z", "u": "8c1f5d3e-8a51-4c7e-9a56-3f0b7a0c1d2e"},
            {"id": 2, "price": 2.5, "at": None, "u": None}, {"id": 3, "price": "19.99"}]
    cycle(sink, f"{unique}.w1.1.1", records(topic, vals))
    got = rows(pg, table, "id, price::text, at IS NOT NULL, u::text")
    assert got == [(1, "3.00", True, "8c1f5d3e-8a51-4c7e-9a56-3f0b7a0c1d2e"), (2, "2.50", False, None), (3, "19.99", False, None)]


def test_table_name_format_with_schema(make_sink: MakeSink, pg: PG, unique: str) -> None:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(f"{unique}_s")))
    sink = make_sink({"table.name.format": f"{unique}_s.out_${{topic}}"})
    cycle(sink, f"{unique}.w1.1.1", records("Sales.EU-orders", [{"id": 1}]))
    assert pg.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(f"{unique}_s", "out_Sales_EU_orders"))).fetchall() == [(1,)]


# -- configuration and server -------------------------------------------------------------------
def test_config_errors_name_the_key(stack: Endpoints, unique: str) -> None:
    url = {"connection.url": stack.postgres_dsn}
    with pytest.raises(ConfigError) as err:
        PostgresSink(unique, {**url, "insert.mode": "upsert"})
    assert err.value.key == "pk.mode"
    with pytest.raises(ConfigError) as err:
        PostgresSink(unique, {**url, "pk.mode": "record_value"})
    assert err.value.key == "pk.fields"
    with pytest.raises(ConfigError) as err:
        PostgresSink(unique, {**url, "insert.mode": "merge"})
    assert err.value.key == "insert.mode"
    with pytest.raises(ConfigError) as err:
        PostgresSink(unique, {})
    assert err.value.key == "connection.url"
    assert PostgresSink.CONFIG.mask({**url, "connection.password": "s3cret"})["connection.password"] == "[hidden]"


def test_upsert_without_unique_index_names_pk_fields(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint, v text)").format(sql.Identifier(table)))
    sink = make_sink({"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"})
    with pytest.raises(ConfigError, match=r"no PRIMARY KEY or UNIQUE index on exactly \(id\)") as err:
        prepare(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1, "v": "a"}]))
    assert err.value.key == "pk.fields"


def test_gid_too_long_names_connector(stack: Endpoints, make_sink: MakeSink, unique: str) -> None:
    long_name = unique + "x" * 190
    with pytest.raises(ConfigError, match=f"connector name '{long_name[:60]}' is too long"):
        PostgresSink(long_name, {"connection.url": stack.postgres_dsn})
    sink = make_sink()
    with pytest.raises(ConfigError, match="GID of 2\\d\\d bytes \\(limit 199\\).*too long"):
        sink.begin_transaction(f"{unique}.{'w' * 190}.1.1")


def _pg_bindir() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def test_max_prepared_transactions_zero_names_setting() -> None:
    """A real server started with max_prepared_transactions=0 (a private throwaway cluster)."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb) on this machine to start a cluster with the setting at 0")
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as the postgres user")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="eosink-pg0-"))
    data = base / "data"
    if as_postgres:
        shutil.chown(base, "postgres")
    port = free_port()
    try:
        subprocess.run([*as_postgres, str(bindir / "initdb"), "-D", str(data), "-U", "eosink", "--auth=trust", "--no-sync"],
                       check=True, capture_output=True, timeout=120)
        opts = f"-p {port} -c max_prepared_transactions=0 -c listen_addresses=127.0.0.1 -c unix_socket_directories={base} -c fsync=off"
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"],
                       check=True, capture_output=True, timeout=60)
        sink = PostgresSink("pg0", {"connection.url": f"postgresql://eosink@127.0.0.1:{port}/postgres"})
        with pytest.raises(FatalError, match="max_prepared_transactions = 0") as err:
            sink.open()
        assert "Set max_prepared_transactions" in str(err.value)
        sink.close()
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
