"""The publisher's Schema Registry client: an outbox's schema id, looked up or registered once per process.

Shared by the formats in Confluent's wire format (:mod:`eosink.spark_jobs.avro`,
:mod:`eosink.spark_jobs.json_schema`): each derives its schema from the DataFrame on the driver, then
asks here for its id under the subject (``<topic>-value``, Confluent's TopicNameStrategy, unless
``Outbox(subject=...)`` names one). Ids never change for a given schema, so a streaming query asks once,
not every micro-batch.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs.errors import RegistryUnreachableError, SchemaRejectedError

#: The keys of a ``registry=`` mapping: Kafka Connect's converter keys (without ``value.converter.``).
REGISTRY_KEYS = ("schema.registry.url", "basic.auth.credentials.source", "basic.auth.user.info")
MAGIC = b"\x00"

_ids: dict[tuple[str, str, str, str], int] = {}
_ids_lock = threading.Lock()


def registry_config(registry: str | Mapping[str, str] | None, topic: str, fmt: str = "avro") -> dict[str, Any]:
    """confluent-kafka's ``SchemaRegistryClient`` config from ``Outbox(registry=...)``: a URL, or a mapping of
    Connect's keys (``schema.registry.url``, ``basic.auth.credentials.source``, ``basic.auth.user.info``)."""
    from eosink.worker.engine.registry_converters import client_config

    settings: Mapping[str, str] = {"schema.registry.url": registry} if isinstance(registry, str) else (registry or {})
    unknown = sorted(set(settings) - set(REGISTRY_KEYS))
    if unknown:
        raise ConfigError(f"Outbox('{topic}', registry=...) has unknown key(s) {', '.join(unknown)}; the keys are "
                          f"{', '.join(REGISTRY_KEYS)}", key="registry", source="publish_outbox")
    url = str(settings.get("schema.registry.url") or "").rstrip("/")
    if not url:
        raise ConfigError(f"Outbox('{topic}', format='{fmt}') needs registry= (the schema.registry.url of a schema "
                          "registry with Confluent's API, or a mapping holding it)", key="registry",
                          source="publish_outbox")
    return client_config(url, settings)


def schema_id(conf: Mapping[str, Any], subject: str, schema: str, schema_type: str = "AVRO",
              timeout_s: float = 10.0) -> int:
    """The id of ``schema`` (of ``schema_type``: ``AVRO``, ``JSON``) under ``subject``: looked up, registered
    when absent (the registry's compatibility rule decides; a refusal names the subject and carries the
    registry's message); cached per process."""
    url = str(conf["url"])
    cache_key = (url, subject, schema_type, schema)
    with _ids_lock:
        if cache_key in _ids:
            return _ids[cache_key]
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        client = SchemaRegistryClient({**conf, "timeout": timeout_s, "max.retries": 1})
    except ValueError as exc:  # credentials both in the URL and in basic.auth.user.info, or no ':' in them
        raise ConfigError(f"the schema registry settings are not usable: {exc}", key="registry",
                          source="publish_outbox") from None
    wanted = Schema(schema, schema_type)
    try:
        try:
            found = client.lookup_schema(subject, wanted).schema_id
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:  # 40401 no such subject, 40403 not under it: register it
                raise
            found = client.register_schema(subject, wanted)
    except SchemaRegistryError as exc:
        if exc.http_status_code >= 500:
            raise RegistryUnreachableError(url, f"HTTP {exc.http_status_code}: {exc.error_message}") from None
        raise SchemaRejectedError(subject, url, f"HTTP {exc.http_status_code} (error code {exc.error_code}): "
                                                f"{exc.error_message}") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, timeout, DNS: the registry is not reachable
        raise RegistryUnreachableError(url, f"{type(exc).__name__}: {exc}") from None
    if found is None:
        raise SchemaRejectedError(subject, url, "the registry answered without a schema id")
    with _ids_lock:
        _ids[cache_key] = int(found)
    return int(found)


def header(schema_id_: int) -> bytes:
    """Confluent's 5-byte header: the magic byte, then the schema id in 4 bytes, big-endian."""
    return MAGIC + schema_id_.to_bytes(4, "big")
