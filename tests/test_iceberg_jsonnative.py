"""The Iceberg sink's C parse of JSON bytes into Arrow buffers (``connectors/iceberg/jsonnative.py``,
``_json_columns.c``) never decides anything the checked dicts-to-Arrow path would decide otherwise:
where it returns a table, the checked path makes the same table of the same records, bit for bit
(floats parsed as ``float()`` does, escapes decoded as ``json.loads`` does); where the checked path
refuses a record, it returns None. Where both it and Arrow's reader return a table, the tables are
the same. And it is really taken for ordinary batches, so the property is not met by always declining.

No services needed: pure conversion.
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyiceberg")

import pyarrow as pa  # noqa: E402
from pyiceberg.io.pyarrow import schema_to_pyarrow  # noqa: E402
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.types import LongType, NestedField  # noqa: E402

from eosink.connectors.api.records import UNDECODED, DeferredRecord, LazyJsonRecord, SinkRecord  # noqa: E402
from eosink.connectors.iceberg import arrow as ia  # noqa: E402
from eosink.connectors.iceberg import jsonarrow, jsonnative  # noqa: E402
from tests.test_iceberg_jsonarrow import checked, exact, raw_values, records_of, schema_of  # noqa: E402

pytestmark = pytest.mark.skipif(not jsonnative.available(), reason="the C extension is not built (or EOSINK_ICEBERG_NATIVE=0)")


def native(schema: Schema, records: list[SinkRecord], kafka: bool = True) -> pa.Table | None:
    return jsonnative.from_json(schema, schema_to_pyarrow(schema, include_field_ids=False), records, kafka,
                                {r.topic for r in records})


def reader(schema: Schema, records: list[SinkRecord], kafka: bool = True) -> pa.Table | None:
    """Arrow's reader alone (the C parser switched off)."""
    jsonnative.enabled = False
    try:
        return jsonarrow.from_json(schema, records, kafka, {r.topic for r in records})
    finally:
        jsonnative.enabled = True


def assert_same_or_declined(schema: Schema, raws: list[bytes], kafka: bool = True) -> pa.Table | None:
    records = records_of(raws)
    fast = native(schema, records, kafka)
    if fast is not None:
        slow = checked(schema, records, kafka)
        assert isinstance(slow, pa.Table), f"parsed a batch the checked path refuses: {slow}"
        assert fast.schema == slow.schema
        assert exact(fast) == exact(slow)
        other = reader(schema, records, kafka)
        assert other is None or exact(other) == exact(fast)
    return fast


#: Spellings of numbers and strings json.dumps never writes, each put in every column.
odd_token = st.sampled_from([
    "1E5", "1e+5", "-0.0", "-0", "0e0", "1.5e-7", "01", "1.", ".5", "-", "1e", "NaN", "Infinity", "-Infinity", "1e400",
    "1e-400", "4.9e-324", "2.2250738585072014e-308", "9007199254740992", "-9007199254740993", "9007199254740991.0",
    "9223372036854775807", "-9223372036854775808", "9223372036854775808", "18446744073709551616", "123456789012345678901",
    "0.1000000000000000055511151231257827", "1" + "0" * 30 + ".5", "1e0000022", "true", "false", "null", "nul",
    '"\\u00e9\\ud83d\\ude00"', '"\\ud83d"', '"\\ude00x"', '"\\uD83D\\uDE00"', '"a\\/b\\"c\\\\\\b\\f\\n\\r\\t"', '"\\x41"',
    '"\\u004"', '"tab\there"', '"\x7f"', '"\\u0000"', '{}', '[]', '"é"', '"\xc3"', '"\xed\xa0\x80"', '"\xf0\x9f\x98\x80"', '"\xc3\xa9"',
])
column = st.sampled_from(["n", "x", "s", "b"])


