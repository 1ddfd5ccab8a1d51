"""Single Message Transforms and predicates (eosink.worker.transforms): Connect's keys and semantics.

Pure unit tests: records are built in memory, no server is involved.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eosink.connectors.api.errors import ConfigError, RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.api.schemas import WriterSchema
from eosink.worker.transforms import (
    PREDICATES,
    TRANSFORMS,
    TransformChain,
    TransformError,
    build_chain,
    chain_config_def,
    definitions,
    validate_chain,
)
from eosink.worker.transforms.base import RECORD_FIELDS, with_headers, with_key, with_topic, with_value
from eosink.worker.transforms.dateformat import compile_format

PKG = "org.apache.kafka.connect.transforms."
#: The machine is shared: slow draws are the machine's, not the strategy's.
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rec(value: Any = None, *, key: Any = None, topic: str = "orders", partition: int = 2, offset: int = 7,
        headers: tuple = (), ts: int = 1_700_000_000_123) -> SinkRecord:
    raw = json.dumps(value).encode() if isinstance(value, dict) else None
    return SinkRecord(topic, partition, offset, key, value, raw, headers, ts)


def one(type_: str, **keys: Any) -> TransformChain:
    """A chain of one transform aliased ``t``; keyword ``a_b`` means the key ``a.b``."""
    cfg = {"transforms": "t", "transforms.t.type": type_}
    cfg.update({f"transforms.t.{k.replace('_', '.')}": v for k, v in keys.items()})
    return build_chain(cfg)


def value_of(chain: TransformChain, r: SinkRecord) -> Any:
    out = chain.apply(r)
    assert out is not None
    return out.value


# -- record rebuilding ----------------------------------------------------------------------------------------------
def test_record_helpers_would_drop_a_new_sinkrecord_field():
    assert tuple(f.name for f in dataclasses.fields(SinkRecord)) == RECORD_FIELDS
    r = rec({"a": 1}, key=b"k", headers=(("h", b"1"),))
    r.value_schema = WriterSchema(3, "avro", '{"type": "record", "name": "R", "fields": []}')
    # A new value may no longer match the writer's schema: a sink types it from the value.
    assert with_value(r, 5) == dataclasses.replace(r, value=5, raw_value=None, value_schema=None)
    assert with_key(r, {"k": 1}) == dataclasses.replace(r, key={"k": 1})
    assert with_headers(r, ()) == dataclasses.replace(r, headers=())
    assert with_topic(r, "x") == dataclasses.replace(r, topic="x")


def test_transform_leaves_its_input_record_unchanged():
    r = rec({"a": 1, "b": {"c": 2}})
    snapshot = dataclasses.replace(r, value=json.loads(json.dumps(r.value)))
    for c in (one("InsertField", static_field="s", static_value="v"), one("ReplaceField", exclude="a"),
              one("MaskField", fields="a"), one("Flatten"), one("Cast", spec="a:string")):
        c.apply(r)
    assert r == snapshot


# -- names ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["InsertField$Value", "InsertField", PKG + "InsertField$Value"])
def test_value_side_names_all_build_the_value_transform(name):
    assert value_of(one(name, static_field="s", static_value="v"), rec({"a": 1})) == {"a": 1, "s": "v"}


def test_every_transform_and_predicate_is_reachable_by_connect_class_name():
    for d in definitions():
        assert d.class_names, d.name
        for n in d.class_names:
            assert n.startswith(PKG)
            assert (TRANSFORMS if d.kind == "transform" else PREDICATES)[n]
    assert len([d for d in definitions() if d.kind == "transform"]) == 15
    assert {d.name for d in definitions() if d.kind == "predicate"} == {"TopicNameMatches", "HasHeaderKey",
                                                                          "RecordIsTombstone"}


# -- InsertField ------------------------------------------------------------------------------------------------------
def test_insertfield_adds_metadata_and_static_and_replaces_raw_value():
    c = one("InsertField$Value", topic_field="t!", partition_field="p?", offset_field="o", timestamp_field="ts",
            static_field="src", static_value="eosink")
    out = c.apply(rec({"a": 1}))
    assert out is not None and out.raw_value is not None and json.loads(out.raw_value) == out.value  # never stale
    assert out.value == {"a": 1, "t": "orders", "p": 2, "o": 7, "ts": 1_700_000_000_123, "src": "eosink"}


def test_insertfield_passes_tombstone_untouched():
    r = rec(None)
    assert one("InsertField$Value", static_field="s", static_value="v").apply(r) is r


def test_insertfield_on_string_value_is_a_record_error_naming_record_and_alias():
    with pytest.raises(RecordError) as e:
        one("InsertField$Value", static_field="s", static_value="v").apply(rec("plain"))
    assert isinstance(e.value, TransformError)
    assert e.value.stage == "TRANSFORMATION"
    assert (e.value.topic, e.value.partition, e.value.offset) == ("orders", 2, 7)
    assert "transform 't' (InsertField$Value)" in str(e.value) and "found string" in str(e.value)


def test_insertfield_key_on_raw_bytes_key_fails():
    with pytest.raises(TransformError, match="key to be a JSON object"):
        one("InsertField$Key", static_field="s", static_value="v").apply(rec({"a": 1}, key=b"k"))


# -- ReplaceField ----------------------------------------------------------------------------------------------------
def test_replacefield_exclude_wins_over_include_and_renames_apply():
    c = one("ReplaceField$Value", include="a,b,c", exclude="b", renames="a:alpha,c:gamma")
    assert value_of(c, rec({"a": 1, "b": 2, "c": 3, "d": 4})) == {"alpha": 1, "gamma": 3}


def test_replacefield_accepts_blacklist_and_whitelist():
    assert value_of(one("ReplaceField", blacklist="b"), rec({"a": 1, "b": 2})) == {"a": 1}
    assert value_of(one("ReplaceField", whitelist="b"), rec({"a": 1, "b": 2})) == {"b": 2}


def test_replacefield_bad_rename_is_config_error_naming_full_key():
    with pytest.raises(ConfigError, match="transforms.t.renames"):
        one("ReplaceField", renames="a-b")


def test_replacefield_passes_tombstone_and_fails_on_array():
    assert one("ReplaceField", exclude="a").apply(rec(None)).value is None  # type: ignore[union-attr]
    with pytest.raises(TransformError, match="found array"):
        one("ReplaceField", exclude="a").apply(rec([1, 2]))


_json_keys = st.text(st.characters(min_codepoint=97, max_codepoint=102), min_size=1, max_size=3)
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)


@relaxed
@given(st.dictionaries(_json_keys, _scalars), st.sets(_json_keys))
def test_replacefield_exclude_then_include_of_the_rest_round_trips(value, drop):
    kept = value_of(one("ReplaceField", exclude=",".join(sorted(drop)) or None), rec(value))
    assert kept == {k: v for k, v in value.items() if k not in drop}
    if value:
        assert value_of(one("ReplaceField", include=",".join(value)), rec(value)) == value


@relaxed
@given(st.dictionaries(_json_keys, _scalars, min_size=1))
def test_replacefield_rename_and_back_is_identity(value):
    fwd = ",".join(f"{k}:X{k}" for k in value)
    back = ",".join(f"X{k}:{k}" for k in value)
    assert value_of(one("ReplaceField", renames=back), rec(value_of(one("ReplaceField", renames=fwd), rec(value)))) \
        == value


# -- MaskField -------------------------------------------------------------------------------------------------------
def test_maskfield_masks_by_type_and_keeps_nulls():
    c = one("MaskField$Value", fields="i,f,b,s,l,m,n")
    v = {"i": 5, "f": 1.5, "b": True, "s": "x", "l": [1], "m": {"a": 1}, "n": None, "keep": 9}
    assert value_of(c, rec(v)) == {"i": 0, "f": 0.0, "b": False, "s": "", "l": [], "m": {}, "n": None, "keep": 9}


def test_maskfield_replacement_is_converted_to_the_field_type():
    c = one("MaskField", fields="i,f,s", replacement="42")
    out = value_of(c, rec({"i": 5, "f": 1.5, "s": "x"}))
    assert out == {"i": 42, "f": 42.0, "s": "42"} and type(out["i"]) is int and type(out["f"]) is float


def test_maskfield_replacement_not_a_number_for_int_field_names_the_field():
    with pytest.raises(TransformError) as e:
        one("MaskField", fields="i", replacement="***").apply(rec({"i": 5}))
    assert e.value.column == "i"


def test_maskfield_boolean_with_replacement_fails():
    with pytest.raises(TransformError, match="custom replacement"):
        one("MaskField", fields="b", replacement="x").apply(rec({"b": True}))


def test_maskfield_without_fields_is_config_error():
    with pytest.raises(ConfigError, match="transforms.t.fields"):
        one("MaskField")


# -- Cast ------------------------------------------------------------------------------------------------------------
def test_cast_fields_with_java_semantics():
    c = one("Cast$Value", spec="a:int8,b:int32,c:float32,d:boolean,e:string,f:string,g:int64,h:float64,i:string")
    out = value_of(c, rec({"a": 300, "b": -7.9, "c": 0.1, "d": "TRUE", "e": True, "f": 2.5, "g": "12", "h": "1e3",
                           "i": None}))
    assert out == {"a": 44, "b": -7, "c": pytest.approx(0.1, rel=1e-7), "d": True, "e": "true", "f": "2.5", "g": 12,
                   "h": 1000.0, "i": None}
    assert out["c"] != 0.1  # rounded to single precision


def test_cast_whole_value_and_tombstone():
    assert value_of(one("Cast$Value", spec="int16"), rec("123")) == 123
    r = rec(None)
    assert one("Cast$Value", spec="int16").apply(r) is r


def test_cast_string_out_of_range_is_record_error_with_field():
    with pytest.raises(TransformError) as e:
        one("Cast", spec="a:int8").apply(rec({"a": "300"}))
    assert e.value.column == "a" and "not a valid int8" in str(e.value)


def test_cast_map_field_is_record_error():
    with pytest.raises(TransformError, match="cannot cast a value of type object"):
        one("Cast", spec="a:string").apply(rec({"a": {"b": 1}}))


@pytest.mark.parametrize("spec, msg", [("a:int128", "cannot cast to 'int128'"), ("int8,a:int16", "only cast"),
                                       ("a:b:c", "invalid cast")])
def test_cast_bad_spec_is_config_error(spec, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        one("Cast", spec=spec)
    assert e.value.key == "transforms.t.spec"


@relaxed
@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_cast_int8_wraps_like_java_byte(n):
    out = value_of(one("Cast", spec="int8"), rec(n))
    assert -128 <= out <= 127 and (out - n) % 256 == 0


# -- TimestampConverter ----------------------------------------------------------------------------------------------
ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def test_timestampconverter_string_to_unix_and_back():
    to_unix = one("TimestampConverter$Value", field="at", target_type="unix", format=ISO)
    assert value_of(to_unix, rec({"at": "2023-11-14T22:13:20.123Z"})) == {"at": 1_700_000_000_123}
    to_str = one("TimestampConverter$Value", field="at", target_type="string", format=ISO)
    assert value_of(to_str, rec({"at": 1_700_000_000_123})) == {"at": "2023-11-14T22:13:20.123Z"}


def test_timestampconverter_unix_precision_and_logical_types():
    moment = dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    c = one("TimestampConverter", target_type="unix", unix_precision="seconds")
    assert value_of(c, rec(moment)) == 1_700_000_000
    assert value_of(c, rec(1_700_000_000)) == 1_700_000_000  # the precision reads and writes
    ts = value_of(one("TimestampConverter", target_type="Timestamp", unix_precision="microseconds"),
                  rec(1_700_000_000_123_456))
    assert ts == moment
    assert value_of(one("TimestampConverter", target_type="Date"), rec(1_700_000_000_123)) == dt.date(2023, 11, 14)
    assert value_of(one("TimestampConverter", target_type="Time"), rec(1_700_000_000_123)) == dt.time(22, 13, 20, 123000)
    assert value_of(one("TimestampConverter", target_type="unix"), rec(dt.date(1970, 1, 2))) == 86_400_000


def test_timestampconverter_passes_tombstone_and_null_field():
    r = rec(None)
    assert one("TimestampConverter", target_type="unix").apply(r) is r
    assert value_of(one("TimestampConverter", field="at", target_type="unix"), rec({"at": None})) == {"at": None}


def test_timestampconverter_unparsable_string_names_field():
    with pytest.raises(TransformError) as e:
        one("TimestampConverter", field="at", target_type="unix", format="yyyy-MM-dd").apply(rec({"at": "14/11/2023"}))
    assert e.value.column == "at"


def test_timestampconverter_string_target_without_format_is_config_error():
    with pytest.raises(ConfigError, match="transforms.t.format"):
        one("TimestampConverter", target_type="string")


def test_timestampconverter_unsupported_pattern_letter_is_named():
    with pytest.raises(ConfigError, match="'EEE'.*not supported") as e:
        one("TimestampConverter", target_type="string", format="EEE, dd MMM yyyy")
    assert e.value.key == "transforms.t.format"


def test_timestampconverter_bad_target_type_is_config_error():
    with pytest.raises(ConfigError, match="transforms.t.target.type"):
        one("TimestampConverter", target_type="epoch")


@relaxed
@given(st.integers(min_value=-62_135_596_800_000 + 86_400_000, max_value=253_402_300_799_999))
def test_dateformat_round_trips_every_millisecond(ms):
    f = compile_format("yyyy-MM-dd HH:mm:ss.SSS", key="format")
    assert f.parse(f.format(ms)) == ms


# -- ValueToKey, ExtractField, HoistField, Flatten -----------------------------------------------------------------
def test_valuetokey_builds_map_key_with_nulls_for_absent_fields():
    out = one("ValueToKey", fields="id,missing").apply(rec({"id": 3, "x": 1}, key=b"old"))
    assert out is not None and out.key == {"id": 3, "missing": None} and out.value == {"id": 3, "x": 1}
    assert out.raw_value is not None  # value untouched: the sink may still write the topic's bytes


def test_valuetokey_on_tombstone_fails():
    with pytest.raises(TransformError, match="found null"):
        one("ValueToKey", fields="id").apply(rec(None))


def test_extractfield_value_and_key_after_valuetokey():
    assert value_of(one("ExtractField$Value", field="a"), rec({"a": {"b": 1}})) == {"b": 1}
    assert value_of(one("ExtractField$Value", field="z"), rec({"a": 1})) is None
    cfg = {"transforms": "k,x", "transforms.k.type": "ValueToKey", "transforms.k.fields": "id",
           "transforms.x.type": PKG + "ExtractField$Key", "transforms.x.field": "id"}
    assert build_chain(cfg).apply(rec({"id": 9})).key == 9  # type: ignore[union-attr]


def test_extractfield_passes_tombstone():
    r = rec(None)
    assert one("ExtractField$Value", field="a").apply(r) is r


def test_hoistfield_wraps_value_and_key():
    assert value_of(one("HoistField$Value", field="line"), rec("text")) == {"line": "text"}
    assert one("HoistField$Key", field="k").apply(rec(1, key=b"x")).key == {"k": b"x"}  # type: ignore[union-attr]


def test_flatten_joins_nested_names_and_keeps_arrays():
    v = {"a": {"b": {"c": 1}, "d": [1, {"e": 2}]}, "f": None}
    assert value_of(one("Flatten$Value", delimiter="_"), rec(v)) == {"a_b_c": 1, "a_d": [1, {"e": 2}], "f": None}


def test_flatten_passes_tombstone_and_fails_on_string():
    assert one("Flatten").apply(rec(None)).value is None  # type: ignore[union-attr]
    with pytest.raises(TransformError):
        one("Flatten").apply(rec("x"))


_nested = st.recursive(_scalars, lambda inner: st.dictionaries(_json_keys, inner, min_size=1), max_leaves=12)


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, x in flat.items():
        *parents, leaf = name.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = x
    return out


@settings(relaxed, max_examples=200)
@given(st.dictionaries(_json_keys, _nested))
def test_flatten_then_unflatten_round_trips(value):
    flat = value_of(one("Flatten", delimiter="/"), rec(value))
    assert all(type(x) is not dict for x in flat.values())
    assert _unflatten(flat) == value


# -- routing -----------------------------------------------------------------------------------------------------------
def test_regexrouter_rewrites_matching_topics_with_java_groups():
    c = one("RegexRouter", regex="(?<env>\\w+)-orders-(.*)", replacement="${env}_$2\\$")
    assert c.apply(rec({"a": 1}, topic="prod-orders-eu")).topic == "prod_eu$"  # type: ignore[union-attr]
    r = rec({"a": 1}, topic="prod-orders")
    assert c.apply(r) is r


def test_regexrouter_needs_a_full_match():
    r = rec({"a": 1}, topic="xorders")
    assert one("RegexRouter", regex="orders", replacement="o").apply(r) is r


@pytest.mark.parametrize("regex, replacement, key", [("(a", "x", "regex"), ("(a)", "$2", "replacement"),
                                                     ("a", "${n}", "replacement")])
def test_regexrouter_bad_config_names_key(regex, replacement, key):
    with pytest.raises(ConfigError) as e:
        one("RegexRouter", regex=regex, replacement=replacement)
    assert e.value.key == f"transforms.t.{key}"


def test_timestamprouter_formats_topic_from_record_timestamp():
    c = one("TimestampRouter", topic_format="${topic}_${timestamp}", timestamp_format="yyyy.MM.dd")
    assert c.apply(rec({"a": 1})).topic == "orders_2023.11.14"  # type: ignore[union-attr]
    assert one("TimestampRouter").apply(rec({"a": 1})).topic == "orders-20231114"  # type: ignore[union-attr]


def test_filter_without_predicate_drops_everything():
    assert one("Filter").apply(rec({"a": 1})) is None


# -- headers ----------------------------------------------------------------------------------------------------------
def test_dropheaders_removes_every_header_of_the_names():
    out = one("DropHeaders", headers="a,b").apply(rec(1, headers=(("a", b"1"), ("c", b"2"), ("a", b"3"), ("b", b""))))
    assert out.headers == (("c", b"2"),)  # type: ignore[union-attr]


def test_insertheader_appends_literal():
    out = one("InsertHeader", header="src", value_literal="eosink").apply(rec(1, headers=(("a", b"1"),)))
    assert out.headers == (("a", b"1"), ("src", b"eosink"))  # type: ignore[union-attr]


def test_headerfrom_move_and_copy():
    v = {"id": 5, "who": "ann", "ok": True, "x": 1}
    moved = one("HeaderFrom$Value", fields="id,who,ok", headers="h_id,h_who,h_ok", operation="move").apply(rec(v))
    assert moved.value == {"x": 1} and moved.raw_value is None  # type: ignore[union-attr]
    assert moved.headers == (("h_id", b"5"), ("h_who", b"ann"), ("h_ok", b"true"))  # type: ignore[union-attr]
    copied = one("HeaderFrom", fields="id", headers="h", operation="copy").apply(rec(v))
    assert copied.value == v and copied.headers == (("h", b"5"),)  # type: ignore[union-attr]


def test_headerfrom_mismatched_lists_is_config_error():
    with pytest.raises(ConfigError, match="transforms.t.headers"):
        one("HeaderFrom", fields="a,b", headers="h", operation="copy")


def test_headerfrom_bad_operation_is_config_error():
    with pytest.raises(ConfigError, match="transforms.t.operation"):
        one("HeaderFrom", fields="a", headers="h", operation="cut")


# -- predicates and negate --------------------------------------------------------------------------------------------
def _gated(pred_type: str, negate: bool, **pred_keys: str) -> TransformChain:
    cfg = {"transforms": "drop", "transforms.drop.type": "Filter", "transforms.drop.predicate": "p",
           "transforms.drop.negate": str(negate).lower(), "predicates": "p", "predicates.p.type": pred_type}
    cfg.update({f"predicates.p.{k}": v for k, v in pred_keys.items()})
    return build_chain(cfg)


def test_topicnamematches_gates_the_filter_and_negate_inverts_it():
    c = _gated("TopicNameMatches", False, pattern="audit-.*")
    assert c.apply(rec(1, topic="audit-x")) is None
    assert c.apply(rec(1, topic="orders")) is not None
    n = _gated(PKG + "predicates.TopicNameMatches", True, pattern="audit-.*")
    assert n.apply(rec(1, topic="audit-x")) is not None
    assert n.apply(rec(1, topic="orders")) is None


def test_hasheaderkey_predicate():
    c = _gated("HasHeaderKey", False, name="skip")
    assert c.apply(rec(1, headers=(("skip", b""),))) is None
    assert c.apply(rec(1, headers=(("other", b""),))) is not None


def test_recordistombstone_predicate_guards_a_field_transform():
    cfg = {"transforms": "ins", "transforms.ins.type": "InsertField$Value", "transforms.ins.static.field": "s",
           "transforms.ins.static.value": "v", "transforms.ins.predicate": "tomb", "transforms.ins.negate": "true",
           "predicates": "tomb", "predicates.tomb.type": "RecordIsTombstone"}
    c = build_chain(cfg)
    assert c.apply(rec(None)).value is None  # type: ignore[union-attr]
    assert value_of(c, rec({"a": 1})) == {"a": 1, "s": "v"}
    assert _gated("RecordIsTombstone", False).apply(rec(None)) is None


# -- the chain ------------------------------------------------------------------------------------------------------
def test_chain_applies_in_order_and_stops_at_a_drop():
    cfg = {"transforms": "hoist,route,drop", "transforms.hoist.type": "HoistField$Value", "transforms.hoist.field": "v",
           "transforms.route.type": "RegexRouter", "transforms.route.regex": "orders",
           "transforms.route.replacement": "dropme", "transforms.drop.type": "Filter",
           "transforms.drop.predicate": "p", "predicates": "p", "predicates.p.type": "TopicNameMatches",
           "predicates.p.pattern": "dropme"}
    c = build_chain(cfg)
    assert c.apply(rec(1, topic="orders")) is None
    out = c.apply(rec(1, topic="other"))
    assert out is not None and out.value == {"v": 1} and out.topic == "other"


def test_fused_value_stages_pass_a_tombstone_as_the_same_record():
    cfg = {"transforms": "a,b", "transforms.a.type": "InsertField$Value", "transforms.a.static.field": "s",
           "transforms.a.static.value": "v", "transforms.b.type": "ReplaceField$Value", "transforms.b.exclude": "x"}
    c = build_chain(cfg)
    r = rec(None)
    assert c.apply(r) is r
    assert value_of(c, rec({"x": 1, "y": 2})) == {"y": 2, "s": "v"}


TAG_AND_SLIM = {"transforms": "a,b", "transforms.a.type": "InsertField$Value", "transforms.a.static.field": "s",
                "transforms.a.static.value": "v", "transforms.b.type": "ReplaceField$Value", "transforms.b.exclude": "x"}


def test_a_run_of_value_transforms_writes_the_new_values_json_as_raw_value_and_leaves_its_input_alone():
    original = {"x": 1, "y": [1.5, 1e16, None], "z": "é", "big": 2**70}
    r = rec(dict(original))
    out = build_chain(TAG_AND_SLIM).apply(r)
    assert out is not None and out is not r and r.value == original and r.raw_value == json.dumps(original).encode()
    assert out.value == {"y": [1.5, 1e16, None], "z": "é", "big": 2**70, "s": "v"}
    assert out.raw_value is not None and json.loads(out.raw_value) == out.value


@pytest.mark.parametrize("value, raw", [
    ({"x": 1, "y": float("nan")}, b'{"x":1,"y":NaN}'),  # msgspec would write null: the sink encodes exactly
    ({"x": 1, "y": [float("-inf")]}, b'{"x":1,"y":[-Infinity]}'),
    ({"x": 1, "y": "\ud800"}, b'{"x":1,"y":"\\ud800"}'),  # a lone surrogate: no UTF-8 for it
    ({"x": 1}, None),  # no bytes of its own: not known to be JSON-typed (value.converter=string, bytes)
])
def test_raw_value_stays_none_where_the_native_json_would_not_read_back_as_the_value(value, raw):
    out = build_chain(TAG_AND_SLIM).apply(SinkRecord("orders", 0, 1, None, value, raw))
    assert out is not None and out.raw_value is None and "x" not in out.value and out.value["s"] == "v"


def test_raw_value_stays_none_after_a_transform_that_may_leave_other_types_than_json_decodes():
    cfg = {"transforms": "a,ts", "transforms.a.type": "InsertField$Value", "transforms.a.static.field": "s",
           "transforms.a.static.value": "v", "transforms.ts.type": "TimestampConverter$Value",
           "transforms.ts.field": "t", "transforms.ts.target.type": "Timestamp"}
    out = build_chain(cfg).apply(rec({"t": 1_700_000_000_000}))
    assert out is not None and isinstance(out.value["t"], dt.datetime) and out.raw_value is None


@pytest.mark.parametrize("cfg, value", [
    (TAG_AND_SLIM, {"x": 1, "y": {"n": 2}}),
    ({"transforms": "h,b", "transforms.h.type": "HoistField$Value", "transforms.h.field": "w",
      "transforms.b.type": "ReplaceField$Value", "transforms.b.exclude": "x"}, {"x": 1, "y": 2}),
    ({"transforms": "e,a", "transforms.e.type": "ExtractField$Value", "transforms.e.field": "inner",
      "transforms.a.type": "InsertField$Value", "transforms.a.static.field": "s", "transforms.a.static.value": "v"},
     {"inner": {"x": 1}, "y": 2}),
    ({"transforms": "a,r,b", "transforms.a.type": "InsertField$Value", "transforms.a.static.field": "s",
      "transforms.a.static.value": "v", "transforms.r.type": "RegexRouter", "transforms.r.regex": "orders",
      "transforms.r.replacement": "o2", "transforms.b.type": "ReplaceField$Value", "transforms.b.exclude": "x"},
     {"x": 1, "y": 2}),
])
def test_apply_owned_gives_what_apply_gives_and_apply_never_edits_what_it_was_given(cfg, value):
    chain = build_chain(cfg)
    given = rec(json.loads(json.dumps(value)))
    expected = chain.apply(given)
    assert given.value == value and given.raw_value == json.dumps(value).encode()  # apply edited nothing
    owned = rec(json.loads(json.dumps(value)))
    out = chain.runner(owned=True)(owned)
    assert chain.runner() == chain._apply  # noqa: SLF001 - the engine's loop calls what apply calls
    assert out is not None and expected is not None
    assert (out.topic, out.value, out.raw_value) == (expected.topic, expected.value, expected.raw_value)


def test_apply_owned_of_a_chain_ending_in_value_transforms_updates_the_record_itself():
    r = rec({"x": 1, "y": 2})
    out = build_chain(TAG_AND_SLIM).apply_owned(r)
    assert out is r and r.value == {"y": 2, "s": "v"} and json.loads(r.raw_value) == r.value  # type: ignore[arg-type]


def test_empty_chain_is_falsy_and_returns_the_record():
    c = build_chain({"topics": "x"})
    r = rec({"a": 1})
    assert not c and len(c) == 0 and c.apply(r) is r


def test_failure_in_second_stage_names_that_stage_and_the_original_coordinates():
    cfg = {"transforms": "ok,bad", "transforms.ok.type": "HoistField$Value", "transforms.ok.field": "v",
           "transforms.bad.type": "Cast$Value", "transforms.bad.spec": "v:int8"}
    with pytest.raises(TransformError) as e:
        build_chain(cfg).apply(rec("x"))
    assert e.value.alias == "bad" and e.value.transform_type == "Cast$Value" and e.value.offset == 7
    assert e.value.component == "transforms.bad"


def test_failure_after_a_router_names_the_topic_the_record_was_read_from():
    cfg = {"transforms": "route,bad", "transforms.route.type": "RegexRouter", "transforms.route.regex": ".*",
           "transforms.route.replacement": "elsewhere", "transforms.bad.type": "ExtractField$Value",
           "transforms.bad.field": "a"}
    with pytest.raises(TransformError) as e:
        build_chain(cfg).apply(rec("x", topic="orders"))
    assert e.value.topic == "orders" and e.value.alias == "bad"


def test_unknown_key_is_refused_with_closest_key_hint():
    with pytest.raises(ConfigError) as e:
        build_chain({"transforms": "mask", "transforms.mask.type": "MaskField$Value", "transforms.mask.feilds": "a"})
    assert e.value.key == "transforms.mask.feilds"
    assert "did you mean `transforms.mask.fields`?" in str(e.value)


def test_unknown_key_without_close_match_lists_known_keys():
    with pytest.raises(ConfigError, match="known keys: .*transforms.t.field"):
        one("ExtractField", field="a", zzzzzz="1")


def test_unknown_predicate_key_is_refused():
    with pytest.raises(ConfigError, match="predicates.p.patern.*did you mean `predicates.p.pattern`"):
        _gated("TopicNameMatches", False, patern="x")


def test_missing_type_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as e:
        build_chain({"transforms": "a"})
    assert e.value.key == "transforms.a.type"


def test_unknown_type_is_refused_naming_key_and_value():
    with pytest.raises(ConfigError, match="'com.example.Nope'") as e:
        build_chain({"transforms": "a", "transforms.a.type": "com.example.Nope"})
    assert e.value.key == "transforms.a.type"


def test_undeclared_predicate_is_refused():
    with pytest.raises(ConfigError, match="'missing'") as e:
        build_chain({"transforms": "f", "transforms.f.type": "Filter", "transforms.f.predicate": "missing",
                     "predicates": "p", "predicates.p.type": "RecordIsTombstone"})
    assert e.value.key == "transforms.f.predicate"


def test_unknown_predicate_type_is_refused():
    with pytest.raises(ConfigError) as e:
        build_chain({"predicates": "p", "predicates.p.type": "IsTombstone"})
    assert e.value.key == "predicates.p.type"


def test_negate_without_predicate_is_refused():
    with pytest.raises(ConfigError) as e:
        one("Filter", negate="true")
    assert e.value.key == "transforms.t.negate"


def test_duplicate_alias_is_refused():
    with pytest.raises(ConfigError, match="more than once"):
        build_chain({"transforms": "a,a", "transforms.a.type": "Filter"})


def test_validate_reports_every_problem_with_its_key():
    cfg = {"transforms": "a,b,c", "transforms.a.type": "MaskField", "transforms.a.feilds": "x",
           "transforms.a.replacment": "y", "transforms.b.type": "Nope", "transforms.c.type": "Cast",
           "transforms.c.spec": "x:int8", "transforms.c.predicate": "q"}
    keys = {e.key for e in validate_chain(cfg)}
    assert keys == {"transforms.a.feilds", "transforms.a.replacment", "transforms.b.type", "transforms.c.predicate"}
    assert TransformChain.validate({"transforms": "c", "transforms.c.type": "Cast", "transforms.c.spec": "a:int8"}) == []


def test_chain_config_def_lists_full_keys_for_docs():
    cfg = {"transforms": "m", "transforms.m.type": "MaskField", "predicates": "p", "predicates.p.type": "HasHeaderKey"}
    keys = set(chain_config_def(cfg).keys)
    assert {"transforms.m.type", "transforms.m.predicate", "transforms.m.negate", "transforms.m.fields",
            "transforms.m.replacement", "predicates.p.type", "predicates.p.name"} <= keys
