"""The rig for the infrastructure fault tests (tests/test_faults.py) and the soak (bench/soak.py).

Private servers for what a test breaks (a Kafka of one or three nodes, a PostgreSQL), started
with the stack's own component code under the test's own home and ports, so the shared stack
that other tests use is never touched. A producer publishes transactions the whole time (some
aborted), three workers deliver the whole time, a sampler records the sink's row count twice a
second (the recovery figures), and the end is counted from the sinks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from eosink.worker.stack.proc import free_port_block
from tests.procs import WorkerProcess, free_port, register, wait_until

PARTITIONS = 6
SESSION = 4.0


class PrivateStack:
    """Kafka (``brokers`` nodes) and/or PostgreSQL of the product's stack, under ``home`` only.

    The ports are set in the environment for the stack calls (``monkeypatch``), the way a user
    sets them for ``eosink stack up``; ``stop()`` runs the stack's own ``down`` for this home.
    """

    def __init__(self, home: Path, monkeypatch: Any, *, brokers: int = 0, postgres: bool = False,
                 kafka_advertised_port: int | None = None) -> None:
        from eosink.worker.stack.components.postgres import Postgres
        from eosink.worker.stack.layout import StackLayout

        self.home = home
        self.names = (["kafka"] if brokers else []) + (["postgres"] if postgres else [])
        self.brokers = brokers
        base = free_port_block(2 * max(brokers, 1) + 1)
        monkeypatch.setenv("EOSINK_KAFKA_PORT", str(base))
        monkeypatch.setenv("EOSINK_KAFKA_CONTROLLER_PORT", str(base + 1))
        monkeypatch.setenv("EOSINK_POSTGRES_PORT", str(base + 2 * max(brokers, 1)))
        monkeypatch.setenv("EOSINK_KAFKA_BROKERS", str(max(brokers, 1)))
        if kafka_advertised_port is not None:
            monkeypatch.setenv("EOSINK_KAFKA_ADVERTISED_PORT", str(kafka_advertised_port))
        self.kafka_port = base
        self.postgres_port = base + 2 * max(brokers, 1)
        self.pg_base = Postgres(StackLayout.for_home(home)).base_dir

    def start(self) -> PrivateStack:
        from eosink.worker.stack import manager

        manager.up(self.names, self.home, brokers=self.brokers or None)
        return self

    def stop(self) -> None:
        from eosink.worker.stack import manager

        try:
            manager.down(self.names, self.home)
        finally:
            if "postgres" in self.names:
                shutil.rmtree(self.pg_base, ignore_errors=True)

    def endpoints(self) -> Any:
        from eosink.worker.stack import load_endpoints

        return load_endpoints(self.home)

    def component(self, name: str) -> Any:
        from eosink.worker.stack import manager
        from eosink.worker.stack.layout import StackLayout

        return manager.select([name], StackLayout.for_home(self.home))[0]

    def kill(self, name: str) -> float:
        """SIGKILL one server (a Kafka node: ``kafka-2``); returns when it died (monotonic)."""
        pid = self.component(name).running_pid()
        assert pid is not None, f"{name} is not running"
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: self.component(name).running_pid() is None, 30, f"{name} (pid {pid}) to die")
        return time.monotonic()

    def restart(self, name: str) -> float:
        from eosink.worker.stack import start_component

        start_component(name, self.home)
        return time.monotonic()


def coordinator_partition(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of a transactional id, as the broker computes it
    (``Utils.abs(transactionalId.hashCode) % partitions``, Java's String.hashCode)."""
    units = transactional_id.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


#: Kafka Connect's schema of the publisher's values, as JsonConverter writes it with schemas.enable=true.
ENVELOPE_SCHEMA = json.dumps({"type": "struct", "optional": False, "fields": [
    {"type": "string", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "payload"}]}).encode()


