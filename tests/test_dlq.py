"""Bad records and errors: ``errors.tolerance``, the dead-letter topic (exactly once, also across kill -9),
``errors.retry.timeout``. The engine tests run on memory sinks; the rest against the real stack.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping

import pytest

from eosink.connectors import memory
from eosink.connectors.api.errors import RecordError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.memory import MemorySink
from eosink.worker.engine.batch import Batch, FailedRecord
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from tests.fakes import ListSource

TP = TopicPartition("outbox", 0)


# -- the engine, on memory sinks -------------------------------------------------------------------------------
class ToleratingListSource(ListSource):
    """ListSource with errors.tolerance=all: an undecodable value goes to ``Batch.failed``, the batch goes on."""

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch:
        batch = Batch()
        for tp in sorted(self.positions):
            while self.positions[tp] < len(self.data[tp]) and len(batch.records) + len(batch.failed) < max_records:
                pos = self.positions[tp]
                raw = self.data[tp][pos]
                self.positions[tp] = pos + 1
                try:
                    value = json.loads(raw)
                except ValueError as exc:
                    err = RecordError(str(exc), topic=tp.topic, partition=tp.partition, offset=pos, component="converter")
                    batch.failed.append(FailedRecord(tp.topic, tp.partition, pos, None, raw, (), 0, err))
                    continue
                batch.records.append(SinkRecord(tp.topic, tp.partition, pos, None, value, raw))
        return batch


class MemoryDeadLetters(MemorySink):
    """The dead-letter sink's contract on the memory store: bad records become visible with the cycle."""

    def report(self, failed: list[FailedRecord]) -> None:
        self._batch.extend(SinkRecord(f.topic, f.partition, f.offset, f.key, {"error": str(f.error), "stage": f.stage},
                                      f.value) for f in failed)

    def write(self, records) -> None:
        pass


class RejectingSink(MemorySink):
    """A sink that refuses records whose value has ``"bad": true`` at prepare, naming the record."""

    def pre_commit(self, manifest: TxnManifest) -> None:
        for r in self._batch:
            if isinstance(r.value, dict) and r.value.get("bad"):
                raise RecordError("does not fit", topic=r.topic, partition=r.partition, offset=r.offset, column="x")
        super().pre_commit(manifest)


class FlakySink(MemorySink):
    """Every prepare fails as retryable (a database that stays away)."""

    def pre_commit(self, manifest: TxnManifest) -> None:
        raise RetryableError("the database is away", component="flaky")


def _task(name: str, data: Mapping[TopicPartition, list[bytes]], *, sink_cls=MemorySink, tolerate: bool = True,
          source_cls=ToleratingListSource, **settings) -> tuple[SinkTask, MemoryDecisionLog]:
    for store in (f"{name}-sink", f"{name}-dlq"):
        memory.drop_store(store)
    log = MemoryDecisionLog()
    dlq = MemoryDeadLetters("c", {"memory.store": f"{name}-dlq"}) if tolerate else None
    task = SinkTask("c", "w1", [sink_cls("c", {"memory.store": f"{name}-sink"})], source_cls(dict(data)), log,
                    TaskSettings(commit_interval_s=0, tolerate_errors=tolerate, **settings), sleep=lambda _s: None,
                    dead_letter=dlq)
    task.open()
    task.assign(list(data))
    return task, log


def _offsets(store: str) -> list[int]:
    return sorted(r.offset for r in memory.store(store).committed)


def test_undecodable_records_go_to_the_dead_letter_sink_and_the_partition_moves_past_them(request):
    name = request.node.name
    data = {TP: [b'{"id": 0}', b"{broken", b'{"id": 2}', b"nope"]}  # the last record is bad: the decision must pass it
    task, log = _task(name, data)
    r = task.run_cycle()
    assert r.outcome is CycleOutcome.SUCCEEDED and r.records == 2
    assert _offsets(f"{name}-sink") == [0, 2] and _offsets(f"{name}-dlq") == [1, 3]
    assert log.read("c", [TP])[TP].next_offset == 4
    assert task.run_cycle().outcome is CycleOutcome.EMPTY, "a bad record was read again"
    assert _offsets(f"{name}-dlq") == [1, 3]


def test_a_batch_of_only_bad_records_still_commits_and_advances(request):
    name = request.node.name
    task, log = _task(name, {TP: [b"{x", b"{y"]})
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert _offsets(f"{name}-sink") == [] and _offsets(f"{name}-dlq") == [0, 1]
    assert log.read("c", [TP])[TP].next_offset == 2


