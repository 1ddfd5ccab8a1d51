"""Benchmark: end to end, Kafka -> one ``eosink worker`` process -> PostgreSQL, against a raw binary COPY.

What a user sees: a topic of ``--partitions`` partitions pre-filled transactionally with ``--records``
~210-byte JSON orders (``bench._data.order``), one real worker process (``eosink worker``, as
deployed, against the local stack, a cluster name of its own), and a ``postgres`` connector
(insert mode, auto.create) registered through the REST API. The clock starts at the POST and stops
when every row is visible: assignment, recovery, the consumer's start and every cycle are all in it.
``--poll-by offsets`` (the default) watches the connector's rows in ``eosink_offsets``, polled
every ``--poll-s``: the sink writes them in the same prepared transaction as the rows, so they
become visible with them, at the same COMMIT PREPARED; the run is over when each partition's
next offset is past its last record, and ``SELECT count(*)`` then confirms every row. The clock
then stops at the worker's log line of that last commit (written right after its COMMIT PREPARED
returned) when it falls between the last poll that did not see the end and the one that did: the
moment the rows became visible, not up to a poll interval later; otherwise at the poll. ``--poll-by
count`` polls ``SELECT count(*)`` instead, as earlier runs did: a scan of the growing table
(~0.1 s of PostgreSQL CPU at 1M rows) several times a second, on the cores the run shares.

Also reported: the worker's peak RSS (VmHWM from /proc) and CPU time (user + system, every thread)
from the POST to the last row; the per-step histograms of its /metrics (``eosink_cycle_step_seconds``,
``eosink_cycle_seconds``) and its per-cycle log lines, so "where the time goes" is in every run
(the poll + decode share is the cycle's time minus its steps). Checked afterwards: exactly the N
distinct ids 0..N-1, none twice, and no prepared transaction left behind.

Baseline, in the same run and in a fresh process: the same N rows, pre-built as tuples, binary
COPY into a fresh table of the same shape, one COPY + COMMIT per ``batch.max.records`` rows (no
Kafka, no JSON, no 2PC): the end-to-end rate is printed as a share of it.

    python bench/bench_e2e.py [--records 1000000] [--partitions 6] [--commit-interval-ms 1000]
        [--batch-max-records N] [--consumer fetch.max.bytes=...] [--py-spy profile.svg] [--outbox-headers]

Run it from the repository root with the stack up (``eosink stack up``, or EOSINK_HOME pointing at a
running one). Results are appended to ``bench/results/e2e.json``. ``--wait-load`` (default 2.5)
waits, up to 10 minutes, for the 1-minute load average to drop below it before each measured part.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from psycopg import sql  # noqa: E402

from bench import e2e_avro  # noqa: E402
from bench import report as published  # noqa: E402
from bench._data import order, order_envelope  # noqa: E402
from bench.bench_postgres_sink import COLUMNS, COPY_TYPES, FIELDS, create_table  # noqa: E402
from bench.bench_worker import TXN_RECORDS, cpu_of, expected_high_watermarks, in_child, recreate_topic, watermarks  # noqa: E402
from eosink.connectors.api.records import ID_HEADER, RUN_HEADER  # noqa: E402
from eosink.worker.stack.endpoints import load_endpoints  # noqa: E402
from eosink.worker.stack.proc import free_port  # noqa: E402

RESULTS = REPO / "bench" / "results" / "e2e.json"
TARGET_RATE = 300_000
#: The end-to-end rate as a share of the raw binary COPY of the same rows in the same run.
TARGET_SHARE = 0.5


def value_of(i: int, envelope: bool = False) -> bytes:
    """The outbox record with id ``i``: ``order(i)`` as compact JSON (~210 bytes), or in Kafka Connect's
    ``schemas.enable=true`` envelope (``envelope``)."""
    return order_envelope(i) if envelope else json.dumps(order(i), separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------- pre-fill
def prefill(bootstrap: str, topic: str, n: int, partitions: int, headers: bool = False, envelope: bool = False,
            avro_registry: str | None = None, record: str = "order") -> None:
    """Make ``topic`` hold exactly ``n`` committed records (record i in partition i % P), unless it does;
    ``headers``: each with the two headers the Spark publisher gives an outbox record (``eosink.id``,
    ``eosink.run``), which the sink does not read but the worker still receives; ``avro_registry``: the
    records as Avro, their schema registered there; ``record``: another record than the order (:mod:`bench.e2e_avro`)."""
    want = [(0, h) for h in expected_high_watermarks(n, partitions)]
    have = watermarks(bootstrap, topic, partitions)
    if have == want:
        print(f"  {topic} already holds {n:,} records in {partitions} partitions")
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    if topic in admin.list_topics(timeout=10).topics:
        print(f"  {topic} does not hold exactly {n:,} records (watermarks {have}): recreating it")
    recreate_topic(admin, topic, partitions, deadline)
    t0 = time.perf_counter()
    txn_id = f"bench-e2e-{topic}-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 50,
                         "batch.size": 1_000_000, "queue.buffering.max.messages": 500_000,
                         "queue.buffering.max.kbytes": 512 * 1024})
    producer.init_transactions(30)
    encode = e2e_avro.encoder(avro_registry, topic, record) if avro_registry else \
        (lambda i: value_of(i, envelope)) if record == "order" else (lambda i: e2e_avro.json_value(i, record))
    for start in range(0, n, TXN_RECORDS):
        producer.begin_transaction()
        for i in range(start, min(n, start + TXN_RECORDS)):
            while True:
                try:
                    producer.produce(topic, encode(i), str(i).encode(), partition=i % partitions,
                                     headers=[(ID_HEADER, f"bench-e2e/run-0/{i % partitions}/{i}"), (RUN_HEADER, "run-0")]
                                     if headers else None)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(120)
    print(f"  pre-filled {topic}: {n:,} records in {partitions} partitions in {time.perf_counter() - t0:.1f}s")
    if watermarks(bootstrap, topic, partitions) != want:
        raise RuntimeError(f"after pre-filling, {topic} does not have the watermarks {want}")


# ---------------------------------------------------------------------------------------- baseline
def raw_copy(dsn: str, table: str, n: int, partitions: int, batch: int, topic: str) -> dict[str, float]:
    """Binary COPY of the same ``n`` rows, pre-built (outside the timing), one COPY + COMMIT per ``batch``."""
    import gc

    getter = itemgetter(*[f for f, _, _ in FIELDS])
    rows = [getter(order(i)) + (topic, i % partitions, i // partitions) for i in range(n)]
    gc.collect()
    gc.freeze()
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS)))
    with psycopg.connect(dsn) as conn:
        create_table(conn, table)
        t0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, n, batch):
            with conn.cursor() as cur, cur.copy(stmt) as cp:
                cp.set_types(COPY_TYPES)
                write = cp.write_row
                for row in rows[start:start + batch]:
                    write(row)
            conn.commit()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        got = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
        conn.commit()
    if not got or got[0] != n:
        raise RuntimeError(f"raw COPY: {got} rows instead of {n}")
    return {"seconds": seconds, "cpu_s": cpu, "rate": n / seconds}


# ---------------------------------------------------------------------------------------- worker
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (kB) of a process."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine, every CPU, from /proc/stat (in clock ticks)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far per thread name of a process (threads of one name summed), from /proc."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def http(method: str, url: str, body: Any = None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_load(limit: float, budget_s: float = 600) -> float:
    """Wait (up to ``budget_s``) for the 1-minute load average to drop below ``limit``; return it."""
    deadline = time.monotonic() + budget_s
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(5)
    load = os.getloadavg()[0]
    if load >= limit:
        print(f"  (load {load:.2f} still >= {limit} after {budget_s:.0f}s: measuring anyway)")
    return load


def histograms(metrics_text: str, connector: str) -> dict[str, dict[str, float]]:
    """Sum and count of the cycle histograms on /metrics, by step (``cycle`` for the whole cycle)."""
    out: dict[str, dict[str, float]] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(("eosink_cycle_step_seconds_", "eosink_cycle_duration_seconds_")):
            continue
        if f'connector="{connector}"' not in line:
            continue
        name, value = line.rsplit(" ", 1)
        kind = "sum" if "_sum{" in name else "count" if "_count{" in name else None
        if kind is None:
            continue
        step = name.split('step="', 1)[1].split('"', 1)[0] if 'step="' in name else "cycle"
        out.setdefault(step, {})[kind] = float(value)
    return out


def log_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "timestamp" in doc:
            doc["t"] = datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00")).timestamp()
            out.append(doc)
    return out


def timeline(events: list[dict[str, Any]], connector: str, posted_at: float) -> dict[str, Any]:
    """Seconds after the POST at which the worker logged each milestone, and each cycle's commit."""
    marks: dict[str, Any] = {}
    for e in events:
        ev, rel = e.get("event"), round(e["t"] - posted_at, 3)
        if ev == "rest_request" and e.get("method") == "POST" and e.get("path") == "/connectors":
            marks["post_ms"] = e.get("ms")
        elif ev in ("connector_started", "partitions_acquired") and e.get("connector") == connector:
            marks.setdefault(ev, rel)
        elif ev == "assignment_published" and connector in (e.get("partitions") or {}):
            marks.setdefault("assignment_published", rel)
        elif ev == "cycle_committed" and e.get("connector") == connector:
            marks.setdefault("commits", []).append((rel, e.get("records")))
    return marks


