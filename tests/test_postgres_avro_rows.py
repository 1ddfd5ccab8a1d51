"""Avro values decoded straight into native rows, end to end: the stack's Schema Registry, one real worker,
the stack's PostgreSQL.

The first cycle's records reach the sink as the converter's dicts (its stream then offers native rows);
the records produced after it are decoded straight into native rows and COPYed in binary. Every id must
land once, every value exactly as the writer wrote it: a decimal in its numeric column, an instant in
its timestamptz column, bytes in their bytea column, a null where the union said null.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from eosink.connectors.api.records import SinkRecord
from tests.conftest import RegistryServer
from tests.test_postgres_sink import make_sink  # noqa: F401 - the fixture
from tests.test_postgres_typed_schema import avro
from tests.test_schema_registry import connector

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "blob", "type": "bytes"},
    {"name": "note", "type": ["null", "string"], "default": None}]}
EPOCH = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)


def order(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"cüstomer-{i % 97}\t\\", "amount": decimal.Decimal(i * 7919 % 10**9 - 5 * 10**8).scaleb(-2),
            "at": EPOCH + datetime.timedelta(milliseconds=i * 1_000_003), "blob": i.to_bytes(3, "big") + b"\x00\\",
            "note": None if i % 3 else f"n{i}"}


def test_avro_records_land_once_and_exactly_through_native_rows(registry: RegistryServer, stack, make_topic, unique, pg,
                                                                tmp_path) -> None:
    from tests.procs import WorkerProcess, register, wait_until
    from tests.restkit import pg_ids, produce

    topic = make_topic(3)
    encode = avro(registry.url, topic, ORDER)
    first, total = 30, 6000
    produce(stack.kafka_bootstrap, topic, [(i % 3, encode(order(i))) for i in range(first)])
    register(stack.zookeeper_hosts, unique, unique.replace("_", "-"), connector("avro", registry.url, topic, unique))
    w = WorkerProcess(stack, unique, "w1", tmp_path)
    try:
        wait_until(lambda: len(pg_ids(pg, unique)) >= first, 90, f"{first} rows")
        for start in range(first, total, 1990):  # several cycles, each of native rows
            produce(stack.kafka_bootstrap, topic, [(i % 3, encode(order(i))) for i in range(start, min(total, start + 1990))])
        wait_until(lambda: len(pg_ids(pg, unique)) >= total, 120, f"{total} rows")
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
    assert sorted(pg_ids(pg, unique)) == list(range(total)), "not every record exactly once"
    rows = pg.execute(f'SELECT id, name, amount, "at", blob, note FROM "{unique}" ORDER BY id').fetchall()
    wrong = [r for r in rows if r != tuple(order(r[0]).values())]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {wrong[:2]} against {[tuple(order(r[0]).values()) for r in wrong[:2]]}"
    assert pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{unique}%",)).fetchone()[0] == 0


def test_an_upsert_streams_avro_values_as_native_rows_through_its_stage(registry: RegistryServer, make_topic, unique, pg,
                                                                        make_sink) -> None:  # noqa: F811 - the fixture
    """Upsert mode: after a cycle of the converter's dicts the sink offers native rows. A cycle of them meeting
    known keys ends its direct stream (the prepare writes it, and the next cycle is dicts again); once a
    stream ran through the stage, native rows stream into the transaction's stage in binary, a key twice in
    a batch taken from its later record. The table holds each key once with its
    latest values; no stage and no prepared transaction is left."""
    from eosink.worker.engine.avro_rows import AvroRows
    from eosink.worker.engine.registry_converters import RegistryDecoder
    from tests.sinkkit import manifest_for

    topic = make_topic(1)
    encode, decode = avro(registry.url, topic, ORDER), RegistryDecoder("avro", registry.url)
    sink = make_sink({"table.name.format": unique, "insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id",
                      "fields.kafka": "false"})
    want: dict[int, tuple[Any, ...]] = {}
    offset = 0

    def cycle(n: int, ids: list[int], native: AvroRows | None, staged: bool = False, dicts_first: int = 0) -> None:
        nonlocal offset
        txn, recs = f"{unique}.w1.1.{n}", []
        for k, i in enumerate(ids):
            value = {**order(i), "name": f"c{n}-{offset}"}
            raw = encode(value)
            # As the source asks: None while the sink offers none (and, with dicts_first, for the first slice).
            row = native() if native is not None and k >= dicts_first else None
            rec = SinkRecord(topic, 0, offset, None, decode(raw) if row is None else row(raw), raw)
            if row is not None and native is not None:
                rec.__class__ = native.record_class
            rec.value_schema = decode.schema
            recs.append(rec)
            want[i] = tuple(value.values())
            offset += 1
        sink.begin_transaction(txn)
        for k in range(0, len(recs), 7):
            sink.write(recs[k:k + 7])
        if staged:
            st = sink._stream
            assert st is not None and st.stage is not None and st.shape.native, "native rows streamed into the stage"
        sink.pre_commit(manifest_for(txn, sink.connector, recs))
        sink.commit(txn)

    assert sink.native_row_target() is None, "no native rows before a stream ran"
    cycle(1, list(range(20)), None)
    assert sink.native_row_target() is not None, "an upsert sink offers native rows once its stream ran"
    rows = AvroRows(decode, sink.native_row_target)
    cycle(2, [*range(10, 30), 12], rows)  # known keys: the direct stream ends, the prepare writes the batch
    assert sink.native_row_target() is None, "rows again only after a stream that ran without a hitch"
    cycle(3, [*range(0, 10), 25, 3], rows)  # dicts, through the stage from now on (DIRECT_PAUSE)
    assert sink.native_row_target() is not None
    cycle(4, [*range(5, 35), 7], rows, staged=True)
    cycle(5, [*range(30, 40), 31], rows, staged=True)
    cycle(6, [*range(0, 40, 3), 6, 9], rows, staged=True, dicts_first=7)  # dicts, then rows: the stage's COPY switches
    got = {r[0]: r for r in pg.execute(f'SELECT id, name, amount, "at", blob, note FROM "{unique}"').fetchall()}
    assert got == want
    assert pg.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE %s", (f"{unique}%eosink_stage%",)).fetchone()[0] == 0
    assert pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"eosink:{unique}%",)).fetchone()[0] == 0
