"""``bench_e2e.py --format avro``: the same records as Avro (a registered schema, Confluent's wire format)
against JSON, end to end, alternated.

The JSON run is the plain end-to-end run (:func:`bench.bench_e2e.run_e2e`: a fresh worker process, a
postgres connector registered through the REST API, the clock from the POST to the last row). The Avro
run is the same with the records of :func:`bench._data.order` written by fastavro under a schema
registered in the stack's Schema Registry (``<topic>-value``), read with ``value.converter=avro``:
same ids, same values, a table of the same column types (typed from the schema instead of inferred
from the JSON). ``--pairs`` runs of each, alternated (json, avro, json, avro, ...) so that the shared
machine's drift falls on both alike; the ratio of the median rates is what Avro costs.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import io
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report as published
from bench._data import order

#: :func:`bench._data.order` as an Avro record: what its JSON gives the table (bigint, text, double precision).
ORDER_AVRO: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    *({"name": f, "type": "string"} for f in ("user", "email")),
    {"name": "amount", "type": "double"},
    *({"name": f, "type": "string"} for f in ("currency", "status", "country", "created", "note")),
]}
#: A record of the types JSON lacks: a decimal, an instant, bytes (a numeric, a timestamptz, a bytea column from
#: the schema; as JSON, the converter's text of each, into the text columns the JSON infers).
TYPED_AVRO: dict[str, Any] = {"type": "record", "name": "Typed", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "blob", "type": "bytes"},
    {"name": "note", "type": ["null", "string"]},
]}
_AT = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)


def typed(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"user_{i % 99991:05d}", "amount": decimal.Decimal(i * 7919 % 100000).scaleb(-2),
            "at": _AT + datetime.timedelta(milliseconds=i * 7919), "blob": i.to_bytes(4, "big"),
            "note": None if i % 2 else f"order {i}"}


#: ``--avro-record``: the schema and the values of record ``i``.
RECORDS: dict[str, tuple[dict[str, Any], Callable[[int], dict[str, Any]]]] = {"order": (ORDER_AVRO, order),
                                                                              "typed": (TYPED_AVRO, typed)}


def json_value(i: int, record: str) -> bytes:
    """Record ``i`` as the JSON the Avro converter's dict would be (a decimal, an instant, bytes as their text)."""
    from eosink.worker.engine.registry_converters import jsonable

    return json.dumps(jsonable(RECORDS[record][1](i)), separators=(",", ":")).encode()


TARGET_RATIO = 0.9
TITLE = "End to end, Avro against JSON: Kafka to PostgreSQL through one worker process"
MEASURES = ("Records/s from registering a postgres connector through the REST API to the last row visible, through one "
            "eosink worker process, the records as Avro (value.converter=avro, schema in the Schema Registry) and as JSON, "
            "alternated; every id checked once and no prepared transaction left.")
BASELINE = "the same records as JSON, alternated with the Avro runs"


def encoder(registry_url: str, topic: str, record: str = "order") -> Callable[[int], bytes]:
    """``i -> bytes``: record ``i`` of ``record`` (:data:`RECORDS`) in Confluent's wire format, its schema registered
    as ``<topic>-value``."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from fastavro import parse_schema, schemaless_writer

    client = SchemaRegistryClient({"url": registry_url, "timeout": 30})
    schema, values = RECORDS[record]
    schema_id = client.register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
    parsed = parse_schema(schema)
    header = b"\x00" + schema_id.to_bytes(4, "big")

    def encode(i: int) -> bytes:
        buf = io.BytesIO()
        buf.write(header)
        schemaless_writer(buf, parsed, values(i))
        return buf.getvalue()

    return encode


def converter_config(registry_url: str) -> dict[str, str]:
    return {"value.converter": "avro", "value.converter.schema.registry.url": registry_url}


def run_pairs(args: argparse.Namespace, ep: Any, json_topic: str, avro_topic: str, tag: str, logdir: Path) -> dict[str, Any]:
    from bench.bench_e2e import run_e2e

    runs: dict[str, list[dict[str, Any]]] = {"json": [], "avro": []}
    n = args.records
    for i in range(args.pairs):
        for fmt in ("json", "avro"):
            args.converter_config = converter_config(ep.registry_url) if fmt == "avro" else {}
            r = run_e2e(args, ep, avro_topic if fmt == "avro" else json_topic, f"{tag}{i}{fmt[0]}", logdir)
            runs[fmt].append(r)
            r["rate_from_first_row"] = n / max(1e-9, r["seconds"] - (r["first_row_s"] or 0.0))
            print(f"  {fmt} run {i + 1}: {r['rate']:,.0f} records/s in {r['seconds']:.2f}s ({r['rate_from_first_row']:,.0f} from "
                  f"the first row, {r['first_row_s'] or 0:.2f}s after the POST), worker CPU "
                  f"{r['cpu_s'] / n * 1e6:.1f} us/record (check {'ok' if r['check']['ok'] else 'FAILED'})", flush=True)
    args.converter_config = {}
    med = {fmt: statistics.median(r["rate"] for r in rs) for fmt, rs in runs.items()}
    cpu = {fmt: statistics.median(r["cpu_s"] / n * 1e6 for r in rs) for fmt, rs in runs.items()}
    pairs = [a["rate"] / j["rate"] for j, a in zip(runs["json"], runs["avro"])]
    steady = {fmt: statistics.median(r["rate_from_first_row"] for r in rs) for fmt, rs in runs.items()}
    ratio = med["avro"] / med["json"]
    print(f"Avro {med['avro']:,.0f} vs JSON {med['json']:,.0f} records/s (medians of {args.pairs}) = {ratio:.2f}x "
          f"(per pair {', '.join(f'{p:.2f}' for p in pairs)}; target >= {TARGET_RATIO}x: "
          f"{'met' if ratio >= TARGET_RATIO else 'MISSED'}); from the first row {steady['avro']:,.0f} vs {steady['json']:,.0f} "
          f"= {steady['avro'] / steady['json']:.2f}x; worker CPU {cpu['avro']:.1f} vs {cpu['json']:.1f} us/record")
    ok = all(r["check"]["ok"] for rs in runs.values() for r in rs)
    return {"runs": runs, "median": med, "cpu_us": cpu, "pair_ratios": pairs, "ratio": ratio, "ok": ok,
            "median_from_first_row": steady, "ratio_from_first_row": steady["avro"] / steady["json"]}


def figure(args: argparse.Namespace, result: dict[str, Any], conditions: str, argv: Any) -> dict[str, Any]:
    med, cpu, runs = result["median"], result["cpu_us"], result["runs"]

    def span(fmt: str) -> str:
        rs = runs[fmt]
        return f"median of {len(rs)} runs ({min(r['rate'] for r in rs):,.0f}-{max(r['rate'] for r in rs):,.0f})"

    rows = [published.row("JSON (value.converter=json)", round(med["json"]), baseline=True, cpu_us=cpu["json"], note=span("json")),
            published.row("Avro (value.converter=avro, Schema Registry)", round(med["avro"]), med["json"], cpu_us=cpu["avro"],
                          note=span("avro"))]
    return published.figure(
        "e2e-avro", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="records/s", rows=rows,
        targets=[published.target("Avro against JSON", f">= {TARGET_RATIO}x", f"{result['ratio']:.2f}x",
                                  result["ratio"] >= TARGET_RATIO)],
        argv=argv, make_target="bench-e2e")
