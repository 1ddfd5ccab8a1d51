"""``Outbox(format="avro")`` against real Spark, the stack's Kafka and its Schema Registry (Apicurio).

Values are read back read_committed and decoded by confluent-kafka's ``AvroDeserializer`` (the
reference reader of Confluent's wire format), and delivered by a real worker with Kafka Connect's
``AvroConverter`` into PostgreSQL; bad input is refused before anything is published, naming what
to fix.
"""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from tests.conftest import RegistryServer
from tests.spark_fixtures import assert_exactly_once, ledger, read_topic, spark  # noqa: F401

pytestmark = pytest.mark.spark

AT = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)
COLUMNS = "id bigint, name text, amount numeric(10,2), at timestamptz, blob bytea, note text, city text"


def orders(spark, n: int, partitions: int = 2):  # noqa: F811 - the fixture is passed in
    """Row i: long id, string, decimal(10,2), timestamp (micros), binary, a string null for odd i, a nested struct."""
    from pyspark.sql import functions as F

    at = F.lit(AT.replace(tzinfo=None)).cast("timestamp") + F.make_interval(secs=F.col("id").cast("decimal(18,6)"))
    return spark.range(0, n, 1, numPartitions=partitions).select(
        F.col("id"),
        F.format_string("n%d", "id").alias("name"),
        (F.col("id").cast("decimal(10,2)") / 100 + 1).cast("decimal(10,2)").alias("amount"),
        at.alias("at"),
        F.concat(F.col("id").cast("string").cast("binary"), F.lit(bytearray(b"\x00\xff"))).alias("blob"),
        F.when(F.col("id") % 2 == 0, F.lit("even")).alias("note"),
        F.struct(F.format_string("c%d", F.col("id") % 3).alias("city"),
                 F.when(F.col("id") % 3 == 0, F.col("id")).alias("zip")).alias("address"),
    )


def more_types(spark, n: int):  # noqa: F811 - the fixture is passed in
    """The rest of the mapping: arrays (a null element), maps, short, float, boolean, date, timestamp_ntz, NULL."""
    from pyspark.sql import functions as F

    i = F.col("id")
    return orders(spark, n).select(
        "id", F.array(i, F.lit(None).cast("long"), i * 2).alias("list"),
        F.create_map(F.lit("a"), i.cast("double") / 4, F.lit("b"), F.lit(None).cast("double")).alias("dict"),
        F.array(F.struct(i.alias("x"))).alias("points"), i.cast("short").alias("small"),
        (i.cast("float") / 2).alias("ratio"), (i % 2 == 0).alias("ok"), F.date_add(F.lit("2026-01-01"), i.cast("int"))
        .alias("day"), F.make_timestamp_ntz(F.lit(2026), F.lit(1), F.lit(2), F.lit(3), F.lit(4), F.lit(5.25)).alias("local"),
        F.lit(None).alias("nothing"))


def expected_more(i: int) -> dict:
    return {"id": i, "list": [i, None, 2 * i], "dict": {"a": i / 4, "b": None}, "points": [{"x": i}], "small": i,
            "ratio": i / 2, "ok": i % 2 == 0, "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
            "local": datetime.datetime(2026, 1, 2, 3, 4, 5, 250000), "nothing": None}


def expected(i: int) -> dict:
    return {"id": i, "name": f"n{i}", "amount": decimal.Decimal(i) / 100 + 1,
            "at": AT + datetime.timedelta(seconds=i), "blob": str(i).encode() + b"\x00\xff",
            "note": None if i % 2 else "even", "address": {"city": f"c{i % 3}", "zip": i if i % 3 == 0 else None}}


def publish(spark, stack, df, topic, unique, registry, run_id="r1", **outbox):  # noqa: F811
    from eosink.spark_jobs import Outbox, publish_outbox

    return publish_outbox(df, Outbox(topic, format="avro", registry=registry, **outbox), key="id", job=unique,
                          run_id=run_id, kafka=stack.kafka_bootstrap)


