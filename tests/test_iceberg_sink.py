"""The Iceberg sink against the real stack: a SQL catalog in the stack's PostgreSQL, warehouses on
the local filesystem and on the stack's S3 (MinIO); a REST catalog (Iceberg's own RESTCatalogServer
from Maven Central); and Spark reading the rows through Iceberg's Spark runtime and JdbcCatalog.

Every table, connector and warehouse prefix is unique per test (``unique``), so runs never collide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from eosink.connectors.api.errors import FatalError, FencedError, RecordError, RetryableError
from eosink.connectors.api.records import UNDECODED, LazyJsonRecord, SinkRecord
from eosink.worker.stack.proc import free_port

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import load_catalog  # noqa: E402

from eosink.connectors.iceberg.sink import SUMMARY_CONNECTOR, SUMMARY_EPOCHS, SUMMARY_OFFSETS, SUMMARY_TXN, IcebergSink  # noqa: E402
from tests.sinkkit import prepare  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BUCKET = "eosink-iceberg-tests"
CATALOG = "eosink_tests"


# -- helpers -------------------------------------------------------------------------------------
def records(topic: str, n: int, *, partitions: int = 2, first: int = 0,
            value: Callable[[int], dict[str, Any]] | None = None) -> list[SinkRecord]:
    """``n`` records round-robin over ``partitions``; offsets continue from ``first`` per partition."""
    make = value or (lambda i: {"id": i, "user": f"u{i % 7}", "amount": round(i * 1.25, 2), "paid": i % 2 == 0,
                                "items": [{"sku": f"s{i}", "qty": 1}]})
    out = []
    for i in range(n):
        v = make(i)
        out.append(SinkRecord(topic, i % partitions, first + i // partitions, None, v, json.dumps(v).encode()))
    return out


def sql_uri(dsn: str) -> str:
    """The stack's libpq DSN as a SQLAlchemy URL for psycopg2 (pyiceberg's SqlCatalog)."""
    scheme, rest = dsn.split("://", 1)
    assert scheme in ("postgresql", "postgres"), dsn
    return f"postgresql+psycopg2://{rest}"


class Target:
    """One warehouse + catalog under test, and an independent pyiceberg reader of it."""

    def __init__(self, config: dict[str, Any], storage: Callable[[str], list[str]]) -> None:
        self.config = config
        self._list = storage
        props = {k: v for k, v in config.items() if k.startswith("s3.")}
        props |= {"type": config.get("iceberg.catalog.type", "sql"), "uri": config["iceberg.catalog.uri"]}
        if config.get("iceberg.warehouse"):
            props["warehouse"] = config["iceberg.warehouse"]
        self.reader = load_catalog(config.get("iceberg.catalog.name", CATALOG), **props)

    def sink(self, connector: str, **overrides: Any) -> IcebergSink:
        s = IcebergSink(connector, {**self.config, **overrides})
        s.open()
        return s

    def rows(self, table: str) -> list[dict[str, Any]]:
        """What a reader other than the sink sees: a fresh pyiceberg catalog, a full scan."""
        t = self.reader.load_table(table)
        return sorted(t.scan().to_arrow().to_pylist(), key=lambda r: (r.get("__partition"), r.get("__offset")))

    def files(self, prefix: str) -> list[str]:
        """Every object/file under ``prefix`` (a URI)."""
        return self._list(prefix)

    def drop(self) -> None:
        """Forget the test's table in the shared catalog (its files go with the test's directory/prefix)."""
        try:
            self.reader.drop_table(self.config["iceberg.table"])
        except Exception:  # noqa: BLE001 - the test may never have created it
            pass


@pytest.fixture(scope="session")
def s3_client(stack):
    import boto3

    client = boto3.client("s3", **stack.s3)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return client


def _s3_lister(client) -> Callable[[str], list[str]]:
    def ls(uri: str) -> list[str]:
        bucket, _, key = uri[len("s3://"):].partition("/")
        out: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key.rstrip("/") + "/"):
            out += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return out

    return ls


def _fs_lister(uri: str) -> list[str]:
    root = Path(uri[len("file://"):])
    return sorted(f"file://{p}" for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture(params=["file", "s3"])
def target(request, stack, unique, tmp_path) -> Iterator[Target]:
    """A SQL catalog in the stack's PostgreSQL with the warehouse on the local disk or on S3."""
    base = {"iceberg.catalog.uri": sql_uri(stack.postgres_dsn), "iceberg.catalog.name": CATALOG,
            "iceberg.table": f"eosink_it.{unique}"}
    if request.param == "file":
        t = Target({**base, "iceberg.warehouse": f"file://{tmp_path}/warehouse"}, _fs_lister)
    else:
        client = request.getfixturevalue("s3_client")
        s3 = {"s3.endpoint": stack.s3["endpoint_url"], "s3.access-key-id": stack.s3["aws_access_key_id"],
              "s3.secret-access-key": stack.s3["aws_secret_access_key"], "s3.region": stack.s3["region_name"]}
        t = Target({**base, **s3, "iceberg.warehouse": f"s3://{BUCKET}/{unique}"}, _s3_lister(client))
    yield t
    t.drop()


