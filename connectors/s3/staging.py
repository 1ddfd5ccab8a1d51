"""A transaction's records as ``write`` receives them: grouped per partition, encoded at the prepare.

The engine hands a sink its batch in slices while it is still reading the rest (``write`` * n,
``CHUNK_RECORDS`` in ``eosink.worker.engine.source``). ``write`` only groups each slice by
partition (:func:`group`, a C loop where the extension is built); the objects' bodies - JSON Lines
or Parquet - are encoded by the prepare, once its CreateMultipartUploads are on their way
(:mod:`.protocol`): nothing can be uploaded before them, so encoding while their round trips run
takes that work off the cycle's critical path, where encoding in ``write`` sat wholly on it. A JSON
Lines body of undecoded records is joined in C with the GIL released for the copy
(:mod:`eosink.connectors.common.jsonlines`), so the creates' threads are not kept waiting for it.

Nothing is uploaded from here: an object's key ends in its last offset (deterministic final keys,
see :mod:`.protocol`), which only the manifest at ``pre_commit`` knows, and S3 fixes a multipart
upload's key at its create.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

from eosink.connectors.api.records import SinkRecord
from eosink.connectors.common import batches_native

COMPONENT = "s3"
TP = tuple[str, int]
#: The C loop of :func:`group` (:mod:`eosink.connectors.common.batches_native`), or None (tests set it).
native_group = batches_native.group
_TOPIC, _PARTITION = SinkRecord.__dict__["topic"], SinkRecord.__dict__["partition"]


class Staging:
    """One txn's staged records per (topic, partition), in the order written (see module doc)."""

    def __init__(self) -> None:
        self._slices: dict[TP, list[list[SinkRecord]]] = {}
        # Seconds spent grouping slices and encoding the bodies (for the cycle's timings).
        self.group_s = self.body_s = 0.0

    def add(self, records: Sequence[SinkRecord]) -> None:
        t0 = time.perf_counter()
        for tp, recs in group(records).items():
            self._slices.setdefault(tp, []).append(recs)
        self.group_s += time.perf_counter() - t0

    def firsts(self) -> dict[TP, SinkRecord]:
        """The first record staged for each partition, in the order they first appeared."""
        return {tp: slices[0][0] for tp, slices in self._slices.items()}

    def body(self, tp: TP, encode: Callable[[list[SinkRecord]], bytes]) -> bytes:
        """The partition's object: ``encode`` of its records; empty for none."""
        t0 = time.perf_counter()
        try:
            slices = self._slices.get(tp)
            if not slices:
                return b""
            return encode(slices[0] if len(slices) == 1 else list(itertools.chain.from_iterable(slices)))
        finally:
            self.body_s += time.perf_counter() - t0


def group(records: Sequence[SinkRecord]) -> dict[TP, list[SinkRecord]]:
    """The records per (topic, partition), each list in the order given.

    A loop of one dict lookup per record: the usual slice has one topic, and then the lookup is
    by the partition number alone (no tuple built and hashed per record: half the time). In C
    where the extension is built (under half the time again: one lookup per run of a partition),
    else the same loop in Python.
    """
    if not records:
        return {}
    topic = records[0].topic
    if native_group is not None:
        by_partition = native_group(records if isinstance(records, list) else list(records), _TOPIC, _PARTITION)
        if by_partition is not None:
            return {(topic, p): g for p, g in by_partition.items()}
    by_p: dict[int, list[SinkRecord]] = {}
    get = by_p.get
    for rec in records:
        g = get(rec.partition)
        if g is None or rec.topic != topic:
            if rec.topic != topic:
                return _by_topic_partition(records)
            g = by_p[rec.partition] = []
        g.append(rec)
    return {(topic, p): g for p, g in by_p.items()}


def _by_topic_partition(records: Sequence[SinkRecord]) -> dict[TP, list[SinkRecord]]:
    groups: dict[TP, list[SinkRecord]] = {}
    for rec in records:
        key = (rec.topic, rec.partition)
        g = groups.get(key)
        if g is None:
            g = groups[key] = []
        g.append(rec)
    return groups
