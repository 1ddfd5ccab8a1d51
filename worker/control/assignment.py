"""Partition assignment: balanced, sticky, and honouring ``tasks.max``.

The leader (lowest ephemeral-sequential znode under ``/leader``) computes it from the live
workers (ephemeral znodes under ``/workers``) and the RUNNING connectors, and writes one znode
per worker under ``/assignments``. Workers only read their own. Who *really* owns a partition
is decided by the epoch in the decision log: an assignment is an invitation to acquire, and a
worker that still thinks it holds a moved partition is refused at its next decision.

Rules, per connector:

* at most ``tasks.max`` workers consume it (as Kafka Connect users read ``tasks.max``);
* balanced: the partition counts of any two of its workers differ by at most one;
* sticky: a worker keeps what it had up to its quota; only the excess and the orphans move;

and across connectors, a worker keeps a connector of one task only while its partitions are under
its fair share (all partitions over the live workers): a worker that started first and took every
such connector hands the excess to the workers that joined after it, as Kafka Connect's assignor
spreads tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eosink.connectors.api.records import TopicPartition

Assignment = dict[str, dict[str, set[TopicPartition]]]  # worker -> connector -> partitions


def assign(
    partitions: Mapping[str, Sequence[TopicPartition]],
    tasks_max: Mapping[str, int],
    workers: Sequence[str],
    previous: Assignment | None = None,
) -> Assignment:
    previous = previous or {}
    live = sorted(set(workers))
    out: Assignment = {w: {} for w in live}
    if not live:
        return out
    load = {w: 0 for w in live}  # partitions given so far, across connectors: spreads connectors
    total = sum(len(set(tps)) for tps in partitions.values())
    fair = -(-total // len(live))  # a worker's share of every connector's partitions, rounded up
    for connector in sorted(partitions):
        tps = sorted(set(partitions[connector]))
        if not tps:
            continue
        held = {w: set(previous.get(w, {}).get(connector, set())) & set(tps) for w in live}
        k = max(1, min(tasks_max.get(connector, 1), len(live), len(tps)))
        # Keep the workers that already hold the most of it, then the least loaded. A connector of one
        # task goes whole to one worker, so its holder keeps it only while under its fair share: that is
        # what spreads such connectors over workers that joined later (one of several tasks moves
        # within its connector's quotas instead, and only as much as a joining worker takes).
        chosen = sorted(live, key=lambda w: (k == 1 and load[w] >= fair, -len(held[w]), load[w], w))[:k]
        base, extra = divmod(len(tps), k)
        # The workers holding the most get the larger quotas, so fewer partitions move.
        ranked = sorted(chosen, key=lambda w: (-len(held[w]), w))
        quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(ranked)}
        result: dict[str, set[TopicPartition]] = {w: set() for w in chosen}
        taken: set[TopicPartition] = set()
        for w in chosen:
            keep = sorted(held[w])[: quota[w]]
            result[w].update(keep)
            taken.update(keep)
        orphans = [tp for tp in tps if tp not in taken]
        for tp in orphans:
            w = min((w for w in chosen if len(result[w]) < quota[w]), key=lambda w: (len(result[w]), w))
            result[w].add(tp)
        for w, s in result.items():
            out[w][connector] = s
            load[w] += len(s)
    return out


def to_json(assignment: Mapping[str, set[TopicPartition]]) -> dict[str, list[list]]:
    return {c: [[tp.topic, tp.partition] for tp in sorted(s)] for c, s in sorted(assignment.items())}


def from_json(doc: Mapping[str, list[list]]) -> dict[str, set[TopicPartition]]:
    return {c: {TopicPartition(t, int(p)) for t, p in tps} for c, tps in doc.items()}