@pytest.fixture
def local(stack, unique, tmp_path) -> Iterator[Target]:
    """The local-disk variant only, for tests whose point is not the storage."""
    t = Target({"iceberg.catalog.uri": sql_uri(stack.postgres_dsn), "iceberg.catalog.name": CATALOG,
                "iceberg.table": f"eosink_it.{unique}", "iceberg.warehouse": f"file://{tmp_path}/warehouse"}, _fs_lister)
    yield t
    t.drop()


def data_files(target: Target, table: str) -> list[str]:
    return target.files(target.reader.load_table(table).location() + "/data")


# -- configuration ---------------------------------------------------------------------------------
def test_config_is_checked_before_anything_connects() -> None:
    from eosink.connectors.api.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        IcebergSink("c", {"iceberg.catalog.uri": "sqlite:///x.db", "iceberg.table": "t"})
    assert e.value.key == "iceberg.table"
    with pytest.raises(ConfigError) as e:
        IcebergSink("c", {"iceberg.catalog.uri": "sqlite:///x.db"})
    assert e.value.key == "iceberg.warehouse"
    with pytest.raises(ConfigError) as e:
        IcebergSink("c", {"iceberg.catalog.type": "rest", "iceberg.catalog.uri": "http://h:8181"})
    assert e.value.key == "iceberg.pending.location"
    s = IcebergSink("c", {"iceberg.catalog.uri": "sqlite:///x.db", "iceberg.warehouse": "file:///w", "iceberg.table": "ns.${topic}",
                          "s3.secret-access-key": "hush", "s3.path-style-access": "true"})
    assert s.table_name("orders.v1-eu") == "ns.orders_v1_eu"
    assert s.catalog_props["s3.secret-access-key"] == "hush" and s.catalog_props["s3.path-style-access"] == "true"
    assert IcebergSink.CONFIG.mask({"s3.secret-access-key": "hush"})["s3.secret-access-key"] != "hush"


# -- visibility and the happy path ----------------------------------------------------------------------
def test_prepared_batch_is_invisible_until_commit_then_visible_once(target: Target, unique: str) -> None:
    table = target.config["iceberg.table"]
    sink = target.sink(unique)
    recs = records("orders", 40)
    m = prepare(sink, f"{unique}.w.1.1", recs, epoch=3)

    assert target.rows(table) == [], "prepared rows must not be visible"
    assert target.reader.load_table(table).current_snapshot() is None
    assert [x.txn_id for x in sink.recover()] == [m.txn_id]
    assert len(target.files(sink.markers.dir)) == 1

    sink.commit(m.txn_id)
    rows = target.rows(table)
    assert len(rows) == 40
    assert rows[0] == {"id": 0, "user": "u0", "amount": 0.0, "paid": True, "items": '[{"sku":"s0","qty":1}]',
                       "__topic": "orders", "__partition": 0, "__offset": 0}
    assert sorted((r["__partition"], r["__offset"]) for r in rows) == sorted((r.partition, r.offset) for r in recs)
    t = target.reader.load_table(table)
    summary = t.current_snapshot().summary.additional_properties
    assert summary[SUMMARY_TXN] == m.txn_id and summary[SUMMARY_CONNECTOR] == unique
    assert json.loads(summary[SUMMARY_EPOCHS]) == {"orders-0": 3, "orders-1": 3}
    assert json.loads(summary[SUMMARY_OFFSETS]) == {"orders-0": [0, 19], "orders-1": [0, 19]}
    assert t.metadata.properties["commit.retry.num-retries"] == "0"
    assert json.loads(t.metadata.properties[f"eosink.state.{unique}.orders-1"]) == {"epoch": 3, "next_offset": 20, "txn": m.txn_id}
    assert sink.recover() == [] and target.files(sink.markers.dir) == []


