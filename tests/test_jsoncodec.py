"""eosink.connectors.common.jsoncodec against the standard library, over generated documents.

The codec's contract is the stdlib's: ``decode(raw)`` returns what ``json.loads(raw)`` returns or raises
what it raises; ``encode(v)`` returns ``json.dumps(v, separators=(",", ":")).encode()`` or raises what it
raises. The documents are built as text (not through ``json.dumps``) so they hold what a producer may
send: duplicate keys, number literals of any length, ``NaN``/``Infinity``, lone surrogates escaped or as
bytes, odd whitespace, a byte order mark, UTF-16/32, deep nesting, and corrupted bytes.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eosink.connectors.common import jsoncodec


# ---------------------------------------------------------------------------------------- comparing
def same(a: Any, b: Any) -> bool:
    """Equality that tells 1 from 1.0 from True, 0.0 from -0.0, and keeps key order; NaN equals NaN.
    Iterative: the documents compared nest as deep as the decoder allows."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if x.__class__ is not y.__class__:
            return False
        if x.__class__ is float:
            if math.isnan(x) or math.isnan(y):
                if not (math.isnan(x) and math.isnan(y)):
                    return False
            elif x != y or math.copysign(1.0, x) != math.copysign(1.0, y):
                return False
        elif x.__class__ is dict:
            if list(x) != list(y):
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif x.__class__ in (list, tuple):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y))
        elif x != y:
            return False
    return True


def outcome(fn: Any, arg: Any) -> tuple[Any, ...]:
    try:
        return ("value", fn(arg))
    except Exception as exc:  # noqa: BLE001 - the refusal is what is compared
        return ("refused", type(exc), str(exc))


def assert_same_outcome(mine: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    if theirs[0] == "value":
        assert mine[0] == "value", f"refused {mine[1:]} where the stdlib gives {theirs[1]!r}"
        assert same(mine[1], theirs[1]), f"{mine[1]!r} != stdlib {theirs[1]!r}"
    else:
        assert mine == theirs


def assert_decodes_as_stdlib(raw: bytes) -> None:
    assert_same_outcome(outcome(jsoncodec.decode, raw), outcome(json.loads, raw))


# ---------------------------------------------------------------------------------------- documents as text
_ws = st.text(alphabet=" \t\r\n", max_size=2)
_number = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
    st.integers(min_value=-(2**200), max_value=2**200).map(str),  # beyond 64 bits: exact ints
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "-0.0",
                     "9223372036854775808", "-9223372036854775809", "18446744073709551616", "1.7976931348623157e308"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr).map(lambda s: {"nan": "NaN", "inf": "Infinity",
                                                                            "-inf": "-Infinity"}.get(s, s)),
)
# Any code point, lone surrogates included (json.dumps escapes them, or writes them raw without ensure_ascii).
_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
_string = st.builds(lambda s, ascii_only: json.dumps(s, ensure_ascii=ascii_only), _text, st.booleans())
_scalar = st.one_of(_number, _string, st.sampled_from(["true", "false", "null"]))


def _join(parts: list[str], open_: str, close: str, ws: str) -> str:
    return open_ + ws + ("," + ws).join(parts) + ws + close


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    keys = st.one_of(st.sampled_from(['"a"', '"b"', '"id"']), _string)  # few names: duplicate keys are common
    pair = st.builds(lambda k, ws, v: f"{k}{ws}:{ws}{v}", keys, _ws, children)
    return st.one_of(
        st.builds(_join, st.lists(children, max_size=5), st.just("["), st.just("]"), _ws),
        st.builds(_join, st.lists(pair, max_size=5), st.just("{"), st.just("}"), _ws),
    )


_document = st.recursive(_scalar, _containers, max_leaves=25)


