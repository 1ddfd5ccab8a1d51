"""The PostgreSQL sink's Kafka Connect JDBC sink keys against the stack's real PostgreSQL.

Tombstones (``delete.enabled``), ``pk.mode=kafka``, ``insert.mode=update``, the field filters and
every JDBC key eosink refuses. Fixtures and helpers are those of ``test_postgres_sink``: names
derive from ``unique`` and teardown rolls back whatever a test left prepared.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from eosink.connectors.api.errors import ConfigError, RecordError, RetryableError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.postgres.sink import PostgresSink
from eosink.worker.stack import Endpoints
from tests import test_postgres_sink as base
from tests.sinkkit import prepare, records
from tests.test_postgres_sink import MakeSink, column_types, count, cycle, prepared_gids, rows

make_sink, topic, table = base.make_sink, base.topic, base.table  # the fixtures, found by name

PG = psycopg.Connection[Any]
DELETES = {"delete.enabled": "true", "pk.mode": "record_key", "pk.fields": "id"}


def keyed(topic: str, items: Sequence[tuple[int, Any]], start: int = 0, partition: int = 0) -> list[SinkRecord]:
    """(key, value) pairs at consecutive offsets; a None value is a real tombstone (no value bytes)."""
    return [SinkRecord(topic, partition, start + i, str(k).encode(), v, None if v is None else b"{}")
            for i, (k, v) in enumerate(items)]


def by_id(pg: PG, table: str, cols: str = "id, v") -> list[tuple[Any, ...]]:
    return rows(pg, table, cols, "id")


# -- tombstones ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_tombstone_deletes_by_record_key_only_when_the_prepared_txn_commits(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, mode: str
) -> None:
    sink = make_sink({**DELETES, "insert.mode": mode})
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a"}), (2, {"v": "b"}), (3, {"v": "c"})]))
    prepare(sink, f"{unique}.w1.1.2", keyed(topic, [(2, None), (4, {"v": "d"})], start=3))
    assert by_id(pg, table) == [(1, "a"), (2, "b"), (3, "c")], "prepared deletes are invisible to other sessions"
    sink.commit(f"{unique}.w1.1.2")
    assert by_id(pg, table) == [(1, "a"), (3, "c"), (4, "d")]


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_insert_then_tombstone_of_a_key_in_one_batch_leaves_no_row(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, mode: str
) -> None:
    sink = make_sink({**DELETES, "insert.mode": mode})
    cycle(sink, f"{unique}.w1.1.0", keyed(topic, [(9, {"v": "keep"})]))
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a"}), (2, {"v": "b"}), (1, None), (2, {"v": "b2"}), (2, None)], start=1))
    assert by_id(pg, table) == [(9, "keep")]


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_tombstone_then_insert_of_a_key_in_one_batch_leaves_a_fresh_row(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str, mode: str
) -> None:
    sink = make_sink({**DELETES, "insert.mode": mode})
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "old", "note": "old"}), (2, {"v": "x", "note": "x"})]))
    cycle(sink, f"{unique}.w1.1.2", keyed(topic, [(1, None), (1, {"v": "new"}), (3, None)], start=2))
    assert by_id(pg, table, "id, v, note") == [(1, "new", None), (2, "x", "x")], \
        "the row after a tombstone is a new one: a field it lacks is not the deleted row's"


def test_tombstone_order_across_partitions_follows_offsets(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({**DELETES, "insert.mode": "upsert"})
    batch = keyed(topic, [(1, {"v": "p0@10"})], start=10) + keyed(topic, [(1, None)], start=5, partition=1)
    cycle(sink, f"{unique}.w1.1.1", batch)
    assert by_id(pg, table) == [(1, "p0@10")], "the tombstone's offset is lower: the upsert wins, as upserts decide"


def test_abort_of_prepared_deletes_leaves_the_rows(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink(DELETES)
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(i, {"v": str(i)}) for i in range(5)]))
    prepare(sink, f"{unique}.w1.1.2", keyed(topic, [(i, None) for i in range(5)], start=5))
    sink.abort(f"{unique}.w1.1.2")
    assert count(pg, table) == 5
    assert prepared_gids(pg, unique) == []


def test_prepared_deletes_are_committed_by_recovery_after_a_crash(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink(DELETES)
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(i, {"v": str(i)}) for i in range(4)]))
    m = prepare(sink, f"{unique}.w1.1.2", keyed(topic, [(0, None), (2, None)], start=4))
    sink.close()  # the crash
    fresh = make_sink(DELETES)
    assert fresh.recover() == [m]
    fresh.recover_and_commit(m)
    assert by_id(pg, table) == [(1, "1"), (3, "3")]
    assert fresh.recover() == []


def test_tombstone_without_delete_enabled_is_a_record_error_naming_the_record(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink({"insert.mode": "upsert", "pk.mode": "record_key", "pk.fields": "id"})
    with pytest.raises(RecordError, match="tombstone: deletes need delete.enabled=true") as err:
        prepare(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a"}), (1, None)], start=7, partition=3))
    assert (err.value.topic, err.value.partition, err.value.offset) == (topic, 3, 8)
    assert prepared_gids(pg, unique) == []


def test_tombstone_with_a_null_key_names_the_record(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink(DELETES)
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a"})]))
    bad = SinkRecord(topic, 0, 2, None, None, None)
    with pytest.raises(RecordError, match="Kafka key is null") as err:
        prepare(sink, f"{unique}.w1.1.2", keyed(topic, [(1, None)], start=1) + [bad])
    assert err.value.offset == 2
    assert by_id(pg, table) == [(1, "a")]


def test_tombstone_key_of_the_wrong_type_names_the_record_and_column(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink(DELETES)
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a"})]))  # id bigint (the key is JSON 1)
    bad = SinkRecord(topic, 0, 5, b'"one"', None, None)
    with pytest.raises(RecordError) as err:
        prepare(sink, f"{unique}.w1.1.2", keyed(topic, [(1, None)], start=4) + [bad])
    assert (err.value.offset, err.value.column) == (5, "id")
    assert by_id(pg, table) == [(1, "a")]


def test_deletes_of_many_keys_in_one_cycle(make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str) -> None:
    sink = make_sink({**DELETES, "insert.mode": "upsert"})
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(i, {"v": str(i)}) for i in range(3000)]))
    cycle(sink, f"{unique}.w1.1.2", keyed(topic, [(i, None) for i in range(0, 3000, 2)], start=3000))
    assert count(pg, table) == 1500
    assert pg.execute(sql.SQL("SELECT count(*) FROM {} WHERE id % 2 = 0").format(sql.Identifier(table))).fetchone() == (0,)


# -- pk.mode=kafka, insert.mode=update, field filters ----------------------------------------------
def test_pk_mode_kafka_keys_rows_by_connect_coordinates_and_upsert_is_idempotent(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink({"pk.mode": "kafka", "insert.mode": "upsert"})
    recs = records(topic, [{"v": "a"}, {"v": "b"}], partition=2, start=40)
    cycle(sink, f"{unique}.w1.1.1", recs)
    cycle(sink, f"{unique}.w1.1.2", records(topic, [{"v": "a2"}], partition=2, start=40))  # a redelivered offset
    assert set(column_types(pg, table)) == {"v", "__connect_topic", "__connect_partition", "__connect_offset"}, \
        "with pk.mode=kafka fields.kafka defaults to false: the coordinates are in the key"
    assert rows(pg, table, "__connect_topic, __connect_partition, __connect_offset, v", "__connect_offset") == [
        (topic, 2, 40, "a2"), (topic, 2, 41, "b")]
    pkey = pg.execute("SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i JOIN pg_attribute a ON "
                      "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                      (sql.Identifier(table).as_string(pg),)).fetchone()
    assert pkey == (["__connect_offset", "__connect_partition", "__connect_topic"],)


def test_pk_mode_kafka_with_renamed_pk_fields_and_fields_kafka_on(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink({"pk.mode": "kafka", "pk.fields": "src,part,off", "fields.kafka": "true"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"v": 1}], partition=1, start=7))
    assert rows(pg, table, "src, part, off, __topic, __offset, v", "off") == [(topic, 1, 7, topic, 7, 1)]


def test_update_mode_updates_existing_rows_and_inserts_no_missing_key(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text, note text)").format(sql.Identifier(table)))
    pg.execute(sql.SQL("INSERT INTO {} (id, v, note) VALUES (1, 'a', 'n1'), (2, 'b', 'n2')").format(sql.Identifier(table)))
    sink = make_sink({"insert.mode": "update", "pk.mode": "record_value", "pk.fields": "id", "fields.kafka": "false"})
    prepare(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1, "v": "x"}, {"id": 3, "v": "new"}, {"id": 1, "v": "a2"},
                                                      {"id": 2, "v": "b2", "note": None}]))
    assert by_id(pg, table, "id, v, note") == [(1, "a", "n1"), (2, "b", "n2")], "prepared updates are invisible"
    sink.commit(f"{unique}.w1.1.1")
    assert by_id(pg, table, "id, v, note") == [(1, "a2", "n1"), (2, "b2", None)], \
        "the last record per key wins; an absent field keeps its value; key 3 has no row and gets none"


def test_update_mode_with_tombstones_deletes_and_updates_in_order(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(sql.Identifier(table)))
    pg.execute(sql.SQL("INSERT INTO {} (id, v) VALUES (1, 'a'), (2, 'b')").format(sql.Identifier(table)))
    sink = make_sink({**DELETES, "insert.mode": "update", "fields.kafka": "false"})
    cycle(sink, f"{unique}.w1.1.1", keyed(topic, [(1, {"v": "a2"}), (2, None), (2, {"v": "gone"})]))
    assert by_id(pg, table) == [(1, "a2")], "an update after a delete finds no row"


def test_fields_whitelist_writes_listed_fields_and_key_columns(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    sink = make_sink({"fields.whitelist": "v", "insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1, "v": "a", "secret": "s", "more": 1}]))
    assert set(column_types(pg, table)) == {"id", "v", "__topic", "__partition", "__offset"}


def test_field_exclude_list_drops_plain_and_topic_qualified_fields(make_sink: MakeSink, pg: PG, unique: str) -> None:
    a, b = f"{unique}.a", f"{unique}.b"
    sink = make_sink({"field.exclude.list": f"secret,{b}:note,id", "fields.kafka": "false",
                      "insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"})
    vals = [{"id": 1, "secret": "s", "note": "n"}]
    cycle(sink, f"{unique}.w1.1.1", records(a, vals) + records(b, vals))
    assert set(column_types(pg, f"{unique}_a")) == {"id", "note"}, "the key column is never excluded"
    assert set(column_types(pg, f"{unique}_b")) == {"id"}


def test_field_include_list_with_topic_qualified_fields(make_sink: MakeSink, pg: PG, unique: str) -> None:
    a, b = f"{unique}.a", f"{unique}.b"
    sink = make_sink({"field.include.list": f"v,{b}:w", "fields.kafka": "false"})
    cycle(sink, f"{unique}.w1.1.1", records(a, [{"v": 1, "w": 2, "x": 3}]) + records(b, [{"v": 1, "w": 2, "x": 3}]))
    assert set(column_types(pg, f"{unique}_a")) == {"v"}
    assert set(column_types(pg, f"{unique}_b")) == {"v", "w"}


# -- the other JDBC keys ------------------------------------------------------------------------
def test_db_timezone_reads_timestamps_without_offset_in_that_zone(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint, at timestamptz)").format(sql.Identifier(table)))
    sink = make_sink({"db.timezone": "Asia/Tokyo", "fields.kafka": "false"})
    cycle(sink, f"{unique}.w1.1.1", records(topic, [{"id": 1, "at": "2024-05-01 09:00:00"}]))
    got = pg.execute(sql.SQL("SELECT to_char(at AT TIME ZONE 'UTC', 'HH24:MI') FROM {}").format(sql.Identifier(table))).fetchone()
    assert got == ("00:00",)


def test_table_types_without_partitioned_table_refuses_a_partitioned_target(
    make_sink: MakeSink, pg: PG, topic: str, table: str, unique: str
) -> None:
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint, __topic text, __partition int, __offset bigint) PARTITION BY RANGE (id)")
               .format(sql.Identifier(table)))
    pg.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(sql.Identifier(table + "_d"), sql.Identifier(table)))
    with pytest.raises(ConfigError, match="is a PARTITIONED TABLE, which table.types does not list") as err:
        prepare(make_sink({"table.types": "TABLE"}), f"{unique}.w1.1.1", records(topic, [{"id": 1}]))
    assert err.value.key == "table.types"
    cycle(make_sink(connector=f"{unique}_all"), f"{unique}_all.w1.1.1", records(topic, [{"id": 1}]))
    assert count(pg, table) == 1, "the default admits partitioned tables"


def test_connection_attempts_are_counted_before_a_retryable_error(stack: Endpoints, unique: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    dsn = make_conninfo(stack.postgres_dsn, host="127.0.0.1", port=str(port))
    sink = PostgresSink(unique, {"connection.url": dsn, "connection.attempts": 2, "connection.backoff.ms": 0})
    with pytest.raises(RetryableError, match=r"2 attempt\(s\), connection.attempts"):
        sink.open()


@pytest.mark.parametrize(("extra", "key", "message"), [
    ({"delete.enabled": "true"}, "delete.enabled", "delete.enabled=true needs pk.mode=record_key.*pk.mode=none"),
    ({"delete.enabled": "true", "pk.mode": "record_value", "pk.fields": "id"}, "delete.enabled", "got pk.mode=record_value"),
    ({"insert.mode": "update"}, "pk.mode", "insert.mode=update needs a primary key"),
    ({"pk.mode": "kafka", "pk.fields": "a,b"}, "pk.fields", "three pk.fields"),
    ({"fields.whitelist": "a", "field.include.list": "b"}, "field.include.list", "both set"),
    ({"field.include.list": "a", "field.exclude.list": "b"}, "field.exclude.list", "both set"),
    ({"fields.blacklist": "a"}, "fields.blacklist", "use field.exclude.list"),
    ({"batch.size": 3000}, "batch.size", "batch.max.records"),
    ({"max.retries": 10}, "max.retries", "errors.retry.timeout"),
    ({"retry.backoff.ms": 3000}, "retry.backoff.ms", "errors.retry.delay.max.ms"),
    ({"quote.sql.identifiers": "never"}, "quote.sql.identifiers", "always quotes"),
    ({"dialect.name": "MySqlDatabaseDialect"}, "dialect.name", "PostgreSQL only"),
    ({"db.timezone": "Mars/Olympus"}, "db.timezone", "not a time zone"),
    ({"db.timezone.date": "UTC"}, "db.timezone.date", "not supported"),
    ({"table.types": "TABLE,VIEW"}, "table.types", "VIEW is not supported"),
    ({"mssql.use.merge.holdlock": "true"}, "mssql.use.merge.holdlock", "SQL Server"),
    ({"trim.sensitive.log": "true"}, "trim.sensitive.log", "not supported"),
])
def test_jdbc_keys_eosink_does_not_do_are_refused_naming_the_key(
    stack: Endpoints, unique: str, extra: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        PostgresSink(unique, {"connection.url": stack.postgres_dsn, **extra})
    assert err.value.key == key


def test_jdbc_values_eosink_does_anyway_are_accepted(stack: Endpoints, unique: str) -> None:
    PostgresSink(unique, {"connection.url": stack.postgres_dsn, "quote.sql.identifiers": "ALWAYS", "db.timezone.date": "none",
                          "dialect.name": "PostgreSqlDatabaseDialect", "table.types": "TABLE", "db.timezone": "UTC"})


def test_every_jdbc_sink_key_is_declared_with_a_doc() -> None:
    jdbc = {"connection.url", "connection.user", "connection.password", "connection.attempts", "connection.backoff.ms",
            "dialect.name", "insert.mode", "batch.size", "delete.enabled", "table.types", "table.name.format", "pk.mode",
            "pk.fields", "fields.whitelist", "db.timezone", "db.timezone.date", "auto.create", "auto.evolve",
            "quote.sql.identifiers", "mssql.use.merge.holdlock", "max.retries", "retry.backoff.ms", "trim.sensitive.log"}
    keys = PostgresSink.CONFIG.keys
    assert jdbc <= set(keys), sorted(jdbc - set(keys))
    assert all(keys[k].doc for k in keys)