def test_commit_twice_abort_twice_and_abort_unknown_are_ok(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    m = prepare(sink, f"{unique}.w.1.1", records("orders", 10))
    sink.commit(m.txn_id)
    sink.commit(m.txn_id)
    local.sink(unique).commit(m.txn_id)  # a fresh instance: no marker, the snapshot summary proves it
    sink.abort(m.txn_id)  # an abort replayed after the commit must not touch committed files
    local.sink(unique).abort(m.txn_id)
    assert len(local.rows(table)) == 10
    assert len(local.reader.load_table(table).metadata.snapshots) == 1

    m2 = prepare(sink, f"{unique}.w.1.2", records("orders", 10, first=5))
    sink.abort(m2.txn_id)
    sink.abort(m2.txn_id)
    local.sink(unique).abort(m2.txn_id)
    sink.abort(f"{unique}.w.9.9")  # never seen
    assert len(local.rows(table)) == 10
    assert sink.recover() == []
    with pytest.raises(FatalError, match="aborted or never"):
        local.sink(unique).commit(m2.txn_id)  # the decision log can never name an aborted txn: say so loudly


# -- crashes -------------------------------------------------------------------------------------------
def test_crash_between_prepare_and_commit_new_instance_recovers_and_commits(target: Target, unique: str) -> None:
    table = target.config["iceberg.table"]
    first = target.sink(unique)
    done = prepare(first, f"{unique}.w.1.1", records("orders", 6))
    first.commit(done.txn_id)
    m = prepare(first, f"{unique}.w.1.2", records("orders", 30, first=3))
    del first  # the worker dies here: nothing in memory survives

    second = target.sink(unique)
    found = second.recover()
    assert found == [m], "recover must list exactly the prepared, uncommitted txn, with its ranges and epochs"
    assert len(target.rows(table)) == 6
    second.recover_and_commit(found[0])
    rows = target.rows(table)
    assert len(rows) == 36
    assert len({(r["__partition"], r["__offset"]) for r in rows}) == 36
    assert second.recover() == []


def test_crash_after_iceberg_commit_before_marker_delete_is_not_applied_twice(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    m = prepare(sink, f"{unique}.w.1.1", records("orders", 12))
    with mock.patch.object(sink.markers, "delete", side_effect=OSError("connection reset")), pytest.raises(RetryableError):
        sink.commit(m.txn_id)
    assert len(local.rows(table)) == 12, "the snapshot landed before the failure"
    survivor = local.sink(unique)
    assert survivor.recover() == [m]
    survivor.recover_and_commit(m)  # the summary carries the txn: ok, nothing appended again
    assert len(local.rows(table)) == 12
    assert len(local.reader.load_table(table).metadata.snapshots) == 1
    assert survivor.recover() == []


def test_abort_replayed_after_commit_keeps_the_committed_files(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    m = prepare(sink, f"{unique}.w.1.1", records("orders", 12))
    with mock.patch.object(sink.markers, "delete", side_effect=OSError("connection reset")), pytest.raises(RetryableError):
        sink.commit(m.txn_id)
    files = data_files(local, table)
    other = local.sink(unique)
    assert other.recover() == [m]  # the marker survived the commit
    other.abort(m.txn_id)  # a confused caller: the snapshot already references the files
    assert data_files(local, table) == files
    assert len(local.rows(table)) == 12 and other.recover() == []


# -- fencing ---------------------------------------------------------------------------------------------
def test_stale_epoch_is_refused_at_prepare(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    new_owner = local.sink(unique)
    m2 = prepare(new_owner, f"{unique}.w2.1.1", records("orders", 8, first=100), epoch=2)
    new_owner.commit(m2.txn_id)

    zombie = local.sink(unique)
    with pytest.raises(FencedError, match="older than epoch 2"):
        prepare(zombie, f"{unique}.w1.1.1", records("orders", 8, first=100), epoch=1)
    zombie.abort(f"{unique}.w1.1.1")
    assert zombie.recover() == []
    assert data_files(local, table) and not any("w1.1.1" in f for f in data_files(local, table)), "a refused prepare writes no file"
    assert len(local.rows(table)) == 8


def test_stale_epoch_is_refused_at_commit(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    zombie = local.sink(unique)
    m1 = prepare(zombie, f"{unique}.w1.1.1", records("orders", 8), epoch=1)  # before the new owner commits
    new_owner = local.sink(unique)
    m2 = prepare(new_owner, f"{unique}.w2.1.1", records("orders", 8), epoch=2)
    new_owner.commit(m2.txn_id)

    with pytest.raises(FencedError):
        zombie.commit(m1.txn_id)
    with pytest.raises(FencedError):  # and after a restart, from the marker alone
        local.sink(unique).commit(m1.txn_id)
    rows = local.rows(table)
    assert len(rows) == 8
    assert {r["id"] for r in rows} == set(range(8))
    assert local.reader.load_table(table).current_snapshot().summary.additional_properties[SUMMARY_TXN] == m2.txn_id


def test_concurrent_commit_is_not_silently_reapplied_even_if_the_table_allows_retries(local: Target, unique: str) -> None:
    """pyiceberg's own retry would re-apply the stale append on top of the newer commit. The sink
    commits with 0 retries whatever the table property says, and re-checks the fence itself."""
    table = local.config["iceberg.table"]
    warm = local.sink(unique)
    warm.commit(prepare(warm, f"{unique}.w0.1.1", records("orders", 2, first=0)).txn_id)
    t = local.reader.load_table(table)
    with t.transaction() as tx:  # as if someone else created the table with pyiceberg's default
        tx.set_properties({"commit.retry.num-retries": "4", "commit.retry.min-wait-ms": "1"})

    stale = local.sink(unique, **{"iceberg.commit.attempts": 1})
    m1 = prepare(stale, f"{unique}.w1.1.1", records("orders", 4, first=10), epoch=1)  # reads the table now
    fresh = local.sink(unique)
    m2 = prepare(fresh, f"{unique}.w2.1.1", records("orders", 4, first=10), epoch=2)
    fresh.commit(m2.txn_id)  # lands first: the stale writer's base snapshot is gone

    with pytest.raises(RetryableError) as e:
        stale.commit(m1.txn_id)
    assert not isinstance(e.value, FencedError), "with one attempt the conflict itself must surface"
    t = local.reader.load_table(table)
    assert [s.summary.additional_properties.get(SUMMARY_TXN) for s in t.metadata.snapshots][-1] == m2.txn_id
    assert len(local.rows(table)) == 6, "the stale append must not have been applied"
    with pytest.raises(FencedError):  # the engine's retry re-reads the table and meets the fence
        stale.commit(m1.txn_id)
    assert len(local.rows(table)) == 6


# -- abort and orphan files -----------------------------------------------------------------------------------
def test_abort_deletes_the_prepared_files_and_marker(target: Target, unique: str) -> None:
    table = target.config["iceberg.table"]
    sink = target.sink(unique)
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 4)).txn_id)
    kept = set(target.files(target.reader.load_table(table).location() + "/data"))
    m = prepare(sink, f"{unique}.w.1.2", records("orders", 20, first=2))
    location = target.reader.load_table(table).location()
    prepared = set(target.files(location + "/data")) - kept
    assert prepared and all("/eosink-" in f and f.endswith(".parquet") for f in prepared)

    target.sink(unique).abort(m.txn_id)  # e.g. recovery by another instance
    assert set(target.files(location + "/data")) == kept, "orphan files left behind"
    assert target.files(sink.markers.dir) == []
    assert len(target.rows(table)) == 4


def test_abort_after_a_prepare_that_failed_half_way_deletes_its_files(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 4)).txn_id)
    before = set(local.files(local.reader.load_table(table).location() + "/data"))
    with mock.patch.object(sink.markers, "put", side_effect=OSError("disk full")), pytest.raises(RetryableError, match="disk full"):
        prepare(sink, f"{unique}.w.1.2", records("orders", 10, first=2))
    after = set(local.files(local.reader.load_table(table).location() + "/data"))
    assert after > before, "the data files were written before the marker failed"
    assert sink.recover() == [], "without its marker the txn is not prepared"
    sink.abort(f"{unique}.w.1.2")
    assert set(local.files(local.reader.load_table(table).location() + "/data")) == before


