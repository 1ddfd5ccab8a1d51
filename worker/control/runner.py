"""A worker process: a ZooKeeper session, the connectors it runs, one task thread per connector.

The worker's loop is *reconcile*: read what the cluster wants (:mod:`eosink.worker.control.store`),
take part in membership and, when leading, assign (:mod:`eosink.worker.control.membership`), start
and stop task threads until they match this worker's share, then report (:mod:`eosink.worker.control.status`).
Partition ownership itself is the decision log's: every grant bumps the partition's epoch, so an
older owner can never decide again, whatever the assignment said.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eosink.connectors.api.errors import ConfigError, EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import metrics
from eosink.worker.control import cluster_format
from eosink.worker.control.config import ConnectorConfig, parse_connector, secret_values
from eosink.worker.control.membership import Membership, TopicPartitions
from eosink.worker.control.status import StatusPublisher
from eosink.worker.control.store import ConnectorStore
from eosink.worker.engine.decision import ZooKeeperDecisionLog
from eosink.worker.engine.source import KafkaSource
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import TaskSettings
from eosink.worker.engine.zk import ZkCredentials, ZkSession
from eosink.worker.logging import get_logger, register_secret, run_in_context
from eosink.worker.transforms import build_chain

if TYPE_CHECKING:
    from eosink.worker.control.rest.auth import RestAuth

log = get_logger("eosink.worker.control.runner")


@dataclass
class WorkerOptions:
    bootstrap: str
    zookeeper: str
    cluster: str = "default"
    worker_id: str = ""
    session_timeout_s: float = 10.0
    poll_interval_s: float = 1.0
    #: REST API (worker/control/rest): port 0 = no REST server.
    rest_host: str = "0.0.0.0"
    rest_port: int = 0
    rest_advertised_url: str = ""
    rest_auth: RestAuth | None = None
    rest_tls: Any = None  # ssl.SSLContext: the REST API serves https (eosink.worker.control.rest.tls.server_context)
    #: Kafka client settings passed through to every consumer, producer and admin client
    #: (``security.protocol``, ``sasl.*``, ``ssl.*``).
    kafka: dict[str, str] = field(default_factory=dict)
    #: The digest principal this worker authenticates to ZooKeeper as; every znode it creates is that
    #: principal's alone (:mod:`eosink.worker.engine.zk`). None: no authentication, znodes open to anyone.
    zookeeper_credentials: ZkCredentials | None = None
    #: Connect to ZooKeeper over TLS, verifying it against this CA file; None = plaintext.
    zookeeper_ca_file: str | None = None
    #: Take over a cluster tree left open by a run without credentials instead of refusing to start.
    zookeeper_lock_open_tree: bool = False
    #: Continuous audit (:mod:`eosink.worker.audit.continuous`), run by the leader: seconds between
    #: rounds (0 = off) and the most records one round checks per connector.
    audit_interval_s: float = 0.0
    audit_max_records: int = 100_000

    def __post_init__(self) -> None:
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class _Running:
    config: ConnectorConfig
    task: SinkTask
    thread: threading.Thread
    stop: threading.Event
    restart_seen: int = -1


@dataclass
class _Desired:
    """What the cluster wants, as this worker reads it: the connectors to run, and those it cannot parse."""

    wanted: dict[str, ConnectorConfig] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    invalid: dict[str, str] = field(default_factory=dict)


class Worker:
    """Runs every RUNNING connector found in ZooKeeper, over the partitions assigned to it."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.session = ZkSession(options.zookeeper, options.cluster, options.session_timeout_s, options.zookeeper_credentials,
                                 options.zookeeper_ca_file)
        self.membership = Membership(self.session, options.worker_id, TopicPartitions(options.bootstrap, options.kafka))
        self.status = StatusPublisher(self.session, options.worker_id)
        self.running: dict[str, _Running] = {}
        self._wake = threading.Event()
        #: Connectors this worker should run but cannot (invalid here, or failed to start): reported FAILED.
        self.failures: dict[str, str] = {}
        self._last_invalid: dict[str, str] = {}
        self.rest: Any = None  # eosink.worker.control.rest.RestServer once serving
        self.last_tick: float | None = None  # monotonic time of the last completed reconcile (liveness)
        self.registered = False  # this worker's znode exists in the current session (readiness)
        #: Suspended past the session timeout on the local clock: every partition dropped (logged once).
        self._presumed_lost = False
        self.leading = False  # as of the last reconcile (the metrics read it without a ZooKeeper call)
        self._last_assignment: dict[str, set[TopicPartition]] | None = None

    # -- what the REST API reads of its worker (eosink.worker.control.rest.api.WorkerView) ----------
    @property
    def worker_id(self) -> str:
        return self.options.worker_id

    @property
    def cluster(self) -> str:
        return self.options.cluster

    @property
    def bootstrap(self) -> str:
        return self.options.bootstrap

    @property
    def kafka(self) -> Mapping[str, str]:
        return self.options.kafka

    @property
    def poll_interval_s(self) -> float:
        return self.options.poll_interval_s

    @property
    def rest_url(self) -> str | None:
        if self.options.rest_advertised_url:
            return self.options.rest_advertised_url
        return f"{self.rest.scheme}://{socket.gethostname()}:{self.rest.port}" if self.rest is not None else None

    # -- what the metrics read at scrape time (eosink.worker.metrics.WorkerView) --------------------
    def zookeeper_connected(self) -> bool:
        return self.session.can_decide()

    def is_leader(self) -> bool:
        return self.leading and self.session.can_decide()

    def failed_connectors(self) -> list[str]:
        return [n for n in list(self.failures) if n not in self.running]

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.session.start(lock_open_tree=self.options.zookeeper_lock_open_tree)
        try:
            cluster_format.claim(self.session.client, self.session.root, self.session.hosts)
        except BaseException:
            self.session.stop()
            raise
        metrics.track_worker(self)
        if self.options.rest_port or self.options.rest_advertised_url:
            from eosink.worker.control.rest import RestServer

            self.rest = RestServer(self, self.options.rest_host, self.options.rest_port, self.options.rest_auth,
                                   self.options.rest_tls).start()
        self._register()
        self.membership.watch(self._wake.set)
        self.session.on_reconnect(self._zookeeper_back)
        self.registered = True
        log.info("worker_started", worker=self.options.worker_id, cluster=self.options.cluster, rest_url=self.rest_url)
        store = ConnectorStore(self.session)
        auditor = None
        if self.options.audit_interval_s > 0:
            from eosink.worker.audit.continuous import ContinuousAudit

            auditor = ContinuousAudit(self, self.options.audit_interval_s, self.options.audit_max_records).start()
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
            if auditor is not None:
                auditor.stop()
            for name in list(self.running):
                self._stop(name)  # finishes the cycle in flight, releases partitions at once
            if self.rest is not None:
                self.rest.stop()
            self.session.stop()  # ephemeral znodes go now, not a session timeout later
            metrics.untrack_worker(self)
            log.info("worker_stopped", worker=self.options.worker_id)

    def _zookeeper_back(self) -> None:
        """On kazoo's thread, when the connection returns: reconcile now, and end every task's backoff after
        the cycles ZooKeeper's absence aborted (it grows to ``errors.retry.delay.max.ms``)."""
        self._wake.set()
        for r in list(self.running.values()):
            r.task.interrupt()

    def reconcile(self, store: ConnectorStore) -> None:
        """Bring running tasks in line with the configs, target states and this worker's assignment."""
        if self.session.session_probably_lost():
            self.registered = False
            if not self._presumed_lost:  # once per suspension: what an operator sees of the local timer
                self._presumed_lost = True
                log.warning("zookeeper_session_presumed_lost", zookeeper=self.options.zookeeper,
                            session_timeout_s=self.options.session_timeout_s, dropping=sorted(self.running))
            for r in self.running.values():
                r.task.request_assignment(set())  # the partitions are someone else's by now
            return
        self._presumed_lost = False
        if not self.session.can_decide():
            return  # suspended: a ZooKeeper read would wait for the connection, and this loop must keep turning
        self._register()
        self.registered = True
        desired = self._desired(store)
        wanted = desired.wanted
        leader = self.leading = self.membership.is_leader()
        if leader:
            self.membership.lead(wanted)
        mine = self.membership.my_assignment()
        if mine != self._last_assignment:
            if self._last_assignment is not None:
                metrics.REBALANCES.inc()
            self._last_assignment = mine
        for name in list(self.running):
            stale = name not in wanted or not mine.get(name) or wanted[name].raw != self.running[name].config.raw
            if stale or self._restart_requested(name, store):  # a restart request is read only for a task kept
                self._stop(name)
        # Failures to report: a config this worker cannot resolve (the leader reports it once, as
        # nobody is assigned it), and connectors assigned here that would not start.
        failures = {n: e for n, e in desired.invalid.items() if leader}
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
            task, pause = self.running[name].task, name in desired.paused
            newly_paused = pause and not task.paused
            task.paused = pause
            if newly_paused:
                task.interrupt()  # the flush in progress commits what it has now; /status says PAUSED after it
        self.failures = failures
        self.status.publish({name: r.task for name, r in self.running.items()}, self.failures)

    def _register(self) -> None:
        if self.membership.register(self.rest_url):
            self.status.forget()  # a new session: the ephemeral status znodes are gone too

    def _desired(self, store: ConnectorStore) -> _Desired:
        """The RUNNING and PAUSED connectors, parsed (their secrets registered for redaction); a config
        that does not parse is logged once per distinct error."""
        out = _Desired()
        for name in store.names():
            raw = store.get(name)
            state = store.target_state(name)
            if raw is None or state not in ("RUNNING", "PAUSED"):
                continue  # STOPPED: no tasks anywhere, partitions released
            try:
                out.wanted[name] = parse_connector(name, raw, source=f"zookeeper connector {name}")
                for secret in secret_values(out.wanted[name]):
                    register_secret(secret)
            except ConfigError as exc:
                out.invalid[name] = str(exc)
                if self._last_invalid.get(name) != out.invalid[name]:
                    log.error("connector_config_invalid", connector=name, error=str(exc))
            if state == "PAUSED":
                out.paused.add(name)
        self._last_invalid = out.invalid
        return out

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

    # -- one connector's task -------------------------------------------------------------------
    def _start(self, cfg: ConnectorConfig, store: ConnectorStore) -> _Running:
        s = cfg.settings
        tolerate = s["errors.tolerance"] == "all"
        restart_seen, _ = store.restart_request(cfg.name)  # requests made before this start are served by it
        source = KafkaSource(
            cfg.name, self.options.bootstrap, value_converter=cfg.value_converter, reset=s["consumer.auto.offset.reset"],
            key_converter=cfg.key_converter, schemas_enable=s["value.converter.schemas.enable"],
            value_registry=cfg.registry("value"), key_registry=cfg.registry("key"),
            overrides={**self.options.kafka,
                       **{k[len("consumer.override."):]: v for k, v in cfg.raw.items() if k.startswith("consumer.override.")}},
            tolerate=tolerate,
        )
        settings = TaskSettings(
            commit_interval_s=s["commit.interval.ms"] / 1000, commit_min_interval_s=cfg.commit_min_interval_ms / 1000,
            max_records=s["batch.max.records"], max_bytes=s["batch.max.bytes"],
            backoff_max_s=s["errors.retry.delay.max.ms"] / 1000, retry_timeout_s=s["errors.retry.timeout"] / 1000,
            tolerate_errors=tolerate, log_errors=s["errors.log.enable"], log_error_messages=s["errors.log.include.messages"],
            # A decided commit is retried through a sink's outage as long as errors.retry.timeout allows (forever at -1).
            commit_retry_min_s=float("inf") if s["errors.retry.timeout"] < 0 else s["errors.retry.timeout"] / 1000,
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
                        on_fenced=lambda _partitions: self._wake.set(), on_change=self._wake.set,
                        transforms=build_chain(cfg.raw))
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
