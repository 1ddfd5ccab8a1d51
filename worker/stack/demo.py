"""``eosink demo`` (``make demo``): Spark -> outbox -> worker -> PostgreSQL + Iceberg + S3 + files, then count.

Each run starts clean (topic, table, decision log and output of the demo connector are reset),
publishes a deterministic set of orders from a PySpark job in one Kafka transaction per task,
also publishes one transaction that it aborts, starts a worker process, registers
``configs/demo-orders.json`` through the worker's REST API (``eosink connectors --url ... apply``),
waits until everything is delivered, and counts each sink itself: PostgreSQL by SQL, the Iceberg
table by a pyiceberg scan, the S3 archive by reading its objects, the files by their lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from eosink.connectors.api.errors import EosinkError
from eosink.worker import paths
from eosink.worker.stack.demo_access import DemoAccess, for_stack
from eosink.worker.stack.endpoints import Endpoints
from eosink.worker.stack.proc import free_port

CONNECTOR = "demo-orders"
LAKE_TABLE = "demo.orders"


def _lake_catalog(access: DemoAccess) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("eosink", **access.catalog)


def _empty(s3: Any, bucket: str, prefix: str, create: bool) -> None:
    """Delete every object under ``prefix`` (the whole bucket when empty), creating the bucket if asked."""
    if create:
        try:
            s3.create_bucket(Bucket=bucket)
        except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            pass
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def _step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def _reset(ep: Endpoints, access: DemoAccess, home: Path, partitions: int) -> None:
    import psycopg
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = access.topic
    admin = AdminClient(access.kafka_admin)
    if topic in admin.list_topics(timeout=10).topics:
        admin.delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.2)
    for _ in range(50):
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
            break
        except Exception:  # noqa: BLE001 - deletion still settling
            time.sleep(0.3)
    from eosink.worker.clients.zk_auth import stack_security
    from eosink.worker.engine.zk import kazoo_client

    creds, ca = stack_security()  # a secure stack's ZooKeeper: TLS, and a tree the workers' principal's alone
    zk = kazoo_client(ep.zookeeper_hosts, creds, ca)
    zk.start(timeout=20)
    root = paths.cluster_root("default")
    for path in (paths.partitions(root, CONNECTOR), paths.connector(root, CONNECTOR)):
        if zk.exists(path):
            zk.delete(path, recursive=True)
    zk.stop()
    with psycopg.connect(access.pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {access.table}")
        for table in ("eosink_offsets", "eosink_txn_manifest", "eosink_committed_txns"):
            if _row(conn, "SELECT to_regclass(%s)", (table,))[0]:
                conn.execute(f"DELETE FROM {table} WHERE connector = %s", (CONNECTOR,))
    shutil.rmtree(home / "demo-out", ignore_errors=True)
    import boto3

    s3 = boto3.client("s3", **access.s3_admin)
    for bucket, prefix in ((access.lake_bucket, access.lake_prefix), (access.archive_bucket, access.archive_prefix)):
        _empty(s3, bucket, prefix, create=not access.secure)  # the secure stack's bucket is made by the stack
    try:
        _lake_catalog(access).drop_table(LAKE_TABLE)
    except Exception:  # noqa: BLE001 - first run: no table yet
        pass


def _publish_aborted(access: DemoAccess, n: int) -> None:
    """One transaction that is aborted: none of it may ever be delivered."""
    from confluent_kafka import Producer

    p = Producer({**access.kafka_publisher, "transactional.id": f"{access.aborted_txn_prefix}{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(access.topic, key=f"aborted-{i}", value=json.dumps({"order_id": f"aborted-{i}", "customer": "nobody", "amount": 0}))
    p.flush(30)
    p.abort_transaction(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eosink demo")
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args(argv)

    from eosink.worker.stack import load_endpoints

    t0 = time.monotonic()
    ep = load_endpoints()
    home = Path(os.environ.get("EOSINK_HOME", ".eosink")).resolve()
    os.environ["EOSINK_HOME"] = str(home)
    access = for_stack(ep, home)
    os.environ.update(access.connector_env)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    if access.secure:
        _step("a secure stack: Spark publishes as eosink-publisher, the worker reads as eosink-worker and writes as "
              "eosink_sink (PostgreSQL) and eosink-sink (S3), over TLS; its REST API is https with basic auth")
    _step(f"resetting demo topic {access.topic} ({args.partitions} partitions), table {access.table}, lake table {LAKE_TABLE}, "
          f"{access.warehouse}, s3://{access.archive_bucket}/{access.archive_prefix}, connector state")
    _reset(ep, access, home, args.partitions)
    if access.secure:
        # What an operator does once per cluster: workers with credentials never create the cluster's root.
        _step("creating cluster default's ZooKeeper root as its principal, as an operator does once: eosink cluster init")
        init = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "cluster", "init"], check=False,
                              env={**os.environ, **access.worker_env})
        if init.returncode != 0:
            raise EosinkError(f"`eosink cluster init` failed (exit code {init.returncode}, its error is above)", component="demo")

    _step(f"publishing {args.orders} orders from a Spark job (one Kafka transaction per task)")
    from pyspark.sql import SparkSession

    from eosink.spark_jobs.jobs import orders

    spark = (SparkSession.builder.master("local[2]").appName("eosink-demo")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    published = orders.run(spark, run_id=run_id, bootstrap=access.kafka_publisher, orders_topic=access.topic,
                           n_orders=args.orders, partitions=args.partitions, job=access.job, create_topics=False)
    spark.stop()
    _step(f"published: {published}")
    _publish_aborted(access, 1000)
    _step("published 1000 more records in a Kafka transaction that was aborted")

    log_path = home / "logs" / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = int(os.environ.get("EOSINK_REST_PORT") or free_port())
    url = f"{access.rest_scheme}://127.0.0.1:{port}"
    _step(f"starting a worker with its REST API on {url} (log: {log_path})")
    t_worker = time.monotonic()
    with open(log_path, "w") as logf:
        worker = subprocess.Popen([sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--worker-id", "demo-worker",
                                   "--rest-host", "127.0.0.1", "--rest-port", str(port)],
                                  stdout=logf, stderr=subprocess.STDOUT,
                                  env={**os.environ, **access.worker_env, "EOSINK_LOG_FORMAT": "json"})
    try:
        _wait_ready(url, worker, log_path, access.cli_env.get("EOSINK_REST_CA"))
        config = access.config
        shown = config.relative_to(Path.cwd()) if config.is_relative_to(Path.cwd()) else config
        _step(f"registering {shown} through the REST API: eosink connectors --url {url} apply {shown}")
        # A process of its own, as a user would run it (and the demo does not import the CLI that imports it).
        applied = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "connectors", "--url", url, "apply",
                                  str(config)], check=False, env={**os.environ, **access.cli_env})
        if applied.returncode != 0:
            raise EosinkError(f"registering the demo connector failed (exit code {applied.returncode})", component="demo")
        _step("waiting until everything is delivered")
        counts = _wait_delivered(access.pg_dsn, access.table, args.orders, args.timeout, worker, log_path)
    finally:
        worker.send_signal(signal.SIGTERM)
        rc = worker.wait(60)
    delivered_s = time.monotonic() - t_worker
    files = _count_files(home / "demo-out" / CONNECTOR / "committed")
    lake = _count_ids(_lake_ids(access))
    archive = _count_ids(_archive_ids(access))
    ok = (counts["duplicates"] == 0 and counts["missing"] == 0 and counts["from_aborted"] == 0 and files == args.orders
          and rc == 0 and all(c == {"rows": args.orders, "distinct": args.orders, "from_aborted": 0} for c in (lake, archive)))
    print()
    print("verification (each sink read back by itself)")
    print(f"  records published (committed) : {args.orders}")
    print("  records in an aborted txn     : 1000")
    print(f"  PostgreSQL rows delivered     : {counts['rows']}")
    print(f"  distinct ids                  : {counts['distinct']}")
    print(f"  duplicates                    : {counts['duplicates']}")
    print(f"  missing                       : {counts['missing']}")
    print(f"  rows from the aborted txn     : {counts['from_aborted']}")
    print(f"  lines in the filesystem sink  : {files}")
    print(f"  Iceberg table (pyiceberg scan): {lake['rows']} rows, {lake['distinct']} distinct ids, "
          f"{lake['from_aborted']} from the aborted txn")
    print(f"  S3 archive (objects read)     : {archive['rows']} lines, {archive['distinct']} distinct ids, "
          f"{archive['from_aborted']} from the aborted txn")
    print(f"  worker exit code (SIGTERM)    : {rc}")
    print(f"  delivery time                 : {delivered_s:.1f} s ({args.orders / max(delivered_s, 1e-9):,.0f} records/s incl. start-up)")
    print(f"  total demo time               : {time.monotonic() - t0:.1f} s")
    print("RESULT:", "OK - exactly once" if ok else "FAILED")
    return 0 if ok else 1


def _lake_ids(access: DemoAccess) -> list[str]:
    table = _lake_catalog(access).load_table(LAKE_TABLE)
    return table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist()


def _archive_ids(access: DemoAccess) -> list[str]:
    import boto3

    s3 = boto3.client("s3", **access.s3_admin)
    bucket = access.archive_bucket
    prefix = f"{access.archive_prefix}/{CONNECTOR}/" if access.archive_prefix else f"{CONNECTOR}/"
    ids: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            ids += [json.loads(line)["order_id"] for line in body.splitlines() if line]
    return ids


def _count_ids(ids: list[str]) -> dict[str, int]:
    return {"rows": len(ids), "distinct": len(set(ids)), "from_aborted": sum(1 for i in ids if str(i).startswith("aborted-"))}


def _wait_ready(url: str, worker: subprocess.Popen, log_path: Path, ca_file: str | None = None, timeout: float = 60) -> None:
    """Until the worker's ``/ready`` says it joined the cluster (over https verified against ``ca_file`` when given)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise EosinkError(f"the worker exited with code {worker.returncode}", component="demo", log_file=str(log_path))
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise EosinkError(f"the worker was not ready within {timeout:.0f} s", component="demo", log_file=str(log_path))


