"""The record source: its process-wide garbage-collector pause (no broker), and ``value.converter=json``
decoding records from the real Kafka exactly as ``json.loads`` would, undecodable ones named by offset -
also when it only checks objects and arrays and leaves them undecoded (``defer_json_decoding``)."""

from __future__ import annotations

import gc
import json
import math
import time
from typing import Any

import pytest

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import LazyJsonRecord, SinkRecord, TopicPartition
from eosink.connectors.api.rows import RowRecord, row_of
from eosink.worker.engine import gcpause, source
from eosink.worker.engine.batch import Batch
from eosink.worker.engine.source import KafkaSource
from tests.restkit import produce


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_gc_pause_is_counted_so_the_collector_comes_back_only_after_the_last_holder(collector_on):
    gcpause.pause()
    gcpause.pause()
    assert not gc.isenabled()
    gcpause.resume()
    assert not gc.isenabled()
    gcpause.resume()
    assert gc.isenabled()


def test_overlapping_gc_pauses_still_collect_cyclic_garbage(collector_on, monkeypatch):
    """Task threads whose cycles overlap keep the collector paused between them; once it has been
    off longer than GC_MAX_PAUSE_S, the next pause collects, so reference cycles made meanwhile by
    other threads do not pile up for as long as the worker is busy."""
    monkeypatch.setattr(gcpause, "GC_MAX_PAUSE_S", 0.0)
    with gcpause.paused():  # task A's cycle
        for _ in range(500):
            _Cycle()  # garbage with a reference cycle: only the collector frees it
        assert any(isinstance(o, _Cycle) for o in gc.get_objects())
        with gcpause.paused():  # task B's cycle begins before A's ends: one collection first
            assert not any(isinstance(o, _Cycle) for o in gc.get_objects())
            assert not gc.isenabled()
    assert gc.isenabled()


# ---------------------------------------------------------------------------------------- json from Kafka
#: Values json.loads accepts although msgspec refuses them (the stdlib decides), and ordinary ones.
ODD_BUT_VALID = [
    b'{"id":0,"amount":554.33,"big":123456789012345678901234567890}',
    b'{"id":1,"x":NaN,"y":-Infinity,"z":1e400}',
    b'{"id":2,"s":"\\ud800","dup":1,"dup":2}',
    b'\xef\xbb\xbf{"id":3}',
    '{"id":4}'.encode("utf-16-le"),
    b'{"id":5,"raw_surrogate":"\xed\xa0\x80"}',
]
UNDECODABLE = [b"{broken", b'{"s":"\xff"}', b"[" * 5000 + b"]" * 5000, b"1" * 4301,
               # What a parse that builds no value would let through: an integer over the digit limit
               # inside an object, invalid UTF-8 (an overlong NUL, a code point past U+10FFFF) in a string.
               b'{"n":' + b"1" * 4301 + b"}", b'{"s":"\xc0\x80"}', b'["\xf4\x90\x80\x80"]']
#: Poll as the worker does for sinks that read values (decoded), and for sinks that copy their bytes.
DECODING = pytest.mark.parametrize("deferred", [False, True], ids=["decoded", "checked-then-deferred"])


def _source(unique: str, bootstrap: str, deferred: bool, **kw) -> KafkaSource:
    src = KafkaSource(unique, bootstrap, value_converter="json", **kw)
    if deferred:
        assert src.defer_json_decoding()
    return src


def _poll_all(src: KafkaSource, n: int) -> Batch:
    out = Batch()
    deadline = time.monotonic() + 30
    while len(out.records) + len(out.failed) < n and out.error is None and time.monotonic() < deadline:
        b = src.poll_batch(10_000, 10_000_000, 1.0)
        out.records += b.records
        out.failed += b.failed
        out.error = b.error
    return out


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@DECODING
def test_json_converter_decodes_kafka_values_exactly_as_json_loads(stack, make_topic, unique, deferred):
    topic = make_topic()
    produce(stack.kafka_bootstrap, topic, [(0, v) for v in ODD_BUT_VALID])
    src = _source(unique, stack.kafka_bootstrap, deferred)
    try:
        src.assign({TopicPartition(topic, 0): 0})
        batch = _poll_all(src, len(ODD_BUT_VALID))
    finally:
        src.close()
    assert batch.error is None and batch.failed == []
    assert [r.offset for r in batch.records] == list(range(len(ODD_BUT_VALID)))
    # Deferred, the plain object (a big integer is plain JSON) is left undecoded; what only json.loads
    # takes (NaN, a lone surrogate, a BOM, UTF-16) was decoded, as without deferring.
    lazy = [r.offset for r in batch.records if r.__class__ is LazyJsonRecord]
    assert lazy == ([0] if deferred else [])
    for r, raw in zip(batch.records, ODD_BUT_VALID):
        assert r.raw_value == raw
        assert _same(r.value, json.loads(raw)), (r.offset, r.value)


