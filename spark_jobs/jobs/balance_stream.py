"""``balance_alerts --stream``: running balances per user from a Kafka topic, as a streaming query.

Transactions ``(txn_id, user_id, amount, ts)`` are read read_committed from ``--source kafka:<topic>``
and summed per user in update mode: every micro-batch, each user it touched gets one record with the
new balance in the balances outbox and, if the batch took the balance across the threshold (at or
below it before the batch, above it after), one alert in the alerts outbox, in the same transaction.

A crossing needs the balance *before* the batch, which an update-mode aggregation does not output.
So the query publishes the union of two streams: the running aggregate and the batch's own
transactions; each micro-batch (``publish_outbox_stream``'s ``transform``) joins the users' new
balances with the sum of their transactions in the batch, and ``before = balance - that sum``. Both
halves are the batch's, fixed by its offsets in the checkpoint, so a replay computes the same rows.

    eosink spark run balance_alerts --stream --source kafka:raw_transactions --balances-topic balance_outbox
    eosink spark run balance_alerts --stream --source kafka:raw_transactions --available-now   # drain, stop
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from eosink.connectors.api.errors import ConfigError
from eosink.spark_jobs.jobs._common import ensure_topics
from eosink.spark_jobs.jobs.balance_alerts import DEFAULT_THRESHOLD, NAME, TRANSACTION_SCHEMA, alert
from eosink.spark_jobs.outbox import Outbox
from eosink.spark_jobs.runs import PublishResult
from eosink.spark_jobs.sources import read_kafka_stream
from eosink.spark_jobs.stream import publish_outbox_stream
from eosink.spark_jobs.task import FaultHook

BALANCE_COLUMNS = ["user_id", "balance", "transactions", "last_ts"]


def stream_input(transactions: DataFrame) -> DataFrame:
    """The running aggregate per user (``kind = 'balance'``) and the transactions themselves (``'txn'``)."""
    totals = transactions.groupBy("user_id").agg(
        F.sum("amount").alias("total"), F.count(F.lit(1)).alias("transactions"), F.max("ts").alias("last_ts"))
    running = totals.select(F.lit("balance").alias("kind"), "user_id", "total", "transactions", "last_ts",
                            F.lit(None).cast("double").alias("amount"))
    moves = transactions.select(F.lit("txn").alias("kind"), "user_id", F.lit(None).cast("double").alias("total"),
                                F.lit(None).cast("long").alias("transactions"), F.lit(None).cast("timestamp").alias("last_ts"),
                                "amount")
    return running.unionByName(moves)


def balance_changes(batch: DataFrame, threshold: float) -> DataFrame:
    """One micro-batch of :func:`stream_input`: each touched user's new balance, and whether it crossed."""
    moved = batch.where(F.col("kind") == "txn").groupBy("user_id").agg(F.sum("amount").alias("delta"))
    now = batch.where(F.col("kind") == "balance").join(moved, "user_id", "left")
    before = F.round(F.col("total") - F.coalesce(F.col("delta"), F.lit(0.0)), 2)
    changes = now.select("user_id", F.round("total", 2).alias("balance"), before.alias("before"), "transactions", "last_ts")
    crossed = (F.col("before") <= F.lit(threshold)) & (F.col("balance") > F.lit(threshold))
    return changes.select(*BALANCE_COLUMNS, crossed.alias("crossed"), alert(threshold))


