"""What a running task shows the outside: its ``/status`` snapshot and the live metrics' state.

Both are read from other threads (the worker's status loop, a Prometheus scrape) while the task
thread runs a cycle, so neither takes the cycle lock, which a cycle holds for up to
``commit.interval.ms``: ``list(dict)`` and ``dict.copy()`` are atomic under the GIL, so each copy
is consistent per field. Both report only what the task holds now, so a partition that moved to
another worker disappears from here at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.types import TaskState, TaskStatus

if TYPE_CHECKING:
    from eosink.worker.engine.task import SinkTask


def stalled_of(task: SinkTask) -> dict[TopicPartition, float]:
    """Seconds each held partition has stood behind an open transaction (see :mod:`eosink.worker.engine.stall`).
    Only a Kafka source can tell; another (a test's list of records) has no watermark."""
    watch = getattr(task.source, "stalls", None)
    held = set(task.grants)
    return {tp: s for tp, s in watch.stalled().items() if tp in held} if watch is not None else {}


def status_of(task: SinkTask) -> TaskStatus:
    grants = list(task.grants)
    delivered, lag = task.delivered.copy(), task.lag.copy()
    return TaskStatus(task.state, sorted(str(tp) for tp in grants), task.trace, list(task.unresolved.values()),
                      {str(tp): delivered.get(tp, 0) for tp in grants},
                      {str(tp): n for tp, n in lag.items() if tp in grants}, task.pause_applied,
                      task.retry_timeout.describe(), {str(tp): round(s) for tp, s in stalled_of(task).items()})


def gauges_of(task: SinkTask) -> dict[str, Any]:
    held = set(task.grants)
    return {"failed": task.state is TaskState.FAILED, "partitions": held,
            "lag": {tp: n for tp, n in task.lag.copy().items() if tp in held},
            "stalled": stalled_of(task),
            "last_commit": {tp: t for tp, t in task.last_commit.copy().items() if tp in held},
            "unresolved_since": [u.since for u in list(task.unresolved.values())]}
