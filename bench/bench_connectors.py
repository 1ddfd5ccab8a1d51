"""What one connector costs a worker: threads, PostgreSQL connections, memory, ZooKeeper writes/s.

    python bench/bench_connectors.py [--connectors 100 500] [--postgres 20] [--seconds 10]

Three real ``eosink worker`` processes, against a private ZooKeeper (started for the run with the
stack's own code, so only this run's writes count) and the stack's Kafka and PostgreSQL. For each
N in ``--connectors``: N connectors of one task over one 3-partition topic, the first
``--postgres`` of them PostgreSQL sinks (sharing each worker's pool of ``--postgres-pool-size``
connections; keep this under the stack PostgreSQL's max_prepared_transactions, 64) and the rest
filesystem sinks. Measured with the N connectors idle (every
partition held, nothing published), then under a light load (a transactional producer, ~100
records/s into the topic every connector reads):

* threads and RSS of the three workers (``/proc/<pid>/status``), less what they had with no connector;
* PostgreSQL connections of the cluster, from ``pg_stat_activity`` by ``application_name``
  (``eosink/<connector>``, the connector using a pooled connection or that used it last);
* the cluster's ZooKeeper writes per second: the ``zxid`` delta of ``srvr`` over the window (every
  write, a multi-op included, is one zxid), on a ZooKeeper nothing else writes to.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from bench import report  # noqa: E402
from eosink.worker.stack import load_endpoints  # noqa: E402
from tests.procs import WorkerProcess, free_port, register, wait_until  # noqa: E402

WORKERS = ("w1", "w2", "w3")
POOL = 20  # the workers' --postgres-pool-size (default)


def _four_letter(hosts: str, word: bytes) -> str:
    host, port = hosts.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(word)
        s.shutdown(socket.SHUT_WR)
        text = b""
        while chunk := s.recv(4096):
            text += chunk
    return text.decode()


def zxid(hosts: str) -> int:
    for line in _four_letter(hosts, b"srvr").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split()[1], 16)
    raise RuntimeError(f"no Zxid in the srvr answer of {hosts}")


def proc_usage(pid: int) -> tuple[int, float]:
    """(threads, RSS in MiB) of a live process."""
    threads, rss_kb = 0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return threads, rss_kb / 1024


class PrivateZooKeeper:
    """A ZooKeeper of this run's own, under a temporary home, started and stopped by the stack's code."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()

    def __enter__(self) -> str:
        from eosink.worker.stack import manager

        os.environ["EOSINK_ZOOKEEPER_PORT"] = str(self.port)
        manager.up(["zookeeper"], self.home)
        return f"127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        from eosink.worker.stack import manager

        manager.down(["zookeeper"], self.home)


