"""Rolling upgrade and rollback under load: a cluster of the released workers (``v0.1.0``, built from its
commit by :mod:`tests.upgradekit`) is replaced one worker at a time by the checkout's code while a
producer publishes (every fourth transaction aborted), then rolled back the same way. Every worker is
stopped as an orchestrator stops it (SIGTERM, then the next version starts under the same id), and the
cluster keeps delivering throughout; counted from PostgreSQL and the files at the end: every committed
id once, nothing from an aborted transaction, no prepared transaction left, and no task ever FAILED.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from eosink.worker.version import VERSION
from tests import upgradekit
from tests.faultkit import Publisher, Rig

SLOTS = ("w1", "w2", "w3")


def _replace(rig: Rig, wid: str, code: dict[str, Any], version: str) -> None:
    """Stop ``wid`` gracefully and start it again on ``version`` (``code``: how a worker runs it), then wait
    until the cluster has spread the partitions over all three again."""
    assert rig.workers[wid].stop() == 0, rig.workers[wid].log_text()[-2000:]
    rig.start(wid, **code)
    rig.wait_running(set(SLOTS))
    assert upgradekit.version_of(rig.workers[wid].url) == version
    rig.record_statuses()
    time.sleep(1.0)  # a few cycles on the mixed cluster before the next worker goes


@pytest.mark.chaos
def test_rolling_upgrade_from_the_release_and_rollback_under_load_deliver_every_record_once(
        stack, kafka_admin, unique, tmp_path):
    release = upgradekit.release_worker()
    assert VERSION != upgradekit.RELEASE_VERSION, "the checkout must be a later version than the release"
    rig = Rig(kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
              tmp=tmp_path, name=unique)
    try:
        for wid in SLOTS:
            rig.start(wid, **release)
        rig.wait_running(set(SLOTS))
        assert {upgradekit.version_of(rig.workers[w].url) for w in SLOTS} == {upgradekit.RELEASE_VERSION}
        publisher = Publisher(stack.kafka_bootstrap, rig.topic, pause=0.05)
        publisher.start()
        time.sleep(2)
        for wid in SLOTS:  # the upgrade
            _replace(rig, wid, {}, VERSION)
        delivered_mid = rig.rows()
        for wid in SLOTS:  # the rollback
            _replace(rig, wid, release, upgradekit.RELEASE_VERSION)
        publisher.stop()
        assert publisher.failure is None, publisher.failure
        committed = publisher.committed
        assert publisher.aborted and delivered_mid > 0 and len(committed) > delivered_mid
        rig.wait_delivered(committed, timeout=120)
        rig.assert_exactly_once(committed, publisher.aborted)
        failed = [(wid, s) for _, wid, s in rig.statuses if isinstance(s, dict)
                  and any(t.get("state") == "FAILED" for t in s.get("tasks", []))]
        assert failed == [], failed
        assert [line for wid in SLOTS for line in rig.log_lines(wid, "task_failed")] == []
    finally:
        rig.stop()
        kafka_admin.delete_topics([rig.topic])[rig.topic].result(30)
