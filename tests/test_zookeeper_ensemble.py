"""The fault matrix's ZooKeeper rows: a 3-node ensemble fails under load, and delivery stays exactly-once.

One private ensemble (``eosink stack up --zookeeper-nodes 3`` under this module's own home and ports)
serves every test here; Kafka, PostgreSQL and the files sink are the shared stack's. As in
:mod:`tests.test_faults`, a transactional producer publishes the whole time (every 4th transaction
aborted), three workers deliver the whole time, and the end is counted from the sinks: every
committed id once, none from an aborted transaction, no prepared transaction left. Each test prints
a ``FAULT-FIGURES`` line (longest stall, catch-up after the fault) for docs/faults.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from eosink.worker.stack.proc import free_port_block
from tests.faultkit import SESSION, PrivateStack, Publisher, Rig
from tests.procs import TcpProxy, wait_until
from tests.test_cli import _write, cli
from tests.test_faults import _drive, _rig, _watch

pytestmark = pytest.mark.faults

NODES = ("zookeeper", "zookeeper-2", "zookeeper-3")


class Ensemble(PrivateStack):
    """Three ZooKeeper nodes of the product's stack under ``home``, on a free block of ports (the
    inherited ``kill``/``restart``/``stop`` act on one node, or all, with the stack's own code)."""

    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: D107 - no Kafka, no PostgreSQL
        self.home = home
        self.names = ["zookeeper"]
        self.brokers = 0
        self.base = free_port_block(25)  # clients base..+2, quorum +10..+12, election +20..+22
        monkeypatch.setenv("EOSINK_ZOOKEEPER_PORT", str(self.base))
        monkeypatch.setenv("EOSINK_ZOOKEEPER_NODES", "3")

    def start(self) -> Ensemble:
        super().start()
        self.hosts = self.endpoints().zookeeper_hosts
        return self

    def modes(self) -> dict[str, str | None]:
        return {name: self.component(name).mode() for name in NODES}

    def leader(self) -> str:
        wait_until(lambda: "leader" in self.modes().values(), 30, "a ZooKeeper leader", interval=0.2)
        return next(name for name, mode in self.modes().items() if mode == "leader")


@pytest.fixture(scope="module")
def ensemble(stack, tmp_path_factory) -> Iterator[Ensemble]:
    """Started after the shared stack's endpoints are read: the env ports below are this ensemble's only."""
    with pytest.MonkeyPatch.context() as mp:
        e = Ensemble(tmp_path_factory.mktemp("zk-ensemble") / "home", mp)
        try:
            yield e.start()
        finally:
            e.stop()


def _commit_times(log: str) -> list[float]:
    """Wall-clock times of a worker's ``cycle_committed`` log lines."""
    return [datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
            for line in log.splitlines() if '"cycle_committed"' in line]