class Cluster:
    """Three workers of one cluster, the connectors registered on it, and a light producer."""

    def __init__(self, ep: Any, zk_hosts: str, tmp: Path) -> None:
        self.ep, self.zk_hosts, self.tmp = ep, zk_hosts, tmp
        self.cluster = f"bc-{uuid.uuid4().hex[:6]}"
        self.topic = f"bench-connectors-{uuid.uuid4().hex[:8]}"
        self.admin = AdminClient({"bootstrap.servers": ep.kafka_bootstrap})
        self.admin.create_topics([NewTopic(self.topic, 3, 1)])[self.topic].result(60)
        ends = type("Endpoints", (), {"kafka_bootstrap": ep.kafka_bootstrap, "zookeeper_hosts": zk_hosts,
                                      "postgres_dsn": ep.postgres_dsn})()
        self.workers = {w: WorkerProcess(ends, self.cluster, w, tmp, extra_args=["--postgres-pool-size", str(POOL)])
                        for w in WORKERS}
        self.zk = KazooClient(hosts=zk_hosts)
        self.zk.start(20)
        self.names: list[str] = []
        self.tables: list[str] = []
        self._loading = threading.Event()

    def wait_up(self) -> None:
        path = f"/eosink/{self.cluster}/workers"
        wait_until(lambda: bool(self.zk.exists(path)) and len(self.zk.get_children(path)) == len(WORKERS), 60,
                   "three workers registered")

    def add(self, n: int, postgres: int) -> None:
        for i in range(len(self.names), len(self.names) + n):
            name = f"{self.cluster}-{i}"
            if len(self.tables) < postgres:
                table = f"bench_conn_{self.cluster.replace('-', '_')}_{i}"
                self.tables.append(table)
                config = {"connector.class": "postgres", "connection.url": "${env:EOSINK_PG_DSN}", "table.name.format": table}
            else:
                config = {"connector.class": "filesystem", "file.path": str(self.tmp / "out"), "file.fsync": "false"}
            register(self.zk_hosts, self.cluster, name, {**config, "topics": self.topic, "tasks.max": "1"})
            self.names.append(name)

    def running(self) -> int:
        """Connectors whose task holds all 3 partitions, running."""
        n = 0
        for name in self.names:
            base = f"/eosink/{self.cluster}/status/{name}"
            held = 0
            for w in self.zk.get_children(base) if self.zk.exists(base) else []:
                try:
                    st = json.loads(self.zk.get(f"{base}/{w}")[0])
                except Exception:  # noqa: BLE001 - gone between the calls
                    continue
                if st.get("state") == "RUNNING":
                    held += len(st.get("partitions", []))
            n += held == 3
        return n

    def usage(self) -> tuple[int, float]:
        per = [proc_usage(w.proc.pid) for w in self.workers.values()]
        return sum(t for t, _ in per), sum(r for _, r in per)

    def load(self) -> None:
        def run() -> None:
            p = Producer({"bootstrap.servers": self.ep.kafka_bootstrap, "transactional.id": f"bench-{self.topic}",
                          "linger.ms": 5})
            p.init_transactions(30)
            n = 0
            while self._loading.is_set():
                p.begin_transaction()
                for _ in range(20):
                    p.produce(self.topic, value=json.dumps({"id": n, "payload": "x" * 100}).encode(), partition=n % 3)
                    n += 1
                p.commit_transaction(30)
                time.sleep(0.2)
        self._loading.set()
        threading.Thread(target=run, daemon=True).start()

    def close(self, pg: psycopg.Connection[Any] | None) -> None:
        self._loading.clear()
        for w in self.workers.values():
            w.stop(60)
        self.zk.stop()
        if pg is not None:
            with psycopg.connect(self.ep.postgres_dsn, autocommit=True) as own:  # the run's may have met a restart
                for t in self.tables:
                    own.execute(f'DROP TABLE IF EXISTS "{t}"')
        self.admin.delete_topics([self.topic])[self.topic].result(60)


def pg_connections(pg: psycopg.Connection[Any], cluster: str) -> int:
    row = pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (f"eosink/{cluster}-%",)).fetchone()
    return int(row[0]) if row else 0


def window(c: Cluster, pg: psycopg.Connection[Any], seconds: float) -> dict[str, float]:
    z0, t0 = zxid(c.zk_hosts), time.monotonic()
    time.sleep(seconds)
    z1, t1 = zxid(c.zk_hosts), time.monotonic()
    threads, rss = c.usage()
    return {"zk_writes_per_s": (z1 - z0) / (t1 - t0), "threads": threads, "rss_mib": rss,
            "pg_connections": pg_connections(pg, c.cluster)}


def measure(ep: Any, zk_hosts: str, n: int, postgres: int, seconds: float, tmp: Path) -> dict[str, Any]:
    pg = psycopg.connect(ep.postgres_dsn, autocommit=True)
    c = Cluster(ep, zk_hosts, tmp)
    try:
        c.wait_up()
        time.sleep(2)
        base = window(c, pg, seconds / 2)
        t0 = time.monotonic()
        c.add(n, postgres)
        wait_until(lambda: c.running() == n, 170, f"{n} connectors running", interval=1.0)
        started_s = time.monotonic() - t0
        time.sleep(2)
        idle = window(c, pg, seconds)
        c.load()
        time.sleep(2)
        loaded = window(c, pg, seconds)
        alive = all(w.proc.poll() is None for w in c.workers.values())
        assert alive, "a worker died under the connectors"
        return {"n": n, "postgres": min(postgres, n), "started_s": started_s, "base": base, "idle": idle, "load": loaded}
    finally:
        c.close(pg)
        pg.close()


