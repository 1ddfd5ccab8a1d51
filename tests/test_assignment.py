"""The assignment function: balanced, sticky, tasks.max (property-based, no servers)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from eosink.connectors.api.records import TopicPartition
from eosink.worker.control.assignment import assign

workers_st = st.lists(st.sampled_from([f"w{i}" for i in range(6)]), min_size=1, max_size=6, unique=True)
conns_st = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.tuples(st.integers(1, 40), st.integers(1, 6)), min_size=1)


def _parts(conns):
    return {c: [TopicPartition(f"t{c}", p) for p in range(n)] for c, (n, _) in conns.items()}


@settings(max_examples=300, deadline=None)
@given(conns=conns_st, workers=workers_st)
def test_every_partition_once_balanced_and_within_tasks_max(conns, workers):
    parts = _parts(conns)
    tmax = {c: m for c, (_, m) in conns.items()}
    a = assign(parts, tmax, workers)
    for c, tps in parts.items():
        given_out = [tp for w in a for tp in a[w].get(c, ())]
        assert sorted(given_out) == sorted(tps), "a partition is missing or given twice"
        counts = [len(a[w][c]) for w in a if c in a[w]]
        assert len(counts) <= tmax[c], "more workers than tasks.max"
        assert max(counts) - min(counts) <= 1, "not balanced"


@settings(max_examples=300, deadline=None)
@given(conns=conns_st, workers=workers_st, joiner=st.sampled_from(["w7", "w8"]))
def test_a_joining_worker_moves_only_what_must_move(conns, workers, joiner):
    parts = _parts(conns)
    tmax = {c: m for c, (_, m) in conns.items()}
    before = assign(parts, tmax, workers)
    after = assign(parts, tmax, [*workers, joiner], before)
    for c, tps in parts.items():
        k_after = min(tmax[c], len(workers) + 1, len(tps))
        quota_min = len(tps) // k_after
        moved = sum(1 for w in workers for tp in before[w].get(c, ()) if tp not in after[w].get(c, set()))
        # Only the newcomer's share (and the trimming of old holders to their new quota) moves.
        assert moved <= len(after[joiner].get(c, ())) + max(0, quota_min), (c, moved)


def test_leaving_worker_partitions_go_to_the_survivors_and_nothing_else_moves():
    parts = {"c": [TopicPartition("t", p) for p in range(9)]}
    before = assign(parts, {"c": 3}, ["w1", "w2", "w3"])
    after = assign(parts, {"c": 3}, ["w1", "w2"], before)
    for w in ("w1", "w2"):
        assert before[w]["c"] <= after[w]["c"], "a survivor lost a partition it had"
    assert sorted(len(after[w]["c"]) for w in after) == [4, 5]


def test_tasks_max_one_puts_a_connector_on_one_worker():
    parts = {"c": [TopicPartition("t", p) for p in range(8)]}
    a = assign(parts, {"c": 1}, ["w1", "w2", "w3"])
    assert sum(1 for w in a if a[w].get("c")) == 1


def test_connectors_a_first_worker_took_are_spread_when_others_join():
    """The first worker up takes every connector; the workers that join after it get their share."""
    parts = {f"c{i:02d}": [TopicPartition(f"t{i}", p) for p in range(3)] for i in range(30)}
    tmax = dict.fromkeys(parts, 1)
    alone = assign(parts, tmax, ["w3"])
    after = assign(parts, tmax, ["w1", "w2", "w3"], alone)
    held = {w: sum(len(s) for s in after[w].values()) for w in after}
    assert sorted(held.values()) == [30, 30, 30], held
    kept = sum(1 for c in after["w3"] if after["w3"][c])
    assert kept == 10, "the first worker should keep its share, moving only the excess"
    assert assign(parts, tmax, ["w1", "w2", "w3"], after) == after, "a balanced assignment is stable"
