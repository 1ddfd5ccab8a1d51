"""The Iceberg sink's configuration: its keys, and the catalog, FileIO and table properties made from them.

Keys that depend on each other (``iceberg.warehouse`` with the catalog type, where the markers
go) are checked in :func:`settings`, when the sink is built, naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, at_least, non_empty, one_of
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.iceberg import arrow as ia
from eosink.connectors.iceberg import txn as itx
from eosink.connectors.iceberg.tlsio import IMPL as CA_IO_IMPL
from eosink.connectors.iceberg.tlsio import S3_CA_BUNDLE

log = logging.getLogger("eosink.connectors.iceberg.sink")
CATALOG_PROPS_PREFIX = "iceberg.catalog.properties."
TABLE_PROPS_PREFIX = "iceberg.table.properties."
_S3_KEYS = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region")
#: Below this cycle length the sink warns about small files (the engine's default is 1000 ms).
SMALL_FILES_INTERVAL_MS = 10_000

CONFIG = (
    ConfigDef()
    .define("iceberg.catalog.type", Type.STRING, "sql", "sql (a JDBC-style catalog in a database, pyiceberg's SqlCatalog, "
            "readable by Iceberg's JdbcCatalog) or rest (an Iceberg REST catalog).", Importance.HIGH, one_of("sql", "rest"))
    .define("iceberg.catalog.uri", Type.STRING, doc="sql: a SQLAlchemy URL, e.g. postgresql+psycopg2://user@host:5432/db or "
            "sqlite:////path/catalog.db; rest: the catalog's base URL, e.g. http://host:8181.", importance=Importance.HIGH,
            validator=non_empty)
    .define("iceberg.catalog.name", Type.STRING, "eosink", "Catalog name (a SQL catalog keeps it in catalog_name: readers "
            "such as Spark must use the same name).", validator=non_empty)
    .define("iceberg.catalog.credential", Type.PASSWORD, None, "REST: OAuth2 client credential (client_id:secret).")
    .define("iceberg.catalog.token", Type.PASSWORD, None, "REST: bearer token.")
    .define("iceberg.warehouse", Type.STRING, None, "Where new tables live: file:///path or s3://bucket/path (required for "
            "sql; for rest, passed as the catalog's warehouse).", Importance.HIGH)
    .define("iceberg.pending.location", Type.STRING, None, "Where prepared-txn markers live (file:// or s3://); default "
            "<iceberg.warehouse>/eosink-pending. Keep it stable while txns are pending: recovery looks only here.")
    .define("iceberg.table", Type.STRING, "eosink.${topic}", "Target table namespace.table; ${topic} is the topic with '.' "
            "and '-' replaced by '_'. Several tables make a txn commit table by table (see the module docs).",
            Importance.HIGH, non_empty)
    .define("iceberg.partition.fields", Type.LIST, [], "Partition spec of auto-created tables: col, bucket(N, col), "
            "truncate(W, col), year|month|day|hour(col); comma-separated. Existing tables keep theirs.")
    .define("iceberg.commit.attempts", Type.INT, 3, "Attempts per commit when another writer committed first; each one "
            "re-reads the table and re-checks the fence and the txn id.", validator=at_least(1))
    .define("iceberg.fsync", Type.BOOLEAN, True, "fsync data files and markers on a local (file://) warehouse.")
    .define("auto.create", Type.BOOLEAN, True, "Create a missing namespace/table: columns typed from the writer's schema "
            "with an Avro, Protobuf or JSON Schema value.converter (docs/connectors/schema-registry.md), else from the "
            "batch's JSON types.")
    .define("auto.evolve", Type.BOOLEAN, True, "Add an optional column for a new non-null field; with a Schema Registry "
            "value.converter, compare each new schema version with the table first (add its optional fields, promote "
            "int/float/decimal columns, fail the task on a change the table cannot take). Off: such a record is a RecordError.")
    .define("fields.kafka", Type.BOOLEAN, True, "Add required columns __topic string, __partition int, __offset long.")
    .define("s3.endpoint", Type.STRING, None,
            "S3 endpoint URL (MinIO, another S3-compatible server; unset for AWS); passed to pyiceberg's FileIO.")
    .define("s3.access-key-id", Type.STRING, None, "S3 access key id.")
    .define("s3.secret-access-key", Type.PASSWORD, None, "S3 secret access key.")
    .define("s3.region", Type.STRING, None, "S3 region, e.g. us-east-1.")
    .define("s3.ca-bundle", Type.STRING, None, "PEM file of the certificate authorities to trust for an https s3.endpoint "
            "signed by a private CA (the S3 sink's aws.ca.bundle); pyarrow's tls_ca_file_path. Unset: the system's "
            "trust store.", Importance.MEDIUM)
)


@dataclass(frozen=True, slots=True)
class Settings:
    """What the sink connects with: the catalog's properties, its FileIO's, new tables', and where markers go."""

    catalog_props: dict[str, str]
    io_props: dict[str, str]
    table_props: dict[str, str]
    pending: str


