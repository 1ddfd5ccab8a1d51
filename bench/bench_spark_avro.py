"""Records/s of ``publish_outbox`` with Avro values (Confluent's wire format) against the same rows as JSON.

    python bench/bench_spark_avro.py [--rows 1000000] [--repeat 3] [--registry URL] [--bootstrap HOST:PORT]

Both paths publish every row of one cached DataFrame (the orders of ``bench_spark_publisher.py``:
strings, a decimal, an int, a timestamp) exactly once, one transaction per partition, C produce loop:

* ``json`` - ``Outbox(topic)``: ``to_json`` in the JVM (the baseline).
* ``avro`` - ``Outbox(topic, format="avro", registry=URL)``: the schema derived from the columns and looked
  up in the registry on the driver (once per process; registered in the warm-up), ``to_avro`` in the JVM
  and the 5-byte header.

Interleaved rounds; best and median per path, the ratio avro/json, and the CPU per row of the Spark JVM,
its Python workers and the broker (Avro's smaller records cost the produce loop and the broker less,
``to_avro`` costs the JVM more; the ratio says which wins on this machine).
"""

from __future__ import annotations

import os
import statistics
import sys
import uuid
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_spark_publisher import (  # noqa: E402
    ProcessCPU,
    best_and_median,
    common_arguments,
    delete_topics,
    kafka_of,
    make_frame,
    timed,
)


def run(fmt: str, registry: str, spark, df, bootstrap: str, topic: str) -> int:  # noqa: ANN001 - Spark objects
    from eosink.spark_jobs import Outbox, publish_outbox

    outbox = Outbox(topic, format="avro", registry=registry) if fmt == "avro" else Outbox(topic)
    return publish_outbox(df, outbox, key="order_id", job="bench-avro", run_id=uuid.uuid4().hex[:12],
                          kafka=bootstrap).records


def main(argv: list[str] | None = None) -> int:
    ap = common_arguments(__doc__)
    ap.add_argument("--partitions", type=int, default=4, help="Spark partitions (= transactions)")
    ap.add_argument("--registry", help="the registry's Confluent API; default: the local stack's")
    args = ap.parse_args(argv)
    from confluent_kafka.admin import AdminClient, NewTopic

    from eosink.spark_jobs.session import build_session
    from eosink.worker.stack import load_endpoints

    bootstrap = kafka_of(args)
    registry = args.registry or load_endpoints().registry_url
    if not bootstrap or not registry:
        print("no Kafka or no schema registry: pass --bootstrap / --registry or start the stack", file=sys.stderr)
        return 2
    spark = build_session("eosink-bench-avro", master=args.master, kafka_jars=True, conf={
        "spark.ui.enabled": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000"})
    spark.sparkContext.setLogLevel("ERROR")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"bench_avro_{uuid.uuid4().hex[:6]}"
    # one topic per format: the Avro subject (<topic>-value) then holds the one schema of this run
    topics = {fmt: f"{prefix}_{fmt}" for fmt in ("json", "avro")}
    for f in admin.create_topics([NewTopic(t, 4, 1) for t in topics.values()]).values():
        f.result(30)
    try:
        df = make_frame(spark, args.rows, args.partitions)
        print(f"{args.rows:,} rows, {args.partitions} Spark partitions, master {args.master}, Kafka {bootstrap}, "
              f"registry {registry}, load {os.getloadavg()[0]:.1f}")
        warm = make_frame(spark, 20_000, args.partitions)
        for fmt, topic in topics.items():  # warm-up: Python workers, producer connections, the schema registered
            run(fmt, registry, spark, warm, bootstrap, topic)
        meter = ProcessCPU(bootstrap)
        rates: dict[str, list[float]] = {fmt: [] for fmt in topics}
        cpu: dict[str, list[dict[str, float]]] = {fmt: [] for fmt in topics}
        for r in range(args.repeat):
            for fmt, topic in topics.items():
                n = timed(meter, fmt, r, partial(run, fmt, registry, spark, df, bootstrap, topic), rates, cpu)
                assert n == args.rows, f"{fmt} published {n} of {args.rows}"
        best, median = best_and_median(rates)
        print(f"\n{'format':7} {'best rec/s':>12} {'median rec/s':>13} {'CPU us/row (jvm python broker)':>32}")
        for fmt in topics:
            med = {k: statistics.median(c[k] for c in cpu[fmt]) for k in cpu[fmt][0]}
            print(f"{fmt:7} {best[fmt]:12,.0f} {median[fmt]:13,.0f}   "
                  f"{med['jvm']:5.2f} {med['python']:6.2f} {med['broker']:6.2f}")
        print(f"\navro / json: {best['avro'] / best['json']:.2f}x best, {median['avro'] / median['json']:.2f}x median")
    finally:
        delete_topics(admin, list(topics.values()))
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
