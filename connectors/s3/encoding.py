"""Object bodies of the S3 sink: JSON Lines or Parquet, one object per partition per txn.

``jsonl``: the record's JSON bytes as they were on the topic, one per line (values containing a
line break are re-encoded compactly; non-JSON string values are JSON-quoted): the shared
encoder in :mod:`eosink.connectors.common.jsonlines`. ``parquet``: one Parquet file per object,
schema inferred by pyarrow over the whole batch (the union of the objects' fields), or typed from
the writer's schema for a Schema Registry converter's records (:mod:`.typed`), plus
``__topic``, ``__partition`` and ``__offset`` columns.
"""

from __future__ import annotations

from collections.abc import Callable

from eosink.connectors.api.errors import RecordError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.common import jsonlines
from eosink.connectors.s3.typed import typed_columns

COMPONENT = "s3"
KAFKA_COLUMNS = ("__topic", "__partition", "__offset")
CONTENT_TYPES = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}


def encode_jsonl(records: list[SinkRecord]) -> bytes:
    return jsonlines.values(records, COMPONENT)


def encode_parquet(records: list[SinkRecord]) -> bytes:
    import pyarrow as pa  # only connectors with format=parquet pay for the import
    import pyarrow.parquet as pq

    first = records[0]
    for r in records:
        if not isinstance(r.value, dict):
            raise RecordError("format=parquet needs JSON object values (one column per field)",
                              topic=r.topic, partition=r.partition, offset=r.offset, component=COMPONENT)
    try:
        table = typed_columns(records)  # typed from the writer's schema (a Schema Registry converter's records)
        if table is None:
            table = pa.Table.from_struct_array(pa.array([r.value for r in records]))  # infers over every record
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise RecordError(f"no single Parquet schema fits the batch (offsets {first.offset}..{records[-1].offset}): {exc}",
                          topic=first.topic, partition=first.partition, offset=first.offset, component=COMPONENT) from None
    for name in KAFKA_COLUMNS:
        if name in table.column_names:
            raise RecordError("field collides with the Kafka coordinate column", topic=first.topic,
                              partition=first.partition, offset=first.offset, column=name, component=COMPONENT)
    n = len(records)
    table = (table.append_column("__topic", pa.array([first.topic] * n, pa.string()))
             .append_column("__partition", pa.array([first.partition] * n, pa.int32()))
             .append_column("__offset", pa.array([r.offset for r in records], pa.int64())))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes()


ENCODERS: dict[str, Callable[[list[SinkRecord]], bytes]] = {"jsonl": encode_jsonl, "parquet": encode_parquet}