@DECODING
def test_undecodable_json_values_become_record_errors_naming_topic_partition_and_offset(stack, make_topic, unique,
                                                                                       deferred):
    """Malformed JSON, invalid UTF-8, nesting past the recursion limit, an integer over the digit limit:
    each is a RecordError for its own offset (tolerated: listed as failed, and the batch goes on)."""
    topic = make_topic()
    good = b'{"id":"ok"}'
    produce(stack.kafka_bootstrap, topic, [(0, v) for v in [good, *UNDECODABLE, good]])
    src = _source(unique, stack.kafka_bootstrap, deferred, tolerate=True)
    try:
        src.assign({TopicPartition(topic, 0): 0})
        batch = _poll_all(src, len(UNDECODABLE) + 2)
    finally:
        src.close()
    assert batch.error is None
    assert [r.offset for r in batch.records] == [0, len(UNDECODABLE) + 1]
    assert [f.offset for f in batch.failed] == list(range(1, len(UNDECODABLE) + 1))
    for f, raw in zip(batch.failed, UNDECODABLE):
        assert f.value == raw and f.stage == "VALUE_CONVERTER"
        err = f.error
        assert isinstance(err, RecordError)
        assert (err.topic, err.partition, err.offset) == (topic, 0, f.offset)
        assert "cannot be decoded as json" in str(err)

    assert {r.__class__ for r in batch.records} == {LazyJsonRecord if deferred else SinkRecord}

    strict = _source(unique + "-strict", stack.kafka_bootstrap, deferred)
    try:
        strict.assign({TopicPartition(topic, 0): 3})  # the nesting record first
        batch = _poll_all(strict, 1)
    finally:
        strict.close()
    assert batch.records == [] and isinstance(batch.error, RecordError)
    assert (batch.error.topic, batch.error.partition, batch.error.offset) == (topic, 0, 3)
    assert "recursion" in str(batch.error)


#: Kafka Connect's JsonConverter with schemas.enable=true: a payload cut out natively (its bytes kept), one only
#: json.loads reads (NaN), a null payload, one with whitespace, a doubled payload key, and two that are not envelopes.
_SCHEMA = b'{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}],"optional":false}'
ENVELOPES = [b'{"schema":' + _SCHEMA + b',"payload":{"id":1,"s":"\xc3\xa9"}}',
             b'{"schema":' + _SCHEMA + b',"payload":{"id":2,"x":NaN}}',
             b'{"schema":null,"payload":null}',
             b' {"schema":{"type":"string"}, "payload": "three"}',
             # The first one's schema bytes, then a slot json.loads reads as a payload key followed by another.
             b'{"schema":' + _SCHEMA + b',"payload":{"id":0},"payload":{"id":4}}']
NOT_ENVELOPES = [b'{"id":4}', b'{"schema":{},"payload":']


