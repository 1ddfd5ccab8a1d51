"""The failure table of docs/concepts/commit-cycle.md, one row per test, on the real engine and memory sinks."""

from __future__ import annotations

import json

import pytest

from eosink.connectors import memory
from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from tests.fakes import FailingSink, FaultPlan, FlakyDecisionLog, ListSource, fatal, retryable, unknown

TP = TopicPartition("outbox", 0)


class Rig:
    def __init__(self, name: str, n: int = 10) -> None:
        self.stores = {lbl: f"{name}-{lbl}" for lbl in ("a", "b")}
        for s in self.stores.values():
            memory.drop_store(s)
        self.data = {TP: [json.dumps({"id": i}).encode() for i in range(n)]}
        self.log = MemoryDecisionLog()
        self.plan = FaultPlan()
        self.n = 0

    def task(self, **settings) -> SinkTask:
        self.n += 1
        sinks = [FailingSink("c", self.stores[lbl], self.plan, lbl) for lbl in ("a", "b")]
        t = SinkTask("c", f"w{self.n}", sinks, ListSource(self.data), FlakyDecisionLog(self.log, self.plan, f"w{self.n}"),
                     TaskSettings(commit_interval_s=0, commit_retries=2, unknown_decision_wait_s=0.01, **settings),
                     sleep=lambda _s: None)
        t.open()
        t.assign([TP])
        return t

    def visible(self, lbl: str) -> list[int]:
        return sorted(r.offset for r in memory.store(self.stores[lbl]).committed)

    def prepared(self, lbl: str) -> list[str]:
        return sorted(memory.store(self.stores[lbl]).prepared)


@pytest.fixture
def rig(request) -> Rig:
    return Rig(request.node.name)


@pytest.mark.parametrize("op", ["begin", "write", "pre_commit"])
def test_failure_before_decision_aborts_every_sink_and_retries(rig, op):
    task = rig.task()
    rig.plan.armed[("b", op)] = retryable()
    assert task.run_cycle().outcome is CycleOutcome.ABORTED
    assert rig.visible("a") == rig.visible("b") == [] and rig.prepared("a") == rig.prepared("b") == []
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert rig.visible("a") == rig.visible("b") == list(range(10))


def test_fenced_decision_aborts_and_drops_the_partition(rig):
    zombie = rig.task()
    rig.plan.hooks[("b", "after_pre_commit")] = lambda: rig.log.acquire("c", [TP], owner="newer")
    r = zombie.run_cycle()
    assert r.outcome is CycleOutcome.FENCED and TP not in zombie.grants
    assert rig.prepared("a") == rig.prepared("b") == [] and rig.visible("a") == []


def test_decision_refused_before_sending_is_aborted_and_retried(rig):
    task = rig.task()
    rig.plan.armed[("decision", "refuse")] = retryable("suspended")
    assert task.run_cycle().outcome is CycleOutcome.ABORTED
    assert rig.prepared("a") == [] and task.run_cycle().outcome is CycleOutcome.SUCCEEDED


def test_unknown_decision_that_was_recorded_is_committed(rig):
    task = rig.task()
    rig.plan.armed[("decision", "unknown_after_write")] = unknown()
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert rig.visible("a") == rig.visible("b") == list(range(10))


def test_unknown_decision_that_was_not_recorded_is_aborted(rig):
    task = rig.task()
    rig.plan.armed[("decision", "unknown_before_write")] = unknown()
    assert task.run_cycle().outcome is CycleOutcome.ABORTED
    assert rig.visible("a") == [] and rig.prepared("a") == []


def test_unknown_decision_with_session_lost_is_left_to_the_next_owners_recovery(rig):
    task = rig.task()
    rig.plan.armed[("decision", "unknown_lost")] = unknown()
    r = task.run_cycle()
    assert r.outcome is CycleOutcome.FENCED and not task.grants
    assert rig.prepared("a") == [r.txn_id] and rig.visible("a") == []  # neither committed nor aborted blindly
    heir = rig.task()  # acquires, recovers: the log names the txn -> commit
    assert rig.visible("a") == rig.visible("b") == list(range(10)) and rig.prepared("b") == []
    assert heir.run_cycle().outcome is CycleOutcome.EMPTY


def test_commit_failure_is_fatal_and_recovery_commits_on_restart(rig):
    task = rig.task()
    rig.plan.armed[("b", "commit")] = fatal("disk gone")
    r = task.run_cycle()
    assert r.outcome is CycleOutcome.FATAL and task.state is TaskState.FAILED
    assert "the decision stands" in task.trace
    assert rig.visible("a") == list(range(10)) and rig.visible("b") == []
    rig.task()  # operator restart
    assert rig.visible("b") == list(range(10)) and rig.prepared("b") == []