def _encoded(doc: str, how: str) -> bytes:
    if how == "utf-8":
        return doc.encode("utf-8", "surrogatepass")  # a lone surrogate becomes ED A0 80 and the like
    if how == "utf-8-sig":
        return b"\xef\xbb\xbf" + doc.encode("utf-8", "surrogatepass")
    return doc.encode(how, "surrogatepass")


_encoding = st.sampled_from(["utf-8"] * 6 + ["utf-8-sig", "utf-16-le", "utf-16-be", "utf-32-le", "utf-16"])
_raw_document = st.builds(lambda ws1, doc, ws2, how: _encoded(ws1 + doc + ws2, how), _ws, _document, _ws, _encoding)


@st.composite
def _corrupted(draw: st.DrawFn) -> bytes:
    """A document with bytes replaced, inserted or cut: invalid UTF-8, truncation, stray characters."""
    raw = bytearray(draw(_raw_document))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["replace", "insert", "cut"]))
        byte = draw(st.integers(0, 255))
        if op == "replace" and at < len(raw):
            raw[at] = byte
        elif op == "insert":
            raw.insert(at, byte)
        else:
            del raw[at:]
    return bytes(raw)


@st.composite
def _nested(draw: st.DrawFn) -> bytes:
    """Nesting from shallow to past the recursion limit, objects and arrays mixed."""
    depth = draw(st.one_of(st.integers(0, 50), st.integers(700, 1100)))
    opens = draw(st.lists(st.sampled_from(["[", '{"k":']), min_size=depth, max_size=depth))
    inner = draw(st.sampled_from(["1", "[]", "{}", '"x"', "NaN"]))
    return ("".join(opens) + inner + "".join("]" if o == "[" else "}" for o in reversed(opens))).encode()


# ---------------------------------------------------------------------------------------- decode
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_raw_document)
@example(b'{"a":1,"b":2,"a":3}')  # duplicate keys: the last value, at the first key's place
@example(b'"\\ud800"')
@example(b'"\xed\xa0\x80"')
@example(b"[NaN,Infinity,-Infinity,1e400]")
@example(b"123456789012345678901234567890123")
@example(b"\xef\xbb\xbf{}")
@example(b"1" * 4301)  # over the int digit limit: ValueError from both
def test_decode_gives_the_value_or_refusal_of_json_loads_on_generated_documents(raw: bytes) -> None:
    assert_decodes_as_stdlib(raw)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_corrupted(), st.binary(max_size=40)))
@example(b'"\xff"')
@example(b"\x00{}")
@example(b'{"a":1,}')
def test_decode_refuses_corrupted_bytes_exactly_as_json_loads(raw: bytes) -> None:
    assert_decodes_as_stdlib(raw)


@settings(max_examples=150, deadline=None)
@given(_nested())
def test_decode_nests_as_deep_as_json_loads_and_no_deeper(raw: bytes) -> None:
    assert_decodes_as_stdlib(raw)


@pytest.mark.parametrize("open_, close", [(b"[", b"]"), (b'{"k":', b"}")], ids=["arrays", "objects"])
def test_decode_agrees_with_json_loads_at_the_recursion_limit(open_: bytes, close: bytes) -> None:
    """msgspec nests a few levels deeper than json.loads: around the limit, the stdlib must decide.
    The limit depends on the caller's stack (every frame counts), so the reference is json.loads in the
    codec's own place: the codec with its native path switched off."""
    def nested(n: int) -> bytes:
        return open_ * n + b"1" + close * n

    def refuse(raw: bytes) -> Any:
        raise ValueError("native path off")

    native = jsoncodec._native_decode
    seen: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for n in range(1, 5000):  # every call below from this very frame: the same stack under each
        raw = nested(n)
        mine = outcome(jsoncodec.decode, raw)
        jsoncodec._native_decode = refuse
        try:
            theirs = outcome(jsoncodec.decode, raw)
        finally:
            jsoncodec._native_decode = native
        seen[n] = (mine, theirs)
        if theirs[0] == "refused" and n > 8 and all(seen[k][1][0] == "refused" for k in range(n - 8, n + 1)):
            break
    limit = min(n for n, (_, theirs) in seen.items() if theirs[1] is RecursionError)
    assert limit > 100
    for n in range(limit - 3, limit + 8):
        assert_same_outcome(*seen[n])


