"""Cluster benchmark: failover, graceful handoff, assignment convergence, ZooKeeper writes per cycle.

    python bench/bench_cluster.py [--session-timeout 6] [--partitions 1000]

Real processes on the local stack (``eosink stack up``): three ``eosink worker`` processes, a
filesystem connector, and a transactional producer keeping the outbox busy.

* failover: ``kill -9`` of the worker owning partition 0 -> the first decision written for that
  partition by its new owner (read from the decision log znode), against the session timeout;
* graceful handoff: SIGTERM of the owner -> the first decision by the new owner;
* convergence: a connector over a 1,000-partition topic registered with three workers running
  -> every partition held, balanced;
* ZooKeeper writes per cycle: the zxid delta (every write, a multi-op included, is one zxid)
  over the cycles completed in a steady window with one worker.
"""

from __future__ import annotations

import argparse
import json
import signal
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

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from bench import report  # noqa: E402
from eosink.worker.stack import load_endpoints  # noqa: E402
from tests.procs import WorkerProcess, register, wait_until  # noqa: E402


def _zxid(hosts: str) -> int:
    host, port = hosts.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"srvr")
        s.shutdown(socket.SHUT_WR)
        text = b""
        while chunk := s.recv(4096):
            text += chunk
    for line in text.decode().splitlines():
        if line.startswith("Zxid:"):
            return int(line.split()[1], 16)
    raise RuntimeError(f"no Zxid in srvr output: {text!r}")


class Rig:
    def __init__(self, ep, partitions: int, session: float, interval_ms: int, tmp: Path) -> None:
        self.ep, self.session, self.tmp = ep, session, tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.cluster = f"bench-{uuid.uuid4().hex[:8]}"
        self.connector = "bench"
        self.topic = f"bench-cluster-{uuid.uuid4().hex[:8]}"
        self.partitions = partitions
        admin = AdminClient({"bootstrap.servers": ep.kafka_bootstrap})
        admin.create_topics([NewTopic(self.topic, partitions, 1)])[self.topic].result(60)
        self.zk = KazooClient(hosts=ep.zookeeper_hosts)
        self.zk.start(20)
        self.workers: dict[str, WorkerProcess] = {}
        self.interval_ms = interval_ms
        self._stop = threading.Event()

    def register(self) -> float:
        register(self.ep.zookeeper_hosts, self.cluster, self.connector, {
            "connector.class": "filesystem", "topics": self.topic, "file.path": str(self.tmp / "out"), "file.fsync": "false",
            "tasks.max": "3", "commit.interval.ms": str(self.interval_ms),
        })
        return time.monotonic()

    def start(self, wid: str) -> None:
        self.workers[wid] = WorkerProcess(self.ep, self.cluster, wid, self.tmp, session_timeout=self.session)

    def load(self) -> None:
        def run() -> None:
            p = Producer({"bootstrap.servers": self.ep.kafka_bootstrap, "transactional.id": f"bench-{self.topic}", "linger.ms": 5})
            p.init_transactions(30)
            n = 0
            while not self._stop.is_set():
                p.begin_transaction()
                for part in range(self.partitions):
                    p.produce(self.topic, value=json.dumps({"id": n}).encode(), partition=part)
                    n += 1
                p.commit_transaction(30)
                time.sleep(0.05)
        threading.Thread(target=run, daemon=True).start()

    def entry(self, partition: int) -> dict:
        data, _ = self.zk.get(f"/eosink/{self.cluster}/partitions/{self.connector}/{self.topic}-{partition}")
        return json.loads(data)

    def held(self) -> dict[str, list[str]]:
        base = f"/eosink/{self.cluster}/status/{self.connector}"
        out = {}
        for w in self.zk.get_children(base) if self.zk.exists(base) else []:
            try:
                st = json.loads(self.zk.get(f"{base}/{w}")[0])
            except Exception:  # noqa: BLE001 - gone between the calls
                continue
            if st["state"] == "RUNNING":
                out[w] = st["partitions"]
        return out

    def wait_balanced(self, workers: set[str], timeout: float) -> float:
        t0 = time.monotonic()

        def ok() -> bool:
            h = self.held()
            every = [p for ps in h.values() for p in ps]
            sizes = [len(ps) for ps in h.values()]
            return set(h) == workers and len(every) == len(set(every)) == self.partitions and max(sizes) - min(sizes) <= 1
        wait_until(ok, timeout, f"all {self.partitions} partitions held by {sorted(workers)}", interval=0.05)
        return time.monotonic() - t0

    def first_decision_by_other(self, partition: int, victim: str, since: float, timeout: float) -> tuple[float, str]:
        deadline = since + timeout
        while time.monotonic() < deadline:
            e = self.entry(partition)
            txn = e.get("txn") or ""
            owner = txn.split(".")[1] if txn.count(".") >= 3 else ""
            if owner and owner != victim:
                return time.monotonic() - since, owner
            time.sleep(0.01)
        raise TimeoutError(f"no decision by a new owner of partition {partition} within {timeout} s")

    def close(self) -> None:
        self._stop.set()
        for w in self.workers.values():
            w.stop()
        self.zk.stop()


