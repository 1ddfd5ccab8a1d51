"""Deterministic model tests of the commit cycle: a failure at every step and in every sink
operation (abort and recover included), crashes, restarts and zombies, then the invariants.

Only Kafka is replaced (by the read_committed view in ``ListSource``); the engine, the memory
sinks and the decision log are the real code.
"""

from __future__ import annotations

import itertools
import json

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eosink.connectors import memory
from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from tests.fakes import FailingSink, FaultPlan, FlakyDecisionLog, ListSource, fatal, retryable, unknown

TPS = [TopicPartition("outbox", 0), TopicPartition("outbox", 1)]
SINKS = ("a", "b")
_ids = itertools.count()


class World:
    """One connector, two sinks (fan-out), one decision log; tasks come and go."""

    def __init__(self) -> None:
        n = next(_ids)
        self.stores = {label: f"model-{n}-{label}" for label in SINKS}
        for name in self.stores.values():
            memory.drop_store(name)
        self.data = {tp: [] for tp in TPS}
        self.log = MemoryDecisionLog()
        self.plan = FaultPlan()
        self.workers = itertools.count()
        self.task = self.new_task()

    def produce(self, tp: TopicPartition, n: int) -> None:
        start = len(self.data[tp])
        self.data[tp].extend(json.dumps({"id": f"{tp}-{i}"}).encode() for i in range(start, start + n))

    def new_task(self) -> SinkTask:
        wid = f"w{next(self.workers)}"
        sinks = [FailingSink("c", self.stores[label], self.plan, label) for label in SINKS]
        task = SinkTask(
            "c", wid, sinks, ListSource(self.data), FlakyDecisionLog(self.log, self.plan, wid),
            TaskSettings(commit_interval_s=0, max_records=7, commit_retries=2, unknown_decision_wait_s=0.01),
            sleep=lambda _s: None,
        )
        task.open()
        return task

    def restart(self) -> None:
        """A crash or an operator restart: the old task vanishes without cleaning up."""
        self.task = self.new_task()
        self.task.assign(TPS)

    def committed(self, label: str) -> list[tuple[TopicPartition, int]]:
        return [(r.tp, r.offset) for r in memory.store(self.stores[label]).committed]

    def check_safety(self) -> None:
        for label in SINKS:
            seen = self.committed(label)
            assert len(seen) == len(set(seen)), f"sink {label} holds a record twice"
            decided = self.log.read("c", TPS)
            for tp in TPS:
                offsets = sorted(o for t, o in seen if t == tp)
                assert offsets == list(range(len(offsets))), f"sink {label} {tp}: not a gap-free prefix: {offsets}"
                assert len(offsets) <= (decided[tp].next_offset or 0), f"sink {label} {tp}: visible beyond the decision"
                assert all(o < len(self.data[tp]) for o in offsets)

    def drain(self) -> None:
        """No more faults: restart, run to the end, and everything is delivered once."""
        self.plan.armed.clear()
        self.plan.hooks.clear()
        self.restart()
        for _ in range(200):
            r = self.task.run_cycle()
            assert self.task.state is not TaskState.FAILED, self.task.trace
            if r.outcome is CycleOutcome.EMPTY:
                break
        self.check_safety()
        for label in SINKS:
            assert sorted(self.committed(label)) == sorted((tp, o) for tp in TPS for o in range(len(self.data[tp])))
            assert not memory.store(self.stores[label]).prepared, "a prepared txn was left unresolved"
        assert not self.task.unresolved


SINK_OPS = ("begin", "write", "pre_commit", "commit", "abort", "recover")


class CommitCycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.world.task.assign(TPS)

    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 12))
    def produce(self, tp, n):
        self.world.produce(tp, n)

    @rule(label=st.sampled_from(SINKS), op=st.sampled_from(SINK_OPS), kind=st.sampled_from(["retryable", "fatal"]))
    def arm_sink_fault(self, label, op, kind):
        self.world.plan.armed[(label, op)] = retryable() if kind == "retryable" else fatal()

    @rule(kind=st.sampled_from(["refuse", "unknown_before_write", "unknown_after_write", "unknown_lost"]))
    def arm_decision_fault(self, kind):
        plan = self.world.plan
        if kind == "refuse":
            plan.armed[("decision", "refuse")] = retryable("suspended: not sent")
        elif kind == "unknown_before_write":
            plan.armed[("decision", "unknown_before_write")] = unknown()
        else:
            plan.armed[("decision", kind)] = unknown()

    @rule(when=st.sampled_from(["write", "pre_commit", "after_pre_commit"]))
    def zombie_is_fenced_mid_cycle(self, when):
        """Mid-cycle, a new owner takes every partition (epoch bump): the old task's decision
        is refused, it aborts what it prepared, and the new owner carries on."""
        world = self.world
        old = world.task

        def steal() -> None:
            world.task = world.new_task()
            world.task.assign(TPS)

        world.plan.hooks[(SINKS[-1], when)] = steal
        r = old.run_cycle()
        world.plan.hooks.clear()
        if world.task is not old and r.outcome is not CycleOutcome.EMPTY:
            assert r.outcome in (CycleOutcome.FENCED, CycleOutcome.FATAL, CycleOutcome.ABORTED), r
            if r.outcome is CycleOutcome.FENCED:
                assert not (r.error.partitions & set(old.grants)), "a fenced task kept a fenced partition"
                for label in SINKS:
                    left = r.txn_id in memory.store(world.stores[label]).prepared
                    assert not left or r.txn_id in old.fanout.abort_pending, "the zombie left its txn prepared and forgot it"

    @rule()
    def cycle(self):
        self.world.task.run_cycle()

    @rule()
    def crash_and_restart(self):
        self.world.restart()

    @precondition(lambda self: self.world.task.state in (TaskState.FAILED, TaskState.UNASSIGNED))
    @rule()
    def operator_restarts_failed_task(self):
        self.world.restart()

    @invariant()
    def safety(self):
        self.world.check_safety()

    def teardown(self):
        self.world.drain()


TestCommitCycleModel = CommitCycleMachine.TestCase
TestCommitCycleModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
