"""Records/s of the exactly-once streaming publishers vs Spark's own Kafka sink, same streaming query, same run.

    python bench/bench_spark_streaming.py [--rows 1000000] [--batch-rows 250000] [--repeat 3] [--bootstrap HOST:PORT] [--publish]

One source topic is filled once with ``--rows`` records (~200-byte JSON values, keyed). Every path runs
the same streaming query over it - spark-sql-kafka's source read read_committed, ``--batch-rows``
records a micro-batch (``maxOffsetsPerTrigger``), ``availableNow`` - from a fresh checkpoint into its
own topic, and is timed from ``start()`` to the query's end:

* ``eosink-ds`` - ``writeStream.format("eosink")``: the Python Data Source writer, one Kafka
  transaction per partition and micro-batch, ledger entry, content fingerprint; exactly-once.
* ``eosink-fn`` - ``publish_outbox_stream``: the same publish, planned per micro-batch in ``foreachBatch``.
* ``spark``     - Spark's built-in Kafka sink (Java producer), the same key, value and two headers;
  at-least-once.

Producer settings are the publisher's defaults for every path (acks=all, idempotence, linger 20 ms,
1 MB batches, lz4). Paths run ``--repeat`` times, interleaved; best and median are printed, the target
(eosink >= 90% of Spark's sink) is judged on the best runs, as in ``bench_spark_publisher.py``, and
every round also measures the CPU seconds per row of the Spark JVM, its Python workers and the broker.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid
from datetime import datetime
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench import report as published  # noqa: E402 - after the path set-up above
from bench.bench_spark_publisher import (  # noqa: E402
    ProcessCPU,
    common_arguments,
    delete_topics,
    kafka_of,
    timed,
)

PATHS = ("eosink-ds", "eosink-fn", "spark")
GUARANTEE = {"eosink-ds": "exactly-once", "eosink-fn": "exactly-once", "spark": "at-least-once"}


def fill(bootstrap: str, topic: str, rows: int) -> int:
    """``rows`` keyed records of ~200 bytes of JSON; returns the value size."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
                  "queue.buffering.max.messages": 500_000})
    size = 0
    for i in range(rows):
        value = json.dumps({"order_id": f"o-{i:010d}", "customer": f"c-{(i * 7919) % 100_000:06d}",
                            "amount": round((i * 37) % 1_000_000 / 100, 2), "currency": "EUR", "items": i % 5 + 1,
                            "ts": 1_700_000_000 + i, "digest": f"{(i * 2654435761) % 2**64:016x}" * 4,
                            "shipping": "standard-shipping"}).encode()
        size = len(value)
        while True:
            try:
                p.produce(topic, value, f"o-{i:010d}".encode())
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return size


def source(spark, bootstrap: str, topic: str, batch_rows: int):
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
           .option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed")
           .option("maxOffsetsPerTrigger", batch_rows).load())
    return raw.select(F.col("key").cast("string").alias("k"), "value", "partition", "offset")


def start(name: str, df, bootstrap: str, topic: str, checkpoint: str, job: str):
    """The path's query, started."""
    from pyspark.sql import functions as F

    from eosink.spark_jobs import Outbox, publish_outbox_stream
    from eosink.spark_jobs.publisher import DEFAULT_PRODUCER_CONFIG

    if name != "spark":
        df = df.select("k", "value")
    if name == "eosink-fn":
        return publish_outbox_stream(df, Outbox(topic, value="value"), key="k", job=job, checkpoint=checkpoint,
                                     kafka=bootstrap, trigger={"availableNow": True})
    if name == "eosink-ds":
        return (df.writeStream.format("eosink").option("topic", topic).option("key", "k").option("job", job)
                .option("kafka.bootstrap.servers", bootstrap).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start())
    out = df.select(
        F.col("k").alias("key"), "value",
        F.array(
            F.struct(F.lit("eosink.id").alias("key"),
                     F.concat_ws("/", F.lit(job), F.col("partition"), F.col("offset"))
                     .cast("binary").alias("value")),
            F.struct(F.lit("eosink.run").alias("key"), F.lit(job).cast("binary").alias("value")),
        ).alias("headers"),
    )
    writer = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
              .option("checkpointLocation", checkpoint).trigger(availableNow=True))
    for k in ("acks", "linger.ms", "batch.size", "compression.type", "enable.idempotence"):
        writer = writer.option(f"kafka.{k}", str(DEFAULT_PRODUCER_CONFIG[k]).lower())
    return writer.start()