def _owner_of(rig: Rig, partition: int) -> str:
    name = f"{rig.topic}-{partition}"
    for w, ps in rig.held().items():
        if name in ps:
            return w
    raise RuntimeError(f"nobody holds {name}")


def bench_failover_and_handoff(ep, args, tmp: Path) -> dict[str, float]:
    rig = Rig(ep, 6, args.session_timeout, args.commit_interval_ms, tmp / "fo")
    out: dict[str, float] = {}
    try:
        rig.register()
        for w in ("w1", "w2", "w3"):
            rig.start(w)
        rig.load()
        rig.wait_balanced({"w1", "w2", "w3"}, 60)
        time.sleep(2)
        victim = _owner_of(rig, 0)
        t0 = time.monotonic()
        rig.workers[victim].signal(signal.SIGKILL)
        out["failover_s"], heir = rig.first_decision_by_other(0, victim, t0, args.session_timeout + 60)
        rig.workers[victim].wait(10)
        live = {"w1", "w2", "w3"} - {victim}
        rig.wait_balanced(live, 60)
        time.sleep(2)
        owner = _owner_of(rig, 0)
        t0 = time.monotonic()
        rig.workers[owner].signal(signal.SIGTERM)
        out["graceful_handoff_s"], _ = rig.first_decision_by_other(0, owner, t0, 60)
        out["sigterm_exit_code"] = rig.workers[owner].wait(60)
    finally:
        rig.close()
    return out


def bench_convergence(ep, args, tmp: Path) -> dict[str, float]:
    rig = Rig(ep, args.partitions, args.session_timeout, args.commit_interval_ms, tmp / "conv")
    try:
        for w in ("w1", "w2", "w3"):
            rig.start(w)
        time.sleep(3)  # workers up and registered
        t0 = rig.register()
        wait_until(lambda: bool(rig.held()), 60, "a first grant", interval=0.05)
        rig.wait_balanced({"w1", "w2", "w3"}, 120)
        return {"convergence_s": time.monotonic() - t0}
    finally:
        rig.close()


def bench_zk_writes(ep, args, tmp: Path) -> dict[str, float]:
    rig = Rig(ep, 4, args.session_timeout, 200, tmp / "zkw")
    try:
        rig.register()
        rig.start("w1")
        rig.load()
        rig.wait_balanced({"w1"}, 60)
        time.sleep(2)
        z0, d0 = _zxid(ep.zookeeper_hosts), _decisions(rig)
        time.sleep(10)
        z1, d1 = _zxid(ep.zookeeper_hosts), _decisions(rig)
        cycles = d1 - d0
        return {"cycles": cycles, "zk_writes": z1 - z0, "zk_writes_per_cycle": round((z1 - z0) / max(cycles, 1), 2)}
    finally:
        rig.close()


