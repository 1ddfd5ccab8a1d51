"""Parquet columns of the S3 sink typed from the records' registered schema (Avro, Protobuf, JSON Schema).

Inferred from the decoded values, a decimal would be a string column and bytes their ``\\x`` hex text.
Records read with a Schema Registry converter carry their writer's schema, so an object's columns take
the types the Iceberg sink gives the same fields (:mod:`eosink.connectors.iceberg.schema_types`, as
Arrow by pyiceberg's own mapping: decimal128(p,s), timestamp[us, tz=UTC], date32, binary, structs...)
and the values are turned back into those types (:mod:`eosink.connectors.iceberg.typed_values`): the
same mapping in both lake formats, one place to change it.

That mapping is pyiceberg's: without the ``iceberg`` extra installed, :func:`typed_columns` answers
None and the columns stay inferred from the values (the S3 sink's own extra needs only pyarrow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Any

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import SinkRecord

COMPONENT = "s3"


def typed_columns(records: Sequence[SinkRecord]) -> Any:
    """The records' value fields as a typed Arrow table (no Kafka columns), or None where the values keep
    their inferred types: records without a schema, a schema not typed as a record, pyiceberg absent, or
    versions whose common fields disagree on a type (each version's fields are the union's, nullable
    where a version lacks them, inside structs too)."""
    if not records or (records[0].value_schema is None and records[-1].value_schema is None):
        return None
    try:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        from eosink.connectors.iceberg import schema_types as ist
        from eosink.connectors.iceberg.typed_values import arrow_array, convert_column
    except ImportError:
        return None
    schemas = list(dict.fromkeys(map(attrgetter("value_schema"), records)))
    if None in schemas:
        return None
    merged: dict[str, ist.FieldType] = {}
    versions = [ist.fields_of(s) for s in schemas]
    for fields in versions:
        if fields is None:
            return None
        for name, ft in fields.items():
            seen = merged.get(name)
            wide = ft.type if seen is None else ist.widest(seen.type, ft.type)  # (int then long, a struct's new field)
            if wide is None:
                return None
            merged[name] = replace(ft, type=wide)
    nullable = {n for n in merged if any(fields is not None and (n not in fields or fields[n].nullable) for fields in versions)}
    schema = ist.table_schema([ist.FieldType(n, f.type, n in nullable, f.defaulted, f.source) for n, f in merged.items()], ())
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    values = [r.value for r in records]
    arrays = []
    for f in arrow_schema:
        col = [v.get(f.name) for v in values]
        ftype = schema.find_field(f.name).field_type
        try:
            arrays.append(arrow_array(convert_column(col, ftype), f.type))
        except (ValueError, TypeError, AttributeError, ArithmeticError, pa.ArrowException) as exc:
            raise _bad(records, col, f.name, ftype, f.type) or RecordError(
                f"column '{f.name}' cannot be written as {f.type}: {exc}", topic=records[0].topic,
                partition=records[0].partition, offset=records[0].offset, component=COMPONENT) from None
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _bad(records: Sequence[SinkRecord], col: list[Any], name: str, ftype: Any, arrow_type: Any) -> RecordError | None:
    """The first record whose value does not convert, named."""
    from eosink.connectors.iceberg.typed_values import arrow_array, convert_column

    for r, x in zip(records, col):
        try:
            arrow_array(convert_column([x], ftype), arrow_type)
        except Exception as exc:  # noqa: BLE001 - any failure marks the offending value
            return RecordError(f"{x!r:.60} is not a value of column type {arrow_type} ({exc})", topic=r.topic,
                               partition=r.partition, offset=r.offset, column=name, component=COMPONENT)
    return None
