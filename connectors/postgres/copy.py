"""Rows and COPY for the PostgreSQL sink (:mod:`eosink.connectors.postgres.sink`): the hot path.

Records are grouped by *shape* (the tuple of keys of their JSON object). A shape becomes one
``COPY target (its columns) FROM STDIN``, so a field a record lacks gets the column's DEFAULT
(NULL unless the table defines one), exactly as if the row had been INSERTed with those columns.

The common case - every record of a batch has the same keys - costs per record: one
``itemgetter`` call, one ``tuple(map(type, ...))`` compared against the type tuples already
checked for that shape, one tuple concatenation for the Kafka coordinates and one
``write_row``. Rows are streamed into COPY while later records are still being encoded, so the
server parses rows while Python builds the next ones. The first record that does not fit the
running shape ends that COPY; the rest of the batch is grouped by shape, one COPY each.

Binary COPY is used when every column is of a kind psycopg encodes exactly (bool, bigint,
double, text, json/jsonb): on the benchmark's rows it measured 10-25% faster than text COPY
(median 547k vs 433k rows/s) and costs the client about half the formatting CPU. Tables with
int2/int4, numeric, timestamptz and the like use text COPY: the server parses and range-checks
those values and names the offending line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import msgspec
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.types.string import BytesBinaryDumper

from eosink.connectors.api.errors import ConfigError, RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres import stage as pgstage
from eosink.connectors.postgres.copy_native import Encoded
from eosink.connectors.postgres.rejects import NeedsDDL, RowRejected, error_line, non_object_error, record_error
from eosink.connectors.postgres.schema import ALLOWED, BINARY_KINDS, GENERATED, KAFKA_COLUMN_NAMES, Column, Table

_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1
astuple = msgspec.structs.astuple
KAFKA_NAMES = frozenset(KAFKA_COLUMN_NAMES)


class NumericTextDumper(Dumper):
    """Text COPY dumper for ``numeric`` columns accepting int, float and str.

    psycopg's own numeric dumper takes only Decimal/int; JSON gives floats and strings
    ("12.34" is the usual way to carry money). ``str()`` of a float is its shortest round-trip
    form; a malformed string is rejected by the server, which names the line. Registered with
    ``register_dumper(None, ...)``: used only through ``Copy.set_types``, never for parameters.
    """

    oid = psycopg.postgres.types["numeric"].oid

    def dump(self, obj: Any) -> bytes:
        return obj.encode() if type(obj) is str else str(obj).encode()


def register_dumpers(conn: psycopg.Connection[Any]) -> None:
    conn.adapters.register_dumper(None, NumericTextDumper)
    # Binary COPY into bytea takes the dumper registered last for its oid: psycopg's DB-API ``Binary``
    # wrapper's, in Python (a third of a native row's COPY time, measured); bytes' own is in C.
    conn.adapters.register_dumper(bytes, BytesBinaryDumper)


def _getter(cols: Sequence[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    if len(cols) == 1:
        key = cols[0]
        return lambda v: (v[key],)
    if not cols:
        return lambda v: ()
    return itemgetter(*cols)


@dataclass(slots=True)
class Shape:
    """How records with one tuple of keys become COPY rows for one table."""

    table: Table
    keys: tuple[str, ...]
    kafka: bool
    cols: tuple[str, ...] = ()  # the keys the table has columns for, in key order
    unknown: tuple[str, ...] = ()  # keys with no column: must be null in every record
    allowed: tuple[frozenset[type], ...] = ()
    types: tuple[str, ...] = ()
    binary: bool = False
    getter: Callable[[dict[str, Any]], tuple[Any, ...]] = field(default=lambda v: ())
    fits: Callable[[tuple[Any, ...]], bool] = field(default=lambda vals: True)
    #: The typed row of a record with exactly these keys and values of the types the columns take
    #: (see :func:`row_type`), None when a column's kind has none; ``decode`` makes one from JSON.
    row_type: type[msgspec.Struct] | None = None
    decode: Callable[[bytes], Any] | None = None
    #: Rows are plain tuples of native values in column order (:mod:`eosink.connectors.postgres.native_rows`),
    #: and nothing else: a record holding another value ends the run.
    native: bool = False
    #: Rows are ``bytes`` the C encoder wrote from the records' JSON (:mod:`eosink.connectors.postgres.copy_native`),
    #: joined and written to a COPY of this shape as they are, by the streamed COPY only.
    encoded: Encoded | None = None

    @classmethod
    def of(cls, table: Table, keys: tuple[str, ...], kafka: bool) -> Shape:
        cols = tuple(k for k in keys if k in table.columns)
        unknown = tuple(k for k in keys if k not in table.columns)
        columns = [table.columns[c] for c in cols]
        kcols = [table.columns[c] for c in KAFKA_COLUMN_NAMES] if kafka else []
        binary = all(c.kind in BINARY_KINDS for c in columns) and all(kafka_binary_ok(c) for c in kcols)
        allowed = tuple(ALLOWED[c.kind] for c in columns)
        rt = row_type(columns) if cols and not unknown else None
        return cls(
            table, keys, kafka, cols, unknown,
            allowed=allowed,
            types=tuple(c.copy_type for c in columns + kcols),
            binary=binary,
            getter=_getter(cols),
            fits=compile_type_check(allowed),
            row_type=rt,
            decode=msgspec.json.Decoder(rt).decode if rt is not None else None,
        )

    @property
    def all_cols(self) -> tuple[str, ...]:
        return self.cols + (KAFKA_COLUMN_NAMES if self.kafka else ())

    def copy_statement(self, target: sql.Identifier, extra: tuple[str, ...] = ()) -> sql.Composed:
        """``COPY target (the shape's columns, then ``extra``) FROM STDIN``, binary when it can be."""
        fmt = " (FORMAT BINARY)" if self.binary else ""
        return sql.SQL("COPY {} ({}) FROM STDIN" + fmt).format(  # fmt: one of two constants
            target, sql.SQL(", ").join(map(sql.Identifier, self.all_cols + extra))
        )

    def check(self, vals: tuple[Any, ...], rec: SinkRecord) -> None:
        """Slow path of the type check (after :attr:`fits` said no): name the column."""
        for col, x, allowed in zip(self.cols, vals, self.allowed):
            if type(x) not in allowed:
                column = self.table.columns[col]
                if column.kind == GENERATED:
                    raise record_error(rec, f"column {col!r} of {self.table.display} is generated and cannot be written", col)
                raise record_error(
                    rec,
                    f"a JSON {type(x).__name__} ({_short(x)}) does not fit column {col!r} of type {column.sqltype or column.typname}"
                    f" in {self.table.display}",
                    col,
                )

    def check_unknown(self, v: dict[str, Any], rec: SinkRecord, evolve: bool) -> None:
        for k in self.unknown:
            if v[k] is not None:
                if evolve:
                    raise NeedsDDL(self.table, k)
                raise record_error(rec, f"{self.table.display} has no column {k!r} and auto.evolve is false", k)


_TYPE_NAMES: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str", dict: "dict", list: "list"}
_ANY_JSON = frozenset(_TYPE_NAMES) | {type(None)}


def compile_type_check(allowed: Sequence[frozenset[type]]) -> Callable[[tuple[Any, ...]], bool]:
    """``vals -> bool``: does every value's exact type fit its column? Generated per shape.

    The obvious ``tuple(map(type, vals)) in ok_set`` costs ~3x more per record (measured: ~670
    vs ~200 ns for 9 columns), and it runs for every record. The generated source contains
    only column indexes and the builtin type names of :data:`_TYPE_NAMES` - nothing from input.
    """
    terms: list[str] = []
    for i, a in enumerate(allowed):
        if a >= _ANY_JSON:
            continue  # json/jsonb: any JSON value
        alts = [f"type(x) is {name}" for t, name in _TYPE_NAMES.items() if t in a]
        if type(None) not in a or not alts:
            terms.append("False")  # generated column: nothing fits
            continue
        terms.append(f"((x := vals[{i}]) is None or {' or '.join(alts)})")
    source = "lambda vals: " + (" and ".join(terms) if terms else "True")
    namespace: dict[str, Any] = {"__builtins__": {}, "type": type, **{name: t for t, name in _TYPE_NAMES.items()}}
    return eval(source, namespace)  # noqa: S307 - built from constants above


#: The msgspec type that accepts exactly the JSON values a column of each kind takes (:data:`ALLOWED`:
#: ``true`` is no int, ``1.0`` no int, an int stays an int in a float column). Kinds without one
#: (json, numeric, other, generated) keep their records on the dict path.
_ROW_TYPES: dict[str, Any] = {pgs.BOOL: bool | None, pgs.INT8: int | None, pgs.INT: int | None,
                              pgs.FLOAT: int | float | None, pgs.TEXT: str | None}


#: What msgspec refuses in a renamed field's name (a column so named keeps its records on the dict path).
_UNRENAMABLE = re.compile(r'[\\"\x00-\x1f]')


def row_type(columns: Sequence[Column]) -> type[msgspec.Struct] | None:
    """A struct of exactly ``columns`` (in order, all required, no other field), each typed as the
    column's kind allows, or None. msgspec decodes a JSON object into it with the parser that decodes
    it into a dict - the same strings, numbers (a big int stays exact), duplicate keys (the last wins)
    - and refuses anything else: a missing or unknown field, another type, another JSON value. So a
    record it takes gives the row :func:`copy_rows` would have built from its dict, type checks done
    (about 0.3 us per 200-byte record less to decode, and less to free, than the dict; measured)."""
    types = [_ROW_TYPES.get(c.kind) for c in columns]
    if any(t is None for t in types) or any(_UNRENAMABLE.search(c.name) for c in columns):
        return None
    fields = [(f"f{i}", t) for i, t in enumerate(types)]  # column names need not be identifiers
    return msgspec.defstruct("Row", fields, rename={f"f{i}": c.name for i, c in enumerate(columns)},
                             forbid_unknown_fields=True, gc=False)


def kafka_binary_ok(c: Column) -> bool:
    """Binary COPY sends fixed-width ints that psycopg truncates silently when too wide for the
    column: partitions (< 2**31) fit int4 or int8; offsets need int8 (a user table could have
    made ``__offset`` an int4)."""
    if c.name == "__partition":
        return c.typname in ("int4", "int8")
    if c.name == "__offset":
        return c.typname == "int8"
    return c.kind in BINARY_KINDS


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _client_side(rec: SinkRecord, shape: Shape, vals: tuple[Any, ...], exc: Exception) -> RecordError:
    """A value psycopg could not encode (e.g. an int beyond bigint in binary COPY)."""
    column = None
    for col, x in zip(shape.cols, vals):
        if type(x) is int and not _INT8_MIN <= x <= _INT8_MAX:
            column = col
            break
    return record_error(rec, f"value cannot be encoded for {shape.table.display}: {exc}", column)


def check_shape(shape: Shape, first: SinkRecord) -> None:
    """Refuse a shape no COPY can take (naming ``first``, the shape's first record)."""
    if not shape.all_cols:
        raise record_error(first, f"no field of the record maps to a column of {shape.table.display}")
    if shape.kafka and not KAFKA_NAMES.isdisjoint(shape.keys):
        clash = next(k for k in shape.keys if k in KAFKA_NAMES)
        raise record_error(first, f"field {clash!r} collides with the Kafka coordinate columns (fields.kafka=true)", clash)


def copy_rows(write: Callable[[tuple[Any, ...]], None], shape: Shape, recs: Sequence[SinkRecord],
              values: Sequence[Any], evolve: bool, ordinal: int | None = None) -> int:
    """Write the leading records that fit ``shape`` as rows with ``write`` (an open COPY's
    ``write_row``); return how many. Stops at the first record with other keys. Raises
    :class:`RecordError` for a value of the wrong type and :class:`NeedsDDL` for a new field.
    ``ordinal``: each row ends with the record's offset and its position in the batch (``ordinal``
    for the first record), the columns a streamed upsert dedupes by (:data:`stage.ORDER`)."""
    getter, n, fits, kafka = shape.getter, len(shape.keys), shape.fits, shape.kafka
    exact = frozenset(shape.keys) if shape.unknown else None
    typed, native = shape.row_type, shape.native
    count = 0
    for r, v in zip(recs, values):
        if v.__class__ is typed:  # a row decoded by this shape's decoder: its keys and types are checked
            vals = astuple(v)
        elif native:  # a row decoded for this shape's columns from its writer's schema
            if v.__class__ is not tuple or len(v) != n:
                break
            vals = v
        else:
            try:
                if len(v) != n:
                    break
                vals = getter(v)
            except (KeyError, TypeError):
                break  # not a dict (another shape's row included), or other keys
            if exact is not None:
                if v.keys() != exact:
                    break
                shape.check_unknown(v, r, evolve)
            if not fits(vals):
                shape.check(vals, r)
        row = vals + (r.topic, r.partition, r.offset) if kafka else vals
        if ordinal is not None:
            row += (r.offset, ordinal + count)
        try:
            write(row)
        except (psycopg.OperationalError, psycopg.InterfaceError, MemoryError):
            raise  # the connection or the process, not the value
        except Exception as exc:  # noqa: BLE001 - a dumper refusing the value (OverflowError, struct.error, ...)
            shape.check(vals, r)  # names the column when the type is the problem
            raise _client_side(r, shape, vals, exc) from exc
        count += 1
    return count


def copy_run(
    cur: psycopg.Cursor[Any],
    shape: Shape,
    recs: Sequence[SinkRecord],
    values: Sequence[Any],
    target: sql.Identifier,
    evolve: bool,
) -> int:
    """COPY the leading records that fit ``shape`` into ``target``; return how many.

    Stops at the first record with other keys (the caller regroups the rest). Raises
    :class:`RecordError` for a value of the wrong type, :class:`NeedsDDL` for a new field and
    :class:`RowRejected` when the server refuses the rows.
    """
    check_shape(shape, recs[0])
    try:
        with cur.copy(shape.copy_statement(target)) as cp:
            cp.set_types(list(shape.types))
            return copy_rows(cp.write_row, shape, recs, values, evolve)
    except (psycopg.DataError, psycopg.IntegrityError) as exc:
        line = error_line(exc)
        suspect = recs[line - 1] if line is not None and 0 < line <= len(recs) else None
        raise RowRejected(shape.table, suspect, exc) from exc


def group_by_shape(recs: Sequence[SinkRecord], values: Sequence[Any]) -> dict[tuple[str, ...], list[int]]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (r, v) in enumerate(zip(recs, values)):
        if type(v) is not dict:
            raise non_object_error(r, v)
        groups.setdefault(tuple(v), []).append(i)
    return groups


def write_insert(
    cur: psycopg.Cursor[Any], table: Table, recs: Sequence[SinkRecord], values: Sequence[Any], kafka: bool, evolve: bool
) -> None:
    """Insert mode: stream the batch into the table, one COPY per shape."""
    if not recs:
        return
    first = values[0]
    if type(first) is not dict:
        raise non_object_error(recs[0], first)
    done = copy_run(cur, Shape.of(table, tuple(first), kafka), recs, values, table.ident, evolve)
    if done == len(recs):
        return
    rest_r, rest_v = recs[done:], values[done:]
    for keys, idx in group_by_shape(rest_r, rest_v).items():
        sub_r = [rest_r[i] for i in idx]
        sub_v = [rest_v[i] for i in idx]
        copy_run(cur, Shape.of(table, keys, kafka), sub_r, sub_v, table.ident, evolve)


def latest_per_key(recs: Sequence[SinkRecord], values: Sequence[Any], pk: Sequence[str]) -> list[int]:
    """Indexes of the records that win per primary key: the highest offset (then the later one)."""
    get = _getter(pk)
    latest: dict[tuple[Any, ...], int] = {}
    for i, (r, v) in enumerate(zip(recs, values)):
        if type(v) is not dict:
            raise non_object_error(r, v)
        try:
            key = get(v)
        except KeyError as exc:
            raise record_error(r, f"primary key field {exc.args[0]!r} is missing (pk.fields = {', '.join(pk)})", exc.args[0]) from None
        for f, x in zip(pk, key):
            if x is None or type(x) in (dict, list):
                what = "null" if x is None else f"a JSON {type(x).__name__}"
                raise record_error(r, f"primary key field {f!r} is {what}", f)
        j = latest.get(key)
        if j is None or recs[j].offset <= r.offset:
            latest[key] = i
    return sorted(latest.values())


def write_upsert(
    cur: psycopg.Cursor[Any],
    table: Table,
    recs: Sequence[SinkRecord],
    values: Sequence[Any],
    kafka: bool,
    evolve: bool,
    pk: Sequence[str],
) -> None:
    """Upsert mode, the batch written at prepare: dedupe by key, then per shape ``COPY stage``,
    ``INSERT INTO target (cols) SELECT cols FROM stage ON CONFLICT (pk) DO UPDATE SET <the shape's
    non-key columns> = EXCLUDED...`` and ``DROP`` the stage, which lives only in this transaction
    (:mod:`eosink.connectors.postgres.stage`). A field a record lacks keeps the existing row's value
    on update and gets the DEFAULT on insert.
    """
    if not recs:
        return
    keep = latest_per_key(recs, values, pk)
    recs = [recs[i] for i in keep]
    values = [values[i] for i in keep]
    for keys, idx in group_by_shape(recs, values).items():
        shape = Shape.of(table, keys, kafka)
        missing = [f for f in pk if f not in shape.cols]
        if missing:  # latest_per_key saw them in the record: the table lacks the column
            raise ConfigError(f"table {table.display} has no column {missing[0]!r} of pk.fields", key="pk.fields")
        sub_r = [recs[i] for i in idx]
        sub_v = [values[i] for i in idx]
        check_shape(shape, sub_r[0])
        stage = pgstage.create(cur, table, shape.all_cols)
        copy_run(cur, shape, sub_r, sub_v, stage, evolve)
        try:
            cur.execute(pgstage.merge(table, shape.all_cols, pk, stage))
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise RowRejected(table, None, exc) from exc
        pgstage.drop(cur, stage)


__all__ = [
    "Shape",
    "check_shape",
    "copy_rows",
    "copy_run",
    "group_by_shape",
    "latest_per_key",
    "register_dumpers",
    "row_type",
    "write_insert",
    "write_upsert",
]
