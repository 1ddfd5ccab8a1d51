"""Who is in the cluster, who leads it, and what each worker owns.

Every worker keeps an ephemeral znode under ``workers/`` and an ephemeral sequence znode under
``leader/``; the lowest sequence leads. The leader alone computes the assignment
(:func:`eosink.worker.control.assignment.assign`) and publishes each worker's share under
``assignments/<worker>``; every worker then runs what its own znode names. Ephemeral znodes make a
lost ZooKeeper session leave the cluster by itself, so a dead worker's partitions move on.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from eosink.connectors.api.errors import RetryableError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import paths
from eosink.worker.control.assignment import assign, from_json, to_json
from eosink.worker.control.config import ConnectorConfig
from eosink.worker.engine.kafka_errors import is_authorization
from eosink.worker.engine.zk import ZkSession
from eosink.worker.logging import get_logger
from eosink.worker.version import VERSION

log = get_logger("eosink.worker.control.membership")


class TopicPartitions:
    """The partitions of topics as Kafka reports them now (what the leader divides among the workers)."""

    def __init__(self, bootstrap: str, kafka: Mapping[str, str]) -> None:
        self._config: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, **kafka}
        self._admin: Any = None
        #: Named topics the last call found refused by the broker's ACLs (topic -> librdkafka error name).
        self.refused: dict[str, str] = {}

    def __call__(self, topics: list[str], regex: str = "") -> set[TopicPartition]:
        """The partitions of ``topics``, or of every topic whose whole name matches ``regex`` (as Connect's
        ``topics.regex``; Kafka's internal ``__`` topics never match): asked anew at every assignment
        round, so a topic created later is picked up without a restart."""
        from confluent_kafka import KafkaException

        try:
            md = self.warm().list_topics(timeout=10)
        except KafkaException as exc:
            raise RetryableError(f"cannot read topic metadata from Kafka at {self._config['bootstrap.servers']}: "
                                 f"{exc.args[0].str() if exc.args else exc}", component="kafka") from None
        out: set[TopicPartition] = set()
        self.refused = {}
        if regex:
            # A topic the worker may not DESCRIBE is absent from the metadata: a regex matches only what it may see.
            pattern = re.compile(regex)
            topics = sorted(t for t in md.topics if not t.startswith("__") and pattern.fullmatch(t))
        for t in topics:
            tmd = md.topics.get(t)
            if tmd is None:
                self._note_refusal(t)
                continue
            if tmd.error is not None:
                continue
            out |= {TopicPartition(t, p) for p in tmd.partitions}
        return out

    def warm(self) -> Any:
        """The admin client, made now if it is not yet: librdkafka connects to the cluster as it is made, in
        the background. Made by the leader before any connector needs it, the first connector's assignment
        round no longer waits for that connection before its metadata request."""
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self._config)
        return self._admin

    def _note_refusal(self, topic: str) -> None:
        """A named topic missing from the metadata: absent, or hidden by the ACLs? Only asking for it tells."""
        from confluent_kafka import KafkaException

        try:
            tmd = self._admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        except KafkaException:
            return
        if tmd is not None and is_authorization(tmd.error):
            self.refused[topic] = tmd.error.name()


class Membership:
    """One worker's place in the cluster: its znodes, the election, and the assignment it reads (or, leading, writes)."""

    def __init__(self, session: ZkSession, worker_id: str, partitions: TopicPartitions) -> None:
        self.session = session
        self.worker_id = worker_id
        self._partitions = partitions
        self._leader_node: str | None = None
        self._refusals_logged: set[tuple[str, str]] = set()

    def register(self, rest_url: str | None) -> bool:
        """(Re-)create this worker's ephemeral znodes; after a LOST session they are gone.

        True when this worker's znode had to be created: a new session, whose other ephemeral
        znodes (the status reports) are gone too."""
        from kazoo.exceptions import NodeExistsError

        zk, root = self.session.client, self.session.root
        me = paths.worker(root, self.worker_id)
        fresh = False
        if not zk.exists(me):
            fresh = True
            try:
                zk.create(me, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                                          "rest_url": rest_url, "version": VERSION}).encode(), ephemeral=True, makepath=True)
            except NodeExistsError:
                pass
            self._leader_node = None
        if self._leader_node is None or not zk.exists(self._leader_node):
            self._leader_node = zk.create(paths.leader_candidate(root), self.worker_id.encode(), ephemeral=True,
                                          sequence=True, makepath=True)
        return fresh

    def watch(self, wake: Callable[[], None]) -> None:
        """Watches that wake the reconcile loop at once: membership, leadership, connectors and this
        worker's assignment. Polling stays as the safety net. Set once: kazoo's watch recipes re-arm
        themselves after reconnects."""
        zk, root = self.session.client, self.session.root
        for path in (paths.workers(root), paths.leader(root), paths.connectors(root), paths.assignments(root)):
            zk.ensure_path(path)

        def on_event(*_args: Any) -> None:  # runs on kazoo's thread: only set a flag
            wake()

        for path in (paths.workers(root), paths.leader(root), paths.connectors(root)):
            zk.ChildrenWatch(path, on_event, send_event=True)
        zk.DataWatch(paths.assignment(root, self.worker_id), on_event)

    def is_leader(self) -> bool:
        children = sorted(self.session.client.get_children(paths.leader(self.session.root)))
        return bool(children) and self._leader_node is not None and self._leader_node.endswith(children[0])

    def lead(self, wanted: Mapping[str, ConnectorConfig]) -> None:
        """Leader only: compute the assignment of every RUNNING connector and publish it."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        zk, root = self.session.client, self.session.root
        try:
            self._partitions.warm()  # (before the first connector: see TopicPartitions.warm)
        except Exception as exc:  # noqa: BLE001 - a config librdkafka refuses: the first metadata call reports it
            log.debug("kafka_admin_not_made", error=str(exc))
        workers = zk.get_children(paths.workers(root))
        zk.ensure_path(paths.assignments(root))
        previous = {}
        for w in zk.get_children(paths.assignments(root)):
            try:
                previous[w] = from_json(json.loads(zk.get(paths.assignment(root, w))[0]))
            except (NoNodeError, ValueError):
                continue
        partitions = {name: sorted(self._with_refused(name, cfg, previous)) for name, cfg in wanted.items()}
        result = assign(partitions, {n: c.settings["tasks.max"] for n, c in wanted.items()}, workers, previous)
        for w, conns in result.items():
            doc = json.dumps(to_json(conns), sort_keys=True).encode()
            path = paths.assignment(root, w)
            if previous.get(w) == conns and zk.exists(path):
                continue
            try:
                zk.create(path, doc)
            except NodeExistsError:
                zk.set(path, doc)
            log.info("assignment_published", worker=w, partitions={c: len(s) for c, s in conns.items()})
        for w in set(previous) - set(result):
            try:
                zk.delete(paths.assignment(root, w))
            except NoNodeError:
                pass

    def _with_refused(self, name: str, cfg: ConnectorConfig, previous: Mapping[str, Mapping[str, set[TopicPartition]]]
                      ) -> set[TopicPartition]:
        """The connector's partitions; a named topic the ACLs hide keeps the partitions it had (else partition 0).

        Dropping it would leave the task idle and healthy while nothing is delivered. Kept, the task
        that owns it fails on its first fetch with TOPIC_AUTHORIZATION_FAILED naming the topic, in /status;
        once the grant is restored the real partitions come back at the next round.
        """
        found = set(self._partitions(cfg.topics, cfg.topics_regex))
        refused = getattr(self._partitions, "refused", {})
        for topic, code in sorted(refused.items()):
            kept = {tp for conns in previous.values() for tp in conns.get(name, ()) if tp.topic == topic}
            found |= kept or {TopicPartition(topic, 0)}
            if (name, topic) in self._refusals_logged:
                continue
            self._refusals_logged.add((name, topic))
            log.error("kafka_topic_refused", connector=name, topic=topic, error=code,
                      message=f"{code}: the worker may not READ topic {topic}; grant it (docs/operations/security.md: Kafka)")
        return found

    def my_assignment(self) -> dict[str, set[TopicPartition]]:
        """What the leader last gave this worker: partitions per connector (empty before the first assignment)."""
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.session.client.get(paths.assignment(self.session.root, self.worker_id))
        except NoNodeError:
            return {}
        return from_json(json.loads(data))
