"""The fault matrix: the infrastructure fails under load, and delivery stays exactly-once.

Each test breaks a PRIVATE server (a Kafka of three nodes or one, a PostgreSQL, a TCP link
through :class:`TcpProxy`), started with the stack's own code under the test's own home and
ports, while a transactional producer publishes the whole time (every 4th transaction aborted)
and three workers deliver the whole time into PostgreSQL and files. The end is counted from
the sinks: every committed id once, none from an aborted transaction, no prepared transaction
left. Each test prints a ``FAULT-FIGURES`` line (longest delivery stall, catch-up after the
fault ends, what ``/status`` and the log said), the numbers behind the fault matrix (docs/faults.md).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.faultkit import PrivateStack, Publisher, Rig, coordinator_partition
from tests.procs import PrivateMinio, TcpProxy, publish, wait_until

pytestmark = pytest.mark.faults


@pytest.fixture
def private(tmp_path, monkeypatch) -> Iterator[Callable[..., PrivateStack]]:
    """``private(brokers=3, postgres=True)``: private servers, stopped by the stack's ``down`` at the end."""
    made: list[PrivateStack] = []

    def make(**kw: Any) -> PrivateStack:
        s = PrivateStack(tmp_path / "home", monkeypatch, **kw)
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.stop()


def _rig(rigs: list[Rig], **kw: Any) -> Rig:
    r = Rig(**kw)
    rigs.append(r)
    return r