@DECODING
def test_schemas_enable_envelope_gives_the_payload_with_its_own_bytes_and_names_a_bare_value(stack, make_topic,
                                                                                             unique, deferred):
    topic = make_topic()
    values = [*ENVELOPES, *NOT_ENVELOPES]
    produce(stack.kafka_bootstrap, topic, [(0, v) for v in values])
    src = _source(unique, stack.kafka_bootstrap, deferred, schemas_enable=True, tolerate=True)
    try:
        src.assign({TopicPartition(topic, 0): 0})
        batch = _poll_all(src, len(values))
    finally:
        src.close()
    assert [r.offset for r in batch.records] == [0, 1, 2, 3, 4]
    assert [r.offset for r in batch.records if r.__class__ is LazyJsonRecord] == ([0] if deferred else [])
    # The NaN payload is sliced too (same schema bytes as the first): json.loads takes it, as without an envelope.
    assert [r.raw_value for r in batch.records] == [b'{"id":1,"s":"\xc3\xa9"}', b'{"id":2,"x":NaN}', None, b'"three"', None]
    for r, raw in zip(batch.records, ENVELOPES):
        assert _same(r.value, json.loads(raw)["payload"]), (r.offset, r.value)
    # Not an envelope: a record error for its offset; the dead-letter record keeps the bytes as they were sent.
    assert [(f.offset, f.value) for f in batch.failed] == [(5, NOT_ENVELOPES[0]), (6, NOT_ENVELOPES[1])]
    assert "envelope" in str(batch.failed[0].error) and "cannot be decoded as json" in str(batch.failed[1].error)


# ---------------------------------------------------------------------------------------- ending a poll early
def test_a_poll_that_has_read_everything_ends_once_min_s_old_not_at_its_timeout(stack, make_topic, unique):
    """commit.min.interval.ms: with every partition at its end (read_committed: past the commit
    marker), the poll returns once ``min_s`` old; without ``min_s`` it waits out its timeout."""
    topic = make_topic(partitions=2)
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": i}).encode()) for i in range(50)])
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json")
    try:
        src.assign({TopicPartition(topic, 0): 0, TopicPartition(topic, 1): 0})
        t0 = time.monotonic()
        batch = src.poll_batch(10_000, 10_000_000, 20.0, min_s=0.2)
        early = time.monotonic() - t0
        assert sorted(r.value["id"] for r in batch.records) == list(range(50))
        assert src.caught_up()
        assert early < 10, f"a caught-up poll took {early:.1f}s: it waited for records that do not come"

        t0 = time.monotonic()
        assert src.poll_batch(10_000, 10_000_000, 0.5).records == []
        assert time.monotonic() - t0 >= 0.45  # no min_s: the whole timeout

        produce(stack.kafka_bootstrap, topic, [(1, b'{"id":50}')])
        t0 = time.monotonic()
        batch = src.poll_batch(10_000, 10_000_000, 20.0, min_s=0.5)
        assert [r.value for r in batch.records] == [{"id": 50}]  # read although the last poll had caught up
        assert time.monotonic() - t0 < 10
    finally:
        src.close()


def test_a_caught_up_poll_holding_half_a_batch_ends_at_once_a_smaller_one_waits(stack, make_topic, unique):
    """``min_fill``: the last part of a backlog, once read, ends the poll however young it is when it is at
    least that large (records or bytes); a smaller one waits for ``min_s`` (here: the whole timeout)."""
    topic = make_topic(partitions=2)
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": i}).encode()) for i in range(600)])
    tps = {TopicPartition(topic, 0): 0, TopicPartition(topic, 1): 0}
    for fill, ends_early in (((500, 10**9), True), ((10**6, 5_000), True), ((700, 10**9), False)):
        src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json")
        try:
            src.assign(tps)
            t0 = time.monotonic()
            batch = src.poll_batch(10_000, 10_000_000, 3.0, min_s=3.0, min_fill=fill)
            took = time.monotonic() - t0
            assert len(batch.records) == 600
            if ends_early:
                assert took < 2.5, f"min_fill={fill}: a caught-up poll of 600 records waited {took:.1f}s"
            else:
                assert took >= 2.9, f"min_fill={fill}: a poll of fewer records ended after {took:.1f}s"
        finally:
            src.close()


