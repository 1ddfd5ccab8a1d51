"""The engine around two per-cycle policies: transforms between decode and the sinks, and a
fence raised by a sink's resource (not the decision log), on the real engine and memory sinks."""

from __future__ import annotations

import json

import pytest

from eosink.connectors import memory
from eosink.connectors.api.errors import FencedError, RecordError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import metrics
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from eosink.worker.transforms import build_chain
from tests.fakes import FailingSink, FaultPlan, ListSource

TP = TopicPartition("orders", 0)


class ReportingSink(memory.MemorySink):
    """A dead-letter stand-in: keeps what the task reports as bad, in the txn of the good records."""

    def __init__(self, connector: str, store_name: str) -> None:
        super().__init__(connector, {"memory.store": store_name})
        self.reported: list = []

    def report(self, failed) -> None:
        self.reported.extend(failed)


def _task(name: str, values: list[dict], transforms: dict[str, str] | None = None, *, tolerate: bool = False,
          plan: FaultPlan | None = None):
    memory.drop_store(name)
    memory.drop_store(name + "-dlq")
    log = MemoryDecisionLog()
    sink = FailingSink("c", name, plan or FaultPlan(), "a")
    dlq = ReportingSink("c", name + "-dlq") if tolerate else None
    task = SinkTask("c", "w1", [sink], ListSource({TP: [json.dumps(v).encode() for v in values]}), log,
                    TaskSettings(commit_interval_s=0, tolerate_errors=tolerate), sleep=lambda _s: None,
                    dead_letter=dlq, transforms=build_chain(transforms) if transforms else None)
    task.open()
    task.assign([TP])
    return task, log, dlq


def _visible(name: str) -> list:
    return sorted((r.offset, r.topic, r.value) for r in memory.store(name).committed)


def test_transforms_change_what_the_sinks_get_and_a_dropped_record_still_advances_the_decision(request):
    name = request.node.name
    conf = {"transforms": "tag,onlyBig,route",
            "transforms.tag.type": "org.apache.kafka.connect.transforms.InsertField$Value",
            "transforms.tag.static.field": "source", "transforms.tag.static.value": "eosink",
            "transforms.onlyBig.type": "Filter", "transforms.onlyBig.predicate": "small",
            "transforms.route.type": "RegexRouter", "transforms.route.regex": "orders", "transforms.route.replacement": "big_orders",
            "predicates": "small", "predicates.small.type": "TopicNameMatches", "predicates.small.pattern": "none-such"}
    task, log, _ = _task(name, [{"id": i} for i in range(5)], conf)
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert _visible(name) == [(i, "big_orders", {"id": i, "source": "eosink"}) for i in range(5)]
    assert log.read("c", [TP])[TP].next_offset == 5
    # the same chain, with the Filter now matching every record: nothing delivered, offsets move on
    memory.drop_store(name)
    conf["predicates.small.pattern"] = "orders"
    task, log, _ = _task(name, [{"id": i} for i in range(3)], conf)
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert _visible(name) == []
    assert log.read("c", [TP])[TP].next_offset == 3


def test_a_transform_failing_on_a_record_fails_the_task_naming_it_without_tolerance(request):
    name = request.node.name
    conf = {"transforms": "pick", "transforms.pick.type": "ExtractField$Value", "transforms.pick.field": "id"}
    task, log, _ = _task(name, [{"id": 1}, [1, 2], {"id": 3}], conf)  # a JSON array is not a struct
    result = task.run_cycle()
    assert result.outcome is CycleOutcome.FATAL and task.state is TaskState.FAILED
    assert isinstance(result.error, RecordError) and "orders[0]@1" in str(result.error)
    assert "pick" in task.trace
    assert _visible(name) == [] and memory.store(name).prepared == {}
    assert log.read("c", [TP])[TP].next_offset is None


def test_a_transform_failing_on_a_record_sends_it_to_the_dead_letter_sink_under_tolerance_all(request):
    name = request.node.name
    conf = {"transforms": "pick", "transforms.pick.type": "ExtractField$Value", "transforms.pick.field": "id"}
    task, log, dlq = _task(name, [{"id": 1}, [1, 2], {"id": 3}], conf, tolerate=True)
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    assert [(o, v) for o, _t, v in _visible(name)] == [(0, 1), (2, 3)]
    assert [(f.offset, f.stage) for f in dlq.reported] == [(1, "TRANSFORMATION")]
    assert log.read("c", [TP])[TP].next_offset == 3


