"""Benchmark: latency of a trickle, from a producer's commit to the row in PostgreSQL.

What a streaming user sees: a transactional producer commits one ``--txn-records``-record transaction
every ``--every-ms`` into an outbox topic, one real worker process (``eosink worker``, as deployed)
delivers it through a ``postgres`` connector at its defaults (``commit.interval.ms`` 1000, and the
early commit of a caught-up cycle at ``commit.min.interval.ms`` 250), and the benchmark watches the
table. Each record's latency is from the moment its transaction's ``commit_transaction()`` returned
(the earliest a read_committed consumer could see it) to the moment the benchmark's poll of the
table (every ``--poll-ms``) first saw its row. Reported: p50 / p99 / max, the cycles' cadence, and the
bound: a record waits for the cycle that reads it to end (up to ``commit.min.interval.ms`` once caught
up, else ``commit.interval.ms``), then for its prepare, decision and ``COMMIT PREPARED``.

Baseline, in the same run: the same trickle with the connector's ``commit.min.interval.ms`` set to
``commit.interval.ms`` (no early commit: every cycle runs its full interval).

    python bench/bench_latency.py [--seconds 20] [--every-ms 100] [--txn-records 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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

import psycopg  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench import report as published  # noqa: E402
from bench.bench_e2e import free_port, http, wait_ready  # noqa: E402
from eosink.worker.stack.endpoints import load_endpoints  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


WARM_UP_IDS = 10_000_000  # the warm-up's ids start here, apart from the measured ones (0, 1, ...)


def trickle(bootstrap: str, topic: str, seconds: float, every_s: float, per_txn: int,
            committed: dict[int, float], stop: threading.Event, first_id: int = 0) -> None:
    """One transaction of ``per_txn`` records every ``every_s``; ``committed[id]`` = when its commit returned."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-trickle-{first_id}", "linger.ms": 1})
    p.init_transactions(30)
    next_id, deadline = first_id, time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        started = time.monotonic()
        p.begin_transaction()
        ids = range(next_id, next_id + per_txn)
        for i in ids:
            p.produce(topic, json.dumps({"id": i, "amount": i % 97}).encode())
        p.commit_transaction(30)
        at = time.monotonic()
        for i in ids:
            committed[i] = at
        next_id += per_txn
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))


def start_worker(ep: Any, cluster: str, log_path: Path) -> tuple[subprocess.Popen, str, Path]:
    """One real worker process (``eosink worker``) of its own cluster: the process, its REST base URL, its log."""
    port = free_port()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers", ep.kafka_bootstrap,
             "--zookeeper", ep.zookeeper_hosts, "--cluster", cluster, "--worker-id", "w1", "--rest-port", str(port),
             "--rest-host", "127.0.0.1"], cwd=REPO, env={**os.environ, "EOSINK_LOG_FORMAT": "json"},
            stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", log_path


def watch(conn: Any, select: str, trickle_thread: threading.Thread, committed: dict[int, float],
          args: argparse.Namespace) -> dict[int, tuple[Any, ...]]:
    """Poll ``select`` (``id`` first) every ``--poll-ms`` until the trickle ended and every id it committed showed:
    ``{id: (when it first showed, the row's other columns...)}``."""
    seen: dict[int, tuple[Any, ...]] = {}
    end = time.monotonic() + args.seconds + 15
    while time.monotonic() < end:
        now = time.monotonic()
        for i, *rest in conn.execute(f"{select} WHERE id < %s", (WARM_UP_IDS,)):
            if i not in seen:
                seen[i] = (now, *rest)
        if not trickle_thread.is_alive() and len(seen) >= len(committed):
            break
        time.sleep(args.poll_ms / 1000)
    trickle_thread.join()
    return seen


