"""Benchmark: latency through a streaming query and a worker, from a source commit to the row in PostgreSQL.

A transactional producer commits one ``--txn-records``-record transaction every ``--every-ms`` into a
source topic; a Structured Streaming query with a ``--trigger-ms`` processing-time trigger reads it
read_committed (spark-sql-kafka) and publishes it with ``publish_outbox_stream`` into an outbox topic;
one real worker process delivers the outbox into PostgreSQL through a ``postgres`` connector at its
defaults. Each record's latency runs from its source transaction's ``commit_transaction()`` to the
benchmark's first sight of its row (the table polled every ``--poll-ms``), over ``--seconds`` of steady
state (after the query's first micro-batches and the table exist).

The breakdown, per record: *trigger wait* (source commit to the start of the micro-batch that reads
it: every row carries its batch's ``current_timestamp()``), *batch* (batch start to the end of the
publish, seen by ``on_batch``; its Kafka transaction's commit reported apart), *worker* (publish end
to the row in PostgreSQL: the worker's cycle, prepare, decision and ``COMMIT PREPARED``).

Baseline, in the same run: the same trickle straight into an outbox (no query), one worker at its
defaults (``bench_latency.py``'s measure).

    python bench/bench_stream_latency.py [--seconds 60] [--trigger-ms 1000] [--every-ms 100] [--txn-records 10]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import psycopg  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench import report as published  # noqa: E402
from bench.bench_e2e import http, wait_ready  # noqa: E402
from bench.bench_latency import WARM_UP_IDS, percentile, start_worker, trickle, trickle_arguments, watch  # noqa: E402
from bench.bench_latency import run as run_direct  # noqa: E402
from eosink.worker.stack.endpoints import load_endpoints  # noqa: E402


def stats(values: list[float]) -> dict[str, int]:
    if not values:
        return {"p50_ms": 0, "p99_ms": 0, "max_ms": 0}
    return {"p50_ms": round(1000 * statistics.median(values)), "p99_ms": round(1000 * percentile(values, 0.99)),
            "max_ms": round(1000 * max(values))}


class Batches:
    """``on_batch``: when each micro-batch's publish ended (wall clock) and its steps."""

    def __init__(self) -> None:
        self.ended: list[float] = []
        self.job_s: list[float] = []
        self.commit_s: list[float] = []
        self.steps: dict[str, list[float]] = {}

    def __call__(self, result: Any) -> None:
        self.ended.append(time.time())
        self.job_s.append(result.steps.get("job", 0.0))
        self.commit_s += [p.steps.get("commit", 0.0) for p in result.partitions]
        for k, v in [*result.steps.items(), ("total", result.seconds),
                     *((f"task.{k}", v) for p in result.partitions for k, v in p.steps.items())]:
            self.steps.setdefault(k, []).append(v)

    def end_after(self, t: float) -> float | None:
        i = bisect.bisect_left(self.ended, t)
        return self.ended[i] if i < len(self.ended) else None


def start_query(spark: Any, bootstrap: str, source: str, outbox: str, trigger_ms: float, checkpoint: str,
                on_batch: Batches, source_options: dict[str, str]) -> Any:
    from pyspark.sql import functions as F

    from eosink.spark_jobs import Outbox, publish_outbox_stream

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
           .option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed"))
    for k, v in source_options.items():
        raw = raw.option(k, v)
    df = raw.load().select(F.get_json_object(F.col("value").cast("string"), "$.id").cast("long").alias("id"),
                    (F.unix_micros(F.current_timestamp()) / 1e6).alias("batch_at"))
    return publish_outbox_stream(df, Outbox(outbox, value=["id", "batch_at"]), key="id", job=f"bench-{outbox}",
                                 checkpoint=checkpoint, kafka=bootstrap,
                                 trigger={"processingTime": f"{trigger_ms / 1000:g} seconds"}, on_batch=on_batch)


