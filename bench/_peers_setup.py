"""The topic, the connector configurations and the checks of bench/bench_peers.py.

Every record is Kafka Connect's JSON envelope (``JsonConverter`` with ``schemas.enable=true``):
``{"schema": <a struct of the order's nine fields>, "payload": <the order>}``, ~770 bytes, key the
id as a string; the payload is ``bench._data.order(i)``. Both sides of each comparison read it:
Debezium's and Iceberg's sinks through ``JsonConverter``, eosink with
``value.converter.schemas.enable=true``.

``--formats avro``: the same orders as Avro in Confluent's wire format (``0x00``, the schema's 4-byte
id, the payload; :data:`bench.e2e_avro.ORDER_AVRO` registered as ``<topic>-value`` through the stack
registry's Confluent API). Debezium reads them with Apicurio's ``AvroConverter`` for Kafka Connect
(:func:`connect_avro_worker`), eosink with ``value.converter=io.confluent.connect.avro.AvroConverter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from bench import bench_worker
from bench._data import ORDER_SCHEMA, order, order_envelope
from bench.bench_worker import IdCheck

DEBEZIUM_BATCH = 5000  # batch.size and consumer.max.poll.records: Debezium's advice for throughput
NAMESPACE = "peers"
SCHEMA = ORDER_SCHEMA
envelope = order_envelope  # record i: Kafka Connect's {"schema", "payload"} envelope around order(i)


def prefill(bootstrap: str, topic: str, n: int, partitions: int, value: Callable[[int], bytes] = envelope) -> None:
    """Make ``topic`` hold exactly ``n`` committed records ``value(i)`` (record i in partition i % P), unless it does."""
    if not bench_worker.prefill(bootstrap, topic, n, partitions, value):
        print(f"  {topic} already holds {n:,} records in {partitions} partitions")


def avro_value(registry_url: str, topic: str) -> Callable[[int], bytes]:
    """Record i as Avro in Confluent's wire format, the schema registered as ``<topic>-value`` (once: the same id)."""
    from bench.e2e_avro import encoder

    return encoder(registry_url, topic, "order")


#: Apicurio Registry's converter for Kafka Connect, reading Confluent's wire format from the stack's registry.
APICURIO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
APICURIO_VERSION = "2.6.13.Final"  # worker/stack/jvm/apicurio-converter/pom.xml


def apicurio_api(registry_url: str) -> str:
    """Apicurio's own v2 API beside its Confluent one (``.../apis/ccompat/v7`` -> ``.../apis/registry/v2``)."""
    return registry_url.split("/apis/", 1)[0] + "/apis/registry/v2"


def connect_avro_worker(registry_url: str) -> dict[str, Any]:
    """The Connect worker's value converter for the Avro topic: Apicurio 2.6's ``AvroConverter`` with Confluent's
    framing (no headers; a 4-byte id, which the registry's Confluent API hands out as the content id)."""
    return {
        "value.converter": APICURIO_CONVERTER, "value.converter.schemas.enable": None,
        "value.converter.apicurio.registry.url": apicurio_api(registry_url),
        "value.converter.apicurio.registry.headers.enabled": "false",
        "value.converter.apicurio.registry.id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler",
        "value.converter.apicurio.registry.use-id": "contentId",
    }


def create_topic(bootstrap: str, topic: str, delete: bool = False) -> None:
    """A fresh one-partition topic (Iceberg's control topic); ``delete``: delete it instead."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    if delete:  # best effort: it may not have been created
        with suppress(KafkaException):
            admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    else:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


# ---------------------------------------------------------------------------------------- PostgreSQL
def jdbc_url(dsn: str, extra: str = "") -> tuple[str, str, str]:
    """(JDBC URL, user, password) of a ``postgresql://user[:password]@host:port/db`` DSN."""
    u = urlsplit(dsn)
    return f"jdbc:postgresql://{u.hostname}:{u.port or 5432}{u.path}{extra}", u.username or "", u.password or ""