def test_decode_of_anything_but_bytes_is_json_loads() -> None:
    for arg in ('{"a": 1}', bytearray(b"[1]"), memoryview(b"[1]"), None, 5):
        assert_same_outcome(outcome(jsoncodec.decode, arg), outcome(json.loads, arg))


def test_decode_value_keeps_a_tombstone_as_none() -> None:
    assert jsoncodec.decode_value(None) is None
    with pytest.raises(TypeError):
        jsoncodec.decode(None)  # type: ignore[arg-type] - json.loads(None) refuses it too


def test_a_plain_record_is_decoded_natively_without_the_stdlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed is the point: an ordinary record must not reach json.loads."""
    def refuse(raw: Any) -> Any:
        raise AssertionError(f"json.loads called for {raw!r}")

    monkeypatch.setattr(jsoncodec, "_loads", refuse)
    raw = b'{"id":7,"user":"user_00007","amount":554.33,"tags":["a","\xc3\xa9"],"big":123456789012345678901234567890}'
    assert same(jsoncodec.decode(raw), json.loads(raw.decode()))
    assert same(jsoncodec.decode_value(raw), json.loads(raw.decode()))
    with pytest.raises(AssertionError, match="json.loads called"):
        jsoncodec.decode(b"[NaN]")  # what msgspec refuses does go to the stdlib


# ---------------------------------------------------------------------------------------- checking, not decoding
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_raw_document, _corrupted(), _nested(), st.binary(max_size=40)))
@example(b'{"n":' + b"1" * 4301 + b"}")  # an integer json.loads refuses, inside an object
@example(b'[' + b"1" * 9000 + b"]")
@example(b'{"s":"\xc0\x80"}')  # invalid UTF-8 inside a string: a parse that builds nothing may not look
@example(b'["\xf4\x90\x80\x80"]')
@example(b'{"s":"\xed\xa0\x80"}')  # a lone surrogate's bytes: json.loads takes them, decode must decide
@example(b'{"a":1} x')
@example(b"[" * 900 + b"]" * 900)
def test_is_json_container_vouches_only_for_what_decode_gives_as_an_object_or_array(raw: bytes) -> None:
    """A value the source leaves undecoded is one ``json.loads`` takes, as a dict or a list, and decodes
    to the same value later: whatever the check lets through, the decoder would have let through."""
    if jsoncodec.is_json_container(raw):
        theirs = json.loads(raw)
        assert theirs.__class__ in (dict, list)
        assert same(jsoncodec.decode(raw), theirs)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_raw_document, _nested()))
def test_is_json_container_vouches_for_every_object_or_array_msgspec_decodes(raw: bytes) -> None:
    """The speed is the point: an object or array the native decoder takes is not decoded to be checked."""
    if raw[:1] not in (b"{", b"["):
        return
    try:
        jsoncodec._native_decode(raw)
    except (ValueError, RecursionError):
        return
    if raw.count(b"[") + raw.count(b"{") < sys.getrecursionlimit() - jsoncodec.CALLER_FRAMES:
        assert jsoncodec.is_json_container(raw)


@st.composite
def _envelope(draw: st.DrawFn) -> bytes:
    """Kafka Connect's ``{"schema", "payload"}`` envelope around any document, keys in any order, some
    missing, doubled or joined by others, with whitespace; sometimes corrupted."""
    parts = draw(st.lists(st.sampled_from(["schema", "payload", "extra"]), min_size=0, max_size=4))
    body = ",".join(f'{draw(_ws)}"{k}"{draw(_ws)}:{draw(_ws)}{draw(_document)}' for k in parts)
    raw = ("{" + body + "}").encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        return raw
    at = draw(st.integers(0, len(raw)))
    return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_envelope(), _raw_document))
@example(b'{"schema":{"type":"string"},"payload":"x","payload":{"id":1}}')  # the last payload, as json.loads
@example(b'{"schema":null,"payload":null}')  # a null payload: decoded whole (a value without bytes)
@example(b'{"schema":{"doc":"\xff"},"payload":{}}')  # invalid UTF-8 in the schema
@example(b'{"schema":' + b"1" * 4301 + b',"payload":{}}')  # an integer json.loads refuses, in the schema
@example(b'{"schema":{},"payload":[NaN]}')
@example(b'[{"schema":{},"payload":{}}]')
def test_envelope_payload_cuts_out_only_what_json_loads_reads_as_the_payload(raw: bytes) -> None:
    """The source hands a payload's bytes on as the record's own: they must decode to exactly what
    ``json.loads`` of the whole envelope holds as its payload, and the envelope must be one it accepts."""
    payload = jsoncodec.envelope_payload(raw)
    if payload is None:
        return
    doc = json.loads(raw)
    assert doc.__class__ is dict and "schema" in doc and doc["payload"] is not None
    assert same(json.loads(payload), doc["payload"])


def test_envelope_payload_is_cut_natively_from_a_plain_envelope() -> None:
    raw = b'{"schema":{"type":"struct","fields":[{"type":"int64","field":"id"}]},"payload": {"id":7,"n":"\xc3\xa9"} }'
    assert jsoncodec.envelope_payload(raw) == b'{"id":7,"n":"\xc3\xa9"}'  # the bytes as sent: no decoding
    for not_one in (b'{"payload":{"id":1}}', b'{"schema":{}}', b'{"schema":{},"payload":{}', b'[]', b' {}'):
        assert jsoncodec.envelope_payload(not_one) is None, not_one


def _cut_and_decode(cutter: jsoncodec.EnvelopeCutter, raw: bytes) -> Any:
    """The source's use of a cutter: the slice decoded, and the whole envelope decoded where the cutter
    gives nothing or its unchecked slice is refused (the exception of the decoder that decided)."""
    payload, checked = cutter(raw)
    if payload is not None:
        try:
            return jsoncodec.decode(payload)
        except (ValueError, RecursionError):
            if checked:
                raise
    doc = json.loads(raw)
    if doc.__class__ is not dict or "schema" not in doc or "payload" not in doc:
        raise ValueError("not an envelope")
    return doc["payload"]


_slot = st.one_of(_document.map(lambda d: json.dumps(d)), st.sampled_from([
    '{"a":1},"payload":{"b":2}', '1,"x":2', '{"a":1}}', "", "null", "NaN", '"\\ud800"', '{"a":1} ', "[1,2]]"]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_document, _document, st.lists(_slot, min_size=1, max_size=5))
def test_envelope_cutter_slices_only_what_json_loads_reads_as_the_payload(schema: Any, first: Any, slots: list[str]) -> None:
    """After one envelope taught it a schema's bytes, the cutter slices the payload of any envelope with
    those bytes; whatever the slot holds, the source's answer is ``json.loads``' (value or refusal)."""
    cutter = jsoncodec.EnvelopeCutter()
    prefix = '{"schema":' + json.dumps(schema, separators=(",", ":")) + ',"payload":'
    learnt = (prefix + json.dumps(first, separators=(",", ":")) + "}").encode("utf-8", "surrogatepass")
    for raw in [learnt, *((prefix + slot + "}").encode("utf-8", "surrogatepass") for slot in slots)]:
        try:
            theirs = json.loads(raw)
        except (ValueError, RecursionError):
            with pytest.raises((ValueError, RecursionError)):
                _cut_and_decode(cutter, raw)
            continue
        assert same(_cut_and_decode(cutter, raw), theirs["payload"])


def test_envelope_cutter_slices_after_learning_a_schema_and_leaves_the_rest_to_a_full_check() -> None:
    cutter = jsoncodec.EnvelopeCutter()
    env = b'{"schema":{"type":"struct"},"payload":%s}'
    assert cutter(env % b'{"id":1}') == (b'{"id":1}', True)  # checked whole, its schema's bytes learnt
    assert cutter(env % b'{"id":2}') == (b'{"id":2}', False)  # sliced: the decoder checks it
    assert cutter(env % b'{"a":1},"payload":{"b":2}') == (b'{"a":1},"payload":{"b":2}', False)  # refused, then whole
    assert cutter(env % b"null") == (None, True)
    assert cutter(b'{"schema":{"type":"string"},"payload":"x"}') == (b'"x"', True)  # another schema: checked, learnt


def test_is_json_container_says_no_to_scalars_tombstone_shapes_and_broken_documents() -> None:
    for raw in (b'"x"', b"1", b"null", b" {}", b"\xef\xbb\xbf{}", b"{", b"[1,]", b"{} {}", b"[NaN]"):
        assert not jsoncodec.is_json_container(raw), raw
    assert jsoncodec.is_json_container(b'{"id":7,"tags":["a","\xc3\xa9"],"big":123456789012345678901234567890}')


# ---------------------------------------------------------------------------------------- encode
_keys = st.one_of(st.sampled_from(["a", "id"]), _text)
_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**100), max_value=2**100),
              st.floats(allow_nan=True, allow_infinity=True), _text),
    lambda children: st.one_of(st.lists(children, max_size=5), st.lists(children, max_size=3).map(tuple),
                               st.dictionaries(_keys, children, max_size=5)),
    max_leaves=25,
)


def stdlib_encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_value)
@example({"a": [1e16, 1e-5, 1e-4, 9999999999999998.0, 0.1, -0.0, float("nan"), float("-inf")]})
@example({"é": "\u2028\x7f\x00\ud800", "id": 2**70})
def test_encode_writes_the_bytes_of_json_dumps_and_decodes_back_to_the_value(value: Any) -> None:
    out = jsoncodec.encode(value)
    assert out == stdlib_encode(value)
    back = json.loads(json.dumps(value))  # tuples come back as lists
    assert same(jsoncodec.decode(out), back)


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("value", [
    b"bytes", {1, 2}, {1: "int key"}, {None: 1, True: 2, 1.5: 3}, {(1, 2): "tuple key"}, Colour.RED, [Colour.RED],
    "\ud800", 10**5000, [[[[[]]]]] * 2, "x" * 10_000, {"a": float("inf")},
], ids=["bytes", "set", "int-key", "scalar-keys", "tuple-key", "intenum", "intenum-in-list", "lone-surrogate",
        "int-over-digit-limit", "shared-list", "long-string", "infinity"])
def test_encode_refuses_or_converts_exactly_as_json_dumps(value: Any) -> None:
    assert outcome(jsoncodec.encode, value) == outcome(stdlib_encode, value)


def test_encode_refuses_cycles_and_deep_nesting_as_json_dumps() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert outcome(jsoncodec.encode, cyclic) == outcome(stdlib_encode, cyclic)
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    mine, theirs = outcome(jsoncodec.encode, deep), outcome(stdlib_encode, deep)
    assert mine[:2] == theirs[:2] == ("refused", RecursionError)


def test_a_plain_value_is_encoded_natively_without_the_stdlib(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(value: Any) -> Any:
        raise AssertionError(f"json encoder called for {value!r}")

    monkeypatch.setattr(jsoncodec, "_dumps", refuse)
    value = {"id": 7, "amount": 554.33, "ok": True, "none": None, "tags": ["a", "b"], "big": 2**70}
    assert jsoncodec.encode(value) == stdlib_encode(value)
