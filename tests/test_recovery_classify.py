"""The recovery rule, alone: what becomes of a prepared txn, given only the decision log.

``classify`` is shared by the task's recovery and the admin API's transaction listing; these
tests pin the rule itself (the commit-cycle and REST tests exercise it through both callers).
"""

from __future__ import annotations

from eosink.connectors.api.records import PartitionRange, TopicPartition, TxnManifest
from eosink.worker.engine.decision import NO_ENTRY, Entry
from eosink.worker.engine.recovery import Action, classify

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def manifest(txn: str, epochs: dict[TopicPartition, int]) -> TxnManifest:
    ranges = tuple(PartitionRange(tp.topic, tp.partition, 0, 9, e) for tp, e in sorted(epochs.items()))
    return TxnManifest(txn, "c", ranges)


def test_txn_named_by_one_entry_is_committed_even_where_a_newer_epoch_holds_its_other_partition():
    # Decided at epoch 3 on both partitions; B was since acquired (epoch 4) and decided again.
    m = manifest("c.w.1.1", {A: 3, B: 3})
    entries = {A: Entry("w", 3, 10, "c.w.1.1"), B: Entry("x", 4, 20, "c.x.2.1")}
    verdict = classify(m, entries, held={A: 3, B: 4})
    assert verdict.action is Action.COMMIT, "a decided txn must be committed: aborting it would lose decided records"
    assert "names the txn" in verdict.reason


def test_undecided_txn_prepared_at_an_older_epoch_than_the_holders_is_aborted():
    m = manifest("c.w.1.2", {A: 3, B: 3})
    entries = {A: Entry("x", 4, 10, "c.w.1.1"), B: Entry("x", 3, 10, "c.w.1.1")}
    verdict = classify(m, entries, held={A: 4, B: 3})
    assert verdict.action is Action.ABORT
    assert verdict.fenced == {A}, "only the partition held at a newer epoch fences the txn"
    assert "fenced" in verdict.reason


def test_undecided_txn_at_the_holders_own_epoch_is_reported_not_aborted():
    # It may be a cycle in flight at this very epoch: aborting it could race its decision.
    m = manifest("c.w.1.2", {A: 3})
    verdict = classify(m, {A: Entry("w", 3, 10, "c.w.1.1")}, held={A: 3})
    assert verdict.action is Action.REPORT
    assert verdict.reason


def test_newer_epoch_on_a_partition_the_caller_does_not_hold_does_not_abort():
    # Fencing is judged by the epochs the caller holds: the task holds only A, at the txn's epoch.
    m = manifest("c.w.1.2", {A: 3, B: 3})
    entries = {A: Entry("w", 3, 10, None), B: Entry("x", 5, 10, None)}
    assert classify(m, entries, held={A: 3}).action is Action.REPORT
    assert classify(m, entries, held={A: 3, B: 5}).action is Action.ABORT


def test_txn_never_decided_on_partitions_nobody_acquired_is_reported():
    m = manifest("c.w.1.1", {A: 1})
    assert classify(m, {A: NO_ENTRY}, held={}).action is Action.REPORT


def test_txn_without_a_manifest_is_reported_whatever_the_log_says():
    verdict = classify(TxnManifest("c.w.1.1", "c"), {A: Entry("w", 9, 10, "c.w.1.1")}, held={A: 9})
    assert verdict.action is Action.REPORT
    assert "without a manifest" in verdict.reason


def test_decision_log_entry_survives_its_codec():
    entry = Entry("w", 7, 1234, "c.w.3-ab12cd.9")
    assert Entry.from_bytes(entry.to_bytes()) == entry
    assert Entry.from_bytes(None) == NO_ENTRY and Entry.from_bytes(b"") == NO_ENTRY