def settings(connector: str, c: Mapping[str, Any]) -> Settings:
    """Cross-key rules on the parsed config ``c``, and the properties made from it."""
    src = f"connector '{connector}'"
    if "." not in c["iceberg.table"].replace("${topic}", "t"):
        raise ConfigError("must be namespace.table (e.g. analytics.${topic})", key="iceberg.table", source=src)
    try:
        ia.check_partition_fields(c["iceberg.partition.fields"])
    except ConfigError as exc:
        raise ConfigError(exc.message.split(": ", 1)[-1], key=exc.key, source=src) from None
    warehouse = c["iceberg.warehouse"]
    if c["iceberg.catalog.type"] == "sql" and not warehouse:
        raise ConfigError("is required for iceberg.catalog.type=sql (file:///path or s3://bucket/path)",
                          key="iceberg.warehouse", source=src)
    pending = c["iceberg.pending.location"] or (f"{warehouse.rstrip('/')}/eosink-pending" if warehouse and "://" in warehouse else None)
    if not pending:
        raise ConfigError("is required when iceberg.warehouse is not a file:// or s3:// location", key="iceberg.pending.location",
                          source=src)
    io_props = {k: str(c[k]) for k in _S3_KEYS if c.get(k)}
    io_props |= {k: str(v) for k, v in c.items() if k.startswith("s3.") and k not in io_props and v not in (None, "")}
    io_props |= {k[len(CATALOG_PROPS_PREFIX):]: str(v) for k, v in c.items() if k.startswith(CATALOG_PROPS_PREFIX)}
    catalog_props: dict[str, str] = {"type": c["iceberg.catalog.type"], "uri": c["iceberg.catalog.uri"]}
    if c["iceberg.catalog.type"] == "sql":
        # A pooled connection dead after a database restart would fail one whole cycle: ping first.
        catalog_props["pool_pre_ping"] = "true"
    if c.get(S3_CA_BUNDLE):
        catalog_props["py-io-impl"] = CA_IO_IMPL  # the catalog's table IO must trust the CA too
    catalog_props |= io_props
    if warehouse:
        catalog_props["warehouse"] = warehouse
    for key, prop in (("iceberg.catalog.credential", "credential"), ("iceberg.catalog.token", "token")):
        if c[key]:
            catalog_props[prop] = c[key]
    table_props = {**itx.NO_RETRIES, **{k[len(TABLE_PROPS_PREFIX):]: str(v) for k, v in c.items() if k.startswith(TABLE_PROPS_PREFIX)}}
    return Settings(catalog_props, io_props, table_props, pending)


def warn_small_files(connector: str, config: Mapping[str, Any]) -> None:
    """Every cycle is one snapshot and at least one file per table partition: a short cycle makes
    small files and a metadata file that grows by a snapshot per second. Say so at start."""
    try:
        interval = int(str(config.get("commit.interval.ms", 1000)).strip())
    except ValueError:
        return
    if interval < SMALL_FILES_INTERVAL_MS:
        log.warning("connector %s: commit.interval.ms=%d makes one Iceberg snapshot and at least one data file per table "
                    "partition every cycle; for Iceberg use >= %d (e.g. 60000) with a large batch.max.records / "
                    "batch.max.bytes, and compact regularly", connector, interval, SMALL_FILES_INTERVAL_MS)
