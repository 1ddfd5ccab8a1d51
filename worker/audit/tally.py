"""One sink's sightings against the source: per partition, what is there once, missing, doubled or foreign.

The counts, for the offsets ``[first, due)`` of a partition (``due``: the decision log's
``next_offset``, or the end of the range asked for, whichever is lower):

* ``expected``   committed records the sink must hold once (every one; or, for a sink keeping one
                 row per key, the last record of each key);
* ``found_once`` expected and held exactly once;
* ``missing``    expected and not held;
* ``duplicated`` expected and held more than once (``extra_copies``: how many copies too many);
* ``foreign``    held at an offset where the source has no committed record (a record of an
                 aborted transaction, a marker's offset, an offset never written) or not placeable;
* ``stale``      held, committed, but superseded: an older record of a key whose last record is due;
* ``in_flight``  held at or past ``due``: decided after the decision log was read, or not yet due -
                 never a fault.

Culprits are named as offset ranges (``first-last``) and a few ``eosink.id`` examples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eosink.connectors.api.audit import NOWHERE, UNPLACED, AuditReader, Window
from eosink.connectors.api.records import TopicPartition
from eosink.worker.audit.source import SourceIndex

#: Culprit ranges and example ids named per kind and partition.
MAX_RANGES = 5
MAX_IDS = 3
FAULTS = ("missing", "duplicated", "foreign", "stale")


@dataclass
class Culprits:
    ranges: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    more_ranges: int = 0


@dataclass
class PartitionAudit:
    topic: str
    partition: int
    first: int
    due: int
    expected: int = 0
    found_once: int = 0
    missing: int = 0
    duplicated: int = 0
    extra_copies: int = 0
    foreign: int = 0
    stale: int = 0
    in_flight: int = 0
    culprits: dict[str, Culprits] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(getattr(self, k) for k in FAULTS)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["culprits"] = {k: asdict(v) for k, v in self.culprits.items()}
        return d


def ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets as ``(first, last)`` runs of consecutive values."""
    out: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def _culprits(offsets: list[int], tp: TopicPartition, source: SourceIndex) -> Culprits:
    runs = ranges(o for o in offsets if o != UNPLACED)
    c = Culprits([f"{a}-{b}" if a != b else str(a) for a, b in runs[:MAX_RANGES]], more_ranges=max(0, len(runs) - MAX_RANGES))
    if UNPLACED in offsets:
        c.ranges.append("unplaced")
    for o in offsets:
        if len(c.ids) >= MAX_IDS:
            break
        rid = source.id_of(tp, o) if o != UNPLACED else None
        if rid is not None:
            c.ids.append(rid)
    return c


def tally(reader: AuditReader, source: SourceIndex, windows: Mapping[TopicPartition, Window]) -> list[PartitionAudit]:
    """Read the sink once and count every partition of ``windows`` (sightings of other partitions are
    not this connector's: ignored)."""
    held: dict[TopicPartition, Counter[int]] = {tp: Counter() for tp in windows}
    nowhere = 0
    for tp, chunk in reader.sightings(source, windows):
        c = held.get(tp)
        if c is not None:
            c.update(chunk)
        elif tp == NOWHERE:
            nowhere += len(chunk)
    out = [_partition(reader, source, tp, w, held[tp]) for tp, w in sorted(windows.items())]
    if nowhere:  # records tied to no partition at all: foreign wherever they came from
        out.append(PartitionAudit(NOWHERE.topic, NOWHERE.partition, 0, 0, foreign=nowhere,
                                  culprits={"foreign": Culprits(["unplaced"])}))
    return out


def _partition(reader: AuditReader, source: SourceIndex, tp: TopicPartition, w: Window, held: Counter[int]) -> PartitionAudit:
    due: Sequence[int] = source.offsets(tp)
    expected = reader.expected(source, tp, due)
    p = PartitionAudit(tp.topic, tp.partition, w.first, w.end, expected=len(expected))
    committed = set(due)
    wanted = committed if expected is due else set(expected)
    missing, doubled, foreign, stale = [], [], [], []
    for o in expected:
        n = held.get(o, 0)
        if n == 1:
            p.found_once += 1
        elif n == 0:
            missing.append(o)
        else:
            doubled.append(o)
            p.extra_copies += n - 1
    for o, n in held.items():
        if o == UNPLACED:
            p.foreign += n
            foreign.append(o)
        elif o < w.first:
            continue  # before the window: not under audit (deleted by retention, or not asked for)
        elif o >= w.end:
            p.in_flight += n
        elif o not in committed:
            p.foreign += n
            foreign.append(o)
        elif o not in wanted:
            p.stale += n
            stale.append(o)
    p.missing, p.duplicated = len(missing), len(doubled)
    for kind, offs in (("missing", missing), ("duplicated", doubled), ("foreign", foreign), ("stale", stale)):
        if offs:
            p.culprits[kind] = _culprits(offs, tp, source)
    return p
