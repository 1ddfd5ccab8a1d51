"""Prometheus metrics of the worker (served on ``/metrics`` of the REST port and on ``--metrics-port``).

Two kinds, on purpose:

* **Events** (cycles, records delivered and consumed, fenced attempts, recoveries, rebalances) are
  counters incremented where they happen; counters only grow, so a restart is visible as a reset.
* **State** (is the task failed, which partitions does this worker hold, their lag and freshness,
  what is prepared and unresolved, the ZooKeeper session, leadership) is read from the live
  objects *at scrape time* by :class:`LiveCollector`. A gauge set on a change would keep its last
  value after the change is undone: a recovered task would still read failed, a partition that
  moved to another worker would still report this worker's stale lag and be counted twice across
  the cluster. Read at scrape time, a series exists exactly while the state does.

Tasks and the worker register themselves (:func:`track_task`, :func:`track_worker`) and
unregister when they stop.
"""

from __future__ import annotations

import platform
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from eosink.worker.version import VERSION

CYCLES = Counter("eosink_cycles_total", "Commit cycles by outcome.", ["connector", "outcome"])
RECORDS = Counter("eosink_records_delivered_total", "Records made visible in the sinks.", ["connector"])
CONSUMED = Counter("eosink_records_consumed_total",
                   "Records read from the outbox topics (delivered, dead-lettered, filtered or read again after an abort).",
                   ["connector"])
