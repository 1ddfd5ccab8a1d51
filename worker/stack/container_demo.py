"""``make container-demo``: the demo's fan-out connector delivered by three worker containers.

The images are what users deploy, so this is the deployment proven end to end: three containers
of ``eosink-worker`` on the host network, configured by exactly the environment
``docker/compose.yaml`` gives its workers (addresses and secrets pointed at the local stack),
sharing one ``/var/lib/eosink`` volume as compose's workers do. The connector is registered by
compose's ``register`` command in a one-shot container, through worker-1's REST API. While
orders are published (and one transaction aborted), one worker is killed with SIGKILL and
started again, another is stopped with SIGTERM (exit code 0, its partitions handed over), and
then every sink is counted by reading it back. ``tests/test_containers.py`` runs the same
scenario with names of its own.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eosink.connectors.api.errors import ConfigError, FatalError
from eosink.worker.stack.images import DOCKER, IMAGES, REPO, Engine, find_engine
from eosink.worker.stack.proc import free_port

COMPOSE = DOCKER / "compose.yaml"
CONFIG = REPO / "configs" / "demo-orders.json"
HOME_IN_IMAGE = "/var/lib/eosink"
IMAGE_UID = 10001


def compose() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the merge keys (<<) as Compose does


def worker_env(ep: Any, cluster: str) -> dict[str, str]:
    """worker-1's environment from compose.yaml, its service addresses and secrets replaced by the local stack's.

    Only keys compose sets are replaced: a variable the demo config needs and compose forgets fails here.
    """
    from eosink.worker.stack.demo_access import for_stack

    env = {k: str(v) for k, v in compose()["services"]["worker-1"]["environment"].items()}
    local = {**for_stack(ep, REPO / ".eosink").connector_env,
             "EOSINK_BOOTSTRAP_SERVERS": ep.kafka_bootstrap, "EOSINK_ZOOKEEPER": ep.zookeeper_hosts,
             "EOSINK_CLUSTER": cluster, "AWS_ACCESS_KEY_ID": ep.s3["aws_access_key_id"],
             "AWS_SECRET_ACCESS_KEY": ep.s3["aws_secret_access_key"]}
    missing = sorted(set(local) - set(env))
    if missing:
        raise ConfigError(f"docker/compose.yaml's worker environment lacks {', '.join(missing)}", key="x-worker-env")
    env.update(local)
    if env.get("EOSINK_HOME") != HOME_IN_IMAGE:
        raise ConfigError(f"docker/compose.yaml sets EOSINK_HOME={env.get('EOSINK_HOME')!r}; the worker volume is "
                          f"mounted at {HOME_IN_IMAGE}", key="EOSINK_HOME")
    return env


@dataclass
class Names:
    """What the scenario creates; the demo uses configs/demo-orders.json's own, tests unique ones."""

    cluster: str
    connector: str = "demo-orders"
    topic: str = "eosink-demo-orders"
    table: str = "demo_orders"
    lake_bucket: str = "eosink-demo-lake"
    lake_table: str = "demo.orders"
    archive_bucket: str = "eosink-demo-archive"

    def config(self, tasks_max: int) -> dict[str, Any]:
        """configs/demo-orders.json with these names and ``tasks.max`` (three workers share the connector)."""
        doc = json.loads(CONFIG.read_text())
        c = dict(doc["config"])
        c.update({"topics": self.topic, "sinks.db.table.name.format": self.table,
                  "sinks.lake.iceberg.warehouse": f"s3://{self.lake_bucket}/warehouse", "sinks.lake.iceberg.table": self.lake_table,
                  "sinks.archive.s3.bucket.name": self.archive_bucket, "tasks.max": str(tasks_max)})
        return {"name": self.connector, "config": c}