def _wait_delivered(dsn: str, table: str, expected: int, timeout: float, worker: subprocess.Popen, log_path: Path) -> dict[str, int]:
    import psycopg

    deadline = time.monotonic() + timeout
    counts = {"rows": 0, "distinct": 0, "duplicates": 0, "missing": expected, "from_aborted": 0}
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise EosinkError(f"the worker exited with code {worker.returncode}", component="demo", log_file=str(log_path))
            if _row(conn, "SELECT to_regclass(%s)", (table,))[0]:
                rows, distinct, aborted = _row(
                    conn, f"SELECT count(*), count(DISTINCT order_id), count(*) FILTER (WHERE order_id LIKE 'aborted-%%') FROM {table}"
                )
                counts = {"rows": rows, "distinct": distinct, "duplicates": rows - distinct,
                          "missing": expected - (distinct - aborted), "from_aborted": aborted}
                if distinct >= expected:
                    time.sleep(2 * 1.0)  # two more commit intervals: anything extra would show now
                    rows, distinct = _row(conn, f"SELECT count(*), count(DISTINCT order_id) FROM {table}")
                    counts.update(rows=rows, distinct=distinct, duplicates=rows - distinct)
                    return counts
            time.sleep(0.5)
    raise EosinkError(f"not everything was delivered within {timeout:.0f} s: {counts}", component="demo", log_file=str(log_path))


def _row(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """The one row a query of aggregates returns."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise EosinkError(f"PostgreSQL returned no row for {sql!r}", component="demo")
    return tuple(row)


def _count_files(path: Path) -> int:
    n = 0
    for f in path.glob("*.jsonl"):
        with open(f, "rb") as fh:
            n += sum(1 for _ in fh)
    return n
