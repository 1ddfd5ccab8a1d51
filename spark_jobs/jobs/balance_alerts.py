"""Balance aggregation with high-balance alerts (the transactional-outbox balance example), as a Spark job.

Transactions ``(txn_id, user_id, amount, ts)`` are summed per user; every user whose balance
exceeds the threshold (10000.0 by default) gets an alert in the alerts outbox, and, when a balances
topic is given, every balance goes to it in the same transaction. The alert is an outbox record,
never a direct call to the alerting system: a retried task cannot send an alert twice, and the sink
that delivers alerts deduplicates by ``eosink.id`` as a second line of defence.

Input: ``--source`` is a Parquet/CSV/JSON path or ``kafka:<topic>`` (read with
``kafka.isolation.level=read_committed``); without it, ``--generate N`` deterministic transactions.

    eosink spark run balance_alerts --source kafka:raw_transactions --alerts-topic alert_outbox --run-id r1
    spark-submit spark_jobs/jobs/balance_alerts.py --source /data/txns.parquet --alerts-topic alert_outbox

With ``--stream`` it runs as a streaming query instead (:mod:`eosink.spark_jobs.jobs.balance_stream`):
a running balance per user, every change to the balances outbox, every threshold crossing to the
alerts outbox.

    eosink spark run balance_alerts --stream --source kafka:raw_transactions --balances-topic balance_outbox
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

from eosink.spark_jobs.jobs._common import ensure_topics
from eosink.spark_jobs.outbox import Outbox
from eosink.spark_jobs.publisher import publish_outbox
from eosink.spark_jobs.sources import read_source
from eosink.spark_jobs.task import FaultHook

NAME = "balance_alerts"
DEFAULT_THRESHOLD = 10_000.0
TRANSACTION_SCHEMA = StructType(
    [
        StructField("txn_id", StringType()),
        StructField("user_id", StringType()),
        StructField("amount", DoubleType()),
        StructField("ts", TimestampType()),
    ]
)


def generate_transactions(spark: SparkSession, n: int, users: int = 50, partitions: int = 4) -> DataFrame:
    """Deterministic transactions: user ``u-k`` gets amounts that make a known set of users high."""
    i = F.col("id")
    return spark.range(0, n, 1, numPartitions=partitions).select(
        F.format_string("t-%08d", i).alias("txn_id"),
        F.format_string("u-%03d", i % users).alias("user_id"),
        # users 0..9 receive large deposits, the rest small movements in both directions
        F.when(i % users < 10, F.lit(2500.0) + (i % 7) * 10).otherwise(((i % 11) - 5) * 10.0).alias("amount"),
        F.timestamp_seconds(F.lit(1_700_000_000) + i).alias("ts"),
    )


def balances(transactions: DataFrame, threshold: float) -> DataFrame:
    """Per-user balance, count and last timestamp, with the alert decision and the alert record."""
    agg = transactions.groupBy("user_id").agg(
        F.round(F.sum("amount"), 2).alias("balance"),
        F.count(F.lit(1)).alias("transactions"),
        F.max("ts").alias("last_ts"),
    )
    return agg.select(
        "user_id",
        "balance",
        "transactions",
        "last_ts",
        (F.col("balance") > F.lit(threshold)).alias("is_high"),
        alert(threshold),
    )


def alert(threshold: float) -> Column:
    """The alert record of a row with ``user_id``, ``balance`` and ``last_ts``."""
    return F.struct(
        F.concat(F.lit("alert-"), F.col("user_id")).alias("alert_id"),
        F.col("user_id"),
        F.col("balance"),
        F.lit(threshold).alias("threshold"),
        F.format_string("High balance detected: %.2f", F.col("balance")).alias("message"),
        F.col("last_ts").alias("as_of"),
    ).alias("alert")


def run(
    spark: SparkSession,
    *,
    run_id: str,
    bootstrap: str,
    alerts_topic: str,
    balances_topic: str | None = None,
    source: str | None = None,
    fmt: str | None = None,
    generate: int = 10_000,
    threshold: float = DEFAULT_THRESHOLD,
    partitions: int = 4,
    job: str = NAME,
    create_topics: bool = True,
    fault_hook: FaultHook | None = None,
) -> dict[str, Any]:
    """Aggregate and publish; returns counts (``alerts``/``balances`` published by this call)."""
    if create_topics:
        ensure_topics(bootstrap, [alerts_topic] + ([balances_topic] if balances_topic else []))
    txns = (
        read_source(spark, source, TRANSACTION_SCHEMA, fmt=fmt, bootstrap=bootstrap)
        if source
        else generate_transactions(spark, generate)
    )
    df = balances(txns, threshold)
    outboxes = [Outbox(alerts_topic, key="user_id", value="alert", when="is_high")]
    if balances_topic:
        outboxes.append(Outbox(balances_topic, key="user_id", value=["user_id", "balance", "transactions", "last_ts"]))
    # partitions= fixes the partitioning (hash of user_id) so a resumed run keeps it.
    result = publish_outbox(
        df, outboxes, key="user_id", job=job, run_id=run_id, kafka=bootstrap, partitions=partitions,
        fault_hook=fault_hook,
    )
    out = result.as_dict()
    out["alerts"] = result.topics.get(alerts_topic, 0)
    out["balances"] = result.topics.get(balances_topic, 0) if balances_topic else 0
    out["threshold"] = threshold
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alerts-topic", default="alert_outbox", help="outbox for high-balance alerts")
    parser.add_argument("--balances-topic", help="outbox for every balance (same transaction); optional")
    parser.add_argument("--source", help="path (Parquet/CSV/JSON) or kafka:<topic>; default: generated data")
    parser.add_argument("--format", dest="fmt", choices=["parquet", "csv", "json"], help="format of a path source")
    parser.add_argument("--generate", type=int, default=10_000, help="generated transactions without --source")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions = transactions")
    parser.add_argument("--job", default=NAME)
    from eosink.spark_jobs.jobs import balance_stream

    balance_stream.add_arguments(parser)


def needs_kafka_jars(args: argparse.Namespace) -> bool:
    return bool(args.source and args.source.startswith("kafka:"))


def run_from_args(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    if args.stream:
        from eosink.spark_jobs.jobs import balance_stream

        return balance_stream.run_from_args(spark, args)
    return run(
        spark,
        run_id=args.run_id,
        bootstrap=args.bootstrap,
        alerts_topic=args.alerts_topic,
        balances_topic=args.balances_topic,
        source=args.source,
        fmt=args.fmt,
        generate=args.generate,
        threshold=args.threshold,
        partitions=args.partitions,
        job=args.job,
        create_topics=not args.no_create_topics,
    )


if __name__ == "__main__":
    from eosink.spark_jobs.jobs._common import main

    sys.exit(main(sys.modules[__name__], sys.argv[1:], prog="balance_alerts"))
