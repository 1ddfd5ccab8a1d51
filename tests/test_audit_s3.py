"""The S3 ``jsonl`` audit compares every line with its record's value: a line rewritten behind the
product's back leaves its record missing and the line foreign, and a line deleted from the middle of
an object leaves only that record missing (the lines after it still match theirs). A window that
starts inside an object audits clean.
"""

from __future__ import annotations

import boto3

from tests.procs import publish, register, wait_until
from tests.test_audit import _audit, _sink, _sink_found, _worker

PARTITIONS = 2


def test_s3_audit_names_a_rewritten_line_and_a_deleted_one(stack, make_topic, unique, tmp_path):
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    bucket = name[:63].strip("-")
    committed, _aborted = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=4, per_txn=200, aborted_every=2)
    register(stack.zookeeper_hosts, unique, name, {
        "connector.class": "s3", "topics": topic, "s3.bucket.name": bucket, "s3.endpoint.url": stack.s3["endpoint_url"],
        "s3.region": stack.s3["region_name"], "aws.access.key.id": stack.s3["aws_access_key_id"],
        "aws.secret.access.key": stack.s3["aws_secret_access_key"], "commit.interval.ms": "200", "batch.max.records": "120"})
    w = _worker(stack, unique, "w-s3-lines", tmp_path)
    try:
        wait_until(lambda: _sink_found(w.url, name, "s3") >= len(committed), 120, f"{len(committed)} records in S3")
        rc, report, text = _audit(w.url, name)
        assert rc == 0 and _sink(report, "s3")["totals"]["found_once"] == len(committed), text
        s3 = boto3.client("s3", **stack.s3)
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{name}/")["Contents"])
        by_part = {int(k.split("/")[-2]): k for k in keys}
        assert set(by_part) == {0, 1}, keys
        first0, last0 = (int(x) for x in by_part[0].rsplit("/", 1)[1].split(".")[0].split("-"))
        # A window starting inside an object (as a continuous round's does): its earlier lines are
        # not under audit, neither foreign nor misplaced.
        rc_mid, mid, mid_text = _audit(w.url, name, "--offsets", f"{topic}:0={first0 + 5}-{last0 + 1}")
        assert rc_mid == 0 and _sink(mid, "s3")["totals"]["foreign"] == 0, mid_text
        # partition 0: the third line rewritten with the same shape; partition 1: the second line deleted.
        body = s3.get_object(Bucket=bucket, Key=by_part[0])["Body"].read().splitlines(keepends=True)
        body[2] = b'{"id":"forged","payload":"' + b"y" * 100 + b'"}\n'
        s3.put_object(Bucket=bucket, Key=by_part[0], Body=b"".join(body))
        first1 = int(by_part[1].rsplit("/", 1)[1].split("-")[0])
        body1 = s3.get_object(Bucket=bucket, Key=by_part[1])["Body"].read().splitlines(keepends=True)
        s3.put_object(Bucket=bucket, Key=by_part[1], Body=b"".join(body1[:1] + body1[2:]))
        rc, report, text = _audit(w.url, name)
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert rc == 1, text
    s = _sink(report, "s3")
    assert (s["totals"]["missing"], s["totals"]["foreign"], s["totals"]["duplicated"]) == (2, 1, 0), text
    parts = {p["partition"]: p for p in s["partitions"]}
    # Offsets of partition p are not consecutive (markers of aborted transactions): name them via the source.
    assert len(parts[0]["culprits"]["missing"]["ranges"]) == 1 and parts[0]["foreign"] == 1, text
    assert parts[0]["culprits"]["foreign"]["ranges"] == ["unplaced"], text
    assert parts[1]["missing"] == 1 and parts[1]["foreign"] == 0, text
    assert int(parts[0]["culprits"]["missing"]["ranges"][0]) > first0, text
    assert int(parts[1]["culprits"]["missing"]["ranges"][0]) > first1, text