def _watch(rig: Rig, seconds: float) -> None:
    """Poll every worker's /status for ``seconds`` (what an operator sees during the fault)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rig.record_statuses()
        time.sleep(1.0)


def _traces(rig: Rig, since: float) -> list[str]:
    """The distinct task states and traces /status showed since ``since``."""
    seen: list[str] = []
    for t, wid, status in rig.statuses:
        if t < since:
            continue
        if not isinstance(status, dict):
            line = f"{wid}: /status unanswered ({status})"
        else:
            line = "; ".join(f"{wid}/task{task.get('id')}={task.get('state')}/{task.get('eosink_state')}"
                             + (f" trace={task['trace'].splitlines()[-1][:200]}" if task.get("trace") else "")
                             + (f" retrying={task['retrying'][:160]}" if task.get("retrying") else "")
                             for task in status.get("tasks", []))
        if line not in seen:
            seen.append(line)
    return seen


def _drive(rig: Rig, publisher: Publisher, fault: Callable[[], float], what: str, words: tuple[str, ...],
           after: float = 8.0, extra: tuple[set[str], set[str]] = (set(), set())) -> dict[str, Any]:
    """Publish and deliver, run ``fault`` (returns when the fault ended), then count the sinks."""
    rig.sample_forever()
    publisher.start()
    wait_until(lambda: rig.rows() >= 1500, 180, "the first 1500 rows before the fault", interval=0.5)
    started = time.monotonic()
    ended = fault()
    target = len(publisher.committed) + len(extra[0])
    time.sleep(after)  # publishing goes on after the fault
    publisher.stop()
    committed, aborted = publisher.committed | extra[0], publisher.aborted | extra[1]
    rig.wait_delivered(committed)
    rig.assert_exactly_once(committed, aborted)
    alive = {wid: w.proc.poll() for wid, w in rig.workers.items()}
    figures = {
        "fault": what, "records": len(committed), "aborted": len(aborted),
        "fault_s": round(ended - started, 1), "longest_stall_s": round(rig.stall(started, ended + 60), 1),
        "catch_up_after_fault_s": round(rig.catch_up(ended, target), 1),
        "publisher_errors": sorted({e.split(":", 2)[0] + ":" + e.split(":", 2)[1] for e in publisher.errors})[:5],
        "worker_exit": alive, "status": _traces(rig, started)[:12],
        "log": {wid: rig.log_lines(wid, *words)[:4] for wid in rig.workers},
    }
    print("FAULT-FIGURES " + json.dumps(figures))
    return figures


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[partition].leader


def _node_name(node_id: int) -> str:
    return "kafka" if node_id == 1 else f"kafka-{node_id}"


def _assert_replicated(bootstrap: str, topic: str) -> None:
    """What --kafka-brokers 3 promises: three brokers, RF 3 everywhere, two in sync for a write."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10)
    assert sorted(md.brokers) == [1, 2, 3]
    for name in (topic, "__transaction_state"):
        assert {len(p.replicas) for p in md.topics[name].partitions.values()} == {3}, f"{name} is not replicated 3 times"
    resource = ConfigResource(ResourceType.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["min.insync.replicas"].value == "2"


def test_leader_broker_then_transaction_coordinator_killed_on_three_brokers_delivers_exactly_once(
        private, rigs, stack, unique, tmp_path):
    kafka = private(brokers=3)
    bootstrap = kafka.endpoints().kafka_bootstrap
    rig = _rig(rigs, kafka=bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn, tmp=tmp_path,
               name=unique, replication=3)
    _assert_replicated(bootstrap, rig.topic)
    rig.start_three()
    rig.wait_running({"w1", "w2", "w3"})
    publisher = Publisher(bootstrap, rig.topic)

    def fault() -> float:
        leader = _node_name(_leader(bootstrap, rig.topic, 0))
        kafka.kill(leader)
        _watch(rig, 10)
        kafka.restart(leader)
        # The coordinator of the publisher's transactional id leads its __transaction_state
        # partition (confluent-kafka has no describe_transactions; the broker's hash is computed).
        partition = coordinator_partition(publisher.transactional_id, 3)
        node = _leader(bootstrap, "__transaction_state", partition)
        # The leader kill may have moved __transaction_state's leadership since the publisher last
        # initialised: the coordinator is the node whose log initialised its transactional id last.
        said = f"Initialized transactionalId {publisher.transactional_id}"
        last: dict[str, str] = {}
        for name in ("kafka", "kafka-2", "kafka-3"):
            lines = [ln for ln in kafka.component(name).log_path.read_text(errors="replace").splitlines() if said in ln]
            if lines:
                last[name] = lines[-1][:25]  # "[yyyy-mm-dd hh:mm:ss,mmm]" sorts in time order
        coordinator = max(last, key=last.__getitem__) if last else _node_name(node)
        wait_until(publisher.in_txn.is_set, 30, "the publisher inside a transaction", interval=0.01)
        kafka.kill(coordinator)
        _watch(rig, 10)
        kafka.restart(coordinator)
        print(f"killed leader {leader}, then coordinator {coordinator} (__transaction_state-{partition})")
        return time.monotonic()

    figures = _drive(rig, publisher, fault, "kafka leader + coordinator kill (3 brokers)", ("kafka", "broker", "Kafka"))
    assert all(code is None for code in figures["worker_exit"].values()), "a worker died with a broker"


def test_single_broker_restart_mid_delivery_delivers_exactly_once(private, rigs, stack, unique, tmp_path):
    kafka = private(brokers=1)
    bootstrap = kafka.endpoints().kafka_bootstrap
    rig = _rig(rigs, kafka=bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn, tmp=tmp_path,
               name=unique)
    rig.start_three()
    rig.wait_running({"w1", "w2", "w3"})
    publisher = Publisher(bootstrap, rig.topic)

    def fault() -> float:
        kafka.kill("kafka")
        _watch(rig, 8)
        kafka.restart("kafka")
        return time.monotonic()

    figures = _drive(rig, publisher, fault, "single kafka broker kill -9 + restart", ("kafka", "broker", "Kafka"))
    assert all(code is None for code in figures["worker_exit"].values()), "a worker died with the broker"


def test_postgres_immediate_stop_and_start_mid_delivery_resolves_prepared_transactions(
        private, rigs, stack, unique, tmp_path):
    pg = private(postgres=True)
    component = pg.component("postgres")
    rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=pg.endpoints().postgres_dsn,
               tmp=tmp_path, name=unique)
    rig.start_three()
    rig.wait_running({"w1", "w2", "w3"})
    publisher = Publisher(stack.kafka_bootstrap, rig.topic)
    prepared_at_stop: list[int] = []

    def fault() -> float:
        # Stop while a transaction is prepared, if one shows within 20 s (prepare to commit is short).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            count = int(rig.scalar("SELECT count(*) FROM pg_prepared_xacts"))
            if count:
                break
        prepared_at_stop.append(count)
        argv = [str(component._bindir() / "pg_ctl"), "-D", str(component.pgdata), "-m", "immediate", "-w", "stop"]
        assert component._run(argv) == 0, f"pg_ctl stop -m immediate failed; see {component.log_path}"
        _watch(rig, 8)
        pg.restart("postgres")
        return time.monotonic()

    figures = _drive(rig, publisher, fault, "postgres pg_ctl stop -m immediate + start", ("postgres", "5432", "connection"))
    print(f"prepared transactions when PostgreSQL stopped: {prepared_at_stop}")
    assert all(code is None for code in figures["worker_exit"].values()), "a worker died with PostgreSQL"