BYTES = Counter("eosink_bytes_delivered_total", "Value bytes made visible in the sinks.", ["connector"])
CYCLE_SECONDS = Histogram(
    "eosink_cycle_duration_seconds",
    "Duration of a commit cycle from begin to commit.",
    ["connector"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STEP_SECONDS = Histogram(
    "eosink_cycle_step_seconds", "Duration of each step of the cycle.", ["connector", "step"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
FENCED = Counter("eosink_fenced_attempts_total",
                 "Cycles refused because a newer epoch owns a partition (at the decision log or at a sink's resource).",
                 ["connector"])
STALE_BATCHES = Counter("eosink_stale_batches_total", "Batches refused because the consumer went back behind the decision log.",
                        ["connector"])
RECOVERED = Counter("eosink_recovered_txns_total", "Prepared transactions resolved by recovery.", ["connector", "action"])
AUDIT_RECORDS = Counter("eosink_audit_records_total", "Due records checked by the continuous audit, per sink.",
                        ["connector", "sink"])
AUDIT_MISSING = Counter("eosink_audit_missing_total", "Due records the continuous audit found missing from a sink.",
                        ["connector", "sink"])
AUDIT_DUPLICATED = Counter("eosink_audit_duplicated_total", "Due records the continuous audit found more than once in a sink.",
                           ["connector", "sink"])
AUDIT_FOREIGN = Counter("eosink_audit_foreign_total", "Records the continuous audit found in a sink that the outbox never "
                        "committed, or rows superseded by a later record of their key.", ["connector", "sink"])
AUDIT_ERRORS = Counter("eosink_audit_errors_total", "Continuous audit rounds that could not read the outbox or a sink.",
                       ["connector", "sink"])
DEAD_LETTERED = Counter("eosink_records_dead_lettered_total", "Bad records written to the dead-letter topic.", ["connector"])
TOLERATED = Counter("eosink_records_tolerated_total", "Bad records skipped under errors.tolerance=all, by stage.",
                    ["connector", "stage"])
REBALANCES = Counter("eosink_rebalances_total", "Assignments this worker received that changed what it holds.")


class TaskView(Protocol):
    """What the collector reads of a running task (``eosink.worker.engine.task.SinkTask``)."""

    connector: str

    def gauges(self) -> dict[str, Any]: ...


class WorkerView(Protocol):
    """What the collector reads of the worker process (``eosink.worker.control.runner.Worker``)."""

    def zookeeper_connected(self) -> bool: ...

    def is_leader(self) -> bool: ...

    def failed_connectors(self) -> list[str]:
        """Connectors this worker should run but whose task would not start (no task to read)."""
        ...


class LiveCollector(Collector):
    """The state metrics, computed from the registered task and worker at every scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[int, TaskView] = {}
        self._workers: dict[int, WorkerView] = {}

    def track_task(self, task: TaskView) -> None:
        with self._lock:
            self._tasks[id(task)] = task

    def untrack_task(self, task: TaskView) -> None:
        with self._lock:
            self._tasks.pop(id(task), None)

    def track_worker(self, worker: WorkerView) -> None:
        with self._lock:
            self._workers[id(worker)] = worker

    def untrack_worker(self, worker: WorkerView) -> None:
        with self._lock:
            self._workers.pop(id(worker), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            tasks, workers = list(self._tasks.values()), list(self._workers.values())
        info = GaugeMetricFamily("eosink_build_info", "eosink's version and Python; always 1.", labels=["version", "python"])
        info.add_metric([VERSION, platform.python_version()], 1)
        yield info
        failed = GaugeMetricFamily("eosink_task_failed", "1 while the connector's task on this worker is FAILED, else 0.",
                                   labels=["connector"])
        assigned = GaugeMetricFamily("eosink_assigned_partitions", "Partitions of the connector this worker holds.",
                                     labels=["connector"])
        lag = GaugeMetricFamily("eosink_consumer_lag", "Records behind the high watermark, per partition this worker holds.",
                                labels=["connector", "topic", "partition"])
        stalled = GaugeMetricFamily(
            "eosink_partition_stalled_seconds",
            "Seconds a held partition's position has stood while its high watermark moved: read_committed waits behind a "
            "transaction left open (present only while it stalls).", labels=["connector", "topic", "partition"])
        fresh = GaugeMetricFamily(
            "eosink_seconds_since_last_commit",
            "Seconds since a cycle last committed records of the partition here (since it was acquired, before the first).",
            labels=["connector", "topic", "partition"])
        unresolved = GaugeMetricFamily("eosink_prepared_unresolved",
                                       "Prepared transactions recovery could not resolve (operator needed).", labels=["connector"])
        age = GaugeMetricFamily("eosink_prepared_unresolved_age_seconds",
                                "Age of the oldest prepared transaction recovery could not resolve (0: none).",
                                labels=["connector"])
        now = time.monotonic()
        for t in tasks:
            g = t.gauges()
            c = t.connector
            failed.add_metric([c], 1.0 if g["failed"] else 0.0)
            assigned.add_metric([c], len(g["partitions"]))
            for tp, n in g["lag"].items():
                lag.add_metric([c, tp.topic, str(tp.partition)], n)
            for tp, s in g["stalled"].items():
                stalled.add_metric([c, tp.topic, str(tp.partition)], s)
            for tp, at in g["last_commit"].items():
                fresh.add_metric([c, tp.topic, str(tp.partition)], max(0.0, now - at))
            unresolved.add_metric([c], len(g["unresolved_since"]))
            age.add_metric([c], max((now - s for s in g["unresolved_since"]), default=0.0))
        with_task = {t.connector for t in tasks}
        for c in sorted({c for w in workers for c in w.failed_connectors()} - with_task):
            failed.add_metric([c], 1.0)  # it failed before it had a task: FAILED in /status too
        yield from (failed, assigned, lag, stalled, fresh, unresolved, age)
        yield from _pool_gauges()
        if workers:
            zk = GaugeMetricFamily("eosink_zookeeper_connected", "1 while this worker's ZooKeeper session is connected.")
            leader = GaugeMetricFamily("eosink_leader", "1 while this worker leads the cluster (assigns partitions).")
            zk.add_metric([], 1.0 if any(w.zookeeper_connected() for w in workers) else 0.0)
            leader.add_metric([], 1.0 if any(w.is_leader() for w in workers) else 0.0)
            yield zk
            yield leader


def _pool_gauges() -> Iterator[GaugeMetricFamily]:
    """The worker's PostgreSQL pools (:mod:`eosink.connectors.postgres.pool`), once a postgres sink made one."""
    pool = sys.modules.get("eosink.connectors.postgres.pool")
    if pool is None:
        return
    conns = GaugeMetricFamily("eosink_postgres_pool_connections",
                              "Connections of this worker's pool for a PostgreSQL database, by state: leased by a sink for a "
                              "statement (autocommit) or a transaction until its PREPARE, or idle.", labels=["database", "state"])
    size = GaugeMetricFamily("eosink_postgres_pool_size", "Most connections this worker opens to the database "
                             "(--postgres-pool-size).", labels=["database"])
    for where, st in sorted(pool.pools().items()):
        conns.add_metric([where, "autocommit"], st["autocommit_leased"])
        conns.add_metric([where, "transaction"], st["transaction_leased"])
        conns.add_metric([where, "idle"], st["autocommit_idle"] + st["transaction_idle"])
        size.add_metric([where], st["size"])
    yield conns
    yield size


LIVE = LiveCollector()
REGISTRY.register(LIVE)
track_task = LIVE.track_task
untrack_task = LIVE.untrack_task
track_worker = LIVE.track_worker
untrack_worker = LIVE.untrack_worker
