"""A pause holds from the first moment /status says PAUSED: no cycle in flight then delivers what comes after."""

from __future__ import annotations

import json

from eosink.connectors import memory
from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings
from tests.fakes import ListSource

TP = TopicPartition("outbox", 0)


def test_status_says_paused_only_once_no_cycle_is_in_flight_so_nothing_written_after_it_is_delivered(request):
    """The worker sets ``paused`` from its control thread while the task thread may be in a cycle, which
    delivers whatever it reads until it ends. Reported PAUSED at once, a record written right after the
    report could still be delivered by that cycle; the task reports it from the first cycle that sees it."""
    store = f"{request.node.name}-store"
    memory.drop_store(store)
    data = {TP: [json.dumps({"id": i}).encode() for i in range(4)]}
    task = SinkTask("c", "w1", [memory.MemorySink("c", {"memory.store": store})], ListSource(data), MemoryDecisionLog(),
                    TaskSettings(commit_interval_s=0, max_records=2), sleep=lambda _s: None)
    changes: list[bool] = []
    task.on_change = lambda: changes.append(task.status().paused)
    try:
        task.open()
        task.assign([TP])
        task.paused = True  # (the control thread; a cycle may be in flight on the task thread)
        assert not task.status().paused, "PAUSED reported before the task thread stopped cycling"
        assert task.run_cycle().outcome is CycleOutcome.EMPTY
        assert task.status().paused and changes == [True], "the applied pause was not reported"
        assert memory.store(store).committed == []
        task.paused = False
        assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
        assert not task.status().paused and changes == [True, False]
        assert [r.offset for r in memory.store(store).committed] == [0, 1]
    finally:
        task.close()