def test_a_steady_trickle_of_transactions_still_ends_a_poll_early(stack, make_topic, unique):
    """librdkafka reports no end of partition when a fetch ends on a commit marker, so with a transaction
    committed every 100 ms the poll never saw an end event and waited out its whole timeout: every cycle
    lasted commit.interval.ms. Caught up is also "position at the fetched high watermark" now."""
    import threading

    from confluent_kafka import Producer

    topic = make_topic(partitions=1)
    stop = threading.Event()
    sent: list[int] = []

    def trickle() -> None:
        p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-trickle", "linger.ms": 5})
        p.init_transactions(30)
        while not stop.is_set():
            p.begin_transaction()
            for _ in range(10):
                p.produce(topic, json.dumps({"id": len(sent)}).encode())
                sent.append(len(sent))
            p.commit_transaction(30)
            time.sleep(0.1)

    producer = threading.Thread(target=trickle, daemon=True)
    producer.start()
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json")
    try:
        src.assign({TopicPartition(topic, 0): 0})
        while len(sent) < 30:
            time.sleep(0.05)
        took, ids = [], []
        for _ in range(4):
            t0 = time.monotonic()
            batch = src.poll_batch(100_000, 100_000_000, 8.0, min_s=0.25)
            took.append(time.monotonic() - t0)
            ids += [r.value["id"] for r in batch.records]
        assert ids == list(range(len(ids))) and len(ids) > 0
        # Without the fix each poll took its whole 8 s timeout; with it, ~0.25 s (a generous bound: a noisy machine).
        assert max(took) < 4.0, f"polls took {[round(t, 2) for t in took]} s: the trickle never counted as caught up"
    finally:
        stop.set()
        producer.join(30)
        src.close()


def test_on_chunk_receives_every_record_once_in_order(stack, make_topic, unique, monkeypatch):
    monkeypatch.setattr(source, "CHUNK_RECORDS", 7)
    topic = make_topic()
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": i}).encode()) for i in range(40)])
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json", fetch_batch=5)  # 5 records a fetch
    chunks: list[list[int]] = []
    try:
        src.assign({TopicPartition(topic, 0): 0})
        batch = src.poll_batch(10_000, 10_000_000, 20.0, min_s=0.0,
                               on_chunk=lambda recs: chunks.append([r.value["id"] for r in recs]))
    finally:
        src.close()
    assert [r.value["id"] for r in batch.records] == list(range(40))
    assert [i for c in chunks for i in c] == list(range(40))
    assert len(chunks) > 1


def test_a_sink_without_rows_yet_gets_a_small_first_chunk_and_rows_right_after_it(stack, make_topic, unique, monkeypatch):
    """The sink's rows come with its first stream, which opens with the first chunk: that chunk is small, so
    that the records after it are decoded into rows (the slice after the chunk asks again)."""
    monkeypatch.setattr(source, "FIRST_CHUNK_RECORDS", 3)
    topic = make_topic()
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": i}).encode()) for i in range(40)])
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json", fetch_batch=5)
    chunks: list[list[Any]] = []

    def row(raw: bytes) -> tuple[int]:
        return (json.loads(raw)["id"],)

    try:
        src.assign({TopicPartition(topic, 0): 0})
        batch = src.poll_batch(10_000, 10_000_000, 20.0, min_s=0.0, on_chunk=lambda recs: chunks.append(list(recs)),
                               rows=lambda: row if chunks else None)  # rows once the first chunk is written
    finally:
        src.close()
    assert [len(c) for c in chunks][:1] == [3]
    assert [i for c in chunks for i in (row_of(r)[0] if type(r) is RowRecord else r.value["id"] for r in c)] == list(range(40))
    assert [type(r) for r in batch.records] == [SinkRecord] * 3 + [RowRecord] * 37


def test_the_next_poll_frees_the_last_batch_but_never_edits_the_list_a_caller_holds(stack, make_topic, unique):
    """The source keeps its own list of the last batch's records and empties it while the next batch
    is decoded (the freed memory is reused at once); the records and the list the caller got stay as
    they were for as long as the caller holds them."""
    topic = make_topic()
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": i}).encode()) for i in range(60)])
    src = KafkaSource(unique, stack.kafka_bootstrap, value_converter="json", fetch_batch=10)
    try:
        src.assign({TopicPartition(topic, 0): 0})
        first = src.poll_batch(30, 10_000_000, 20.0, min_s=0.0)
        assert [r.value["id"] for r in first.records] == list(range(30))
        second = src.poll_batch(30, 10_000_000, 20.0, min_s=0.0)
        assert [r.value["id"] for r in first.records] == list(range(30)), "the caller's batch was edited"
        assert [r.value["id"] for r in second.records] == list(range(30, 60))
        assert [id(r) for r in src._last] == [id(r) for r in second.records]  # only the last batch is kept
        src.assign({TopicPartition(topic, 0): 60})
        assert src._last == []  # a new assignment lets it go at once
    finally:
        src.close()
