"""Records/s of the exactly-once Spark publisher vs two at-least-once peers, same DataFrame, same run.

    python bench/bench_spark_publisher.py [--rows 1000000] [--partitions 4] [--repeat 3] [--bootstrap HOST:PORT]

Paths, each publishing every row of one cached DataFrame (~200-byte JSON values) to its own topic:

* ``eosink``  - :func:`spark_jobs.publish_outbox`: one Kafka transaction per partition, ledger
  entry, fencing; exactly-once; its produce loop in C (``spark_jobs/native``).
* ``eosink-py`` - the same with its produce loop in Python (``EOSINK_PUBLISHER_NATIVE=0``).
* ``plain``   - a ``mapInArrow`` task with the Python produce loop and a non-transactional (idempotent) confluent-kafka
  producer and the same headers; at-least-once (a retried task publishes its partition again).
* ``spark``   - Spark's built-in Kafka sink (spark-sql-kafka-0-10, Java producer); at-least-once.

Every path does its own JSON encoding (``to_json`` in the JVM) inside the timed region; producer
settings are the publisher's defaults for all three (acks=all, idempotence, linger 20 ms, 1 MB
batches, lz4). Each path runs ``--repeat`` times, interleaved; best and median are printed and the targets are
judged on the best runs (the machine is shared with the broker and whatever else runs, so the
best run is the least disturbed one; the median shows how noisy it was). Prints a table and the ratios
against the targets (eosink >= 100% of Spark's sink, >= 80% of plain).

Where the time goes: every round also measures the CPU seconds each process spent on the path
(the Spark JVM, its Python workers, and the Kafka broker when it runs on this machine), per row.
A fourth path, ``handoff``, publishes nothing: it hands the same ``key``/``value`` columns to
Python through ``mapInArrow`` and only turns them into Python objects - the fixed cost any
Python-side producer pays before its first ``produce()``. On 2 cores the paths are CPU-bound, so
these per-row figures explain the ratios. The broker is shared: its figure includes whatever else
writes to it at the time (compare the ``handoff`` row, which sends it nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench import report as published  # noqa: E402


def make_frame(spark, rows: int, partitions: int):
    """``rows`` orders of ~200 bytes of JSON each, cached so generation is not timed."""
    from pyspark.sql import functions as F

    i = F.col("id")
    df = spark.range(0, rows, 1, numPartitions=partitions).select(
        F.format_string("o-%010d", i).alias("order_id"),
        F.format_string("c-%06d", (i * 7919) % 100_000).alias("customer"),
        (((i * 37) % 1_000_000) / 100).cast("decimal(12,2)").alias("amount"),
        F.lit("EUR").alias("currency"),
        ((i % 5) + 1).cast("int").alias("items"),
        F.timestamp_seconds(F.lit(1_700_000_000) + i).alias("ts"),
        F.sha2(F.col("id").cast("string"), 256).alias("digest"),
        F.lit("standard-shipping").alias("shipping"),
    )
    df = df.cache()
    df.count()
    return df


def plain_task(conf: dict, topic: str, job: str, run_id: str) -> Callable[[Iterator], Iterator]:
    """The at-least-once peer: the publisher's task loop without the transaction and the ledger."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from confluent_kafka import Producer
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        producer = Producer(conf)
        produce = producer.produce
        prefix, run_b, seq = f"{job}/{run_id}/{partition}/", run_id.encode(), 0
        for batch in batches:
            ks, vs = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            for k, v in zip(ks, vs):
                hdrs = [("eosink.id", prefix + str(seq)), ("eosink.run", run_b)]
                while True:
                    try:  # positional, as the publisher's loop calls it
                        produce(topic, v, k, -1, None, None, 0, hdrs)
                        break
                    except BufferError:
                        producer.poll(0.05)
                seq += 1
            producer.poll(0)
        if producer.flush(120) != 0:
            raise RuntimeError("plain producer could not deliver everything")
        yield pa.RecordBatch.from_pylist([{"records": seq}], schema=pa.schema([("records", pa.int64())]))

    return run


