"""What the control plane reads and writes in ZooKeeper, for the REST API (any worker serves any request).

* **status** aggregates the ephemeral ``/status/<connector>/<worker>`` znodes each worker publishes
  (task id = index in the sorted list of workers reporting) with the target state;
* **offsets** are the decision log's ``next_offset`` per partition (``/partitions/<connector>/<tp>``).
  The decision is the single commit point: a txn named there is visible in every sink, or is
  made visible by recovery before the partition is consumed again - never delivered twice, never
  skipped. So the decision log *is* "what was delivered"; the sinks' own bookkeeping (e.g.
  PostgreSQL's ``eosink_offsets``) can only trail it while a decided commit is being completed,
  and such a txn is listed by :meth:`ClusterAdmin.transactions`;
* **altering offsets** (connector STOPPED) rewrites ``next_offset`` in one compare-and-set
  multi-op that also **bumps each epoch**, so a worker still holding an older grant is fenced at
  its next decision and at the resources; the ``txn`` field is kept, so a decided txn still
  awaiting its commit is still committed by recovery, never aborted by the reset;
* **transactions** lists prepared txns of a connector with what recovery will do about them, by the
  rule recovery itself applies (:func:`eosink.worker.engine.recovery.classify`).

Every path comes from :mod:`eosink.worker.paths`, and every decision-log entry is read and written
with the decision log's own codec (:class:`eosink.worker.engine.decision.Entry`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.errors import EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import paths
from eosink.worker.engine.decision import Entry
from eosink.worker.engine.recovery import Action, classify
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.control.admin")

#: Task states as Kafka Connect names them; eosink's RECOVERING is a RUNNING task catching up.
_CONNECT_STATE = {"RECOVERING": "RUNNING", "UNASSIGNED": "UNASSIGNED", "RUNNING": "RUNNING", "FAILED": "FAILED",
                  "STOPPED": "UNASSIGNED", "PAUSED": "PAUSED"}


#: What recovery will do, as :meth:`ClusterAdmin.transactions` names it.
_TXN_STATE = {Action.COMMIT: "DECIDED", Action.ABORT: "FENCED", Action.REPORT: "PREPARED"}


class OffsetsConflict(EosinkError):
    """The decision log entries kept changing under an offsets update (a concurrent update or a worker)."""


@dataclass(frozen=True)
class TaskReport:
    id: int
    worker_id: str
    doc: dict[str, Any]


class ClusterAdmin:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.zk = session.client
        self.root = session.root

    # -- membership -----------------------------------------------------------------------------
    def workers(self) -> dict[str, dict[str, Any]]:
        from kazoo.exceptions import NoNodeError

        out: dict[str, dict[str, Any]] = {}
        try:
            names = self.zk.get_children(paths.workers(self.root))
        except NoNodeError:
            return out
        for w in sorted(names):
            try:
                out[w] = json.loads(self.zk.get(paths.worker(self.root, w))[0] or b"{}")
            except (NoNodeError, ValueError):
                continue
        return out

    def leader(self) -> str | None:
        from kazoo.exceptions import NoNodeError

        try:
            children = sorted(self.zk.get_children(paths.leader(self.root)))
            return self.zk.get(f"{paths.leader(self.root)}/{children[0]}")[0].decode() if children else None
        except (NoNodeError, IndexError):
            return None

    # -- status ---------------------------------------------------------------------------------
    def tasks(self, connector: str) -> list[TaskReport]:
        from kazoo.exceptions import NoNodeError

        try:
            names = sorted(self.zk.get_children(paths.status(self.root, connector)))
        except NoNodeError:
            return []
        out: list[TaskReport] = []
        for w in names:
            try:
                doc = json.loads(self.zk.get(paths.task_status(self.root, connector, w))[0])
            except (NoNodeError, ValueError):
                continue
            out.append(TaskReport(len(out), w, doc))
        return out

    @staticmethod
    def task_json(t: TaskReport, restarting: bool = False) -> dict[str, Any]:
        """Kafka Connect's task status, plus eosink's per-partition view (epoch, lag, delivered)."""
        d = t.doc
        state = "RESTARTING" if restarting else _CONNECT_STATE.get(d.get("state", ""), "UNASSIGNED")
        out: dict[str, Any] = {"id": t.id, "state": state, "worker_id": t.worker_id}
        if d.get("state") == "FAILED" and d.get("trace"):
            out["trace"] = d["trace"]
        if d.get("state") not in (None, state):
            out["eosink_state"] = d["state"]
        epochs, lag, delivered = d.get("epochs", {}), d.get("lag", {}), d.get("delivered", {})
        stalled = d.get("stalled", {})
        out["partitions"] = [{"partition": p, "epoch": epochs.get(p), "lag": lag.get(p),
                              "delivered": delivered.get(p, 0)}
                             | ({"stalled_behind_open_transaction_s": stalled[p]} if p in stalled else {})
                             for p in d.get("partitions", [])]
        if d.get("unresolved"):
            out["unresolved"] = d["unresolved"]
        if d.get("retrying") and state != "FAILED":  # a fault being retried: what failed, where, for how long
            out["retrying"] = d["retrying"]
        return out

    def status(self, connector: str, target_state: str, restarting: Iterable[int] = ()) -> dict[str, Any]:
        tasks = self.tasks(connector)
        restart = set(restarting)
        task_docs = [self.task_json(t, t.id in restart) for t in tasks]
        if target_state == "STOPPED":
            state = "STOPPED"
        elif target_state == "PAUSED":
            state = "PAUSED"
        elif any(t.doc.get("state") == "FAILED" for t in tasks):
            state = "FAILED"
        elif restart:
            state = "RESTARTING"
        else:
            state = "RUNNING" if tasks else "UNASSIGNED"
        connector_doc: dict[str, Any] = {"state": state, "worker_id": self.leader() or ""}
        if state == "FAILED":
            traces = [f"task {t.id} on {t.worker_id}: {t.doc.get('trace')}"
                      for t in tasks if t.doc.get("state") == "FAILED"]
            connector_doc["trace"] = "\n".join(traces)
        return {"name": connector, "connector": connector_doc, "tasks": task_docs, "type": "sink"}

    # -- offsets (the decision log) ----------------------------------------------------------------------
    def decisions(self, connector: str) -> dict[TopicPartition, Entry]:
        """The decision log entries of ``connector``: ``{tp: Entry(owner, epoch, next_offset, txn)}``."""
        from kazoo.exceptions import NoNodeError

        base = paths.partitions(self.root, connector)
        try:
            names = self.zk.get_children(base)
        except NoNodeError:
            return {}
        out: dict[TopicPartition, Entry] = {}
        for name in names:
            tp = paths.parse_partition(name)
            if tp is None:
                continue
            try:
                out[tp] = Entry.from_bytes(self.zk.get(f"{base}/{name}")[0])
            except NoNodeError:
                continue
        return dict(sorted(out.items()))

    def offsets(self, connector: str) -> list[dict[str, Any]]:
        """KIP-875's sink shape: the next offset to deliver per partition."""
        return [{"partition": {"kafka_topic": tp.topic, "kafka_partition": tp.partition},
                 "offset": {"kafka_offset": e.next_offset}}
                for tp, e in self.decisions(connector).items() if e.next_offset is not None]

    def topics(self, connector: str) -> list[str]:
        """Active topics: those the connector has consumed (has a decision log entry for)."""
        return sorted({tp.topic for tp in self.decisions(connector)})

    def alter_offsets(self, connector: str, offsets: Mapping[TopicPartition, int | None], attempts: int = 10) -> None:
        """Set ``next_offset`` (None = reset to ``consumer.auto.offset.reset``) for each partition, atomically,
        bumping every epoch (fences any older owner) and keeping ``txn`` (a decided txn stays decided)."""
        from kazoo.exceptions import NoNodeError

        self.zk.ensure_path(paths.partitions(self.root, connector))
        for _ in range(attempts):
            tx = self.zk.transaction()
            for tp, off in offsets.items():
                path = paths.partition(self.root, connector, tp)
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    tx.create(path, Entry(None, 1, off, None).to_bytes())
                    continue
                e = Entry.from_bytes(data)
                tx.set_data(path, Entry(None, e.epoch + 1, off, e.txn).to_bytes(), version=stat.version)
            results = tx.commit()
            hard = [r for r in results if isinstance(r, Exception) and type(r).__name__ not in (
                "BadVersionError", "NodeExistsError", "NoNodeError", "RuntimeInconsistency", "RolledBackError")]
            if hard:
                raise EosinkError(f"offsets of {connector}: ZooKeeper refused the update: {hard[0]!r}",
                                  component="admin")
            if not any(isinstance(r, Exception) for r in results):
                log.info("offsets_altered", connector=connector,
                         offsets={str(tp): off for tp, off in offsets.items()})
                return
        raise OffsetsConflict(f"offsets of {connector} kept changing under the update (a concurrent update, or a "
                              "worker still running it?); try again", component="admin")

    # -- transactions ------------------------------------------------------------------------------
    def transactions(self, connector: str, sinks: list[Any], errors: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Prepared txns of ``connector`` in its sinks, and what recovery will do about each (``classify``,
        with each partition held at its entry's epoch, as its owner holds it):

        ``DECIDED``   the decision log names it: it will be committed (a commit in progress, or the
                      fatal case - committed by recovery at the next start of the task);
        ``FENCED``    not decided, and a newer epoch holds one of its partitions: recovery aborts it;
        ``PREPARED``  not decided, not fenced: a cycle in flight, or left by a worker that died before
                      deciding (aborted once a new owner's epoch fences it);
        ``IN_DOUBT``  a task could not tell and reported it: its partitions wait for an operator.
        """
        found: dict[str, dict[str, Any]] = {}
        for sink in sinks:
            try:
                manifests = sink.recover()
            except Exception as exc:  # noqa: BLE001 - report, do not fail the whole listing
                errors.append({"sink": type(sink).__name__, "message": str(exc)})
                continue
            for m in manifests:
                entry = found.setdefault(m.txn_id, {"txn": m.txn_id, "manifest": m, "sinks": []})
                entry["sinks"].append(type(sink).__name__)
        decisions = self.decisions(connector)
        out = []
        for txn_id, f in sorted(found.items()):
            m = f["manifest"]
            parts = sorted(m.partitions)
            entries = {tp: decisions[tp] for tp in parts if tp in decisions}
            verdict = classify(m, entries, held={tp: e.epoch for tp, e in entries.items()})
            out.append({"txn": txn_id, "state": _TXN_STATE[verdict.action], "partitions": [str(tp) for tp in parts],
                        "epochs": {str(tp): m.epoch_of(tp) for tp in parts}, "sinks": f["sinks"]})
        listed = {t["txn"]: t for t in out}
        for t in self.tasks(connector):
            for u in t.doc.get("unresolved", []):
                item = listed.get(u["txn"])
                if item is None:
                    item = {"txn": u["txn"], "partitions": u.get("partitions", []), "epochs": {}, "sinks": []}
                    out.append(item)
                    listed[u["txn"]] = item
                item.update(state="IN_DOUBT", reason=u.get("reason"), reported_by=t.worker_id)
        return out
