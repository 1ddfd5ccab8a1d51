"""Who the demo acts as, and where, on an open stack and on a secure one (``eosink stack up --secure``).

The demo does the same things on both: reset its topic, table, lake, archive and connector state;
publish from Spark; start a worker; register ``configs/demo-orders*.json`` through the REST API; count
every sink. On the open stack one all-powerful identity does all of it. On the secure stack each step
runs as the principal a production deployment would use, with exactly the grants docs/operations/security.md lists:

- the Spark job publishes as ``eosink-publisher`` (outbox topic ``outbox.*``, job ``outbox.*`` so its
  transactional.ids fall under the granted ``eosink-outbox.`` prefix);
- the worker consumes as ``eosink-worker``, writes PostgreSQL as ``eosink_sink`` (password from the
  stack's pgpass file, TLS verified), S3 and the Iceberg warehouse as ``eosink-sink`` (one bucket), and
  serves its REST API over TLS with basic auth, which the CLI calls with the stack's CA;
- only the demo's own set-up and counting use the stack's administrators (Kafka ``admin`` to create the
  topic, MinIO's root user to empty the prefixes), as an operator's tooling would.

Secrets reach the worker as ``${file:...}`` references or environment variables, never as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eosink.worker.stack.endpoints import Endpoints

CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # the checkout's configs/


@dataclass(frozen=True)
class DemoAccess:
    """Names and client settings of one demo run; :func:`for_stack` picks them for the stack it runs on."""

    secure: bool
    config: Path
    topic: str
    job: str
    table: str  # as the counting connection names it
    kafka_admin: dict[str, Any]  # librdkafka settings to create and delete the topic
    kafka_publisher: dict[str, Any]  # librdkafka settings of the Spark job and the aborted transaction
    aborted_txn_prefix: str
    pg_dsn: str  # reset the bookkeeping and count the rows
    s3_admin: dict[str, Any]  # boto3 client kwargs to empty the lake and the archive
    lake_bucket: str
    lake_prefix: str  # warehouse location inside the bucket
    archive_bucket: str
    archive_prefix: str  # the S3 sink's s3.prefix ("" = the bucket's root)
    connector_env: dict[str, str]  # what the connector config reads through ${env:...}
    worker_env: dict[str, str] = field(default_factory=dict)  # REST TLS and credentials of the worker
    cli_env: dict[str, str] = field(default_factory=dict)  # what `eosink connectors` needs to call it
    catalog: dict[str, Any] = field(default_factory=dict)  # pyiceberg load_catalog kwargs to read the lake

    @property
    def rest_scheme(self) -> str:
        return "https" if self.secure else "http"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.lake_bucket}/{self.lake_prefix}" if self.lake_prefix else f"s3://{self.lake_bucket}/warehouse"


def for_stack(ep: Endpoints, home: Path) -> DemoAccess:
    return _secure(ep, home) if ep.secure else _open(ep)


def _open(ep: Endpoints) -> DemoAccess:
    user_host = ep.postgres_dsn.split("://", 1)[1]
    catalog_uri = f"postgresql+psycopg2://{user_host}"
    s3 = {"s3.endpoint": ep.s3["endpoint_url"], "s3.access-key-id": ep.s3["aws_access_key_id"],
          "s3.secret-access-key": ep.s3["aws_secret_access_key"], "s3.region": "us-east-1"}
    return DemoAccess(
        secure=False, config=CONFIGS / "demo-orders.json", topic="eosink-demo-orders", job="orders", table="demo_orders",
        kafka_admin={"bootstrap.servers": ep.kafka_bootstrap}, kafka_publisher={"bootstrap.servers": ep.kafka_bootstrap},
        aborted_txn_prefix="eosink-demo-aborted-", pg_dsn=ep.postgres_dsn, s3_admin=dict(ep.s3),
        lake_bucket="eosink-demo-lake", lake_prefix="", archive_bucket="eosink-demo-archive", archive_prefix="",
        connector_env={
            "EOSINK_PG_DSN": ep.postgres_dsn,
            "EOSINK_ICEBERG_CATALOG_URI": catalog_uri,
            "EOSINK_S3_ENDPOINT": ep.s3["endpoint_url"],
            "EOSINK_S3_ACCESS_KEY_ID": ep.s3["aws_access_key_id"],
            "EOSINK_S3_SECRET_ACCESS_KEY": ep.s3["aws_secret_access_key"],
        },
        catalog={"type": "sql", "uri": catalog_uri, "warehouse": "s3://eosink-demo-lake/warehouse", **s3},
    )


def _secure(ep: Endpoints, home: Path) -> DemoAccess:
    from eosink.worker.stack import secure
    from eosink.worker.stack.components.kafka_config import client_config
    from eosink.worker.stack.layout import StackLayout

    layout = StackLayout.for_home(home)
    m = secure.material(layout)
    raw = ep.raw or {}
    pg = raw["postgres"]
    bucket = (ep.security or {})["sink_bucket"]
    catalog_uri = (f"postgresql+psycopg2://{pg['sink_user']}@{ep.postgres_dsn.split('@', 1)[1].split('/', 1)[0]}/eosink"
                   f"?sslmode=verify-full&sslrootcert={m.ca_cert}&passfile={pg['passfile']}")
    sink_secret = m.password("s3.sink")
    rest_auth = f"{m.user('rest')}:{m.reference('rest')}"
    return DemoAccess(
        secure=True, config=CONFIGS / "demo-orders-secure.json", topic="outbox.demo-orders", job="outbox.demo",
        table=f"{pg['sink_schema']}.demo_orders",
        kafka_admin={"bootstrap.servers": ep.kafka_bootstrap, **client_config(layout, "kafka.admin")},
        kafka_publisher={"bootstrap.servers": ep.kafka_bootstrap, **client_config(layout, "kafka.publisher")},
        aborted_txn_prefix="eosink-outbox.demo-aborted-", pg_dsn=pg["sink_dsn"],
        s3_admin={**ep.s3, "aws_access_key_id": m.user("s3.root"), "aws_secret_access_key": m.password("s3.root")},
        lake_bucket=bucket, lake_prefix="demo-lake", archive_bucket=bucket, archive_prefix="demo-archive",
        connector_env={
            "EOSINK_PG_SINK_DSN": pg["sink_dsn"],  # TLS verified against the stack's CA; the password from its pgpass file
            "EOSINK_ICEBERG_CATALOG_URI": catalog_uri,
            "EOSINK_S3_ENDPOINT": ep.s3["endpoint_url"],
            "EOSINK_S3_CA_BUNDLE": str(m.ca_cert),
            "EOSINK_S3_ACCESS_KEY_ID": m.user("s3.sink"),
            "EOSINK_S3_SECRET_ACCESS_KEY": sink_secret,
            "EOSINK_S3_BUCKET": bucket,
        },
        worker_env={"EOSINK_REST_TLS_CERT": str(m.server_cert), "EOSINK_REST_TLS_KEY": str(m.server_key),
                    "EOSINK_REST_BASIC_AUTH": rest_auth},
        cli_env={"EOSINK_REST_CA": str(m.ca_cert), "EOSINK_REST_BASIC_AUTH": rest_auth},
        catalog={"type": "sql", "uri": catalog_uri, "warehouse": f"s3://{bucket}/demo-lake", "s3.endpoint": ep.s3["endpoint_url"],
                 "s3.access-key-id": m.user("s3.sink"), "s3.secret-access-key": sink_secret, "s3.region": ep.s3["region_name"],
                 "s3.ca-bundle": str(m.ca_cert), "py-io-impl": "eosink.connectors.iceberg.tlsio.CaBundleFileIO"},
    )
