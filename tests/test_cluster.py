"""The ZooKeeper cluster against real processes: three workers, then kill -9, SIGSTOP past the
session timeout, a ZooKeeper restart, a worker cut off from ZooKeeper only, and a rolling
restart under load. Each test ends by counting PostgreSQL: every id once, none missing, nothing
from an aborted Kafka transaction.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import pytest

from tests.procs import TcpProxy, WorkerProcess, free_port, publish, register, wait_until

pytestmark = pytest.mark.chaos

PARTITIONS = 6
SESSION = 4.0


class Cluster:
    def __init__(self, stack, unique, pg, zk, tmp_path, make_topic, *, tasks_max: int = 3) -> None:
        self.stack, self.unique, self.pg, self.zk, self.tmp = stack, unique, pg, zk, tmp_path
        self.topic = make_topic(PARTITIONS)
        self.connector = unique.replace("_", "-")
        self.table = unique
        self.committed: set[str] = set()
        self.aborted: set[str] = set()
        self.batches = 0
        register(stack.zookeeper_hosts, unique, self.connector, {
            "connector.class": "postgres", "topics": self.topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": self.table, "tasks.max": str(tasks_max), "commit.interval.ms": "250",
        })
        self.workers: dict[str, WorkerProcess] = {}

    def start(self, wid: str, **kw) -> WorkerProcess:
        w = WorkerProcess(self.stack, self.unique, wid, self.tmp, session_timeout=SESSION, **kw)
        self.workers[wid] = w
        return w

    def publish(self, txns: int = 4, per_txn: int = 150) -> None:
        self.batches += 1
        c, a = publish(self.stack.kafka_bootstrap, self.topic, PARTITIONS, txns=txns, per_txn=per_txn, aborted_every=3,
                       prefix=f"b{self.batches}")
        self.committed |= c
        self.aborted |= a

    def statuses(self) -> dict[str, dict]:
        base = f"/eosink/{self.unique}/status/{self.connector}"
        out = {}
        for w in self.zk.get_children(base) if self.zk.exists(base) else []:
            try:
                out[w] = json.loads(self.zk.get(f"{base}/{w}")[0])
            except Exception:  # noqa: BLE001 - the znode went away between the two calls
                continue
        return out

    def owners(self) -> dict[str, list[str]]:
        return {w: s["partitions"] for w, s in self.statuses().items() if s["state"] == "RUNNING" and s["partitions"]}

    def wait_spread(self, workers: set[str], timeout: float = 60) -> None:
        def spread() -> bool:
            o = self.owners()
            held = sorted(p for ps in o.values() for p in ps)
            return set(o) == workers and len(held) == PARTITIONS == len(set(held))
        wait_until(spread, timeout, f"{PARTITIONS} partitions spread over {sorted(workers)} (now {self.owners()})")

    def ids(self) -> list[str]:
        if not self.pg.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0]:
            return []
        return [r[0] for r in self.pg.execute(f'SELECT id FROM "{self.table}"')]

    def wait_delivered(self, timeout: float = 120) -> None:
        wait_until(lambda: len(set(self.ids())) >= len(self.committed), timeout,
                   f"delivery of {len(self.committed)} records (have {len(set(self.ids()))})")

    def assert_exactly_once(self) -> None:
        time.sleep(1.0)  # a few more commit intervals: anything extra would show now
        ids = self.ids()
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
        assert set(ids) == self.committed, f"missing {len(self.committed - set(ids))}, from aborted {len(set(ids) & self.aborted)}"
        prepared = self.pg.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
                                   (f"eosink:{self.connector}.%",)).fetchone()[0]
        assert prepared == 0, "a prepared transaction was left unresolved"

    def stop_all(self) -> dict[str, int]:
        return {wid: w.stop() for wid, w in self.workers.items()}


@pytest.fixture
def cluster(stack, unique, pg, zk, tmp_path, make_topic):
    c = Cluster(stack, unique, pg, zk, tmp_path, make_topic)
    yield c
    c.stop_all()


def _metric(port: int, name: str, connector: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{connector="{connector}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_killed_worker_partitions_resume_elsewhere(cluster):
    for wid in ("w1", "w2", "w3"):
        cluster.start(wid)
    cluster.wait_spread({"w1", "w2", "w3"})
    cluster.publish()
    cluster.wait_delivered()
    victim = cluster.workers["w2"]
    victim.signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    cluster.publish()
    cluster.wait_spread({"w1", "w3"}, timeout=SESSION + 30)
    cluster.wait_delivered()
    cluster.assert_exactly_once()


def test_zombie_commit_after_sigstop_is_refused(cluster):
    cluster.start("w1")
    cluster.start("w2")
    port = free_port()
    # w3 pauses itself (SIGSTOP) right after preparing its 3rd transaction: a zombie holding a
    # prepared transaction, its decision not yet sent.
    zombie = cluster.start("w3", fault="after_prepare:2:stop", metrics_port=port)
    cluster.wait_spread({"w1", "w2", "w3"})

    def paused() -> bool:
        cluster.publish(txns=2, per_txn=60)
        return "SIGSTOP to pid" in zombie.log_text()

    wait_until(paused, 90, "w3 to pause holding a prepared txn", interval=0.5)
    time.sleep(SESSION + 1)  # past the session timeout: the others take over and commit more
    cluster.publish()
    cluster.wait_spread({"w1", "w2"}, timeout=30)
    cluster.wait_delivered()
    zombie.signal(signal.SIGCONT)
    wait_until(lambda: "decision_fenced" in zombie.log_text(), 30, "the zombie's decision to be refused")
    assert _metric(port, "eosink_fenced_attempts_total", cluster.connector) >= 1
    assert '"cycle_committed"' not in zombie.log_text().split("SIGSTOP to pid", 1)[1]
    cluster.assert_exactly_once()


def test_zookeeper_restart_mid_stream(cluster):
    from eosink.worker.stack import start_component, stop_component

    for wid in ("w1", "w2", "w3"):
        cluster.start(wid)
    cluster.wait_spread({"w1", "w2", "w3"})
    cluster.publish()
    stop_component("zookeeper")
    try:
        cluster.publish()  # Kafka keeps taking records while ZooKeeper is down
        time.sleep(2)
    finally:
        start_component("zookeeper")
    cluster.publish()
    cluster.wait_delivered(timeout=180)
    cluster.assert_exactly_once()
    assert all(w.proc.poll() is None for w in cluster.workers.values()), "a worker died with ZooKeeper"


def test_worker_cut_off_from_zookeeper_only_stops_committing(cluster, stack):
    host, port = stack.zookeeper_hosts.split(",")[0].rsplit(":", 1)
    proxy = TcpProxy((host, int(port)))
    mport = free_port()
    try:
        cut_off = WorkerProcess(cluster.stack, cluster.unique, "w-cut", cluster.tmp, session_timeout=SESSION, metrics_port=mport,
                                zookeeper=f"127.0.0.1:{proxy.port}")
        cluster.workers["w-cut"] = cut_off
        cluster.start("w-ok")
        cluster.wait_spread({"w-cut", "w-ok"})
        cluster.publish()
        cluster.wait_delivered()
        proxy.sever()  # it still reaches Kafka and PostgreSQL
        time.sleep(1.0)
        before = _metric(mport, "eosink_records_delivered_total", cluster.connector)
        cluster.publish(txns=6)
        cluster.wait_spread({"w-ok"}, timeout=SESSION + 30)  # its session expires; w-ok takes everything
        cluster.wait_delivered()
        time.sleep(SESSION)
        assert _metric(mport, "eosink_records_delivered_total", cluster.connector) == before, \
            "the worker cut off from ZooKeeper committed"
        proxy.heal()
        cluster.publish()
        cluster.wait_delivered()
        cluster.assert_exactly_once()
    finally:
        proxy.close()


def test_rolling_restart_of_all_workers_under_load(cluster):
    for wid in ("w1", "w2", "w3"):
        cluster.start(wid)
    cluster.wait_spread({"w1", "w2", "w3"})
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            cluster.publish(txns=3, per_txn=100)
            time.sleep(0.2)

    producer = threading.Thread(target=load, daemon=True)
    producer.start()
    try:
        live = {"w1", "w2", "w3"}
        for i, old in enumerate(["w1", "w2", "w3"]):
            rc = cluster.workers[old].stop()
            assert rc == 0, f"{old} did not exit 0 on SIGTERM: {rc}"
            new = f"w{i + 4}"
            cluster.start(new)
            live = (live - {old}) | {new}
            cluster.wait_spread(live)
    finally:
        stop.set()
        producer.join()
    cluster.wait_delivered()
    cluster.assert_exactly_once()
