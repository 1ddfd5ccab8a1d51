"""What a registration may say: every key means something, nothing is silently ignored, and no
override can weaken exactly-once. Checked where registrations are validated (the REST API's
create, update and validate, and ``eosink connectors apply``), without a server."""

from __future__ import annotations

import json

import pytest

from eosink.connectors.api.errors import ConfigError
from eosink.worker.control import plugins
from eosink.worker.control.config import load_connector_file, parse_connector

PG = {"connector.class": "postgres", "topics": "orders", "connection.url": "postgresql://x@127.0.0.1:1/db"}


def _refused(config: dict, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_connector("c", config, resolve=False, **kw)
    return err.value


def test_a_misspelt_key_is_refused_with_the_closest_known_key():
    err = _refused({**PG, "tabel.name.format": "orders_${topic}"})
    assert err.key == "tabel.name.format" and "did you mean 'table.name.format'" in str(err)


def test_a_misspelt_key_under_a_fanout_sink_is_refused_with_its_full_name():
    config = {"connector.class": "fanout", "topics": "orders", "sinks": "db",
              **{f"sinks.db.{k}": v for k, v in PG.items() if k != "topics"}, "sinks.db.insert.mdoe": "upsert"}
    err = _refused(config)
    assert err.key == "sinks.db.insert.mdoe" and "did you mean 'sinks.db.insert.mode'" in str(err)


@pytest.mark.parametrize("prop", ["isolation.level", "enable.auto.commit", "group.id", "bootstrap.servers",
                                  "partition.assignment.strategy"])
def test_an_override_that_would_break_exactly_once_or_ownership_is_refused_with_the_reason(prop):
    err = _refused({**PG, f"consumer.override.{prop}": "read_uncommitted" if prop == "isolation.level" else "x"})
    assert err.key == f"consumer.override.{prop}" and "cannot be overridden" in str(err)
    if prop == "isolation.level":
        assert "aborted transactions" in str(err)


def test_consumer_override_auto_offset_reset_is_honoured():
    cfg = parse_connector("c", {**PG, "consumer.override.auto.offset.reset": "largest"}, resolve=False)
    assert cfg.settings["consumer.auto.offset.reset"] == "latest"
    err = _refused({**PG, "consumer.override.auto.offset.reset": "none"})
    assert "earliest or latest" in str(err)


def test_librdkafka_judges_passed_through_overrides_at_registration():
    assert parse_connector("c", {**PG, "consumer.override.fetch.min.bytes": "100"}, resolve=False, check_clients=True)
    misspelt = _refused({**PG, "consumer.override.fetch.min.bytz": "100"}, check_clients=True)
    assert misspelt.key == "consumer.override.fetch.min.bytz" and "No such configuration property" in str(misspelt)
    producer_only = _refused({**PG, "consumer.override.acks": "all"}, check_clients=True)
    assert "would ignore" in str(producer_only)


def test_a_converter_eosink_cannot_decode_is_refused_at_registration_not_at_task_start():
    err = _refused({**PG, "value.converter": "com.example.XmlConverter"})
    assert err.key == "value.converter" and "XmlConverter" in str(err) and "AvroConverter" in str(err)
    err = _refused({**PG, "key.converter": "thrift"})
    assert err.key == "key.converter"
    err = _refused({**PG, "value.converter": "io.confluent.connect.avro.AvroConverter"})
    assert err.key == "value.converter.schema.registry.url" and "AvroConverter" in str(err)
    registry = parse_connector("c", {**PG, "key.converter": "protobuf", "key.converter.schema.registry.url": "http://r"},
                               resolve=False)
    assert registry.key_converter == "protobuf" and registry.registry("key") == {
        "schema.registry.url": "http://r", "basic.auth.credentials.source": "", "basic.auth.user.info": "",
        "schema.registry.ssl.ca.location": ""}
    ok = parse_connector("c", {**PG, "key.converter": "org.apache.kafka.connect.json.JsonConverter",
                               "value.converter.schemas.enable": "true"}, resolve=False)
    assert ok.key_converter == "json" and ok.settings["value.converter.schemas.enable"] is True


def test_a_registry_ca_that_is_missing_or_not_a_pem_certificate_is_refused_at_registration(tmp_path):
    avro = {**PG, "value.converter": "avro", "value.converter.schema.registry.url": "https://127.0.0.1:1"}
    key = "value.converter.schema.registry.ssl.ca.location"
    missing = _refused({**avro, key: str(tmp_path / "absent.pem")})
    assert missing.key == key and "absent.pem" in str(missing)
    garbage = tmp_path / "not-a-ca.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    bad = _refused({**avro, key: str(garbage)})
    assert bad.key == key and "not-a-ca.pem" in str(bad) and "not a PEM CA certificate" in str(bad)
    ca = tmp_path / "ca.pem"
    ca.write_text(_self_signed_ca())
    accepted = parse_connector("c", {**avro, key: str(ca)}, resolve=False)
    assert accepted.registry("value")["schema.registry.ssl.ca.location"] == str(ca)


def _self_signed_ca() -> str:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_topics_and_topics_regex_are_exclusive_and_the_regex_must_compile():
    assert parse_connector("c", {**{k: v for k, v in PG.items() if k != "topics"}, "topics.regex": "orders-.*"},
                           resolve=False).topics_regex == "orders-.*"
    assert _refused({**PG, "topics.regex": "orders-.*"}).key == "topics"
    assert _refused({k: v for k, v in PG.items() if k != "topics"}).key == "topics"
    assert _refused({**{k: v for k, v in PG.items() if k != "topics"}, "topics.regex": "orders-("}).key == "topics.regex"


@pytest.mark.parametrize("key,hint", [("producer.override.acks", "produce nothing"),
                                      ("header.converter", "as bytes")])
def test_connect_keys_that_mean_nothing_here_are_refused_with_why(key, hint):
    err = _refused({**PG, key: "x"})
    assert err.key == key and hint in str(err)


def test_transform_keys_are_checked_when_the_connector_is_registered():
    err = _refused({**PG, "transforms": "mask", "transforms.mask.type": "MaskField$Value", "transforms.mask.feilds": "email"})
    assert err.key == "transforms.mask.feilds" and "did you mean" in str(err)
    assert parse_connector("c", {**PG, "transforms": "mask", "transforms.mask.type": "MaskField$Value",
                                 "transforms.mask.fields": "email"}, resolve=False)


def test_validate_endpoint_counts_an_unknown_key_as_an_error():
    plugin = next(p for p in plugins.plugins() if p.alias == "postgres")
    infos = plugins.validate(plugin, {**PG, "name": "c", "tabel.name.format": "x"})
    assert infos["error_count"] == 1
    errors = {c["value"]["name"]: c["value"]["errors"] for c in infos["configs"] if c["value"]["errors"]}
    assert list(errors) == ["tabel.name.format"] and "table.name.format" in errors["tabel.name.format"][0]


def test_connectors_apply_refuses_an_unknown_key_naming_the_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"name": "c", "config": {**PG, "tabel.name.format": "x"}}))
    with pytest.raises(ConfigError) as err:
        load_connector_file(f, resolve=False)
    assert str(f) in str(err.value) and "tabel.name.format" in str(err.value)


