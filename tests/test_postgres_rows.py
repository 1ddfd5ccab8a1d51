"""Records decoded straight into the PostgreSQL sink's typed rows (``eosink.connectors.api.rows``).

The row type must take exactly the JSON objects the dict path writes without a type error - giving
the very row it would build - and refuse everything else, which then keeps the dict path; a
``RowRecord`` must behave as the plain record it stands for; and a sink fed rows (by the engine's
source, from the real Kafka) must write the same rows and refuse the same records as without them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import psycopg
import pytest
from confluent_kafka import Message, Producer
from psycopg import sql

from eosink.connectors import memory
from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.connectors.api.rows import RowRecord, row_of
from eosink.connectors.common import jsoncodec
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres.sink import PostgresSink
from eosink.worker.engine.batch import Batch
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.source import KafkaSource
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings
from eosink.worker.stack import Endpoints
from eosink.worker.transforms import build_chain
from tests.fakes import ListSource
from tests.sinkkit import manifest_for, records
from tests.test_postgres_sink import MakeSink, make_sink  # noqa: F401 - the fixture

PG = psycopg.Connection[Any]

# -- the row type against the dict path (no stack) ---------------------------------------------
COLUMNS = [pgs.Column("id", "int8", pgs.INT8), pgs.Column("n", "int4", pgs.INT), pgs.Column("ok", "bool", pgs.BOOL),
           pgs.Column("amount", "float8", pgs.FLOAT), pgs.Column("name", "text", pgs.TEXT),
           pgs.Column("odd name", "text", pgs.TEXT)]
TABLE = pgs.Table(None, "t", {c.name: c for c in COLUMNS})
KEYS = ("id", "n", "ok", "amount", "name", "odd name")

DOCS = [
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"}',
    b'{"odd name":null,"name":null,"amount":null,"ok":null,"n":null,"id":null}',  # other order, all null
    b'{"id":123456789012345678901234567890,"n":-1,"ok":false,"amount":7,"name":"","odd name":"x"}',  # big int, int in float
    b'{"id":1,"n":2,"ok":true,"amount":1e-5,"name":"\\u00e9\\ud83d\\ude00","odd name":"\\"","id":3}',  # escapes, dup key
    b'{"i\\u0064":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"}',  # an escaped key
    b'{"id":1.0,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"}',  # a float for an int
    b'{"id":true,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"}',  # a bool for an int
    b'{"id":1,"n":2,"ok":1,"amount":1.5,"name":"a","odd name":"b"}',  # an int for a bool
    b'{"id":1,"n":"2","ok":true,"amount":1.5,"name":"a","odd name":"b"}',  # a string for an int
    b'{"id":1,"n":2,"ok":true,"amount":"1.5","name":"a","odd name":"b"}',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":5,"odd name":"b"}',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":{"a":1},"odd name":"b"}',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":["a"],"odd name":"b"}',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"a"}',  # a field missing
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b","new":1}',  # a field more
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b","new":null}',  # a null field more
    b'{"id":1,"n":2,"ok":true,"amount":NaN,"name":"a","odd name":"b"}',  # json.loads only
    b'{"id":1,"n":2,"ok":true,"amount":1e400,"name":"a","odd name":"b"}',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"\\ud800","odd name":"b"}',  # a lone surrogate
    b'\xef\xbb\xbf{"id":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"}',
    b' {"id":1,"n":2,"ok":true,"amount":1.5,"name":"a","odd name":"b"} ',
    b'{"id":1,"n":2,"ok":true,"amount":1.5,"name":"\xff","odd name":"b"}',
    b'[1,2,true,1.5,"a","b"]', b"null", b"1", b'"x"', b"{}", b"{broken", b"",
]


def _dict_row(shape: pgc.Shape, raw: bytes) -> tuple[Any, ...] | None:
    """The row the dict path writes for ``raw`` without an error (None: it writes none, or not this shape's)."""
    try:
        v = jsoncodec.decode_value(raw)
    except ValueError:
        return None
    if type(v) is not dict or set(v) != set(shape.keys) or len(v) != len(shape.keys):
        return None
    vals = shape.getter(v)
    return vals if shape.fits(vals) else None


def test_a_row_is_decoded_exactly_where_the_dict_path_writes_the_same_row_without_error() -> None:
    shape = pgc.Shape.of(TABLE, KEYS, kafka=False)
    assert shape.decode is not None and shape.row_type is not None
    taken = 0
    for raw in DOCS:
        want = _dict_row(shape, raw)
        try:
            got = msgspec.structs.astuple(shape.decode(raw))
        except (ValueError, TypeError):
            got = None
        if got is not None:  # a document the row type refuses is decoded into a dict: as without rows
            assert got == want and [type(x) for x in got] == [type(x) for x in want or ()], raw
            taken += 1
    assert taken == 6  # the first five documents, and the one in blanks


def test_no_row_type_where_a_column_kind_has_none_or_a_key_no_column() -> None:
    cols = {**TABLE.columns, "doc": pgs.Column("doc", "jsonb", pgs.JSON), "ts": pgs.Column("ts", "timestamptz", pgs.OTHER)}
    table = pgs.Table(None, "t", cols)
    assert pgc.Shape.of(table, ("id", "doc"), kafka=False).row_type is None
    assert pgc.Shape.of(table, ("id", "ts"), kafka=False).row_type is None
    assert pgc.Shape.of(table, ("id", "unknown"), kafka=False).row_type is None
    assert pgc.Shape.of(table, ("id", "name"), kafka=False).row_type is not None  # the others' columns


def test_copy_rows_writes_a_row_as_the_dict_it_was_decoded_from() -> None:
    shape = pgc.Shape.of(TABLE, KEYS, kafka=False)
    raws = DOCS[:5]
    dict_recs = [SinkRecord("t", 0, i, None, jsoncodec.decode_value(raw), raw) for i, raw in enumerate(raws)]
    row_recs = [_row_record("t", 0, i, raw, shape) for i, raw in enumerate(raws)]
    by_dict: list[tuple[Any, ...]] = []
    by_row: list[tuple[Any, ...]] = []
    assert pgc.copy_rows(by_dict.append, shape, dict_recs, [r.value for r in dict_recs], True) == 5
    assert pgc.copy_rows(by_row.append, shape, row_recs, [row_of(r) for r in row_recs], True) == 5
    assert by_row == by_dict
    assert all(r.__class__ is RowRecord for r in row_recs), "the rows were written without decoding any value"
    other = pgc.Shape.of(TABLE, KEYS, kafka=False)  # another shape's rows are not this one's
    assert pgc.copy_rows(by_row.append, other, row_recs, [row_of(r) for r in row_recs], True) == 0


# -- RowRecord is the plain record it stands for ------------------------------------------------
def _row_record(topic: str, partition: int, offset: int, raw: bytes, shape: pgc.Shape,
                headers: list[tuple[str, bytes]] | None = [("h", b"v")]) -> SinkRecord:  # noqa: B006 - never changed
    assert shape.decode is not None
    message = Message(topic=topic, partition=partition, offset=offset, value=raw, headers=headers)
    rec = SinkRecord(topic, partition, offset, b"k", shape.decode(raw), raw, message, 7)  # type: ignore[arg-type]
    rec.__class__ = RowRecord  # as the source makes it: the consumer's message in the headers slot
    return rec


def test_reading_or_assigning_the_value_makes_a_plain_record() -> None:
    shape = pgc.Shape.of(TABLE, KEYS, kafka=False)
    raw = DOCS[3]
    plain = SinkRecord("t", 0, 5, b"k", jsoncodec.decode_value(raw), raw, (("h", b"v"),), 7)
    r = _row_record("t", 0, 5, raw, shape)
    assert isinstance(row_of(r), shape.row_type)
    assert r.value == plain.value and list(r.value) == list(plain.value)  # the topic's key order
    assert type(r) is SinkRecord and r == plain and row_of(r) is r.value
    r2 = _row_record("t", 0, 5, raw, shape)
    r2.value = {"x": 1}
    assert type(r2) is SinkRecord and r2.value == {"x": 1}
    r3 = _row_record("t", 0, 5, raw, shape)
    assert r3 == plain and plain == _row_record("t", 0, 5, raw, shape)
    for made in (copy.copy(_row_record("t", 0, 5, raw, shape)), pickle.loads(pickle.dumps(_row_record("t", 0, 5, raw, shape)))):
        assert type(made) is SinkRecord and made == plain
    assert repr(_row_record("t", 0, 5, raw, shape)) == repr(plain)
    r4 = _row_record("t", 0, 5, raw, shape)
    assert r4.record_id == "t/0/5" and r4.header("h") == "v" and r4.tp == TopicPartition("t", 0)
    assert r4.headers == (("h", b"v"),) and type(r4) is RowRecord, "coordinates and headers are read without decoding the value"
    r5 = _row_record("t", 0, 5, raw, shape, headers=None)
    assert r5.headers == () and r5.record_id == "t/0/5"
    r6 = _row_record("t", 0, 5, raw, shape, headers=[("eosink.id", b"j/r/0/1")])
    r6.value  # noqa: B018 - the plain record it becomes holds the headers, converted
    assert type(r6) is SinkRecord and r6.headers == (("eosink.id", b"j/r/0/1"),) and r6.record_id == "j/r/0/1"
    r7 = _row_record("t", 0, 5, raw, shape)
    r7.headers = [("x", b"y")]  # type: ignore[assignment]  # whatever is assigned is kept as it is
    assert r7.headers == [("x", b"y")] and r7 == SinkRecord("t", 0, 5, b"k", plain.value, raw, [("x", b"y")], 7)  # type: ignore[arg-type]
    r8 = dataclasses.replace(_row_record("t", 0, 5, raw, shape), value={"x": 1})
    assert type(r8) is SinkRecord and (r8.value, r8.headers) == ({"x": 1}, (("h", b"v"),))
    r9 = dataclasses.replace(_row_record("t", 0, 5, raw, shape), offset=6)
    assert type(r9) is SinkRecord and r9 == SinkRecord("t", 0, 6, b"k", plain.value, raw, (("h", b"v"),), 7)


# -- the sink, fed rows ------------------------------------------------------------------------
@pytest.fixture
def sinks(make_sink: MakeSink, unique: str) -> Callable[[], PostgresSink]:  # noqa: F811 - the fixture
    """A sink writing to ``<unique>_t`` (everything it leaves is undone by ``make_sink``)."""
    return lambda: make_sink({"table.name.format": f"{unique}_t"})


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "amount": i / 4, "name": f"n{i}", "ok": i % 2 == 0, **extra}


