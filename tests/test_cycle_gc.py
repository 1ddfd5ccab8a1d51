"""The cyclic garbage collector around a task's cycles: paused across a backlog, back once the task idles."""

from __future__ import annotations

import gc
import json
import threading

from eosink.connectors import memory
from eosink.connectors.api.errors import FatalError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, CycleResult, TaskSettings
from tests.fakes import ListSource

TP = TopicPartition("outbox", 0)


def test_the_collector_stays_paused_between_cycles_of_a_backlog_so_no_collection_walks_the_last_batch(request):
    """A cycle's records outlive it (the source frees them while it reads the next batch) and were made
    with the collector paused: resumed between two cycles, its first collection walks them all. Across
    cycles that deliver back to back it stays paused; once the task has nothing to read, and after it
    stops, it is back on."""
    store = f"{request.node.name}-store"
    memory.drop_store(store)
    data = {TP: [json.dumps({"id": i}).encode() for i in range(10)]}
    task = SinkTask("c", "w1", [memory.MemorySink("c", {"memory.store": store})], ListSource(data), MemoryDecisionLog(),
                    TaskSettings(commit_interval_s=0, max_records=2), sleep=lambda _s: None)
    seen: list[tuple[CycleOutcome, bool]] = []  # each cycle's outcome, and the collector right after it
    stop = threading.Event()
    judge = task.retry_timeout.gave_up  # (the loop's first step after a cycle has settled the pause)

    def gave_up(result: CycleResult) -> FatalError | None:
        seen.append((result.outcome, gc.isenabled()))
        if sum(o is CycleOutcome.EMPTY for o, _ in seen) >= 3:
            stop.set()
        return judge(result)

    task.retry_timeout.gave_up = gave_up  # type: ignore[method-assign]
    was = gc.isenabled()
    gc.enable()
    try:
        task.open()
        task.request_assignment([TP])
        thread = threading.Thread(target=task.run, args=(stop,))
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the task did not stop"
        assert gc.isenabled(), "the collector was left paused after the task stopped"
    finally:
        (gc.enable if was else gc.disable)()
        task.close()
    delivering = [on for outcome, on in seen if outcome is CycleOutcome.SUCCEEDED]
    assert len(delivering) == 5 and sorted(r.offset for r in memory.store(store).committed) == list(range(10))
    assert not any(delivering), f"the collector was back on between cycles of the backlog: {seen}"
    assert all(on for outcome, on in seen if outcome is CycleOutcome.EMPTY), f"still paused with nothing to read: {seen}"
