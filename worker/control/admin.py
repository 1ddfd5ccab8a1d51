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
* **transactions** lists prepared txns of a connector with what recovery will do about them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.errors import EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.engine.decision import _decode, _encode  # the decision log's own entry format
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.control.admin")

#: Task states as Kafka Connect names them; eosink's RECOVERING is a RUNNING task catching up.
_CONNECT_STATE = {"RECOVERING": "RUNNING", "UNASSIGNED": "UNASSIGNED", "RUNNING": "RUNNING", "FAILED": "FAILED",
                  "STOPPED": "UNASSIGNED", "PAUSED": "PAUSED"}


class OffsetsConflict(EosinkError):
    """The decision log entries kept changing under an offsets update (a concurrent update or a worker)."""


@dataclass(frozen=True)
class TaskReport:
    id: int
    worker_id: str
    doc: dict[str, Any]


def parse_tp(name: str) -> TopicPartition | None:
    topic, sep, p = name.rpartition("-")
    return TopicPartition(topic, int(p)) if sep and topic and p.isdigit() else None


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
            names = self.zk.get_children(f"{self.root}/workers")
        except NoNodeError:
            return out
        for w in sorted(names):
            try:
                out[w] = json.loads(self.zk.get(f"{self.root}/workers/{w}")[0] or b"{}")
            except (NoNodeError, ValueError):
                continue
        return out

    def leader(self) -> str | None:
        from kazoo.exceptions import NoNodeError

        try:
            children = sorted(self.zk.get_children(f"{self.root}/leader"))
            return self.zk.get(f"{self.root}/leader/{children[0]}")[0].decode() if children else None
        except (NoNodeError, IndexError):
            return None

    # -- status ---------------------------------------------------------------------------------
    def tasks(self, connector: str) -> list[TaskReport]:
        from kazoo.exceptions import NoNodeError

        base = f"{self.root}/status/{connector}"
        try:
            names = sorted(self.zk.get_children(base))
        except NoNodeError:
            return []
        out = []
        for w in names:
            try:
                doc = json.loads(self.zk.get(f"{base}/{w}")[0])
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
        out["partitions"] = [{"partition": p, "epoch": epochs.get(p), "lag": lag.get(p), "delivered": delivered.get(p, 0)}
                             for p in d.get("partitions", [])]
        if d.get("unresolved"):
            out["unresolved"] = d["unresolved"]
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
            traces = [f"task {t.id} on {t.worker_id}: {t.doc.get('trace')}" for t in tasks if t.doc.get("state") == "FAILED"]
            connector_doc["trace"] = "\n".join(traces)
        return {"name": connector, "connector": connector_doc, "tasks": task_docs, "type": "sink"}

    # -- offsets (the decision log) ----------------------------------------------------------------------
    def _partitions_path(self, connector: str) -> str:
        return f"{self.root}/partitions/{connector}"

    def decisions(self, connector: str) -> dict[TopicPartition, Any]:
        """The decision log entries of ``connector``: ``{tp: Entry(owner, epoch, next_offset, txn)}``."""
        from kazoo.exceptions import NoNodeError

        base = self._partitions_path(connector)
        try:
            names = self.zk.get_children(base)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            tp = parse_tp(name)
            if tp is None:
                continue
            try:
                out[tp] = _decode(self.zk.get(f"{base}/{name}")[0])
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

        base = self._partitions_path(connector)
        self.zk.ensure_path(base)
        for _ in range(attempts):
            tx = self.zk.transaction()
            for tp, off in offsets.items():
                path = f"{base}/{tp.topic}-{tp.partition}"
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    tx.create(path, _encode(None, 1, off, None))
                    continue
                e = _decode(data)
                tx.set_data(path, _encode(None, e.epoch + 1, off, e.txn), version=stat.version)
            results = tx.commit()
            hard = [r for r in results if isinstance(r, Exception) and type(r).__name__ not in (
                "BadVersionError", "NodeExistsError", "NoNodeError", "RuntimeInconsistency", "RolledBackError")]
            if hard:
                raise EosinkError(f"offsets of {connector}: ZooKeeper refused the update: {hard[0]!r}", component="admin")
            if not any(isinstance(r, Exception) for r in results):
                log.info("offsets_altered", connector=connector,
                         offsets={str(tp): off for tp, off in offsets.items()})
                return
        raise OffsetsConflict(f"offsets of {connector} kept changing under the update (a concurrent update, or a "
                              "worker still running it?); try again", component="admin")

    # -- transactions ------------------------------------------------------------------------------
    def transactions(self, connector: str, sinks: list[Any], errors: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Prepared txns of ``connector`` in its sinks, and what recovery will do about each:

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
            if any(decisions.get(tp) is not None and decisions[tp].txn == txn_id for tp in parts):
                state = "DECIDED"
            elif any(decisions.get(tp) is not None and decisions[tp].epoch > (m.epoch_of(tp) or 0) for tp in parts):
                state = "FENCED"
            else:
                state = "PREPARED"
            out.append({"txn": txn_id, "state": state, "partitions": [str(tp) for tp in parts],
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
