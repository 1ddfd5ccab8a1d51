"""The filesystem sink read back: every line of ``committed/*.jsonl`` names its topic, partition and offset.

Only committed files are read (a prepared file is invisible to readers, so it is not delivered).
Each line is an envelope the sink writes itself (:func:`eosink.connectors.common.jsonlines.envelopes`)
starting ``{"topic":...,"partition":N,"offset":N,``; that prefix is matched without parsing the
value, so a large file reads at disk speed. A line that does not match is parsed as JSON; one
without coordinates is tied to no partition (:data:`NOWHERE`) and counts as foreign. ``file.format=raw`` writes values
alone: nothing ties a line to its record, so that sink is not audited.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from eosink.connectors.api.audit import NOWHERE, UNPLACED, SourceView, Window
from eosink.connectors.api.errors import RetryableError
from eosink.connectors.api.records import TopicPartition

_PREFIX = re.compile(rb'^\{"topic":("(?:[^"\\]|\\.)*"),"partition":(\d+),"offset":(\d+),', re.M)


class FilesystemReader:
    needs_records = False

    def __init__(self, name: str, root: Path, fmt: str) -> None:
        self.name = name
        self.root = root
        self.limit: str | None = None if fmt == "jsonl" else (
            "file.format=raw: lines are values alone, with no topic, partition or offset to tie them to their records")

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        try:
            files = sorted((self.root / "committed").glob("*.jsonl"))
        except OSError as exc:
            raise RetryableError(f"cannot list {self.root / 'committed'}: {exc}", component="audit") from exc
        for f in files:
            try:
                data = f.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise RetryableError(f"cannot read {f}: {exc}", component="audit") from exc
            yield from _lines(data)

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        return None


def _lines(data: bytes) -> Iterable[tuple[TopicPartition, list[int]]]:
    """The coordinates of every line of one file, grouped by partition."""
    found: dict[TopicPartition, list[int]] = {}
    matched = 0
    topics: dict[bytes, str] = {}
    for m in _PREFIX.finditer(data):
        raw_topic = m.group(1)
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = json.loads(raw_topic)
        found.setdefault(TopicPartition(topic, int(m.group(2))), []).append(int(m.group(3)))
        matched += 1
    if matched != data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1):
        found = {}  # a line not in the sink's own shape: read every line the slow way
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                found.setdefault(TopicPartition(str(d["topic"]), int(d["partition"])), []).append(int(d["offset"]))
            except (ValueError, KeyError, TypeError):
                found.setdefault(NOWHERE, []).append(UNPLACED)
    return found.items()
