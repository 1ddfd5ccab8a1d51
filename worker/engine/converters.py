"""Kafka Connect's converters as the source applies them: a record's bytes to the value sinks get.

``json`` is :func:`eosink.connectors.common.jsoncodec.decode_value` (``json.loads``' values and
refusals, natively where msgspec agrees); with ``schemas.enable=true`` it unwraps Connect's
``{"schema", "payload"}`` envelope. ``avro``, ``protobuf`` and ``jsonschema`` read Confluent's wire format
with the schemas of a Schema Registry (:mod:`eosink.worker.engine.registry_converters`).
:func:`json_checked` is ``json`` for a task whose sinks only copy
the bytes of JSON objects and arrays: it checks them and leaves them undecoded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eosink.connectors.api.records import UNDECODED
from eosink.connectors.common import jsoncodec

#: ``json.loads(raw)`` - same value, same refusal - natively where msgspec agrees (``None`` is a tombstone).
json_value = jsoncodec.decode_value
_is_json_container = jsoncodec.is_json_container


def json_checked(raw: bytes | None) -> Any:
    """``value.converter=json`` for sinks that copy JSON objects' and arrays' bytes: such a value is
    checked (:func:`~eosink.connectors.common.jsoncodec.is_json_container`) and left undecoded
    (``UNDECODED``: the record is then a :class:`~eosink.connectors.api.records.LazyJsonRecord`);
    anything else is decoded, so every refusal is the decoder's own."""
    if raw.__class__ is bytes and _is_json_container(raw):
        return UNDECODED
    return json_value(raw)


def _string(raw: bytes | None) -> Any:
    return None if raw is None else raw.decode("utf-8")


def _bytes(raw: bytes | None) -> Any:
    return raw


CONVERTERS: dict[str, Callable[[bytes | None], Any]] = {"json": json_value, "string": _string, "bytes": _bytes}
#: Confluent's formats: values in its wire format, schemas from a Schema Registry (:mod:`.registry_converters`).
REGISTRY_FORMATS = ("avro", "protobuf", "jsonschema")


def _unwrap_envelope(raw: bytes | None) -> Any:
    """JSON with ``schemas.enable=true``: Kafka Connect's ``{"schema": ..., "payload": ...}`` envelope,
    whose payload is the value (the schema is Connect's to describe it; sinks map JSON types themselves)."""
    doc = json_value(raw)
    if doc is None:
        return None
    if type(doc) is not dict or "payload" not in doc or "schema" not in doc:
        raise ValueError("not Kafka Connect's {\"schema\": ..., \"payload\": ...} envelope, which "
                         "value.converter.schemas.enable=true expects")
    return doc["payload"]


def converter(name: str, *, schemas_enable: bool = False,
              registry: Mapping[str, Any] | None = None) -> Callable[[bytes | None], Any]:
    """The decode function of a converter alias (``json``, ``string``, ``bytes``; ``avro``, ``protobuf``,
    ``jsonschema`` with ``registry``: Connect's ``schema.registry.url`` and ``basic.auth.*`` keys)."""
    if schemas_enable and name == "json":
        return _unwrap_envelope
    if name in REGISTRY_FORMATS:
        from eosink.worker.engine.registry_converters import RegistryDecoder

        if not registry or not registry.get("schema.registry.url"):
            raise KeyError(f"{name} needs schema.registry.url")
        return RegistryDecoder(name, str(registry["schema.registry.url"]), registry)
    return CONVERTERS[name]
