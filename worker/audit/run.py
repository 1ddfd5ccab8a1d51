"""``audit``: a connector's sinks read back and checked against its outbox, from the decision log's view.

What is *due* is what the decision log says was delivered: per partition, every committed record
before its ``next_offset``. The decision log is read first, the source next, the sinks last, so a
cycle committing meanwhile can only add records at or past the ``next_offset`` read: those count as
in flight, never as faults. Nothing is written anywhere; the worker keeps running.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eosink.connectors.api.audit import AuditReader, Window
from eosink.connectors.api.errors import ConfigError, EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.audit import source as src
from eosink.worker.audit.tally import FAULTS, PartitionAudit, tally
from eosink.worker.engine.decision import Entry

#: Pause before a sink with missing records is read again (a decided commit may be completing).
RECHECK_S = 2.0


@dataclass(frozen=True)
class Asked:
    """A range asked for on the command line: ``TOPIC:PARTITION=FROM-TO`` (``TO`` exclusive, as ``next_offset``)."""

    tp: TopicPartition
    first: int
    end: int


def parse_range(raw: str) -> Asked:
    tp, sep, span = raw.rpartition("=")
    topic, sep2, part = tp.rpartition(":")
    first, dash, end = span.partition("-")
    if not (sep and sep2 and dash and topic and part.isdigit() and first.isdigit() and end.isdigit()) or int(end) < int(first):
        raise ConfigError(f"{raw!r} is not TOPIC:PARTITION=FROM-TO (whole numbers, TO >= FROM, TO exclusive)", key="offsets")
    return Asked(TopicPartition(topic, int(part)), int(first), int(end))


def _partitions(bootstrap: str, kafka: Mapping[str, Any], topics: list[str]) -> dict[TopicPartition, int]:
    """Each partition of ``topics`` with its earliest offset (the low watermark)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    c = Consumer({**kafka, "bootstrap.servers": bootstrap, "group.id": f"eosink-audit-{uuid.uuid4().hex}", "log_level": 3})
    try:
        meta = c.list_topics(timeout=30)
        out: dict[TopicPartition, int] = {}
        for t in topics:
            tm = meta.topics.get(t)
            if tm is None or tm.error is not None:
                continue
            for p in tm.partitions:
                low, _high = c.get_watermark_offsets(KTP(t, p), timeout=30, cached=False)
                out[TopicPartition(t, p)] = max(low, 0)
        return out
    except Exception as exc:  # noqa: BLE001 - librdkafka's errors: the audit cannot tell
        raise src.SourceUnreadable(f"Kafka at {bootstrap}: {exc}", component="audit") from exc
    finally:
        c.close()


def windows_of(decisions: Mapping[TopicPartition, Entry], earliest: Mapping[TopicPartition, int],
               asked: list[Asked]) -> dict[TopicPartition, Window]:
    """Per partition ``[first, due)``: from the earliest offset (or ``FROM``) to the decision log's
    ``next_offset`` (capped at ``TO``). A partition never decided has nothing due."""
    if asked:
        out = {}
        for a in asked:
            nxt = decisions.get(a.tp, Entry(None, 0, None, None)).next_offset
            out[a.tp] = Window(a.first, max(a.first, min(a.end, nxt if nxt is not None else a.first)))
        return out
    out = {}
    for tp, low in earliest.items():
        nxt = decisions[tp].next_offset if tp in decisions else None
        out[tp] = Window(low, max(low, nxt if nxt is not None else low))
    return out


def _names(cfg: Any) -> list[str]:
    """Each sink's name in the report: its fan-out alias, else the connector class as given."""
    return [s.alias or str(cfg.settings["connector.class"]) for s in cfg.sinks]