def debezium_config(name: str, dsn: str, topic: str, table: str, mode: str) -> dict[str, Any]:
    """Debezium's JDBC sink, tuned as its docs advise: large batches, PostgreSQL's batched inserts rewritten."""
    url, user, password = jdbc_url(dsn, "?reWriteBatchedInserts=true")
    cfg: dict[str, Any] = {
        "name": name, "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": 1, "topics": topic,
        "connection.url": url, "connection.username": user, "connection.password": password or "unused",
        "insert.mode": mode, "schema.evolution": "basic", "collection.name.format": table, "table.name.format": table,
        "batch.size": DEBEZIUM_BATCH, "primary.key.mode": "none", "quote.identifiers": "true",  # a column "user"
    }
    if mode == "upsert":
        cfg |= {"primary.key.mode": "record_value", "primary.key.fields": "id"}
    return cfg


def eosink_converter(registry_url: str | None) -> dict[str, Any]:
    """eosink's value converter: the JSON envelope's, or (a registry URL) Confluent's Avro converter's keys."""
    if registry_url is None:
        return {"value.converter": "json", "value.converter.schemas.enable": "true"}
    return {"value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": registry_url}


def eosink_pg_config(dsn: str, topic: str, table: str, mode: str, registry_url: str | None = None) -> dict[str, Any]:
    """eosink's postgres connector reading the same records, every other key at its default."""
    cfg: dict[str, Any] = {
        "connector.class": "postgres", "tasks.max": "1", "topics": topic, "connection.url": dsn, "insert.mode": mode,
        "auto.create": "true", "fields.kafka": "false", "table.name.format": table, **eosink_converter(registry_url),
    }
    if mode == "upsert":
        cfg |= {"pk.mode": "record_value", "pk.fields": "id"}
    return cfg


class PgTable:
    """A table one side writes: its row count as a probe, its ids checked, then dropped."""

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.count_sql = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))

    def count(self) -> int:
        try:
            row = self.conn.execute(self.count_sql).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        except psycopg.OperationalError:  # the server restarted under the probe: ask again next time
            self.conn = psycopg.connect(self.dsn, autocommit=True)
            return 0
        return int(row[0]) if row else 0

    def check(self, n: int) -> str:
        """Exactly the ids 0..n-1, each once, and every row's columns equal to ``order(id)``'s fields."""
        ids = IdCheck(n)
        fields = list(order(0))
        differ, first = 0, ""
        query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(map(sql.Identifier, fields)), sql.Identifier(self.table))
        with self.conn.cursor(name=f"check_{self.table}") as cur:  # server-side: 1M rows streamed, not held
            self.conn.autocommit = False
            cur.itersize = 20_000
            cur.execute(query)
            for row in cur:
                i = int(row[0])
                ids.add(i)
                if 0 <= i < n and dict(zip(fields, row, strict=True)) != order(i):
                    differ += 1
                    first = first or f" (first: id {i})"
        self.conn.rollback()
        self.conn.autocommit = True
        ok, text = ids.summary()
        ok = ok and differ == 0
        text = text.replace("lines", "rows") + (", values as published" if differ == 0 else f", {differ:,} rows of other values{first}")
        return f"{'ok' if ok else 'FAILED'}: {text}"

    def _reconnect(self) -> None:
        if self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True)

    def forget(self, connector: str) -> None:
        """eosink's bookkeeping rows of ``connector`` (offsets, committed txns, manifests), as bench_e2e drops them."""
        self._reconnect()
        for t in ("eosink_offsets", "eosink_committed_txns", "eosink_txn_manifest"):
            with suppress(psycopg.errors.UndefinedTable):
                self.conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(t)), (connector,))

    def drop(self) -> None:
        """The table, and the staging tables eosink's upsert leaves beside it (``<table>__eosink_stage_*``)."""
        self._reconnect()
        like = self.table.replace("_", r"\_") + r"\_\_eosink\_stage\_%"
        stages = [t for (t,) in self.conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (like,))]
        for name in (self.table, *stages):
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        self.conn.close()