def sample_transactions(lo: int, hi: int) -> list[dict[str, Any]]:
    """Deterministic transactions ``lo..hi-1`` of five users: u-0 climbs 300 a time, u-1 swings +700/-500, u-2..u-4
    move by small amounts (the streaming tests and ``eosink demo --stream``)."""
    out = []
    for i in range(lo, hi):
        user = i % 5
        amount = {0: 300.0, 1: 700.0 if (i // 5) % 2 == 0 else -500.0}.get(user, float((i % 7) - 3))
        out.append({"txn_id": f"t-{i:05d}", "user_id": f"u-{user}", "amount": amount,
                    "ts": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"})
    return out


def expected_outboxes(rows: list[dict[str, Any]], per_batch: int, threshold: float) -> tuple[Counter, Counter]:
    """What the query publishes for ``rows`` read ``per_batch`` a micro-batch: ``(user, balance, transactions)`` per
    batch for each user it touched (the balances outbox), and ``(user, balance)`` per crossing (the alerts)."""
    balance: dict[str, float] = {}
    count: Counter[str] = Counter()
    changes: Counter[tuple[str, float, int]] = Counter()
    crossings: Counter[tuple[str, float]] = Counter()
    for b in range(0, len(rows), per_batch):
        before = dict(balance)
        for r in rows[b:b + per_batch]:
            balance[r["user_id"]] = balance.get(r["user_id"], 0.0) + r["amount"]
            count[r["user_id"]] += 1
        for user in {r["user_id"] for r in rows[b:b + per_batch]}:
            now = round(balance[user], 2)
            changes[(user, now, count[user])] += 1
            if round(before.get(user, 0.0), 2) <= threshold < now:
                crossings[(user, now)] += 1
    return changes, crossings


def default_checkpoint(job: str) -> str:
    home = Path(os.environ.get("EOSINK_HOME") or Path.cwd() / ".eosink")
    return str(home / "spark" / "checkpoints" / job)


def run_stream(
    spark: SparkSession,
    *,
    bootstrap: str,
    source_topic: str,
    alerts_topic: str,
    balances_topic: str,
    checkpoint: str,
    threshold: float = DEFAULT_THRESHOLD,
    job: str = NAME,
    available_now: bool = False,
    trigger_seconds: float = 5.0,
    max_offsets_per_trigger: int | None = None,
    create_topics: bool = True,
    fault_hook: FaultHook | None = None,
) -> dict[str, Any]:
    """Start the query; with ``available_now`` drain the topic, stop and return the counts, else run until
    interrupted (Ctrl-C stops it; a restart resumes from ``checkpoint``)."""
    if create_topics:
        ensure_topics(bootstrap, [alerts_topic, balances_topic])
    published: Counter[str] = Counter()
    batches: list[int] = []

    def count(result: PublishResult) -> None:
        published.update(result.topics)
        batches.append(result.published_partitions)

    txns = read_kafka_stream(spark, bootstrap, source_topic, TRANSACTION_SCHEMA, max_offsets_per_trigger)
    query = publish_outbox_stream(
        stream_input(txns),
        [Outbox(balances_topic, key="user_id", value=BALANCE_COLUMNS), Outbox(alerts_topic, key="user_id", value="alert",
                                                                              when="crossed")],
        key="user_id", job=job, checkpoint=checkpoint, kafka=bootstrap, output_mode="update",
        trigger={"availableNow": True} if available_now else {"processingTime": f"{trigger_seconds} seconds"},
        transform=lambda batch: balance_changes(batch, threshold), on_batch=count, fault_hook=fault_hook,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return {"job": job, "query_id": query.id, "checkpoint": checkpoint, "micro_batches": len(batches),
            "balances": published[balances_topic], "alerts": published[alerts_topic], "threshold": threshold}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streaming (--stream)")
    group.add_argument("--stream", action="store_true", help="run as a streaming query over --source kafka:<topic>")
    group.add_argument("--checkpoint", help="checkpoint location (default: $EOSINK_HOME/spark/checkpoints/<job>)")
    group.add_argument("--available-now", action="store_true", help="process what the topic holds, then stop")
    group.add_argument("--trigger-seconds", type=float, default=5.0, help="micro-batch interval")
    group.add_argument("--max-offsets-per-trigger", type=int, help="at most this many records a micro-batch")
    group.add_argument("--state-partitions", type=int, default=4,
                       help="partitions of the running balances (spark.sql.shuffle.partitions of the query; fixed by "
                            "the checkpoint at its first start: Spark's default, 200, makes every micro-batch 200 tasks)")


def run_from_args(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    if not (args.source and args.source.startswith("kafka:")):
        raise ConfigError("--stream reads a Kafka topic: pass --source kafka:<topic>", key="source")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.state_partitions))
    return run_stream(
        spark,
        bootstrap=args.bootstrap,
        source_topic=args.source[len("kafka:"):],
        alerts_topic=args.alerts_topic,
        balances_topic=args.balances_topic or "balance_outbox",
        checkpoint=args.checkpoint or default_checkpoint(args.job),
        threshold=args.threshold,
        job=args.job,
        available_now=args.available_now,
        trigger_seconds=args.trigger_seconds,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        create_topics=not args.no_create_topics,
    )