@st.composite
def odd_values(draw: Any) -> bytes:
    """An object whose values are the odd spellings, with odd keys and spacing."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.one_of(column.map(json.dumps), st.sampled_from(['"\\u006e"', '"n\\u0000"', '"other"', '"x"'])))
        sep = draw(st.sampled_from([":", " : ", "\t:\r\n"]))
        parts.append(f"{key}{sep}{draw(odd_token)}")
    text = "{" + draw(st.sampled_from([",", ", ", ",\n"])).join(parts) + "}"
    text = draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", " ", "\r\n", " x", "}"]))
    return text.encode("latin-1")  # the tokens' characters are their bytes: invalid UTF-8 included


def decodable(raws: list[bytes]) -> bool:
    try:
        for raw in raws:
            json.loads(raw)
        return True
    except ValueError:
        return False


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raws=st.lists(st.one_of(raw_values(), odd_values()), min_size=1, max_size=8).filter(decodable),
       required=st.sampled_from([None, "n", "s"]))
@example(raws=[b'{"x": 9007199254740993}'], required=None)
@example(raws=[b'{"x": -0}'], required=None)
@example(raws=[b'{"x": -0.0}'], required=None)
@example(raws=[b'{"n": 1, "n": 2}'], required=None)
@example(raws=[b'{"s": "\\ud800"}'], required=None)
@example(raws=[b'{"s": "\\ud83d\\ude00"}'], required=None)
@example(raws=[b'{"s": {"a": 1}}'], required=None)
@example(raws=[b'{"b": 1}'], required=None)
@example(raws=[b'{"n": 1.0}'], required=None)
@example(raws=[b'{"x": NaN}'], required=None)
@example(raws=[b'{"x": 1e400}'], required=None)
@example(raws=[b'{"__offset": 1}'], required=None)
@example(raws=[b'{"x": 1}', b'[1]'], required=None)
@example(raws=[b'{"x": 1}'], required="s")
@example(raws=[b'{"s": null}'], required="s")
def test_parsed_batch_is_the_checked_batch_or_declined(raws: list[bytes], required: str | None) -> None:
    assert_same_or_declined(schema_of(required), raws)


fitting = st.fixed_dictionaries({}, optional={
    "n": st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    "x": st.one_of(st.none(), st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1), st.floats(allow_nan=False, allow_infinity=False)),
    "s": st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=["Cs"]))),
    "b": st.one_of(st.none(), st.booleans()),
})


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(fitting, min_size=1, max_size=20), ensure_ascii=st.booleans(), required=st.sampled_from([None, "n"]))
def test_batch_that_fits_the_table_is_parsed_natively(values: list[dict[str, Any]], ensure_ascii: bool,
                                                      required: str | None) -> None:
    """Every finite float (written by repr: exponents, 17 digits, -0.0), every int of the column's range,
    every string without a lone surrogate: parsed, and the checked path's table."""
    raws = [json.dumps(v, ensure_ascii=ensure_ascii).encode() for v in values]
    if required and any(v.get(required) is None for v in values):
        return
    assert assert_same_or_declined(schema_of(required), raws) is not None


decimal = st.builds(lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
                    st.sampled_from(["", "-"]),
                    st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,25}", fullmatch=True)),
                    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,30}", fullmatch=True)),
                    st.one_of(st.just(""), st.from_regex(r"[eE][+-]?[0-9]{1,3}", fullmatch=True)))


@settings(max_examples=3000, deadline=None)
@given(text=decimal)
@example(text="2.2250738585072011e-308")
@example(text="0.30000000000000004")
@example(text="9007199254740993.0")
@example(text="123456789012345.6")
@example(text="1e22")
@example(text="1e23")
def test_double_is_what_float_makes_of_the_text(text: str) -> None:
    """Correct rounding, fast path and strtod alike: the bits of ``float(text)`` (an integer spelling
    in range is the int's double, as the checked path converts it)."""
    table = native(schema_of(), records_of([f'{{"x": {text}}}'.encode()]))
    value = json.loads(text)
    if table is None:
        # Declined only where the checked path does not store the number as it is, or where it overflows.
        assert abs(value) >= 2**53 if type(value) is int else math.isinf(value)
        return
    got = table.column("x")[0].as_py()
    assert struct.pack("<d", got) == struct.pack("<d", float(value))


def test_undecoded_records_are_parsed_and_stay_undecoded() -> None:
    raws = [json.dumps({"n": i, "x": i / 4, "s": f"ü{i}", "b": i % 2 == 0}).encode() for i in range(2000)]
    records: list[SinkRecord] = []
    for i, raw in enumerate(raws):
        r = SinkRecord("orders", i % 5, 7 + i, None, UNDECODED, raw)
        r.__class__ = LazyJsonRecord
        records.append(r)
    table = native(schema_of(), records)
    assert table is not None
    assert table.column("s")[1999].as_py() == "ü1999" and table.column("x")[3].as_py() == 0.75
    assert table.column("__partition").to_pylist() == [i % 5 for i in range(2000)]
    assert table.column("__offset")[5].as_py() == 12 and table.column("__topic").unique().to_pylist() == ["orders"]
    assert all(r.__class__ is LazyJsonRecord for r in records), "a value was decoded"


def test_value_that_is_not_a_dict_is_declined_though_its_bytes_are_an_object() -> None:
    """``value.converter=bytes``: the bytes are a JSON object but the value is not (the checked path refuses it)."""
    records = [SinkRecord("orders", 0, 0, None, b'{"n": 1}', b'{"n": 1}')]
    assert native(schema_of(), records) is None
    records[0].value = None
    assert native(schema_of(), records) is None


def test_record_without_its_bytes_and_other_coordinate_types_fall_back() -> None:
    records = records_of([b'{"n": 1}', b'{"n": 2}'])
    records[1].raw_value = None
    assert native(schema_of(), records) is None
    wide = Schema(*schema_of().fields[:5], NestedField(6, "__partition", LongType(), required=True),
                  NestedField(7, "__offset", LongType(), required=True))
    table = native(wide, records_of([b'{"n": 1}', b'{"n": 2}']))
    assert table is not None and table.column("__partition").type == pa.int64()
    assert exact(table) == exact(checked(wide, records_of([b'{"n": 1}', b'{"n": 2}'])))


