"""Kafka Connect's JSON with schemas (``value.converter.schemas.enable=true``) through real workers: the
payload of every envelope reaches PostgreSQL, files and S3 exactly once across a SIGKILL, and what the
files hold is the payload's own bytes, as the producer wrote them (cut out of the envelope, not re-encoded).
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.faultkit import Publisher, Rig


@pytest.mark.chaos
def test_worker_sigkilled_while_reading_connect_envelopes_delivers_each_payload_once(stack, kafka_admin, unique,
                                                                                    tmp_path):
    rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
              tmp=tmp_path, name=unique, s3=stack.s3, envelope=True)
    try:
        w1, w2 = rig.start("w1"), rig.start("w2")
        rig.wait_running({w1.worker_id, w2.worker_id})
        publisher = Publisher(stack.kafka_bootstrap, rig.topic, pause=0.05, envelope=True)
        publisher.start()
        time.sleep(4)
        w1.signal(signal.SIGKILL)
        assert w1.wait(10) == -signal.SIGKILL
        time.sleep(3)
        publisher.stop()
        assert publisher.aborted and len(publisher.committed) > 500, (len(publisher.committed), len(publisher.aborted))
        rig.wait_delivered(publisher.committed, timeout=120)
        rig.assert_exactly_once(publisher.committed, publisher.aborted)
        lines = [line for f in (rig.out / rig.connector / "committed").glob("*.jsonl") for line in f.read_bytes().splitlines()]
        assert lines and all(set(json.loads(line)["value"]) == {"id", "payload"} for line in lines)  # no schema
        # The producer's bytes (json.dumps' ", " and ": "), not a re-encoding of the decoded payload.
        assert all(b'"value":{"id": "r-' in line and b'", "payload": "xxx' in line for line in lines), lines[0]
    finally:
        rig.stop()
        kafka_admin.delete_topics([rig.topic])[rig.topic].result(30)