def wait_ready(base: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 60) -> None:
    """Until the worker at ``base`` answers ``/ready``; an error naming its log if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while not _ready(base):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not become ready (see {log_path})")
        time.sleep(0.1)


def run_e2e(args: argparse.Namespace, ep: Any, topic: str, tag: str, logdir: Path) -> dict[str, Any]:
    n = args.records
    cluster, name, table = f"bench-e2e-{tag}", f"bench-e2e-{tag}", f"bench_e2e_{tag}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = logdir / f"worker-{tag}.log"
    env = {**os.environ, "EOSINK_LOG_FORMAT": "json", "EOSINK_LOG_LEVEL": args.log_level}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers", ep.kafka_bootstrap,
             "--zookeeper", ep.zookeeper_hosts, "--cluster", cluster, "--worker-id", "w1", "--rest-port", str(port),
             "--rest-host", "127.0.0.1", *getattr(args, "worker_args", [])], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    spy: subprocess.Popen[bytes] | None = None
    config: dict[str, Any] = {
        "connector.class": "postgres", "topics": topic, "connection.url": ep.postgres_dsn,
        "insert.mode": getattr(args, "insert_mode", "insert"),
        "auto.create": "true", "table.name.format": table, "tasks.max": "1",
        "commit.interval.ms": str(args.commit_interval_ms),
    }
    if config["insert.mode"] != "insert":  # every order id is distinct: the merge path, not deduplication, is measured
        config |= {"pk.mode": "record_value", "pk.fields": "id"}
    if getattr(args, "envelope", False):
        config["value.converter.schemas.enable"] = "true"
    config.update(getattr(args, "converter_config", {}))
    if args.batch_max_records:
        config["batch.max.records"] = str(args.batch_max_records)
    if args.batch_max_bytes:
        config["batch.max.bytes"] = str(args.batch_max_bytes)
    for kv in args.consumer:
        k, _, v = kv.partition("=")
        config[f"consumer.override.{k}"] = v
    result: dict[str, Any] = {"connector_config": {k: v for k, v in config.items() if k != "connection.url"}}
    try:
        wait_ready(base, proc, log_path)
        if args.py_spy:
            fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(Path(args.py_spy).suffix, "raw")
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-o", args.py_spy, "-f", fmt,
                                    "--pid", str(proc.pid), "-r", "100", "--threads", "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)  # py-spy attached before the clock starts
        result["load_before"] = wait_load(args.wait_load)
        marks = watermarks(ep.kafka_bootstrap, topic, args.partitions)
        if not marks:
            raise RuntimeError(f"cannot read the watermarks of {topic}")
        ends = [high - 1 for _, high in marks]
        conn = psycopg.connect(ep.postgres_dsn, autocommit=True)
        count_sql = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        rss_samples: list[int] = []
        cpu0, machine0, threads0 = cpu_of(proc.pid), machine_jiffies(), thread_cpu(proc.pid)
        t0, posted_at = time.perf_counter(), time.time()
        status, body = http("POST", f"{base}/connectors", {"name": name, "config": config})
        if status != 201:
            raise RuntimeError(f"POST /connectors: {status} {body}")
        seen, first_row_s, visible, asked = 0, None, [], 0.0
        while seen < n:
            time.sleep(args.poll_s)
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode} (see {log_path})")
            rss_samples.append(proc_status(proc.pid)["VmRSS"])
            before, asked = asked, time.perf_counter() - t0  # (the last poll that did not see the end was asked then)
            try:
                seen = int(conn.execute(count_sql).fetchone()[0]) if args.poll_by == "count" \
                    else delivered(conn, name, topic, ends, n)
            except psycopg.errors.UndefinedTable:
                continue
            now = time.perf_counter() - t0
            visible.append((round(now, 3), seen))
            if seen and first_row_s is None:
                first_row_s = now
            if now > args.timeout:
                raise RuntimeError(f"only {seen:,} of {n:,} rows after {args.timeout:.0f}s (see {log_path})")
        seconds = polled = time.perf_counter() - t0
        cpu = cpu_of(proc.pid) - cpu0
        machine1 = machine_jiffies()
        threads = {k: round(v - threads0.get(k, 0.0), 2) for k, v in thread_cpu(proc.pid).items()}
        busy = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])
        mem = proc_status(proc.pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        result.update(records=n, seconds=seconds, rate=n / seconds, cpu_s=cpu, first_row_s=first_row_s,
                      peak_rss_mb=mem["VmHWM"] / 1024, rss_max_sampled_mb=max(rss_samples) / 1024,
                      load_after=os.getloadavg()[0], machine_busy=busy, visible=visible,
                      thread_cpu_s=dict(sorted(threads.items(), key=lambda kv: -kv[1])[:6]))
        _, metrics_text = http("GET", f"{base}/metrics")
        result["steps"] = histograms(metrics_text, name)
        result["check"] = verify(conn, table, name, n)
        result["timeline"] = marks = timeline(log_events(log_path), name, posted_at)
        last = marks.get("commits", [(None, 0)])[-1][0]
        if last is not None and before <= last <= polled:
            seconds = last  # the commit that made the last rows visible, seen between the two polls
        result.update(seconds=seconds, rate=n / seconds, polled_s=polled, end_by="commit" if seconds < polled else "poll")
        result["cycles"] = len(marks.get("commits", []))
        result["cycle_records"] = [r for _, r in marks.get("commits", [])]
        http("DELETE", f"{base}/connectors/{name}")
        if not args.keep:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
            for t in ("eosink_offsets", "eosink_committed_txns", "eosink_txn_manifest"):
                conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(t)), (name,))
        conn.close()
    finally:
        if spy is not None and spy.poll() is None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        stop_worker(proc)
        drop_cluster(ep.zookeeper_hosts, cluster)
    result["log"] = str(log_path)
    return result


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a worker process (it leaves its group and stops its tasks), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def delivered(conn: psycopg.Connection[Any], connector: str, topic: str, ends: list[int], n: int) -> int:
    """Rows visible by the connector's committed offsets: ``n`` once every partition's next offset
    reached ``ends`` (its last record + 1: the topic ends with a commit marker), else the records
    before those offsets (an estimate: the offsets count the producer's commit markers too)."""
    got = dict(conn.execute("SELECT partition, next_offset FROM eosink_offsets WHERE connector = %s AND topic = %s",
                            (connector, topic)).fetchall())
    if all(got.get(p, 0) >= end for p, end in enumerate(ends)):
        return n  # verify() counts the rows themselves afterwards
    return min(n - 1, sum(got.values()))


def _ready(base: str) -> bool:
    try:
        return http("GET", f"{base}/ready", timeout=2)[0] == 200
    except OSError:  # not listening yet
        return False


def verify(conn: psycopg.Connection[Any], table: str, connector: str, n: int) -> dict[str, Any]:
    """Exactly the ids 0..n-1, each once; nothing of the connector left prepared."""
    q = sql.SQL("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {}").format(sql.Identifier(table))
    count, distinct, lo, hi = conn.execute(q).fetchone()  # type: ignore[misc]
    left = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{connector}%",)).fetchone()
    prepared = left[0] if left else -1
    ok = count == distinct == n and lo == 0 and hi == n - 1 and prepared == 0
    return {"ok": ok, "rows": count, "distinct_ids": distinct, "min_id": lo, "max_id": hi, "left_prepared": prepared}


def drop_cluster(zk_hosts: str, cluster: str) -> None:
    from kazoo.client import KazooClient

    from eosink.worker.paths import cluster_root

    zk = KazooClient(hosts=zk_hosts)
    try:
        zk.start(timeout=10)
        zk.delete(cluster_root(cluster), recursive=True)
    except Exception:  # noqa: BLE001 - best effort: every run has a cluster of its own
        pass
    finally:
        zk.stop()
        zk.close()


# ---------------------------------------------------------------------------------------- report
def report(e2e: dict[str, Any], raw: dict[str, float] | None) -> None:
    n = e2e["records"]
    print()
    print(f"end to end: {n:,} records, POST -> last row visible in {e2e['seconds']:.2f}s"
          + (f" (the last commit's log line; the poll saw it at {e2e['polled_s']:.2f}s)" if e2e.get("end_by") == "commit" else "")
          + f" = {e2e['rate']:,.0f} records/s"
          + (f" = {e2e['rate'] / raw['rate']:.0%} of raw COPY" if raw else "")
          + f"; first rows visible at {e2e['first_row_s'] or 0:.2f}s")
    print(f"  worker: peak RSS {e2e['peak_rss_mb']:.0f} MB (VmHWM), CPU {e2e['cpu_s']:.1f}s "
          f"({e2e['cpu_s'] / n * 1e6:.1f} us/record, {e2e['cpu_s'] / e2e['seconds']:.0%} of one core); "
          f"the machine's {os.cpu_count()} CPUs were {e2e.get('machine_busy', 0):.0%} busy (every process)")
    print("  worker CPU by thread (s): " + ", ".join(f"{k} {v:.2f}" for k, v in e2e.get("thread_cpu_s", {}).items()))
    if raw:
        print(f"raw binary COPY (pre-built rows, no Kafka): {raw['seconds']:.2f}s = {raw['rate']:,.0f} rows/s "
              f"(client CPU {raw['cpu_s']:.1f}s)")
    steps = e2e.get("steps", {})
    cyc = steps.get("cycle", {})
    if cyc.get("count"):
        total = cyc["sum"]
        parts = {s: v.get("sum", 0.0) for s, v in steps.items() if s != "cycle"}
        parts["poll+decode+stage (rest)"] = total - sum(parts.values())
        median = statistics.median(e2e["cycle_records"] or [0])
        print(f"  {int(cyc['count'])} cycles, {total:.2f}s in cycles; median {median:,.0f} records/cycle; per step: "
              + ", ".join(f"{s} {v:.2f}s ({v / total:.0%})" for s, v in parts.items()))
        print(f"  outside cycles (registration, assignment, recovery, count polling): {e2e['seconds'] - total:.2f}s")
    tl = e2e.get("timeline", {})
    commits = tl.get("commits", [])
    print(f"  timeline after the POST (s): POST answered in {tl.get('post_ms', 0) / 1000:.2f}, assignment "
          f"{tl.get('assignment_published', '-')}, partitions acquired {tl.get('partitions_acquired', '-')}, "
          f"first commit {commits[0][0] if commits else '-'}, last commit {commits[-1][0] if commits else '-'}")
    c = e2e["check"]
    print(f"  check: {'ok' if c['ok'] else 'FAILED'}: {c['rows']:,} rows, {c['distinct_ids']:,} distinct ids "
          f"[{c['min_id']}..{c['max_id']}], {c['left_prepared']} left prepared")
    print(f"  target >= {TARGET_RATE:,} records/s: {verdict(e2e)}; "
          f"load {e2e['load_before']:.1f} -> {e2e['load_after']:.1f} on {os.cpu_count()} CPUs; worker log {e2e['log']}")


def verdict(e2e: dict[str, Any]) -> str:
    """'met', or by how much it was missed and the figures that say why: the worker's one task thread
    is CPU-bound, so the rate is its CPU per record and the share of a core it got."""
    rate = e2e["rate"]
    if rate >= TARGET_RATE:
        return "met"
    n, seconds, cpu = e2e["records"], e2e["seconds"], e2e["cpu_s"]
    core = cpu / seconds
    need = n / TARGET_RATE
    return (f"MISSED by {1 - rate / TARGET_RATE:.1%} ({TARGET_RATE - rate:,.0f} records/s short): the worker used "
            f"{cpu / n * 1e6:.2f} us of CPU per record at {core:.0%} of a core (the machine {e2e.get('machine_busy', 0):.0%} "
            f"busy); {TARGET_RATE:,}/s needs {cpu / need:.0%} of a core at that cost, or "
            f"{need * min(core, 1.0) / n * 1e6:.2f} us per record with {min(core, 1.0):.0%} of one")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--topic", default=None, help="outbox topic (default bench-e2e-<N>-p<P>; reused when full)")
    ap.add_argument("--outbox-headers", action="store_true", help="records carry the publisher's two headers "
                    "(eosink.id, eosink.run), as Spark's outbox records do (topic ...-h)")
    ap.add_argument("--envelope", action="store_true", help="values in Kafka Connect's schemas.enable=true envelope "
                    "(JsonConverter's {\"schema\", \"payload\"}), read with value.converter.schemas.enable=true")
    ap.add_argument("--format", choices=("json", "avro"), default="json", help="avro: the same records also as Avro "
                    "(value.converter=avro, schema in the stack's Schema Registry), --pairs runs of each alternated with "
                    "JSON (bench/e2e_avro.py)")
    ap.add_argument("--avro-record", choices=("order", "typed"), default="order", help="with --format avro: the order "
                    "(long, strings, double) or a record with a decimal, a timestamp-millis and bytes (bench/e2e_avro.py)")
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--insert-mode", choices=("insert", "upsert", "update"), default="insert",
                    help="the connector's insert.mode (upsert/update: pk.mode=record_value, pk.fields=id); "
                         "figures are published for insert only")
    ap.add_argument("--batch-max-records", type=int, default=0, help="0: the connector default")
    ap.add_argument("--batch-max-bytes", type=int, default=0, help="0: the connector default")
    ap.add_argument("--consumer", action="append", default=[], metavar="KEY=VALUE",
                    help="a librdkafka consumer property, as consumer.override.KEY (repeatable)")
    ap.add_argument("--skip-copy", action="store_true", help="skip the raw COPY baseline")
    ap.add_argument("--py-spy", default=None, metavar="OUT", help="py-spy record the worker (.svg, .json, raw)")
    ap.add_argument("--poll-s", type=float, default=None, help="how often the rows are looked for (default 0.05 s "
                    "by offsets, 0.25 s by count)")
    ap.add_argument("--poll-by", choices=("offsets", "count"), default="offsets",
                    help="offsets: the connector's committed offsets (same transaction as the rows); count: count(*)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--wait-load", type=float, default=2.5, help="wait for the 1-minute load to drop below this")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--label", default="", help="a name for this configuration in the results")
    ap.add_argument("--keep", action="store_true", help="keep the table and the bookkeeping rows")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--audit-overhead", action="append", default=[], metavar="SECONDS[:MAX_RECORDS]", help="alternate "
                    "--pairs runs without and with --audit-interval SECONDS [--audit-max-records MAX_RECORDS] on the "
                    "worker (repeatable) and report the cost (bench/e2e_audit.py)")
    ap.add_argument("--pairs", type=int, default=3, help="with --audit-overhead or --format avro: runs of each kind")
    published.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.poll_s is None:
        args.poll_s = 0.05 if args.poll_by == "offsets" else 0.25
    ep = load_endpoints()
    tag = uuid.uuid4().hex[:6]
    topic = args.topic or f"bench-e2e-{args.records}-p{args.partitions}" + ("-h" if args.outbox_headers else "") \
        + ("-env" if args.envelope else "") + ("" if args.avro_record == "order" else f"-{args.avro_record}")
    in_child(prefill, ep.kafka_bootstrap, topic, args.records, args.partitions, args.outbox_headers, args.envelope, None,
             args.avro_record)
    logdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    if args.audit_overhead:
        from bench import e2e_audit

        over = e2e_audit.run_overhead(args, ep, topic, tag, logdir)
        published.maybe_publish(args, lambda: e2e_audit.figure(args, over, argv))
        return 0 if over["ok"] else 1
    if args.format == "avro":
        if not ep.registry_url:
            raise SystemExit("--format avro needs the stack's Schema Registry")
        avro_topic = topic + "-avro"
        in_child(prefill, ep.kafka_bootstrap, avro_topic, args.records, args.partitions, False, False, ep.registry_url,
                 args.avro_record)
        both = e2e_avro.run_pairs(args, ep, topic, avro_topic, tag, logdir)
        published.maybe_publish(args, lambda: e2e_avro.figure(args, both, conditions(args, both["runs"]["avro"][-1]), argv))
        return 0 if both["ok"] else 1
    e2e = run_e2e(args, ep, topic, tag, logdir)
    raw = None
    if not args.skip_copy:
        wait_load(args.wait_load)
        raw = in_child(raw_copy, ep.postgres_dsn, f"bench_e2e_raw_{tag}", args.records, args.partitions,
                       args.batch_max_records or 200_000, topic)
    report(e2e, raw)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(args.out.read_text()) if args.out.exists() else []
    runs.append({"label": args.label, "poll_by": args.poll_by, "outbox_headers": args.outbox_headers, "envelope": args.envelope,
                 "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "topic": topic, "partitions": args.partitions, "e2e": e2e, "raw_copy": raw,
                 "ratio_to_raw_copy": e2e["rate"] / raw["rate"] if raw else None})
    args.out.write_text(json.dumps(runs, indent=1))
    # Records with the outbox headers, or in the envelope, are figures of their own: never the plain run's.
    kind = ", records with the outbox headers" if args.outbox_headers else ""
    kind += ", values in Kafka Connect's schemas.enable envelope" if args.envelope else ""
    name = "e2e" + ("-outbox-headers" if args.outbox_headers else "") + ("-envelope" if args.envelope else "")
    if args.insert_mode != "insert":
        args.publish = False  # the published figure is insert mode's
    published.maybe_publish(args, lambda: published.figure(
        name, title=TITLE + kind, measures=MEASURES,
        baseline=BASELINE, conditions=conditions(args, e2e), unit="records/s", rows=figure_rows(e2e, raw, kind),
        targets=[published.target("end-to-end rate", f">= {TARGET_RATE:,} records/s", f"{e2e['rate']:,.0f} records/s",
                                  e2e["rate"] >= TARGET_RATE)]
        + ([published.target("share of the raw binary COPY, same run", f">= {TARGET_SHARE:.0%}", f"{e2e['rate'] / raw['rate']:.0%}",
                             e2e["rate"] / raw["rate"] >= TARGET_SHARE)] if raw else []),
        argv=argv, make_target="bench-e2e"))
    return 0 if e2e["check"]["ok"] else 1


