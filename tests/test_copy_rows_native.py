"""The C row encoder (:mod:`eosink.connectors.postgres.copy_native`) writes exactly the bytes of the Python path.

For random tables (int8, bool, float8 and text columns, with or without the Kafka coordinates, an int4 or
int8 partition column) and random JSON objects - unicode and escapes, nulls, ints and floats at the edges,
numbers spelt every way JSON allows, keys in any order, missing, extra and repeated fields, other types,
damaged JSON - the encoder either refuses the value (the source then decodes it as without the encoder) or
gives, joined with the record's coordinates, the very bytes psycopg sends for the row the Python path
builds from the typed row (``copy.row_type``); it refuses every value that path refuses, and takes every
plain one. A sink fed encoded rows writes the tables the Python path writes, and refuses the same records
naming the same culprit, in insert and upsert modes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.copy import LibpqWriter

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.api.rows import RowRecord, row_of
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import copy_native
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres import stage as pgstage
from eosink.connectors.postgres.sink import PostgresSink
from tests.sinkkit import manifest_for, records
from tests.test_postgres_rows import in_slices
from tests.test_postgres_sink import MakeSink, make_sink  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(not copy_native.available(), reason="the C extension is not built (or EOSINK_PG_NATIVE=0)")

PG = psycopg.Connection[Any]
KINDS = {"int8": pgs.INT8, "bool": pgs.BOOL, "float8": pgs.FLOAT, "text": pgs.TEXT}
NAMES = ["id", "a", "é b", "x y", "c", "d", "e"]
INT_EDGES = [0, -1, 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**53 + 1, 10**30]
FLOAT_EDGES = [0.0, -0.0, 5e-324, 1.7976931348623157e308, 0.1, -2.5, 1e-7, 1e16, 123456789.125]
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
PLAIN_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


def number_forms(x: int | float) -> list[str]:
    """Ways JSON spells ``x`` (all decode to the same value of the same type)."""
    if isinstance(x, int):
        return [str(x)]
    r = repr(x)
    return [r, r.upper(), f"{x:.17e}", f"{x:.17E}".replace("E+", "E")] if math.isfinite(x) else [r]


@st.composite
def tables(draw: st.DrawFn) -> tuple[pgs.Table, tuple[str, ...], bool]:
    n = draw(st.integers(1, 5))
    names = draw(st.permutations(NAMES))[:n]
    types = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=n, max_size=n))
    cols = [pgs.Column(name, typ, KINDS[typ]) for name, typ in zip(names, types)]
    kafka = draw(st.booleans())
    if kafka:
        cols += [pgs.Column("__topic", "text", pgs.TEXT), pgs.Column("__partition", draw(st.sampled_from(["int4", "int8"])), pgs.INT),
                 pgs.Column("__offset", "int8", pgs.INT8)]
    return pgs.Table(None, "t", {c.name: c for c in cols}), tuple(names), kafka


def value_token(draw: st.DrawFn, typ: str, plain: bool) -> str:
    """A JSON token for a column of ``typ``: of its type (or null) when ``plain``, else anything."""
    if not plain and draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(['"1"', "1", "1.0", "true", "[]", "{}", '{"a":1}', "1e400", "-0", "01", "1.", "tru",
                                     '"\\ud800"', '"\\u0000"', '"a\\x"', '"\\uD83D\\uDE00"', "-", "2e", "NaN"]))
    if draw(st.integers(0, 7)) == 0:
        return "null"
    if typ == "bool":
        return draw(st.sampled_from(["true", "false"]))
    if typ == "text":
        s = draw(PLAIN_TEXT if plain else TEXT)
        return json.dumps(s, ensure_ascii=draw(st.booleans()))
    if typ == "int8":
        x = draw(st.integers(-(2**63), 2**63 - 1) | st.sampled_from(INT_EDGES[:5] if plain else INT_EDGES))
        return str(x)
    x = draw(st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(FLOAT_EDGES) | st.integers(-(2**63), 2**63 - 1))
    return draw(st.sampled_from(number_forms(x)))


@st.composite
def documents(draw: st.DrawFn, table: pgs.Table, keys: tuple[str, ...], plain: bool) -> bytes:
    fields = [(k, value_token(draw, table.columns[k].typname, plain)) for k in keys]
    order = draw(st.permutations(fields))
    if not plain:
        damage = draw(st.integers(0, 8))
        if damage == 0 and order:
            order = order[1:]  # a field missing
        elif damage == 1:
            order = [*order, ("extra", "1")]
        elif damage == 2 and order:
            order = [*order, order[0]]  # a repeated key
        elif damage == 3 and order:
            order = [("\\u0069" + order[0][0][1:] if order[0][0] else "", order[0][1]), *order[1:]]  # an escaped key
    ws = draw(st.sampled_from(["", " ", "\n\t "])) if not plain or draw(st.booleans()) else ""
    doc = "{" + ws + ("," + ws).join(f"{json.dumps(k, ensure_ascii=False)}{ws}:{ws}{v}" for k, v in order) + ws + "}" + ws
    raw = doc.encode()
    if not plain and draw(st.integers(0, 9)) == 0:
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.sampled_from([b"", b"\xff", b"\x01", b"}", b"\xc3"])) + raw[cut + 1:]
    return raw


class Capture(LibpqWriter):
    """Sends a COPY's data as psycopg's own writer does, keeping a copy."""

    def __init__(self, cursor: Any) -> None:
        super().__init__(cursor)
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += data
        super().write(data)


def python_bytes(conn: PG, columns: list[tuple[str, str]], types: list[str], rows: list[tuple[Any, ...]]) -> bytes | None:
    """The binary COPY data psycopg sends for ``rows`` of ``columns`` (name, type) (without header and
    trailer), or None where it refuses them."""
    with conn.cursor() as cur:
        capture = Capture(cur)
        names = sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns)
        try:
            with conn.transaction(force_rollback=True):
                cur.execute(sql.SQL("CREATE TEMP TABLE t ({}) ON COMMIT DROP").format(sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns)))
                with cur.copy(sql.SQL("COPY t ({}) FROM STDIN (FORMAT BINARY)").format(names), writer=capture) as cp:
                    cp.set_types(types)
                    for row in rows:
                        cp.write_row(row)
        except (psycopg.DataError, OverflowError, ValueError):
            return None
    data = bytes(capture.data)
    assert data.startswith(copy_native.SIGNATURE) and data.endswith(copy_native.TRAILER)
    return data[len(copy_native.SIGNATURE):-len(copy_native.TRAILER)]


def typed_row(shape: pgc.Shape, raw: bytes) -> tuple[Any, ...] | None:
    assert shape.decode is not None
    try:
        return msgspec.structs.astuple(shape.decode(raw))
    except (ValueError, TypeError):
        return None


@pytest.fixture(scope="module")
def conn(stack: Any) -> Iterator[PG]:
    with psycopg.connect(stack.postgres_dsn) as c:
        pgc.register_dumpers(c)
        yield c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_the_encoder_writes_psycopgs_bytes_for_the_python_paths_row_or_refuses(conn: PG, data: st.DataObject) -> None:
    table, keys, kafka = data.draw(tables())
    shape = pgc.Shape.of(table, keys, kafka)
    enc = copy_native.encoded(shape, utf8=True)
    assert enc is not None
    plain = data.draw(st.booleans())
    raws = data.draw(st.lists(documents(table, keys, plain), min_size=1, max_size=4))
    topic = data.draw(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8))
    recs = [SinkRecord(topic, data.draw(st.integers(0, 2**31 - 1)), data.draw(st.integers(0, 2**63 - 1)), None, None, raw)
            for raw in raws]
    ordinal = data.draw(st.none() | st.integers(0, 2**40))
    for rec, raw in zip(recs, raws):
        row = typed_row(shape, raw)
        try:
            encoded = enc.encode(raw)
        except ValueError:
            assert not plain, f"a plain value refused: {raw!r}"
            continue
        assert row is not None, f"the encoder took a value the typed row refuses: {raw!r}"
        full = row + (rec.topic, rec.partition, rec.offset) if kafka else row
        columns = [(c, shape.table.columns[c].typname) for c in shape.all_cols]
        types = list(shape.types)
        if ordinal is not None:
            full += (rec.offset, ordinal)
            columns += [(c, "int8") for c in pgstage.ORDER]
            types += pgstage.ORDER_TYPES
        want = python_bytes(conn, columns, types, [full])
        assert want is not None, f"psycopg refused a row the encoder took: {full!r}"
        got, n = copy_native.join(enc, [encoded], [rec], ordinal)
        assert n == 1 and got == want, (raw, full)


def test_join_stops_at_the_first_row_not_encoded_and_the_switch_turns_the_encoder_off() -> None:
    table = pgs.Table(None, "t", {"id": pgs.Column("id", "int8", pgs.INT8)})
    shape = pgc.Shape.of(table, ("id",), kafka=False)
    enc = copy_native.encoded(shape, utf8=True)
    assert enc is not None and copy_native.encoded(shape, utf8=False) is None
    rows: list[Any] = [enc.encode(b'{"id":1}'), enc.encode(b'{"id":2}'), {"id": 3}, enc.encode(b'{"id":4}')]
    recs = [SinkRecord("t", 0, i, None, None, None) for i in range(4)]
    blob, n = copy_native.join(enc, rows, recs, None)
    assert n == 2 and blob == b"".join(b"\x00\x01" + r for r in rows[:2])
    copy_native.enabled = False
    try:
        assert copy_native.encoded(shape, utf8=True) is None
    finally:
        copy_native.enabled = True


# -- a sink fed encoded rows against the Python path -------------------------------------------
def fed(sink: PostgresSink, topic: str, values: list[bytes], start: int) -> list[SinkRecord]:
    """What the source makes with the sink's row decoder (a RowRecord where it decodes, else the dict)."""
    decode = sink.row_decoder()
    out = []
    for i, raw in enumerate(values):
        try:
            if decode is None:
                raise ValueError
            rec = SinkRecord(topic, 0, start + i, None, decode(raw), raw)
            rec.__class__ = RowRecord
        except (ValueError, TypeError):
            rec = SinkRecord(topic, 0, start + i, None, json.loads(raw), raw)
        out.append(rec)
    return out


