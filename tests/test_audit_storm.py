"""A storm of kill -9s audits clean: three workers deliver a topic into PostgreSQL, files and S3 while a
producer publishes (every fourth transaction aborted) and a random worker is SIGKILLed every few
seconds and replaced; once the producer stops and the sinks drain, ``eosink connectors audit`` finds
every committed record once in every sink and nothing else - and agrees with counting the ids.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.faultkit import Publisher, Rig
from tests.test_audit import _audit, _sink

KILLS = 8
KILL_EVERY_S = 4.0


@pytest.mark.chaos
def test_kill_9_storm_of_workers_audits_clean_in_postgres_files_and_s3(stack, kafka_admin, unique, tmp_path):
    rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
              tmp=tmp_path, name=unique, s3=stack.s3)
    rng = random.Random(11)
    try:
        slots = {slot: rig.start(f"{slot}-0") for slot in ("w1", "w2", "w3")}
        rig.wait_running({w.worker_id for w in slots.values()})
        publisher = Publisher(stack.kafka_bootstrap, rig.topic, pause=0.05)
        publisher.start()
        for kill in range(1, KILLS + 1):
            time.sleep(KILL_EVERY_S * rng.uniform(0.75, 1.25))
            slot = rng.choice(sorted(slots))
            slots[slot].signal(signal.SIGKILL)
            assert slots[slot].wait(10) == -signal.SIGKILL
            slots[slot] = rig.start(f"{slot}-{kill}")
        publisher.stop()
        committed = publisher.committed
        assert publisher.aborted and len(committed) > 1000, (len(committed), len(publisher.aborted))
        rig.wait_delivered(committed, timeout=120)
        rc, report, text = _audit(slots["w1"].url, rig.connector)
        rig.assert_exactly_once(committed, publisher.aborted)  # the ids counted by hand agree
    finally:
        rig.stop()
        kafka_admin.delete_topics([rig.topic])[rig.topic].result(30)
    assert rc == 0 and report["ok"], text
    assert report["source"]["records"] == len(committed), text
    for sink in ("db", "files", "lake"):
        t = _sink(report, sink)["totals"]
        assert (t["expected"], t["found_once"], t["missing"], t["duplicated"], t["foreign"], t["stale"]) == (
            len(committed), len(committed), 0, 0, 0, 0), (sink, text)