def handoff_task(batches: Iterator) -> Iterator:
    """The Python side's floor: receive the Arrow batches and make the Python objects, publish nothing."""
    import pyarrow as pa

    n = 0
    for batch in batches:
        ks, vs = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        n += len(ks) + 0 * len(vs)
    yield pa.RecordBatch.from_pylist([{"records": n}], schema=pa.schema([("records", pa.int64())]))


def run_handoff(spark, df, bootstrap: str, topic: str) -> int:
    from eosink.spark_jobs.arrow_map import map_in_arrow

    return sum(r.records for r in map_in_arrow(_projected(df), handoff_task, "records long").collect())


def _projected(df):
    """``key``/``value`` as the publisher projects them: utf-8 key bytes, JSON value bytes, made in the JVM."""
    from pyspark.sql import functions as F

    from eosink.spark_jobs.outbox import JSON_OPTIONS

    return df.select(
        F.col("order_id").cast("string").cast("binary"), F.to_json(F.struct(*df.columns), JSON_OPTIONS).cast("binary")
    )


class ProcessCPU:
    """CPU seconds used so far by the Spark JVM (a child of this driver), its Python workers, and the
    Kafka broker (whoever listens on the bootstrap port, if it runs here). Linux ``/proc`` only."""

    def __init__(self, bootstrap: str) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        self.jvm = next((p for p in self._children(me) if b"java" in self._read(p, "cmdline")), None)
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        self.broker = self._listener(port)

    @staticmethod
    def _read(pid: int, name: str) -> bytes:
        try:
            return Path(f"/proc/{pid}/{name}").read_bytes()
        except OSError:
            return b""

    def _stat(self, pid: int) -> list[bytes]:
        return self._read(pid, "stat").rsplit(b")", 1)[-1].split()

    def _children(self, pid: int) -> list[int]:
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and self._stat(int(d))[1:2] == [str(pid).encode()]]

    def _listener(self, port: int) -> int | None:
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{f[9]}]")
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                if any(os.readlink(f"/proc/{d}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{d}/fd")):
                    return int(d)
            except OSError:
                continue
        return None

    def _cpu(self, pid: int | None) -> float:
        f = self._stat(pid) if pid is not None else []
        return (int(f[11]) + int(f[12])) / self.tick if len(f) > 12 else 0.0

    def sample(self) -> dict[str, float]:
        """Cumulative CPU seconds per process group; Python workers that exit between samples are lost
        (Spark reuses them, so between two paths of a round they do not)."""
        workers: list[int] = []
        todo = self._children(self.jvm) if self.jvm is not None else []
        while todo:
            pid = todo.pop()
            workers.append(pid)
            todo += self._children(pid)
        return {
            "jvm": self._cpu(self.jvm),
            "python": sum(self._cpu(p) for p in workers),
            "broker": self._cpu(self.broker),
        }


#: Every timed ``publish_outbox`` result, for its per-step seconds.
EOSINK_RESULTS: list = []
#: Of each, the records its C produce loop sent (see eosink.spark_jobs.native).
C_ROWS: list[int] = []


def run_eosink(spark, df, bootstrap: str, topic: str) -> int:
    from eosink.spark_jobs import publish_outbox

    res = publish_outbox(df, topic, key="order_id", job="bench", run_id=uuid.uuid4().hex[:12], kafka=bootstrap)
    EOSINK_RESULTS.append(res)
    C_ROWS.append(sum(p.c_rows for p in res.partitions))
    return res.records


def run_eosink_python(spark, df, bootstrap: str, topic: str) -> int:
    """The same publisher with its produce loop in Python (``EOSINK_PUBLISHER_NATIVE=0``)."""
    from eosink.spark_jobs import native, publish_outbox

    os.environ[native.ENV] = "0"
    try:
        res = publish_outbox(df, topic, key="order_id", job="bench", run_id=uuid.uuid4().hex[:12], kafka=bootstrap)
    finally:
        del os.environ[native.ENV]
    assert sum(p.c_rows for p in res.partitions) == 0
    return res.records


