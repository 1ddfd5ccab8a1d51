"""Connector configurations in Kafka Connect's shape, and the keys the engine itself reads.

A registration is ``{"name": ..., "config": {"connector.class": ..., "topics": ..., ...}}``;
``connector.class`` is a short alias (``postgres``, ``s3``, ``iceberg``, ``http``,
``filesystem``, ``memory``, ``fanout``) or a dotted path to a
:class:`~eosink.connectors.api.sink.TwoPhaseCommitSink` subclass.

A ``fanout`` connector delivers one outbox into several sinks in one transaction (all prepare,
one decision, all commit). Its sinks are named in ``sinks`` and configured under a prefix, the
way Kafka Connect configures ``transforms.<alias>.*``::

    "connector.class": "fanout", "sinks": "db,files",
    "sinks.db.connector.class": "postgres", "sinks.db.connection.url": "...",
    "sinks.files.connector.class": "filesystem", "sinks.files.file.path": "/data/out"

Values may reference ``${env:VAR}`` and ``${file:/path/to/props:key}`` (config providers), so
secrets stay out of the JSON files.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eosink.connectors.api.config import MASK, ConfigDef, Importance, Type, at_least, non_empty, one_of
from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker.control import keys
from eosink.worker.engine.registry_converters import FORMATS
from eosink.worker.engine.registry_converters import SETTINGS as REGISTRY_SETTINGS
from eosink.worker.transforms import validate_chain

ALIASES: dict[str, str] = {
    "memory": "eosink.connectors.memory.MemorySink",
    "filesystem": "eosink.connectors.filesystem.FilesystemSink",
    "postgres": "eosink.connectors.postgres.sink.PostgresSink",
    "s3": "eosink.connectors.s3.sink.S3Sink",
    "iceberg": "eosink.connectors.iceberg.sink.IcebergSink",
    "http": "eosink.connectors.http.sink.HttpSink",
}
FANOUT = "fanout"

_CONVERTER_ALIASES = {
    "org.apache.kafka.connect.json.JsonConverter": "json",
    "org.apache.kafka.connect.storage.StringConverter": "string",
    "org.apache.kafka.connect.converters.ByteArrayConverter": "bytes",
    **FORMATS,
}
#: What ``key.converter`` / ``value.converter`` may name (besides the class names above).
_CONVERTERS = ("json", "string", "bytes", *FORMATS.values())



def _converter(key: str, value: Any) -> None:
    if _CONVERTER_ALIASES.get(value, value) not in _CONVERTERS:
        raise ConfigError(f"{value!r} is not a converter eosink can decode: {', '.join(_CONVERTERS)}, or Kafka Connect's "
                          f"{', '.join(sorted(_CONVERTER_ALIASES))}", key=key)


def _registry_keys(cdef: ConfigDef) -> ConfigDef:
    """The Schema Registry keys of Confluent's converters, for values and for keys."""
    for side in ("value", "key"):
        p = f"{side}.converter."
        cdef = (cdef
                .define(p + "schema.registry.url", Type.STRING, "", f"Avro, Protobuf and JSON Schema {side}s: the Schema "
                        "Registry's URL (Confluent's API; the local stack's is registry.url in endpoints.json).",
                        Importance.MEDIUM)
                .define(p + "basic.auth.credentials.source", Type.STRING, "", "USER_INFO: the registry's basic-auth "
                        f"credentials are {p}basic.auth.user.info; URL: they are in the URL (http://user:password@host).",
                        Importance.LOW, one_of("", "USER_INFO", "URL"))
                .define(p + "basic.auth.user.info", Type.PASSWORD, "", "user:password for the Schema Registry, with "
                        "basic.auth.credentials.source=USER_INFO (best as a ${file:...} reference).", Importance.LOW)
                .define(p + "schema.registry.ssl.ca.location", Type.STRING, "", "A PEM file of the CA(s) an https "
                        "Schema Registry's certificate is verified against (default: the system's trust store); "
                        "Java's truststore keys take JKS, this takes PEM, as confluent-kafka's ssl.ca.location.",
                        Importance.LOW, _pem_ca))
    return cdef