@dataclass
class WorkerContainers:
    """Worker containers named ``eosink-<cluster>-<worker>``; :meth:`remove` deletes exactly the ones started here."""

    engine: Engine
    image: str
    env: dict[str, str]
    home: Path
    ports: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def name(self, worker: str) -> str:
        return f"eosink-{self.env['EOSINK_CLUSTER']}-{worker}"

    def url(self, worker: str) -> str:
        return f"http://127.0.0.1:{self.ports[worker]}"

    def start(self, worker: str, port: int, **overrides: str) -> str:
        self.ports[worker] = port
        env = {**self.env, "EOSINK_WORKER_ID": worker, "EOSINK_REST_PORT": str(port),
               "EOSINK_REST_ADVERTISED_URL": f"http://127.0.0.1:{port}", **overrides}
        argv = self.engine.cmd("run", "-d", "--name", self.name(worker), "--network", "host", *self.engine.run_flags,
                               "-v", f"{self.home}:{HOME_IN_IMAGE}")
        for k, v in env.items():
            argv += ["-e", f"{k}={v}"]
        cid = _out(argv + [self.image]).strip()
        self.started.append(cid)
        return cid

    def ready(self, worker: str) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url(worker)}/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, worker: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready(worker):
                return
            if self.state(worker) == "exited":
                raise FatalError(f"{self.name(worker)} exited: {self.logs(worker)[-2000:]}", component="container-demo")
            time.sleep(0.5)
        raise FatalError(f"{self.name(worker)} not ready within {timeout:.0f} s: {self.logs(worker)[-2000:]}", component="container-demo")

    def state(self, worker: str) -> str:
        """The container's state: ``running``, ``exited``, ...

        Podman reads ``stopped`` for a moment between a container's process ending and its cleanup
        (exit code, mounts) being done, then ``exited``: that moment is waited out (up to 10 s), so a
        container that has ended reads ``exited``, as docker reports it."""
        deadline = time.monotonic() + 10
        while True:
            state = _out(self.engine.cmd("inspect", "--format", "{{.State.Status}}", self.name(worker))).strip()
            if state != "stopped" or time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def exit_code(self, worker: str) -> int:
        return int(_out(self.engine.cmd("inspect", "--format", "{{.State.ExitCode}}", self.name(worker))).strip())

    def healthy(self, worker: str) -> bool:
        """The image's HEALTHCHECK, run now (podman runs it on demand; docker reports its last result)."""
        if self.engine.name == "podman":
            r = subprocess.run(self.engine.cmd("healthcheck", "run", self.name(worker)), capture_output=True, text=True, check=False)
            return r.returncode == 0
        status = _out(self.engine.cmd("inspect", "--format", "{{.State.Health.Status}}", self.name(worker))).strip()
        return status == "healthy"

    def uid(self, worker: str) -> int:
        """The real uid of the container's main process (PID 1 in its PID namespace)."""
        status = _out(self.engine.cmd("exec", self.name(worker), "cat", "/proc/1/status"))
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))

    def kill(self, worker: str) -> None:
        _out(self.engine.cmd("kill", "--signal", "KILL", self.name(worker)))

    def restart(self, worker: str) -> None:
        _out(self.engine.cmd("start", self.name(worker)))

    def stop(self, worker: str, grace_s: int = 30) -> int:
        _out(self.engine.cmd("stop", "-t", str(grace_s), self.name(worker)))
        return self.exit_code(worker)

    def logs(self, worker: str) -> str:
        r = subprocess.run(self.engine.cmd("logs", self.name(worker)), capture_output=True, text=True, check=False)
        return r.stdout + r.stderr

    def register(self, config: dict[str, Any]) -> str:
        """compose's ``register`` service: its entrypoint and command, in a one-shot container, against worker-1."""
        svc = compose()["services"]["register"]
        with tempfile.TemporaryDirectory(prefix="eosink-configs-") as d:
            (Path(d) / f"{config['name']}.json").write_text(json.dumps(config))
            Path(d).chmod(0o755)
            argv = [a.replace("http://worker-1:8083", self.url("worker-1")) for a in svc["command"]]
            return _out(self.engine.cmd("run", "--rm", "--network", "host", *self.engine.run_flags, "-v", f"{d}:/configs:ro",
                                        "--entrypoint", svc["entrypoint"][0], self.image, *argv))

    def remove(self) -> None:
        for cid in self.started:
            subprocess.run(self.engine.cmd("rm", "-f", "-t", "0", cid), capture_output=True, check=False)


def _out(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise FatalError(f"`{' '.join(argv[:6])} ...` failed ({r.returncode}): {r.stderr.strip()[-1500:]}", component="container-demo")
    return r.stdout


def shared_home(root: Path) -> Path:
    """The volume every worker mounts at /var/lib/eosink, writable by the image's user."""
    import os

    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, IMAGE_UID, IMAGE_UID)
    return root


