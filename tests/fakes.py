"""Fakes named for their behaviour, for the deterministic model tests of the commit cycle.

They wrap the real in-memory sink and decision log; only Kafka is replaced, by
:class:`ListSource` (the read_committed view of an outbox: a list of records per partition).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from eosink.connectors.api.errors import CommitStateUnknownError, FatalError, RecordError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.memory import MemorySink
from eosink.worker.engine.batch import Batch
from eosink.worker.engine.decision import MemoryDecisionLog


class ListSource:
    """An outbox held in lists; ``poll_batch`` round-robins over the assigned partitions."""

    def __init__(self, data: dict[TopicPartition, list[bytes]]) -> None:
        self.data = data
        self.positions: dict[TopicPartition, int] = {}
        self.committed_offsets: dict[TopicPartition, int] = {}

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        self.positions = {tp: (off or 0) for tp, off in positions.items()}

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float) -> Batch:
        batch = Batch()
        progressed = True
        while progressed and len(batch.records) < max_records:
            progressed = False
            for tp in sorted(self.positions):
                pos = self.positions[tp]
                if pos >= len(self.data[tp]) or len(batch.records) >= max_records:
                    continue
                raw = self.data[tp][pos]
                try:
                    value = json.loads(raw)
                except ValueError as exc:
                    batch.error = RecordError(str(exc), topic=tp.topic, partition=tp.partition, offset=pos)
                    return batch
                batch.records.append(SinkRecord(tp.topic, tp.partition, pos, None, value, raw))
                batch.nbytes += len(raw)
                self.positions[tp] = pos + 1
                progressed = True
        return batch

    def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.committed_offsets.update(offsets)

    def lag(self, *, fresh: bool = False) -> dict[TopicPartition, int]:
        return {tp: len(self.data[tp]) - p for tp, p in self.positions.items()}

    def close(self) -> None:
        pass


@dataclass
class FaultPlan:
    """Faults armed by the test: ``(target, op) -> exception factory``; each fires once."""

    armed: dict[tuple[str, str], Callable[[], BaseException]] = field(default_factory=dict)
    hooks: dict[tuple[str, str], Callable[[], None]] = field(default_factory=dict)

    def fire(self, target: str, op: str) -> None:
        hook = self.hooks.pop((target, op), None)
        if hook is not None:
            hook()
        make = self.armed.pop((target, op), None)
        if make is not None:
            raise make()


class FailingSink(MemorySink):
    """A memory sink whose operations raise when the plan says so (before doing anything)."""

    def __init__(self, connector: str, store_name: str, plan: FaultPlan, label: str) -> None:
        super().__init__(connector, {"memory.store": store_name})
        self.plan, self.label = plan, label

    def begin_transaction(self, txn_id: str) -> None:
        self.plan.fire(self.label, "begin")
        super().begin_transaction(txn_id)

    def write(self, records) -> None:
        self.plan.fire(self.label, "write")
        super().write(records)

    def pre_commit(self, manifest: TxnManifest) -> None:
        self.plan.fire(self.label, "pre_commit")
        super().pre_commit(manifest)
        self.plan.fire(self.label, "after_pre_commit")

    def commit(self, txn_id: str) -> None:
        self.plan.fire(self.label, "commit")
        super().commit(txn_id)

    def abort(self, txn_id: str) -> None:
        self.plan.fire(self.label, "abort")
        super().abort(txn_id)

    def recover(self) -> list[TxnManifest]:
        self.plan.fire(self.label, "recover")
        return super().recover()


class FlakyDecisionLog:
    """The in-memory decision log, with decisions that can be refused, lost or made unreadable."""

    def __init__(self, inner: MemoryDecisionLog, plan: FaultPlan, owner: str) -> None:
        self.inner, self.plan, self.owner = inner, plan, owner
        self.unreadable = False

    def acquire(self, connector, partitions):
        return self.inner.acquire(connector, partitions, owner=self.owner)

    def decide(self, connector, txn_id, next_offsets, grants):
        self.plan.fire("decision", "refuse")  # raises before anything is written
        if ("decision", "unknown_after_write") in self.plan.armed:
            self.plan.armed.pop(("decision", "unknown_after_write"))
            self.inner.decide(connector, txn_id, next_offsets, grants)
            raise CommitStateUnknownError("connection lost after the write")
        if ("decision", "unknown_lost") in self.plan.armed:
            self.plan.armed.pop(("decision", "unknown_lost"))
            self.inner.decide(connector, txn_id, next_offsets, grants)
            self.unreadable = True  # the session is gone: the log cannot be read in time
            raise CommitStateUnknownError("session lost after the write")
        self.plan.fire("decision", "unknown_before_write")
        return self.inner.decide(connector, txn_id, next_offsets, grants)

    def read(self, connector, partitions):
        if self.unreadable:
            raise RetryableError("not connected")
        return self.inner.read(connector, partitions)

    def release(self, connector, grants):
        self.inner.release(connector, grants)

    def new_generation(self, connector):
        return self.inner.new_generation(connector)


def retryable(msg: str = "injected retryable") -> Callable[[], BaseException]:
    return lambda: RetryableError(msg, component="fault")


def fatal(msg: str = "injected fatal") -> Callable[[], BaseException]:
    return lambda: FatalError(msg, component="fault")


def unknown(msg: str = "injected unknown") -> Callable[[], BaseException]:
    return lambda: CommitStateUnknownError(msg, component="fault")
