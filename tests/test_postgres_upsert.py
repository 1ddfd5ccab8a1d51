"""Upsert mode against the stack's real PostgreSQL: the batch streamed into a staging table of its
transaction, merged with the last record per key winning, and no staging table ever left behind -
after commits, aborts, or a worker SIGKILLed mid-cycle whose partitions another worker takes over."""

from __future__ import annotations

import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from eosink.connectors.api.errors import RecordError
from eosink.connectors.postgres import stage as pgstage
from eosink.connectors.postgres.streaming import DIRECT_PAUSE
from eosink.worker.stack import Endpoints
from tests.procs import WorkerProcess, publish, register, wait_until
from tests.sinkkit import manifest_for as manifest
from tests.sinkkit import records
from tests.test_postgres_sink import MakeSink, count, prepared_gids, rows
from tests.test_postgres_sink import make_sink as make_sink  # noqa: F401 - the fixture
from tests.test_postgres_sink import table as table  # noqa: F401 - the fixture
from tests.test_postgres_sink import topic as topic  # noqa: F401 - the fixture

PG = psycopg.Connection[Any]
UPSERT = {"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"}


def stages(pg: PG, prefix: str) -> list[str]:
    """Staging tables whose name starts with ``prefix`` that any other session can see."""
    found = pg.execute("SELECT relname FROM pg_class WHERE starts_with(relname, %s) AND strpos(relname, %s) > 0",
                       (prefix[:36], pgstage.MARK)).fetchall()
    return [r[0] for r in found]