# -- records that do not fit ------------------------------------------------------------------------------------
def test_wrong_type_names_topic_partition_offset_and_column_and_writes_nothing(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 4)).txn_id)
    files_before = set(local.files(local.reader.load_table(table).location()))

    bad = records("orders", 10, first=50)
    bad[7].value = {**bad[7].value, "amount": "12.50"}  # a string in a double column
    with pytest.raises(RecordError) as e:
        prepare(sink, f"{unique}.w.1.2", bad)
    err = e.value
    assert (err.topic, err.partition, err.offset, err.column) == ("orders", 1, 53, "amount")
    assert "string" in str(err) and "double" in str(err)

    truncating = records("orders", 3, first=60)
    truncating[2].value = {**truncating[2].value, "id": 1.5}  # pyarrow alone would store 1
    with pytest.raises(RecordError) as e:
        prepare(sink, f"{unique}.w.1.3", truncating)
    assert (e.value.offset, e.value.column) == (61, "id")

    tomb = records("orders", 2, first=70)
    tomb[1].value = None
    with pytest.raises(RecordError, match="tombstone"):
        prepare(sink, f"{unique}.w.1.4", tomb)

    strict = local.sink(unique, **{"auto.evolve": False})
    extra = records("orders", 2, first=80)
    extra[1].value = {**extra[1].value, "coupon": "X1"}
    with pytest.raises(RecordError) as e:
        prepare(strict, f"{unique}.w.1.5", extra)
    assert (e.value.offset, e.value.column) == (80, "coupon")

    assert set(local.files(local.reader.load_table(table).location())) == files_before, "nothing may be written"
    assert sink.recover() == [] and len(local.rows(table)) == 4


