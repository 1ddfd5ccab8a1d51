"""The Spark publisher's C produce loop (``spark_jobs/native``) against the real Kafka: it writes
exactly what the Python loop writes (keys, values, both eosink headers, nulls, non-ASCII, sliced and
large Arrow columns), resumes after librdkafka's queue fills up, is used by the publisher in Spark
(and not when turned off), and is never bound to anything but a confluent-kafka producer.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from eosink.connectors.api.records import ID_HEADER, RUN_HEADER
from eosink.spark_jobs import native
from tests.spark_fixtures import assert_exactly_once, read_topic, spark  # noqa: F401

pytestmark = pytest.mark.skipif(native._produce is None, reason="built without a C compiler: the publisher uses its Python loop")


def producer(stack: Any, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"native-{uuid.uuid4().hex}",
                  "linger.ms": 5, **conf})
    p.init_transactions(30)
    p.begin_transaction()
    return p


def python_loop(p: Producer, topic: str, keys: pa.Array, values: pa.Array, prefix: str, run: bytes) -> None:
    """What the publisher's Python loop sends for the same rows."""
    for seq, (k, v) in enumerate(zip(keys.to_pylist(), values.to_pylist())):
        p.produce(topic, v, k, -1, None, None, 0, [(ID_HEADER, prefix + str(seq)), (RUN_HEADER, run)])


def c_loop(p: Producer, topic: str, keys: pa.Array, values: pa.Array, prefix: str, run: bytes) -> int:
    """The C loop over the same rows, serving a full queue as the task does; how often it was full."""
    loop = native.loop_for(p)
    assert loop is not None and loop.fits(keys, values)
    first = full = 0
    while first < len(values):
        first, err = loop.produce(topic, keys, values, first, ID_HEADER, prefix.encode(), first, RUN_HEADER, run)
        if err == native.QUEUE_FULL:
            full += 1
            p.poll(0.05)
        else:
            assert err == 0, err
    return full


def rows(n: int) -> tuple[list[bytes | None], list[bytes | None]]:
    keys = [None if i % 7 == 0 else f"k-{i}-ü".encode() for i in range(n)]
    values = [None if i % 11 == 0 else b"" if i % 13 == 0 else f'{{"i":{i},"s":"é{"x" * (i % 50)}"}}'.encode() for i in range(n)]
    return keys, values


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.string()], ids=["binary", "large_binary", "string"])
def test_c_loop_writes_exactly_what_the_python_loop_writes(stack, make_topic, kind: pa.DataType) -> None:
    raw_keys, raw_values = rows(3_000)
    text = pa.types.is_string(kind)
    keys = pa.array([None if k is None else k.decode() for k in raw_keys] if text else raw_keys, kind)
    values = pa.array([None if v is None else v.decode() for v in raw_values] if text else raw_values, kind)
    keys, values = keys.slice(500), values.slice(500)  # an offset into the buffers, as a batch of a larger array has
    by_python, by_c = make_topic(1), make_topic(1)
    for topic, loop in ((by_python, python_loop), (by_c, c_loop)):
        p = producer(stack)
        loop(p, topic, keys, values, "job/run/3/", b"run")
        p.commit_transaction(30)
    want, got = read_topic(stack.kafka_bootstrap, by_python), read_topic(stack.kafka_bootstrap, by_c)
    assert len(got) == 2_500
    assert [(r.key, r.value, r.headers) for r in got] == [(r.key, r.value, r.headers) for r in want]
    assert got[0].headers == {"eosink.id": "job/run/3/0", "eosink.run": "run"} and got[-1].id == "job/run/3/2499"


def test_c_loop_resumes_where_a_full_queue_stopped_it(stack, make_topic) -> None:
    topic = make_topic(3)
    keys = pa.array([f"k-{i:06d}".encode() for i in range(20_000)], pa.binary())
    values = pa.array([b'{"pad":"' + b"x" * 200 + b'"}'] * 20_000, pa.binary())
    p = producer(stack, **{"queue.buffering.max.messages": 1_000})
    assert c_loop(p, topic, keys, values, "j/r/0/", b"r") > 0, "the queue never filled: the test proves nothing"
    p.commit_transaction(60)
    got = read_topic(stack.kafka_bootstrap, topic)
    assert_exactly_once(got, [k.decode() for k in keys.to_pylist()])
    assert sorted(int(r.id.rsplit("/", 1)[1]) for r in got) == list(range(20_000))


def test_only_a_confluent_producer_is_bound_and_the_switch_turns_it_off(stack, monkeypatch) -> None:
    assert native.loop_for(b"x" * 64) is None and native.loop_for(object()) is None
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    assert native.loop_for(p) is not None
    monkeypatch.setenv(native.ENV, "0")
    assert native.loop_for(p) is None
    assert not native.NativeLoop.fits(pa.array([1]), pa.array([b"v"]))


def test_publisher_produces_in_c_unless_turned_off(spark, stack, make_topic, unique, monkeypatch) -> None:  # noqa: F811
    from pyspark.sql import functions as F

    from eosink.spark_jobs import publish_outbox

    df = spark.range(0, 4_000, 1, numPartitions=4).select(F.format_string("k-%06d", "id").alias("k"), F.col("id"))
    expected = [f"k-{i:06d}" for i in range(4_000)]
    for run_id, switch, c_rows in (("r1", None, 4_000), ("r2", "0", 0)):
        if switch is not None:
            monkeypatch.setenv(native.ENV, switch)
        topic = make_topic(2)
        res = publish_outbox(df, topic, key="k", job=unique, run_id=run_id, kafka=stack.kafka_bootstrap)
        assert res.records == 4_000 and sum(p.c_rows for p in res.partitions) == c_rows
        assert_exactly_once(read_topic(stack.kafka_bootstrap, topic), expected)