def as_rows(sink: PostgresSink, topic: str, values: Sequence[dict[str, Any]], start: int) -> list[SinkRecord]:
    """What the source makes with the sink's row decoder: a RowRecord where it decodes, else the dict."""
    decode = sink.row_decoder()
    assert decode is not None
    out = []
    for i, v in enumerate(values):
        raw = json.dumps(v).encode()
        try:
            rec = SinkRecord(topic, 0, start + i, None, decode(raw), raw)
            rec.__class__ = RowRecord
        except (ValueError, TypeError):
            rec = SinkRecord(topic, 0, start + i, None, v, raw)
        out.append(rec)
    return out


def in_slices(sink: PostgresSink, txn: str, recs: list[SinkRecord], size: int) -> None:
    sink.begin_transaction(txn)
    for i in range(0, len(recs), size):
        sink.write(recs[i:i + size])
    sink.pre_commit(manifest_for(txn, sink.connector, recs))


def table_rows(pg: PG, table: str) -> list[tuple[Any, ...]]:
    return pg.execute(sql.SQL("SELECT id, amount, name, ok, __offset FROM {} ORDER BY id").format(sql.Identifier(table))).fetchall()


def test_rows_stream_as_the_dicts_would_and_nothing_is_decoded(sinks: Callable[[], PostgresSink], pg: PG, unique: str) -> None:
    sink = sinks()
    topic = f"{unique}.o"
    assert sink.row_decoder() is None, "no row type before the sink has streamed into the table"
    in_slices(sink, f"{unique}.w1.1.1", records(topic, [order(i) for i in range(10)]), 4)
    sink.commit(f"{unique}.w1.1.1")
    recs = as_rows(sink, topic, [order(i) for i in range(10, 40)], 10)
    assert all(type(r) is RowRecord for r in recs)
    in_slices(sink, f"{unique}.w1.1.2", recs, 7)
    sink.commit(f"{unique}.w1.1.2")
    assert all(type(r) is RowRecord for r in recs), "the rows were written without decoding a value"
    assert table_rows(pg, f"{unique}_t") == [(i, i / 4, f"n{i}", i % 2 == 0, i) for i in range(40)]


