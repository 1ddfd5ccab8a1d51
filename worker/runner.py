"""A worker process: a ZooKeeper session, the connectors it runs, one task thread per connector.

Partition ownership comes from :mod:`worker.assignment`; every grant bumps the partition's
epoch in the decision log, so an older owner can never decide again.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from connectors.errors import ConfigError, EosinkError
from connectors.records import TopicPartition
from worker.config import ConnectorConfig, parse_connector
from worker.decision import ZooKeeperDecisionLog
from worker.logging import get_logger, run_in_context
from worker.source import KafkaSource
from worker.task import SinkTask, TaskSettings
from worker.zk import ZkSession

log = get_logger("worker.runner")


@dataclass
class WorkerOptions:
    bootstrap: str
    zookeeper: str
    cluster: str = "default"
    worker_id: str = ""
    session_timeout_s: float = 10.0
    http_port: int | None = None
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}"


class ConnectorStore:
    """Connector configs and target states in ZooKeeper (``/eosink/<cluster>/connectors/<name>``)."""

    def __init__(self, session: ZkSession) -> None:
        self.zk = session.client
        self.root = f"{session.root}/connectors"

    def put(self, name: str, config: dict) -> bool:
        """Create or update; returns True when created."""
        from kazoo.exceptions import NodeExistsError

        data = json.dumps(config, sort_keys=True).encode()
        path = f"{self.root}/{name}/config"
        try:
            self.zk.create(path, data, makepath=True)
            self.zk.create(f"{self.root}/{name}/target-state", b"RUNNING", makepath=True)
            return True
        except NodeExistsError:
            self.zk.set(path, data)
            return False

    def get(self, name: str) -> dict | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.zk.get(f"{self.root}/{name}/config")
        except NoNodeError:
            return None
        return json.loads(data)

    def names(self) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(self.zk.get_children(self.root))
        except NoNodeError:
            return []

    def target_state(self, name: str) -> str:
        from kazoo.exceptions import NoNodeError

        try:
            return self.zk.get(f"{self.root}/{name}/target-state")[0].decode() or "RUNNING"
        except NoNodeError:
            return "RUNNING"

    def delete(self, name: str) -> bool:
        from kazoo.exceptions import NoNodeError

        try:
            self.zk.delete(f"{self.root}/{name}", recursive=True)
            return True
        except NoNodeError:
            return False


@dataclass
class _Running:
    config: ConnectorConfig
    task: SinkTask
    thread: threading.Thread
    stop: threading.Event


class Worker:
    """Runs every RUNNING connector found in ZooKeeper, over the partitions assigned to it."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.session = ZkSession(options.zookeeper, options.cluster, options.session_timeout_s)
        self.running: dict[str, _Running] = {}
        self._admin = None
        self._leader_node: str | None = None

    def _partitions(self, topics: list[str]) -> set[TopicPartition]:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.options.bootstrap})
        md = self._admin.list_topics(timeout=10)
        out: set[TopicPartition] = set()
        for t in topics:
            tmd = md.topics.get(t)
            if tmd is None or tmd.error is not None:
                continue
            out |= {TopicPartition(t, p) for p in tmd.partitions}
        return out

    def _start(self, cfg: ConnectorConfig) -> _Running:
        s = cfg.settings
        source = KafkaSource(
            cfg.name, self.options.bootstrap, value_converter=cfg.value_converter, reset=s["consumer.auto.offset.reset"],
            overrides={k[len("consumer.override."):]: v for k, v in cfg.raw.items() if k.startswith("consumer.override.")},
        )
        settings = TaskSettings(
            commit_interval_s=s["commit.interval.ms"] / 1000, max_records=s["batch.max.records"], max_bytes=s["batch.max.bytes"]
        )
        task = SinkTask(cfg.name, self.options.worker_id, cfg.create_sinks(), source,
                        ZooKeeperDecisionLog(self.session, self.options.worker_id), settings)
        task.open()
        stop = threading.Event()
        thread = run_in_context(task.run, stop, name=f"task-{cfg.name}", daemon=False)
        log.info("connector_started", connector=cfg.name, topics=cfg.topics)
        return _Running(cfg, task, thread, stop)

    def _stop(self, name: str) -> None:
        r = self.running.pop(name)
        r.stop.set()
        r.thread.join()
        r.task.close()
        log.info("connector_stopped", connector=name)

    # -- membership ---------------------------------------------------------------------------
    def _register(self) -> None:
        """(Re-)create this worker's ephemeral znodes; after a LOST session they are gone."""
        from kazoo.exceptions import NodeExistsError

        zk, root = self.session.client, self.session.root
        me = f"{root}/workers/{self.options.worker_id}"
        if not zk.exists(me):
            try:
                zk.create(me, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}).encode(),
                          ephemeral=True, makepath=True)
            except NodeExistsError:
                pass
            self._leader_node = None
        if self._leader_node is None or not zk.exists(self._leader_node):
            self._leader_node = zk.create(f"{root}/leader/n_", self.options.worker_id.encode(), ephemeral=True, sequence=True,
                                          makepath=True)

    def _is_leader(self) -> bool:
        children = sorted(self.session.client.get_children(f"{self.session.root}/leader"))
        return bool(children) and self._leader_node is not None and self._leader_node.endswith(children[0])

    def _lead(self, wanted: dict[str, ConnectorConfig]) -> None:
        """Leader only: compute the assignment of every RUNNING connector and publish it."""
        from kazoo.exceptions import NoNodeError, NodeExistsError

        from worker.assignment import assign, from_json, to_json

        zk, root = self.session.client, self.session.root
        workers = zk.get_children(f"{root}/workers")
        zk.ensure_path(f"{root}/assignments")
        previous = {}
        for w in zk.get_children(f"{root}/assignments"):
            try:
                previous[w] = from_json(json.loads(zk.get(f"{root}/assignments/{w}")[0]))
            except (NoNodeError, ValueError):
                continue
        partitions = {name: sorted(self._partitions(cfg.topics)) for name, cfg in wanted.items()}
        result = assign(partitions, {n: c.settings["tasks.max"] for n, c in wanted.items()}, workers, previous)
        for w, conns in result.items():
            doc = json.dumps(to_json(conns), sort_keys=True).encode()
            path = f"{root}/assignments/{w}"
            if previous.get(w) == conns and zk.exists(path):
                continue
            try:
                zk.create(path, doc)
            except NodeExistsError:
                zk.set(path, doc)
            log.info("assignment_published", worker=w, partitions={c: len(s) for c, s in conns.items()})
        for w in set(previous) - set(result):
            try:
                zk.delete(f"{root}/assignments/{w}")
            except NoNodeError:
                pass

    def _my_assignment(self) -> dict[str, set[TopicPartition]]:
        from kazoo.exceptions import NoNodeError

        from worker.assignment import from_json

        try:
            data, _ = self.session.client.get(f"{self.session.root}/assignments/{self.options.worker_id}")
        except NoNodeError:
            return {}
        return from_json(json.loads(data))

    def reconcile(self, store: ConnectorStore) -> None:
        """Bring running tasks in line with the configs, target states and this worker's assignment."""
        if self.session.session_probably_lost():
            for r in self.running.values():
                r.task.request_assignment(set())  # the partitions are someone else's by now
            return
        self._register()
        wanted: dict[str, ConnectorConfig] = {}
        for name in store.names():
            raw = store.get(name)
            if raw is None or store.target_state(name) != "RUNNING":
                continue
            try:
                wanted[name] = parse_connector(name, raw, source=f"zookeeper connector {name}")
            except ConfigError as exc:
                log.error("connector_config_invalid", connector=name, error=str(exc))
        if self._is_leader():
            self._lead(wanted)
        mine = self._my_assignment()
        for name in list(self.running):
            if name not in wanted or not mine.get(name) or wanted[name].raw != self.running[name].config.raw:
                self._stop(name)
        for name, cfg in wanted.items():
            if not mine.get(name):
                continue
            if name not in self.running:
                try:
                    self.running[name] = self._start(cfg)
                except EosinkError as exc:
                    log.error("connector_start_failed", connector=name, error=str(exc))
                    continue
            self.running[name].task.request_assignment(mine[name])

    def run(self, stop: threading.Event) -> None:
        self.session.start()
        self._register()
        log.info("worker_started", worker=self.options.worker_id, cluster=self.options.cluster)
        store = ConnectorStore(self.session)
        try:
            while not stop.is_set():
                try:
                    self.reconcile(store)
                except Exception as exc:  # noqa: BLE001 - ZooKeeper or Kafka briefly away: try again
                    log.warning("reconcile_failed", error=str(exc), error_class=type(exc).__name__)
                stop.wait(self.options.poll_interval_s)
        finally:
            for name in list(self.running):
                self._stop(name)  # finishes the cycle in flight, releases partitions at once
            self.session.stop()  # ephemeral znodes go now, not a session timeout later
            log.info("worker_stopped", worker=self.options.worker_id)
