"""What a txn writes to each Iceberg table, before anything is written: the records as Arrow, the table ready.

Per target table of the batch: load it; parse the JSON bytes straight into Arrow
(:mod:`.jsonarrow`), or else convert the decoded values for the table as it is; only when the
batch needs more (a missing table, a new column) create or evolve it, then convert; and refuse
an older epoch (the resource fence). Every record is checked here, so a RecordError comes before
any file of the txn is written, and ``pre_commit`` writes files only for a batch that fits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider

from eosink.connectors.api.records import SinkRecord, TxnManifest
from eosink.connectors.iceberg import arrow as ia
from eosink.connectors.iceberg import jsonarrow
from eosink.connectors.iceberg import txn as itx
from eosink.connectors.iceberg.store import txn_key
from eosink.connectors.iceberg.tables import Tables
from eosink.connectors.iceberg.txn import TableTxn


@dataclass
class Plan:
    """Per table, in name order, where the txn's files go and their rows; and what finding that out cost."""

    tables: list[tuple[TableTxn, pa.Table]] = field(default_factory=list)
    load_ms: float = 0.0
    convert_ms: float = 0.0


def plan_tables(connector: str, manifest: TxnManifest, records: list[SinkRecord], *, tables: Tables,
         table_name: Callable[[str], str], kafka: bool) -> Plan:
    txn = manifest.txn_id
    idents = {t: table_name(t) for t in {r.topic for r in records}}
    groups: dict[str, tuple[list[SinkRecord], list[dict[str, Any]] | None, set[str]]] = {}
    if len(set(idents.values())) <= 1:  # one table (the common case): no per-record grouping
        for ident in set(idents.values()):
            groups[ident] = (records, None, set(idents))  # values decoded only if the JSON bytes cannot be parsed
    else:
        for r in records:
            ident = idents[r.topic]
            g = groups.get(ident)
            if g is None:
                g = groups[ident] = ([], None, {t for t, i in idents.items() if i == ident})
            g[0].append(r)
    key = txn_key(connector, txn)
    out = Plan()
    for ident in sorted(groups):
        recs, vals, topics = groups[ident]
        l0 = time.perf_counter()
        ranges = [r for r in manifest.ranges if r.topic in topics]
        try:
            table: Table | None = tables.load(ident)
        except NoSuchTableError:
            table = None
        # Records of a Schema Registry converter carry their writer's schema: a version not yet compared
        # with the table evolves it first; their values are the converter's text forms (typed=True).
        typed = bool(tables.typed(recs))
        if typed and table is not None:
            table = tables.evolve_typed(ident, recs, table)
        c0 = time.perf_counter()
        arrow = jsonarrow.from_json(table.schema(), recs, kafka, topics) if table is not None and not typed else None
        if arrow is None:
            vals = ia.check_values(recs) if vals is None else vals
            arrow = _as_is(table, recs, vals, topics, kafka, typed) if table is not None else None
        c1 = l1 = time.perf_counter()
        complete = arrow is not None
        if table is None or arrow is None:
            assert vals is not None
            table, complete = tables.ensure(ident, recs, vals, table)
        itx.check_fence(connector, table, ranges, txn)
        l2 = time.perf_counter()
        if arrow is None:
            assert vals is not None
            arrow = ia.to_arrow(table.schema(), recs, vals, kafka, unknown_ok=complete, topics=topics, typed=typed)
        out.convert_ms += (c1 - c0 + time.perf_counter() - l2) * 1000
        out.load_ms += (c0 - l0 + l2 - l1) * 1000
        data_path = load_location_provider(table.metadata.location, table.metadata.properties).data_path
        tt = TableTxn(ident, f"{data_path}/eosink-{key}", sorted({(r.topic, r.partition) for r in ranges}), loaded=table)
        out.tables.append((tt, arrow))
    return out


def _as_is(table: Table, recs: list[SinkRecord], vals: list[dict[str, Any]], topics: set[str], kafka: bool,
           typed: bool) -> pa.Table | None:
    """The batch as Arrow for ``table`` as it is, when every field already has a column there and
    every value fits; else None, and the caller takes the full path (create or evolve the table,
    then convert), whose result and errors are then exactly those of a batch that never tried.

    The common batch needs no new column: converting first and counting keys afterwards
    (:func:`~eosink.connectors.iceberg.arrow.all_fields_have_columns`) skips the union of every
    record's keys that evolution needs (~3 ms per 50,000 records).
    """
    try:
        arrow = ia.to_arrow(table.schema(), recs, vals, kafka, unknown_ok=True, topics=topics, typed=typed)
    except Exception:  # noqa: BLE001 - the full path judges (and names) the batch again
        return None
    return arrow if ia.all_fields_have_columns(arrow, vals, kafka) else None
