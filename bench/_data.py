"""The records every benchmark uses: ~200-byte JSON orders, the same for the same index."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from eosink.connectors.api.records import UNDECODED, LazyJsonRecord, SinkRecord

STATUSES = ("paid", "pending", "refunded", "failed")
COUNTRIES = ("DE", "FR", "NL", "US", "GB", "PL")


def order(i: int, note: str | None = None) -> dict[str, Any]:
    """The order with id ``i``."""
    return {
        "id": i,
        "user": f"user_{i % 99991:05d}",
        "email": f"user{i % 99991}@example.com",
        "amount": round((i * 7919 % 100000) / 100.0, 2),
        "currency": "EUR",
        "status": STATUSES[i % 4],
        "country": COUNTRIES[i % 6],
        "created": f"2024-05-{1 + i % 28:02d}T12:{i % 60:02d}:{i * 7 % 60:02d}Z",
        "note": note if note is not None else f"order {i} shipped via standard delivery, thank you",
    }


#: Kafka Connect's schema of :func:`order`, as its JsonConverter writes it with ``schemas.enable=true``.
ORDER_SCHEMA: dict[str, Any] = {"type": "struct", "name": "order", "optional": False, "fields": [
    {"field": "id", "type": "int64", "optional": False},
    *({"field": f, "type": "string", "optional": False} for f in ("user", "email")),
    {"field": "amount", "type": "double", "optional": False},
    *({"field": f, "type": "string", "optional": False} for f in ("currency", "status", "country", "created", "note")),
]}
_ORDER_SCHEMA_JSON = json.dumps(ORDER_SCHEMA, separators=(",", ":"))


def order_envelope(i: int) -> bytes:
    """:func:`order` in Kafka Connect's ``{"schema": ..., "payload": ...}`` envelope (JsonConverter,
    ``schemas.enable=true``): what Debezium's JDBC sink and most Connect JSON topics need (~750 bytes)."""
    payload = json.dumps(order(i), separators=(",", ":"))
    return f'{{"schema":{_ORDER_SCHEMA_JSON},"payload":{payload}}}'.encode()


def make_records(topic: str, n: int, partitions: int) -> list[SinkRecord]:
    """``n`` orders round-robin over ``partitions``, as a worker would hand them to a sink."""
    out: list[SinkRecord] = []
    for i in range(n):
        value = order(i)
        out.append(SinkRecord(topic, i % partitions, i // partitions, None, value, json.dumps(value).encode()))
    return out


def batches(records: Sequence[SinkRecord], size: int) -> list[Sequence[SinkRecord]]:
    """Consecutive slices of ``size``: one commit cycle's worth each."""
    return [records[i : i + size] for i in range(0, len(records), size)]


def as_read_undecoded(records: Sequence[SinkRecord]) -> list[SinkRecord]:
    """``records`` as the engine reads them for a task whose sinks only copy the values' bytes
    (``value.converter=json``, no transforms, every sink ``reads_values = False``): each value checked
    but not decoded, a :class:`LazyJsonRecord` holding the topic's bytes (see ``worker/engine/source.py``)."""
    out: list[SinkRecord] = []
    for r in records:
        rec = SinkRecord(r.topic, r.partition, r.offset, r.key, UNDECODED, r.raw_value, r.headers, r.timestamp_ms)
        rec.__class__ = LazyJsonRecord
        out.append(rec)
    return out
