"""A streaming query's driver in a process of its own, for the tests that kill it (``python tests/stream_driver.py``).

It reads a Kafka topic (read_committed) with spark-sql-kafka, publishes it to an outbox with one of the
two streaming publishers (``ds``: ``writeStream.format("eosink")``, ``fn``: ``publish_outbox_stream``)
until the topic is drained (``availableNow``), prints ``DONE <batches>`` and exits. ``--fault`` is a
hook of :mod:`eosink.spark_jobs.faults` as :func:`~eosink.spark_jobs.faults.to_option` encodes it,
``--min-partitions`` the Kafka source's ``minPartitions``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def source_frame(spark, bootstrap: str, topic: str, max_offsets: int, min_partitions: int | None = None):  # noqa: ANN001, ANN201
    """``k`` (the record key) and ``value`` (its JSON) of every committed record of ``topic``."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed")
              .option("maxOffsetsPerTrigger", max_offsets))
    if min_partitions:
        reader = reader.option("minPartitions", min_partitions)
    raw = reader.load()
    return raw.select(F.col("key").cast("string").alias("k"), F.col("value").cast("string").alias("value"))


def start(spark, engine: str, bootstrap: str, source: str, outbox: str, job: str, checkpoint: str,  # noqa: ANN001, ANN201
          fault: str | None = None, max_offsets: int = 100, transaction_timeout_ms: int | None = None,
          min_partitions: int | None = None):
    """The query, started (availableNow); ``min_partitions`` is the Kafka source's ``minPartitions``."""
    from eosink.spark_jobs import Outbox, publish_outbox_stream
    from eosink.spark_jobs.faults import from_option

    df = source_frame(spark, bootstrap, source, max_offsets, min_partitions)
    if engine == "fn":
        more = {"transaction_timeout_ms": transaction_timeout_ms} if transaction_timeout_ms else {}
        return publish_outbox_stream(df, Outbox(outbox, value="value"), key="k", job=job, checkpoint=checkpoint, kafka=bootstrap,
                                     trigger={"availableNow": True}, fault_hook=from_option(fault) if fault else None, **more)
    writer = (df.writeStream.format("eosink").option("topic", outbox).option("key", "k").option("job", job)
              .option("kafka.bootstrap.servers", bootstrap).option("checkpointLocation", checkpoint)
              .trigger(availableNow=True))
    if fault:
        writer = writer.option("fault_hook", fault)
    if transaction_timeout_ms:
        writer = writer.option("transaction_timeout_ms", str(transaction_timeout_ms))
    return writer.start()


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("engine", "bootstrap", "source", "outbox", "job", "checkpoint"):
        ap.add_argument(name)
    ap.add_argument("--fault")
    ap.add_argument("--min-partitions", type=int)
    args = ap.parse_args()
    from eosink.spark_jobs.session import build_session

    spark = build_session("eosink-stream-driver", master="local[2,4]", kafka_jars=True, conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"})
    spark.sparkContext.setLogLevel("ERROR")
    query = start(spark, args.engine, args.bootstrap, args.source, args.outbox, args.job, args.checkpoint, args.fault,
                  min_partitions=args.min_partitions)
    query.awaitTermination()
    print("DONE " + json.dumps([p["batchId"] for p in (json.loads(x.json) for x in query.recentProgress)]), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
