"""The S3 sink read back: every visible object under ``<prefix>/<connector>/``, placed by its key.

An object's key names its partition and the first and last offset of the range it holds
(``<topic>/<partition>/<first:020d>-<last:020d>.<ext>``, see :mod:`.protocol`). A ``jsonl``
object holds values alone, one line per record, in offset order: its lines are the committed
records of that range, in order, so line *i* is placed at the *i*-th committed offset of the
range. A line more than the range has committed records is not placeable (foreign); a line fewer
leaves the range's last records missing; two objects over the same offsets double them. A
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
                if w is None or int(m["last"]) < w.first:
                    continue  # another partition, or before the window
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
        lines = body.count(b"\n") + (0 if body.endswith(b"\n") or not body else 1)
        offs: Sequence[int] = source.offsets(tp)
        lo, hi = bisect.bisect_left(offs, first), bisect.bisect_right(offs, last)
        placed = list(offs[lo:min(hi, lo + lines)])
        extra = lines - len(placed)
        if extra > 0:
            # Lines the range's due records cannot account for: past the due end they are records
            # decided after the decision log was read (in flight); within it, foreign.
            placed += [w.end] * extra if last >= w.end else [UNPLACED] * extra
        return tp, placed

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        self.bucket.close()


def _parquet_offsets(body: bytes, tp: TopicPartition) -> list[int]:
    import pyarrow.parquet as pq

    t: Any = pq.read_table(io.BytesIO(body), columns=["__topic", "__partition", "__offset"])
    out = []
    for topic, part, off in zip(*(t.column(c).to_pylist() for c in ("__topic", "__partition", "__offset"))):
        out.append(int(off) if (topic, part) == (tp.topic, tp.partition) and off is not None else UNPLACED)
    return out
