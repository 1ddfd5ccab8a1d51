"""``bench_worker.py --modes postgres,postgres-avro``: the PostgreSQL sink in the worker's engine, JSON and Avro values.

Both modes deliver the benchmark's records (:func:`bench.bench_worker.value_of`) with the engine as the
worker runs it (a :class:`~eosink.worker.engine.task.SinkTask`, the ZooKeeper decision log, two-phase
commit) into a fresh table of the stack's PostgreSQL (insert mode, ``auto.create``). ``postgres`` reads
them as JSON (``value.converter=json``); ``postgres-avro`` reads the same records written as Avro under a
schema registered in the stack's Schema Registry (``value.converter=avro``), from a topic of their own
(``<topic>-avro``). Each is reported against the consumer alone (the ceiling) and, when both ran, Avro
against JSON. Checked afterwards: exactly the N ids in the table, each once, nothing left prepared.
"""

from __future__ import annotations

from typing import Any

from bench._data import order
from bench.e2e_avro import ORDER_AVRO, RECORDS

MODES = ("postgres", "postgres-avro")
RECORDS.setdefault("worker", (ORDER_AVRO, lambda i: order(i, note=f"order {i} shipped")))  # bench_worker.value_of's


def avro_topic(topic: str) -> str:
    return f"{topic}-avro"


def prefill_avro(bootstrap: str, topic: str, n: int, partitions: int, registry_url: str) -> bool:
    """The Avro topic of ``topic``: the same ``n`` records as Avro (run in a child process, as the JSON pre-fill)."""
    from bench.bench_worker import prefill
    from bench.e2e_avro import encoder

    return prefill(bootstrap, avro_topic(topic), n, partitions, encoder(registry_url, avro_topic(topic), "worker"))


def source_and_sink(kind: str, connector: str, bootstrap: str, tag: str) -> tuple[Any, Any, str, str]:
    """(source, sink, the mode's name, the table) for ``postgres`` or ``postgres-avro``."""
    from eosink.connectors.postgres.sink import PostgresSink
    from eosink.worker.engine.source import KafkaSource
    from eosink.worker.stack import load_endpoints

    ep = load_endpoints()
    avro = kind == "postgres-avro"
    if avro and not ep.registry_url:
        raise RuntimeError("postgres-avro needs the stack's Schema Registry")
    table = f"bench_worker_{kind.replace('-', '_')}_{tag}"
    source = KafkaSource(connector, bootstrap, value_converter="avro" if avro else "json",
                         value_registry={"schema.registry.url": ep.registry_url} if avro else None)
    sink = PostgresSink(connector, {"connection.url": ep.postgres_dsn, "table.name.format": table,
                                    "insert.mode": "insert", "auto.create": "true"})
    return source, sink, "eosink PostgresSink, " + ("Avro values" if avro else "JSON values"), table


def collect_ids(table: str, connector: str, ids: Any, keep: bool) -> int:
    """Add the table's ids to ``ids``; the number of the connector's transactions left prepared. Drops the
    table and the connector's bookkeeping rows unless ``keep``."""
    import psycopg
    from psycopg import sql

    from eosink.worker.stack import load_endpoints

    with psycopg.connect(load_endpoints().postgres_dsn, autocommit=True) as conn:
        for (i,) in conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table))):
            ids.add(i)
        left = int(conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
                                (f"eosink:{connector}.%",)).fetchone()[0])
        if not keep:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
            for t in ("eosink_offsets", "eosink_committed_txns", "eosink_txn_manifest"):
                conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(t)), (connector,))
    return left


def print_avro_against_json(avro: Any, json_: Any) -> None:
    print(f"Avro against JSON into PostgreSQL: {avro.rate:,.0f} vs {json_.rate:,.0f} records/s = {avro.rate / json_.rate:.2f}x; "
          f"CPU {avro.cpu_s / avro.records * 1e6:.1f} vs {json_.cpu_s / json_.records * 1e6:.1f} us/record")