def _decisions(rig: Rig) -> int:
    """Cycles committed so far: the highest txn counter of the (single) generation in the log."""
    counters = []
    for p in range(rig.partitions):
        txn = rig.entry(p).get("txn") or ""
        if txn.count(".") >= 3:
            counters.append(int(txn.rsplit(".", 1)[1]))
    return max(counters, default=0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session-timeout", type=float, default=6.0)
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--output", default="bench/results/cluster.json")
    ap.add_argument("--workdir", help="keep worker logs here instead of a temporary directory")
    report.add_arguments(ap)
    args = ap.parse_args(argv)
    ep = load_endpoints()
    with tempfile.TemporaryDirectory(prefix="eosink-bench-cluster-") as d:
        tmp = Path(args.workdir or d)
        res: dict[str, float] = {}
        res.update(bench_failover_and_handoff(ep, args, tmp))
        res.update(bench_convergence(ep, args, tmp))
        res.update(bench_zk_writes(ep, args, tmp))
    rows = [
        ("failover (kill -9 -> first commit by new owner)", f"{res['failover_s']:.2f} s",
         f"target <= session timeout + 2 s = {args.session_timeout + 2:.1f} s"),
        ("graceful handoff (SIGTERM -> first commit by new owner)", f"{res['graceful_handoff_s']:.2f} s", "target <= 1 s"),
        (f"assignment convergence ({args.partitions} partitions, 3 workers)", f"{res['convergence_s']:.2f} s", "target <= 5 s"),
        ("ZooKeeper writes per cycle (steady state)", f"{res['zk_writes_per_cycle']}",
         f"{res['zk_writes']} writes / {res['cycles']} cycles"),
    ]
    print(f"\nsession timeout {args.session_timeout} s, commit.interval.ms {args.commit_interval_ms}")
    for name, value, note in rows:
        print(f"  {name:<60} {value:>10}   {note}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": {**vars(args), "publish_dir": str(args.publish_dir)}, "results": res}, indent=2))
    conditions = (f"three worker processes, a producer keeping the outbox busy, session timeout {args.session_timeout:g} s, "
                  f"commit.interval.ms {args.commit_interval_ms}; ZooKeeper writes per cycle in steady state: "
                  f"{res['zk_writes_per_cycle']} ({res['zk_writes']} writes / {res['cycles']} cycles; one multi-op per "
                  f"decision); {report.load_note()}")
    report.maybe_publish(args, lambda: report.figure(
        "cluster", title=TITLE, measures=MEASURES, baseline=BASELINE, conditions=conditions, unit="seconds",
        rows=figure_rows(res, args.partitions), targets=figure_targets(res, args.session_timeout), argv=argv))
    return 0


TITLE = "Cluster: failover, graceful handoff and assignment convergence"
MEASURES = ("Seconds until work moves between real worker processes: a kill -9 or a SIGTERM of the owner of a partition "
            "to the first decision by its new owner, and a new connector to every partition held and balanced.")
BASELINE = "none: each measure is held to its target (the session timeout for a failover)"


def figure_rows(res: dict[str, Any], partitions: int) -> list[dict[str, Any]]:
    return [report.row(label, round(res[key], 2)) for label, key in (
        ("failover: kill -9 of the owner of partition 0 -> first decision by its new owner", "failover_s"),
        ("graceful handoff: SIGTERM -> first decision by the new owner", "graceful_handoff_s"),
        (f"assignment convergence: {partitions:,} partitions over 3 workers, balanced and held", "convergence_s"))]


def figure_targets(res: dict[str, Any], session_timeout: float) -> list[dict[str, Any]]:
    bound = session_timeout + 2
    return [report.target("failover", f"<= session timeout + 2 s ({bound:g} s)", f"{res['failover_s']:.2f} s", res["failover_s"] <= bound),
            report.target("graceful handoff", "<= 1 s", f"{res['graceful_handoff_s']:.2f} s", res["graceful_handoff_s"] <= 1),
            report.target("assignment convergence", "<= 5 s", f"{res['convergence_s']:.2f} s", res["convergence_s"] <= 5)]


if __name__ == "__main__":
    sys.exit(main())