def test_s3_server_killed_and_restarted_mid_delivery_delivers_exactly_once(rigs, stack, unique, tmp_path):
    """A private MinIO (the ``lake`` sink beside PostgreSQL and files) SIGKILLed mid-delivery and
    started again on its data directory: uploads prepared before the kill are completed or aborted
    by the txn's outcome, nothing is lost, nothing twice, no multipart upload left open."""
    minio = PrivateMinio(tmp_path / "minio").start()
    try:
        rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
                   tmp=tmp_path, name=unique, s3=minio.endpoint())
        rig.start_three()
        rig.wait_running({"w1", "w2", "w3"})
        publisher = Publisher(stack.kafka_bootstrap, rig.topic)

        def fault() -> float:
            minio.kill()
            _watch(rig, 8)
            minio.start()
            return time.monotonic()

        figures = _drive(rig, publisher, fault, "S3 (MinIO) kill -9 + restart on its data directory",
                         ("s3", "S3", str(minio.port)))
        assert all(code is None for code in figures["worker_exit"].values()), "a worker died with S3"
    finally:
        minio.kill()


def test_worker_cut_off_from_postgres_between_prepare_and_commit_resolves_after_heal(
        private, rigs, stack, unique, tmp_path):
    pg = private(postgres=True)
    dsn = pg.endpoints().postgres_dsn
    proxy = TcpProxy(("127.0.0.1", pg.postgres_port))
    try:
        rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=dsn, tmp=tmp_path,
                   name=unique)
        # w1 reaches PostgreSQL only through the proxy, and pauses itself right after its 3rd prepare.
        cut = rig.start("w1", postgres_dsn=dsn.replace(f":{pg.postgres_port}/", f":{proxy.port}/"),
                        fault="after_prepare:3:stop")
        rig.start("w2")
        rig.start("w3")
        rig.wait_running({"w1", "w2", "w3"})
        publisher = Publisher(stack.kafka_bootstrap, rig.topic)

        cut_at: list[float] = []

        def fault() -> float:
            wait_until(lambda: "SIGSTOP to pid" in cut.log_text(), 120, "w1 to pause after a prepare", interval=0.05)
            proxy.sever()  # between its prepare and its commit; its ZooKeeper session is untouched
            cut_at.append(time.time())
            cut.signal(signal.SIGCONT)
            _watch(rig, 15)
            assert cut.proc.poll() is None, "w1 died cut off from PostgreSQL"
            cut_at.append(time.time())
            proxy.heal()
            return time.monotonic()

        figures = _drive(rig, publisher, fault, "one worker cut off from postgres after prepare", ("postgres", "connection"))
        assert figures["worker_exit"]["w2"] is None and figures["worker_exit"]["w3"] is None
        # The worker's commit of the prepared transaction waited for the link: no commit while cut off,
        # then its cycles went on once healed.
        after_pause = cut.log_text().split("SIGSTOP to pid", 1)[1]
        commits = [datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
                   for line in after_pause.splitlines() if '"cycle_committed"' in line]
        severed, healed = cut_at
        assert commits, "w1 committed nothing after the link was healed"
        assert not [t for t in commits if severed + 0.5 < t < healed], "w1 committed while cut off from PostgreSQL"
        print(f"CUT-FIGURES w1 cut {healed - severed:.1f}s; first commit {commits[0] - healed:.1f}s after the heal; "
              f"{len(commits)} commits after")
    finally:
        proxy.close()


