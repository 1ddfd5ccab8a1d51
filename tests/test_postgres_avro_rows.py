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

from tests.conftest import RegistryServer
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