def _pem_ca(key: str, value: Any) -> None:
    """Checked where the config is registered: a missing or non-PEM file would otherwise first fail as
    a handshake error when a task fetches its first schema."""
    if value:
        from eosink.worker.control.rest.tls import ca_file

        ca_file(str(value), key)


def _regex(key: str, value: Any) -> None:
    if value:
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(f"{value!r} is not a regular expression: {exc}", key=key) from None


#: Keys the engine reads for every connector, whatever its class.
COMMON = (
    ConfigDef()
    .define("connector.class", Type.STRING, doc="Alias or dotted path of the sink class.", importance=Importance.HIGH, validator=non_empty)
    .define("topics", Type.LIST, [], "Outbox topics to deliver, comma-separated (or topics.regex).", importance=Importance.HIGH)
    .define("topics.regex", Type.STRING, "", "Deliver every topic whose whole name matches this regular expression (Java "
            "syntax as far as Python's re shares it); topics created later are picked up without a restart, within a "
            "poll interval. Exactly one of topics and topics.regex.", Importance.HIGH, _regex)
    .define("tasks.max", Type.INT, 1, "At most this many workers consume the connector at once.", validator=at_least(1))
    .define("commit.interval.ms", Type.LONG, 1000, "Cycle length: the longest a record waits before its commit.", validator=at_least(10))
    .define("commit.min.interval.ms", Type.LONG, None, "A cycle that has read everything available (each partition "
            "at its last stable offset) commits once it is this old instead of waiting out commit.interval.ms: records "
            "are delivered sooner, and a trickle still makes at most one transaction per this long. >= "
            "commit.interval.ms: every cycle runs its full interval. Unset: 250 where every sink's transaction makes "
            "rows or requests (postgres, http, memory); commit.interval.ms where one makes a file, object or snapshot "
            "(filesystem, s3, iceberg, a fanout holding one), which ending early at low traffic would make small. "
            "A cycle that has read everything available and holds half of batch.max.records or batch.max.bytes "
            "commits at once whatever this says.",
            validator=at_least(0))
    .define("batch.max.records", Type.INT, 200_000, "A cycle commits early once it holds this many records.", validator=at_least(1))
    .define("batch.max.bytes", Type.LONG, 64 * 1024 * 1024, "A cycle commits early once it holds this many value bytes.",
            validator=at_least(1))
    .define("value.converter", Type.STRING, "json", "json | string | bytes | avro | protobuf | jsonschema (or Kafka "
            "Connect's and Confluent's class names, e.g. io.confluent.connect.avro.AvroConverter).",
            validator=_converter)
    .define("value.converter.schemas.enable", Type.BOOLEAN, False, "JSON only: values are Kafka Connect's "
            "{\"schema\": ..., \"payload\": ...} envelope and the payload is delivered.")
    .define("key.converter", Type.STRING, "bytes", "How record keys reach transforms and sinks: bytes (as on the topic), "
            "string, json, avro, protobuf or jsonschema (or Kafka Connect's and Confluent's class names). "
            "pk.mode=record_key reads it.", validator=_converter)
    .define("consumer.auto.offset.reset", Type.STRING, "earliest", "Where to start a partition no decision names yet.",
            validator=one_of("earliest", "latest"))
    # -- bad records and errors, as Kafka Connect names them (see worker/engine/deadletter.py) --------------------------
    .define("errors.tolerance", Type.STRING, "none", "none: a record that cannot be converted or that a sink rejects "
            "fails the task (the reason is in /status). all: it goes to the dead-letter topic, exactly once, in the "
            "same cycle, and the partition moves on.", Importance.MEDIUM, one_of("none", "all"))
    .define("errors.deadletterqueue.topic.name", Type.STRING, "", "Dead-letter topic; required with errors.tolerance=all "
            "(a tolerated record is never dropped silently). Created when missing.", Importance.MEDIUM)
    .define("errors.deadletterqueue.topic.replication.factor", Type.INT, -1, "Replication factor of the dead-letter topic "
            "when it is created; -1 = the broker's default.", Importance.LOW)
    .define("errors.deadletterqueue.context.headers.enable", Type.BOOLEAN, True, "Add __connect.errors.* headers (topic, "
            "partition, offset, stage, exception class and message) to each dead-letter record.", Importance.LOW)
    .define("errors.retry.timeout", Type.LONG, -1, "How long a cycle that keeps failing with a retryable sink error is "
            "retried, in ms, before the task fails; -1 = forever, 0 = fail at the first error.", Importance.MEDIUM,
            at_least(-1))
    .define("errors.retry.delay.max.ms", Type.LONG, 10_000, "Longest backoff between retries of a failed cycle "
            "(exponential with jitter up to this).", Importance.MEDIUM, at_least(1))
    .define("errors.log.enable", Type.BOOLEAN, False, "Log every tolerated bad record (topic, partition, offset, error).",
            Importance.LOW)
    .define("errors.log.include.messages", Type.BOOLEAN, False, "With errors.log.enable: also log the record's key and "
            "value.", Importance.LOW)
)

