"""The PostgreSQL sink's configuration: Kafka Connect JDBC sink keys, each honoured or refused.

People move connectors from the Confluent JDBC sink (``io.confluent.connect.jdbc.JdbcSinkConnector``)
with their configs. A key that sink knows must never be dropped silently here: a user who wrote
``insert.mode=update`` or ``delete.enabled=true`` and got inserts would find out from the data.
So every key of the JDBC sink's ConfigDef is declared below and either does what it does there,
or is refused by its validator - at registration, naming the key and saying what to use instead.

Cross-key rules (``delete.enabled`` needs ``pk.mode=record_key``, one field filter at a time, ...)
are checked in :func:`settings`, when the sink is built.

**Field filters.** ``fields.whitelist`` is the JDBC sink's key (plain field names). Debezium's
JDBC sink - the other JDBC sink Kafka Connect users run - names them ``field.include.list`` and
``field.exclude.list``, whose entries are ``field`` or ``topic:field``; both are accepted with that
meaning. There is no ``fields.blacklist`` in either sink: it is refused, pointing at
``field.exclude.list``. Key columns (``pk.fields``, the Kafka key's fields, the Kafka coordinates)
are never filtered out, as in the JDBC sink, where the filter applies to the other columns.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, Validator, at_least, non_empty, one_of
from eosink.connectors.api.errors import ConfigError

#: Connect's names for the Kafka coordinates with ``pk.mode=kafka`` (JdbcSinkConfig.DEFAULT_KAFKA_PK_NAMES).
CONNECT_KAFKA_PK: tuple[str, str, str] = ("__connect_topic", "__connect_partition", "__connect_offset")
#: ``table.types`` values and the pg_class.relkind each admits (VIEW is refused: see the key's doc).
TABLE_TYPES: dict[str, str] = {"TABLE": "r", "PARTITIONED TABLE": "p"}


def refused(why: str) -> Validator:
    """A validator for a JDBC sink key eosink does not do: any value set is a ConfigError."""

    def check(key: str, value: Any) -> None:
        raise ConfigError(why, key=key)

    return check


def only(allowed: tuple[str, ...], why: str) -> Validator:
    """Accept the values eosink does anyway (case-insensitive, as the JDBC sink's enums); refuse others."""

    def check(key: str, value: Any) -> None:
        if str(value).strip().lower() not in {a.lower() for a in allowed}:
            raise ConfigError(f"{value!r} is not supported: {why}", key=key)

    return check


def _time_zone(key: str, value: Any) -> None:
    try:
        zoneinfo.ZoneInfo(str(value))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{value!r} is not a time zone name (e.g. UTC, Europe/Paris)", key=key) from None


def _table_types(key: str, value: Any) -> None:
    for t in value:
        if t.upper() == "VIEW":
            raise ConfigError("VIEW is not supported: COPY cannot write into a view; write to its base table", key=key)
        if t.upper() not in TABLE_TYPES:
            raise ConfigError(f"{t!r} is not a table type; use TABLE and/or PARTITIONED TABLE", key=key)


_CYCLE = "eosink writes a whole commit cycle in one prepared transaction (COPY, no statement batches)"
_RETRY = ("the worker retries a failed cycle itself: set errors.retry.timeout and errors.retry.delay.max.ms "
          "on the connector instead")

CONFIG = (
    ConfigDef()
    .define("connection.url", Type.STRING, doc="PostgreSQL DSN, e.g. postgresql://host:5432/db (libpq URI or key=value). TLS is set here, "
            "as libpq reads it: ?sslmode=verify-full&sslrootcert=/path/ca.pem trusts a private CA and checks the host name. "
            "Keep the password out of it: use connection.password or a pgpass file (passfile=).",
            importance=Importance.HIGH, validator=non_empty)
    .define("connection.user", Type.STRING, None, "User name; overrides the DSN's.", Importance.HIGH)
    .define("connection.password", Type.PASSWORD, None, "Password; overrides the DSN's. Name it rather than write it: "
            "${file:/path/credentials.properties:key}.", Importance.HIGH)
    .define("connection.attempts", Type.INT, 1, "Connection attempts before a cycle fails as retryable (JDBC sink: 3).",
            Importance.LOW, at_least(1))
    .define("connection.backoff.ms", Type.LONG, 10_000, "Wait between two connection attempts.", Importance.LOW, at_least(0))
    .define("dialect.name", Type.STRING, None, "Only PostgreSqlDatabaseDialect (or empty): this sink writes PostgreSQL only.",
            Importance.LOW, only(("PostgreSqlDatabaseDialect",), "this sink speaks PostgreSQL only"))
    .define("table.name.format", Type.STRING, "${topic}",
            "Target table; ${topic} is the topic with '.' and '-' replaced by '_'. A '.' in the result separates a schema.",
            validator=non_empty)
    .define("table.types", Type.LIST, ["TABLE", "PARTITIONED TABLE"],
            "Kinds of existing table the sink may write: TABLE and/or PARTITIONED TABLE (both by default; the JDBC sink's "
            "default is TABLE). VIEW is refused: COPY cannot write into a view.", Importance.LOW, _table_types)
    .define("insert.mode", Type.STRING, "insert",
            "insert: COPY every record as a new row. upsert: one row per primary key, the record with the highest offset "
            "wins (INSERT ... ON CONFLICT; needs pk.mode and a unique index on the key). update: UPDATE the existing row "
            "of each key with the record with the highest offset; a key with no row is not inserted (needs pk.mode).",
            Importance.HIGH, one_of("insert", "upsert", "update"))
    .define("delete.enabled", Type.BOOLEAN, False,
            "A record with a null value (a tombstone) deletes the row whose primary key is the record's key, in the same "
            "prepared transaction as the cycle's other rows; per key, the last record of the batch wins. Requires "
            "pk.mode=record_key. Without it a tombstone is refused as a bad record (errors.tolerance applies).",
            Importance.MEDIUM)
    .define("pk.mode", Type.STRING, "none",
            "none | kafka (the Kafka coordinates, in columns __connect_topic, __connect_partition, __connect_offset, or "
            "the three names of pk.fields; fields.kafka then defaults to false, the coordinates being in the key) | "
            "record_key (the Kafka key: a JSON object's fields, else the key itself in column pk.fields[0] or __key) | "
            "record_value (pk.fields of the value).",
            Importance.HIGH, one_of("none", "kafka", "record_key", "record_value"))
    .define("pk.fields", Type.LIST, [], "Primary key columns (comma-separated). Required with pk.mode=record_value; "
            "with pk.mode=kafka, three names for topic, partition and offset.")
    .define("fields.whitelist", Type.LIST, [], "Value fields to write (comma-separated); empty writes all. Key columns "
            "are always written. The JDBC sink's name; field.include.list is Debezium's.")
    .define("field.include.list", Type.LIST, [], "Debezium JDBC sink's include list: entries 'field' or 'topic:field'. "
            "Not together with fields.whitelist or field.exclude.list.")
    .define("field.exclude.list", Type.LIST, [], "Debezium JDBC sink's exclude list: entries 'field' or 'topic:field'; "
            "key columns cannot be excluded.")
    .define("fields.blacklist", Type.LIST, None, "Refused: no JDBC sink has this key; use field.exclude.list.",
            Importance.LOW, refused("no JDBC sink has this key (the Confluent one has only fields.whitelist): "
                                    "use field.exclude.list"))
    .define("auto.create", Type.BOOLEAN, True, "Create a missing table (with PRIMARY KEY pk.fields): columns typed from the "
            "writer's schema with an Avro, Protobuf or JSON Schema value.converter (docs/connectors/schema-registry.md), else from the "
            "batch's JSON types.")
    .define("auto.evolve", Type.BOOLEAN, True, "Add a column (ALTER TABLE ... ADD COLUMN, nullable) for a new optional field "
            "of a new schema version, or for a new non-null JSON field; a schema version the table cannot take fails the task.")
    .define("fields.kafka", Type.BOOLEAN, True, "Add columns __topic text, __partition int, __offset bigint to every row "
            "so it can be traced to (and deduplicated by) its outbox record. Defaults to false with pk.mode=kafka.")
    .define("db.timezone", Type.STRING, None, "Session TimeZone of the sink's connections: how a timestamp text without "
            "an offset is read into a timestamptz column. Empty keeps the server's (the JDBC sink's default is UTC).",
            Importance.MEDIUM, _time_zone)
    .define("db.timezone.date", Type.STRING, None, "Only NONE: dates are JSON text that PostgreSQL parses itself.",
            Importance.LOW, only(("NONE",), "dates arrive as JSON text that PostgreSQL parses; there is no conversion to shift"))
    .define("quote.sql.identifiers", Type.STRING, None, "Only always: identifiers are always quoted (their case is kept).",
            Importance.LOW, only(("always",), "eosink always quotes identifiers, keeping field names' case"))
    .define("batch.size", Type.INT, None, f"Refused: {_CYCLE}; size cycles with batch.max.records.", Importance.LOW,
            refused(f"{_CYCLE}: size the cycle with batch.max.records / batch.max.bytes on the connector instead"))
    .define("max.retries", Type.INT, None, "Refused: the worker retries cycles (errors.retry.timeout).", Importance.LOW,
            refused(_RETRY))
    .define("retry.backoff.ms", Type.INT, None, "Refused: the worker retries cycles (errors.retry.delay.max.ms).",
            Importance.LOW, refused(_RETRY))
    .define("mssql.use.merge.holdlock", Type.BOOLEAN, None, "Refused: a SQL Server setting.", Importance.LOW,
            refused("a SQL Server setting; this sink writes PostgreSQL"))
    .define("trim.sensitive.log", Type.BOOLEAN, None, "Refused: error messages name the offending value's column and a "
            "short excerpt; use errors.log.include.messages to control record contents in logs.", Importance.LOW,
            refused("not supported: record errors quote a short excerpt of the offending value"))
    .define("lock.timeout.ms", Type.LONG, 10_000, "Longest wait for a lock before the cycle fails as retryable "
            "(PostgreSQL lock_timeout); 0 waits forever.", validator=at_least(0))
)


@dataclass(frozen=True, slots=True)
class FieldFilter:
    """Which value fields become columns (``fields.whitelist`` / ``field.include.list`` / ``field.exclude.list``)."""

    include: bool
    plain: frozenset[str]
    by_topic: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, names: list[str], include: bool, qualified: bool) -> FieldFilter:
        plain: set[str] = set()
        by_topic: dict[str, set[str]] = {}
        for n in names:
            topic, colon, f = n.rpartition(":")
            if qualified and colon:
                by_topic.setdefault(topic, set()).add(f)
            else:
                plain.add(n)
        return cls(include, frozenset(plain), {t: frozenset(s) for t, s in by_topic.items()})

    def names(self, topic: str) -> frozenset[str]:
        return self.plain | self.by_topic.get(topic, frozenset())