def test_streamed_upsert_keeps_the_last_record_per_key_across_slices(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    sink = make_sink(UPSERT)
    seed = records(topic, [{"id": i, "v": "seed"} for i in range(3)], partition=9)
    sink.begin_transaction(f"{unique}.w1.1.0")
    sink.write(seed)
    sink.pre_commit(manifest(f"{unique}.w1.1.0", sink.connector, seed))
    sink.commit(f"{unique}.w1.1.0")
    # key 1 three times over three slices, key 3 and key 5 twice: per key the highest offset wins,
    # then the later record (partition 1 @ 50 beats partition 2 @ 7 although it comes first)
    batch = records(topic, [{"id": 1, "v": "a"}, {"id": 3, "v": "a"}, {"id": 3, "v": "b"}], start=0)
    batch += records(topic, [{"id": 1, "v": "b"}, {"id": 5, "v": "p1@50"}], partition=1, start=50)
    batch += records(topic, [{"id": 1, "v": "c"}, {"id": 5, "v": "p2@7"}, {"id": 3, "v": "last"}], partition=2, start=7)
    txn = f"{unique}.w1.1.1"
    caplog.set_level(logging.DEBUG, logger="eosink.connectors.postgres.sink")
    sink._direct_pause = 1  # as after a direct COPY met a known key: this stream goes through the stage
    sink.begin_transaction(txn)
    for part in (batch[:2], batch[2:5], batch[5:]):
        sink.write(part)
        assert sink._stream is not None and sink._stream.stage is not None, "the slice went into the stage"
    assert stages(pg, table) == [], "the stage's creation is not visible outside its transaction"
    sink.pre_commit(manifest(txn, sink.connector, batch))
    assert not [m for m in caplog.messages if "instead of streamed" in m or "writing the batch at prepare" in m], caplog.messages
    assert prepared_gids(pg, unique) == [f"eosink:{txn}"] and rows(pg, table, "id, v", "id") == [(i, "seed") for i in range(3)]
    sink.commit(txn)
    assert rows(pg, table, "id, v, __partition, __offset", "id") == [
        (0, "seed", 9, 0), (1, "b", 1, 50), (2, "seed", 9, 2), (3, "last", 2, 9), (5, "p1@50", 1, 51)
    ]
    assert stages(pg, table) == []


def test_upsert_of_new_keys_is_copied_straight_in_and_a_known_key_falls_back_to_the_merge(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink(UPSERT)
    new = records(topic, [{"id": i, "v": "new"} for i in range(5)])
    sink.begin_transaction(f"{unique}.w1.1.1")
    sink.write(new)
    assert sink._stream is not None and sink._stream.direct and sink._stream.stage is None
    sink.pre_commit(manifest(f"{unique}.w1.1.1", sink.connector, new))
    sink.commit(f"{unique}.w1.1.1")
    assert rows(pg, table, "id, v", "id") == [(i, "new") for i in range(5)] and sink._direct_pause == 0
    # key 4 is known, key 7 comes twice: the direct COPY is refused, the merge keeps the last per key
    again = records(topic, [{"id": 7, "v": "x"}, {"id": 4, "v": "upd"}, {"id": 7, "v": "last"}], start=5)
    sink.begin_transaction(f"{unique}.w1.1.2")
    sink.write(again)
    sink.pre_commit(manifest(f"{unique}.w1.1.2", sink.connector, again))
    sink.commit(f"{unique}.w1.1.2")
    assert rows(pg, table, "id, v", "id") == [(i, "new") for i in range(4)] + [(4, "upd"), (7, "last")]
    assert sink._direct_pause == DIRECT_PAUSE, "a key met again sends the next streams through the stage"
    later = records(topic, [{"id": 8, "v": "s"}], start=8)
    sink.begin_transaction(f"{unique}.w1.1.3")
    sink.write(later)
    assert sink._stream is not None and not sink._stream.direct and sink._stream.stage is not None
    sink.pre_commit(manifest(f"{unique}.w1.1.3", sink.connector, later))
    sink.commit(f"{unique}.w1.1.3")
    assert count(pg, table) == 7 and stages(pg, table) == []


def test_streamed_upsert_refuses_a_null_key_by_name_with_a_nullable_unique_key(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    """A unique index on a nullable column would take the null key the client refuses: the stream
    checks for it before merging and leaves the batch to the prepare, which names the record."""
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint UNIQUE, v text, __topic text, __partition int, __offset bigint)")
               .format(sql.Identifier(table)))
    sink = make_sink(UPSERT)
    batch = records(topic, [{"id": 1, "v": "a"}, {"id": None, "v": "b"}])
    sink.begin_transaction(f"{unique}.w1.1.1")
    sink.write(batch)
    with pytest.raises(RecordError, match="primary key field 'id' is null") as err:
        sink.pre_commit(manifest(f"{unique}.w1.1.1", sink.connector, batch))
    assert err.value.offset == 1
    assert count(pg, table) == 0 and stages(pg, table) == []


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["flush:3", "after_prepare:2"])
def test_no_staging_table_after_a_killed_worker_is_taken_over(
    point: str, stack: Endpoints, make_topic: Any, unique: str, pg: PG, tmp_path: Path
) -> None:
    """SIGKILLed with a stream open (``flush``: the stage created, rows copied, nothing prepared)
    or with a transaction prepared: no stage is ever visible, and the next worker delivers each
    committed record once."""
    topic = make_topic(3)
    connector = unique.replace("_", "-")
    # a key the server lets through twice (a UNIQUE index on a nullable column): every stream goes
    # through a staging table, never straight into the target
    pg.execute(sql.SQL("CREATE TABLE {} (id text UNIQUE, payload text, __topic text, __partition int, __offset bigint)")
               .format(sql.Identifier(unique)))
    try:
        _kill_and_take_over(point, stack, topic, connector, unique, pg, tmp_path)
    finally:  # a prepared transaction left by a failure would hold the table: give up after 5 s
        with contextlib.suppress(psycopg.Error), pg.transaction():
            pg.execute("SET LOCAL lock_timeout = '5s'")
            pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(unique)))


def _kill_and_take_over(point: str, stack: Endpoints, topic: str, connector: str, unique: str, pg: PG, tmp_path: Path) -> None:
    committed, _aborted = publish(stack.kafka_bootstrap, topic, 3, txns=8, per_txn=250, aborted_every=4)
    register(stack.zookeeper_hosts, unique, connector, {
        "connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn,
        "table.name.format": unique, **UPSERT, "commit.interval.ms": "200", "batch.max.records": "400",
    })
    first = WorkerProcess(stack, unique, "w-killed", tmp_path, fault=point)
    rc = first.wait(90)
    assert rc == -signal.SIGKILL, f"worker was not killed: rc={rc}\n{first.log_text()[-3000:]}"
    wait_until(lambda: not pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                      (f"eosink/{connector}",)).fetchone()[0], 30, "the killed worker's sessions to end")
    left = pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector}.%",)).fetchone()[0]
    assert left == (1 if point.startswith("after_prepare") else 0)
    assert stages(pg, unique) == [], "a stage outlived its transaction"

    second = WorkerProcess(stack, unique, "w-takeover", tmp_path)
    try:
        wait_until(lambda: count(pg, unique) >= len(committed), 120, f"delivery of {len(committed)} records")
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]
    ids = [r[0] for r in pg.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(unique))).fetchall()]
    assert len(ids) == len(set(ids)) and set(ids) == committed
    assert stages(pg, unique) == [] and pg.execute(
        "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector}.%",)).fetchone()[0] == 0