def run(ep: Any, args: argparse.Namespace, early: bool, logdir: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    topic, table, name = f"bench-latency-{tag}", f"bench_latency_{tag}", f"bench-latency-{tag}"
    admin = AdminClient({"bootstrap.servers": ep.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    proc, base, log_path = start_worker(ep, name, logdir / f"worker-{tag}.log")
    config = {"connector.class": "postgres", "topics": topic, "connection.url": ep.postgres_dsn,
              "table.name.format": table, "auto.create": "true"}
    if not early:
        config["commit.min.interval.ms"] = "1000"  # = commit.interval.ms: the baseline, no early commit
    committed: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()
    try:
        wait_ready(base, proc, log_path)
        status, body = http("POST", f"{base}/connectors", {"name": name, "config": config})
        if status != 201:
            raise RuntimeError(f"POST /connectors: {status} {body}")
        # The first cycle creates the table: warm up until it exists, then start the measured trickle.
        trickle(ep.kafka_bootstrap, topic, 2.0, 0.5, 1, {}, stop, first_id=WARM_UP_IDS)
        conn = psycopg.connect(ep.postgres_dsn, autocommit=True)
        wait = time.monotonic() + 30
        while not conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
            if time.monotonic() > wait:
                raise RuntimeError(f"the table never appeared (see {log_path})")
            time.sleep(0.1)
        t = threading.Thread(target=trickle, args=(ep.kafka_bootstrap, topic, args.seconds, args.every_ms / 1000,
                                                   args.txn_records, committed, stop))
        t.start()
        seen = {i: row[0] for i, row in watch(conn, f'SELECT id FROM "{table}"', t, committed, args).items()}
    finally:
        stop.set()
        proc.terminate()
        proc.wait(30)
    missing = [i for i in committed if i not in seen]
    latencies = [seen[i] - committed[i] for i in committed if i in seen]
    return {"early_commit": early, "records": len(committed), "missing": len(missing),
            "p50_ms": round(1000 * statistics.median(latencies)), "p99_ms": round(1000 * percentile(latencies, 0.99)),
            "max_ms": round(1000 * max(latencies))}


def figure_of(args: argparse.Namespace, early: dict[str, Any], full: dict[str, Any],
              argv: list[str] | None) -> dict[str, Any]:
    row = published.row
    return published.figure(
        "latency", title="A trickle into PostgreSQL: from the producer's commit to the row", unit="ms",
        measures="Milliseconds from a transaction's commit_transaction() to its rows being visible in PostgreSQL, "
                 "through one worker and a postgres connector at its defaults.",
        baseline="the same trickle with commit.min.interval.ms = commit.interval.ms (no early commit), in the same run",
        conditions=f"one {args.txn_records}-record transaction every {args.every_ms:g} ms for {args.seconds:g} s "
                   f"({early['records']} records each), the table polled every {args.poll_ms:g} ms; "
                   f"{published.load_note()}",
        rows=[row("p99 without the early commit", full["p99_ms"], baseline=True),
              row("p99, defaults (early commit at 250 ms)", early["p99_ms"], full["p99_ms"]),
              row("p50 without the early commit", full["p50_ms"], note="the baseline's median"),
              row("p50, defaults", early["p50_ms"], full["p50_ms"]),
              row("max, defaults", early["max_ms"], full["max_ms"], note=f"without: {full['max_ms']} ms")],
        targets=[published.target("p99, commit to row, one worker at its defaults", "<= 2,500 ms",
                                  f"{early['p99_ms']:,} ms", early["p99_ms"] <= 2500)],
        argv=sys.argv[1:] if argv is None else argv)


def trickle_arguments(ap: argparse.ArgumentParser, seconds: float) -> None:
    """The trickle's shape, the table's polling and ``--publish``, shared with ``bench_stream_latency.py``."""
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--every-ms", type=float, default=100.0)
    ap.add_argument("--txn-records", type=int, default=10)
    ap.add_argument("--poll-ms", type=float, default=10.0)
    published.add_arguments(ap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    trickle_arguments(ap, seconds=20.0)
    args = ap.parse_args(argv)
    ep = load_endpoints()
    logdir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    results = [run(ep, args, True, logdir), run(ep, args, False, logdir)]
    for r in results:
        label = "early commit (defaults)" if r["early_commit"] else "full interval (baseline)"
        print(f"{label:26} records {r['records']:6}  missing {r['missing']}  p50 {r['p50_ms']:5} ms  "
              f"p99 {r['p99_ms']:5} ms  max {r['max_ms']:5} ms")
    out = REPO / "bench" / "results" / "latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, default=str, indent=2))
    published.maybe_publish(args, lambda: figure_of(args, *results, argv))
    return 0 if all(r["missing"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
