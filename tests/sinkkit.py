"""Helpers the connector test suites share: records, the manifest a cycle would build, a prepare."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from eosink.connectors.api.records import SinkRecord, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink


def records(topic: str, values: Sequence[Any], partition: int = 0, start: int = 0,
            keys: Sequence[bytes | None] | None = None) -> list[SinkRecord]:
    """One record per value at consecutive offsets from ``start``; the raw bytes are the JSON."""
    return [SinkRecord(topic, partition, start + i, keys[i] if keys is not None else None, v, json.dumps(v).encode())
            for i, v in enumerate(values)]


def manifest_for(txn: str, connector: str, recs: Sequence[SinkRecord], epoch: int = 1) -> TxnManifest:
    """The manifest the engine builds for ``recs``: per partition, first and last offset, one epoch."""
    return TxnManifest.covering(txn, connector, recs, epoch)


def prepare(sink: TwoPhaseCommitSink, txn: str, recs: Sequence[SinkRecord], epoch: int = 1) -> TxnManifest:
    """begin_transaction, write, pre_commit: what one cycle does before its decision."""
    m = manifest_for(txn, sink.connector, recs, epoch)
    sink.begin_transaction(txn)
    sink.write(recs)
    sink.pre_commit(m)
    return m