COMMON = _registry_keys(COMMON)

_REF = re.compile(r"\$\{(env|file):([^}]*)\}")


def resolve_providers(value: Any, *, key: str, source: str | None = None) -> Any:
    """Expand ``${env:VAR}`` and ``${file:path:key}`` in a string value."""
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "env":
            if arg not in os.environ:
                raise ConfigError(f"environment variable {arg} referenced by ${{env:{arg}}} is not set", key=key, source=source)
            return os.environ[arg]
        path, _, prop = arg.rpartition(":")
        if not path:
            raise ConfigError(f"${{file:{arg}}} needs the form ${{file:/path:key}}", key=key, source=source)
        try:
            for line in Path(path).read_text().splitlines():
                k, sep, v = line.partition("=")
                if sep and k.strip() == prop:
                    return v.strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", key=key, source=source) from None
        raise ConfigError(f"key {prop!r} not found in {path}", key=key, source=source)

    return _REF.sub(sub, value)


def load_class(name: str, *, key: str = "connector.class", source: str | None = None) -> type[TwoPhaseCommitSink]:
    path = ALIASES.get(name, name)
    module_name, _, cls_name = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"unknown connector class {name!r}; aliases: {', '.join(sorted([*ALIASES, FANOUT]))}", key=key, source=source)
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load connector class {name!r}: {exc}", key=key, source=source) from None
    if not (isinstance(cls, type) and issubclass(cls, TwoPhaseCommitSink)):
        raise ConfigError(f"{name!r} is not a TwoPhaseCommitSink", key=key, source=source)
    return cls


@dataclass(frozen=True)
class SinkSpec:
    alias: str
    cls: type[TwoPhaseCommitSink]
    config: dict[str, Any]