def run_path(spark, name: str, bootstrap: str, src: str, dst: str, batch_rows: int, tmp: str) -> int:
    """The path's query from start() to its end; the rows its micro-batches read."""
    job = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    df = source(spark, bootstrap, src, batch_rows)
    query = start(name, df, bootstrap, dst, f"{tmp}/{job}", job)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    progress = [json.loads(p.json) for p in query.recentProgress]
    STEADY.setdefault(name, []).append(steady_rate(progress))
    return sum(p["numInputRows"] for p in progress)


#: Per path, each timed run's rate after its first micro-batch (see :func:`steady_rate`).
STEADY: dict[str, list[float]] = {}


def steady_rate(progress: list[dict]) -> float:
    """Rows/s from the end of the first micro-batch to the end of the last: the query's running rate,
    without what a query pays once at its start (Python workers for the data source's planner and
    commit, the first producers, Spark's planning) - what a long-running query sees."""
    def end(p: dict) -> float:
        return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() + p["durationMs"]["triggerExecution"] / 1000

    batches = [p for p in progress if p["numInputRows"]]
    if len(batches) < 2:
        return 0.0
    return sum(p["numInputRows"] for p in batches[1:]) / (end(batches[-1]) - end(batches[0]))


def main(argv: list[str] | None = None) -> int:
    ap = common_arguments(__doc__)
    ap.add_argument("--batch-rows", type=int, default=250_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--topic-partitions", type=int, default=4, help="of the source (= Spark partitions) and the outboxes")
    published.add_arguments(ap)
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from eosink.spark_jobs.session import build_session

    bootstrap = kafka_of(args)
    if not bootstrap:
        return 2
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"benchs_{uuid.uuid4().hex[:6]}"
    src, warm_src = f"{prefix}_source", f"{prefix}_warm"
    topics = [src, warm_src] + [f"{prefix}_{name.replace('-', '_')}_{i}" for name in PATHS for i in range(args.repeat + 1)]
    for f in admin.create_topics([NewTopic(t, args.topic_partitions, 1) for t in topics]).values():
        f.result(30)
    spark = build_session("eosink-bench-streaming", master=args.master, kafka_jars=True, conf={
        "spark.ui.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.sql.shuffle.partitions": str(args.topic_partitions)})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        size = fill(bootstrap, src, args.rows)
        fill(bootstrap, warm_src, 20_000)
        print(f"{args.rows:,} rows, {size}-byte JSON values, {args.batch_rows:,} a micro-batch, {args.topic_partitions} "
              f"topic partitions, master {args.master}, Kafka {bootstrap}, load {os.getloadavg()[0]:.1f}")
        with TemporaryDirectory(prefix="eosink-bench-ck-") as tmp:
            for name in PATHS:  # warm-up: Python workers, JIT, producer connections, the ledger read
                run_path(spark, name, bootstrap, warm_src, f"{prefix}_{name.replace('-', '_')}_{args.repeat}", 5_000, tmp)
            STEADY.clear()
            meter = ProcessCPU(bootstrap)
            rates: dict[str, list[float]] = {n: [] for n in PATHS}
            cpu: dict[str, list[dict[str, float]]] = {n: [] for n in PATHS}
            for r in range(args.repeat):
                for name in PATHS:
                    dst = f"{prefix}_{name.replace('-', '_')}_{r}"
                    n = timed(meter, name, r, partial(run_path, spark, name, bootstrap, src, dst, args.batch_rows, tmp),
                              rates, cpu)
                    assert n == args.rows, f"{name} read {n} of {args.rows}"
        report(rates, cpu, meter.broker is not None)
        conditions = (f"{args.rows:,} rows of {size}-byte JSON values read from Kafka read_committed, "
                      f"{args.batch_rows:,} a micro-batch, availableNow, {args.topic_partitions} partitions, {args.master}, "
                      f"best of {args.repeat} interleaved rounds; CPU per record: the Spark JVM, its Python workers and "
                      f"the broker (medians); {published.load_note()}")
        published.maybe_publish(args, lambda: published.figure(
            "spark-streaming", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions,
            unit="records/s", rows=figure_rows(rates, cpu), targets=figure_targets(rates), argv=argv))
    finally:
        delete_topics(admin, topics)
        spark.stop()
    return 0


TITLE = "Spark streaming publisher: exactly-once micro-batches against Spark's own Kafka sink"
MEASURES = ("Records/s of one streaming query (Kafka source, micro-batches) from start() to its end: eosink's "
            "exactly-once writers (a transaction per partition and micro-batch, ledger, content fingerprint) against "
            "Spark's at-least-once Kafka sink.")
BASELINE = "Spark's built-in Kafka sink (spark-sql-kafka, Java producer, at-least-once), same query and producer settings"
LABELS = {"spark": "Spark's built-in Kafka sink, at-least-once",
          "eosink-ds": 'eosink writeStream.format("eosink"), exactly-once',
          "eosink-fn": "eosink publish_outbox_stream, exactly-once"}


def figure_rows(rates: dict[str, list[float]], cpu: dict[str, list[dict[str, float]]]) -> list[dict]:
    """Each path's best round against Spark's sink's; its CPU per record (medians) and running rate in the note."""
    best = {n: max(r) for n, r in rates.items()}
    median = {n: statistics.median(r) for n, r in rates.items()}
    return [published.row(LABELS[n], round(best[n]), best["spark"], baseline=n == "spark",
                          cpu_us=sum(statistics.median(c[k] for c in cpu[n]) for k in cpu[n][0]),
                          note=f"median round {median[n]:,.0f}; after the first micro-batch {max(STEADY[n]):,.0f}")
            for n in ("spark", "eosink-ds", "eosink-fn")]


def figure_targets(rates: dict[str, list[float]]) -> list[dict]:
    best = {n: max(r) for n, r in rates.items()}
    steady = {n: max(STEADY[n]) for n in rates}
    return [published.target(f"{LABELS[n].split(', ')[0]} vs Spark's sink (best rounds)", ">= 90%",
                             f"{best[n] / best['spark']:.0%} (after the first micro-batch {steady[n] / steady['spark']:.0%})",
                             best[n] >= 0.9 * best["spark"])
            for n in ("eosink-ds", "eosink-fn")]


def report(rates: dict[str, list[float]], cpu: dict[str, list[dict[str, float]]], broker_seen: bool) -> None:
    best = {n: max(r) for n, r in rates.items()}
    median = {n: statistics.median(r) for n, r in rates.items()}
    print(f"\n{'path':9} {'guarantee':14} {'best rec/s':>12} {'median rec/s':>13} {'/spark best':>12} {'median':>7}")
    for n in PATHS:
        print(f"{n:9} {GUARANTEE[n]:14} {best[n]:12,.0f} {median[n]:13,.0f} {best[n] / best['spark']:12.0%} "
              f"{median[n] / median['spark']:7.0%}")
    med = {n: {k: statistics.median(c[k] for c in cs) for k in cs[0]} for n, cs in cpu.items()}
    print(f"\nCPU per row (medians, us; the broker {'included' if broker_seen else 'not found on this machine'}):")
    print(f"{'path':9} {'jvm':>6} {'python':>7} {'broker':>7} {'total':>7}")
    for n, m in med.items():
        print(f"{n:9} {m['jvm']:6.2f} {m['python']:7.2f} {m['broker']:7.2f} {sum(m.values()):7.2f}")
    steady = {n: max(STEADY.get(n, [0.0])) for n in PATHS}
    print("\nafter the first micro-batch (the running query's rate; best round):")
    for n in PATHS:
        print(f"{n:9} {steady[n]:12,.0f} rec/s {steady[n] / steady['spark']:6.0%}")
    for n in ("eosink-ds", "eosink-fn"):
        ratio = best[n] / best["spark"]
        print(f"target {n} >= 90% of Spark's sink (best runs): " + ("met" if ratio >= 0.9 else "NOT met")
              + f" ({ratio:.0%}; median {median[n] / median['spark']:.0%})")


if __name__ == "__main__":
    sys.exit(main())