class FreshListSource(ListSource):
    """Marks its batches fresh, as KafkaSource does: the transforms may edit the decoded records in place."""

    def poll_batch(self, max_records, max_bytes, timeout_s):
        batch = super().poll_batch(max_records, max_bytes, timeout_s)
        batch.fresh = True
        return batch


def test_on_a_fresh_batch_the_transforms_edit_in_place_yet_a_failing_record_goes_out_as_it_was_read(request):
    name = request.node.name
    memory.drop_store(name)
    memory.drop_store(name + "-dlq")
    raws = [json.dumps({"id": i, "note": "n"}).encode() for i in (1, "one", 3)]  # "one" is no int8
    conf = {"transforms": "tag,cast", "transforms.tag.type": "InsertField$Value", "transforms.tag.static.field": "source",
            "transforms.tag.static.value": "eosink", "transforms.cast.type": "Cast$Value", "transforms.cast.spec": "id:int8"}
    dlq = ReportingSink("c", name + "-dlq")
    task = SinkTask("c", "w1", [FailingSink("c", name, FaultPlan(), "a")], FreshListSource({TP: raws}),
                    MemoryDecisionLog(), TaskSettings(commit_interval_s=0, tolerate_errors=True), sleep=lambda _s: None,
                    dead_letter=dlq, transforms=build_chain(conf))
    task.open()
    task.assign([TP])
    assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
    committed = sorted(memory.store(name).committed, key=lambda r: r.offset)
    assert [(r.offset, r.value) for r in committed] == [(0, {"id": 1, "note": "n", "source": "eosink"}),
                                                        (2, {"id": 3, "note": "n", "source": "eosink"})]
    assert all(json.loads(r.raw_value) == r.value for r in committed)
    assert [(f.offset, f.stage, f.value) for f in dlq.reported] == [(1, "TRANSFORMATION", raws[1])]


def test_a_sink_refusing_a_stale_epoch_at_prepare_is_a_fenced_attempt_and_drops_the_partitions(request):
    """A zombie refused by the resource (PostgreSQL's epoch row, S3's epoch object) is fenced there
    exactly as at the decision log: counted, aborted, and its partitions let go at once."""
    name = request.node.name
    plan = FaultPlan()
    plan.armed[("a", "pre_commit")] = lambda: FencedError("a newer epoch already committed", component="postgres")
    task, log, _ = _task(name, [{"id": i} for i in range(4)], plan=plan)
    dropped: list = []
    task.on_fenced = dropped.append
    before = metrics.FENCED.labels("c")._value.get()
    result = task.run_cycle()
    assert result.outcome is CycleOutcome.FENCED
    assert metrics.FENCED.labels("c")._value.get() == before + 1
    assert dropped == [frozenset({TP})] and task.grants == {} and task.state is TaskState.UNASSIGNED
    assert _visible(name) == [] and memory.store(name).prepared == {}
    assert log.read("c", [TP])[TP].next_offset is None
    assert task.run_cycle().outcome is CycleOutcome.EMPTY  # no more cycles on what it lost


@pytest.mark.parametrize("bad", ["tabel", "feilds"])
def test_a_misspelt_transform_key_is_refused_with_the_closest_key(bad):
    from eosink.connectors.api.errors import ConfigError

    key = {"tabel": "transforms.pick.fild", "feilds": "transforms.pick.feild"}[bad]
    with pytest.raises(ConfigError, match="did you mean"):
        build_chain({"transforms": "pick", "transforms.pick.type": "ExtractField$Value", key: "id"})


def test_a_fault_being_retried_shows_in_the_task_status_naming_its_component_until_a_cycle_gets_through(request):
    from eosink.connectors.api.errors import RetryableError

    name = request.node.name
    plan = FaultPlan()
    plan.armed[("a", "pre_commit")] = lambda: RetryableError("cannot connect to PostgreSQL at 127.0.0.1:1",
                                                             component="postgres")
    task, _log, _ = _task(name, [{"id": i} for i in range(3)], plan=plan)
    result = task.run_cycle()
    assert result.outcome is CycleOutcome.ABORTED and task.retry_timeout.gave_up(result) is None
    shown = task.status().retrying
    assert shown is not None and "[postgres]" in shown and "127.0.0.1:1" in shown and "retrying for" in shown
    assert task.status().state is TaskState.RUNNING and task.status().trace is None
    result = task.run_cycle()
    assert result.outcome is CycleOutcome.SUCCEEDED and task.retry_timeout.gave_up(result) is None
    assert task.status().retrying is None