def publish_orders(bootstrap: str, topic: str, partitions: int, txns: int, per_txn: int, pause_s: float,
                   aborted_at: int) -> tuple[set[str], set[str]]:
    """Orders in ``txns`` transactions (the ``aborted_at``-th aborted), shaped like the demo's: committed and aborted ids."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"eosink-container-demo-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    committed: set[str] = set()
    aborted: set[str] = set()
    for t in range(txns):
        p.begin_transaction()
        ids = [f"aborted-{t}-{i}" if t == aborted_at else f"o-{t:04d}-{i:05d}" for i in range(per_txn)]
        for n, oid in enumerate(ids):
            p.produce(topic, key=oid, value=json.dumps({"order_id": oid, "customer": f"c-{n % 97}", "amount": n % 1000 / 10}),
                      partition=n % partitions)
        if t == aborted_at:
            p.flush(30)
            p.abort_transaction(30)
            aborted.update(ids)
        else:
            p.commit_transaction(30)
            committed.update(ids)
        time.sleep(pause_s)
    return committed, aborted


class Publisher(threading.Thread):
    """:func:`publish_orders` in the background, so workers die mid-delivery."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.kw = kw
        self.result: tuple[set[str], set[str]] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = publish_orders(**self.kw)
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller through .error
            self.error = e


def count_sinks(ep: Any, names: Names, home: Path, committed: set[str]) -> dict[str, dict[str, int]]:
    """Each sink read back by itself: rows, distinct ids, ids from the aborted transaction, committed ids missing."""
    import boto3
    import psycopg

    from eosink.connectors.postgres.book import prepared_manifests
    from eosink.worker.stack.demo import _lake_catalog
    from eosink.worker.stack.demo_access import for_stack

    def summary(ids: list[str]) -> dict[str, int]:
        return {"rows": len(ids), "distinct": len(set(ids)), "from_aborted": sum(1 for i in ids if i.startswith("aborted-")),
                "missing": len(committed - set(ids))}

    with psycopg.connect(ep.postgres_dsn, autocommit=True) as conn:
        pg_ids = [r[0] for r in conn.execute(f'SELECT order_id FROM "{names.table}"')]
        prepared = sum(1 for _gid, connector, _m in prepared_manifests(conn) if connector == names.connector)
    lake = _lake_catalog(for_stack(ep, home)).load_table(names.lake_table).scan(selected_fields=("order_id",)).to_arrow()
    s3 = boto3.client("s3", **ep.s3)
    archive: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=names.archive_bucket, Prefix=f"{names.connector}/"):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=names.archive_bucket, Key=obj["Key"])["Body"].read()
            archive += [json.loads(line)["order_id"] for line in body.splitlines() if line]
    files: list[str] = []
    for f in sorted((home / "demo-out" / names.connector / "committed").glob("*.jsonl")):
        files += [json.loads(line)["value"]["order_id"] for line in f.read_text().splitlines() if line]  # the record under "value"
    return {"postgres": {**summary(pg_ids), "prepared_left": prepared}, "iceberg": summary(lake.column("order_id").to_pylist()),
            "s3_archive": summary(archive), "files": summary(files)}


