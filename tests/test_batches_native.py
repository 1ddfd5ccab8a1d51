"""The C loops of batching sinks (``_batches.c``) give exactly the Python paths' results, or leave the batch to them.

Batches of undecoded records (``LazyJsonRecord``, the topic's bytes) are joined in C; a value with a line
break, a record of another class or a raw slot that is not bytes anywhere in the batch makes the C join
answer None, and the Python path then re-encodes, converts or refuses the value as it always did. The
records of a slice are grouped per partition in C, in their order; a slice of several topics is left
to the Python grouping by (topic, partition).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import LazyJsonRecord, SinkRecord
from eosink.connectors.common import jsonlines
from eosink.connectors.s3 import staging
from tests.test_lazy_json import decoded, lazy

pytestmark = pytest.mark.skipif(jsonlines.native is None or staging.native_group is None,
                                reason="the C extension is not built")


@pytest.fixture
def python_path() -> Iterator[None]:
    """The Python path alone, restored after the test."""
    native = jsonlines.native
    jsonlines.native = None
    try:
        yield
    finally:
        jsonlines.native = native


def python_values(records: list[SinkRecord]) -> bytes:
    native, jsonlines.native = jsonlines.native, None
    try:
        return jsonlines.values(records, "test")
    finally:
        jsonlines.native = native


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.text(max_size=5), JSON, max_size=4) | st.lists(JSON, max_size=3),
                          st.booleans()), max_size=12))
def test_the_c_join_writes_the_python_paths_bytes_for_any_batch(docs: list[tuple[object, bool]]) -> None:
    records = [lazy(i, json.dumps(d, indent=2 if pretty else None).encode()) for i, (d, pretty) in enumerate(docs)]
    body = jsonlines.values(records, "test")
    assert body == python_values(records)
    assert body.count(b"\n") == len(records) and [json.loads(line) for line in body.splitlines()] == [d for d, _ in docs]


def test_the_c_join_copies_each_value_once_with_its_newline() -> None:
    values = [b'{"a":1}', b"[2]", b'{"s":"\\u00e9 \\n"}']
    records = [lazy(i, v) for i, v in enumerate(values)]
    assert jsonlines.native is not None
    assert jsonlines.native([records[:1], records[1:]], LazyJsonRecord, jsonlines._RAW_SLOT) == b"".join(v + b"\n" for v in values)
    assert jsonlines.native([], LazyJsonRecord, jsonlines._RAW_SLOT) == b""


def test_a_pretty_printed_value_anywhere_in_the_batch_leaves_the_batch_to_the_python_path() -> None:
    records = [lazy(0, b'{"a":1}'), lazy(1, b'{\n  "b": 2\n}')]
    assert jsonlines.native is not None
    assert jsonlines.native([records], LazyJsonRecord, jsonlines._RAW_SLOT) is None
    assert jsonlines.values(records, "test") == b'{"a":1}\n{"b":2}\n'


def test_a_decoded_record_in_the_batch_leaves_it_to_the_python_path() -> None:
    records = [lazy(0, b'{"a":1}'), decoded(1, b'"a scalar"')]
    assert jsonlines.native is not None
    assert jsonlines.native([records], LazyJsonRecord, jsonlines._RAW_SLOT) is None
    assert jsonlines.values(records, "test") == b'{"a":1}\n"a scalar"\n'


def test_a_raw_value_that_is_not_bytes_leaves_the_batch_to_the_python_path_which_names_the_record() -> None:
    record = SinkRecord("t", 0, 7, None, b"\x00raw", None)
    assert jsonlines.native is not None
    assert jsonlines.native([[lazy(0, b"{}"), record]], LazyJsonRecord, jsonlines._RAW_SLOT) is None
    with pytest.raises(RecordError) as err:
        jsonlines.values([lazy(0, b"{}"), record], "test")
    assert err.value.offset == 7


def test_the_python_path_alone_writes_the_same_body(python_path: None) -> None:
    records = [lazy(i, v) for i, v in enumerate([b'{"a":1}', b"[1,2]"])]
    assert jsonlines.values(records, "test") == b'{"a":1}\n[1,2]\n'


def test_the_join_refuses_a_descriptor_that_is_not_the_records_slot() -> None:
    assert jsonlines.native is not None
    with pytest.raises(TypeError):
        jsonlines.native([[lazy(0, b"{}")]], LazyJsonRecord, SinkRecord.__dict__["tp"])


def python_group(records: list[SinkRecord]) -> dict[tuple[str, int], list[SinkRecord]]:
    native, staging.native_group = staging.native_group, None
    try:
        return staging.group(records)
    finally:
        staging.native_group = native


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t", "u"]), st.sampled_from([0, 1, 7, 1000, 2**40])), max_size=40),
       st.booleans())
def test_the_c_grouping_gives_the_python_groups_in_order_for_any_slice(coords: list[tuple[str, int]], one_topic: bool) -> None:
    records = [SinkRecord("t" if one_topic else t, int(str(p)), i, None, {}, b"{}") for i, (t, p) in enumerate(coords)]
    records[::3] = [lazy(r.offset, b"{}") for r in records[::3]]  # the class of a record read undecoded
    for r in records[::3]:
        r.topic = "t"
    groups = staging.group(records)
    assert groups == python_group(records)
    assert [list(g) for g in groups.values()] == [list(g) for g in python_group(records).values()]  # same order
    assert sorted(r.offset for g in groups.values() for r in g) == list(range(len(records)))


def test_a_slice_of_two_topics_is_left_to_the_python_grouping() -> None:
    records = [SinkRecord("t", 0, 0, None, {}, b"{}"), SinkRecord("u", 0, 1, None, {}, b"{}")]
    assert staging.native_group is not None
    assert staging.native_group(records, staging._TOPIC, staging._PARTITION) is None
    assert staging.group(records) == {("t", 0): records[:1], ("u", 0): records[1:]}
