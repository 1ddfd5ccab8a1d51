"""The S3 sink read back: every visible object under ``<prefix>/<connector>/``, placed by its key.

An object's key names its partition and the first and last offset of the range it holds
(``<topic>/<partition>/<first:020d>-<last:020d>.<ext>``, see :mod:`.protocol`). A ``jsonl``
object holds values alone, one line per record, in offset order: its lines are the committed
records of that range, in order. Each line is compared with the value of its record (a digest
of both, :func:`~eosink.connectors.common.jsonlines.line_digest`): a line is placed at the next
committed offset of the range whose value it holds, so a line deleted leaves its record missing
and a line replaced by another leaves its record missing and the line foreign (not placeable);
two objects over the same offsets double them. Where the engine cannot tell a record's line
(transforms, ``value.converter=bytes`` or with schemas) lines are placed by count: line *i* at
the *i*-th committed offset, a line more foreign, a line fewer the last record missing. A
``parquet`` object carries ``__topic``, ``__partition`` and ``__offset`` columns, read as they are.

Prepared uploads are invisible and not read; neither are the ``__pending__`` and ``__epochs__``
bookkeeping keys, which live outside the data prefix.
"""

from __future__ import annotations

import bisect
import io
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eosink.connectors.api.audit import UNPLACED, SourceView, Window
from eosink.connectors.api.errors import EosinkError, RetryableError
from eosink.connectors.api.records import TopicPartition
from eosink.connectors.common.jsonlines import line_digest
from eosink.connectors.s3.client import Bucket
from eosink.connectors.s3.layout import Layout

_KEY = re.compile(r"^(?P<topic>[^/]+)/(?P<partition>\d+)/(?P<first>\d+)-(?P<last>\d+)\.(?P<ext>[a-z]+)$")
#: Objects fetched at once.
_FETCHES = 8


class S3Reader:
    needs_records = False

    def __init__(self, name: str, bucket: Bucket, layout: Layout, fmt: str) -> None:
        self.name = name
        self.limit: str | None = None
        self.bucket = bucket
        self.layout = layout
        self.format = fmt
        self.needs_digests = fmt == "jsonl"  # each line compared with its record's value

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        prefix = self.layout.data_prefix
        try:
            objects = []
            for o in self.bucket.objects(prefix):
                m = _KEY.match(o["Key"][len(prefix):])
                if m is None:
                    continue  # not a data object of this sink's layout
                tp = TopicPartition(m["topic"], int(m["partition"]))
                w = windows.get(tp)
                if w is None or int(m["last"]) < w.first or int(m["first"]) >= w.end:
                    continue  # another partition, before the window, or wholly past it (not due yet)
                objects.append((o["Key"], tp, int(m["first"]), int(m["last"]), w))
            with ThreadPoolExecutor(_FETCHES, thread_name_prefix="s3-audit") as pool:
                for tp, offsets in pool.map(lambda obj: self._placed(source, *obj), objects):
                    yield tp, offsets
        except EosinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - boto3's errors: the audit cannot tell
            raise RetryableError(f"reading s3://{self.bucket.name}/{prefix}: {exc}", component="audit") from exc

    def _placed(self, source: SourceView, key: str, tp: TopicPartition, first: int, last: int,
                w: Window) -> tuple[TopicPartition, list[int]]:
        got = self.bucket.get(key)
        if got is None:
            return tp, []  # deleted since the listing
        body = got[0]
        if self.format == "parquet" or key.endswith(".parquet"):
            return tp, _parquet_offsets(body, tp)
        offs: Sequence[int] = source.offsets(tp)
        lo, hi = bisect.bisect_left(offs, first), bisect.bisect_right(offs, last)
        digests = source.digests(tp)
        lines = body.count(b"\n") + (0 if body.endswith(b"\n") or not body else 1)
        if digests:
            placed, extra = _matched(body, offs[lo:hi], digests[lo:hi])
        elif first < w.first:  # by count, an object reaching back before the window: its last lines
            placed, extra = list(offs[lo:hi])[-lines:] if lines else [], 0  # are the window's records
        else:  # content not comparable: placed by count
            placed = list(offs[lo:min(hi, lo + lines)])
            extra = lines - len(placed)
        if first < w.first:
            extra = 0  # lines of records before the window (a continuous round's, --offsets): not under audit
        if extra > 0:
            # Lines the range's due records cannot account for: past the due end they are records
            # decided after the decision log was read (in flight); within it, foreign.
            placed += [w.end] * extra if last >= w.end else [UNPLACED] * extra
        return tp, placed

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        self.bucket.close()


def _matched(body: bytes, offs: Sequence[int], digests: Sequence[int]) -> tuple[list[int], int]:
    """Each line of a ``jsonl`` body matched, in order, to the committed record whose value it holds:
    the next record when it matches (the usual case), else the first later one that does (the records
    skipped are missing); a line no later record matches is not placed. Returns the offsets matched
    and how many lines were not."""
    lines = body.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    placed: list[int] = []
    unmatched, j, n = 0, 0, len(offs)
    later: dict[int, list[int]] | None = None
    for line in lines:
        d = line_digest(line)
        if j < n and digests[j] == d:
            placed.append(offs[j])
            j += 1
            continue
        if later is None:  # a line out of step: index the range's digests once
            later = {}
            for i, x in enumerate(digests):
                later.setdefault(x, []).append(i)
        at = later.get(d, [])
        k = bisect.bisect_left(at, j)
        if k == len(at):
            unmatched += 1
            continue
        j = at[k] + 1
        placed.append(offs[at[k]])
    return placed, unmatched


def _parquet_offsets(body: bytes, tp: TopicPartition) -> list[int]:
    import pyarrow.parquet as pq

    t: Any = pq.read_table(io.BytesIO(body), columns=["__topic", "__partition", "__offset"])
    out = []
    for topic, part, off in zip(*(t.column(c).to_pylist() for c in ("__topic", "__partition", "__offset"))):
        out.append(int(off) if (topic, part) == (tp.topic, tp.partition) and off is not None else UNPLACED)
    return out