def test_a_record_the_rows_refuse_gives_the_outcome_it_gives_without_them(
    sinks: Callable[[], PostgresSink], pg: PG, unique: str
) -> None:
    """A new field in the middle of rows: the column is added and every row written once, values
    read from the records; a value of the wrong type: refused, naming the record and the column."""
    sink = sinks()
    topic = f"{unique}.o"
    in_slices(sink, f"{unique}.w1.1.1", records(topic, [order(i) for i in range(5)]), 5)
    sink.commit(f"{unique}.w1.1.1")
    recs = as_rows(sink, topic, [order(i) for i in range(5, 9)] + [order(9, note="new")] + [order(i) for i in range(10, 14)], 5)
    assert [type(r) for r in recs].count(SinkRecord) == 1
    in_slices(sink, f"{unique}.w1.1.2", recs, 3)
    sink.commit(f"{unique}.w1.1.2")
    assert pg.execute(sql.SQL("SELECT count(*), count(DISTINCT id), count(note) FROM {}").format(
        sql.Identifier(f"{unique}_t"))).fetchone() == (14, 14, 1)
    in_slices(sink, f"{unique}.w1.1.3", records(topic, [order(i, note="x") for i in range(14, 20)], start=14), 6)
    sink.commit(f"{unique}.w1.1.3")  # a stream with the new shape: rows again
    bad = as_rows(sink, topic, [order(i, note="x") for i in range(20, 24)] + [order(24, note="x", amount="1.5")], 20)
    assert type(bad[-1]) is SinkRecord and type(bad[0]) is RowRecord
    with pytest.raises(RecordError) as err:
        in_slices(sink, f"{unique}.w1.1.4", bad, 2)
    assert (err.value.topic, err.value.offset, err.value.column) == (topic, 24, "amount")
    sink.abort(f"{unique}.w1.1.4")
    assert pg.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(f"{unique}_t"))).fetchone() == (20,)


