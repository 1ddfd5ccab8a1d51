"""Process-level crash tests: a real worker is SIGKILLed at each step of the commit cycle
(``EOSINK_FAULT``), restarted, and the sinks (PostgreSQL, files and S3 behind one fan-out
connector) are counted: every committed outbox record exactly
once, nothing from aborted Kafka transactions, no prepared transaction left unresolved.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import boto3
import pytest

from tests.procs import WorkerProcess, fanout_config, publish, register, wait_until

pytestmark = pytest.mark.chaos

PARTITIONS = 3


def _fs_ids(root: Path) -> list[str]:
    ids = []
    for f in sorted((root / "committed").glob("*.jsonl")):
        ids.extend(json.loads(line)["value"]["id"] for line in f.read_text().splitlines() if line)
    return ids


def _s3_keys(client, bucket: str, prefix: str) -> list[str]:
    try:
        pages = list(client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))
    except client.exceptions.NoSuchBucket:
        return []
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _s3_ids(client, bucket: str, connector: str) -> list[str]:
    """What a reader of the S3 sink sees: the JSON Lines objects under <connector>/."""
    ids = []
    for key in _s3_keys(client, bucket, connector + "/"):
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        ids.extend(json.loads(line)["id"] for line in body.splitlines() if line)
    return ids


def _pg_ids(pg, table: str) -> list[str]:
    if not pg.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
        return []
    return [r[0] for r in pg.execute(f'SELECT id FROM "{table}"').fetchall()]


def _pg_prepared(pg, connector: str) -> list[str]:
    return [r[0] for r in pg.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector}.%",))]


@pytest.mark.parametrize(
    "point",
    ["begin", "flush", "pre_commit", "after_prepare", "after_decide", "mid_commit", "after_commit", "recover"],
)
def test_worker_killed_at_step_delivers_exactly_once_after_restart(point, stack, make_topic, unique, pg, tmp_path):
    topic = make_topic(PARTITIONS)
    connector = unique.replace("_", "-")
    out = tmp_path / "out"
    s3 = boto3.client("s3", **stack.s3)
    bucket = connector[:63].strip("-")
    committed, aborted = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=12, per_txn=250, aborted_every=4)
    register(stack.zookeeper_hosts, unique, connector, fanout_config(stack, unique, topic, out, bucket))
    # The 2nd time the point is reached, so that some cycles have committed before the crash.
    # For "recover": first leave a prepared txn behind (killed after prepare), then kill the
    # restarted worker in the middle of recovering it.
    first = WorkerProcess(stack, unique, "w-crash", tmp_path, fault="after_prepare:2" if point == "recover" else f"{point}:2")
    rc = first.wait(90)
    assert rc == -signal.SIGKILL, f"worker was not killed: rc={rc}\n{first.log_text()[-3000:]}"
    if point == "recover":
        again = WorkerProcess(stack, unique, "w-crash-in-recovery", tmp_path, fault="recover:1")
        rc = again.wait(90)
        assert rc == -signal.SIGKILL, f"worker was not killed in recovery: rc={rc}\n{again.log_text()[-3000:]}"

    second = WorkerProcess(stack, unique, "w-restarted", tmp_path)
    try:
        wait_until(lambda: len(_fs_ids(out / connector)) >= len(committed) and len(_pg_ids(pg, unique)) >= len(committed)
                   and len(_s3_ids(s3, bucket, connector)) >= len(committed),
                   120, f"delivery of {len(committed)} records after the restart")
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]

    for name, ids in (("postgres", _pg_ids(pg, unique)), ("filesystem", _fs_ids(out / connector)),
                      ("s3", _s3_ids(s3, bucket, connector))):
        assert len(ids) == len(set(ids)), f"{name}: duplicates after a crash at {point}"
        assert set(ids) == committed, f"{name}: missing {len(committed - set(ids))}, from aborted {len(set(ids) & aborted)}"
    assert not list((out / connector / "prepared").glob("*.jsonl")), "filesystem: a prepared txn was left"
    assert _pg_prepared(pg, connector) == [], "postgres: a prepared txn was left"
    assert _s3_keys(s3, bucket, f"__pending__/{connector}/") == [], "s3: a prepared txn or its leftovers were left"
