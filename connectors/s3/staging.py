"""A transaction's records as ``write`` receives them: per partition, JSON Lines encoded on arrival.

The engine hands a sink its batch in slices while it is still reading the rest (``write`` * n,
``CHUNK_RECORDS`` in ``eosink.worker.engine.source``). Grouping and encoding a slice when it
arrives takes that CPU off the prepare's critical path: the prepare's objects are then one join
of lines each (~2 ms per 12 MB), and the encoding no longer runs beside the creates' threads,
which stretched it to two or three times its CPU time.

Encoding on arrival is an optimisation, never a different outcome: a slice that does not encode
(a value JSON Lines cannot hold) turns it off, and the prepare encodes the whole batch as before,
raising the error that names the record. Parquet needs the whole object for its schema, so its
records are only grouped here and encoded at the prepare.

Nothing is uploaded from here: an object's key ends in its last offset (deterministic final keys,
see :mod:`.protocol`), which only the manifest at ``pre_commit`` knows, and S3 fixes a multipart
upload's key at its create.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

from eosink.connectors.api.errors import EosinkError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.common import jsonlines

COMPONENT = "s3"
TP = tuple[str, int]


class Staging:
    """One txn's staged records per (topic, partition), in the order written, and for ``jsonl``
    their lines (see module doc)."""

    def __init__(self, jsonl: bool) -> None:
        self._slices: dict[TP, list[list[SinkRecord]]] = {}
        self._lines: dict[TP, list[bytes]] | None = {} if jsonl else None
        # Seconds spent grouping slices, encoding them, and making the bodies (for the cycle's timings).
        self.group_s = self.encode_s = self.body_s = 0.0

    def add(self, records: Sequence[SinkRecord]) -> None:
        t0 = time.perf_counter()
        groups = group(records)
        for tp, recs in groups.items():
            self._slices.setdefault(tp, []).append(recs)
        t1 = time.perf_counter()
        self.group_s += t1 - t0
        if self._lines is None:
            return
        try:
            encoded = {tp: jsonlines.lines(recs, COMPONENT) for tp, recs in groups.items()}
        except (EosinkError, ValueError, TypeError):
            self._lines = None  # the prepare encodes the whole batch and raises, naming the record
        else:
            for tp, lines in encoded.items():
                have = self._lines.get(tp)
                if have is None:
                    self._lines[tp] = lines
                else:
                    have.extend(lines)
        self.encode_s += time.perf_counter() - t1

    @property
    def encoded(self) -> bool:
        """True when every slice is encoded already: the bodies are joins of lines."""
        return self._lines is not None

    def firsts(self) -> dict[TP, SinkRecord]:
        """The first record staged for each partition, in the order they first appeared."""
        return {tp: slices[0][0] for tp, slices in self._slices.items()}

    def body(self, tp: TP, encode: Callable[[list[SinkRecord]], bytes]) -> bytes:
        """The partition's object: its lines joined, or ``encode`` of its records; empty for none."""
        t0 = time.perf_counter()
        try:
            if self._lines is not None:
                lines = self._lines.get(tp)
                if not lines:
                    return b""
                lines.append(b"")  # the last line's newline, without copying the body once more
                try:
                    return b"\n".join(lines)
                finally:
                    lines.pop()
            slices = self._slices.get(tp)
            if not slices:
                return b""
            return encode(slices[0] if len(slices) == 1 else list(itertools.chain.from_iterable(slices)))
        finally:
            self.body_s += time.perf_counter() - t0


def group(records: Sequence[SinkRecord]) -> dict[TP, list[SinkRecord]]:
    """The records per (topic, partition), each list in the order given.

    A loop of one dict lookup per record: the usual slice has one topic, and then the lookup is
    by the partition number alone (no tuple built and hashed per record: half the time).
    """
    if not records:
        return {}
    topic = records[0].topic
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