def test_the_source_decodes_into_the_offered_rows_and_still_names_what_it_cannot_decode(
    stack: Endpoints, make_topic: Callable[..., str], unique: str
) -> None:
    shape = pgc.Shape.of(pgs.Table(None, "t", {c.name: c for c in COLUMNS[:2]}), ("id", "n"), kafka=False)
    values = [b'{"id":1,"n":2}', b'{"n":3,"id":2,"x":null}', b'{"id":3,"n":null}', None, b'{"id":5,"n":"6"}', b"{broken",
              b'{"id":7,"n":8}']
    topic = make_topic()
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-p"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, v in enumerate(values):
        producer.produce(topic, v, partition=0, headers=[("eosink.id", f"j/r/0/{i}".encode()), ("n", b"1")] if i != 2 else None)
    producer.commit_transaction(30)
    asked: list[int] = []

    def rows() -> Callable[[bytes], Any] | None:
        asked.append(1)
        return shape.decode

    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json")
    try:
        src.assign({TopicPartition(topic, 0): 0})
        got: list[SinkRecord] = []
        deadline = time.monotonic() + 30
        batch = Batch()
        while len(got) < 5 and batch.error is None and time.monotonic() < deadline:
            batch = src.poll_batch(10_000, 10_000_000, 1.0, min_s=0.0, rows=rows)
            got += batch.records
    finally:
        src.close()
    assert asked, "the decoder is asked for"
    assert [type(r) for r in got] == [RowRecord, SinkRecord, RowRecord, SinkRecord, SinkRecord]
    assert type(SinkRecord.__dict__["headers"].__get__(got[0])) is not tuple, "a row's headers are converted when read"
    assert [r.headers for r in got] == [(("eosink.id", f"j/r/0/{i}".encode()), ("n", b"1")) if i != 2 else () for i in range(5)]
    assert got[0].record_id == "j/r/0/0"
    assert [type(r) for r in got] == [RowRecord, SinkRecord, RowRecord, SinkRecord, SinkRecord], "headers read, values not"
    assert [r.value for r in got] == [{"id": 1, "n": 2}, {"n": 3, "id": 2, "x": None}, {"id": 3, "n": None}, None,
                                      {"id": 5, "n": "6"}]
    assert batch.error is not None and (batch.error.topic, batch.error.offset) == (topic, 5)


