"""Each worker's report of its tasks, published where any worker's REST API can read it.

A worker writes one ephemeral znode per connector it runs (``status/<connector>/<worker>``,
:mod:`eosink.worker.paths`); :class:`eosink.worker.control.admin.ClusterAdmin` aggregates them.
Ephemeral, so a worker that is gone stops reporting by itself. A state change is written at once;
lag and delivered counts alone change every cycle, so they are written at most every few seconds
to keep ZooKeeper's write load flat as the cluster grows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from eosink.worker import paths
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.zk import ZkSession
from eosink.worker.logging import redact


def task_report(task: SinkTask, worker_id: str) -> dict[str, Any]:
    """A running task as the status znode holds it."""
    st = task.status()
    return {
        "state": "PAUSED" if st.paused and st.state.value in ("RUNNING", "RECOVERING") else st.state.value,
        "worker_id": worker_id, "partitions": st.partitions,
        "epochs": {str(tp): g.epoch for tp, g in list(task.grants.items())},
        "trace": st.trace,
        "unresolved": [{"txn": u.txn_id, "partitions": sorted(map(str, u.partitions)), "reason": u.reason}
                       for u in st.unresolved],
        "delivered": st.delivered, "lag": st.lag, "retrying": st.retrying, "stalled": st.stalled,
    }


def failure_report(trace: str, worker_id: str) -> dict[str, Any]:
    """A connector this worker should run but cannot (invalid here, or failed to start)."""
    return {"state": "FAILED", "worker_id": worker_id, "partitions": [], "epochs": {},
            "trace": trace, "unresolved": [], "delivered": {}, "lag": {}}


class StatusPublisher:
    """Writes this worker's reports, skipping what ZooKeeper already holds."""

    def __init__(self, session: ZkSession, worker_id: str) -> None:
        self.session = session
        self.worker_id = worker_id
        self._published: dict[str, bytes] = {}
        self._published_shape: dict[str, bytes] = {}  # the status without lag/delivered: a change is written at once
        self._published_at: dict[str, float] = {}

    def forget(self) -> None:
        """A new ZooKeeper session: the ephemeral status znodes are gone, write everything again."""
        self._published.clear()
        self._published_shape.clear()

    def publish(self, tasks: Mapping[str, SinkTask], failures: Mapping[str, str], every_s: float = 2.0) -> None:
        """Each task's status as an ephemeral znode ``/status/<connector>/<worker>`` (read by the REST API).

        Written when the state changes, and at most every ``every_s`` for lag and delivered counts alone.
        Secrets are redacted: a trace may quote anything."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        zk, root = self.session.client, self.session.root
        docs = {name: task_report(task, self.worker_id) for name, task in tasks.items()}
        for name, trace in failures.items():
            docs.setdefault(name, failure_report(trace, self.worker_id))
        now = time.monotonic()
        for name, d in docs.items():
            doc = json.dumps(redact(d), sort_keys=True).encode()
            if self._published.get(name) == doc:
                continue
            shape = json.dumps({k: v for k, v in d.items() if k not in ("delivered", "lag", "stalled")}, sort_keys=True).encode()
            if self._published_shape.get(name) == shape and now - self._published_at.get(name, 0.0) < every_s:
                continue
            path = paths.task_status(root, name, self.worker_id)
            try:
                zk.set(path, doc)
            except NoNodeError:
                try:
                    zk.create(path, doc, ephemeral=True, makepath=True)
                except NodeExistsError:
                    zk.set(path, doc)
            self._published[name] = doc
            self._published_shape[name] = shape
            self._published_at[name] = now
        for name in set(self._published) - set(docs):
            self._published.pop(name)
            self._published_shape.pop(name, None)
            try:
                zk.delete(paths.task_status(root, name, self.worker_id))
            except NoNodeError:
                pass