def test_commit_is_retried_in_place_on_retryable_errors(rig):
    task = rig.task()
    rig.plan.armed[("a", "commit")] = retryable("blip")
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert rig.visible("a") == list(range(10))


def test_failed_abort_is_retried_before_the_next_cycle(rig):
    task = rig.task()
    rig.plan.armed[("a", "pre_commit")] = retryable()
    rig.plan.armed[("b", "abort")] = retryable("abort failed too")
    assert task.run_cycle().outcome is CycleOutcome.ABORTED
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert rig.prepared("b") == [] and rig.visible("b") == list(range(10))


def test_failed_recover_holds_the_partition_until_it_succeeds(rig):
    rig.plan.armed[("a", "recover")] = retryable("store down")
    task = rig.task()
    assert task.active_partitions() == []
    assert task.run_cycle().outcome in (CycleOutcome.SUCCEEDED, CycleOutcome.EMPTY)
    task.run_cycle()
    assert rig.visible("a") == list(range(10))


def test_failed_recover_is_the_aborted_cycles_error_so_the_status_keeps_showing_it(rig):
    """A recovery that keeps failing (a full disk, a database away) is what /status shows as being
    retried: a cycle it aborts carries its error, not none (which cleared the status)."""
    task = rig.task()
    rig.plan.armed[("a", "pre_commit")] = retryable("no space left on /vol")
    first = task.run_cycle()
    assert first.outcome is CycleOutcome.ABORTED and task.retry_timeout.gave_up(first) is None
    rig.plan.armed[("a", "recover")] = retryable("no space left on /vol, recovering")
    second = task.run_cycle()
    assert second.outcome is CycleOutcome.ABORTED and "recovering" in str(second.error)
    task.retry_timeout.gave_up(second)
    assert "no space left on /vol, recovering (retrying for" in (task.retry_timeout.describe() or "")
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert rig.visible("a") == list(range(10))


def test_txn_ids_differ_across_clusters_sharing_a_sink(request):
    """Two clusters (two decision logs, both at generation 1) with the same connector and worker
    names writing into one database must never produce the same txn id."""
    a, b = Rig(request.node.name + "-a"), Rig(request.node.name + "-b")
    ids_a = {a.task().next_txn_id() for _ in range(3)}
    ids_b = {b.task().next_txn_id() for _ in range(3)}
    assert not ids_a & ids_b


def test_txn_ids_are_unique_across_restarts(rig):
    ids = set()
    for _ in range(3):
        t = rig.task()
        ids |= {t.next_txn_id() for _ in range(3)}
    assert len(ids) == 9


def test_bad_record_commits_what_precedes_it_and_fails_naming_the_offset(rig):
    rig.data[TP][4] = b"{not json"
    task = rig.task()
    r = task.run_cycle()
    assert r.outcome is CycleOutcome.FATAL and task.state is TaskState.FAILED
    assert "outbox[0]@4" in task.trace
    assert rig.visible("a") == [0, 1, 2, 3]
    assert rig.log.read("c", [TP])[TP].next_offset == 4


def test_prepare_with_stale_epoch_is_refused_by_the_resource(rig):
    old = rig.task()
    new = rig.task()
    new.run_cycle()
    rig.data[TP].append(b'{"id": 10}')
    from eosink.connectors.api.errors import FencedError
    from eosink.connectors.api.records import PartitionRange, TxnManifest

    sink = old.sinks[0]
    sink.begin_transaction("stale")
    with pytest.raises(FencedError):
        sink.pre_commit(TxnManifest("stale", "c", (PartitionRange("outbox", 0, 10, 10, old.grants[TP].epoch),)))


class RewindingSource(ListSource):
    """A consumer that, once, serves a partition again from its start after delivering part of it:
    what librdkafka did once after an assignment change in the rolling-restart test."""

    def __init__(self, data) -> None:
        super().__init__(data)
        self.rewinds_left = 1

    def poll_batch(self, max_records, max_bytes, timeout_s):
        if self.rewinds_left and any(pos > 0 for pos in self.positions.values()):
            self.rewinds_left -= 1
            self.positions = {tp: 0 for tp in self.positions}
        return super().poll_batch(max_records, max_bytes, timeout_s)


def test_consumer_going_back_behind_the_decision_is_refused_not_delivered_twice(rig):
    task = SinkTask("c", "w1", [FailingSink("c", rig.stores["a"], rig.plan, "a")], RewindingSource(rig.data), rig.log,
                    TaskSettings(commit_interval_s=0, max_records=4), sleep=lambda _s: None)
    task.open()
    task.assign([TP])
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED  # offsets 0-3, decided
    r = task.run_cycle()  # the consumer serves 0-3 again
    assert r.outcome is CycleOutcome.ABORTED and "went back" in str(r.error)
    while task.run_cycle().outcome is CycleOutcome.SUCCEEDED:
        pass
    assert rig.visible("a") == list(range(10)) and rig.prepared("a") == []
