"""Recovery: what becomes of a prepared txn that no cycle is going to finish.

A worker can die (or be fenced) between prepare and commit; the sinks then hold a prepared txn
that nobody is finishing. The decision log alone says what it was: a txn it names was decided and
must be committed; one a newer epoch has fenced can never be decided and is aborted; anything else
cannot be told apart from a cycle still in flight and is left, and reported.

:func:`classify` is that rule, in one place, because two parties apply it: the task, when it
acquires partitions (before consuming them, see :func:`recover`), and the admin API, which lists
prepared txns with what recovery will do about each (``eosink.worker.control.admin``). The failure
table this serves is in ``docs/architecture.md``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.records import TopicPartition, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics
from eosink.worker.engine.decision import DecisionLog, Entry, Grant
from eosink.worker.engine.types import Unresolved

NO_MANIFEST = "prepared txn without a manifest: cannot tell which partitions it covers"
DECIDED = "decision log names the txn"
FENCED = "not decided, and its epoch is fenced"
UNDECIDED = "not in the decision log and not fenced by this worker's epoch"


class Action(str, enum.Enum):
    """What recovery does with a prepared txn."""

    COMMIT = "commit"
    ABORT = "abort"
    REPORT = "report"  # leave it prepared, report it, and hold its partitions back


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    #: ABORT: the partitions on which a newer epoch fences the txn.
    fenced: frozenset[TopicPartition] = frozenset()


def classify(manifest: TxnManifest, entries: Mapping[TopicPartition, Entry],
             held: Mapping[TopicPartition, int]) -> Verdict:
    """Commit, abort or report the prepared txn ``manifest``, with the reason.

    ``entries`` are the decision-log entries of the txn's partitions; ``held`` the epoch at which
    each partition is held by whoever will act on the verdict: a task passes its grants' epochs;
    the admin API, predicting what each partition's owner will do, passes the entries' epochs
    (the owner holds a partition at its entry's epoch).

    * a txn named by any entry was decided: **commit** (a decision covers all its partitions at once);
    * else, a txn prepared at an older epoch than one of its partitions is held at can never be
      decided (the epoch bump moved the entry's version under its compare-and-set): **abort**;
    * else it may be a cycle still in flight, or one whose worker died before deciding and whose
      partitions nobody has acquired since: **report** it and leave it prepared.

    A txn whose sink kept no manifest cannot be tied to any partition: **report**.
    """
    if not manifest.ranges:
        return Verdict(Action.REPORT, NO_MANIFEST)
    if any(e.txn == manifest.txn_id for e in entries.values()):
        return Verdict(Action.COMMIT, DECIDED)
    fenced = frozenset(tp for tp in manifest.partitions & held.keys() if (manifest.epoch_of(tp) or 0) < held[tp])
    if fenced:
        return Verdict(Action.ABORT, FENCED, fenced)
    return Verdict(Action.REPORT, UNDECIDED)


def recover(
    connector: str,
    sinks: Sequence[TwoPhaseCommitSink],
    log: DecisionLog,
    grants: Mapping[TopicPartition, Grant],
    targets: frozenset[TopicPartition] | set[TopicPartition],
    unresolved: dict[str, Unresolved],
    logger: Any,
) -> None:
    """Commit, abort or report every prepared txn touching ``targets`` (partitions the task holds in ``grants``).

    ``unresolved`` is updated as each txn is settled, so a failure part way (raised to the caller,
    which retries) keeps what was already done. A txn without a manifest is reported against all
    of ``targets``: it might cover any of them. Then each sink discards what unprepared txns left
    on ``targets`` (:meth:`~eosink.connectors.api.sink.TwoPhaseCommitSink.discard_unprepared`).
    """
    found: dict[str, tuple[TxnManifest, list[TwoPhaseCommitSink]]] = {}
    for sink in sinks:
        for m in sink.recover():
            if m.partitions & targets or not m.ranges:
                found.setdefault(m.txn_id, (m, []))[1].append(sink)
    held = {tp: g.epoch for tp, g in grants.items()}
    for txn_id, (m, holders) in sorted(found.items()):
        entries = log.read(connector, m.partitions) if m.ranges else {}
        verdict = classify(m, entries, held)
        lg = logger.bind(txn=txn_id)
        if verdict.action is Action.COMMIT:
            for sink in holders:
                sink.recover_and_commit(m)
            metrics.RECOVERED.labels(connector, "commit").inc()
            lg.info("recovered_commit", reason=verdict.reason)
            unresolved.pop(txn_id, None)
        elif verdict.action is Action.ABORT:
            for sink in holders:
                sink.recover_and_abort(m)
            metrics.RECOVERED.labels(connector, "abort").inc()
            lg.info("recovered_abort", reason=verdict.reason, partitions=sorted(str(tp) for tp in verdict.fenced))
            unresolved.pop(txn_id, None)
        else:
            partitions = frozenset(m.partitions & targets if m.ranges else targets)
            known = unresolved.get(txn_id)  # re-recovery reports it again: its age goes on
            unresolved[txn_id] = Unresolved(txn_id, partitions, verdict.reason, known.since if known else time.monotonic())
            logger.error("prepared_txn_unresolved", txn=txn_id, partitions=sorted(map(str, partitions)),
                         reason=verdict.reason)
    for sink in sinks:
        sink.discard_unprepared(frozenset(targets))
