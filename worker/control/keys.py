"""Which keys a registration may carry: nothing eosink would silently ignore, nothing unsafe.

Kafka Connect passes unknown keys through; a sink that ignores what its user wrote is a data
quality incident waiting to happen (a misspelt ``tabel.name.format`` writes to the default table).
So a registration is refused, with the closest known key as a hint, when it carries a key that no
definition declares: not the engine's common keys, not the connector class's (under
``sinks.<alias>.`` for a fan-out), not a transform's (checked by the chain), not an allowed
consumer override.

**Consumer overrides** (``consumer.override.<librdkafka property>``) follow the spirit of
Connect's ``connector.client.config.override.policy``: what would break exactly-once or the
engine's ownership of partitions is refused with the reason (:data:`REFUSED_OVERRIDES`);
``auto.offset.reset`` means what Connect users expect (where a partition with no decision yet
starts) and is honoured as eosink's ``consumer.auto.offset.reset``; anything else is handed to
librdkafka, which checks the property name and value when the consumer is built (see
:func:`check_consumer_overrides`), so a misspelt override is refused at registration too.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from eosink.connectors.api.errors import ConfigError

OVERRIDE_PREFIX = "consumer.override."

_OFFSETS = ("eosink's offsets are the decision log's, committed with each cycle's decision in ZooKeeper; the consumer "
            "group's offsets are written after each commit for tooling only")
_GROUP = ("eosink assigns partitions itself (from ZooKeeper); the consumer never joins a group, so group membership "
          "settings have no effect")
#: Overrides refused, and why. Lower-case librdkafka names.
REFUSED_OVERRIDES: dict[str, str] = {
    "isolation.level": "eosink reads read_committed only: read_uncommitted would deliver records of aborted transactions",
    "enable.auto.commit": _OFFSETS,
    "enable.auto.offset.store": _OFFSETS,
    "auto.commit.interval.ms": _OFFSETS,
    "group.id": "the consumer group is named after the connector (eosink-<name>) so its lag shows in Kafka tooling",
    "group.instance.id": _GROUP,
    "partition.assignment.strategy": _GROUP,
    "group.protocol": _GROUP,
    "group.remote.assignor": _GROUP,
    "session.timeout.ms": _GROUP + "; liveness is the ZooKeeper session (--session-timeout)",
    "heartbeat.interval.ms": _GROUP,
    "max.poll.interval.ms": _GROUP,
    "bootstrap.servers": "the worker's Kafka cluster is set per worker (--bootstrap-servers); the decision log's offsets "
                         "belong to that cluster",
    "enable.partition.eof": "the engine turns it on itself to tell when a cycle has read everything available "
                            "(commit.min.interval.ms); the events never reach the sinks",
    "key.deserializer": "a Java client setting: use key.converter",
    "value.deserializer": "a Java client setting: use value.converter",
}
#: librdkafka spellings of auto.offset.reset, as eosink's consumer.auto.offset.reset names them.
_RESETS = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
           "latest": "latest", "largest": "latest", "end": "latest"}
#: Kafka Connect keys of the converter families that mean something here.
CONVERTER_KEYS = frozenset({"value.converter.schemas.enable", "key.converter.schemas.enable"})
_NOT_HERE = {
    "producer.override.": "eosink's sinks produce nothing; the dead-letter producer is configured per worker "
                          "(--kafka-property)",
    "admin.override.": "eosink's admin clients are configured per worker (--kafka-property)",
    "header.converter": "headers reach sinks and transforms as bytes; no header converter is applied",
}


def overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka properties a registration overrides (without the prefix)."""
    return {k[len(OVERRIDE_PREFIX):]: v for k, v in raw.items() if k.startswith(OVERRIDE_PREFIX)}


def offset_reset(raw: Mapping[str, Any], current: str) -> str:
    """``consumer.override.auto.offset.reset`` as eosink's ``consumer.auto.offset.reset``."""
    value = raw.get(OVERRIDE_PREFIX + "auto.offset.reset")
    if value is None:
        return current
    reset = _RESETS.get(str(value).strip().lower())
    if reset is None:
        raise ConfigError(f"{value!r} is not a reset policy eosink can honour; use earliest or latest",
                          key=OVERRIDE_PREFIX + "auto.offset.reset")
    return reset


def check_overrides(raw: Mapping[str, Any], *, source: str | None = None) -> None:
    for prop in overrides(raw):
        why = REFUSED_OVERRIDES.get(prop.lower())
        if why is not None:
            raise ConfigError(f"cannot be overridden: {why}", key=OVERRIDE_PREFIX + prop, source=source)


def check_consumer_overrides(raw: Mapping[str, Any], *, source: str | None = None,
                             skip: Iterable[str] = ()) -> None:
    """Let librdkafka judge every passed-through property (name and value), as it will when the task
    starts: building a consumer checks its configuration and connects to nothing until it polls."""
    from confluent_kafka import Consumer, KafkaException

    skipped = set(skip)
    props = {k: v for k, v in overrides(raw).items() if OVERRIDE_PREFIX + k not in skipped and k != "auto.offset.reset"}
    if not props:
        return
    for prop, value in props.items():
        warnings = _Warnings()
        try:
            Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "eosink-validate", prop: value,
                      "logger": warnings.logger}).close()
        except (KafkaException, TypeError, ValueError) as exc:
            detail = exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else str(exc)
            raise ConfigError(f"librdkafka refuses {prop}={value!r}: {detail}", key=OVERRIDE_PREFIX + prop,
                              source=source) from None
        ignored = [m for m in warnings.messages if "ignored" in m]
        if ignored:  # e.g. a producer property: librdkafka would ignore it, so would eosink - refuse instead
            raise ConfigError(f"librdkafka would ignore {prop}: {ignored[0]}", key=OVERRIDE_PREFIX + prop, source=source)


class _Warnings(logging.Handler):
    """Collects what librdkafka logs while a consumer is built (it warns of properties it ignores)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.logger = logging.Logger("eosink.validate.librdkafka")
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_unknown(raw: Mapping[str, Any], known: Iterable[str], *, source: str | None = None) -> None:
    """Refuse the first key nothing declares, naming the closest declared key as a hint."""
    declared = set(known)
    keys = list(raw)
    listed = {kind: {a.strip() for a in str(raw.get(kind, "") if isinstance(raw, Mapping) else "").split(",") if a.strip()}
              for kind in ("transforms", "predicates")}
    for key in keys:
        if key in declared or key.startswith(OVERRIDE_PREFIX) or key in CONVERTER_KEYS or key in listed:
            continue
        kind, _, rest = key.partition(".")
        if kind in listed and rest:  # transforms.<alias>.<key>: the chain checks the key; the alias must be listed
            alias = rest.split(".", 1)[0]
            if alias in listed[kind]:
                continue
            raise ConfigError(f"names {kind[:-1]} alias {alias!r}, which '{kind}' does not list "
                              f"({', '.join(sorted(listed[kind])) or 'none'}): it would be ignored", key=key, source=source)
        for prefix, why in _NOT_HERE.items():
            if key.startswith(prefix):
                raise ConfigError(f"is not supported: {why}", key=key, source=source)
        close = difflib.get_close_matches(key, sorted(declared), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"is not a key eosink knows for this connector{hint} (unknown keys are refused, "
                          "not ignored)", key=key, source=source)