def run_stream(ep: Any, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    from eosink.spark_jobs.session import build_session

    tag = uuid.uuid4().hex[:8]
    source, outbox, table, name = f"bench-sl-src-{tag}", f"bench-sl-out-{tag}", f"bench_sl_{tag}", f"bench-sl-{tag}"
    admin = AdminClient({"bootstrap.servers": ep.kafka_bootstrap})
    for f in admin.create_topics([NewTopic(source, 1, 1), NewTopic(outbox, 1, 1)]).values():
        f.result(30)
    proc, base, log_path = start_worker(ep, name, logdir / f"worker-{tag}.log")
    spark = build_session("eosink-bench-stream-latency", master="local[2]", kafka_jars=True, conf={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"})
    spark.sparkContext.setLogLevel("ERROR")
    batches = Batches()
    committed: dict[int, float] = {}
    seen: dict[int, tuple[Any, ...]] = {}
    stop = threading.Event()
    query = None
    try:
        wait_ready(base, proc, log_path)
        config = {"connector.class": "postgres", "topics": outbox, "connection.url": ep.postgres_dsn,
                  "table.name.format": table, "auto.create": "true"}
        status, body = http("POST", f"{base}/connectors", {"name": name, "config": config})
        if status != 201:
            raise RuntimeError(f"POST /connectors: {status} {body}")
        query = start_query(spark, ep.kafka_bootstrap, source, outbox, args.trigger_ms, str(logdir / f"ck-{tag}"), batches,
                            dict(o.split("=", 1) for o in args.source_option))
        # Warm-up: the query's first batches and the table's creation, then the measured trickle.
        conn = psycopg.connect(ep.postgres_dsn, autocommit=True)
        wait = time.monotonic() + 120
        while not (conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] and len(batches.ended) >= 3):
            if time.monotonic() > wait or query.exception() is not None:
                raise RuntimeError(f"the query or the table never started: {query.exception()} (see {log_path})")
            trickle(ep.kafka_bootstrap, source, 1.0, 0.5, 1, {}, stop, first_id=WARM_UP_IDS + int(time.time() * 10) % 10**6)
        t = threading.Thread(target=trickle, args=(ep.kafka_bootstrap, source, args.seconds, args.every_ms / 1000,
                                                   args.txn_records, committed, stop))
        wall_offset = time.time() - time.monotonic()  # trickle() records time.monotonic()
        t.start()
        seen.update(watch(conn, f'SELECT id, batch_at FROM "{table}"', t, committed, args))
    finally:
        stop.set()
        if query is not None:
            query.stop()
        spark.stop()
        proc.terminate()
        proc.wait(30)
        admin.delete_topics([source, outbox])
    total, wait_s, batch_s, worker_s = [], [], [], []
    for i, at in committed.items():
        if i not in seen:
            continue
        now, batch_at = seen[i]
        total.append(now - at)
        ended = batches.end_after(batch_at)
        wait_s.append(batch_at - (at + wall_offset))
        if ended is not None:
            batch_s.append(ended - batch_at)
            worker_s.append(now + wall_offset - ended)
    progress = [json.loads(p.json)["durationMs"] for p in query.recentProgress] if query is not None else []
    durations = {k: stats([d.get(k, 0) / 1000 for d in progress]) for k in (progress[-1] if progress else {})}
    return {"steps": {k: stats(v) for k, v in batches.steps.items()}, "durations": durations,
            "records": len(committed), "missing": len(committed) - len(total), **stats(total),
            "trigger_wait": stats(wait_s), "batch": stats(batch_s), "worker": stats(worker_s),
            "batch_job": stats(batches.job_s), "txn_commit": stats(batches.commit_s), "micro_batches": len(batches.ended)}


def figure_of(args: argparse.Namespace, s: dict[str, Any], direct: dict[str, Any], argv: list[str] | None) -> dict[str, Any]:
    row = published.row
    conditions = (f"one {args.txn_records}-record transaction every {args.every_ms:g} ms for {args.seconds:g} s "
                  f"({s['records']} records), a {args.trigger_ms:g} ms processing-time trigger, Spark local[2], "
                  f"the table polled every {args.poll_ms:g} ms; {published.load_note()}")
    return published.figure(
        "stream-latency", unit="ms", conditions=conditions,
        title="A trickle through a streaming query and a worker into PostgreSQL",
        measures="Milliseconds from a source transaction's commit_transaction() to its rows being visible in "
                 "PostgreSQL, through a Structured Streaming query (publish_outbox_stream) and one worker at its "
                 "defaults.",
        baseline="the same trickle straight into an outbox, one worker at its defaults, in the same run",
        rows=[row("p99 without the query", direct["p99_ms"], baseline=True),
              row("p99 through the query", s["p99_ms"], direct["p99_ms"]),
              row("p50 through the query", s["p50_ms"], direct["p50_ms"], note=f"without: {direct['p50_ms']} ms"),
              row("max through the query", s["max_ms"], direct["max_ms"], note=f"without: {direct['max_ms']} ms"),
              row("p50 trigger wait", s["trigger_wait"]["p50_ms"], note=f"p99 {s['trigger_wait']['p99_ms']} ms"),
              row("p50 micro-batch", s["batch"]["p50_ms"],
                  note=f"p99 {s['batch']['p99_ms']} ms; its Kafka commit p50 {s['txn_commit']['p50_ms']} ms"),
              row("p50 worker", s["worker"]["p50_ms"], note=f"p99 {s['worker']['p99_ms']} ms")],
        targets=[published.target("p99, source commit to row, 1 s trigger, one worker at its defaults", "<= 2,500 ms",
                                  f"{s['p99_ms']:,} ms", s["p99_ms"] <= 2500)],
        argv=sys.argv[1:] if argv is None else argv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    trickle_arguments(ap, seconds=60.0)
    ap.add_argument("--trigger-ms", type=float, default=1000.0)
    ap.add_argument("--baseline-seconds", type=float, default=20.0)
    ap.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the query's Kafka source, e.g. kafka.fetch.max.wait.ms=10")
    args = ap.parse_args(argv)
    ep = load_endpoints()
    logdir = Path(tempfile.mkdtemp(prefix="bench-stream-latency-"))
    s = run_stream(ep, args, logdir)
    direct = run_direct(ep, argparse.Namespace(**{**vars(args), "seconds": args.baseline_seconds}), True, logdir)
    print(f"through the query  records {s['records']:6}  missing {s['missing']}  p50 {s['p50_ms']:5} ms  "
          f"p99 {s['p99_ms']:5} ms  max {s['max_ms']:5} ms  ({s['micro_batches']} micro-batches)")
    for part in ("trigger_wait", "batch", "worker", "batch_job", "txn_commit"):
        print(f"  {part:16} p50 {s[part]['p50_ms']:5} ms  p99 {s[part]['p99_ms']:5} ms  max {s[part]['max_ms']:5} ms")
    for group in ("steps", "durations"):
        for k, v in s[group].items():
            print(f"  {group}.{k:28} p50 {v['p50_ms']:5} ms  p99 {v['p99_ms']:5} ms")
    print(f"without the query  records {direct['records']:6}  missing {direct['missing']}  p50 {direct['p50_ms']:5} ms  "
          f"p99 {direct['p99_ms']:5} ms  max {direct['max_ms']:5} ms")
    print(f"target p99 <= 2,500 ms: {'met' if s['p99_ms'] <= 2500 else 'NOT met'}")
    out = REPO / "bench" / "results" / "stream-latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "stream": s, "direct": direct}, default=str, indent=2))
    published.maybe_publish(args, lambda: figure_of(args, s, direct, argv))
    return 0 if s["missing"] == 0 and direct["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