# ---------------------------------------------------------------------------------------- Iceberg
def iceberg_connect_config(name: str, ep: Any, topic: str, table: str, warehouse: str, control: str,
                           interval_ms: int) -> dict[str, Any]:
    """Apache Iceberg's sink: the JDBC catalog in the stack's PostgreSQL, S3FileIO on its MinIO."""
    url, user, password = jdbc_url(ep.postgres_dsn)
    return {
        "name": name, "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector", "tasks.max": 1, "topics": topic,
        "iceberg.tables": table, "iceberg.tables.auto-create-enabled": "true", "iceberg.control.topic": control,
        "iceberg.control.commit.interval-ms": interval_ms,
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog", "iceberg.catalog.uri": url,
        "iceberg.catalog.jdbc.user": user, "iceberg.catalog.jdbc.password": password or "unused",
        "iceberg.catalog.warehouse": warehouse, "iceberg.catalog.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "iceberg.catalog.s3.endpoint": ep.s3["endpoint_url"], "iceberg.catalog.s3.path-style-access": "true",
        "iceberg.catalog.s3.access-key-id": ep.s3["aws_access_key_id"],
        "iceberg.catalog.s3.secret-access-key": ep.s3["aws_secret_access_key"],
        "iceberg.catalog.client.region": ep.s3["region_name"],
    }


def sqlalchemy_uri(dsn: str) -> str:
    return "postgresql+psycopg2://" + dsn.split("://", 1)[1]


def eosink_iceberg_config(ep: Any, topic: str, table: str, warehouse: str, interval_ms: int) -> dict[str, Any]:
    """eosink's iceberg connector on the same catalog (same name, same database) and warehouse."""
    return {
        "connector.class": "iceberg", "tasks.max": "1", "topics": topic, "iceberg.catalog.uri": sqlalchemy_uri(ep.postgres_dsn),
        "iceberg.catalog.name": "iceberg", "iceberg.warehouse": warehouse, "iceberg.table": table,
        "s3.endpoint": ep.s3["endpoint_url"], "s3.access-key-id": ep.s3["aws_access_key_id"],
        "s3.secret-access-key": ep.s3["aws_secret_access_key"], "s3.region": ep.s3["region_name"],
        "fields.kafka": "false", "commit.interval.ms": str(interval_ms),
        "value.converter": "json", "value.converter.schemas.enable": "true",
    }


@contextmanager
def iceberg_catalog(ep: Any, warehouse: str) -> Iterator[Any]:
    """pyiceberg's view of the catalog both sinks use (catalog name ``iceberg``), namespace created."""
    import boto3
    from pyiceberg.catalog.sql import SqlCatalog

    s3 = boto3.client("s3", **ep.s3)
    bucket = warehouse.split("/")[2]
    try:
        s3.create_bucket(Bucket=bucket)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
    catalog = SqlCatalog("iceberg", uri=sqlalchemy_uri(ep.postgres_dsn), warehouse=warehouse,
                         **{"s3.endpoint": ep.s3["endpoint_url"], "s3.access-key-id": ep.s3["aws_access_key_id"],
                            "s3.secret-access-key": ep.s3["aws_secret_access_key"], "s3.region": ep.s3["region_name"]})
    catalog.create_namespace_if_not_exists(NAMESPACE)
    yield catalog


class IcebergTable:
    """A table one side writes: the records of its current snapshot as a probe; ids, files, snapshots."""

    def __init__(self, catalog: Any, ident: str) -> None:
        self.catalog, self.ident = catalog, ident

    def count(self) -> int:
        from pyiceberg.exceptions import NoSuchTableError
        from sqlalchemy.exc import OperationalError

        try:
            snap = self.catalog.load_table(self.ident).current_snapshot()
        except (NoSuchTableError, OperationalError):  # not created yet; the catalog's server restarted
            return 0
        return int(snap.summary["total-records"]) if snap is not None and snap.summary else 0

    def check(self, n: int) -> tuple[str, dict[str, int]]:
        table = self.catalog.load_table(self.ident)
        ids = IdCheck(n)
        for i in table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist():
            ids.add(int(i))
        ok, text = ids.summary()
        snap = table.current_snapshot()
        files = int(snap.summary["total-data-files"]) if snap is not None and snap.summary else 0
        stats = {"snapshots": len(table.snapshots()), "data_files": files}
        return f"{'ok' if ok else 'FAILED'}: {text.replace('lines', 'rows')}", stats

    def drop(self) -> None:
        try:
            self.catalog.purge_table(self.ident)
        except Exception:  # noqa: BLE001 - best effort: every run has tables of its own
            pass