def test_new_fields_become_columns_and_old_rows_read_null(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 2)).txn_id)
    more = records("orders", 2, first=10, value=lambda i: {"id": 100 + i, "coupon": "X1", "score": 1 if i else 2.5})
    sink.commit(prepare(sink, f"{unique}.w.1.2", more).txn_id)
    rows = local.rows(table)
    assert [r["coupon"] for r in rows] == [None, "X1", None, "X1"]
    assert {r["score"] for r in rows} == {None, 2.5, 1.0}


def test_a_new_field_null_in_every_record_of_its_batch_gets_no_column_and_fails_nothing(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 2)).txn_id)
    more = records("orders", 2, first=10, value=lambda i: {"id": 100 + i, "coupon": None})
    sink.commit(prepare(sink, f"{unique}.w.1.2", more).txn_id)
    assert [r["id"] for r in local.rows(table)] == [0, 100, 1, 101]
    assert "coupon" not in local.reader.load_table(table).schema().column_names


def test_undecoded_values_are_parsed_into_the_table_and_a_batch_the_parse_declines_is_decoded(local: Target, unique: str) -> None:
    """As the worker hands them over (values left undecoded: the sink reads the bytes): the first
    batch creates the table (decoded, checked path), the second is parsed without decoding a value,
    the third has a field of another type and an array in a string column, so it is decoded and
    checked - with the same rows as if it had never been tried."""
    table = local.config["iceberg.table"]
    sink = local.sink(unique)

    def undecoded(recs: list[SinkRecord]) -> list[SinkRecord]:
        for r in recs:
            r.value = UNDECODED
            r.__class__ = LazyJsonRecord
        return recs

    plain = lambda i: {"id": i, "user": f"u{i % 7}", "amount": round(i * 1.25, 2), "paid": i % 2 == 0}  # noqa: E731
    sink.commit(prepare(sink, f"{unique}.w.1.1", undecoded(records("orders", 4, value=plain))).txn_id)
    second = undecoded(records("orders", 6, first=2, value=plain))
    sink.commit(prepare(sink, f"{unique}.w.1.2", second).txn_id)
    assert all(r.__class__ is LazyJsonRecord for r in second), "a value was decoded"
    odd = lambda i: {"id": i, "user": ["a", i], "amount": 7}  # noqa: E731
    third = undecoded(records("orders", 2, first=5, value=odd))
    sink.commit(prepare(sink, f"{unique}.w.1.3", third).txn_id)
    assert all(r.__class__ is SinkRecord for r in third)
    rows = local.rows(table)
    assert len(rows) == 12 and len({(r["__partition"], r["__offset"]) for r in rows}) == 12
    assert [r for r in rows if r["__offset"] == 3 and r["__partition"] == 1] == [
        {"id": 3, "user": "u3", "amount": 3.75, "paid": False, "__topic": "orders", "__partition": 1, "__offset": 3}]
    assert [(r["user"], r["amount"]) for r in rows if r["__offset"] >= 5] == [('["a",0]', 7.0), ('["a",1]', 7.0)]