def test_latency_on_every_link_slows_delivery_but_breaks_nothing(private, rigs, stack, unique, tmp_path, monkeypatch):
    from eosink.worker.stack.components.kafka_config import ADVERTISED_PORT_ENV

    kafka = PrivateStack(tmp_path / "home", monkeypatch, brokers=1)
    kafka_proxy = TcpProxy(("127.0.0.1", kafka.kafka_port))
    monkeypatch.setenv(ADVERTISED_PORT_ENV, str(kafka_proxy.port))  # clients reach the broker via the proxy only
    zk_host, zk_port = stack.zookeeper_hosts.split(",")[0].rsplit(":", 1)
    zk_proxy = TcpProxy((zk_host, int(zk_port)))
    pg_proxy = TcpProxy(("127.0.0.1", stack.postgres_port))
    proxies = (kafka_proxy, zk_proxy, pg_proxy)
    try:
        kafka.start()
        bootstrap = kafka.endpoints().kafka_bootstrap
        assert bootstrap == kafka_proxy.address
        rig = _rig(rigs, kafka=bootstrap, zookeeper=zk_proxy.address, postgres_dsn=stack.postgres_dsn, tmp=tmp_path,
                   name=unique)
        slow_dsn = stack.postgres_dsn.replace(f":{stack.postgres_port}/", f":{pg_proxy.port}/")
        for wid in ("w1", "w2", "w3"):
            rig.start(wid, postgres_dsn=slow_dsn)
        rig.wait_running({"w1", "w2", "w3"})
        publisher = Publisher(bootstrap, rig.topic, pause=0.3)
        rates: dict[str, float] = {}
        backlogs = 0

        def drain_rate() -> float:
            """Delivery rate of a 10k backlog published at once (on top of the steady producer).

            Timed from before the publish: over slow links the workers may drain the backlog while it
            is still being published, so a clock started after the publish can see nothing left to do.
            """
            nonlocal backlogs
            backlogs += 1
            t0, r0 = time.monotonic(), rig.rows()
            committed, aborted = publish(bootstrap, rig.topic, rig.partitions, txns=10, per_txn=1000, aborted_every=5,
                                         prefix=f"backlog{backlogs}")
            extra_committed.update(committed)
            extra_aborted.update(aborted)
            target = len(publisher.committed) + len(extra_committed)
            wait_until(lambda: rig.rows() >= target, 300, f"the backlog delivered ({target} rows)", interval=0.2)
            return (rig.rows() - r0) / (time.monotonic() - t0)

        def fault() -> float:
            rates["records_per_s_direct"] = round(drain_rate(), 1)
            for p in proxies:
                p.latency(0.025)  # 25 ms each way on every link: 50 ms round trips
            rates["records_per_s_latency_25ms"] = round(drain_rate(), 1)
            _watch(rig, 2)
            for p in proxies:
                p.latency(0.0)
            return time.monotonic()

        extra_committed: set[str] = set()
        extra_aborted: set[str] = set()
        figures = _drive(rig, publisher, fault, "25 ms latency on kafka+zookeeper+postgres links", ("timeout", "Timed"),
                         extra=(extra_committed, extra_aborted))
        print("LATENCY-RATES " + json.dumps(rates))
        assert all(code is None for code in figures["worker_exit"].values())
        assert rates["records_per_s_latency_25ms"] > 0, "nothing was delivered over the slow links"
    finally:
        for p in proxies:
            p.close()
        kafka.stop()


def test_soak_kill_random_worker_every_30s_for_2_minutes_delivers_exactly_once(rigs, stack, unique, tmp_path):
    from tests.faultkit import run_soak

    rig = _rig(rigs, kafka=stack.kafka_bootstrap, zookeeper=stack.zookeeper_hosts, postgres_dsn=stack.postgres_dsn,
               tmp=tmp_path, name=unique, files=False)
    curve = run_soak(rig, seconds=120, kill_every=30, rng=random.Random(7), sample_every=10, spare="w3")
    spared = [point["w3"] for point in curve if point["w3"]["rss_mib"] is not None]
    assert len({s["id"] for s in spared}) == 1 and len(spared) >= 10, "the spared worker was not sampled throughout"
    assert spared[-1]["fds"] <= spared[0]["fds"] + 10, f"the spared worker's open fds grew: {spared}"