# -- which sink the engine asks for rows --------------------------------------------------------
class _IncrementalSource(ListSource):
    """A list source that takes ``min_s``, ``on_chunk`` and ``rows`` (as KafkaSource does), and notes ``rows``."""

    incremental = True

    def __init__(self, data: dict[TopicPartition, list[bytes]]) -> None:
        super().__init__(data)
        self.offered: list[Any] = []

    def poll_batch(self, max_records: int, max_bytes: int, timeout_s: float, *, min_s: float | None = None,  # type: ignore[override]
                   on_chunk: Callable[[list[SinkRecord]], None] | None = None, rows: Any = None,
                   native: Any = None, min_fill: Any = None) -> Batch:
        self.offered.append(rows)
        batch = super().poll_batch(max_records, max_bytes, timeout_s)
        if on_chunk is not None and batch.records:
            on_chunk(batch.records)
        return batch


class _RowSink(memory.MemorySink):
    def row_decoder(self) -> Callable[[bytes], Any] | None:
        return None


@pytest.mark.parametrize("setup", ["alone", "two sinks", "transforms", "dead letters"])
def test_the_engine_offers_rows_only_to_the_one_sink_that_gets_the_records_untransformed(setup: str, unique: str) -> None:
    tp = TopicPartition("orders", 0)
    src = _IncrementalSource({tp: [json.dumps({"id": i}).encode() for i in range(3)]})
    sinks: list[Any] = [_RowSink("c", {"memory.store": unique})]
    if setup == "two sinks":
        sinks.append(_RowSink("c", {"memory.store": unique + "-2"}))
    chain = build_chain({"transforms": "pick", "transforms.pick.type": "ExtractField$Value", "transforms.pick.field": "id"})
    task = SinkTask("c", "w1", sinks, src, MemoryDecisionLog(), TaskSettings(commit_interval_s=0), sleep=lambda _s: None,
                    transforms=chain if setup == "transforms" else None,
                    dead_letter=memory.MemorySink("c", {"memory.store": unique + "-dlq"}) if setup == "dead letters" else None)
    try:
        task.open()
        task.assign([tp])
        assert task.run_cycle().outcome is CycleOutcome.SUCCEEDED
        want = sinks[0].row_decoder if setup == "alone" else None
        assert src.offered == [want]
        assert len(memory.store(unique).committed) == 3
    finally:
        for name in (unique, unique + "-2", unique + "-dlq"):
            memory.drop_store(name)