def run_plain(spark, df, bootstrap: str, topic: str) -> int:
    from eosink.spark_jobs.arrow_map import map_in_arrow
    from eosink.spark_jobs.publisher import producer_config

    task = plain_task(producer_config(bootstrap), topic, "bench", uuid.uuid4().hex[:12])
    return sum(r.records for r in map_in_arrow(_projected(df), task, "records long").collect())


def run_spark_sink(spark, df, bootstrap: str, topic: str) -> int:
    from pyspark.sql import functions as F

    from eosink.spark_jobs.outbox import JSON_OPTIONS
    from eosink.spark_jobs.publisher import DEFAULT_PRODUCER_CONFIG

    run_id = uuid.uuid4().hex[:12]
    out = df.select(
        F.col("order_id").cast("string").alias("key"),
        F.to_json(F.struct(*df.columns), JSON_OPTIONS).alias("value"),
        F.array(
            F.struct(
                F.lit("eosink.id").alias("key"),
                F.concat_ws("/", F.lit("bench"), F.lit(run_id), F.spark_partition_id(), F.monotonically_increasing_id())
                .cast("binary")
                .alias("value"),
            ),
            F.struct(F.lit("eosink.run").alias("key"), F.lit(run_id).cast("binary").alias("value")),
        ).alias("headers"),
    )
    writer = out.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for k in ("acks", "linger.ms", "batch.size", "compression.type", "enable.idempotence"):
        writer = writer.option(f"kafka.{k}", str(DEFAULT_PRODUCER_CONFIG[k]).lower())
    writer.save()
    return df.count()


PATHS = {"eosink": run_eosink, "eosink-py": run_eosink_python, "plain": run_plain, "spark": run_spark_sink,
         "handoff": run_handoff}
GUARANTEE = {"eosink": "exactly-once", "eosink-py": "exactly-once", "plain": "at-least-once", "spark": "at-least-once",
             "handoff": "(no Kafka)"}
PUBLISHERS = ("eosink", "eosink-py", "plain", "spark")


