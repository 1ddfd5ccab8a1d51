"""``eosink connectors audit`` against a real worker and real sinks: a clean delivery (through a kill -9
and a restart, with aborted Kafka transactions interleaved) audits to zero, and every way of breaking
exactly-once behind the product's back - a row deleted, a row doubled, a row of an aborted
transaction's record, a file line deleted, an object dropped - is named by the audit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.procs import REPO, WorkerProcess, fanout_config, free_port, publish, register, wait_until

PARTITIONS = 3


def _audit(url: str, name: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """The CLI as an operator runs it: exit code, the --json report, and the text report."""
    cli = [sys.executable, "-m", "eosink.worker.clients.cli", "connectors", "--url", url, "audit", name, *extra]
    j = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    t = subprocess.run(cli, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert j.returncode == t.returncode, (j.stderr, t.stderr)
    assert j.stdout.strip(), j.stderr
    return j.returncode, json.loads(j.stdout), t.stdout


def _delivered(url: str, name: str, n: int) -> bool:
    """Every sink holds ``n`` records (the audit's own count, so the test waits on what it will check)."""
    req = urllib.request.Request(f"{url}/connectors/{name}/audit", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        report = json.loads(resp.read())
    return all("totals" in s and s["totals"]["found_once"] + s["totals"]["duplicated"] >= n for s in report["sinks"])


def _sink(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sinks"] if s["sink"] == name)


def _worker(stack: Any, unique: str, worker_id: str, tmp_path: Path, **kw: Any) -> WorkerProcess:
    w = WorkerProcess(stack, unique, worker_id, tmp_path, rest_port=free_port(), **kw)
    wait_until(lambda: _ready(w.url), 60, f"{worker_id}'s REST API")
    return w


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.mark.chaos
def test_delivery_through_a_kill_and_aborted_transactions_audits_clean(stack, make_topic, unique, tmp_path):
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    bucket = name[:63].strip("-")
    committed, aborted = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=12, per_txn=250, aborted_every=3)
    register(stack.zookeeper_hosts, unique, name, fanout_config(stack, unique, topic, tmp_path / "out", bucket))
    first = WorkerProcess(stack, unique, "w-killed", tmp_path, fault="after_decide:3")  # decided, not yet committed
    assert first.wait(90) == -signal.SIGKILL, first.log_text()[-3000:]
    w = _worker(stack, unique, "w-restarted", tmp_path)
    try:
        wait_until(lambda: _delivered(w.url, name, len(committed)), 120, f"delivery of {len(committed)} records")
        rc, report, text = _audit(w.url, name)
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert rc == 0, text
    assert report["ok"] and report["source"]["records"] == len(committed), text
    for sink in ("db", "files", "archive"):
        t = _sink(report, sink)["totals"]
        assert t == {"expected": len(committed), "found_once": len(committed), "missing": 0, "duplicated": 0,
                     "foreign": 0, "stale": 0, "extra_copies": 0, "in_flight": 0}, (sink, text)
    assert "CLEAN" in text and "NOT CLEAN" not in text
    assert aborted, "the run must have aborted transactions on the topic to prove they are not counted"


def _aborted_offset(stack: Any, topic: str, aborted: set[str]) -> tuple[int, int, str]:
    """Partition, offset and id of a record of an aborted transaction (read_uncommitted)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    c = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"audit-test-{os.getpid()}",
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        c.assign([KTP(topic, p, 0) for p in range(PARTITIONS)])
        for _ in range(60):
            for m in c.consume(500, 1.0):
                if m.error() is None and json.loads(m.value())["id"] in aborted:
                    return m.partition(), m.offset(), json.loads(m.value())["id"]
    finally:
        c.close()
    raise AssertionError("no aborted record found")


def test_audit_names_each_fault_made_behind_the_products_back(stack, make_topic, unique, pg, tmp_path):
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    bucket = name[:63].strip("-")
    out = tmp_path / "out"
    committed, aborted = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=6, per_txn=300, aborted_every=3)
    register(stack.zookeeper_hosts, unique, name, fanout_config(stack, unique, topic, out, bucket))
    w = _worker(stack, unique, "w-audited", tmp_path)
    try:
        wait_until(lambda: _delivered(w.url, name, len(committed)), 120, f"delivery of {len(committed)} records")
        rc, report, text = _audit(w.url, name)
        assert rc == 0 and report["ok"], text

        table = f'"{unique}"'
        # db: one row deleted (p0), one row doubled (p1), one row of an aborted transaction's record.
        gone = pg.execute(f"SELECT __offset, id FROM {table} WHERE __partition = 0 ORDER BY __offset LIMIT 1 OFFSET 7").fetchone()
        pg.execute(f"DELETE FROM {table} WHERE __partition = 0 AND __offset = %s", (gone[0],))
        twice = pg.execute(f"SELECT __offset, id FROM {table} WHERE __partition = 1 ORDER BY __offset LIMIT 1 OFFSET 3").fetchone()
        pg.execute(f"INSERT INTO {table} (id, payload, __topic, __partition, __offset) SELECT id, payload, __topic, "
                   f"__partition, __offset FROM {table} WHERE __partition = 1 AND __offset = %s", (twice[0],))
        ap, aoff, aid = _aborted_offset(stack, topic, aborted)
        pg.execute(f"INSERT INTO {table} (id, payload, __topic, __partition, __offset) VALUES (%s, 'x', %s, %s, %s)",
                   (aid, topic, ap, aoff))
        # files: one line deleted from a committed file.
        f = sorted((out / name / "committed").glob("*.jsonl"))[1]
        lines = f.read_bytes().splitlines(keepends=True)
        dropped = json.loads(lines[2])
        f.write_bytes(b"".join(lines[:2] + lines[3:]) + b"a line no record wrote\n")
        # archive: one object dropped.
        s3 = boto3.client("s3", **stack.s3)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{name}/")["Contents"]]
        victim = sorted(keys)[0]
        lost = s3.get_object(Bucket=bucket, Key=victim)["Body"].read().count(b"\n")
        s3.delete_object(Bucket=bucket, Key=victim)

        rc, report, text = _audit(w.url, name)
        # A clean range still audits clean, limited by --offsets (TO exclusive: one record).
        rc_range, ranged, _ = _audit(w.url, name, "--offsets", f"{topic}:2=0-1")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]

    assert rc == 1 and not report["ok"], text
    db = _sink(report, "db")["totals"]
    assert (db["missing"], db["duplicated"], db["foreign"], db["stale"]) == (1, 1, 1, 0), text
    parts = {p["partition"]: p for p in _sink(report, "db")["partitions"]}
    assert parts[0]["culprits"]["missing"] == {"ranges": [str(gone[0])], "ids": [f"{topic}/0/{gone[0]}"],
                                                     "more_ranges": 0}, text
    doubled = parts[1]["culprits"]["duplicated"]
    assert doubled["ranges"] == [str(twice[0])] and doubled["ids"] == [f"{topic}/1/{twice[0]}"], text
    assert parts[ap]["culprits"]["foreign"]["ranges"] == [str(aoff)], text
    files = _sink(report, "files")
    assert (files["totals"]["missing"], files["totals"]["duplicated"], files["totals"]["foreign"]) == (1, 0, 1), text
    fp = next(p for p in files["partitions"] if p["partition"] == dropped["partition"])
    assert fp["culprits"]["missing"]["ranges"] == [str(dropped["offset"])] and fp["culprits"]["missing"]["ids"] == [dropped["id"]]
    arch = _sink(report, "archive")["totals"]
    assert (arch["missing"], arch["duplicated"], arch["foreign"]) == (lost, 0, 0), text
    vpart = int(victim.split("/")[-2])
    assert next(p for p in _sink(report, "archive")["partitions"] if p["partition"] == vpart)["missing"] == lost, text
    assert "NOT CLEAN" in text and "missing: offsets" in text and "foreign: offsets" in text
    # Only partition 2's first record is due in the ranged audit, and it is clean everywhere; a line tied
    # to no partition is foreign in every audit of the files.
    assert ranged["source"] == {**ranged["source"], "partitions": 1, "records": 1}, ranged
    for s in ranged["sinks"]:
        p2 = [p for p in s["partitions"] if p["partition"] == 2]
        assert len(p2) == 1 and p2[0]["found_once"] == 1 and not p2[0]["culprits"], s
        assert s["clean"] == (s["sink"] != "files"), s
    assert rc_range == 1 and _sink(ranged, "files")["totals"]["foreign"] == 1


def _publish_keyed(stack: Any, topic: str, rounds: int, keys: int) -> dict[str, int]:
    """``rounds`` transactions each writing every key once to partition 0, every third aborted; the
    last committed round of each key, by round number (its value's ``round``)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"audit-{topic}", "linger.ms": 5})
    p.init_transactions(30)
    last: dict[str, int] = {}
    for r in range(rounds):
        p.begin_transaction()
        for k in range(keys):
            p.produce(topic, key=f"k{k}".encode(), value=json.dumps({"n": k, "round": r}).encode(), partition=0)
        if r % 3 == 2:
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            last.update({f"k{k}": r for k in range(keys)})
    return last


def test_upsert_audit_names_a_row_left_behind_by_an_older_record_of_its_key(stack, make_topic, unique, pg, tmp_path):
    topic = make_topic(1)
    name = unique.replace("_", "-")
    last = _publish_keyed(stack, topic, rounds=7, keys=20)
    register(stack.zookeeper_hosts, unique, name, {
        "connector.class": "fanout", "topics": topic, "sinks": "db", "key.converter": "string", "commit.interval.ms": "200",
        "sinks.db.connector.class": "postgres", "sinks.db.connection.url": stack.postgres_dsn,
        "sinks.db.table.name.format": unique, "sinks.db.insert.mode": "upsert", "sinks.db.pk.mode": "record_key",
        "sinks.db.pk.fields": "k"})
    register(stack.zookeeper_hosts, unique, name + "-blind", {  # one postgres sink per connector and server
        "connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn,
        "table.name.format": unique + "_blind", "fields.kafka": "false"})
    w = _worker(stack, unique, "w-upsert", tmp_path)
    try:
        wait_until(lambda: _sink_found(w.url, name, "db") >= len(last), 120, f"{len(last)} keys upserted")
        rc, report, text = _audit(w.url, name)
        assert rc == 0 and report["ok"], text
        rc_blind, blind, blind_text = _audit(w.url, name + "-blind")
        table = f'"{unique}"'
        newest = pg.execute(f"SELECT __offset FROM {table} WHERE k = 'k5'").fetchone()[0]
        older = _committed_offsets_of(stack, topic, b"k5")[-2]
        pg.execute(f"UPDATE {table} SET __offset = %s WHERE k = 'k5'", (older,))  # an older record of k5 left in place
        gone = pg.execute(f"DELETE FROM {table} WHERE k = 'k6' RETURNING __offset").fetchone()[0]
        rc, report, text = _audit(w.url, name)
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert rc == 1, text
    db = _sink(report, "db")
    assert db["totals"] | {} == {**db["totals"], "expected": len(last), "stale": 1, "missing": 2, "foreign": 0}, text
    assert db["partitions"][0]["culprits"]["missing"]["ranges"] == [f"{newest}-{gone}"], text  # k5, k6: adjacent
    assert db["partitions"][0]["culprits"]["stale"]["ranges"] == [str(older)], text
    # Nothing could be checked: not reported clean.
    assert rc_blind == 1 and "postgres: NOT AUDITED: rows carry no Kafka coordinates" in blind_text, blind_text
    assert "nothing was audited" in blind_text and not blind["ok"], blind_text
    assert _sink(blind, "postgres")["clean"] is None and not _sink(blind, "postgres")["audited"]


def _committed_offsets_of(stack: Any, topic: str, key: bytes) -> list[int]:
    """The offsets of ``key``'s committed records on partition 0 of ``topic``, ascending."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    c = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"audit-test-{os.getpid()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "enable.partition.eof": True})
    out: list[int] = []
    try:
        c.assign([KTP(topic, 0, 0)])
        for _ in range(60):
            for m in c.consume(500, 1.0):
                if m.error() is not None:
                    return out
                if m.key() == key:
                    out.append(m.offset())
    finally:
        c.close()
    return out


def test_iceberg_audit_names_a_row_appended_twice_and_clean_before(stack, make_topic, unique, tmp_path):
    """Iceberg is read from its current snapshot's coordinate columns; a second append of a row
    (a copy committed behind the connector's back) is a duplicate."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from tests.test_iceberg_sink import sql_uri

    topic = make_topic(2)
    name = unique.replace("_", "-")
    committed, _aborted = publish(stack.kafka_bootstrap, topic, 2, txns=4, per_txn=100, aborted_every=2)
    ident = f"eosink_audit.{unique}"
    catalog = {"uri": sql_uri(stack.postgres_dsn), "warehouse": f"file://{tmp_path}/warehouse"}
    register(stack.zookeeper_hosts, unique, name, {
        "connector.class": "iceberg", "topics": topic, "iceberg.catalog.uri": catalog["uri"],
        "iceberg.catalog.name": "audit_it", "iceberg.warehouse": catalog["warehouse"], "iceberg.table": ident,
        "commit.interval.ms": "300"})
    w = _worker(stack, unique, "w-iceberg", tmp_path)
    try:
        wait_until(lambda: _sink_found(w.url, name, "iceberg") >= len(committed), 120, f"{len(committed)} rows in Iceberg")
        rc, report, text = _audit(w.url, name)
        assert rc == 0 and _sink(report, "iceberg")["totals"]["found_once"] == len(committed), text
        table = load_catalog("audit_it", **{"type": "sql", **catalog}).load_table(ident)
        rows = table.scan(row_filter="__partition == 1").to_arrow()
        doubled = rows.slice(0, 1)
        table.append(pa.Table.from_batches(doubled.to_batches(), schema=doubled.schema))
        rc, report, text = _audit(w.url, name)
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
        try:
            load_catalog("audit_it", **{"type": "sql", **catalog}).drop_table(ident)
        except Exception:  # noqa: BLE001 - cleanup only
            pass
    assert rc == 1, text
    t = _sink(report, "iceberg")["totals"]
    assert (t["duplicated"], t["missing"], t["foreign"]) == (1, 0, 0), text
    part1 = next(p for p in _sink(report, "iceberg")["partitions"] if p["partition"] == 1)
    assert part1["culprits"]["duplicated"]["ranges"] == [str(doubled.column("__offset")[0].as_py())], text


def _sink_found(url: str, name: str, sink: str) -> int:
    req = urllib.request.Request(f"{url}/connectors/{name}/audit", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:
        return int(_sink(json.loads(resp.read()), sink).get("totals", {}).get("found_once", 0))