def test_several_topics_get_their_own_topic_column() -> None:
    records = records_of([b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'], topics=("a", "b"))
    table = native(schema_of(), records)
    assert table is not None and table.column("__topic").to_pylist() == ["a", "b", "a"]


@pytest.mark.parametrize("raw", [b'{"s": "\xff"}', b'{"s": "\xc3"}', b'{"s": "\xe2\x82"}', b'{"s": "\xc0\xaf"}',
                                 b'{"s": "\xf4\x90\x80\x80"}', b'{"s": "x"}\n{"s": "y"}'])
def test_bytes_that_are_not_one_utf8_object_are_declined(raw: bytes) -> None:
    """Invalid UTF-8 (truncated, overlong, beyond U+10FFFF) or two documents: the engine never hands
    such bytes over undecoded, but the parse checks rather than trusts."""
    r = SinkRecord("orders", 0, 0, None, UNDECODED, raw)
    r.__class__ = LazyJsonRecord
    assert native(schema_of(), [r]) is None


def test_sink_batch_takes_the_native_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sink calls (jsonarrow.from_json) returns the C parser's table: Arrow's reader is never reached."""
    records = records_of([json.dumps({"n": i, "s": "v"}).encode() for i in range(10)])

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Arrow's reader ran")

    monkeypatch.setattr(jsonarrow.pj, "read_json", refused)
    table = jsonarrow.from_json(schema_of(), records, True, {"orders"})
    assert table is not None and table.column("n").to_pylist() == list(range(10))


def test_env_switch_turns_the_native_parse_off() -> None:
    code = "from eosink.connectors.iceberg import jsonnative; print(jsonnative.available())"
    env = {**os.environ, jsonnative.ENV: "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert ia.KAFKA_NAMES  # (the module the switch falls back to stays importable)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.permutations(["a", "ab", "abc", "é"]).flatmap(
    lambda keys: st.lists(st.sampled_from(keys), max_size=4, unique=True)), min_size=1, max_size=6))
def test_keys_that_are_prefixes_of_other_columns_find_their_own_column(rows: list[list[str]]) -> None:
    """The parser first tries the column after the last key's (fields in the table's order): a key
    that only starts like that column's name must still find its own."""
    schema = Schema(*(NestedField(i + 1, name, LongType(), required=False) for i, name in enumerate(["a", "ab", "abc", "é"])))
    raws = [json.dumps({k: i for i, k in enumerate(keys)}, ensure_ascii=False).encode() for keys in rows]
    table = native(schema, records_of(raws), kafka=False)
    assert table is not None
    assert exact(table) == exact(checked(schema, records_of(raws), kafka=False))


def test_column_name_that_json_escapes_is_declined() -> None:
    """A name holding a quote or a backslash is matched against the key's raw bytes nowhere: the reader decides."""
    schema = Schema(NestedField(1, 'q"x', LongType(), required=False))
    assert native(schema, records_of([b'{"q\\"x": 1}']), kafka=False) is None


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(4096, 12000))
def test_batch_split_over_two_threads_is_the_checked_batch(seed: int, n: int) -> None:
    """From 4096 rows the second half parses on a thread of its own (its strings after the first's, its
    bitmaps from a whole byte on): the same table as the checked path's, and a record only the second
    half holds still declines the batch."""
    rng = random.Random(seed)

    def value() -> dict[str, Any]:
        v = {"n": rng.randrange(-(2**63), 2**63), "x": rng.choice([rng.random() * 1e6, rng.randrange(-1000, 1000), None]),
             "s": rng.choice(["", "é\u2028\U0001f600", "plain", None, "a\"b\\c\n" * rng.randrange(3)]),
             "b": rng.choice([True, False, None])}
        return {k: x for k, x in v.items() if x is not None or rng.random() < 0.5}

    raws = [json.dumps(value(), ensure_ascii=rng.random() < 0.5).encode() for i in range(n)]
    table = native(schema_of(), records_of(raws))
    assert table is not None
    assert exact(table) == exact(checked(schema_of(), records_of(raws)))
    raws[rng.randrange(n // 2 + 8, n)] = b'{"n": 1.5}'
    assert native(schema_of(), records_of(raws)) is None


def test_record_of_another_class_is_read_through_its_attributes() -> None:
    """Fields are read from the slots only for SinkRecord and LazyJsonRecord; a record of another class
    (a DeferredRecord, whose value is a property) is read through its attributes and its value checked."""
    r = SinkRecord("orders", 2, 9, None, UNDECODED, b'{"n": 5, "s": "d"}')
    r.__class__ = DeferredRecord
    table = native(schema_of(), [r])
    assert table is not None and table.column("n").to_pylist() == [5] and table.column("__offset").to_pylist() == [9]
    arr = SinkRecord("orders", 2, 10, None, UNDECODED, b'[1]')
    arr.__class__ = DeferredRecord
    assert native(schema_of(), [arr]) is None
