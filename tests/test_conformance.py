"""The sink contract, checked the same way for every connector against its real service.

Every operation idempotent (commit twice, abort twice, abort an unknown txn, commit after a
crash between prepare and commit); ``recover`` lists exactly the prepared transactions; nothing
visible before commit and all of it after; a stale epoch refused; the service restarted between
prepare and commit (for S3, a private MinIO SIGKILLed and started again on the same data
directory: see ``tests.procs.PrivateMinio``). A "crash" is a new sink instance over the same resource, as a restarted
worker process would build it.

Each record's value carries its own coordinates (``{"k": "topic/partition/offset"}``), so
"what a reader sees" is read back the same way from every sink.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eosink.connectors import memory
from eosink.connectors.api.errors import FencedError
from eosink.connectors.api.records import PartitionRange, SinkRecord, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink

TOPIC = "conf"


class Harness:
    """How to build one connector over one resource, read what is visible, and restart its server."""

    name = ""

    def __init__(self, unique: str, tmp: Path, stack: Any) -> None:
        self.unique, self.tmp, self.stack = unique, tmp, stack
        self.connector = unique.replace("_", "-")

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def cls(self) -> type[TwoPhaseCommitSink]:
        raise NotImplementedError

    def make(self) -> TwoPhaseCommitSink:
        sink = self.cls()(self.connector, self.config())
        sink.open()
        return sink

    def visible(self) -> list[str]:
        raise NotImplementedError

    def restartable(self) -> None:
        """Switch to a service that :meth:`restart_service` can restart (most already are)."""

    def restart_service(self) -> None:
        pytest.skip(f"{self.name}: no server process of its own to restart")

    def close(self) -> None:
        pass


class MemoryHarness(Harness):
    name = "memory"

    def config(self):
        return {"memory.store": self.unique}

    def cls(self):
        return memory.MemorySink

    def visible(self):
        return [r.value["k"] for r in memory.store(self.unique).committed]


class FilesystemHarness(Harness):
    name = "filesystem"

    def config(self):
        return {"file.path": str(self.tmp / "fs")}

    def cls(self):
        from eosink.connectors.filesystem import FilesystemSink

        return FilesystemSink

    def visible(self):
        return [row["value"]["k"] for row in self.make().read_committed()]


class PostgresHarness(Harness):
    name = "postgres"

    def config(self):
        return {"connection.url": self.stack.postgres_dsn, "table.name.format": self.unique}

    def cls(self):
        from eosink.connectors.postgres.sink import PostgresSink

        return PostgresSink

    def visible(self):
        import psycopg

        with psycopg.connect(self.stack.postgres_dsn, autocommit=True) as conn:
            if not conn.execute("SELECT to_regclass(%s)", (self.unique,)).fetchone()[0]:
                return []
            return [r[0] for r in conn.execute(f'SELECT k FROM "{self.unique}"')]

    def restart_service(self):
        from eosink.worker.stack import start_component, stop_component

        stop_component("postgres")
        start_component("postgres")


class S3Harness(Harness):
    name = "s3"

    def __init__(self, *a):
        super().__init__(*a)
        self.bucket = self.unique.replace("_", "-")[:60]
        self.s3 = dict(self.stack.s3)
        self.minio: Any = None

    def config(self):
        s3 = self.s3
        return {"s3.bucket.name": self.bucket, "s3.endpoint.url": s3["endpoint_url"], "s3.region": s3["region_name"],
                "aws.access.key.id": s3["aws_access_key_id"], "aws.secret.access.key": s3["aws_secret_access_key"],
                "format": "jsonl"}

    def cls(self):
        from eosink.connectors.s3.sink import S3Sink

        return S3Sink

    def visible(self):
        import boto3

        client = boto3.client("s3", **self.s3)
        out = []
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.connector}/")
        for page in pages:
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                out += [json.loads(line)["k"] for line in body.splitlines() if line]
        return out

    def restartable(self):
        # Not the stack's MinIO, which every other test shares: one of its own, killed at will.
        from tests.procs import PrivateMinio

        self.minio = PrivateMinio(self.tmp / "minio").start()
        self.s3 = self.minio.endpoint()

    def restart_service(self):
        self.minio.kill()  # SIGKILL: no shutdown, whatever it had not synced is what a crash loses
        self.minio.start()

    def close(self):
        if self.minio is not None:
            self.minio.kill()


class HttpHarness(Harness):
    name = "http"

    def __init__(self, *a):
        super().__init__(*a)
        from tests.test_http_sink import ServerProc

        self.server = ServerProc(self.tmp / "http").start()

    def config(self):
        return {"http.url": self.server.url}

    def cls(self):
        from eosink.connectors.http.sink import HttpSink

        return HttpSink

    def visible(self):
        return [json.loads(v)["k"] if isinstance(v, str) else v["k"] for v in self.server.visible(self.connector)]

    def restart_service(self):
        self.server.kill()
        self.server.start()

    def close(self):
        self.server.kill()


class IcebergHarness(Harness):
    name = "iceberg"

    def config(self):
        from tests.test_iceberg_sink import sql_uri

        return {"iceberg.catalog.type": "sql", "iceberg.catalog.uri": sql_uri(self.stack.postgres_dsn),
                "iceberg.warehouse": f"file://{self.tmp}/warehouse", "iceberg.table": f"conformance.{self.unique}"}

    def cls(self):
        from eosink.connectors.iceberg.sink import IcebergSink

        return IcebergSink

    def visible(self):
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        cfg = self.config()
        catalog = load_catalog("eosink", type="sql", uri=cfg["iceberg.catalog.uri"], warehouse=cfg["iceberg.warehouse"])
        try:
            table = catalog.load_table(cfg["iceberg.table"])
        except NoSuchTableError:
            return []
        return table.scan().to_arrow().column("k").to_pylist()

    def restart_service(self):
        PostgresHarness.restart_service(self)  # the SQL catalog's server

    def close(self):
        from pyiceberg.catalog import load_catalog

        cfg = self.config()
        try:
            load_catalog("eosink", type="sql", uri=cfg["iceberg.catalog.uri"]).drop_table(cfg["iceberg.table"])
        except Exception:  # noqa: BLE001 - never created
            pass


HARNESSES: list[type[Harness]] = [MemoryHarness, FilesystemHarness, PostgresHarness, S3Harness, HttpHarness, IcebergHarness]


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def h(request, unique, tmp_path, stack) -> Iterator[Harness]:
    harness = request.param(unique, tmp_path, stack)
    yield harness
    harness.close()


def records(partition: int, first: int, n: int) -> list[SinkRecord]:
    out = []
    for off in range(first, first + n):
        value = {"k": f"{TOPIC}/{partition}/{off}", "n": off}
        out.append(SinkRecord(TOPIC, partition, off, None, value, json.dumps(value).encode()))
    return out


def prepare(sink: TwoPhaseCommitSink, txn: str, recs: list[SinkRecord], epoch: int = 1) -> TxnManifest:
    by_p: dict[int, list[int]] = {}
    for r in recs:
        by_p.setdefault(r.partition, []).append(r.offset)
    m = TxnManifest(txn, sink.connector, tuple(PartitionRange(TOPIC, p, min(o), max(o), epoch) for p, o in sorted(by_p.items())))
    sink.begin_transaction(txn)
    sink.write(recs)
    sink.pre_commit(m)
    return m


def keys(recs: list[SinkRecord]) -> list[str]:
    return [r.value["k"] for r in recs]


def txn(h: Harness, n: int) -> str:
    return f"{h.connector}.w.1.{n}"


def test_nothing_visible_before_commit_and_all_of_it_once_after(h):
    sink = h.make()
    batch = records(0, 0, 20) + records(1, 0, 15)
    prepare(sink, txn(h, 1), batch)
    assert h.visible() == []
    sink.commit(txn(h, 1))
    assert sorted(h.visible()) == sorted(keys(batch))


def test_commit_twice_abort_twice_and_abort_of_an_unknown_txn_are_ok(h):
    sink = h.make()
    a, b = records(0, 0, 10), records(0, 10, 10)
    prepare(sink, txn(h, 1), a)
    sink.commit(txn(h, 1))
    sink.commit(txn(h, 1))
    prepare(sink, txn(h, 2), b)
    sink.abort(txn(h, 2))
    sink.abort(txn(h, 2))
    sink.abort(txn(h, 99))
    assert sorted(h.visible()) == sorted(keys(a))
    assert sink.recover() == []


def test_commit_after_a_crash_between_prepare_and_commit(h):
    batch = records(0, 0, 25)
    m = prepare(h.make(), txn(h, 1), batch)  # the worker dies here
    heir = h.make()
    found = heir.recover()
    assert [x.txn_id for x in found] == [m.txn_id] and found[0].partitions == m.partitions
    heir.recover_and_commit(found[0])
    heir.recover_and_commit(found[0])
    assert sorted(h.visible()) == sorted(keys(batch))
    assert heir.recover() == []


def test_recover_lists_exactly_the_prepared_txns(h):
    sink = h.make()
    prepare(sink, txn(h, 1), records(0, 0, 5))
    sink.commit(txn(h, 1))
    prepare(sink, txn(h, 2), records(0, 5, 5))
    sink.abort(txn(h, 2))
    p3 = prepare(sink, txn(h, 3), records(1, 0, 5))
    p4 = prepare(h.make(), txn(h, 4), records(2, 0, 5))
    found = {m.txn_id: m for m in h.make().recover()}
    assert set(found) == {p3.txn_id, p4.txn_id}
    assert found[p4.txn_id].ranges == p4.ranges


def test_prepare_with_a_stale_epoch_is_refused(h):
    sink = h.make()
    prepare(sink, txn(h, 1), records(0, 0, 5), epoch=2)
    sink.commit(txn(h, 1))
    zombie = h.make()
    with pytest.raises(FencedError):
        prepare(zombie, txn(h, 2), records(0, 5, 5), epoch=1)
    zombie.abort(txn(h, 2))
    assert sorted(h.visible()) == sorted(keys(records(0, 0, 5)))


def test_service_restarted_between_prepare_and_commit(h):
    h.restartable()
    batch = records(0, 0, 30)
    sink = h.make()
    prepare(sink, txn(h, 1), batch)
    h.restart_service()
    heir = h.make()
    assert [m.txn_id for m in heir.recover()] == [txn(h, 1)]
    heir.commit(txn(h, 1))
    assert sorted(h.visible()) == sorted(keys(batch))