def run(sink: PostgresSink, txn: str, recs: list[SinkRecord], size: int) -> None:
    in_slices(sink, txn, recs, size)
    sink.commit(txn)


VALUES = [{"id": i, "amount": i / 3 if i % 5 else i, "name": f"n\u00e9{i}\n\"q\"" if i % 7 else None, "ok": i % 2 == 0}
          for i in range(60)]


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_a_sink_writes_encoded_rows_as_the_python_path_and_names_the_same_culprit(
    make_sink: MakeSink, pg: PG, unique: str, mode: str, caplog: pytest.LogCaptureFixture  # noqa: F811 - the fixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eosink.connectors.postgres.sink")
    got: dict[bool, Any] = {}
    for native in (True, False):
        copy_native.enabled = native
        caplog.clear()
        try:
            table = f"{unique}_{'c' if native else 'py'}"
            conf = {"table.name.format": table, "insert.mode": mode}
            if mode == "upsert":
                conf |= {"pk.mode": "record_value", "pk.fields": "id"}
            sink = make_sink(conf)
            topic = f"{unique}.o"
            # A stream of dicts, then (once it has run) rows in the same transaction: the COPY switches to them.
            sink.begin_transaction(f"{table}.w1.1.1")
            first = records(topic, VALUES[:4])
            sink.write(first)
            later = fed(sink, topic, [json.dumps(v).encode() for v in VALUES[4:10]], 4)
            assert all(type(row_of(r)) is bytes for r in later) == native
            sink.write(later)
            stream = sink._stream
            assert stream is not None, "the stream went on"
            assert (stream.shape.encoded is not None) == native, "the COPY switched to the encoded rows"
            sink.pre_commit(manifest_for(f"{table}.w1.1.1", sink.connector, first + later))
            sink.commit(f"{table}.w1.1.1")
            assert not [r for r in caplog.records if "stream" in r.getMessage()], "every row streamed, none written again"
            raws = [json.dumps(v).encode() for v in VALUES[10:50]]
            recs = fed(sink, topic, raws, 10)
            assert all(type(r) is RowRecord for r in recs)
            assert all(type(row_of(r)) is bytes for r in recs) == native, "the C encoder's rows only where it is on"
            run(sink, f"{table}.w1.1.2", recs, 7)
            assert not [r for r in caplog.records if "stream" in r.getMessage()], "every row streamed, none written again"
            assert all(type(r) is RowRecord for r in recs), "written without decoding a value"
            again = fed(sink, topic, [json.dumps({**v, "id": v["id"] % 5}).encode() for v in VALUES[50:60]], 50)
            run(sink, f"{table}.w1.1.3", again, 3)  # upsert: keys seen before (insert: duplicate ids)
            bad = fed(sink, topic, [json.dumps(VALUES[1]).encode(), b'{"id":99,"amount":"x","name":null,"ok":true}'], 60)
            with pytest.raises(RecordError) as err:
                run(sink, f"{table}.w1.1.4", bad, 1)
            sink.abort(f"{table}.w1.1.4")
            rows = pg.execute(sql.SQL("SELECT id, amount, name, ok, __topic, __partition, __offset FROM {} ORDER BY __offset, id").format(
                sql.Identifier(table))).fetchall()
            got[native] = (rows, err.value.topic, err.value.offset, err.value.column, str(err.value).replace(table, "T"))
        finally:
            copy_native.enabled = True
    assert got[True] == got[False]
    assert len(got[True][0]) == (50 if mode == "upsert" else 60)
    assert got[True][1:4] == (f"{unique}.o", 61, "amount")