@dataclass(frozen=True)
class ConnectorConfig:
    name: str
    raw: dict[str, Any]
    settings: dict[str, Any]
    sinks: tuple[SinkSpec, ...]

    @property
    def topics(self) -> list[str]:
        return self.settings["topics"]

    @property
    def topics_regex(self) -> str:
        return self.settings["topics.regex"]

    @property
    def value_converter(self) -> str:
        v = self.settings["value.converter"]
        return _CONVERTER_ALIASES.get(v, v)

    @property
    def key_converter(self) -> str:
        v = self.settings["key.converter"]
        return _CONVERTER_ALIASES.get(v, v)

    def registry(self, side: str) -> dict[str, Any] | None:
        """The Schema Registry settings of ``value`` or ``key`` (Connect's keys without the prefix), or None."""
        if (self.value_converter if side == "value" else self.key_converter) not in FORMATS.values():
            return None
        p = f"{side}.converter."
        return {k[len(p):]: self.settings[k] for k in self.settings if k.startswith(p) and k[len(p):] in REGISTRY_SETTINGS}

    def create_sinks(self) -> list[TwoPhaseCommitSink]:
        return [spec.cls(self.name, spec.config) for spec in self.sinks]

    @property
    def commit_min_interval_ms(self) -> int:
        """``commit.min.interval.ms`` as set, else what every sink of the connector allows (see
        :attr:`TwoPhaseCommitSink.CAUGHT_UP_COMMIT_MS`): the longest of their wishes, the full
        ``commit.interval.ms`` for a sink that wants no early end."""
        set_ms = self.settings["commit.min.interval.ms"]
        if set_ms is not None:
            return int(set_ms)
        full = int(self.settings["commit.interval.ms"])
        wishes = [spec.cls.CAUGHT_UP_COMMIT_MS for spec in self.sinks]
        return full if None in wishes else min(full, max(w for w in wishes if w is not None))

    def masked(self) -> dict[str, Any]:
        """The config as given, with every password-typed value hidden."""
        secret: set[str] = set()
        for spec in self.sinks:
            prefix = "" if spec.alias == "" else f"sinks.{spec.alias}."
            secret |= {prefix + k for k in spec.cls.CONFIG.passwords()}
        # Untyped keys - Kafka client passthroughs (consumer.override.sasl.password) and keys no
        # definition declares - are hidden by name when they look like credentials.
        declared = set(COMMON.keys) | {("" if s.alias == "" else f"sinks.{s.alias}.") + k for s in self.sinks for k in s.cls.CONFIG.keys}
        secret |= {k for k in self.raw if k not in declared and _looks_secret(k)}
        return {k: (MASK if k in secret and v not in (None, "") else v) for k, v in self.raw.items()}


#: A connector name: it is a ZooKeeper path segment and a URL path segment, so a conservative alphabet.
CONNECTOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,99}$")


def parse_connector(name: Any, config: Any, *, source: str | None = None, resolve: bool = True,
                    check_clients: bool = False) -> ConnectorConfig:
    """Validate a registration. ``resolve=False`` is for where it is registered (CLI, REST):
    ``${env:..}``/``${file:..}`` references stay unresolved and unchecked - they are resolved by
    the worker that runs the connector, so secrets never travel into ZooKeeper."""
    if not isinstance(name, str) or not name:
        raise ConfigError("'name' is required: {\"name\": ..., \"config\": {...}}", key="name", source=source)
    if not CONNECTOR_NAME.match(name):
        raise ConfigError("must be 1-100 letters, digits, '_' or '-' (it names znodes, tables and transaction ids)",
                          key="name", source=source)
    if not isinstance(config, Mapping):
        raise ConfigError("'config' must be a JSON object", key="config", source=source)
    if "name" in config and config["name"] != name:
        raise ConfigError(f"config name {config['name']!r} differs from the connector name {name!r}", key="name", source=source)
    raw = {str(k): v for k, v in config.items()}
    raw["name"] = name
    if resolve:
        resolved = {k: resolve_providers(v, key=k, source=source) for k, v in raw.items()}
        skip: frozenset[str] = frozenset()
    else:
        resolved = dict(raw)
        skip = frozenset(k for k, v in raw.items() if isinstance(v, str) and _REF.search(v))
    settings = COMMON.parse(resolved, source=source, skip=skip)
    if bool(settings["topics"]) == bool(settings["topics.regex"]):
        raise ConfigError("set exactly one of 'topics' and 'topics.regex'", key="topics", source=source)
    for side in ("value", "key"):
        if _CONVERTER_ALIASES.get(settings[f"{side}.converter"], settings[f"{side}.converter"]) in FORMATS.values() \
                and not settings[f"{side}.converter.schema.registry.url"]:
            raise ConfigError(f"is required with {side}.converter={settings[f'{side}.converter']}: the schemas are "
                              "fetched from the registry", key=f"{side}.converter.schema.registry.url", source=source)
    settings["consumer.auto.offset.reset"] = keys.offset_reset(raw, settings["consumer.auto.offset.reset"])
    keys.check_overrides(raw, source=source)
    if check_clients:  # where a config is registered: librdkafka judges the consumer overrides now, not at task start
        keys.check_consumer_overrides(raw, source=source, skip=skip)
    chain_errors = validate_chain(resolved)
    if chain_errors:
        e = chain_errors[0]
        raise ConfigError(e.message.split(": ", 1)[-1], key=e.key, source=source)
    if settings["errors.tolerance"] == "all" and not settings["errors.deadletterqueue.topic.name"]:
        raise ConfigError("is required with errors.tolerance=all: a tolerated record goes to the dead-letter topic, "
                          "it is never dropped silently", key="errors.deadletterqueue.topic.name", source=source)
    cls_name = settings["connector.class"]
    if cls_name == FANOUT:
        aliases = ConfigDef().define("sinks", Type.LIST, validator=non_empty).parse(resolved, source=source)["sinks"]
        specs = []
        for alias in aliases:
            prefix = f"sinks.{alias}."
            sub = {k[len(prefix):]: v for k, v in resolved.items() if k.startswith(prefix)}
            key = prefix + "connector.class"
            if not sub.get("connector.class"):
                raise ConfigError("is required for every sink named in 'sinks'", key=key, source=source)
            cls = load_class(str(sub["connector.class"]), key=key, source=source)
            sub_skip = frozenset(k[len(prefix):] for k in skip if k.startswith(prefix))
            specs.append(SinkSpec(alias, cls, _parse_sink(cls, sub, source, prefix, sub_skip)))
        known = {"name", "sinks", *COMMON.keys, *(f"sinks.{s.alias}.{k}" for s in specs for k in ("connector.class", *s.cls.CONFIG.keys))}
        keys.check_unknown(raw, known, source=source)
        return ConnectorConfig(name, raw, settings, tuple(specs))
    cls = load_class(cls_name, source=source)
    keys.check_unknown(raw, {"name", *COMMON.keys, *cls.CONFIG.keys}, source=source)
    return ConnectorConfig(name, raw, settings, (SinkSpec("", cls, _parse_sink(cls, resolved, source, "", skip)),))