def test_a_record_the_sink_rejects_is_redone_without_it_and_dead_lettered_once(request):
    name = request.node.name
    data = {TP: [json.dumps({"id": i, "bad": i in (3, 7)}).encode() for i in range(10)]}
    task, log = _task(name, data, sink_cls=RejectingSink)
    r = task.run_cycle()
    assert r.outcome is CycleOutcome.SUCCEEDED, r
    assert _offsets(f"{name}-sink") == [0, 1, 2, 4, 5, 6, 8, 9]
    dlq = memory.store(f"{name}-dlq").committed
    assert [d.offset for d in dlq] == [3, 7] and all(d.value["stage"] == "TASK_PUT" and "column 'x'" in d.value["error"]
                                                      for d in dlq)
    assert not memory.store(f"{name}-sink").prepared and not memory.store(f"{name}-dlq").prepared
    assert task.run_cycle().outcome is CycleOutcome.EMPTY and log.read("c", [TP])[TP].next_offset == 10


def test_a_rejected_record_without_tolerance_fails_the_task_naming_it(request):
    name = request.node.name
    data = {TP: [json.dumps({"id": i, "bad": i == 2}).encode() for i in range(5)]}
    task, _ = _task(name, data, sink_cls=RejectingSink, tolerate=False, source_cls=ListSource)
    assert task.run_cycle().outcome is CycleOutcome.FATAL
    assert task.state is TaskState.FAILED and "outbox[0]@2" in task.trace
    assert _offsets(f"{name}-sink") == []


def _run_for(task: SinkTask, seconds: float) -> None:
    stop = threading.Event()
    t = threading.Thread(target=task.run, args=(stop,))
    t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and task.state is not TaskState.FAILED:
        time.sleep(0.02)
    stop.set()
    t.join(10)


def test_retry_timeout_fails_the_task_after_persistent_retryable_sink_errors(request):
    task, _ = _task(request.node.name, {TP: [b'{"id": 1}']}, sink_cls=FlakySink, tolerate=False,
                    retry_timeout_s=0.3, backoff_initial_s=0.01, backoff_max_s=0.02)
    _run_for(task, 5)
    assert task.trace is not None and "errors.retry.timeout=300 ms" in task.trace and "the database is away" in task.trace


def test_without_a_retry_timeout_retryable_errors_are_retried_forever(request):
    task, _ = _task(request.node.name, {TP: [b'{"id": 1}']}, sink_cls=FlakySink, tolerate=False,
                    backoff_initial_s=0.01, backoff_max_s=0.02)
    _run_for(task, 1.0)
    assert task.trace is None, task.trace


