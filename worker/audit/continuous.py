"""Continuous audit: the leader audits, in the background, what was decided since its last round.

Each round (``--audit-interval``) takes, per partition of every connector, the offsets decided
between the end of the last audited range and the ``next_offset`` the decision log showed one
round *earlier* - a round's grace for a decided transaction to become visible in every sink - and
at most ``--audit-max-records`` records per connector and round, spread over its partitions, so
the cost of a round is bounded however far the connector has run ahead (what is left is taken next
round). A partition is first audited from the start of its log (what Kafka still keeps), so a
worker started with the audit on walks the history at that bounded pace, then follows the decisions.

Faults found are counted into ``eosink_audit_missing_total``, ``eosink_audit_duplicated_total``
and ``eosink_audit_foreign_total`` (``{connector, sink}``), which the ``EosinkAuditNotClean``
alert watches; each is logged with its culprits (``audit_not_clean``). Only the leader audits, so
a cluster audits each range once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from eosink.connectors.api.records import TopicPartition
from eosink.worker import metrics
from eosink.worker.audit.run import Asked, audit
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.audit")


class AuditedWorker(Protocol):
    @property
    def session(self) -> Any: ...

    @property
    def bootstrap(self) -> str: ...

    @property
    def kafka(self) -> Mapping[str, str]: ...

    def is_leader(self) -> bool: ...


class ContinuousAudit:
    def __init__(self, worker: AuditedWorker, interval_s: float, max_records: int) -> None:
        self.worker = worker
        self.interval_s = interval_s
        self.max_records = max_records
        #: Per connector and partition: the end of what was audited, and the next_offset seen last round.
        self.audited: dict[tuple[str, TopicPartition], int] = {}
        self.seen: dict[tuple[str, TopicPartition], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="audit", daemon=True)

    def start(self) -> ContinuousAudit:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.worker.is_leader():
                continue
            try:
                self.round()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper or Kafka briefly away: the next round tries again
                log.warning("audit_round_failed", error=str(exc), error_class=type(exc).__name__)

    def round(self) -> None:
        from eosink.worker.control.admin import ClusterAdmin
        from eosink.worker.control.store import ConnectorStore

        store, admin = ConnectorStore(self.worker.session), ClusterAdmin(self.worker.session)
        for name in store.names():
            raw = store.get(name)
            if raw is None:
                continue
            decisions = admin.decisions(name)
            asked = self._ranges(name, {tp: e.next_offset or 0 for tp, e in decisions.items()})
            if not asked:
                continue
            try:
                report = audit(name, raw, decisions, bootstrap=self.worker.bootstrap, kafka=self.worker.kafka, asked=asked)
            except Exception as exc:  # noqa: BLE001 - one connector's failure must not stop the others'
                metrics.AUDIT_ERRORS.labels(name, "source").inc()
                log.warning("audit_failed", connector=name, error=str(exc), error_class=type(exc).__name__)
                continue
            log.info("audit_round", connector=name, records=report["source"]["records"],
                     ranges={str(a.tp): f"{a.first}-{a.end}" for a in asked}, seconds=report["seconds"])
            self._count(name, report)
            for a in asked:
                self.audited[(name, a.tp)] = a.end

    def _ranges(self, name: str, decided: Mapping[TopicPartition, int]) -> list[Asked]:
        """This round's range per partition: from the last audited end to last round's next_offset, capped."""
        cap = max(1, self.max_records // max(1, len(decided)))
        asked = []
        for tp, nxt in decided.items():
            key = (name, tp)
            due = self.seen.get(key)
            self.seen[key] = nxt
            start = self.audited.setdefault(key, 0)  # first sight: from the log's start, at the capped pace
            if due is not None and due > start:
                asked.append(Asked(tp, start, min(due, start + cap)))
        return asked

    @staticmethod
    def _count(name: str, report: Mapping[str, Any]) -> None:
        for s in report["sinks"]:
            if s.get("error"):
                metrics.AUDIT_ERRORS.labels(name, s["sink"]).inc()
                log.warning("audit_failed", connector=name, sink=s["sink"], error=s["error"])
                continue
            t = s.get("totals")
            if not t:
                continue  # not auditable: said once by `eosink connectors audit`, not every round
            metrics.AUDIT_RECORDS.labels(name, s["sink"]).inc(t["expected"])
            metrics.AUDIT_MISSING.labels(name, s["sink"]).inc(t["missing"])
            metrics.AUDIT_DUPLICATED.labels(name, s["sink"]).inc(t["duplicated"])
            metrics.AUDIT_FOREIGN.labels(name, s["sink"]).inc(t["foreign"] + t["stale"])
            if not s["clean"]:
                culprits = {f"{p['topic']}-{p['partition']}": p["culprits"] for p in s["partitions"] if p["culprits"]}
                log.error("audit_not_clean", connector=name, sink=s["sink"], totals=t, culprits=culprits)