def _parse_sink(cls: type[TwoPhaseCommitSink], config: dict[str, Any], source: str | None, prefix: str,
                skip: frozenset[str]) -> dict[str, Any]:
    try:
        cls.CONFIG.parse(config, source=source, skip=skip)
    except ConfigError as exc:
        raise ConfigError(exc.message.split(": ", 1)[-1], key=prefix + (exc.key or ""), source=source) from None
    return config


def load_connector_file(path: str | Path, *, resolve: bool = True) -> ConnectorConfig:
    """Read one registration file; every problem names the file and the key."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(p)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", source=str(p)) from None
    if not isinstance(doc, dict):
        raise ConfigError('must be a JSON object {"name": ..., "config": {...}}', source=str(p))
    if "config" not in doc:
        raise ConfigError("'config' is required: {\"name\": ..., \"config\": {...}}", key="config", source=str(p))
    return parse_connector(doc.get("name"), doc["config"], source=str(p), resolve=resolve, check_clients=True)


def _looks_secret(key: str) -> bool:
    k = key.lower()
    return any(w in k for w in ("password", "secret", "token", "credential", "jaas")) or k.endswith(".key")


def masked_config(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` as it may be shown (REST responses, logs): password-typed values hidden.

    A stored config always parses (it was validated when registered); should one not - a
    connector class removed since - every key that looks secret is hidden instead, so a
    response never falls back to showing a secret.
    """
    try:
        return parse_connector(name, dict(raw), resolve=False).masked()
    except ConfigError:
        return {k: (MASK if _looks_secret(k) and v not in (None, "") else v) for k, v in raw.items()}


def secret_values(cfg: ConnectorConfig) -> list[str]:
    """The values of password-typed keys, as given and as resolved, for log and response redaction."""
    out: list[str] = []
    masked = cfg.masked()
    for k, v in cfg.raw.items():
        if masked.get(k) == MASK and isinstance(v, str):
            out.append(v)
            try:
                out.append(str(resolve_providers(v, key=k)))
            except ConfigError:
                pass
    return [v for v in out if not _REF.fullmatch(v)]