def _http_error(url: str) -> tuple[int, str]:
    """The status code and body of a GET (200 and "" when it succeeds)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return 200, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _three_workers(ensemble: Ensemble, rigs: list[Rig], stack: Any, unique: str, tmp_path: Path) -> Rig:
    rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=ensemble.hosts, postgres_dsn=stack.postgres_dsn,
               tmp=tmp_path, name=unique)
    rig.start_three()
    rig.wait_running({"w1", "w2", "w3"})
    return rig


def test_three_node_ensemble_has_one_leader_and_endpoints_list_every_node(ensemble):
    assert ensemble.hosts == ",".join(f"127.0.0.1:{ensemble.base + i}" for i in range(3))
    assert sorted(m or "down" for m in ensemble.modes().values()) == ["follower", "follower", "leader"]


def test_cli_direct_mode_takes_the_ensemble_connect_string_with_its_first_node_down(ensemble, unique, tmp_path):
    path = _write(tmp_path / "c.json", "direct", {"connector.class": "filesystem", "topics": "t", "file.path": str(tmp_path)})
    direct = ["connectors", "--zookeeper", ensemble.hosts, "--cluster", unique]
    ensemble.kill("zookeeper")  # node 1, the first address of the connect string
    try:
        applied = cli(*direct, "apply", str(path))
        assert applied.stdout.strip() == "created connector direct", applied.stderr
        assert cli(*direct, "list").stdout.split() == ["direct"]
    finally:
        ensemble.restart("zookeeper")
    assert cli(*direct, "delete", "direct").returncode == 0


def test_worker_without_zookeeper_flag_joins_the_ensemble_listed_in_endpoints(ensemble, stack, unique, tmp_path):
    """As ``eosink demo`` starts its worker: no ``--zookeeper``, so the stack's endpoints.json names the
    ZooKeeper, here all three nodes; with node 1 down the worker still registers through another."""
    from kazoo.client import KazooClient

    env = {k: v for k, v in os.environ.items() if k != "EOSINK_ZOOKEEPER"} | {"EOSINK_HOME": str(ensemble.home)}
    ensemble.kill("zookeeper")
    log = tmp_path / "w.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers",
                                   stack.kafka_bootstrap, "--cluster", unique, "--worker-id", "w-default", "--rest-port", "0"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    zk = KazooClient(hosts=ensemble.hosts, timeout=10)
    try:
        zk.start(timeout=20)
        wait_until(lambda: zk.exists(f"/eosink/{unique}/workers/w-default") is not None, 60,
                   f"w-default registered (log {log})")
        assert ensemble.hosts in log.read_text(), "the worker did not log the ensemble's connect string"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        zk.stop()
        zk.close()
        ensemble.restart("zookeeper")


def test_the_demo_runs_on_the_ensemble_listed_in_endpoints_with_its_first_node_down(ensemble, stack):
    """``eosink demo`` as a user runs it against a stack started with ``--zookeeper-nodes 3``: its worker, its
    CLI calls and its checks all take the multi-host connect string of endpoints.json; node 1 is down."""
    env = {k: v for k, v in os.environ.items() if k != "EOSINK_ZOOKEEPER"} | {"EOSINK_HOME": str(ensemble.home)}
    ensemble.kill("zookeeper")
    try:
        run = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "demo"], env=env, capture_output=True,
                             text=True, timeout=600)
    finally:
        ensemble.restart("zookeeper")
    assert run.returncode == 0 and "RESULT: OK - exactly once" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=ensemble.hosts, timeout=10)
    zk.start(timeout=20)
    try:  # the demo's cluster lives on the ensemble, not on the shared stack's ZooKeeper
        assert zk.exists("/eosink/default/connectors") and zk.get_children("/eosink/default/connectors"), \
            "the demo's connector is not on the ensemble"
    finally:
        zk.stop()
        zk.close()


def test_zookeeper_leader_sigkill_under_load_delivers_every_record_once(ensemble, rigs, stack, unique, tmp_path):
    rig = _three_workers(ensemble, rigs, stack, unique, tmp_path)
    publisher = Publisher(stack.kafka_bootstrap, rig.topic)
    killed: list[str] = []

    def fault() -> float:
        leader = ensemble.leader()
        killed.append(leader)
        ensemble.kill(leader)
        _watch(rig, 8)
        ensemble.restart(leader)
        return time.monotonic()

    figures = _drive(rig, publisher, fault, "zookeeper leader kill -9 + restart (3 nodes)", ("zookeeper",))
    print(f"killed the leader {killed}; modes after: {ensemble.modes()}")
    assert all(code is None for code in figures["worker_exit"].values()), "a worker died with the ZooKeeper leader"


def test_worker_cut_off_from_zookeeper_majority_stops_committing_and_its_partitions_move(
        ensemble, rigs, stack, unique, tmp_path):
    """w1 reaches each ZooKeeper node through its own proxy, Kafka and PostgreSQL directly. All three links
    are blackholed (the node on w1's side of such a partition has no quorum and serves no client), so w1
    keeps Kafka and PostgreSQL but loses the majority: no commit from it after its session timeout."""
    proxies = [TcpProxy(("127.0.0.1", ensemble.base + i)) for i in range(3)]
    try:
        rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=ensemble.hosts, postgres_dsn=stack.postgres_dsn,
                   tmp=tmp_path, name=unique)
        cut = rig.start("w1", zookeeper=",".join(p.address for p in proxies))
        rig.start("w2")
        rig.start("w3")
        rig.wait_running({"w1", "w2", "w3"})
        publisher = Publisher(stack.kafka_bootstrap, rig.topic)
        times: dict[str, float] = {}
        answers: list[tuple[int, str]] = []

        def fault() -> float:
            for p in proxies:
                p.sever()
            times["severed"] = time.time()
            rig.wait_running({"w2", "w3"}, timeout=60)  # every partition moved to the workers that reach the majority
            times["moved"] = time.time()
            # w1 hears nothing from the ensemble (no LOST while cut off): its own clock drops its partitions.
            wait_until(lambda: '"zookeeper_session_presumed_lost"' in cut.log_text(), 60,
                       "w1 to drop its partitions on its local timer", interval=0.2)
            times["dropped"] = time.time()
            answers.append(_http_error(f"{cut.url}/connectors/{rig.connector}/status"))
            _watch(rig, 2)
            assert cut.proc.poll() is None, "w1 died cut off from ZooKeeper"
            times["healed"] = time.time()
            for p in proxies:
                p.heal()
            rig.wait_running({"w1", "w2", "w3"}, timeout=60)
            return time.monotonic()

        figures = _drive(rig, publisher, fault, "one worker cut off from the zookeeper majority", ("zookeeper", "SUSPENDED"))
        assert figures["worker_exit"]["w2"] is None and figures["worker_exit"]["w3"] is None
        late = [t for t in _commit_times(cut.log_text()) if times["severed"] + SESSION < t < times["healed"]]
        assert not late, f"w1 committed {len(late)} cycles cut off from the ZooKeeper majority, after its session timeout"
        code, body = answers[0]
        assert code == 503 and f"not connected to {','.join(p.address for p in proxies)}" in body, (code, body)
        lost = [line for line in cut.log_text().splitlines() if '"state": "LOST"' in line]
        assert lost, "w1's session did not expire in the ensemble while it was cut off (LOST, heard once the link is back)"
        print(f"CUT-FIGURES w1 cut {times['healed'] - times['severed']:.1f}s; partitions moved "
              f"{times['moved'] - times['severed']:.1f}s and w1 dropped its own {times['dropped'] - times['severed']:.1f}s "
              "after the cut")
    finally:
        for p in proxies:
            p.close()


def test_zookeeper_quorum_lost_every_worker_stops_committing_and_resumes_when_quorum_returns(
        ensemble, rigs, stack, unique, tmp_path):
    rig = _three_workers(ensemble, rigs, stack, unique, tmp_path)
    publisher = Publisher(stack.kafka_bootstrap, rig.topic)
    times: dict[str, float] = {}
    frozen: list[int] = []

    def fault() -> float:
        down = [n for n in NODES if n != ensemble.leader()]  # both followers: the leader is left without a majority
        for name in down:
            ensemble.kill(name)
        times["lost"] = time.time()
        _watch(rig, SESSION + 2)
        frozen.append(rig.rows())
        _watch(rig, 6)
        frozen.append(rig.rows())
        times["returned"] = time.time()
        for name in down:
            ensemble.restart(name)
        return time.monotonic()

    figures = _drive(rig, publisher, fault, "zookeeper quorum lost (2 of 3 nodes kill -9) + restarted", ("zookeeper",))
    assert frozen[0] == frozen[1], f"the sink grew from {frozen[0]} to {frozen[1]} rows without a ZooKeeper quorum"
    for wid, w in rig.workers.items():
        late = [t for t in _commit_times(w.log_text()) if times["lost"] + SESSION < t < times["returned"]]
        assert not late, f"{wid} committed {len(late)} cycles without a ZooKeeper quorum"
    assert all(code is None for code in figures["worker_exit"].values()), "a worker died while ZooKeeper had no quorum"