def table_lines(r: dict[str, Any]) -> list[str]:
    n, p, b = r["n"], r["postgres"], r["base"]
    out = [f"{n} connectors ({p} postgres, {n - p} filesystem) on 3 workers, all running after {r['started_s']:.0f} s",
           f"  {'':<8} {'threads/conn':>13} {'RSS MiB/conn':>13} {'PG conns':>17} {'ZK writes/s':>12} "
           f"{'ZK w/s per conn':>16}"]
    for what in ("idle", "load"):
        m = r[what]
        pg = str(m["pg_connections"]) if p else "-"
        out.append(f"  {what:<8} {(m['threads'] - b['threads']) / n:>13.2f} {(m['rss_mib'] - b['rss_mib']) / n:>13.2f} "
                   f"{pg:>17} {m['zk_writes_per_s']:>12.1f} {(m['zk_writes_per_s'] - b['zk_writes_per_s']) / n:>16.3f}")
    out.append(f"  no connector: {b['threads']} threads, {b['rss_mib']:.0f} MiB RSS (3 workers), "
               f"{b['zk_writes_per_s']:.1f} ZooKeeper writes/s")
    return out


TITLE = "Connectors: what one costs a worker"
MEASURES = ("Per connector of one task, over three worker processes: threads and RSS added to the workers, PostgreSQL "
            "connections per PostgreSQL connector, and the cluster's ZooKeeper writes per second, idle and under a light load.")
BASELINE = "the same three workers with no connector"


def figure_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        n, p, b = r["n"], r["postgres"], r["base"]
        for what in ("idle", "load"):
            m = r[what]
            rows.append(report.row(f"{n} connectors, {what}: threads per connector", round((m["threads"] - b["threads"]) / n, 2)))
            rows.append(report.row(f"{n} connectors, {what}: RSS MiB per connector", round((m["rss_mib"] - b["rss_mib"]) / n, 2)))
            rows.append(report.row(f"{n} connectors, {what}: ZooKeeper writes/s (cluster)", round(m["zk_writes_per_s"], 1)))
            if p:
                rows.append(report.row(f"{n} connectors, {what}: PostgreSQL connections (cluster, {p} postgres connectors)",
                                       m["pg_connections"]))
    return rows


def figure_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bounds: the workers' pools (3 x POOL PostgreSQL connections, whatever N), no ZooKeeper write by an idle connector."""
    out = []
    for r in results:
        n, p, idle, load = r["n"], r["postgres"], r["idle"], r["load"]
        if p:
            most = max(idle["pg_connections"], load["pg_connections"])
            bound = len(WORKERS) * POOL
            out.append(report.target(f"{n} connectors ({p} postgres): PostgreSQL connections of the cluster",
                                     f"<= {bound} (3 workers' pools of {POOL})", str(most), most <= bound))
        out.append(report.target(f"{n} connectors idle: ZooKeeper writes/s", "< 1 (none per idle connector)",
                                 f"{idle['zk_writes_per_s']:.1f}", idle["zk_writes_per_s"] < 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connectors", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--postgres", type=int, default=50, help="PostgreSQL connectors among them (sharing each worker's pool)")
    ap.add_argument("--seconds", type=float, default=10.0, help="each measuring window")
    ap.add_argument("--output", default="bench/results/connectors.json")
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    ep = load_endpoints()
    results = []
    with tempfile.TemporaryDirectory(prefix="eosink-bench-connectors-") as d, PrivateZooKeeper(Path(d) / "zk") as zk_hosts:
        for n in args.connectors:
            tmp = Path(d) / f"n{n}"
            tmp.mkdir()
            results.append(measure(ep, zk_hosts, n, args.postgres, args.seconds, tmp))
            for line in table_lines(results[-1]):
                print(line)
            shutil.rmtree(tmp / "out", ignore_errors=True)
    load = report.load_note()
    print(load)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": {**vars(args), "publish_dir": str(args.publish_dir)}, "results": results},
                                            indent=2))
    conditions = (f"three worker processes, connectors of one task over one 3-partition topic, the first {args.postgres} "
                  "PostgreSQL sinks and the rest filesystem sinks, commit.interval.ms 1000; light load: 100 records/s "
                  f"(20 per transaction) read by every connector; windows of {args.seconds:g} s; ZooKeeper writes are the "
                  f"zxid delta of a private ZooKeeper; {load}")
    report.maybe_publish(args, lambda: report.figure(
        "connectors", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="value",
        rows=figure_rows(results), targets=figure_targets(results), argv=argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
