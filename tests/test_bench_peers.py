"""The records bench/bench_peers.py gives both sides: Kafka Connect's JSON envelope whose schema
describes its payload, and which eosink's converter unwraps into the very order.

No server: the benchmark itself (JVMs, a worker, the stack) runs with ``make bench-peers``.
"""

from __future__ import annotations

import json

from bench._data import order
from bench._peers_setup import SCHEMA, debezium_config, envelope, eosink_pg_config, jdbc_url
from eosink.worker.engine.converters import converter

CONNECT_TYPES = {"int64": int, "double": float, "string": str}


def test_eosink_unwraps_the_envelope_into_the_order_its_schema_describes() -> None:
    decode = converter("json", schemas_enable=True)
    for i in (0, 1, 7, 99_990, 1_000_003):
        doc = json.loads(envelope(i))
        assert doc["schema"] == SCHEMA
        assert decode(envelope(i)) == order(i) == doc["payload"]
        fields = {f["field"]: f for f in SCHEMA["fields"]}
        assert list(fields) == list(order(i))
        for name, value in order(i).items():
            assert isinstance(value, CONNECT_TYPES[fields[name]["type"]]), name
            assert not fields[name]["optional"]


def test_both_sides_are_configured_for_the_same_mode_and_key() -> None:
    dsn = "postgresql://eosink@127.0.0.1:15432/eosink"
    assert jdbc_url(dsn, "?x=1") == ("jdbc:postgresql://127.0.0.1:15432/eosink?x=1", "eosink", "")
    for mode in ("insert", "upsert"):
        peer, ours = debezium_config("c", dsn, "t", "tab", mode), eosink_pg_config(dsn, "t", "tab", mode)
        assert peer["insert.mode"] == ours["insert.mode"] == mode
        assert peer["tasks.max"] == int(ours["tasks.max"]) == 1
        assert ours["value.converter.schemas.enable"] == "true"
        keyed = mode == "upsert"
        assert (peer["primary.key.mode"] == "record_value") is keyed
        assert (ours.get("pk.mode") == "record_value") is keyed
        if keyed:
            assert peer["primary.key.fields"] == ours["pk.fields"] == "id"


def test_the_avro_topic_is_read_by_both_sides_through_the_same_registry() -> None:
    from pathlib import Path

    from bench._peers_proc import connect_worker_props
    from bench._peers_setup import APICURIO_CONVERTER, apicurio_api, connect_avro_worker

    dsn, url = "postgresql://eosink@127.0.0.1:15432/eosink", "http://127.0.0.1:18081/apis/ccompat/v7"
    assert apicurio_api(url) == "http://127.0.0.1:18081/apis/registry/v2"
    worker = connect_worker_props("k:9092", Path("/c"), Path("/p"), {"consumer.max.poll.records": 5, **connect_avro_worker(url)})
    assert worker["value.converter"] == APICURIO_CONVERTER
    assert "value.converter.schemas.enable" not in worker  # a JsonConverter key, dropped
    assert worker["value.converter.apicurio.registry.url"] == apicurio_api(url)
    # Confluent's framing: no headers, a 4-byte id read as the content id the Confluent API hands out.
    assert worker["value.converter.apicurio.registry.headers.enabled"] == "false"
    assert worker["value.converter.apicurio.registry.id-handler"].endswith("Legacy4ByteIdHandler")
    assert worker["value.converter.apicurio.registry.use-id"] == "contentId"
    ours = eosink_pg_config(dsn, "t", "tab", "insert", url)
    assert ours["value.converter"] == "io.confluent.connect.avro.AvroConverter"
    assert ours["value.converter.schema.registry.url"] == url
    assert "value.converter.schemas.enable" not in ours
