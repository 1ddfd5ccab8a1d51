"""The metrics an operator alerts on, scraped from real workers (Kafka, ZooKeeper, PostgreSQL of the
local stack): each state series appears, changes and disappears as the cluster changes, so that an
alert on it is neither stuck nor double-counted.

* partition series (lag, freshness) exist only on the worker that holds the partition, and move
  when a worker joins or stops; ``eosink_assigned_partitions`` sums to the topic's partitions;
* ``eosink_task_failed`` reads 1 for a failed task and 0 once the cause is fixed and it is restarted;
* ``eosink_prepared_unresolved_age_seconds`` grows while recovery cannot resolve a prepared txn;
* exactly one worker reads ``eosink_leader`` 1; ``eosink_rebalances_total`` counts a join.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.metricskit import Samples, scrape, value
from tests.procs import publish, register, wait_until
from tests.restkit import call, produce, start_worker

pytestmark = pytest.mark.chaos

PARTITIONS = 6
SESSION = 4.0

def partitions_of(samples: Samples, name: str, connector: str) -> set[str]:
    return {f"{ls['topic']}-{ls['partition']}" for ls, _ in samples.get(name, []) if ls.get("connector") == connector}


def _pg_config(stack, topic: str, table: str, **extra: str) -> dict[str, str]:
    return {"connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": table, "commit.interval.ms": "250", **extra}


def _count(pg, table: str) -> int:
    if not pg.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
        return 0
    return pg.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]


@pytest.fixture
def workers():
    started: list = []
    yield started
    for w in started:
        w.stop()


def test_partition_series_follow_their_owner_when_a_worker_joins_and_stops(stack, unique, make_topic, pg, tmp_path, workers):
    """A moved partition's lag and freshness vanish from its old owner: summed across the cluster,
    nothing is counted twice and nothing is missing."""
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    everything = {f"{topic}-{p}" for p in range(PARTITIONS)}
    register(stack.zookeeper_hosts, unique, name, _pg_config(stack, topic, unique, **{"tasks.max": "2"}))
    w1 = start_worker(stack, unique, "w1", tmp_path, session_timeout=SESSION)
    workers.append(w1)

    def alone_on_w1() -> bool:
        s = scrape(w1.url)
        return (value(s, "eosink_assigned_partitions", connector=name) == PARTITIONS
                and partitions_of(s, "eosink_consumer_lag", name) == everything
                and partitions_of(s, "eosink_seconds_since_last_commit", name) == everything)

    # A partition's lag is known once the consumer has read from it (librdkafka has no position
    # before that): every partition gets records first.
    committed, _ = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=3, per_txn=100, aborted_every=3)
    wait_until(lambda: _count(pg, unique) >= len(committed), 60, f"delivery of {len(committed)} records")
    wait_until(alone_on_w1, 60, f"w1 to report all {PARTITIONS} partitions")
    s = scrape(w1.url)
    info = s["eosink_build_info"]
    assert len(info) == 1 and info[0][1] == 1.0 and info[0][0]["version"] and info[0][0]["python"], info
    assert value(s, "eosink_zookeeper_connected") == 1.0 and value(s, "eosink_leader") == 1.0
    assert value(s, "eosink_task_failed", connector=name) == 0.0
    rebalances = value(s, "eosink_rebalances_total") or 0.0
    delivered = value(s, "eosink_records_delivered_total", connector=name)
    consumed = value(s, "eosink_records_consumed_total", connector=name)
    assert delivered == len(committed), (delivered, len(committed))
    assert consumed is not None and consumed >= delivered, (consumed, delivered)
    wait_until(lambda: all(v == 0 for ls, v in scrape(w1.url)["eosink_consumer_lag"] if ls["connector"] == name), 30,
               "the lag to read 0 once everything is delivered")

    w2 = start_worker(stack, unique, "w2", tmp_path, session_timeout=SESSION)
    workers.append(w2)
    wait_until(lambda: (value(scrape(w2.url), "eosink_assigned_partitions", connector=name) or 0) > 0, 60,
               "w2 to be assigned partitions")
    more, _ = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=2, per_txn=60, prefix="after-join")
    committed |= more

    def split() -> bool:
        a, b = scrape(w1.url), scrape(w2.url)
        held = [value(x, "eosink_assigned_partitions", connector=name) or 0 for x in (a, b)]
        if sum(held) != PARTITIONS or 0 in held:
            return False
        for metric in ("eosink_consumer_lag", "eosink_seconds_since_last_commit"):
            pa, pb = partitions_of(a, metric, name), partitions_of(b, metric, name)
            if pa & pb or pa | pb != everything or len(pa) != held[0]:
                return False
        return True

    wait_until(split, 60, "the partitions and their series to split over w1 and w2")
    a, b = scrape(w1.url), scrape(w2.url)
    assert (value(a, "eosink_rebalances_total") or 0.0) > rebalances, "w1's assignment changed when w2 joined"
    assert sorted([value(a, "eosink_leader"), value(b, "eosink_leader")]) == [0.0, 1.0], "exactly one leader"
    assert value(b, "eosink_zookeeper_connected") == 1.0
    rebalances = value(a, "eosink_rebalances_total") or 0.0

    assert w2.stop() == 0
    wait_until(alone_on_w1, SESSION + 30, "w1 to take back every partition and its series")
    a = scrape(w1.url)
    assert (value(a, "eosink_rebalances_total") or 0.0) > rebalances, "w1's assignment changed when w2 stopped"
    assert value(a, "eosink_leader") == 1.0


def test_task_failed_reads_1_until_the_cause_is_fixed_and_the_task_restarted(stack, unique, make_topic, pg, tmp_path,
                                                                           workers):
    topic = make_topic(1)
    name = unique.replace("_", "-")
    pg.execute(f'CREATE TABLE "{unique}" (id text, payload bigint)')  # the records' payload is a string
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"r{i}", "payload": f"p{i}"}).encode()) for i in range(5)])
    w = start_worker(stack, unique, "w-fails", tmp_path, session_timeout=SESSION)
    workers.append(w)
    assert call(w.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})[0] == 201
    wait_until(lambda: value(scrape(w.url), "eosink_task_failed", connector=name) == 1.0, 60,
               f"eosink_task_failed{{connector={name}}} to read 1 (status {call(w.url, 'GET', f'/connectors/{name}/status')[1]})")
    time.sleep(1.0)
    assert value(scrape(w.url), "eosink_task_failed", connector=name) == 1.0, "a failed task stays failed until restarted"
    assert _count(pg, unique) == 0

    pg.execute(f'ALTER TABLE "{unique}" ALTER COLUMN payload TYPE text')  # the operator's fix
    assert call(w.url, "POST", f"/connectors/{name}/restart")[0] == 204
    wait_until(lambda: value(scrape(w.url), "eosink_task_failed", connector=name) == 0.0, 60,
               "eosink_task_failed to read 0 after the restart")
    wait_until(lambda: _count(pg, unique) == 5, 60, "delivery after the fix")
    assert value(scrape(w.url), "eosink_task_failed", connector=name) == 0.0


def test_unresolved_prepared_txn_age_grows_until_it_is_resolved(stack, unique, make_topic, pg, tmp_path, workers):
    """A prepared PostgreSQL transaction of the connector without a manifest: recovery cannot tie it
    to a decision, reports it and holds the partition back; its age is what pages the operator."""
    topic = make_topic(1)
    name = unique.replace("_", "-")
    gid = f"eosink:{name}.orphan-{unique[-8:]}"
    pg.execute("BEGIN")
    pg.execute("SELECT 1")
    pg.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        register(stack.zookeeper_hosts, unique, name, _pg_config(stack, topic, unique))
        w = start_worker(stack, unique, "w-doubt", tmp_path, session_timeout=SESSION)
        workers.append(w)
        wait_until(lambda: (value(scrape(w.url), "eosink_prepared_unresolved", connector=name) or 0) == 1, 60,
                   "the orphan to be reported unresolved")
        first = value(scrape(w.url), "eosink_prepared_unresolved_age_seconds", connector=name)
        assert first is not None and first > 0
        time.sleep(1.5)
        later = value(scrape(w.url), "eosink_prepared_unresolved_age_seconds", connector=name)
        assert later is not None and later >= first + 1.0, (first, later)
        assert value(scrape(w.url), "eosink_task_failed", connector=name) == 0.0, "in doubt is not failed"
    finally:
        if pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone()[0]:
            pg.execute(f"ROLLBACK PREPARED '{gid}'")
    assert call(w.url, "POST", f"/connectors/{name}/restart")[0] == 204  # recovery runs again and finds nothing
    wait_until(lambda: value(scrape(w.url), "eosink_prepared_unresolved", connector=name) == 0
               and value(scrape(w.url), "eosink_prepared_unresolved_age_seconds", connector=name) == 0, 60,
               "the unresolved count and age to read 0 once it is resolved")


def test_task_failed_reads_1_for_a_connector_whose_task_cannot_start(stack, unique, make_topic, tmp_path, workers):
    """A task that fails in ``open`` never exists to be read: the worker's failure is the series. (Refused
    credentials are fatal at open; a server that is away is retried instead, with the task running.)"""
    topic = make_topic(1)
    name = unique.replace("_", "-")
    w = start_worker(stack, unique, "w-nostart", tmp_path, session_timeout=SESSION)
    workers.append(w)
    refused = {"connector.class": "s3", "topics": topic, "s3.bucket.name": name[:60].lower(),
               "s3.endpoint.url": stack.s3["endpoint_url"], "s3.region": stack.s3["region_name"],
               "aws.access.key.id": stack.s3["aws_access_key_id"], "aws.secret.access.key": "not-the-secret"}
    assert call(w.url, "POST", "/connectors", {"name": name, "config": refused})[0] == 201
    wait_until(lambda: call(w.url, "GET", f"/connectors/{name}/status")[1].get("connector", {}).get("state") == "FAILED",
               60, f"{name} to be reported FAILED")
    wait_until(lambda: value(scrape(w.url), "eosink_task_failed", connector=name) == 1.0, 10,
               f"eosink_task_failed{{connector={name}}} to read 1 while /status says FAILED")