def test_existing_table_with_richer_types_gets_strictly_converted_values(local: Target, unique: str) -> None:
    """A table created by someone else (int, timestamptz, date, decimal, struct columns): strings are
    parsed into them, numbers range-checked, and a value that does not parse is named."""
    import datetime
    import decimal

    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, DecimalType, IntegerType, NestedField, StringType, StructType, TimestamptzType

    table = local.config["iceberg.table"]
    local.reader.create_namespace_if_not_exists("eosink_it")
    local.reader.create_table(table, schema=Schema(
        NestedField(1, "qty", IntegerType(), required=True),
        NestedField(2, "at", TimestamptzType(), required=False),
        NestedField(3, "day", DateType(), required=False),
        NestedField(4, "price", DecimalType(10, 2), required=False),
        NestedField(5, "buyer", StructType(NestedField(6, "name", StringType(), required=False)), required=False),
    ))
    sink = local.sink(unique, **{"fields.kafka": False, "auto.evolve": False})
    good = records("orders", 2, value=lambda i: {"qty": i + 1, "at": "2024-05-01T12:00:00Z", "day": "2024-05-01", "price": "12.50",
                                                   "buyer": {"name": f"b{i}"}})
    sink.commit(prepare(sink, f"{unique}.w.1.1", good).txn_id)
    row = local.reader.load_table(table).scan().to_arrow().to_pylist()[0]
    assert row["at"] == datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    assert row["day"] == datetime.date(2024, 5, 1) and row["price"] == decimal.Decimal("12.50") and row["buyer"]["name"] in ("b0", "b1")

    for field, bad_value, expected_offset in (("at", "yesterday", 11), ("qty", 2**40, 11), ("qty", None, 11)):
        bad = records("orders", 4, first=10, value=lambda i: {"qty": 1, "at": "2024-05-01T12:00:00Z"})
        bad[3].value = {**bad[3].value, field: bad_value}
        with pytest.raises(RecordError) as e:
            prepare(sink, f"{unique}.w.2.{field}", bad)
        assert (e.value.partition, e.value.offset, e.value.column) == (1, expected_offset, field), str(e.value)
    assert len(local.rows(table)) == 2


def test_partition_spec_from_config_one_file_per_partition(local: Target, unique: str) -> None:
    table = local.config["iceberg.table"]
    try:
        import pyiceberg_core  # noqa: F401
    except ImportError:  # every transform but identity needs it: refused up front, not at the first write
        from eosink.connectors.api.errors import ConfigError

        with pytest.raises(ConfigError, match="pyiceberg-core"):
            local.sink(unique, **{"iceberg.partition.fields": "__partition, bucket(4, user)"})
    sink = local.sink(unique, **{"iceberg.partition.fields": "__partition, paid"})
    sink.commit(prepare(sink, f"{unique}.w.1.1", records("orders", 60, partitions=3)).txn_id)
    t = local.reader.load_table(table)
    assert [(f.name, str(f.transform)) for f in t.spec().fields] == [("__partition", "identity"), ("paid", "identity")]
    files = list(t.scan().plan_files())
    assert {f.file.partition[0] for f in files} == {0, 1, 2} and len(files) == 6  # 3 Kafka partitions x paid true/false
    for f in files:  # each file holds one Kafka partition's rows only
        assert set(local.reader.load_table(table).scan(row_filter=f"__partition == {f.file.partition[0]}").to_arrow()
                   .column("__partition").to_pylist()) == {f.file.partition[0]}
    assert len(local.rows(table)) == 60
    assert len(list(t.scan(row_filter="__partition == 2").plan_files())) < len(files)


