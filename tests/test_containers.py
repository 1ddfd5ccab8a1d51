"""The images, built and run for real (podman here, docker where an engine answers).

``make images`` builds ``eosink-worker`` and ``eosink-spark``; these tests build them the same way
(the layer cache makes that quick when nothing changed, and the images hold the code under test),
then run them against the local stack on the host network:

* three worker containers, configured by compose.yaml's worker environment, deliver the demo's
  fan-out connector exactly once while one is SIGKILLed and restarted and another is stopped;
* the Spark image publishes the orders job exactly once, also when run again with the same run id;
* bad input: no engine at all, or a wrong ZooKeeper or Kafka address, fails loudly, naming it.

Every container is named ``eosink-...`` and removed by id afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from eosink.worker.stack import container_demo as cd
from eosink.worker.stack import images
from tests.procs import REPO

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def engine() -> images.Engine:
    return images.find_engine()


def _ref(engine: images.Engine, tag: str) -> str:
    return ("localhost/" if engine.name == "podman" else "") + tag


@pytest.fixture(scope="module")
def built(engine) -> dict[str, images.Built]:
    """Both images, built from this checkout (cached layers make a rebuild of unchanged code take seconds)."""
    return images.build(list(images.IMAGES), report=lambda m: print(m, file=sys.stderr))


@pytest.fixture
def containers(engine, built, stack, unique, tmp_path):
    """Worker containers for this test's own cluster, removed by id afterwards."""
    home = cd.shared_home(tmp_path / "eosink-home")
    cluster = cd.WorkerContainers(engine, _ref(engine, built["worker"]["tag"]), cd.worker_env(stack, unique), home)
    yield cluster
    cluster.remove()


