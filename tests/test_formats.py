"""Format versions: what a newer eosink stored is refused with an error naming the place and both
versions, never misread; what a release before the versions stored (no version) is format 1.
The S3 epoch objects' case is in ``tests/test_s3_sink.py``; a cluster of the release reading this
release's data and the other way round, in ``tests/test_upgrade.py``."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import conninfo

from eosink.connectors.api.formats import NewerFormatError
from eosink.connectors.api.records import TxnManifest
from eosink.connectors.postgres.sink import PostgresSink
from eosink.worker import paths
from eosink.worker.engine.decision import Entry
from tests.procs import WorkerProcess, free_port, wait_until

MANIFEST = {"txn": "c.w1.1.1", "connector": "c", "ranges": [["t", 0, 0, 9, 3]]}


def test_manifest_of_a_newer_format_is_refused_naming_where_and_one_without_a_format_is_read():
    assert TxnManifest.from_json(json.dumps(MANIFEST)).ranges[0].epoch == 3  # written before the versions
    assert json.loads(TxnManifest.from_json(json.dumps(MANIFEST)).to_json())["format"] == 1
    with pytest.raises(NewerFormatError, match=r"manifest at s3://b/__pending__/c/x.json is in format 2.*format 1 at most"):
        TxnManifest.from_json(json.dumps({**MANIFEST, "format": 2}), "s3://b/__pending__/c/x.json")


def test_decision_entry_of_a_newer_format_is_refused_naming_its_znode():
    assert Entry.from_bytes(b'{"owner":"w1","epoch":4,"next_offset":10,"txn":"t"}').epoch == 4
    with pytest.raises(NewerFormatError, match=r"decision log entry at ZooKeeper /eosink/c/partitions/x/t-0 is in format 3"):
        Entry.from_bytes(b'{"owner":"w1","epoch":4,"format":3}', "ZooKeeper /eosink/c/partitions/x/t-0")


def test_postgres_bookkeeping_tables_of_a_newer_format_are_refused_when_the_sink_opens(stack, unique):
    db = unique[:50]
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    dsn = conninfo.make_conninfo(stack.postgres_dsn, dbname=db)
    try:
        sink = PostgresSink(unique, {"connection.url": dsn})
        sink.open()  # creates the bookkeeping tables, in format 1
        sink.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            comment = conn.execute("SELECT obj_description('eosink_offsets'::regclass, 'pg_class')").fetchone()
            assert comment == ("eosink bookkeeping format 1",)
            conn.execute("COMMENT ON TABLE eosink_offsets IS 'eosink bookkeeping format 2'")  # a newer release's
        newer = PostgresSink(unique, {"connection.url": dsn})
        with pytest.raises(NewerFormatError, match=rf"table at eosink_offsets in database {db} .* format 2"):
            newer.open()
        newer.close()
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def test_worker_refuses_to_start_on_a_cluster_tree_of_a_newer_format_and_writes_its_own_on_a_new_one(
        stack, zk, unique, tmp_path):
    w = WorkerProcess(stack, unique, "w1", tmp_path, rest_port=free_port())
    try:
        root = paths.cluster_root(unique)
        wait_until(lambda: zk.exists(paths.worker(root, "w1")) is not None, 30, "w1 registered")
        doc = json.loads(zk.get(paths.cluster_format(root))[0])
        assert doc["format"] == 1 and doc["written_by"]
    finally:
        assert w.stop() == 0
    zk.set(paths.cluster_format(root), json.dumps({"format": 2, "written_by": "9.0.0"}).encode())
    late = WorkerProcess(stack, unique, "w2", tmp_path, rest_port=free_port())
    assert late.wait(30) == 2
    log = late.log_text()
    assert f"cluster's ZooKeeper tree at ZooKeeper {stack.zookeeper_hosts}{root}/format is in format 2" in log, log[-2000:]
    assert zk.exists(paths.worker(root, "w2")) is None  # never joined