def main(argv: list[str] | None = None) -> int:
    ap = common_arguments(__doc__)
    ap.add_argument("--partitions", type=int, default=4, help="Spark partitions (= eosink transactions)")
    ap.add_argument("--topic-partitions", type=int, default=4)
    published.add_arguments(ap)
    args = ap.parse_args(argv)

    from confluent_kafka.admin import AdminClient, NewTopic

    from eosink.spark_jobs.session import build_session

    bootstrap = kafka_of(args)
    if not bootstrap:
        return 2
    spark = build_session(
        "eosink-bench", master=args.master, kafka_jars=True,
        conf={"spark.ui.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"bench_{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}_{name}_{i}" for name in PUBLISHERS for i in range(args.repeat + 1)]
    for f in admin.create_topics([NewTopic(t, args.topic_partitions, 1) for t in topics]).values():
        f.result(30)
    try:
        df = make_frame(spark, args.rows, args.partitions)
        sample = df.selectExpr("to_json(struct(*)) AS v").first()[0]
        print(f"{args.rows:,} rows, {len(sample)}-byte JSON values, {args.partitions} Spark partitions, "
              f"{args.topic_partitions} topic partitions, master {args.master}, Kafka {bootstrap}, "
              f"load {os.getloadavg()[0]:.1f}")
        warm = make_frame(spark, 20_000, args.partitions)
        for name, fn in PATHS.items():  # warm-up: Python workers, JIT, producer connections
            fn(spark, warm, bootstrap, f"{prefix}_{name}_{args.repeat}")
        meter = ProcessCPU(bootstrap)
        EOSINK_RESULTS.clear()
        C_ROWS.clear()
        rates: dict[str, list[float]] = {name: [] for name in PATHS}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
        for r in range(args.repeat):
            for name, fn in PATHS.items():
                n = timed(meter, name, r, partial(fn, spark, df, bootstrap, f"{prefix}_{name}_{r}"), rates, cpu)
                assert n == args.rows, f"{name} published {n} of {args.rows}"
        report(rates, cpu, meter.broker is not None)
        conditions = (f"{args.rows:,} rows of {len(sample)}-byte JSON values, {args.partitions} Spark partitions, "
                      f"{args.topic_partitions} topic partitions, {args.master}, best of {args.repeat} interleaved rounds; "
                      f"CPU per record: the Spark JVM, its Python workers and the broker (medians); {published.load_note()}")
        published.maybe_publish(args, lambda: published.figure(
            "spark", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="records/s",
            rows=figure_rows(rates, cpu), targets=figure_targets(rates), argv=argv))
    finally:
        delete_topics(admin, topics)
        spark.stop()
    return 0


def best_and_median(rates: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each path's best round (what the targets are judged on) and its median round."""
    return {name: max(r) for name, r in rates.items()}, {name: statistics.median(r) for name, r in rates.items()}


def common_arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options every Spark publisher bench takes: rows, repeats, master, Kafka."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--bootstrap", help="default: the local stack's Kafka")
    return ap


def kafka_of(args: argparse.Namespace) -> str | None:
    """``--bootstrap`` or the local stack's Kafka (None, said on stderr, when there is neither)."""
    from eosink.spark_jobs.jobs._common import default_bootstrap

    bootstrap = args.bootstrap or default_bootstrap()
    if not bootstrap:
        print("no Kafka: pass --bootstrap or start the stack", file=sys.stderr)
    return bootstrap


def timed(meter: ProcessCPU, name: str, round_no: int, run: Callable[[], int], rates: dict[str, list[float]],
          cpu: dict[str, list[dict[str, float]]]) -> int:
    """One run of a path: its rate and CPU per row added to ``rates``/``cpu``, one line printed; the rows."""
    before = meter.sample()
    t0 = time.perf_counter()
    n = run()
    dt = time.perf_counter() - t0
    after = meter.sample()
    rates[name].append(n / dt)
    per_row = {k: 1e6 * (after[k] - before[k]) / n for k in after}
    cpu[name].append(per_row)
    print(f"  round {round_no + 1} {name:9} {dt:7.2f} s {n / dt:12,.0f} rec/s   CPU us/row: "
          + " ".join(f"{k} {v:4.2f}" for k, v in per_row.items())
          + f" = {sum(per_row.values()):4.2f}   load {os.getloadavg()[0]:.1f}", flush=True)
    return n


def delete_topics(admin, topics: list[str]) -> None:
    for f in admin.delete_topics(topics).values():
        try:
            f.result(30)
        except Exception:  # noqa: BLE001 - best-effort cleanup of unique bench topics
            pass


def report(rates: dict[str, list[float]], cpu: dict[str, list[dict[str, float]]], broker_seen: bool) -> None:
    """The rates table, the CPU per row of each path and process (medians), and the target."""
    best, median = best_and_median(rates)
    print()
    print(f"{'path':9} {'guarantee':14} {'best rec/s':>12} {'median rec/s':>13} {'eosink/path best':>17} {'median':>7}")
    for name in PATHS:
        ratio = (f"{best['eosink'] / best[name]:17.0%} {median['eosink'] / median[name]:7.0%}"
                 if name in PUBLISHERS else "")
        print(f"{name:9} {GUARANTEE[name]:14} {best[name]:12,.0f} {median[name]:13,.0f} {ratio}")

    med = {name: {k: statistics.median(c[k] for c in cs) for k in cs[0]} for name, cs in cpu.items()}
    total = {name: sum(m.values()) for name, m in med.items()}
    print(f"\nCPU per row (medians, us; the broker {'included' if broker_seen else 'not found on this machine'}):")
    print(f"{'path':9} {'jvm':>6} {'python':>7} {'broker':>7} {'total':>7}")
    for name, m in med.items():
        print(f"{name:9} {m['jvm']:6.2f} {m['python']:7.2f} {m['broker']:7.2f} {total[name]:7.2f}")
    handoff, eo, sk = med["handoff"], med["eosink"], med["spark"]
    print(
        f"\nwhy: Spark's sink costs {total['spark']:.2f} us/row in all (JVM: to_json + Java producer; broker "
        f"{sk['broker']:.2f}); handing the rows to Python alone costs {total['handoff']:.2f} "
        f"(JVM {handoff['jvm']:.2f} + Python {handoff['python']:.2f}), before any produce(). On top of that "
        f"eosink's Python workers spend {eo['python'] - handoff['python']:.2f} us/row in the produce loop and "
        f"librdkafka, and the broker {eo['broker']:.2f}: {total['eosink']:.2f} us/row, "
        f"{total['eosink'] / total['spark']:.2f}x Spark's sink's CPU per row."
    )
    print(f"the C produce loop sent {sum(C_ROWS):,} of eosink's {sum(r.records for r in EOSINK_RESULTS):,} records; "
          f"eosink with it / with its Python loop: {best['eosink'] / best['eosink-py']:.2f}x best, "
          f"{median['eosink'] / median['eosink-py']:.2f}x median, {total['eosink-py'] - total['eosink']:.2f} us/row less CPU")
    print_steps(EOSINK_RESULTS)
    plain_ok = best["eosink"] / best["plain"] >= 0.80
    spark_ratio = best["eosink"] / best["spark"]
    print("\ntargets (best runs): eosink >= 100% of Spark's sink: "
          + ("met" if spark_ratio >= 1.0 else f"NOT met ({spark_ratio:.0%}, {1 - spark_ratio:.0%} short; median "
                                             f"{median['eosink'] / median['spark']:.0%})")
          + f"; >= 80% of plain: {'met' if plain_ok else 'NOT met'} ({best['eosink'] / best['plain']:.0%})")


TITLE = "Spark publisher: exactly-once publish_outbox against Spark's own Kafka sink"
MEASURES = ("Records/s publishing every row of one cached DataFrame to Kafka: eosink's exactly-once publish_outbox "
            "(one transaction per partition, ledger, fencing) against at-least-once peers, JSON encoding included.")
BASELINE = "Spark's built-in Kafka sink (spark-sql-kafka, Java producer, at-least-once), same DataFrame and producer settings"
LABELS = {
    "spark": "Spark's built-in Kafka sink, at-least-once",
    "eosink": "eosink publish_outbox, C produce loop, exactly-once",
    "eosink-py": "eosink publish_outbox, Python produce loop, exactly-once",
    "plain": "plain confluent-kafka in mapInArrow, at-least-once",
}


def figure_rows(rates: dict[str, list[float]], cpu: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Each publisher's best round against Spark's sink's, with its CPU per record in every process (medians)."""
    best, median = best_and_median(rates)
    return [published.row(LABELS[name], round(best[name]), best["spark"], baseline=name == "spark",
                          cpu_us=sum(statistics.median(c[k] for c in cpu[name]) for k in cpu[name][0]),
                          note=f"median round {median[name]:,.0f}")
            for name in ("spark", "eosink", "eosink-py", "plain")]


def figure_targets(rates: dict[str, list[float]]) -> list[dict[str, Any]]:
    best, median = best_and_median(rates)
    return [published.target("eosink vs Spark's sink (best rounds)", ">= 100%",
                              f"{best['eosink'] / best['spark']:.0%} (median rounds {median['eosink'] / median['spark']:.0%})",
                              best["eosink"] >= best["spark"]),
            published.target("eosink vs plain confluent-kafka (best rounds)", ">= 80%", f"{best['eosink'] / best['plain']:.0%}",
                             best["eosink"] >= 0.8 * best["plain"])]


def print_steps(results: list) -> None:
    """Where a publish_outbox call's wall time goes: the driver's steps, and each task's (medians over rounds)."""
    if not results:
        return
    from eosink.spark_jobs.task import STEPS

    def med(values) -> float:
        return statistics.median(values) if values else 0.0

    driver = {k: med([r.steps.get(k, 0.0) for r in results]) for k in ("checks", "job", "finish")}
    tasks = {k: med([p.steps.get(k, 0.0) for r in results for p in r.partitions]) for k in STEPS}
    print(f"\neosink steps (s, medians): driver checks {driver['checks']:.2f}, Spark job {driver['job']:.2f}, "
          f"run marker {driver['finish']:.2f}; per task ({len(results[0].partitions)} tasks, 2 at a time): "
          + ", ".join(f"{k} {v:.2f}" for k, v in tasks.items()))


if __name__ == "__main__":
    sys.exit(main())