# ---------------------------------------------------------------------------------------- figures
TITLE = "End to end: Kafka to PostgreSQL through one worker process"
MEASURES = ("Records/s from registering a postgres connector through the REST API to the last row visible, through one "
            "eosink worker process; every id checked once and no prepared transaction left.")
BASELINE = "a raw binary COPY of the same rows, pre-built, into a fresh table, in the same run"


def figure_rows(e2e: dict[str, Any], raw: dict[str, float] | None, kind: str) -> list[dict[str, Any]]:
    """The raw COPY (when it ran) and the end-to-end run, each with the CPU it took per record."""
    n = e2e["records"]
    rows = []
    if raw:
        rows.append(published.row("raw binary COPY of the same rows, pre-built (no Kafka, no JSON, no 2PC)", round(raw["rate"]),
                                  baseline=True, cpu_us=raw["cpu_s"] / n * 1e6, note="CPU: the client's"))
    label = "eosink worker, Kafka to PostgreSQL" + kind
    rows.append(published.row(label, round(e2e["rate"]), raw["rate"] if raw else None, cpu_us=e2e["cpu_s"] / n * 1e6,
                              note=f"worker peak RSS {e2e['peak_rss_mb']:.0f} MB, {e2e['cpu_s'] / e2e['seconds']:.0%} of a core"))
    return rows


def conditions(args: argparse.Namespace, e2e: dict[str, Any]) -> str:
    n = e2e["records"]
    size = statistics.fmean(len(value_of(i, args.envelope)) for i in range(0, n, max(1, n // 1000)))
    return (f"{n:,} JSON records of ~{size:.0f} bytes in {args.partitions} partitions, commit.interval.ms "
            f"{args.commit_interval_ms}, done when the {'committed offsets' if args.poll_by == 'offsets' else 'count(*)'} "
            f"show every record; the machine {e2e.get('machine_busy', 0):.0%} busy, 1-min load {e2e['load_before']:.1f} -> "
            f"{e2e['load_after']:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    raise SystemExit(main())
