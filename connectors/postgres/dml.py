"""Deletes (``delete.enabled``) and updates (``insert.mode=update``) by primary key, batched.

Both go through a staging table, as upserts do (:func:`eosink.connectors.postgres.copy.write_upsert`):
per table and shape, the stage created in the transaction, one ``COPY stage`` of the batch's keys
(and, for updates, values), one set-based statement against the target, the stage dropped -
never a round trip per record. The stage exists only inside its transaction, so no other session
sees it and none is left behind (:mod:`eosink.connectors.postgres.stage`).

**Tombstone order.** Within a batch the last record per key wins, as if the records were applied
one by one: an insert then a tombstone of that key leaves no row; a tombstone then an insert
leaves the inserted row - a fresh one, so a field the insert lacks gets the column's DEFAULT, not
the deleted row's value. :func:`split_tombstones` implements it by deleting every key that has a
tombstone in the batch *first*, then writing only the records that come after their key's last
tombstone. "After" is the higher offset (then the later position), the rule upserts use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from eosink.connectors.api.errors import ConfigError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.postgres import stage as pgstage
from eosink.connectors.postgres.copy import Shape, check_shape, copy_run, group_by_shape, latest_per_key
from eosink.connectors.postgres.rejects import RowRejected, record_error
from eosink.connectors.postgres.schema import Table


def _key(rec: SinkRecord, v: Any, pk: Sequence[str]) -> tuple[Any, ...]:
    try:
        key = tuple(v[f] for f in pk)
    except (KeyError, TypeError) as exc:
        missing = exc.args[0] if isinstance(exc, KeyError) else pk[0]
        raise record_error(rec, f"primary key field {missing!r} is missing from the Kafka key (pk.fields = {', '.join(pk)})",
                           str(missing)) from None
    for f, x in zip(pk, key):
        if x is None or type(x) in (dict, list):
            what = "null" if x is None else f"a JSON {type(x).__name__}"
            raise record_error(rec, f"primary key field {f!r} is {what}", f)
    return key


def split_tombstones(
    recs: Sequence[SinkRecord], values: Sequence[Any], pk: Sequence[str]
) -> tuple[list[SinkRecord], list[dict[str, Any]], list[SinkRecord], list[Any]]:
    """``(delete_recs, delete_keys, write_recs, write_values)``: one key row per deleted key (its
    last tombstone), and the records that outlive their key's last tombstone, in batch order."""
    last: dict[tuple[Any, ...], tuple[int, int]] = {}  # key -> (offset, index) of its last tombstone
    for i, r in enumerate(recs):
        if r.value is None:
            key = _key(r, values[i], pk)
            seen = last.get(key)
            if seen is None or seen <= (r.offset, i):
                last[key] = (r.offset, i)
    if not last:
        return [], [], list(recs), list(values)
    order = sorted((i, key) for key, (_, i) in last.items())
    del_recs = [recs[i] for i, _ in order]
    del_keys = [dict(zip(pk, key)) for _, key in order]
    keep_r: list[SinkRecord] = []
    keep_v: list[Any] = []
    for i, (r, v) in enumerate(zip(recs, values)):
        if r.value is None:
            continue
        try:
            t = last.get(tuple(v[f] for f in pk))
        except (KeyError, TypeError):
            t = None  # no usable key: the write names the record
        if t is not None and (r.offset, i) < t:
            continue  # overwritten by a later tombstone of its key
        keep_r.append(r)
        keep_v.append(v)
    return del_recs, del_keys, keep_r, keep_v


def _match(pk: Sequence[str]) -> sql.Composable:
    return sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(f)) for f in pk)


def _pk_columns(table: Table, shape: Shape, pk: Sequence[str]) -> None:
    missing = [f for f in pk if f not in shape.cols]
    if missing:
        raise ConfigError(f"table {table.display} has no column {missing[0]!r} of the primary key", key="pk.fields")


def write_delete(cur: psycopg.Cursor[Any], table: Table, recs: Sequence[SinkRecord], keys: Sequence[dict[str, Any]],
                 pk: Sequence[str]) -> None:
    """``COPY stage (pk)``, ``DELETE FROM target USING stage`` on every key column, drop the stage."""
    if not recs:
        return
    shape = Shape.of(table, tuple(pk), False)
    _pk_columns(table, shape, pk)
    stage = pgstage.create(cur, table, shape.all_cols)
    done = copy_run(cur, shape, recs, keys, stage, False)
    assert done == len(recs), "key rows have exactly the key's fields"
    try:
        cur.execute(sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE {}").format(table.ident, stage, _match(pk)))
    except (psycopg.DataError, psycopg.IntegrityError) as exc:  # e.g. a foreign key still pointing at the row
        raise RowRejected(table, recs[0] if len(recs) == 1 else None, exc) from exc
    pgstage.drop(cur, stage)


def write_update(
    cur: psycopg.Cursor[Any],
    table: Table,
    recs: Sequence[SinkRecord],
    values: Sequence[Any],
    kafka: bool,
    evolve: bool,
    pk: Sequence[str],
) -> None:
    """Update mode: the latest record per key, per shape ``COPY stage`` then ``UPDATE target SET
    <the shape's non-key columns> FROM stage WHERE <keys match>``. A key without a row stays absent;
    a field the record lacks keeps the row's value."""
    if not recs:
        return
    keep = latest_per_key(recs, values, pk)
    recs = [recs[i] for i in keep]
    values = [values[i] for i in keep]
    pk_set = set(pk)
    for keys, idx in group_by_shape(recs, values).items():
        shape = Shape.of(table, keys, kafka)
        _pk_columns(table, shape, pk)
        updates = [c for c in shape.all_cols if c not in pk_set]
        if not updates:
            continue  # nothing but the key: an update changes nothing
        sub_r = [recs[i] for i in idx]
        sub_v = [values[i] for i in idx]
        check_shape(shape, sub_r[0])
        stage = pgstage.create(cur, table, shape.all_cols)
        copy_run(cur, shape, sub_r, sub_v, stage, evolve)
        sets = sql.SQL(", ").join(sql.SQL("{0} = s.{0}").format(sql.Identifier(c)) for c in updates)
        try:
            cur.execute(sql.SQL("UPDATE {} AS t SET {} FROM {} AS s WHERE {}").format(table.ident, sets, stage, _match(pk)))
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise RowRejected(table, None, exc) from exc
        pgstage.drop(cur, stage)


__all__ = ["split_tombstones", "write_delete", "write_update"]