class Publisher(threading.Thread):
    """One long-lived transactional producer publishing until stopped; every ``aborted_every``-th
    transaction is aborted. Transactions the broker makes us abort (a coordinator moved) count as
    aborted; a retriable commit error is retried, as the client's contract says. A fatal error (a
    coordinator killed mid-abort can answer INVALID_TXN_STATE) is what an application recovers from
    with a new producer of the same transactional.id, whose ``init_transactions`` fences the old one
    and finishes its open transaction: an abort's records count as aborted; a commit's outcome is
    read back read_committed when the publisher stops."""

    def __init__(self, bootstrap: str, topic: str, *, per_txn: int = 100, aborted_every: int = 4, pause: float = 0.1,
                 transactional_id: str | None = None, envelope: bool = False) -> None:
        super().__init__(daemon=True)
        self.topic, self.per_txn, self.aborted_every, self.pause = topic, per_txn, aborted_every, pause
        #: Values in Kafka Connect's schemas.enable=true envelope (a Rig made with ``envelope=True`` reads them).
        self.envelope = envelope
        self.transactional_id = transactional_id or f"faults-{topic}"
        self.bootstrap = bootstrap
        self.producer = self._new_producer()
        self.committed: set[str] = set()
        #: Ids of a transaction whose commit failed fatally: committed or not, as Kafka says.
        self.uncertain: set[str] = set()
        self.aborted: set[str] = set()
        self.errors: list[str] = []
        self.in_txn = threading.Event()
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.txns = 0

    def run(self) -> None:
        try:
            self.producer.init_transactions(60)
            n = 0
            while not self.stopping.is_set():
                self.producer.begin_transaction()
                self.in_txn.set()
                ids = [f"r-{n + i}" for i in range(self.per_txn)]
                for i, rid in enumerate(ids):
                    self._produce(rid, (n + i) % PARTITIONS)
                n += self.per_txn
                self.txns += 1
                if self.aborted_every and self.txns % self.aborted_every == 0:
                    self._end(ids, commit=False)
                else:
                    self._end(ids, commit=True)
                self.in_txn.clear()
                time.sleep(self.pause)
        except BaseException as e:  # noqa: BLE001 - reported by the test that reads .failure
            self.failure = e

    def _new_producer(self) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60000, "log_level": 2})

    def _replace_producer(self) -> None:
        """After a fatal error: a new producer of the same transactional.id (fences the old one)."""
        self.producer = self._new_producer()
        self.producer.init_transactions(60)

    def _produce(self, rid: str, partition: int) -> None:
        value = json.dumps({"id": rid, "payload": "x" * 100}).encode()
        if self.envelope:
            value = b'{"schema":' + ENVELOPE_SCHEMA + b',"payload":' + value + b"}"
        while True:
            try:
                self.producer.produce(self.topic, value=value, partition=partition)
                return
            except BufferError:
                self.producer.poll(0.1)

    def _end(self, ids: list[str], commit: bool) -> None:
        while True:
            try:
                if commit:
                    self.producer.commit_transaction(60)
                    self.committed.update(ids)
                else:
                    self.producer.abort_transaction(60)
                    self.aborted.update(ids)
                return
            except KafkaException as e:
                error = e.args[0]
                self.errors.append(f"{'commit' if commit else 'abort'}: {error}")
                if error.retriable():
                    continue
                if commit and error.txn_requires_abort():
                    commit = False
                    continue
                if error.fatal():
                    (self.uncertain if commit else self.aborted).update(ids)
                    self._replace_producer()
                    return
                raise

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)
        assert not self.is_alive(), "the publisher did not finish its last transaction in 120 s"
        if self.failure is not None:
            raise AssertionError(f"the publisher failed: {self.failure!r}; errors {self.errors[-5:]}")
        if self.uncertain:
            visible = _read_committed_ids(self.bootstrap, self.topic, self.uncertain)
            self.committed |= visible
            self.aborted |= self.uncertain - visible