def _pg_distinct(dsn: str, table: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:  # type: ignore[index]
            return 0
        return int(conn.execute(f'SELECT count(DISTINCT order_id) FROM "{table}"').fetchone()[0])  # type: ignore[index]


def _owners(url: str, connector: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/connectors/{connector}/status", timeout=5) as r:
        return {t["worker_id"] for t in json.loads(r.read())["tasks"]}


def _wait(predicate: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if predicate():
                return time.monotonic() - t0
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise FatalError(f"timed out after {timeout:.0f} s waiting for {what}", component="container-demo")


def run(ep: Any, names: Names, cluster: WorkerContainers, *, txns: int = 30, per_txn: int = 400,
        say: Any = print) -> dict[str, Any]:
    """The scenario (see the module docstring); returns what happened and what each sink holds."""
    report: dict[str, Any] = {}
    workers = ("worker-1", "worker-2", "worker-3")
    say(f"starting {', '.join(cluster.name(w) for w in workers)} ({cluster.image}, host network)")
    for w in workers:
        cluster.start(w, free_port())
    for w in workers:
        cluster.wait_ready(w)
    report["healthy_at_start"] = {w: cluster.healthy(w) for w in workers}
    report["uids"] = {w: cluster.uid(w) for w in workers}
    say(f"registering {names.connector} with compose's register command through {cluster.url('worker-1')}")
    report["register_output"] = cluster.register(names.config(tasks_max=len(workers)))
    say(f"publishing {txns} transactions of {per_txn} orders (one aborted) while workers die")
    publisher = Publisher(bootstrap=ep.kafka_bootstrap, topic=names.topic, partitions=4, txns=txns, per_txn=per_txn,
                          pause_s=0.3, aborted_at=txns // 3)
    publisher.start()
    _wait(lambda: _pg_distinct(ep.postgres_dsn, names.table) >= 2 * per_txn, 120, "delivery to start")
    report["owners_before_kill"] = sorted(_owners(cluster.url("worker-1"), names.connector))
    say("podman kill --signal KILL worker-3, then start it again")
    cluster.kill("worker-3")
    report["killed_exit_code"] = cluster.exit_code("worker-3")
    cluster.restart("worker-3")
    cluster.wait_ready("worker-3")
    say("stopping worker-2 (SIGTERM)")
    t0 = time.monotonic()
    report["stopped_exit_code"] = cluster.stop("worker-2")
    report["stop_seconds"] = round(time.monotonic() - t0, 1)
    report["handover_seconds"] = round(report["stop_seconds"] + _wait(
        lambda: "worker-2" not in _owners(cluster.url("worker-1"), names.connector), 60, "worker-2's partitions to move"), 1)
    publisher.join(300)
    if publisher.error or publisher.result is None:
        raise FatalError(f"publishing failed: {publisher.error!r}", component="container-demo")
    committed, aborted = publisher.result
    report["published"] = {"committed": len(committed), "aborted": len(aborted)}
    say("waiting until everything is delivered")
    report["delivery_wait_seconds"] = round(_wait(lambda: _pg_distinct(ep.postgres_dsn, names.table) >= len(committed), 240,
                                                  f"{len(committed)} orders in {names.table}"), 1)
    time.sleep(3)  # three more commit intervals: a duplicate would show now
    report["healthy_at_end"] = {w: cluster.healthy(w) for w in ("worker-1", "worker-3")}
    report["sinks"] = count_sinks(ep, names, cluster.home, committed)
    report["final_exit_codes"] = {w: cluster.stop(w) for w in ("worker-1", "worker-3")}
    return report


def exactly_once(report: dict[str, Any]) -> bool:
    n = report["published"]["committed"]
    return (all(s["rows"] == s["distinct"] == n and s["from_aborted"] == 0 and s["missing"] == 0 for s in report["sinks"].values())
            and report["sinks"]["postgres"]["prepared_left"] == 0 and report["stopped_exit_code"] == 0
            and set(report["final_exit_codes"].values()) == {0} and all(report["healthy_at_start"].values())
            and all(report["healthy_at_end"].values()) and IMAGE_UID in report["uids"].values()
            and set(report["uids"].values()) == {IMAGE_UID})


def main(argv: list[str] | None = None) -> int:
    import shutil

    from eosink.worker.stack import load_endpoints
    from eosink.worker.stack.demo import _reset
    from eosink.worker.stack.demo_access import for_stack
    from eosink.worker.version import VERSION

    ep = load_endpoints()
    engine = find_engine()
    names = Names(cluster=f"container-demo-{uuid.uuid4().hex[:6]}")
    home = REPO / ".eosink" / "container-demo"
    shutil.rmtree(home, ignore_errors=True)
    shared_home(home)
    print(f"==> resetting the demo's topic, table, lake table, buckets and connector state (home {home})")
    _reset(ep, for_stack(ep, home), home, 4)
    image = IMAGES["worker"].tag(VERSION)
    cluster = WorkerContainers(engine, ("localhost/" if engine.name == "podman" else "") + image, worker_env(ep, names.cluster), home)
    try:
        report = run(ep, names, cluster, say=lambda m: print(f"==> {m}", flush=True))
    finally:
        cluster.remove()
    sinks = report.pop("sinks")
    for k, v in report.items():
        print(f"  {k:24}: {v}")
    for sink, c in sinks.items():
        print(f"  {sink:24}: {c}")
    ok = exactly_once({**report, "sinks": sinks})
    print("RESULT:", "OK - exactly once, through SIGKILL and SIGTERM" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