@dataclass(frozen=True, slots=True)
class Settings:
    """The decoded modes the sink and its table cache act on."""

    insert_mode: str
    pk_mode: str
    pk_fields: tuple[str, ...]
    delete_enabled: bool
    kafka: bool
    filter: FieldFilter | None
    relkinds: tuple[str, ...]

    @property
    def staged(self) -> bool:
        """Modes that create a staging table in their transactions (upsert, update, deletes): the
        role needs CREATE on the target's schema for every cycle, not only for auto.create."""
        return self.insert_mode != "insert" or self.delete_enabled


def settings(connector: str, raw: Mapping[str, Any], c: Mapping[str, Any]) -> Settings:
    """Cross-key rules on the parsed config ``c`` (``raw``: as given, to tell a default from a choice)."""
    src = f"connector '{connector}'"
    mode, pk_mode, pk = c["insert.mode"], c["pk.mode"], list(c["pk.fields"])
    if mode != "insert" and pk_mode == "none":
        raise ConfigError(f"insert.mode={mode} needs a primary key: set pk.mode to record_key, record_value or kafka",
                          key="pk.mode", source=src)
    if pk_mode == "record_value" and not pk:
        raise ConfigError("pk.mode=record_value needs pk.fields (the value fields forming the key)", key="pk.fields", source=src)
    if pk_mode == "kafka":
        if pk and len(pk) != 3:
            raise ConfigError(f"pk.mode=kafka needs three pk.fields (topic, partition, offset columns), got {len(pk)}",
                              key="pk.fields", source=src)
        pk = pk or list(CONNECT_KAFKA_PK)
    if c["delete.enabled"] and pk_mode != "record_key":
        raise ConfigError(f"delete.enabled=true needs pk.mode=record_key (a tombstone names its row by the Kafka key), "
                          f"got pk.mode={pk_mode}", key="delete.enabled", source=src)
    given = [k for k in ("fields.whitelist", "field.include.list", "field.exclude.list") if c[k]]
    if len(given) > 1:
        raise ConfigError(f"{given[0]} and {given[1]} are both set: use one field filter", key=given[1], source=src)
    flt = None
    if given:
        key = given[0]
        flt = FieldFilter.of(list(c[key]), include=key != "field.exclude.list", qualified=key != "fields.whitelist")
    kafka_given = raw.get("fields.kafka") not in (None, "")
    kafka = bool(c["fields.kafka"]) if kafka_given or pk_mode != "kafka" else False
    relkinds = tuple(sorted({TABLE_TYPES[t.upper()] for t in c["table.types"]}))
    return Settings(mode, pk_mode, tuple(pk), bool(c["delete.enabled"]), kafka, flt, relkinds)