def _read_committed_ids(bootstrap: str, topic: str, wanted: set[str]) -> set[str]:
    """Which of ``wanted`` a read_committed consumer sees in ``topic`` (read to its end)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-check-{topic}", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        ends = {p: c.get_watermark_offsets(KTP(topic, p), timeout=30)[1] for p in md.partitions}
        c.assign([KTP(topic, p, 0) for p in md.partitions])
        seen: set[str] = set()
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline, idle = time.monotonic() + 120, 0
        while len(done) < len(ends) and time.monotonic() < deadline and idle < 3:  # a trailing marker may hold
            msgs = c.consume(1000, 1.0)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                if m.error() is None:
                    rid = json.loads(m.value())["id"]
                    if rid in wanted:
                        seen.add(rid)
            for p, end in ends.items():
                pos = c.position([KTP(topic, p)])[0].offset
                if pos >= end:
                    done.add(p)
        return seen
    finally:
        c.close()


@dataclass
class Sample:
    t: float
    rows: int


@dataclass
class Rig:
    """A connector of three workers delivering a topic into PostgreSQL (and files) through a fault."""

    kafka: str
    zookeeper: str
    postgres_dsn: str
    tmp: Path
    name: str
    partitions: int = PARTITIONS
    replication: int = 1
    files: bool = True
    #: An S3 endpoint (boto3 client kwargs): a third sink, ``lake``, writes JSON Lines objects there.
    s3: dict[str, str] | None = None
    #: Values in Kafka Connect's schemas.enable=true envelope (``value.converter.schemas.enable=true``).
    envelope: bool = False
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    statuses: list[tuple[float, str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        import psycopg
        from confluent_kafka.admin import AdminClient, NewTopic

        self.connector = self.name.replace("_", "-")
        self.table = self.name
        self.topic = f"{self.name}_in"
        self.out = self.tmp / "out"
        admin = AdminClient({"bootstrap.servers": self.kafka})
        admin.create_topics([NewTopic(self.topic, self.partitions, self.replication)])[self.topic].result(60)
        sinks = {"sinks.db.connector.class": "postgres", "sinks.db.connection.url": "${env:EOSINK_PG_DSN}",
                 "sinks.db.table.name.format": self.table}
        names = "db"
        if self.files:
            sinks |= {"sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(self.out)}
            names = "db,files"
        if self.s3 is not None:
            self.bucket = self.name.replace("_", "-").lower()[:60]
            sinks |= {"sinks.lake.connector.class": "s3", "sinks.lake.s3.bucket.name": self.bucket,
                      "sinks.lake.s3.endpoint.url": self.s3["endpoint_url"], "sinks.lake.s3.path.style.access": "true",
                      "sinks.lake.aws.access.key.id": self.s3["aws_access_key_id"],
                      "sinks.lake.aws.secret.access.key": self.s3["aws_secret_access_key"]}
            names += ",lake"
        register(self.zookeeper, self.name, self.connector, {
            "connector.class": "fanout", "topics": self.topic, "sinks": names, **sinks,
            "tasks.max": "3", "commit.interval.ms": "250", "batch.max.records": "500",
            **({"value.converter.schemas.enable": "true"} if self.envelope else {}),
        })
        self.pg = psycopg.connect(self.postgres_dsn, autocommit=True)
        self._sampling = threading.Event()

    def endpoints(self, postgres_dsn: str | None = None) -> Any:
        return type("Endpoints", (), {"kafka_bootstrap": self.kafka, "zookeeper_hosts": self.zookeeper,
                                      "postgres_dsn": postgres_dsn or self.postgres_dsn})()

    def start(self, wid: str, *, postgres_dsn: str | None = None, kafka: str | None = None,
              zookeeper: str | None = None, **kw: Any) -> WorkerProcess:
        ends = self.endpoints(postgres_dsn)
        if kafka:
            ends.kafka_bootstrap = kafka
        w = WorkerProcess(ends, self.name, wid, self.tmp, session_timeout=SESSION, rest_port=free_port(),
                          zookeeper=zookeeper, **kw)
        self.workers[wid] = w
        return w

    def start_three(self, **kw: Any) -> None:
        for wid in ("w1", "w2", "w3"):
            self.start(wid, **kw)

    # -- observing ---------------------------------------------------------------------------------

    def rows(self) -> int:
        try:
            return int(self.scalar(f'SELECT count(*) FROM "{self.table}"')) if self.scalar(
                "SELECT to_regclass(%s) IS NOT NULL", (self.table,)) else 0
        except Exception:  # noqa: BLE001 - the database is the thing under fault: no sample now
            self.pg = self._reconnect()
            return -1

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        row = self.pg.execute(sql, params).fetchone()
        assert row is not None, f"no row from {sql}"
        return row[0]

    def _reconnect(self) -> Any:
        import psycopg

        try:
            self.pg.close()
            return psycopg.connect(self.postgres_dsn, autocommit=True, connect_timeout=2)
        except Exception:  # noqa: BLE001 - still down: the next sample tries again
            return self.pg

    def sample_forever(self) -> None:
        def loop() -> None:
            while not self._sampling.is_set():
                self.samples.append(Sample(time.monotonic(), self.rows()))
                time.sleep(0.5)

        threading.Thread(target=loop, daemon=True).start()

    def status_of(self, wid: str) -> Any:
        w = self.workers[wid]
        try:
            with urllib.request.urlopen(f"{w.url}/connectors/{self.connector}/status", timeout=3) as r:
                return json.loads(r.read())
        except Exception as e:  # noqa: BLE001 - what a client sees is the point
            return f"{type(e).__name__}: {e}"

    def record_statuses(self) -> None:
        for wid, w in self.workers.items():
            if w.proc.poll() is None:
                self.statuses.append((time.monotonic(), wid, self.status_of(wid)))

    def wait_running(self, wids: set[str], timeout: float = 90) -> None:
        def spread() -> bool:
            held: list[str] = []
            for wid in wids:
                s = self.status_of(wid)
                if not isinstance(s, dict):
                    return False
                held += [p["partition"] for t in s.get("tasks", []) if t.get("worker_id") == wid
                         for p in t.get("partitions", [])]
            return len(set(held)) == self.partitions
        wait_until(spread, timeout, f"{self.partitions} partitions running on {sorted(wids)}", interval=0.5)

    # -- counting ----------------------------------------------------------------------------------

    def pg_ids(self) -> list[str]:
        self.pg = self._reconnect()
        return [r[0] for r in self.pg.execute(f'SELECT id FROM "{self.table}"')]

    def file_ids(self) -> list[str]:
        ids: list[str] = []
        for f in sorted((self.out / self.connector / "committed").glob("*.jsonl")):
            ids.extend(json.loads(line)["value"]["id"] for line in f.read_text().splitlines() if line)
        return ids

    def s3_ids(self) -> list[str]:
        """Every id in the ``lake`` sink's data objects (bookkeeping keys start with ``__``)."""
        import boto3

        client = boto3.client("s3", **(self.s3 or {}))
        ids: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", []):
                if obj["Key"].startswith("__") or "/__" in obj["Key"]:
                    continue
                body = client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                ids.extend(json.loads(line)["id"] for line in body.splitlines() if line)
        return ids

    def s3_open_uploads(self) -> list[str]:
        import boto3

        client = boto3.client("s3", **(self.s3 or {}))
        return [u["Key"] for u in client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])]

    def wait_delivered(self, committed: set[str], timeout: float = 240) -> float:
        start = time.monotonic()
        wait_until(lambda: self.rows() >= len(committed) and (not self.files or len(self.file_ids()) >= len(committed))
                   and (self.s3 is None or len(self.s3_ids()) >= len(committed)),
                   timeout, f"delivery of {len(committed)} records (have {self.rows()} rows)", interval=1.0)
        return time.monotonic() - start

    def assert_exactly_once(self, committed: set[str], aborted: set[str]) -> None:
        time.sleep(1.5)  # a few more commit intervals: anything extra would show now
        sinks = [("postgres", self.pg_ids())] + ([("filesystem", self.file_ids())] if self.files else []) \
            + ([("s3", self.s3_ids())] if self.s3 is not None else [])
        for sink, ids in sinks:
            assert len(ids) == len(set(ids)), f"{sink}: {len(ids) - len(set(ids))} duplicates"
            assert set(ids) == committed, \
                f"{sink}: missing {len(committed - set(ids))}, from aborted {len(set(ids) & aborted)}"
        prepared = self.pg.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                   (f"eosink:{self.connector}.%",)).fetchall()
        assert prepared == [], f"prepared transactions left: {prepared}"
        if self.files:
            assert not list((self.out / self.connector / "prepared").glob("*.jsonl")), "filesystem: a prepared txn left"
        if self.s3 is not None:
            assert self.s3_open_uploads() == [], "s3: a multipart upload (a prepared txn) left"

    def stall(self, since: float, until: float) -> float:
        """The longest stretch in [since, until] in which the sink gained no row (seconds)."""
        longest, last_growth, last_rows = 0.0, since, None
        for s in self.samples:
            if s.t < since or s.rows < 0:
                continue
            if last_rows is None or s.rows > last_rows:
                longest = max(longest, s.t - last_growth)
                last_growth, last_rows = s.t, s.rows
            if s.t > until:
                break
        return max(longest, min(until, time.monotonic()) - last_growth)

    def catch_up(self, since: float, target: int) -> float:
        """Seconds from ``since`` until the sink held ``target`` rows."""
        for s in self.samples:
            if s.t >= since and s.rows >= target:
                return s.t - since
        return float("nan")

    def log_lines(self, wid: str, *words: str) -> list[str]:
        """The worker's WARNING/ERROR log lines that mention any of ``words`` (all if none)."""
        out = []
        for line in self.workers[wid].log_text().splitlines():
            flagged = '"level": "warning"' in line or '"level": "error"' in line or "Traceback" in line
            if flagged and (not words or any(w in line for w in words)):
                out.append(line[:400])
        return out

    def stop(self) -> dict[str, int]:
        self._sampling.set()
        codes = {wid: w.stop() for wid, w in self.workers.items()}
        try:
            self.pg.close()
        except Exception:  # noqa: BLE001 - closing only
            pass
        return codes