# -- against the real stack ----------------------------------------------------------------------------------
def _publish(bootstrap: str, topic: str, partitions: int, n: int, *, aborted: bool = False, prefix: str = "g"):
    """Good records interleaved with poison ones: undecodable (every 7th) and a string for a bigint column
    (every 11th). Returns (good ids, poison values by (partition, sequence))."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"dlq-{topic}-{prefix}", "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    good, poison = set(), []
    for i in range(n):
        if i % 7 == 3:
            value = f'{{"id": "{prefix}-undecodable-{i}", broken'.encode()
            poison.append(value)
        elif i % 11 == 5:
            value = json.dumps({"id": f"{prefix}-wrongtype-{i}", "amount": f"lots-{i}"}).encode()
            poison.append(value)
        else:
            value = json.dumps({"id": f"{prefix}-{i}", "amount": i}).encode()
            good.add(f"{prefix}-{i}")
        p.produce(topic, value=value, partition=i % partitions)
    if aborted:
        p.flush(30)
        p.abort_transaction(30)
    else:
        p.commit_transaction(30)
    return good, poison


def _read_dlq(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    md = c.list_topics(topic, timeout=10)
    c.assign([KTP(topic, p, 0) for p in md.topics[topic].partitions])
    out, deadline, quiet_since = [], time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < deadline:
        msgs = [m for m in c.consume(500, timeout=0.5) if m.error() is None]
        out += msgs
        if msgs:
            quiet_since = time.monotonic()
        elif len(out) >= expected and time.monotonic() - quiet_since > 3:
            break  # nothing more for 3 s: a duplicate would have shown by now
    c.close()
    return out


@pytest.mark.chaos
@pytest.mark.parametrize("fault", ["after_decide:2", "mid_commit:2", "after_prepare:3"])
def test_poison_records_reach_the_dead_letter_topic_exactly_once_across_kill_9(fault, stack, make_topic, unique, pg, zk, tmp_path):
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids

    topic = make_topic(3)
    dlq = f"{topic}-dlq"
    connector = unique.replace("_", "-")
    pg.execute(f'CREATE TABLE "{unique}" (id text, amount bigint)')
    good, poison = _publish(stack.kafka_bootstrap, topic, 3, 300)
    _, aborted_poison = _publish(stack.kafka_bootstrap, topic, 3, 40, aborted=True, prefix="aborted")
    register(stack.zookeeper_hosts, unique, connector, {
        "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}", "table.name.format": unique,
        "errors.tolerance": "all", "errors.deadletterqueue.topic.name": dlq, "errors.log.enable": "true",
        "commit.interval.ms": "200", "batch.max.records": "40",
    })
    first = WorkerProcess(stack, unique, "w-dies", tmp_path, fault=fault)
    assert first.wait(120) == -signal.SIGKILL, f"not killed at {fault}:\n{first.log_text()[-3000:]}"
    second = WorkerProcess(stack, unique, "w-after", tmp_path)
    try:
        wait_until(lambda: set(pg_ids(pg, unique)) >= good, 120, f"{len(good)} good records in PostgreSQL")
        records = _read_dlq(stack.kafka_bootstrap, dlq, len(poison))
    finally:
        assert second.stop() == 0, second.log_text()[-3000:]
    ids = pg_ids(pg, unique)
    assert len(ids) == len(set(ids)) and set(ids) == good, "good records: not exactly once"
    values = Counter(m.value() for m in records)
    assert values == Counter(poison), f"dead-letter topic: missing {set(poison) - set(values)}, " \
                                      f"duplicated {[v for v, n in values.items() if n > 1]}"
    assert not set(values) & set(aborted_poison), "a record of an aborted Kafka transaction was dead-lettered"
    for m in records:
        h = {k: v.decode() for k, v in m.headers()}
        assert h["__connect.errors.topic"] == topic and h["__connect.errors.connector.name"] == connector
        assert int(h["__connect.errors.partition"]) in (0, 1, 2) and int(h["__connect.errors.offset"]) >= 0
        assert h["__connect.errors.exception.class.name"] == "eosink.connectors.api.errors.RecordError"
        if b"undecodable" in m.value():
            assert h["__connect.errors.stage"] == "VALUE_CONVERTER" and "decoded" in h["__connect.errors.exception.message"]
        else:
            assert h["__connect.errors.stage"] == "TASK_PUT" and "column 'amount'" in h["__connect.errors.exception.message"]
        assert f"{topic}[{h['__connect.errors.partition']}]@{h['__connect.errors.offset']}" in h["__connect.errors.exception.message"]
    coordinates = Counter((dict(m.headers())["__connect.errors.partition"], dict(m.headers())["__connect.errors.offset"])
                          for m in records)
    assert len(coordinates) == len(poison) and set(coordinates.values()) == {1}, "a source record dead-lettered twice"
    left = zk.get_children(f"/eosink/{unique}/deadletter/{connector}") if zk.exists(f"/eosink/{unique}/deadletter/{connector}") else []
    assert left == [], f"dead-letter manifests left: {left}"
    prepared = pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{connector}.%",)).fetchone()[0]
    assert prepared == 0
    log = second.log_path.read_text()
    if fault.split(":")[0] in ("after_decide", "mid_commit"):
        assert "dead_letter_redelivered" in log or "dead_letter_already_committed" in log, \
            "recovery did not complete the decided dead-letter write"
    assert '"record_tolerated"' in log and '"partition"' in log and '"epoch"' in log, "errors.log.enable logs with context"


@pytest.mark.chaos
def test_tolerance_none_fails_the_task_with_the_reason_in_status(stack, make_topic, unique, pg, tmp_path):
    from tests.procs import wait_until
    from tests.restkit import call, pg_ids, produce, start_worker

    topic = make_topic(1)
    produce(stack.kafka_bootstrap, topic, [(0, b'{"id": "a", "amount": 1}'), (0, b'{"id": "b", "amount": "x"}'),
                                           (0, b'{"id": "c", "amount": 3}')])
    pg.execute(f'CREATE TABLE "{unique}" (id text, amount bigint)')
    w = start_worker(stack, unique, "w-strict", tmp_path)
    status = f"/connectors/{unique}/status"
    try:
        call(w.url, "POST", "/connectors", {"name": unique, "config": {
            "connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn, "table.name.format": unique}})
        wait_until(lambda: call(w.url, "GET", status)[1]["connector"]["state"] == "FAILED", 60, "the task to fail")
        trace = call(w.url, "GET", status)[1]["tasks"][0]["trace"]
        assert f"{topic}[0]@1" in trace and "column 'amount'" in trace, trace
        assert pg_ids(pg, unique) == [], "the failed cycle delivered part of its batch"
    finally:
        w.stop()