def test_avro_outbox_rows_round_trip_through_the_registry_exactly(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic, n = make_topic(2), 50
    res = publish(spark, stack, orders(spark, n), topic, unique, registry.url)
    assert (res.status, res.records) == ("published", n)
    again = publish(spark, stack, orders(spark, n), topic, unique, registry.url, run_id="r2")  # looks the schema up
    assert again.records == n

    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    latest = client.get_latest_version(f"{topic}-value")
    fields = {f["name"]: f["type"] for f in json.loads(latest.schema.schema_str)["fields"]}
    assert fields["amount"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}]
    assert fields["at"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    assert fields["note"] == ["null", "string"] and fields["id"] == "long"

    records = read_topic(stack.kafka_bootstrap, topic)
    assert_exactly_once([r for r in records if r.headers["eosink.run"] == "r1"], [str(i) for i in range(n)])
    assert len(records) == 2 * n
    assert {int.from_bytes(r.value[1:5], "big") for r in records if r.value} == {latest.schema_id}, "one schema id"
    decode = AvroDeserializer(client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    for r in records:
        assert r.value is not None and r.value[0] == 0
        assert decode(r.value, ctx) == expected(int(r.key or -1)), r.key


def test_avro_outbox_arrays_maps_dates_and_the_small_types_round_trip_exactly(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic, n = make_topic(1), 20
    assert publish(spark, stack, more_types(spark, n), topic, unique, registry.url).records == n
    records = read_topic(stack.kafka_bootstrap, topic)
    assert_exactly_once(records, [str(i) for i in range(n)])
    decode = AvroDeserializer(SchemaRegistryClient({"url": registry.url, "timeout": 30}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    for r in records:
        assert decode(r.value, ctx) == expected_more(int(r.key or -1)), r.key


def test_avro_outbox_delivered_by_a_worker_into_postgres_once_each(
        spark, stack, registry: RegistryServer, make_topic, unique, pg, tmp_path) -> None:  # noqa: F811 - the fixture is passed in
    from eosink.spark_jobs import Outbox, publish_outbox
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids

    topic, n = make_topic(3), 600
    df = orders(spark, n, partitions=3).selectExpr("*", "address.city AS city").drop("address")
    res = publish_outbox(df, Outbox(topic, format="avro", registry={"schema.registry.url": registry.url}), key="id",
                         job=unique, run_id="r1", kafka=stack.kafka_bootstrap, partitions=3)
    assert res.records == n
    pg.execute(f'CREATE TABLE "{unique}" ({COLUMNS})')
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), {
        "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
        "table.name.format": unique, "value.converter": "io.confluent.connect.avro.AvroConverter",
        "value.converter.schema.registry.url": registry.url, "commit.interval.ms": "300"})
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= n, 90, f"{n} rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert sorted(pg_ids(pg, unique)) == list(range(n)), "not every id exactly once"
    row = pg.execute(f'SELECT id, name, amount, at, blob, note, city FROM "{unique}" WHERE id = 7').fetchone()
    e = expected(7)
    assert row == (7, "n7", e["amount"], e["at"], e["blob"], None, "c1")


def _refused(spark, stack, topic, unique, registry, df=None):  # noqa: F811
    """The error of a refused publish; the topic and the ledger stay empty."""
    from eosink.connectors.api.errors import EosinkError

    with pytest.raises(EosinkError) as err:
        publish(spark, stack, df if df is not None else orders(spark, 10), topic, unique, registry)
    assert read_topic(stack.kafka_bootstrap, topic) == [], "records published by a refused call"
    assert ledger(stack.kafka_bootstrap, unique, "r1") == {}
    return err.value


def test_avro_outbox_without_a_registry_url_is_refused_naming_the_option(
        spark, stack, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from eosink.connectors.api.errors import ConfigError

    err = _refused(spark, stack, make_topic(1), unique, None)
    assert isinstance(err, ConfigError) and err.key == "registry" and "schema.registry.url" in str(err), err


def test_avro_outbox_with_an_unreachable_registry_is_refused_naming_the_url(
        spark, stack, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from eosink.spark_jobs.errors import RegistryUnreachableError

    url = "http://127.0.0.1:9/apis/ccompat/v7"  # the discard port: nothing listens
    err = _refused(spark, stack, make_topic(1), unique, url)
    assert isinstance(err, RegistryUnreachableError) and url in str(err), err


def test_avro_outbox_with_an_incompatible_schema_is_refused_naming_the_subject(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from eosink.spark_jobs.avro import record_name
    from eosink.spark_jobs.errors import SchemaRejectedError

    topic = make_topic(1)
    subject = f"{topic}-value"
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    client.set_compatibility(subject, "BACKWARD")
    earlier = {"type": "record", "name": record_name(topic), "namespace": "eosink.outbox",
               "fields": [{"name": "id", "type": "string"}, {"name": "name", "type": "string"}]}
    client.register_schema(subject, Schema(json.dumps(earlier), "AVRO"))
    err = _refused(spark, stack, topic, unique, registry.url, orders(spark, 10).select("id", "name"))
    assert isinstance(err, SchemaRejectedError) and f"'{subject}'" in str(err) and "409" in str(err), err


def test_avro_outbox_of_a_type_without_avro_mapping_is_refused_naming_the_column(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from pyspark.sql import functions as F

    from eosink.spark_jobs.errors import UnsupportedTypeError

    topic = make_topic(1)
    df = orders(spark, 10).select("id", F.struct(F.make_interval(days=F.lit(1)).alias("wait")).alias("sla"))
    err = _refused(spark, stack, topic, unique, registry.url, df)
    assert isinstance(err, UnsupportedTypeError) and err.column == "sla.wait" and "interval" in str(err), err
    from confluent_kafka.schema_registry import SchemaRegistryClient

    assert f"{topic}-value" not in SchemaRegistryClient({"url": registry.url, "timeout": 30}).get_subjects(), "registered anyway"


def test_avro_outbox_stream_publishes_every_micro_batch_once_under_one_schema_id(
        spark, stack, registry: RegistryServer, make_topic, unique, tmp_path) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from eosink.spark_jobs import Outbox, publish_outbox_stream
    from tests.stream_driver import source_frame

    source, outbox, n = make_topic(2), make_topic(2), 250
    p = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    for i in range(n):
        p.produce(source, json.dumps({"n": i}).encode(), f"k-{i:06d}".encode())
    assert p.flush(30) == 0
    df = source_frame(spark, stack.kafka_bootstrap, source, 100)  # three micro-batches or more
    query = publish_outbox_stream(df, Outbox(outbox, value=["k", "value"], format="avro", registry=registry.url),
                                  key="k", job=unique, checkpoint=str(tmp_path / "ck"), kafka=stack.kafka_bootstrap,
                                  trigger={"availableNow": True})
    assert query.awaitTermination(120), "the query did not drain its source in time"
    assert len(query.recentProgress) >= 3

    records = read_topic(stack.kafka_bootstrap, outbox)
    assert_exactly_once(records, [f"k-{i:06d}" for i in range(n)])
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    assert {int.from_bytes(r.value[1:5], "big") for r in records if r.value} == {
        client.get_latest_version(f"{outbox}-value").schema_id}
    decode, ctx = AvroDeserializer(client), SerializationContext(outbox, MessageField.VALUE)
    for r in records:
        assert decode(r.value, ctx) == {"k": r.key, "value": json.dumps({"n": int((r.key or "")[2:])})}