# -- a REST catalog ---------------------------------------------------------------------------------------
REST_POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Iceberg's REST catalog test server (RESTCatalogServer, from iceberg-open-api's test fixtures)
     over an in-memory JdbcCatalog (sqlite): a real Iceberg REST catalog for tests. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.eosink.tests</groupId>
  <artifactId>iceberg-rest-fixture</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <properties>
    <iceberg.version>1.11.0</iceberg.version><jetty.version>12.1.14</jetty.version><hadoop.version>3.4.1</hadoop.version>
  </properties>
  <dependencies>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-core</artifactId><version>${iceberg.version}</version></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-core</artifactId><version>${iceberg.version}</version><classifier>tests</classifier></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-open-api</artifactId><version>${iceberg.version}</version><classifier>test-fixtures</classifier><type>jar</type></dependency>
    <dependency><groupId>org.eclipse.jetty.ee10</groupId><artifactId>jetty-ee10-servlet</artifactId><version>${jetty.version}</version></dependency>
    <dependency><groupId>org.eclipse.jetty.compression</groupId><artifactId>jetty-compression-server</artifactId><version>${jetty.version}</version></dependency>
    <dependency><groupId>org.eclipse.jetty.compression</groupId><artifactId>jetty-compression-gzip</artifactId><version>${jetty.version}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-api</artifactId><version>${hadoop.version}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-runtime</artifactId><version>${hadoop.version}</version></dependency>
    <dependency><groupId>org.xerial</groupId><artifactId>sqlite-jdbc</artifactId><version>3.49.1.0</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>2.0.17</version></dependency>
  </dependencies>
</project>
"""


def resolve_jars(name: str, pom_dir: Path) -> Path:
    """``eosink.worker.stack.jvm.resolve_jars`` (its cache and Maven lock) for a pom outside worker/stack/jvm."""
    from eosink.worker.stack import jvm

    with mock.patch.object(jvm, "POM_DIR", pom_dir):
        return jvm.resolve_jars(name, name)


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """``(url, warehouse dir)`` of a RESTCatalogServer started for this module, stopped after it."""
    from eosink.worker.stack import jvm

    poms = tmp_path_factory.mktemp("poms")
    (poms / "iceberg-rest-fixture").mkdir()
    (poms / "iceberg-rest-fixture" / "pom.xml").write_text(REST_POM)
    jars = resolve_jars("iceberg-rest-fixture", poms)
    warehouse = tmp_path_factory.mktemp("rest-warehouse")
    port = free_port()
    env = {**os.environ, "CATALOG_REST_PORT": str(port), "CATALOG_WAREHOUSE": f"file://{warehouse}"}
    with open(warehouse.parent / "rest-catalog.log", "wb") as log:
        proc = subprocess.Popen([jvm.java("iceberg-rest"), "-Xmx256m", "-cp", f"{jars}/*", "org.apache.iceberg.rest.RESTCatalogServer"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{url}/v1/config", timeout=2).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(f"REST catalog did not start; see {log.name}") from None
                    time.sleep(0.3)
            yield url, warehouse
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_rest_catalog_commit_and_recovery(rest_catalog: tuple[str, Path], unique: str, tmp_path: Path) -> None:
    url, warehouse = rest_catalog
    cfg = {"iceberg.catalog.type": "rest", "iceberg.catalog.uri": url, "iceberg.catalog.name": "rest",
           "iceberg.table": f"eosink_it.{unique}", "iceberg.pending.location": f"file://{tmp_path}/pending"}
    target = Target(cfg, _fs_lister)
    table = cfg["iceberg.table"]
    sink = target.sink(unique)
    m1 = prepare(sink, f"{unique}.w.1.1", records("orders", 10), epoch=1)
    assert target.rows(table) == []
    sink.commit(m1.txn_id)
    sink.commit(m1.txn_id)
    m2 = prepare(sink, f"{unique}.w.1.2", records("orders", 10, first=5), epoch=1)
    survivor = target.sink(unique)
    assert survivor.recover() == [m2]
    survivor.recover_and_commit(m2)
    assert len(target.rows(table)) == 20
    assert str(warehouse) in target.reader.load_table(table).location()
    with pytest.raises(FencedError):
        prepare(target.sink(unique), f"{unique}.w.0.1", records("orders", 2, first=99), epoch=0)


# -- a reader other than ours: Spark ----------------------------------------------------------------------
SPARK_READER = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    jars, jdbc_url, user, warehouse, catalog, table = sys.argv[1:7]
    spark = (SparkSession.builder.master("local[1]").appName("eosink-iceberg-reader")
             .config("spark.ui.enabled", "false").config("spark.jars", jars)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config(f"spark.sql.catalog.{catalog}", "org.apache.iceberg.spark.SparkCatalog")
             .config(f"spark.sql.catalog.{catalog}.type", "jdbc")
             .config(f"spark.sql.catalog.{catalog}.uri", jdbc_url)
             .config(f"spark.sql.catalog.{catalog}.jdbc.user", user)
             .config(f"spark.sql.catalog.{catalog}.warehouse", warehouse)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    name = f"{catalog}.{table}"
    out = {"rows": [r.asDict() for r in spark.sql(f"SELECT * FROM {name}").collect()],
           "txns": [r[0] for r in spark.sql(f"SELECT summary['eosink.txn'] FROM {name}.snapshots ORDER BY committed_at").collect()]}
    # the compaction recipe of docs/connectors/iceberg.md, on a table whose commits never retry
    spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{table}', options => map('min-input-files', '2'))").collect()
    out["files_after_compaction"] = spark.sql(f"SELECT count(*) FROM {name}.files").collect()[0][0]
    out["rows_after_compaction"] = spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0]
    print("RESULT " + json.dumps(out))
    spark.stop()
""")