def process_usage(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a live process, from /proc."""
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def run_soak(rig: Rig, *, seconds: float, kill_every: float, rng: random.Random, sample_every: float = 10.0,
             pause: float = 0.2, spare: str | None = None, report: Any = print) -> list[dict[str, Any]]:
    """Three workers and a producer for ``seconds``; kill -9 a random worker about every ``kill_every``
    seconds (a new one takes its slot); sample every worker's RSS and fds; then count exactly-once.

    ``spare`` (a slot: ``w3``) is never killed: one process lives through every rebalance the
    others cause, so its RSS and fd curve shows a leak that short-lived processes cannot."""
    slots = {slot: rig.start(f"{slot}-0") for slot in ("w1", "w2", "w3")}
    rig.wait_running({w.worker_id for w in slots.values()})
    publisher = Publisher(rig.kafka, rig.topic, pause=pause)
    rig.sample_forever()
    publisher.start()
    started = time.monotonic()
    next_kill = started + kill_every
    next_sample = started
    kills = 0
    curve: list[dict[str, Any]] = []
    while time.monotonic() - started < seconds:
        now = time.monotonic()
        if now >= next_sample:
            point: dict[str, Any] = {"t": round(now - started), "rows": rig.rows(), "committed": len(publisher.committed)}
            for slot, w in slots.items():
                try:
                    rss, fds = process_usage(w.proc.pid)
                    point[slot] = {"id": w.worker_id, "rss_mib": round(rss, 1), "fds": fds}
                except OSError:
                    point[slot] = {"id": w.worker_id, "rss_mib": None, "fds": None}
            curve.append(point)
            report("SOAK " + json.dumps(point))
            next_sample += sample_every
        if now >= next_kill:
            slot = rng.choice(sorted(set(slots) - {spare}))
            victim = slots[slot]
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            kills += 1
            slots[slot] = rig.start(f"{slot}-{kills}")
            report(f"SOAK kill -9 {victim.worker_id} at t={now - started:.0f}s; {slots[slot].worker_id} takes its slot")
            next_kill = now + kill_every * rng.uniform(0.8, 1.2)
        time.sleep(0.5)
    publisher.stop()
    waited = rig.wait_delivered(publisher.committed, timeout=300)
    rig.assert_exactly_once(publisher.committed, publisher.aborted)
    report(f"SOAK done: {len(publisher.committed)} records, {len(publisher.aborted)} aborted, {kills} kills, "
           f"0 lost, 0 duplicated, drained {waited:.1f}s after the producer stopped")
    return curve