def audit(name: str, raw: Mapping[str, Any], decisions: Mapping[TopicPartition, Entry], *, bootstrap: str,
          kafka: Mapping[str, Any] | None = None, asked: list[Asked] | None = None) -> dict[str, Any]:
    """The audit report of connector ``name`` (its stored config ``raw``), as JSON: ``ok`` is true only
    when no sink that could be read holds a due record missing, twice, superseded, or one not in the source."""
    from eosink.worker.control.config import parse_connector

    t0 = time.perf_counter()
    kafka = dict(kafka or {})
    cfg = parse_connector(name, dict(raw), source=f"connector {name}")
    topics = sorted(set(cfg.topics) | {tp.topic for tp in decisions} | {a.tp.topic for a in asked or ()})
    # Ranges asked for (the CLI's --offsets, every continuous round) are their own windows: the
    # partitions' low watermarks, a Kafka client and a round trip per partition, are not needed.
    earliest = {} if asked else _partitions(bootstrap, kafka, topics)
    windows = windows_of(decisions, earliest, asked or [])
    notes = _notes(cfg)
    sinks = cfg.create_sinks()
    readers: list[AuditReader] = [s.audit_reader(n) for s, n in zip(sinks, _names(cfg))]
    try:
        keep = any(r.needs_records and r.limit is None for r in readers)
        wants = any(getattr(r, "needs_digests", False) and r.limit is None for r in readers)
        source = src.read(bootstrap, kafka, windows, keep_records=keep, digest=_line_digest(cfg) if wants else None)
        out = [_sink(r, source, windows) for r in readers]
    finally:
        for r in readers:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
    ok = all(s["clean"] is not False for s in out) and any(s["audited"] for s in out)
    if not any(s["audited"] or s["error"] for s in out):
        notes.append("no sink of this connector can be read back: nothing was audited, so it is not reported clean")
    return {"connector": name, "ok": ok, "notes": notes, "sinks": out,
            "source": {"records": source.records, "partitions": len(windows), "seconds": round(source.seconds, 3)},
            "seconds": round(time.perf_counter() - t0, 3)}


def _sink(reader: AuditReader, source: src.SourceIndex, windows: Mapping[TopicPartition, Window]) -> dict[str, Any]:
    doc: dict[str, Any] = {"sink": reader.name, "audited": reader.limit is None, "limit": reader.limit, "error": None}
    if reader.limit is not None:
        doc["clean"] = None  # not audited: never reported as clean
        return doc
    t0 = time.perf_counter()
    try:
        parts: list[PartitionAudit] = tally(reader, source, windows)
        if any(p.missing for p in parts):
            # The decision precedes the sinks' commit: a transaction decided just before the decision
            # log was read may still be becoming visible. Read the sink once more, a moment later.
            time.sleep(RECHECK_S)
            parts = tally(reader, source, windows)
    except EosinkError as exc:
        doc.update(audited=False, error=str(exc), clean=False)
        return doc
    totals = {k: sum(getattr(p, k) for p in parts)
              for k in ("expected", "found_once", *FAULTS, "extra_copies", "in_flight")}
    doc.update(clean=not any(totals[k] for k in FAULTS), totals=totals, partitions=[p.to_json() for p in parts],
               seconds=round(time.perf_counter() - t0, 3))
    return doc


def _line_digest(cfg: Any) -> Callable[[bytes | None], int] | None:
    """How the JSON Lines line of a record's value is digested, when the engine can tell that line
    from the record: ``value.converter`` json (schemaless) or string, and no transform."""
    from eosink.connectors.common.jsoncodec import encode
    from eosink.connectors.common.jsonlines import line_digest

    if cfg.raw.get("transforms") or cfg.settings.get("value.converter.schemas.enable"):
        return None
    if cfg.value_converter == "json":
        return lambda v: line_digest(b"null" if v is None else v)
    if cfg.value_converter == "string":
        return lambda v: line_digest(b"null" if v is None else encode(v.decode("utf-8", "replace")))
    return None


def _notes(cfg: Any) -> list[str]:
    """What may legitimately make a sink differ from its outbox, said up front."""
    notes = []
    if cfg.settings.get("errors.tolerance") == "all":
        notes.append(f"errors.tolerance=all: records the sinks refused went to the dead-letter topic "
                     f"{cfg.settings.get('errors.deadletterqueue.topic.name')} and count as missing here")
    if cfg.raw.get("transforms"):
        notes.append("transforms are set: a record a transform drops or routes elsewhere counts as missing here")
    return notes
