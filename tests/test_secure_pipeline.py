"""The pipeline's essential cases on the locked-down stack (``eosink stack up --secure``).

Every process runs as the principal a production deployment grants, with nothing more than the
least-privilege tables of docs/operations/security.md: the publisher as ``eosink-publisher`` (outbox topics ``outbox.*``,
transactional.ids ``eosink-outbox.*``), workers as ``eosink-worker`` over SASL_SSL, as the cluster's
ZooKeeper digest principal over TLS, as ``eosink_sink`` in PostgreSQL (scram over TLS, a schema of
its own) and as ``eosink-sink`` in MinIO (one bucket, over TLS). What the open suites prove -
``test_crash.py``'s SIGKILL at a step of the cycle, ``test_cluster.py``'s kill -9 and SIGSTOP zombie,
the demo end to end - is proven again here, counted from the sinks the same way.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SECURE_HOME, secure_kafka_client
from tests.procs import WorkerProcess, publish, register, wait_until

pytestmark = [pytest.mark.secure, pytest.mark.chaos]

PARTITIONS = 3
SESSION = 4.0


class SecurePipeline:
    """One connector on the secure stack: its outbox topic, its sinks, its workers, and how to count them."""

    def __init__(self, stack: Any, material: Any, unique: str, tmp: Path, zk_env: dict[str, str], kafka_env: dict[str, str],
                 make_topic: Any) -> None:
        from eosink.worker.engine.zk import ZkCredentials

        self.stack, self.material, self.unique, self.tmp = stack, material, unique, tmp
        self.cluster = unique
        self.connector = unique.replace("_", "-")
        self.topic = make_topic(PARTITIONS, f"outbox.{unique}")
        self.table = unique
        self.out = tmp / "out"
        self.bucket = stack.security["sink_bucket"]
        self.prefix = self.connector
        self.env = {**kafka_env, **zk_env}
        self.zk_credentials = ZkCredentials(material.user("zookeeper"), material.password("zookeeper"))
        self.publisher = secure_kafka_client("kafka.publisher")
        self.committed: set[str] = set()
        self.aborted: set[str] = set()
        self.batches = 0
        self.workers: dict[str, WorkerProcess] = {}

    # -- set-up -----------------------------------------------------------------------------------------------
    def register(self, sinks: str = "db,files,archive", **extra: str) -> None:
        pg = self.stack.raw["postgres"]
        config = {
            "connector.class": "fanout", "topics": self.topic, "sinks": sinks,
            "sinks.db.connector.class": "postgres", "sinks.db.connection.url": pg["sink_dsn"],
            "sinks.db.table.name.format": self.table,
            "sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(self.out),
            "sinks.archive.connector.class": "s3", "sinks.archive.s3.bucket.name": self.bucket,
            "sinks.archive.s3.prefix": self.prefix, "sinks.archive.s3.bucket.create": "false",
            "sinks.archive.s3.endpoint.url": self.stack.s3["endpoint_url"], "sinks.archive.aws.ca.bundle": str(self.material.ca_cert),
            "sinks.archive.aws.access.key.id": self.material.user("s3.sink"),
            "sinks.archive.aws.secret.access.key": self.material.reference("s3.sink"),
            "commit.interval.ms": "250", "batch.max.records": "400", **extra,
        }
        for name in {"db", "files", "archive"} - set(sinks.split(",")):
            config = {k: v for k, v in config.items() if not k.startswith(f"sinks.{name}.")}
        register(self.stack.zookeeper_hosts, self.cluster, self.connector, config, credentials=self.zk_credentials,
                 ca_file=str(self.material.ca_cert))

    def publish(self, txns: int = 6, per_txn: int = 150) -> None:
        self.batches += 1
        c, a = publish(self.publisher, self.topic, PARTITIONS, txns=txns, per_txn=per_txn, aborted_every=3,
                       prefix=f"b{self.batches}", txn_prefix="eosink-outbox.test-")
        self.committed |= c
        self.aborted |= a

    def start(self, wid: str, **kw: Any) -> WorkerProcess:
        w = WorkerProcess(self.stack, self.cluster, wid, self.tmp, session_timeout=SESSION, extra_env=self.env, **kw)
        self.workers[wid] = w
        return w

    def stop_all(self) -> dict[str, int]:
        return {wid: w.stop() for wid, w in self.workers.items()}

    # -- counting, each sink read back by itself ----------------------------------------------------------------
    def pg(self) -> Any:
        import psycopg

        return psycopg.connect(self.stack.raw["postgres"]["sink_dsn"], autocommit=True)

    def pg_ids(self) -> list[str]:
        with self.pg() as conn:
            if not conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0]:
                return []
            return [r[0] for r in conn.execute(f'SELECT id FROM "{self.table}"')]

    def pg_prepared(self) -> list[str]:
        with self.pg() as conn:
            return [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{self.connector}.%",))]

    def s3(self) -> Any:
        import boto3

        return boto3.client("s3", **self.stack.s3, aws_access_key_id=self.material.user("s3.root"),
                            aws_secret_access_key=self.material.password("s3.root"))

    def s3_keys(self, prefix: str) -> list[str]:
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def s3_ids(self) -> list[str]:
        client, ids = self.s3(), []
        for key in self.s3_keys(f"{self.prefix}/{self.connector}/"):
            body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
            ids.extend(json.loads(line)["id"] for line in body.splitlines() if line)
        return ids

    def file_ids(self) -> list[str]:
        ids = []
        for f in sorted((self.out / self.connector / "committed").glob("*.jsonl")):
            ids.extend(json.loads(line)["value"]["id"] for line in f.read_text().splitlines() if line)
        return ids

    def sink_ids(self, sinks: str) -> dict[str, list[str]]:
        readers = {"db": self.pg_ids, "files": self.file_ids, "archive": self.s3_ids}
        return {name: readers[name]() for name in sinks.split(",")}

    def wait_delivered(self, sinks: str, timeout: float = 120) -> None:
        wait_until(lambda: all(len(set(ids)) >= len(self.committed) for ids in self.sink_ids(sinks).values()), timeout,
                   f"delivery of {len(self.committed)} records to {sinks}")

    def assert_exactly_once(self, sinks: str, what: str) -> None:
        time.sleep(1.0)  # a few more commit intervals: anything extra would show now
        for name, ids in self.sink_ids(sinks).items():
            assert len(ids) == len(set(ids)), f"{name}: {len(ids) - len(set(ids))} duplicates {what}"
            assert set(ids) == self.committed, (f"{name}: missing {len(self.committed - set(ids))}, "
                                                f"from aborted {len(set(ids) & self.aborted)} {what}")
        if "db" in sinks:
            assert self.pg_prepared() == [], f"postgres: a prepared transaction was left {what}"
        if "files" in sinks:
            assert not list((self.out / self.connector / "prepared").glob("*.jsonl")), f"filesystem: a prepared txn was left {what}"
        if "archive" in sinks:
            assert self.s3_keys(f"{self.prefix}/__pending__/{self.connector}/") == [], f"s3: a prepared txn was left {what}"

@pytest.fixture
def pipeline(secure_stack, secure_material, unique, tmp_path, secure_zookeeper_env, secure_kafka_env, secure_make_topic):
    p = SecurePipeline(secure_stack, secure_material, unique, tmp_path, secure_zookeeper_env, secure_kafka_env, secure_make_topic)
    yield p
    p.stop_all()


@pytest.mark.parametrize("point", ["after_prepare", "after_decide", "mid_commit"])
def test_worker_killed_at_step_on_the_secure_stack_delivers_exactly_once_after_restart(pipeline, point):
    """test_crash.py's essential steps: a prepared-but-undecided, a decided-but-uncommitted and a half-committed
    cycle, each recovered by a restarted worker that holds only the least privileges."""
    pipeline.publish(txns=12, per_txn=250)
    pipeline.register()
    first = pipeline.start("w-crash", fault=f"{point}:2")
    rc = first.wait(120)
    assert rc == -signal.SIGKILL, f"worker was not killed: rc={rc}\n{first.log_text()[-3000:]}"
    second = pipeline.start("w-restarted")
    pipeline.wait_delivered("db,files,archive")
    assert second.stop() == 0, second.log_text()[-3000:]
    pipeline.assert_exactly_once("db,files,archive", f"after a crash at {point}")


def test_killed_worker_partitions_resume_elsewhere_on_the_secure_stack(pipeline):
    pipeline.register(sinks="db", **{"tasks.max": "3"})
    for wid in ("w1", "w2", "w3"):
        pipeline.start(wid)
    pipeline.publish(txns=4)
    pipeline.wait_delivered("db")
    victim = pipeline.workers["w2"]
    victim.signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    pipeline.publish(txns=4)
    pipeline.wait_delivered("db", timeout=SESSION + 120)
    pipeline.assert_exactly_once("db", "after a worker was killed")


def test_zombie_commit_after_sigstop_is_refused_on_the_secure_stack(pipeline):
    """A worker paused holding a prepared transaction, past its session: the others take over; when it
    wakes its decision is refused by ZooKeeper's compare-and-set, on a tree only the principal may write."""
    pipeline.register(sinks="db", **{"tasks.max": "3"})
    pipeline.start("w1")
    pipeline.start("w2")
    zombie = pipeline.start("w3", fault="after_prepare:2:stop")

    def paused() -> bool:
        pipeline.publish(txns=2, per_txn=60)
        return "SIGSTOP to pid" in zombie.log_text()

    wait_until(paused, 120, "w3 to pause holding a prepared txn", interval=0.5)
    time.sleep(SESSION + 1)  # past the session timeout: the others take over and commit more
    pipeline.publish(txns=3)
    pipeline.wait_delivered("db")
    zombie.signal(signal.SIGCONT)
    wait_until(lambda: "decision_fenced" in zombie.log_text(), 30, "the zombie's decision to be refused")
    assert '"cycle_committed"' not in zombie.log_text().split("SIGSTOP to pid", 1)[1]
    pipeline.assert_exactly_once("db", "after a zombie woke")


def test_demo_on_the_secure_stack_runs_each_step_as_its_principal_and_delivers_exactly_once(secure_stack, secure_material):
    """``make secure-demo``: Spark -> outbox -> worker -> PostgreSQL + Iceberg + S3 + files, counted by the demo,
    with the worker's REST API over https with basic auth; no secret shows in its output or the worker's log."""
    import os

    env = {**os.environ, "EOSINK_HOME": str(SECURE_HOME)}
    done = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "demo", "--orders", "5000", "--partitions", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "RESULT: OK - exactly once" in done.stdout, done.stdout[-4000:] + done.stderr[-4000:]
    assert "https://" in done.stdout and "eosink-publisher" in done.stdout
    log = (SECURE_HOME / "logs" / "demo-worker.log").read_text()
    for key, value in secure_material.credentials().items():
        if key.endswith((".password", ".secret_key")):
            assert value not in done.stdout + done.stderr + log, f"{key} shown by the demo or its worker"
