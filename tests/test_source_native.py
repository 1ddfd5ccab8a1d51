"""The source's C loop (``worker/native/_records.c``) builds exactly the records of the Python loop.

From the real Kafka, a topic holding values the row decoder takes, values it refuses
(another field, another type, not JSON at all), empty values, keys, headers and none: read with the C
loop and with the Python loop (``EOSINK_SOURCE_NATIVE=0``), in batches of every size limit, the two
must give the same records (class, coordinates, key, row, bytes, headers, timestamp), the same batches,
the same refusal naming the same record, and the same records left for the next poll.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from confluent_kafka import Producer

from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.connectors.api.rows import RowRecord, row_of
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import copy_native
from eosink.connectors.postgres import schema as pgs
from eosink.worker import native
from eosink.worker.engine.source import KafkaSource
from eosink.worker.stack import Endpoints

pytestmark = pytest.mark.skipif(native.filler() is None, reason="the C extension is not built (or EOSINK_SOURCE_NATIVE=0)")

TABLE = pgs.Table(None, "t", {c.name: c for c in [pgs.Column("id", "int8", pgs.INT8), pgs.Column("name", "text", pgs.TEXT)]})
SHAPE = pgc.Shape.of(TABLE, ("id", "name"), kafka=False)


def values(n: int, seed: int) -> list[bytes | None]:
    rnd = random.Random(seed)
    odd = [b'{"id":1,"name":"x","more":1}', b'{"id":"1","name":"x"}', b"{broken", b"", None, b"[1,2]", b'{"id":1.5,"name":null}']
    return [rnd.choice(odd) if rnd.random() < 0.1 else f'{{"id":{i},"name":"n\\u00e9{i}"}}'.encode() for i in range(n)]


def read(bootstrap: str, topic: str, partitions: int, group: str, decoder: Callable[[bytes], Any], c_loop: bool, limits: tuple[int, int],
         tolerate: bool) -> list[Any]:
    """Every batch polled until the topic is read (or a refusal ends the reading), as comparable tuples."""
    native.records_enabled = c_loop
    src = KafkaSource(group, bootstrap, value_converter="json", tolerate=tolerate)
    out: list[Any] = []
    try:
        src.assign({TopicPartition(topic, p): 0 for p in range(partitions)})
        got = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = src.poll_batch(limits[0], limits[1], 0.5, min_s=0.0, rows=lambda: decoder)
            recs = [(type(r).__name__, r.topic, r.partition, r.offset, r.key, _row(row_of(r)), r.raw_value,
                     SinkRecord.__dict__["headers"].__get__(r) if type(r) is not RowRecord else "message", r.headers,
                     r.timestamp_ms) for r in batch.records]
            failed = [(f.partition, f.offset, str(f.error)) for f in batch.failed]
            err = None if batch.error is None else (batch.error.partition, batch.error.offset, str(batch.error))
            out.append((recs, failed, err, batch.nbytes))
            got += len(batch.records) + len(batch.failed)
            if err is not None or (not batch.records and not batch.failed and src.caught_up()):
                break
    finally:
        native.records_enabled = True
        src.close()
    return [b for b in out if b[0] or b[1] or b[2]]


def _row(v: Any) -> Any:
    return msgspec.structs.astuple(v) if isinstance(v, msgspec.Struct) else v


@pytest.mark.parametrize("limits", [(10_000, 10_000_000), (7, 10_000_000), (10_000, 300)])
@pytest.mark.parametrize("tolerate", [False, True])
def test_the_c_loop_builds_the_records_batches_and_refusals_of_the_python_loop(
    stack: Endpoints, make_topic: Callable[..., str], unique: str, limits: tuple[int, int], tolerate: bool
) -> None:
    # Refusals end the reading at the first in the order records come: one partition, whose order is fixed.
    partitions = 3 if tolerate else 1
    topic = make_topic(partitions=partitions)
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "transactional.id": f"{unique}-p"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, v in enumerate(values(120, seed=len(unique))):
        producer.produce(topic, v, key=None if i % 3 else str(i).encode(), partition=i % partitions,
                         headers=[("eosink.id", f"j/r/{i}".encode())] if i % 2 else None)
    producer.commit_transaction(30)
    encoder = copy_native.encoded(SHAPE, utf8=True)
    for decoder in (SHAPE.decode, encoder.encode if encoder is not None else SHAPE.decode):
        c = read(stack.kafka_bootstrap, topic, partitions, f"{unique}-c", decoder, True, limits, tolerate)
        py = read(stack.kafka_bootstrap, topic, partitions, f"{unique}-py", decoder, False, limits, tolerate)
        for batches in (c, py):  # (how a topic splits into batches depends on when its fetches come back)
            assert all(len(b[0]) <= limits[0] and b[3] < limits[1] + 100 for b in batches)
        # (and the partitions' records interleave as fetches come back: each partition's in order)
        flat_c, flat_py = (tuple(sorted(x for b in batches for x in b[k]) for k in (0, 1)) + (batches[-1][2],)
                           for batches in (c, py))
        assert flat_c == flat_py
        assert len(flat_c[0]) > 10 and any(r[0] == "RowRecord" for r in flat_c[0])
        assert tolerate or flat_c[2] is not None, "a record that cannot be decoded ends the reading, named"
