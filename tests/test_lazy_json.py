"""Values checked but not decoded (``LazyJsonRecord``): what a sink that copies JSON bytes gets.

The record must behave as the decoded one wherever its value is read, the sinks that copy bytes
must write exactly what they wrote for decoded records without decoding anything, and the engine
may defer decoding only when nothing in the task reads values.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import pytest

from eosink.connectors.api.records import (
    UNDECODED,
    LazyJsonRecord,
    SinkRecord,
    TopicPartition,
    TxnManifest,
    copied_json,
    json_document,
)
from eosink.connectors.common import jsonlines
from eosink.connectors.filesystem import FilesystemSink
from eosink.connectors.http.sink import encode_body
from eosink.connectors.iceberg.sink import IcebergSink
from eosink.connectors.memory import MemorySink
from eosink.connectors.s3.sink import S3Sink
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.transforms.chain import build_chain
from tests.fakes import ListSource

VALUES = [b'{"id":1,"big":123456789012345678901234567890,"s":"\\u00e9"}', b'[1,2.5,"x"]',
          b'{"id":3,"nested":{"a":[null,true]}}']
HEADERS = (("eosink.id", b"job/run/0/7"),)


def lazy(offset: int, raw: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> SinkRecord:
    r = SinkRecord("t", 0, offset, b"k", UNDECODED, raw, headers, 1)
    r.__class__ = LazyJsonRecord  # as the source makes them
    return r


def decoded(offset: int, raw: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> SinkRecord:
    return SinkRecord("t", 0, offset, b"k", json.loads(raw), raw, headers, 1)


def test_reading_a_lazy_value_decodes_it_once_and_leaves_a_plain_record() -> None:
    r = lazy(0, VALUES[0])
    assert r.__class__ is LazyJsonRecord
    v = r.value
    assert v == json.loads(VALUES[0]) and v["big"] == 123456789012345678901234567890
    assert r.__class__ is SinkRecord and r.value is v  # decoded once, kept
    assert r == decoded(0, VALUES[0])


def test_assigning_a_value_makes_the_record_plain_so_its_old_bytes_are_not_copied() -> None:
    r = lazy(0, VALUES[0])
    assert copied_json(r) == VALUES[0]
    r.value = 5  # e.g. by code that forgot to update raw_value
    assert r.__class__ is SinkRecord
    assert copied_json(r) is None
    assert json_document(r, component="test", needs="JSON") == b"5"


def test_copies_and_pickles_of_a_lazy_record_are_plain_records_with_the_value() -> None:
    for clone in (copy.copy, lambda r: pickle.loads(pickle.dumps(r)), lambda r: dataclasses.replace(r, offset=9)):
        r = lazy(0, VALUES[1])
        c = clone(r)
        assert c.__class__ is SinkRecord and c.value == [1, 2.5, "x"] and c.raw_value == VALUES[1]


@pytest.mark.parametrize("headers", [(), HEADERS], ids=["no-headers", "id-header"])
def test_sinks_that_copy_bytes_write_the_same_bytes_for_lazy_records_without_decoding_them(headers: Any) -> None:
    lazies = [lazy(i, raw, headers) for i, raw in enumerate(VALUES)]
    plain = [decoded(i, raw, headers) for i, raw in enumerate(VALUES)]
    manifest = TxnManifest.covering("txn-1", "c", plain, epoch=1)
    assert jsonlines.envelopes(lazies, "test") == jsonlines.envelopes(plain, "test")
    assert jsonlines.values(lazies, "test") == jsonlines.values(plain, "test")
    assert encode_body(manifest, lazies) == encode_body(manifest, plain)
    assert all(r.__class__ is LazyJsonRecord for r in lazies), "a sink that copies bytes decoded a value"
    mixed = [lazies[0], plain[1], decoded(2, b'"a scalar"')]
    assert jsonlines.values(mixed, "test") == VALUES[0] + b"\n" + VALUES[1] + b'\n"a scalar"\n'


def test_a_pretty_printed_lazy_value_is_still_written_on_one_line() -> None:
    raw = b'{\n  "id": 1,\n  "s": "\\u00e9"\n}'
    line = jsonlines.envelopes([lazy(0, raw)], "test")
    assert line.count(b"\n") == 1 and json.loads(line)["value"] == {"id": 1, "s": "\u00e9"}


class DeferringListSource(ListSource):
    """A list source that records whether the task asked it to defer decoding."""

    deferred = False

    def defer_json_decoding(self) -> bool:
        self.deferred = True
        return True


@pytest.mark.parametrize("sinks, transforms, expected", [
    (["filesystem"], None, True),
    (["s3-jsonl"], None, True),
    (["s3-parquet"], None, False),  # columns are built from the decoded fields
    (["iceberg"], None, True),  # the bytes are parsed into Arrow columns
    (["filesystem", "filesystem"], None, True),
    (["filesystem", "memory"], None, False),  # the memory sink keeps values: it reads them
    (["memory"], None, False),
    (["filesystem"], {"transforms": "tag", "transforms.tag.type": "InsertField$Value",
                      "transforms.tag.static.field": "f", "transforms.tag.static.value": "v"}, False),
], ids=["filesystem", "s3-jsonl", "s3-parquet", "iceberg", "two-copying-sinks", "with-a-reading-sink", "memory", "with-a-transform"])
def test_a_task_defers_decoding_only_when_no_sink_and_no_transform_reads_values(
        tmp_path: Any, sinks: list[str], transforms: dict[str, str] | None, expected: bool) -> None:
    def sink(i: int, kind: str) -> Any:
        if kind == "filesystem":
            return FilesystemSink("c", {"file.path": str(tmp_path / str(i))})
        if kind.startswith("s3-"):  # (not opened: nothing is sent)
            return S3Sink("c", {"s3.bucket.name": "b", "format": kind[3:]})
        if kind == "iceberg":  # (not opened: no catalog is asked)
            return IcebergSink("c", {"iceberg.catalog.uri": f"sqlite:///{tmp_path}/c.db", "iceberg.warehouse": f"file://{tmp_path}/w"})
        return MemorySink("c", {"memory.store": f"lazy-{i}"})

    built = [sink(i, kind) for i, kind in enumerate(sinks)]
    source = DeferringListSource({TopicPartition("t", 0): []})
    SinkTask("c", "w1", built, source, MemoryDecisionLog(), transforms=build_chain(transforms) if transforms else None)
    assert source.deferred is expected