def test_images_build_without_podman_or_docker_names_what_to_install(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "EOSINK_CONTAINER_ENGINE"} | {"PATH": str(empty)}
    r = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "images", "build"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "no container engine" in r.stderr and "apt-get install -y podman runc mmdebstrap" in r.stderr and "Docker" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_worker_image_runs_non_root_without_pyspark_or_a_compiler(engine, built):
    image = _ref(engine, built["worker"]["tag"])
    probe = ("import importlib.util as u, os, shutil; "
             "print(os.getuid(), u.find_spec('pyspark') is None, [c for c in ('gcc', 'cc', 'g++') if shutil.which(c)], "
             "all(u.find_spec(m) for m in ('eosink.connectors.iceberg', 'eosink.connectors.s3', 'boto3', 'pyiceberg')))")
    out = subprocess.run(engine.cmd("run", "--rm", *engine.run_flags, "--entrypoint", "python", image, "-c", probe),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(" ", 1) == [str(cd.IMAGE_UID), "True [] True\n"], out.stdout


def test_three_worker_containers_deliver_the_fanout_demo_exactly_once_through_kill_and_stop(stack, unique, make_topic, containers):
    import boto3

    from eosink.worker.stack.demo import _empty

    names = cd.Names(cluster=unique, connector=unique.replace("_", "-"), topic=make_topic(4), table=unique,
                     lake_bucket=f"{unique.replace('_', '-')}-lake", lake_table=f"demo.{unique}",
                     archive_bucket=f"{unique.replace('_', '-')}-archive")
    s3 = boto3.client("s3", **stack.s3)
    for bucket in (names.lake_bucket, names.archive_bucket):
        _empty(s3, bucket, "", create=True)
    try:
        report = cd.run(stack, names, containers, txns=24, per_txn=300, say=lambda m: print(m, file=sys.stderr))
    except Exception:
        for w in ("worker-1", "worker-2", "worker-3"):
            print(f"--- {w} ---\n{containers.logs(w)[-3000:]}", file=sys.stderr)
        raise
    n = report["published"]["committed"]
    assert n == 23 * 300 and report["published"]["aborted"] == 300
    assert f"created connector {names.connector}" in report["register_output"]
    assert report["owners_before_kill"] == ["worker-1", "worker-2", "worker-3"], "tasks.max=3: every worker delivers"
    assert report["killed_exit_code"] == 137
    assert report["stopped_exit_code"] == 0, containers.logs("worker-2")[-3000:]
    assert report["handover_seconds"] < 15, report
    assert report["final_exit_codes"] == {"worker-1": 0, "worker-3": 0}
    assert all(report["healthy_at_start"].values()) and all(report["healthy_at_end"].values()), report
    assert set(report["uids"].values()) == {cd.IMAGE_UID}, "the worker process runs as the image's non-root user"
    for sink, counts in report["sinks"].items():
        assert counts["rows"] == counts["distinct"] == n, (sink, counts)
        assert counts["missing"] == 0 and counts["from_aborted"] == 0, (sink, counts)
    assert report["sinks"]["postgres"]["prepared_left"] == 0, "no prepared transaction may be left behind"
    assert cd.exactly_once(report)
    assert '"worker_stopped"' in containers.logs("worker-2")


@pytest.mark.parametrize("service", ["zookeeper", "kafka"])
def test_worker_container_with_a_wrong_address_exits_non_zero_naming_it_and_is_not_healthy(containers, service):
    wrong = "127.0.0.1:1"
    key = {"zookeeper": "EOSINK_ZOOKEEPER", "kafka": "EOSINK_BOOTSTRAP_SERVERS"}[service]
    containers.start("worker-1", cd.free_port(), **{key: wrong, "EOSINK_STARTUP_TIMEOUT": "5"})
    deadline = time.monotonic() + 90
    healthy_while_running = []
    while containers.state("worker-1") == "running" and time.monotonic() < deadline:
        healthy_while_running.append(containers.healthy("worker-1"))
        time.sleep(1)
    assert containers.state("worker-1") == "exited", f"still running after 90 s with {key}={wrong}"
    assert containers.exit_code("worker-1") != 0
    logs = containers.logs("worker-1")
    assert wrong in logs and service in logs.lower(), logs[-2000:]
    assert not any(healthy_while_running), "the health check must never pass for a worker that cannot reach its cluster"
    assert not containers.healthy("worker-1")


def _read_committed(bootstrap: str, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eosink-check-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[bytes] = []
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 60
        while len(done) < len(parts) and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None or m.error():
                pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])}
                done |= {p for p in parts if pos.get(p, -1) >= ends[p]}
                continue
            out.append(m.value())
            if m.offset() + 1 >= ends[m.partition()]:
                done.add(m.partition())
        return out
    finally:
        c.close()


def test_spark_image_publishes_the_orders_job_exactly_once_also_when_run_again(engine, built, stack, unique, make_topic):
    import json

    topic = make_topic(4)
    svc = cd.compose()["services"]["spark-orders"]
    argv = [a.replace("kafka:9092", stack.kafka_bootstrap).replace("eosink-demo-orders", topic).replace("compose-demo-1", unique)
            for a in svc["command"]]
    argv[argv.index("--n") + 1] = "3000"
    image = _ref(engine, built["spark"]["tag"])
    started: list[str] = []
    try:
        for attempt in range(2):  # the same run id again: the ledger says it is done, nothing new is published
            name = f"eosink-{unique}-spark-{attempt}"
            started.append(name)
            r = subprocess.run(engine.cmd("run", "--name", name, "--network", "host", *engine.run_flags, image, *argv),
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    finally:
        for name in started:
            subprocess.run(engine.cmd("rm", "-f", name), capture_output=True)
    ids = [json.loads(v)["order_id"] for v in _read_committed(stack.kafka_bootstrap, topic)]
    assert len(ids) == len(set(ids)) == 3000
    assert set(ids) == {f"o-{i:08d}" for i in range(3000)}


def test_image_build_reports_sizes_and_times(built):
    for key, r in built.items():
        assert r["size_bytes"] > 50e6 and r["build_seconds"] >= 0, (key, r)
    assert built["worker"]["size_bytes"] < built["spark"]["size_bytes"], "the worker image carries no Spark or JVM"
