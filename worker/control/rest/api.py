"""Kafka Connect's REST API over eosink's ZooKeeper state: paths, shapes and status codes as Connect has them.

Every handler takes a :class:`Request` and returns a :class:`Response` or raises :class:`ApiError`
(rendered ``{"error_code": ..., "message": ...}``). Configs and target states live in ZooKeeper
(:class:`~eosink.worker.control.store.ConnectorStore`), so any worker answers any request; the workers act on
what changed at their next reconcile (about a second).

Where eosink differs from Connect, on purpose:

* ``POST /connectors/{n}/restart`` without parameters restarts the connector's *tasks* (a
  connector here is nothing but its tasks); Connect's status codes are kept (204, or 202 with the
  status when ``includeTasks``/``onlyFailed`` is given).
* PAUSED keeps each task and its partitions but stops its cycles; STOPPED stops the tasks and
  releases the partitions (as in Connect).
* Offsets are the decision log's (see :mod:`eosink.worker.control.admin`); altering them is allowed only while
  STOPPED (400 otherwise, as Connect), and 409 while a worker is still stopping a task.
* ``GET /connectors/{n}/transactions`` (eosink's): prepared transactions and what recovery will do.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

from eosink.connectors.api.errors import EosinkError
from eosink.connectors.api.records import TopicPartition
from eosink.worker.control import plugins
from eosink.worker.control.admin import ClusterAdmin, OffsetsConflict
from eosink.worker.control.config import CONNECTOR_NAME, masked_config, parse_connector
from eosink.worker.control.rest.connect4 import plugin_version, with_version
from eosink.worker.control.rest.messages import ApiError, Request, Response, check_config_values
from eosink.worker.control.store import ConnectorStore
from eosink.worker.engine.zk import ZkSession
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.control.rest")
STATES = ("RUNNING", "PAUSED", "STOPPED")
_TOPIC = re.compile(r"^(?!\.{1,2}$)[a-zA-Z0-9._-]{1,249}$")  # Kafka's legal topic names


class WorkerView(Protocol):
    """What the API reads of the worker serving it, and nothing else (the worker is
    :class:`eosink.worker.control.runner.Worker`; the API never reaches into its tasks)."""

    @property
    def session(self) -> ZkSession: ...  # connectors, status and offsets all live in ZooKeeper

    @property
    def worker_id(self) -> str: ...

    @property
    def cluster(self) -> str: ...

    @property
    def bootstrap(self) -> str: ...

    @property
    def kafka(self) -> Mapping[str, str]: ...  # Kafka client settings (security) for admin and dead-letter reads

    @property
    def poll_interval_s(self) -> float: ...

    @property
    def last_tick(self) -> float | None: ...  # monotonic time of the last completed reconcile (liveness)

    @property
    def registered(self) -> bool: ...  # a member of the cluster in the current ZooKeeper session (readiness)


class ConnectApi:
    def __init__(self, worker: WorkerView) -> None:
        self.worker = worker
        self.store = ConnectorStore(worker.session)
        self.admin = ClusterAdmin(worker.session)
        self._cluster_id: str | None = None

    # -- helpers ------------------------------------------------------------------------------------
    def _name(self, req: Request) -> str:
        """The path's connector name, which must exist (404 otherwise, as for any unknown name)."""
        name = req.params["name"]
        if not CONNECTOR_NAME.match(name) or self.store.get(name) is None:
            raise ApiError(404, f"Connector {name} not found")
        return name

    def _info(self, name: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
        config = config if config is not None else (self.store.get(name) or {})
        tasks = [{"connector": name, "task": t.id} for t in self.admin.tasks(name)]
        return {"name": name, "config": masked_config(name, config), "tasks": tasks, "type": "sink"}

    def _validated(self, name: Any, config: Any) -> dict[str, Any]:
        """400 naming every bad key, in Connect's words; the config as it will be stored."""
        if not isinstance(name, str) or not CONNECTOR_NAME.match(name):
            raise ApiError(400, f"Connector name {name!r} is invalid: it must be 1-100 letters, digits, '_' or '-'")
        if not isinstance(config, dict):
            raise ApiError(400, "Connector configuration must be a JSON object")
        check_config_values(config)
        if "name" in config and config["name"] != name:
            raise ApiError(400, f"Connector name configuration ({config['name']!r}) doesn't match connector name in "
                                f"the URL ({name})")
        cfg = {**config, "name": name}
        plugin = plugins.find(str(cfg.get("connector.class") or ""))
        if plugin is not None:
            infos = plugins.validate(plugin, cfg)
            if infos["error_count"]:
                raise ApiError(400, plugins.errors_message(infos, plugin.alias or plugin.class_name))
        problem = plugins.registration_error(name, cfg)
        if problem is not None:
            raise ApiError(400, f"Connector configuration is invalid and contains the following 1 error(s):\n"
                                f"{problem.key or 'config'}: {problem.message.split(': ', 1)[-1]}")
        return cfg

    # -- root, probes, docs -----------------------------------------------------------------------
    def root(self, req: Request) -> Response:
        return Response(200, {"version": plugins.VERSION, "commit": "", "kafka_cluster_id": self._kafka_cluster_id(),
                              "eosink_cluster": self.worker.cluster, "worker_id": self.worker.worker_id})

    def _kafka_cluster_id(self) -> str | None:
        if self._cluster_id is None:
            try:
                from confluent_kafka.admin import AdminClient

                admin = AdminClient({"bootstrap.servers": self.worker.bootstrap, **self.worker.kafka})
                self._cluster_id = admin.list_topics(timeout=5).cluster_id
            except Exception:  # noqa: BLE001 - Kafka away: say so by a null, the root must answer anyway
                return None
        return self._cluster_id

    def health(self, req: Request) -> Response:
        """Liveness (KIP-1017's shape): 200 once started while the reconcile loop keeps turning."""
        w = self.worker
        if w.last_tick is None:
            return Response(503, {"status": "starting", "message": "Worker is still starting up."})
        stale = time.monotonic() - w.last_tick
        if stale > max(30.0, 10 * w.poll_interval_s):
            return Response(500, {"status": "unhealthy", "message": f"the worker's main loop has not run for {stale:.0f} s"})
        return Response(200, {"status": "healthy", "message": "Worker has completed startup and is ready to handle requests."})

    def ready(self, req: Request) -> Response:
        """Readiness: connected to ZooKeeper and a member of the cluster (can take and run work)."""
        w = self.worker
        if w.registered and w.session.can_decide() and w.last_tick is not None:
            return Response(200, {"status": "ready", "worker_id": w.worker_id})
        return Response(503, {"status": "not ready", "message": "not connected to ZooKeeper or not yet registered"})

    def metrics(self, req: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(200, raw=generate_latest(), content_type=CONTENT_TYPE_LATEST)

    def openapi(self, req: Request) -> Response:
        from eosink.worker.control.rest.openapi import document

        return Response(200, document())

    # -- connectors -------------------------------------------------------------------------------
    def list_connectors(self, req: Request) -> Response:
        names = self.store.names()
        expand = {e for v in req.query.get("expand", []) for e in v.split(",")} & {"status", "info"}
        if not expand:
            return Response(200, names)
        out: dict[str, Any] = {}
        for n in names:
            item: dict[str, Any] = {}
            if "info" in expand:
                item["info"] = self._info(n)
            if "status" in expand:
                item["status"] = self._status(n)
            out[n] = item
        return Response(200, out)

    def create(self, req: Request) -> Response:
        body = req.json()
        if not isinstance(body, dict):
            raise ApiError(400, 'request body must be {"name": ..., "config": {...}}')
        if "config" not in body:
            raise ApiError(400, 'Connector config is missing: request body must be {"name": ..., "config": {...}}')
        name = body.get("name")
        if name is None and isinstance(body["config"], dict):
            name = body["config"].get("name")
        state = body.get("initial_state", "RUNNING")
        if state not in STATES:
            raise ApiError(400, f"initial_state must be one of {', '.join(STATES)}, got {state!r}")
        cfg = self._validated(name, body["config"])
        if not self.store.create(cfg["name"], cfg, state):
            raise ApiError(409, f"Connector {cfg['name']} already exists")
        log.info("connector_created", connector=cfg["name"], initial_state=state)
        return Response(201, self._info(cfg["name"], cfg), {"Location": f"/connectors/{quote(cfg['name'])}"})

    def get(self, req: Request) -> Response:
        return Response(200, self._info(self._name(req)))

    def get_config(self, req: Request) -> Response:
        name = self._name(req)
        return Response(200, masked_config(name, self.store.get(name) or {}))

    def put_config(self, req: Request) -> Response:
        name = req.params["name"]
        cfg = self._validated(name, req.json())
        if self.store.get(name) is None and self.store.create(name, cfg):
            log.info("connector_created", connector=name)
            return Response(201, self._info(name, cfg), {"Location": f"/connectors/{quote(name)}"})
        self.store.put(name, cfg)
        log.info("connector_configured", connector=name)
        return Response(200, self._info(name, cfg))

    def delete(self, req: Request) -> Response:
        """Delete, then wait (up to 30 s) until no worker reports a task of it any more: once 204
        is returned, nothing more of the connector is delivered (the cycle in flight when the
        delete landed has committed or aborted by then)."""
        name = self._name(req)
        self.store.delete(name)
        log.info("connector_deleted", connector=name)
        deadline = time.monotonic() + 30
        while self.admin.tasks(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        return Response(204)

    def _status(self, name: str, restarting: list[int] | None = None) -> dict[str, Any]:
        """Connect 4's status: eosink's, with the plugin ``version`` on the connector and each task."""
        status = self.admin.status(name, self.store.target_state(name), restarting=restarting or [])
        return with_version(status, plugin_version(self.store.get(name)))

    def status(self, req: Request) -> Response:
        return Response(200, self._status(self._name(req)))

    def tasks(self, req: Request) -> Response:
        name = self._name(req)
        config = masked_config(name, self.store.get(name) or {})
        return Response(200, [{"id": {"connector": name, "task": t.id},
                               "config": {**config, "eosink.worker.id": t.worker_id,
                                          "eosink.partitions": ",".join(t.doc.get("partitions", []))}}
                              for t in self.admin.tasks(name)])

    def _task(self, req: Request) -> tuple[str, Any]:
        name = self._name(req)
        raw = req.params["task"]
        for t in self.admin.tasks(name):
            if raw.isdigit() and int(raw) == t.id:
                return name, t
        raise ApiError(404, f"Task {name}-{raw} not found")

    def task_status(self, req: Request) -> Response:
        name, t = self._task(req)
        return Response(200, with_version(ClusterAdmin.task_json(t), plugin_version(self.store.get(name))))

    def task_restart(self, req: Request) -> Response:
        name, t = self._task(req)
        self.store.request_restart(name, {"workers": [t.worker_id], "only_failed": False})
        log.info("task_restart_requested", connector=name, task=t.id, worker=t.worker_id)
        return Response(204)

    def _set_state(self, req: Request, state: str) -> Response:
        name = self._name(req)
        self.store.set_target_state(name, state)
        log.info("connector_target_state", connector=name, state=state)
        return Response(202)

    def pause(self, req: Request) -> Response:
        return self._set_state(req, "PAUSED")

    def resume(self, req: Request) -> Response:
        return self._set_state(req, "RUNNING")

    def stop(self, req: Request) -> Response:
        self._set_state(req, "STOPPED")
        return Response(204)  # Connect answers a stop with 204, pause and resume with 202

    def restart(self, req: Request) -> Response:
        name = self._name(req)
        include_tasks, only_failed = req.flag("includeTasks"), req.flag("onlyFailed")
        tasks = self.admin.tasks(name)
        chosen = [t for t in tasks if not only_failed or t.doc.get("state") == "FAILED"]
        if chosen:
            self.store.request_restart(name, {"workers": [t.worker_id for t in chosen], "only_failed": only_failed})
        log.info("connector_restart_requested", connector=name, tasks=[t.id for t in chosen], only_failed=only_failed)
        if not include_tasks and not only_failed:
            return Response(204)
        return Response(202, self._status(name, restarting=[t.id for t in chosen]))

    # -- offsets -------------------------------------------------------------------------------------
    def get_offsets(self, req: Request) -> Response:
        return Response(200, {"offsets": self.admin.offsets(self._name(req))})

    def _require_stopped(self, name: str) -> None:
        if self.store.target_state(name) != "STOPPED":
            raise ApiError(400, "Connectors must be in the STOPPED state before their offsets can be modified. This can "
                                f"be done for the specified connector by issuing a 'PUT' request to the "
                                f"'/connectors/{name}/stop' endpoint")
        busy = [t.worker_id for t in self.admin.tasks(name)]  # a task reports until its worker has stopped it
        if busy:
            raise ApiError(409, f"Connector {name} is STOPPED but worker(s) {', '.join(busy)} are still stopping its "
                                "tasks; try again in a few seconds")

    def patch_offsets(self, req: Request) -> Response:
        name = self._name(req)
        body = req.json()
        items = body.get("offsets") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise ApiError(400, "Partitions / offsets need to be provided for an alter offsets request: "
                                '{"offsets": [{"partition": {"kafka_topic": ..., "kafka_partition": ...}, '
                                '"offset": {"kafka_offset": ...}}]}')
        changes: dict[TopicPartition, int | None] = {}
        for i, item in enumerate(items):
            part = item.get("partition") if isinstance(item, dict) else None
            if not isinstance(part, dict):
                raise ApiError(400, f"offsets[{i}].partition must be an object with kafka_topic and kafka_partition")
            topic, partition = part.get("kafka_topic"), part.get("kafka_partition")
            if not isinstance(topic, str) or not _TOPIC.match(topic):
                raise ApiError(400, f"offsets[{i}].partition.kafka_topic must be a Kafka topic name "
                                    "(1-249 of a-z A-Z 0-9 . _ -)")
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < 2**31:
                raise ApiError(400, f"offsets[{i}].partition.kafka_partition must be a non-negative integer")
            off = item.get("offset")
            if off is None:
                changes[TopicPartition(topic, partition)] = None
                continue
            value = off.get("kafka_offset") if isinstance(off, dict) else None
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise ApiError(400, f"offsets[{i}].offset.kafka_offset must be a non-negative integer (or the offset null)")
            changes[TopicPartition(topic, partition)] = value
        self._require_stopped(name)
        self._alter(name, changes)
        return Response(200, {"message": "The offsets for this connector have been altered successfully"})

    def _alter(self, name: str, changes: dict[TopicPartition, int | None]) -> None:
        try:
            self.admin.alter_offsets(name, changes)
        except OffsetsConflict as exc:
            raise ApiError(409, str(exc)) from None

    def delete_offsets(self, req: Request) -> Response:
        name = self._name(req)
        self._require_stopped(name)
        partitions = list(self.admin.decisions(name))
        if partitions:
            self._alter(name, {tp: None for tp in partitions})
        return Response(200, {"message": "The offsets for this connector have been reset successfully"})

    # -- transactions (eosink) ------------------------------------------------------------------------
    def transactions(self, req: Request) -> Response:
        """Prepared transactions of the connector in its sinks, with what recovery will do (see the runbook)."""
        name = self._name(req)
        errors: list[dict[str, str]] = []
        sinks: list[Any] = []
        try:
            cfg = parse_connector(name, self.store.get(name) or {}, source=f"connector {name}")
            sinks = cfg.create_sinks()
            if cfg.settings["errors.tolerance"] == "all":
                from eosink.worker.engine.deadletter import DeadLetterSink

                sinks.append(DeadLetterSink(name, session=self.worker.session, worker_id=self.worker.worker_id,
                                            bootstrap=self.worker.bootstrap,
                                            topic=cfg.settings["errors.deadletterqueue.topic.name"], kafka=self.worker.kafka))
        except EosinkError as exc:
            errors.append({"sink": "config", "message": str(exc)})
        try:
            txns = self.admin.transactions(name, sinks, errors)
        finally:
            for s in sinks:
                try:
                    s.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        return Response(200, {"connector": name, "transactions": txns, "errors": errors})

    # -- plugins ------------------------------------------------------------------------------------
    def list_plugins(self, req: Request) -> Response:
        return Response(200, [p.info() for p in plugins.plugins()])

    def _plugin(self, req: Request) -> plugins.Plugin:
        p = plugins.find(req.params["plugin"])
        if p is None:
            raise ApiError(404, f"Failed to find any class that implements Connector and which name matches "
                                f"{req.params['plugin']}, available connectors are: "
                                + ", ".join(p.class_name for p in plugins.plugins()))
        return p

    def plugin_config(self, req: Request) -> Response:
        return Response(200, plugins.config_keys(self._plugin(req)))

    def validate(self, req: Request) -> Response:
        plugin = self._plugin(req)
        config = req.json()
        if not isinstance(config, dict):
            raise ApiError(400, "the body must be the connector configuration, a JSON object")
        check_config_values(config)
        given = config.get("connector.class")
        if given not in (None, "") and plugins.find(str(given)) != plugin:
            raise ApiError(400, f"Included connector type {given} does not match request type {req.params['plugin']}")
        cfg = {**config, "connector.class": given or (plugin.alias if plugin.alias else plugin.class_name)}
        return Response(200, plugins.validate(plugin, cfg))


__all__ = ["STATES", "ConnectApi", "WorkerView"]