def test_every_registration_the_docs_show_is_valid():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    pages = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    blocks = [json.loads(b) for page in pages for b in re.findall(r"```json\n(.*?)```", page.read_text(), re.S)
              if '"connector.class"' in b]
    blocks += [json.loads(f.read_text()) for f in sorted((repo / "configs").rglob("*.json"))]
    assert len(blocks) >= 5
    for doc in blocks:
        parse_connector(doc["name"], doc["config"], resolve=False, check_clients=True)


def test_keys_of_a_transform_alias_the_chain_does_not_list_are_refused_not_ignored():
    err = _refused({**PG, "transforms": "mask", "transforms.mask.type": "MaskField$Value", "transforms.mask.fields": "email",
                    "transforms.route.type": "RegexRouter"})
    assert err.key == "transforms.route.type" and "does not list" in str(err)
    err = _refused({**PG, "predicates.p.type": "HasHeaderKey"})
    assert err.key == "predicates.p.type"


FS = {"connector.class": "filesystem", "topics": "orders", "file.path": "/tmp/out"}


@pytest.mark.parametrize(("config", "expected_ms"), [
    (PG, 250),  # rows: a caught-up cycle commits once 250 ms old
    ({**PG, "commit.interval.ms": "100"}, 100),  # never past the full interval
    (FS, 1000),  # a file per transaction: no early end, or a trickle makes a file every 250 ms
    ({**FS, "commit.interval.ms": "60000"}, 60000),
    ({**FS, "commit.min.interval.ms": "500"}, 500),  # as set, whatever the sink
    ({**PG, "commit.min.interval.ms": "0"}, 0),
    ({"connector.class": "fanout", "topics": "orders", "sinks": "db,files",
      **{f"sinks.db.{k}": v for k, v in PG.items() if k != "topics"},
      **{f"sinks.files.{k}": v for k, v in FS.items() if k != "topics"}}, 1000),  # the most patient sink wins
], ids=["postgres", "postgres-short-interval", "filesystem", "filesystem-long-interval", "filesystem-set",
        "postgres-zero", "fanout-postgres-filesystem"])
def test_a_caught_up_cycle_ends_early_only_where_a_transaction_makes_no_file(config, expected_ms):
    assert parse_connector("c", config, resolve=False).commit_min_interval_ms == expected_ms
