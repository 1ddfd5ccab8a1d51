"""``Outbox(format="json-schema")`` against real Spark, the stack's Kafka and its Schema Registry (Apicurio).

Values are read back read_committed and decoded by confluent-kafka's ``JSONDeserializer`` (which
validates each against the registered schema), and delivered by a real worker with Kafka Connect's
``JsonSchemaConverter`` into a PostgreSQL table it creates, typed from that schema; a decimal is
refused before anything is published, naming the column; a new nullable column is a new version the
registry's BACKWARD rule takes.
"""

from __future__ import annotations

import datetime
import json

import pytest

from tests.conftest import RegistryServer
from tests.spark_fixtures import assert_exactly_once, ledger, read_topic, spark  # noqa: F401

pytestmark = pytest.mark.spark

AT = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def rows(spark, n: int, partitions: int = 2):  # noqa: F811 - the fixture is passed in
    """Row i: a long id, a string, a timestamp (micros), a date, a boolean, a double, binary, a string null for odd i,
    a nested struct, an array with a null element and a map."""
    from pyspark.sql import functions as F

    i = F.col("id")
    at = F.lit(AT.replace(tzinfo=None)).cast("timestamp") + F.make_interval(secs=i.cast("decimal(18,6)"))
    return spark.range(0, n, 1, numPartitions=partitions).select(
        i, F.format_string("n%d", i).alias("name"), at.alias("at"),
        F.date_add(F.lit("2026-01-01"), i.cast("int")).alias("day"), (i % 2 == 0).alias("ok"),
        (i.cast("double") / 4).alias("ratio"), F.concat(i.cast("string").cast("binary"), F.lit(bytearray(b"\x00\xff")))
        .alias("blob"), F.when(i % 2 == 0, F.lit("even")).alias("note"),
        F.struct(F.format_string("c%d", i % 3).alias("city")).alias("address"),
        F.array(i, F.lit(None).cast("long")).alias("list"), F.create_map(F.lit("a"), i).alias("dict"))


def expected(i: int) -> dict:
    import base64

    return {"id": i, "name": f"n{i}", "at": (AT + datetime.timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
            "day": (datetime.date(2026, 1, 1) + datetime.timedelta(days=i)).isoformat(), "ok": i % 2 == 0,
            "ratio": i / 4, "blob": base64.b64encode(str(i).encode() + b"\x00\xff").decode(),
            "note": None if i % 2 else "even", "address": {"city": f"c{i % 3}"}, "list": [i, None], "dict": {"a": i}}


def publish(stack, df, topic, unique, registry, run_id="r1"):
    from eosink.spark_jobs import Outbox, publish_outbox

    return publish_outbox(df, Outbox(topic, format="json-schema", registry=registry), key="id", job=unique,
                          run_id=run_id, kafka=stack.kafka_bootstrap)


def test_json_schema_outbox_rows_round_trip_through_the_registry_and_validate(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic, n = make_topic(2), 40
    assert publish(stack, rows(spark, n), topic, unique, registry.url).records == n
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "JSON"
    doc = json.loads(latest.schema.schema_str)
    assert doc["properties"]["at"] == {"type": ["string", "null"], "format": "date-time"}
    assert doc["properties"]["id"] == {"type": "integer"} and "note" not in doc["required"] and "id" in doc["required"]
    assert doc["additionalProperties"] is False

    records = read_topic(stack.kafka_bootstrap, topic)
    assert_exactly_once(records, [str(i) for i in range(n)])
    assert {int.from_bytes(r.value[1:5], "big") for r in records if r.value} == {latest.schema_id}, "one schema id"
    decode = JSONDeserializer(latest.schema.schema_str, schema_registry_client=client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    for r in records:
        assert r.value is not None and r.value[0] == 0
        assert decode(r.value, ctx) == expected(int(r.key or -1)), r.key


def test_json_schema_outbox_delivered_by_a_worker_into_a_typed_table_once_each(
        spark, stack, registry: RegistryServer, make_topic, unique, pg, tmp_path) -> None:  # noqa: F811 - the fixture is passed in
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids

    topic, n = make_topic(3), 300
    df = rows(spark, n, partitions=3).drop("blob", "list", "dict")
    assert publish(stack, df, topic, unique, registry.url).records == n
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), {
        "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
        "table.name.format": unique, "auto.create": "true", "commit.interval.ms": "300",
        "value.converter": "io.confluent.connect.json.JsonSchemaConverter",
        "value.converter.schema.registry.url": registry.url})
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= n, 90, f"{n} rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert sorted(pg_ids(pg, unique)) == list(range(n)), "not every id exactly once"
    types = dict(pg.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
                            (unique,)).fetchall())
    assert {k: types[k] for k in ("id", "at", "day", "ok", "ratio", "note", "address")} == {
        "id": "bigint", "at": "timestamp with time zone", "day": "date", "ok": "boolean",
        "ratio": "double precision", "note": "text", "address": "jsonb"}, types
    row = pg.execute(f'SELECT id, name, at, day, ok, ratio, note, address FROM "{unique}" WHERE id = 7').fetchone()
    assert row == (7, "n7", AT + datetime.timedelta(seconds=7), datetime.date(2026, 1, 8), False, 1.75, None,
                   {"city": "c1"})


def test_json_schema_outbox_of_a_decimal_is_refused_naming_the_column(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import functions as F

    from eosink.spark_jobs.errors import UnsupportedTypeError

    topic = make_topic(1)
    df = rows(spark, 5).select("id", F.struct((F.col("id") / 100).cast("decimal(10,2)").alias("amount")).alias("sum"))
    with pytest.raises(UnsupportedTypeError) as err:
        publish(stack, df, topic, unique, registry.url)
    assert err.value.column == "sum.amount" and "format='avro'" in str(err.value), err.value
    assert read_topic(stack.kafka_bootstrap, topic) == [] and ledger(stack.kafka_bootstrap, unique, "r1") == {}
    assert f"{topic}-value" not in SchemaRegistryClient({"url": registry.url, "timeout": 30}).get_subjects(), "registered anyway"


def test_json_schema_outbox_adding_a_nullable_column_is_a_compatible_new_version(
        spark, stack, registry: RegistryServer, make_topic, unique) -> None:  # noqa: F811 - the fixture is passed in
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = make_topic(1)
    subject = f"{topic}-value"
    client = SchemaRegistryClient({"url": registry.url, "timeout": 30})
    client.set_compatibility(subject, "BACKWARD")
    assert publish(stack, rows(spark, 5).select("id", "name"), topic, unique, registry.url).records == 5
    assert publish(stack, rows(spark, 5).select("id", "name", "note"), topic, unique, registry.url, "r2").records == 5
    assert len(client.get_versions(subject)) == 2
    assert len(read_topic(stack.kafka_bootstrap, topic)) == 10
