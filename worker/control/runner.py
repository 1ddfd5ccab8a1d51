"""A worker process: a ZooKeeper session, the connectors it runs, one task thread per connector.

Partition ownership comes from :mod:`eosink.worker.control.assignment`; every grant bumps the partition's
epoch in the decision log, so an older owner can never decide again.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from eosink.connectors.api.errors import ConfigError, EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.control.config import ConnectorConfig, parse_connector, secret_values
from eosink.worker.engine.decision import ZooKeeperDecisionLog
from eosink.worker.logging import get_logger, redact, register_secret, run_in_context
from eosink.worker.engine.source import KafkaSource
from eosink.worker.engine.task import SinkTask, TaskSettings
from eosink.worker.engine.zk import ZkSession

log = get_logger("eosink.worker.control.runner")


@dataclass
class WorkerOptions:
    bootstrap: str
    zookeeper: str
    cluster: str = "default"
    worker_id: str = ""
    session_timeout_s: float = 10.0
    http_port: int | None = None
    poll_interval_s: float = 1.0
    #: REST API (worker/rest): port 0 = no REST server.
    rest_host: str = "0.0.0.0"
    rest_port: int = 0
    rest_advertised_url: str = ""
    rest_auth: Any = None  # eosink.worker.control.rest.auth.RestAuth | None
    #: Kafka client settings passed through to every consumer, producer and admin client
    #: (``security.protocol``, ``sasl.*``, ``ssl.*``).
    kafka: dict[str, str] = field(default_factory=dict)

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

    def create(self, name: str, config: dict, state: str = "RUNNING") -> bool:
        """Create atomically (config and target state in one multi-op); False when the name exists."""
        self.zk.ensure_path(self.root)
        tx = self.zk.transaction()
        tx.create(f"{self.root}/{name}", b"")
        tx.create(f"{self.root}/{name}/config", json.dumps(config, sort_keys=True).encode())
        tx.create(f"{self.root}/{name}/target-state", state.encode())
        results = tx.commit()
        return not any(isinstance(r, Exception) for r in results)

    def set_target_state(self, name: str, state: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            self.zk.set(f"{self.root}/{name}/target-state", state.encode())
        except NoNodeError:
            self.zk.create(f"{self.root}/{name}/target-state", state.encode(), makepath=True)

    def request_restart(self, name: str, request: dict) -> None:
        """Ask the workers running ``name`` to restart their tasks: ``{"workers": [...] | null, "only_failed": bool}``.

        Every request bumps the znode's version; a worker restarts when it sees a newer version than
        the one it saw when it started the task."""
        from kazoo.exceptions import NoNodeError

        data = json.dumps({**request, "requested": time.time()}, sort_keys=True).encode()
        try:
            self.zk.set(f"{self.root}/{name}/restart", data)
        except NoNodeError:
            self.zk.create(f"{self.root}/{name}/restart", data, makepath=True)

    def restart_request(self, name: str) -> tuple[int, dict]:
        """``(version, request)``; ``(-1, {})`` when none was ever made."""
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.zk.get(f"{self.root}/{name}/restart")
        except NoNodeError:
            return -1, {}
        return stat.version, json.loads(data)


@dataclass
class _Running:
    config: ConnectorConfig
    task: SinkTask
    thread: threading.Thread
    stop: threading.Event
    restart_seen: int = -1


class Worker:
    """Runs every RUNNING connector found in ZooKeeper, over the partitions assigned to it."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.session = ZkSession(options.zookeeper, options.cluster, options.session_timeout_s)
        self.running: dict[str, _Running] = {}
        self._admin = None
        self._leader_node: str | None = None
        self._published: dict[str, bytes] = {}
        self._wake = threading.Event()
        self._published_shape: dict[str, bytes] = {}  # the status without lag/delivered: a change is written at once
        self._published_at: dict[str, float] = {}
        #: Connectors this worker should run but cannot (invalid here, or failed to start): reported FAILED.
        self.failures: dict[str, str] = {}
        self._last_invalid: dict[str, str] = {}
        self.rest: Any = None
        self.last_tick: float | None = None  # monotonic time of the last completed reconcile (liveness)
        self.registered = False  # this worker's znode exists in the current session (readiness)

    def _partitions(self, topics: list[str]) -> set[TopicPartition]:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.options.bootstrap, **self.options.kafka})
        md = self._admin.list_topics(timeout=10)
        out: set[TopicPartition] = set()
        for t in topics:
            tmd = md.topics.get(t)
            if tmd is None or tmd.error is not None:
                continue
            out |= {TopicPartition(t, p) for p in tmd.partitions}
        return out

    def _start(self, cfg: ConnectorConfig, store: ConnectorStore) -> _Running:
        s = cfg.settings
        tolerate = s["errors.tolerance"] == "all"
        restart_seen, _ = store.restart_request(cfg.name)  # requests made before this start are served by it
        source = KafkaSource(
            cfg.name, self.options.bootstrap, value_converter=cfg.value_converter, reset=s["consumer.auto.offset.reset"],
            overrides={**self.options.kafka,
                       **{k[len("consumer.override."):]: v for k, v in cfg.raw.items() if k.startswith("consumer.override.")}},
            tolerate=tolerate,
        )
        settings = TaskSettings(
            commit_interval_s=s["commit.interval.ms"] / 1000, max_records=s["batch.max.records"], max_bytes=s["batch.max.bytes"],
            backoff_max_s=s["errors.retry.delay.max.ms"] / 1000, retry_timeout_s=s["errors.retry.timeout"] / 1000,
            tolerate_errors=tolerate, log_errors=s["errors.log.enable"], log_error_messages=s["errors.log.include.messages"],
        )
        dead_letter = None
        if tolerate:
            from eosink.worker.engine.deadletter import DeadLetterSink

            dead_letter = DeadLetterSink(
                cfg.name, session=self.session, worker_id=self.options.worker_id, bootstrap=self.options.bootstrap,
                topic=s["errors.deadletterqueue.topic.name"], kafka=self.options.kafka,
                context_headers=s["errors.deadletterqueue.context.headers.enable"],
                replication_factor=s["errors.deadletterqueue.topic.replication.factor"],
            )
        task = SinkTask(cfg.name, self.options.worker_id, cfg.create_sinks(), source,
                        ZooKeeperDecisionLog(self.session, self.options.worker_id), settings, dead_letter=dead_letter,
                        on_fenced=lambda _partitions: self._wake.set(), on_change=self._wake.set)
        try:
            task.open()
        except BaseException:
            task.close()
            raise
        stop = threading.Event()
        thread = run_in_context(task.run, stop, name=f"task-{cfg.name}", daemon=False)
        log.info("connector_started", connector=cfg.name, topics=cfg.topics)
        return _Running(cfg, task, thread, stop, restart_seen)

    def _stop(self, name: str) -> None:
        r = self.running.pop(name)
        r.stop.set()
        r.task.interrupt()  # the cycle in flight commits what it has instead of waiting out its interval
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
            self._published.clear()  # a new session: the ephemeral status znodes are gone too
            self._published_shape.clear()
            try:
                zk.create(me, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                                          "rest_url": self.rest_url}).encode(), ephemeral=True, makepath=True)
            except NodeExistsError:
                pass
            self._leader_node = None
        if self._leader_node is None or not zk.exists(self._leader_node):
            self._leader_node = zk.create(f"{root}/leader/n_", self.options.worker_id.encode(), ephemeral=True, sequence=True,
                                          makepath=True)

    def _watch(self) -> None:
        """Watches that wake the reconcile loop at once: membership, leadership, connectors and this
        worker's assignment. Polling (``poll_interval_s``) stays as the safety net."""
        zk, root = self.session.client, self.session.root
        for path in ("workers", "leader", "connectors", "assignments"):
            zk.ensure_path(f"{root}/{path}")
        wake = lambda *_args: self._wake.set()  # noqa: E731 - runs on kazoo's thread: only set a flag
        for path in ("workers", "leader", "connectors"):
            zk.ChildrenWatch(f"{root}/{path}", wake, send_event=True)
        zk.DataWatch(f"{root}/assignments/{self.options.worker_id}", wake)

    def _is_leader(self) -> bool:
        children = sorted(self.session.client.get_children(f"{self.session.root}/leader"))
        return bool(children) and self._leader_node is not None and self._leader_node.endswith(children[0])

    def _lead(self, wanted: dict[str, ConnectorConfig]) -> None:
        """Leader only: compute the assignment of every RUNNING connector and publish it."""
        from kazoo.exceptions import NoNodeError, NodeExistsError

        from eosink.worker.control.assignment import assign, from_json, to_json

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

        from eosink.worker.control.assignment import from_json

        try:
            data, _ = self.session.client.get(f"{self.session.root}/assignments/{self.options.worker_id}")
        except NoNodeError:
            return {}
        return from_json(json.loads(data))

    @property
    def rest_url(self) -> str | None:
        if self.options.rest_advertised_url:
            return self.options.rest_advertised_url
        return f"http://{socket.gethostname()}:{self.rest.port}" if self.rest is not None else None

    def publish_status(self, every_s: float = 2.0) -> None:
        """Each task's status as an ephemeral znode ``/status/<connector>/<worker>`` (read by the REST API).

        Written when the state changes, and at most every ``every_s`` for lag and delivered counts alone.
        Secrets are redacted: a trace may quote anything."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        zk, root = self.session.client, self.session.root
        docs: dict[str, dict] = {}
        for name, r in self.running.items():
            st = r.task.status()
            docs[name] = {
                "state": "PAUSED" if st.paused and st.state.value in ("RUNNING", "RECOVERING") else st.state.value,
                "worker_id": self.options.worker_id, "partitions": st.partitions,
                "epochs": {str(tp): g.epoch for tp, g in list(r.task.grants.items())},
                "trace": st.trace,
                "unresolved": [{"txn": u.txn_id, "partitions": sorted(map(str, u.partitions)), "reason": u.reason}
                               for u in st.unresolved],
                "delivered": st.delivered, "lag": st.lag,
            }
        for name, trace in self.failures.items():
            docs.setdefault(name, {"state": "FAILED", "worker_id": self.options.worker_id, "partitions": [], "epochs": {},
                                   "trace": trace, "unresolved": [], "delivered": {}, "lag": {}})
        now = time.monotonic()
        for name, d in docs.items():
            doc = json.dumps(redact(d), sort_keys=True).encode()
            if self._published.get(name) == doc:
                continue
            shape = json.dumps({k: v for k, v in d.items() if k not in ("delivered", "lag")}, sort_keys=True).encode()
            if self._published_shape.get(name) == shape and now - self._published_at.get(name, 0.0) < every_s:
                continue
            path = f"{root}/status/{name}/{self.options.worker_id}"
            try:
                zk.set(path, doc)
            except NoNodeError:
                try:
                    zk.create(path, doc, ephemeral=True, makepath=True)
                except NodeExistsError:
                    zk.set(path, doc)
            self._published[name] = doc
            self._published_shape[name] = shape
            self._published_at[name] = now
        for name in set(self._published) - set(docs):
            self._published.pop(name)
            self._published_shape.pop(name, None)
            try:
                zk.delete(f"{root}/status/{name}/{self.options.worker_id}")
            except NoNodeError:
                pass

    def reconcile(self, store: ConnectorStore) -> None:
        """Bring running tasks in line with the configs, target states and this worker's assignment."""
        if self.session.session_probably_lost():
            self.registered = False
            for r in self.running.values():
                r.task.request_assignment(set())  # the partitions are someone else's by now
            return
        self._register()
        self.registered = True
        wanted: dict[str, ConnectorConfig] = {}
        paused: set[str] = set()
        invalid: dict[str, str] = {}
        for name in store.names():
            raw = store.get(name)
            state = store.target_state(name)
            if raw is None or state not in ("RUNNING", "PAUSED"):
                continue  # STOPPED: no tasks anywhere, partitions released
            try:
                wanted[name] = parse_connector(name, raw, source=f"zookeeper connector {name}")
                for secret in secret_values(wanted[name]):
                    register_secret(secret)
            except ConfigError as exc:
                invalid[name] = str(exc)
                if self._last_invalid.get(name) != invalid[name]:
                    log.error("connector_config_invalid", connector=name, error=str(exc))
            if state == "PAUSED":
                paused.add(name)
        self._last_invalid = invalid
        leader = self._is_leader()
        if leader:
            self._lead(wanted)
        mine = self._my_assignment()
        for name in list(self.running):
            if name not in wanted or not mine.get(name) or wanted[name].raw != self.running[name].config.raw:
                self._stop(name)
            elif self._restart_requested(name, store):
                self._stop(name)
        # Failures to report: a config this worker cannot resolve (the leader reports it once, as
        # nobody is assigned it), and connectors assigned here that would not start.
        failures = {n: e for n, e in invalid.items() if leader}
        for name, cfg in wanted.items():
            if not mine.get(name):
                continue
            if name not in self.running:
                try:
                    self.running[name] = self._start(cfg, store)
                except EosinkError as exc:
                    if self.failures.get(name) != str(exc):
                        log.error("connector_start_failed", connector=name, error=str(exc))
                    failures[name] = str(exc)
                    continue
            self.running[name].task.request_assignment(mine[name])
            self.running[name].task.paused = name in paused
        self.failures = failures
        self.publish_status()

    def _restart_requested(self, name: str, store: ConnectorStore) -> bool:
        """A restart request (REST ``POST .../restart``) newer than this task that names this worker."""
        r = self.running[name]
        version, request = store.restart_request(name)
        if version <= r.restart_seen:
            return False
        r.restart_seen = version
        workers = request.get("workers")
        if workers is not None and self.options.worker_id not in workers:
            return False
        if request.get("only_failed") and r.task.status().state.value != "FAILED":
            return False
        log.info("connector_restart_requested", connector=name, only_failed=bool(request.get("only_failed")))
        return True

    def run(self, stop: threading.Event) -> None:
        self.session.start()
        if self.options.rest_port or self.options.rest_advertised_url:
            from eosink.worker.control.rest import RestServer

            self.rest = RestServer(self, self.options.rest_host, self.options.rest_port, self.options.rest_auth).start()
        self._register()
        self._watch()  # once: kazoo's watch recipes re-arm themselves after reconnects
        self.registered = True
        log.info("worker_started", worker=self.options.worker_id, cluster=self.options.cluster, rest_url=self.rest_url)
        store = ConnectorStore(self.session)
        try:
            while not stop.is_set():
                self._wake.clear()  # before reconciling: an event during it triggers another round
                try:
                    self.reconcile(store)
                except Exception as exc:  # noqa: BLE001 - ZooKeeper or Kafka briefly away: try again
                    self.registered = self.session.can_decide() and self.registered
                    log.warning("reconcile_failed", error=str(exc), error_class=type(exc).__name__)
                self.last_tick = time.monotonic()
                deadline = time.monotonic() + self.options.poll_interval_s
                while not stop.is_set() and time.monotonic() < deadline:
                    if self._wake.wait(0.05):  # a watch fired: react now, not at the next poll
                        break
        finally:
            self.registered = False
            for name in list(self.running):
                self._stop(name)  # finishes the cycle in flight, releases partitions at once
            if self.rest is not None:
                self.rest.stop()
            self.session.stop()  # ephemeral znodes go now, not a session timeout later
            log.info("worker_stopped", worker=self.options.worker_id)
