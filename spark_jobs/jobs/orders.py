"""Orders job: N deterministic orders into an orders outbox and, in the same transaction per
partition, one ``order_created`` event per order into an events outbox.

Typically the orders outbox feeds PostgreSQL and the events outbox Iceberg: a sink never sees an
order without its event or the other way round, and never either of them twice.

    python -m eosink.spark_jobs.jobs.orders --topic orders --events-topic order_events --n 10000 --run-id r1
    spark-submit spark_jobs/jobs/orders.py --topic orders --n 10000 --run-id r1
    eosink spark run orders --topic orders --n 10000 --run-id r1
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from eosink.spark_jobs.faults import FailAt
from eosink.spark_jobs.jobs._common import ensure_topics
from eosink.spark_jobs.outbox import Outbox
from eosink.spark_jobs.publisher import publish_outbox
from eosink.spark_jobs.task import FaultHook

NAME = "orders"
ORDER_COLUMNS = ["order_id", "customer", "amount", "currency", "items", "status", "ts"]
_EPOCH = 1_700_000_000  # 2023-11-14T22:13:20Z: orders are one second apart from here


def orders_frame(spark: SparkSession, n_orders: int, partitions: int) -> DataFrame:
    """``n_orders`` orders, the same for the same arguments (a re-run must see the same rows)."""
    i = F.col("id")
    return (
        spark.range(0, n_orders, 1, numPartitions=partitions)
        .select(
            F.format_string("o-%08d", i).alias("order_id"),
            F.format_string("c-%04d", (i * 7919) % 1000).alias("customer"),
            (((i * 37) % 100_000) / 100).cast("decimal(10,2)").alias("amount"),
            F.lit("EUR").alias("currency"),
            ((i % 5) + 1).cast("int").alias("items"),
            F.element_at(F.array(F.lit("new"), F.lit("paid"), F.lit("shipped")), (i % 3 + 1).cast("int")).alias(
                "status"
            ),
            F.timestamp_seconds(F.lit(_EPOCH) + i).alias("ts"),
        )
        .withColumn(
            "event",
            F.struct(
                F.concat(F.lit("evt-"), F.col("order_id")).alias("event_id"),
                F.lit("order_created").alias("type"),
                F.col("order_id"),
                F.col("customer"),
                F.col("amount"),
                F.col("ts"),
            ),
        )
    )


def run(
    spark: SparkSession,
    *,
    run_id: str,
    bootstrap: str | Mapping[str, Any],
    orders_topic: str,
    events_topic: str | None = None,
    n_orders: int = 1000,
    partitions: int = 4,
    job: str = NAME,
    create_topics: bool = True,
    fault_hook: FaultHook | None = None,
    **publish_kwargs: Any,
) -> dict[str, Any]:
    """Generate and publish; returns counts (``orders``/``events`` = records this call published).

    ``bootstrap``: the bootstrap servers, or a whole librdkafka config (a secured cluster's SASL/TLS
    settings); topics are created only from a bare bootstrap string (a least-privilege publisher may not).
    """
    if create_topics and isinstance(bootstrap, str):
        ensure_topics(bootstrap, [orders_topic] + ([events_topic] if events_topic else []))
    df = orders_frame(spark, n_orders, partitions)
    outboxes = [Outbox(orders_topic, key="order_id", value=ORDER_COLUMNS)]
    if events_topic:
        outboxes.append(Outbox(events_topic, key="order_id", value="event"))
    result = publish_outbox(
        df, outboxes, key="order_id", job=job, run_id=run_id, kafka=bootstrap, fault_hook=fault_hook, **publish_kwargs
    )
    out = result.as_dict()
    out["orders"] = result.topics.get(orders_topic, 0)
    out["events"] = result.topics.get(events_topic, 0) if events_topic else 0
    out["n_orders"] = n_orders
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", "--orders-topic", dest="topic", default="orders", help="orders outbox topic")
    parser.add_argument("--events-topic", help="events outbox topic (same transaction); omit for orders only")
    parser.add_argument("--n", type=int, default=1000, help="number of orders")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions = transactions")
    parser.add_argument("--job", default=NAME, help="job name in transactional.ids and the ledger")
    parser.add_argument("--fail-after-commit", action="store_true", help=argparse.SUPPRESS)  # demo of a retry


def needs_kafka_jars(args: argparse.Namespace) -> bool:
    return False


def run_from_args(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    return run(
        spark,
        run_id=args.run_id,
        bootstrap=args.bootstrap,
        orders_topic=args.topic,
        events_topic=args.events_topic,
        n_orders=args.n,
        partitions=args.partitions,
        job=args.job,
        create_topics=not args.no_create_topics,
        fault_hook=FailAt("after_commit", frozenset({0}), frozenset({0})) if args.fail_after_commit else None,
    )


if __name__ == "__main__":
    from eosink.spark_jobs.jobs._common import main

    sys.exit(main(sys.modules[__name__], sys.argv[1:], prog="orders"))