@pytest.mark.spark
def test_spark_reads_the_committed_rows_through_iceberg_jdbc_catalog(local: Target, stack, unique: str, pg) -> None:
    """Spark with Iceberg's runtime (Maven Central) and its JdbcCatalog on the same catalog tables.

    Runs in its own process: a JVM holds one SparkContext, and the test session's shared one
    (tests/spark_fixtures.py) has no Iceberg jars and must stay usable for later modules.
    """
    table = local.config["iceberg.table"]
    sink = local.sink(unique)
    m1 = prepare(sink, f"{unique}.w.1.1", records("orders", 30))
    sink.commit(m1.txn_id)
    m2 = prepare(sink, f"{unique}.w.1.2", records("orders", 30, first=15))
    sink.commit(m2.txn_id)
    prepare(sink, f"{unique}.w.1.3", records("orders", 30, first=30))  # prepared only: Spark must not see it
    assert pg.execute("SELECT count(*) FROM iceberg_tables WHERE catalog_name = %s AND table_name = %s",
                      (CATALOG, unique)).fetchone()[0] == 1

    jars = resolve_jars("iceberg-spark", REPO / "connectors" / "jvm")
    user, _, hostpart = stack.postgres_dsn.split("://", 1)[1].rpartition("@")
    argv = [",".join(str(p) for p in sorted(jars.glob("*.jar"))), f"jdbc:postgresql://{hostpart}", user.split(":")[0],
            local.config["iceberg.warehouse"], CATALOG, table]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", SPARK_READER, *argv], capture_output=True, text=True, env=env, timeout=600)
    result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert done.returncode == 0 and result, f"spark reader failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    out = json.loads(result[len("RESULT "):])
    seen = sorted((r["__partition"], r["__offset"]) for r in out["rows"])
    expected = sorted((r.partition, r.offset) for r in records("orders", 30) + records("orders", 30, first=15))
    assert seen == expected, "Spark must see each committed record once and nothing prepared"
    assert {r["id"] for r in out["rows"]} == set(range(30))
    assert out["txns"] == [m1.txn_id, m2.txn_id]
    assert out["rows_after_compaction"] == 60 and out["files_after_compaction"] == 1

    sink.commit(f"{unique}.w.1.3")  # our commit still works after Spark rewrote the table
    assert len(local.rows(table)) == 90


def test_a_namespace_created_by_another_worker_at_the_same_moment_is_not_an_error(local: Target, unique: str,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers starting a connector together both create its namespace: the SQL catalog checks,
    then inserts, so the later insert hits the catalog's unique key. Forced here: the namespace exists,
    but the creator's existence check answers as it would have a moment before the other's commit."""
    from eosink.connectors.iceberg.tables import ensure_namespace

    namespace = f"race_{unique}"
    cat = load_catalog(CATALOG, type="sql", uri=local.config["iceberg.catalog.uri"],
                       warehouse=local.config["iceberg.warehouse"])
    cat.create_namespace(namespace)
    try:
        real = cat.namespace_exists
        answers = iter([False])  # the first check only: the creator's own, before the other's commit
        monkeypatch.setattr(cat, "namespace_exists", lambda ns: next(answers, real(ns)))
        ensure_namespace(cat, namespace)  # the insert fails on the unique key; the namespace is there: fine
        monkeypatch.setattr(cat, "namespace_exists", lambda ns: False)
        with pytest.raises(Exception, match="duplicate key|UNIQUE|IntegrityError"):
            ensure_namespace(cat, namespace)  # when it truly is not there, the creation's error stands
    finally:
        monkeypatch.undo()
        cat.drop_namespace(namespace)
