"""The dead-letter topic as one more two-phase-commit sink of the cycle: exactly once.

With ``errors.tolerance=all`` the engine hands every bad record of a cycle (undecodable, or
rejected by a sink) to :class:`DeadLetterSink`, which the runner adds as the connector's last
sink. The dead-letter write then belongs to the cycle: it becomes visible if and only if the
cycle's decision is recorded, and exactly once.

Why not simply "produce in a Kafka transaction at prepare, commit it at commit"? Because a Kafka
transaction cannot be *prepared* and committed later by another process: if the worker dies
between the decision and the Kafka commit, the open transaction is aborted (by the broker's
``transaction.timeout.ms`` or the next ``init_transactions()`` on its ``transactional.id``) and
the decided dead-letter records would be lost. So the Kafka transaction is only the fast path;
durability and idempotence come from two more pieces:

``pre_commit(manifest)``
    1. writes a *dead-letter manifest* znode ``/eosink/<cluster>/deadletter/<connector>/<txn>``:
       the txn's manifest (partitions, epochs) and, per bad record, its coordinates
       (topic, partition, offset), stage, exception class and message - not its bytes, which
       stay on the source topic, so the znode stays small;
    2. begins a Kafka transaction with ``transactional.id = eosink-dlq.<connector>.<worker>.<generation>``
       (derived from the txn id, so anyone can recompute it from the manifest), produces the
       records with their context headers, and - in the same Kafka transaction - commits
       offsets for the source partitions to the consumer group named like the transactional.id,
       with **offset metadata = the txn id**: the *commit marker*, visible atomically with the records.

``commit(txn)``  commits the Kafka transaction, then deletes the znode.

``recover_and_commit(m)`` (a decided txn whose znode is still there: the worker died after the
decision) - and ``commit`` itself when the Kafka commit fails:
    ``init_transactions()`` with the txn's transactional.id - this fences any older producer
    with that id (a zombie) and completes or aborts its open transaction - then reads the marker
    (a ``read_committed`` offset fetch, which waits for pending transactional commits). Marker
    present: the records are already visible, done. Absent: re-read the bad records from the
    source topic by offset, produce them again with the same headers and marker in a new Kafka
    transaction, commit. Delete the znode. Two processes doing this at once fence each other on
    the transactional.id and each checks the marker after its own ``init_transactions()``, so
    only one can commit.

    Why one marker group per transactional.id, not one per connector: after the recoverer's
    ``init_transactions()`` no other producer can commit a txn of that id, and no *later* txn of
    that id can have been committed either (it would need a decision, and the recoverer's epoch
    bump fences the old owner's decisions; a decision made before it would have deleted this
    znode first). So the marker read then is final. A group shared by the connector could
    meanwhile be overwritten by another worker's later write on the same source partition.

``abort(txn)`` / ``recover_and_abort(m)`` (undecided): abort the Kafka transaction (or fence it
with ``init_transactions()``), delete the znode. Nothing was ever visible to read_committed
consumers of the dead-letter topic.

A cycle without bad records costs nothing here: no znode, no Kafka transaction. A decided txn
whose bad records the source topic no longer holds (retention ran out before recovery) cannot be
completed: commit raises :class:`FatalError`, the task is FAILED with that reason in ``/status``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from eosink.connectors.api.errors import FatalError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.worker import metrics, paths
from eosink.worker.engine.kafka_errors import ConnectionWatch, authorization_error
from eosink.worker.engine.source import FailedRecord
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.engine.deadletter")
COMPONENT = "dead-letter"
TXN_HEADER = "eosink.dlq.txn"
#: The largest dead-letter manifest written to ZooKeeper (its default jute.maxbuffer is 1 MiB).
MAX_MANIFEST_BYTES = 900 * 1024
_MESSAGE_CHARS = 1000


def transactional_id(connector: str, txn_id: str) -> str:
    """``eosink-dlq.<connector>.<worker>.<generation>``: one producer per task generation, and
    recomputable from any txn id ``connector.worker.generation.counter`` by whoever recovers it."""
    prefix = txn_id.rsplit(".", 1)[0]
    return f"eosink-dlq.{prefix if prefix.startswith(connector + '.') else connector + '.' + prefix}"


def group_id(connector: str, txn_id: str) -> str:
    """The consumer group whose offset metadata is the commit marker of the txn's dead-letter write:
    one per transactional.id (see the module doc)."""
    return transactional_id(connector, txn_id)


def _class_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class DeadLetterSink(TwoPhaseCommitSink):
    """Bad records of the cycle into ``errors.deadletterqueue.topic.name``, exactly once (see the module doc)."""

    reads_values = False  # failed records travel as the bytes they had on the topic

    def __init__(self, connector: str, *, session: Any, worker_id: str, bootstrap: str, topic: str,
                 kafka: Mapping[str, str] | None = None, context_headers: bool = True, replication_factor: int = -1,
                 timeout_s: float = 30.0) -> None:
        super().__init__(connector, {})
        self.session = session
        self.worker_id = worker_id
        self.topic = topic
        self.context_headers = context_headers
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self.kafka: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, **dict(kafka or {})}
        self.root = paths.deadletter(session.root, connector)
        self._txn: str | None = None
        self._staged: list[FailedRecord] = []
        self._open: str | None = None  # txn id of the Kafka transaction open on self._producer
        self._open_count = 0
        self._producer: Any = None
        self._producer_tid: str | None = None
        self._consumer: Any = None
        self._consumer_group: str | None = None
        #: Refused logins / TLS handshakes of this sink's clients (fatal; see kafka_errors).
        self.watch = ConnectionWatch(self.kafka, COMPONENT)

    def _refused(self, err: Any, operation: str, resource: str, resource_type: str | None = None) -> Exception | None:
        """An ACL refusal of ``err`` as a fatal error naming what the worker may not do, else ``None``."""
        return authorization_error(err, self.kafka, operation, resource, component=COMPONENT, resource_type=resource_type)

    def _refusal_of(self, err: Any, tid: str, group: str) -> Exception | None:
        """Which grant a failed dead-letter write lacks, from the librdkafka error code."""
        name = err.name() if err is not None else ""
        if name == "TOPIC_AUTHORIZATION_FAILED":
            return self._refused(err, "WRITE", self.topic)
        if name == "GROUP_AUTHORIZATION_FAILED":
            return self._refused(err, "READ", group)
        return self._refused(err, "WRITE", tid)

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the dead-letter topic when it is missing (as Kafka Connect does)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.watch.install(dict(self.kafka)))
        try:
            if self.topic in admin.list_topics(timeout=self.timeout_s).topics:
                return
            fut = admin.create_topics([NewTopic(self.topic, num_partitions=1, replication_factor=self.replication_factor)])
            fut[self.topic].result(self.timeout_s)
            log.info("dead_letter_topic_created", connector=self.connector, topic=self.topic)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            self.watch.check(admin)
            # Hidden from the metadata and not creatable: the worker lacks WRITE on an existing topic
            # (WRITE implies DESCRIBE), or it is missing and the worker may not CREATE it (by design).
            refused = authorization_error(err, self.kafka, "WRITE", self.topic, component=COMPONENT,
                                          detail="the dead-letter topic is invisible to this worker: grant WRITE on it "
                                                 "(or create it; the worker is not granted CREATE)")
            if refused is not None:
                raise refused from None
            raise RetryableError(f"cannot create dead-letter topic {self.topic}: {exc}", component=COMPONENT) from exc

    def close(self) -> None:
        if self._open is not None and self._producer is not None:
            try:
                self._producer.abort_transaction(self.timeout_s)
            except Exception:  # noqa: BLE001 - the next init_transactions() on this id aborts it anyway
                pass
        self._drop_producer()
        self._close_consumer()

    # -- the cycle ----------------------------------------------------------------------------------
    def begin_transaction(self, txn_id: str) -> None:
        self._txn = txn_id
        self._staged = []

    def write(self, records: Sequence[SinkRecord]) -> None:
        """Good records are the other sinks' business."""

    def report(self, failed: Sequence[FailedRecord]) -> None:
        """Stage the cycle's bad records (called by the engine between write and pre_commit)."""
        self._staged.extend(failed)

    def pre_commit(self, manifest: TxnManifest) -> None:
        staged, self._staged = self._staged, []
        if not staged:
            return
        records = [[f.topic, f.partition, f.offset, f.stage, _class_name(f.error), str(f.error)[:_MESSAGE_CHARS]] for f in staged]
        doc = {"manifest": json.loads(manifest.to_json()), "worker": self.worker_id, "records": records}
        data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode())
        if len(data) > MAX_MANIFEST_BYTES:
            raise FatalError(f"txn {manifest.txn_id}: {len(staged)} bad records make a dead-letter manifest of {len(data)} "
                             "bytes, over ZooKeeper's limit: lower batch.max.records", component=COMPONENT)
        self._write_manifest(manifest.txn_id, data)
        self._produce(manifest.txn_id, records, [(f.key, f.value, f.headers) for f in staged], self.worker_id)

    def commit(self, txn_id: str) -> None:
        if self._open == txn_id:
            try:
                self._producer.commit_transaction(self.timeout_s)
                self._open = None
                metrics.DEAD_LETTERED.labels(self.connector).inc(self._open_count)
                log.info("dead_lettered", connector=self.connector, txn=txn_id, records=self._open_count, topic=self.topic)
                self._delete_manifest(txn_id)
                return
            except Exception as exc:  # noqa: BLE001 - fall back to the recovery path, which is idempotent
                log.warning("dead_letter_commit_failed", connector=self.connector, txn=txn_id, error=str(exc))
                self._drop_producer()
        doc = self._read_manifest(txn_id)
        if doc is not None:
            self._redeliver(txn_id, doc)
            self._delete_manifest(txn_id)

    def abort(self, txn_id: str) -> None:
        if self._txn == txn_id:
            self._staged = []
        if self._open == txn_id:
            self._open = None
            try:
                self._producer.abort_transaction(self.timeout_s)
            except Exception:  # noqa: BLE001 - the next init_transactions() on this id aborts it
                self._drop_producer()
        self._delete_manifest(txn_id)

    # -- recovery -----------------------------------------------------------------------------------
    def recover(self) -> list[TxnManifest]:
        from kazoo.exceptions import NoNodeError

        out = []
        try:
            names = self.session.client.get_children(self.root)
        except NoNodeError:
            return []
        for name in sorted(names):
            doc = self._read_manifest(name)
            if doc is not None:
                out.append(TxnManifest.from_json(json.dumps(doc["manifest"])))
        return out

    def recover_and_commit(self, manifest: TxnManifest) -> None:
        self.commit(manifest.txn_id)

    def recover_and_abort(self, manifest: TxnManifest) -> None:
        if self._open != manifest.txn_id and self._read_manifest(manifest.txn_id) is not None:
            # Fence the old producer and abort its open transaction now, rather than leaving it to
            # block read_committed readers of the dead-letter topic until transaction.timeout.ms.
            self._init(transactional_id(self.connector, manifest.txn_id))
        self.abort(manifest.txn_id)

    # -- Kafka ----------------------------------------------------------------------------------------
    def _headers(self, original: Sequence[tuple[str, Any]], rec: Sequence[Any], txn_id: str,
                 worker: str) -> list[tuple[str, Any]]:
        topic, partition, offset, stage, exc_class, message = rec
        headers = list(original)
        if self.context_headers:
            headers += [(k, str(v).encode()) for k, v in (
                ("__connect.errors.topic", topic), ("__connect.errors.partition", partition),
                ("__connect.errors.offset", offset), ("__connect.errors.connector.name", self.connector),
                ("__connect.errors.task.id", worker), ("__connect.errors.stage", stage),
                ("__connect.errors.class.name", "eosink.worker.engine.deadletter.DeadLetterSink"),
                ("__connect.errors.exception.class.name", exc_class), ("__connect.errors.exception.message", message),
            )]
        headers.append((TXN_HEADER, txn_id.encode()))
        return headers

    def _init(self, tid: str) -> Any:
        """A transactional producer for ``tid``, initialised: any older producer with that id is fenced
        and its open transaction completed (if its commit had been sent) or aborted."""
        from confluent_kafka import KafkaException, Producer

        if self._producer_tid == tid:
            self._drop_producer()
        producer = Producer(self.watch.install({**self.kafka, "transactional.id": tid, "transaction.timeout.ms": 60_000,
                                                "linger.ms": 5}))
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            self.watch.check(producer)
            refused = self._refused(exc.args[0] if exc.args else None, "WRITE", tid, "transactional.id")
            if refused is not None:
                raise refused from None
            raise RetryableError(f"dead-letter producer {tid}: init_transactions failed: {exc}", component=COMPONENT) from exc
        return producer

    def _drop_producer(self) -> None:
        self._producer, self._producer_tid, self._open = None, None, None

    def _group_consumer(self, txn_id: str) -> Any:
        """A read_committed consumer in the txn's marker group (never subscribes: it gives the group's
        metadata to the producer, reads the marker, and re-reads records by offset)."""
        from confluent_kafka import Consumer

        group = group_id(self.connector, txn_id)
        if self._consumer is None or self._consumer_group != group:
            self._close_consumer()
            self._consumer = Consumer({**self.watch.install(dict(self.kafka)), "group.id": group, "isolation.level": "read_committed",
                                       "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                       "enable.partition.eof": False})
            self._consumer_group = group
        return self._consumer

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except RuntimeError:
                pass
        self._consumer, self._consumer_group = None, None

    @staticmethod
    def _marker(records: Sequence[Sequence[Any]], txn_id: str) -> list[Any]:
        """Offsets (last bad offset + 1) with metadata = txn id, for every source partition of the write."""
        from confluent_kafka import TopicPartition as KTP

        last: dict[TopicPartition, int] = {}
        for topic, partition, offset, *_ in records:
            tp = TopicPartition(topic, int(partition))
            last[tp] = max(last.get(tp, -1), int(offset))
        return [KTP(tp.topic, tp.partition, off + 1, metadata=txn_id) for tp, off in sorted(last.items())]

    def _produce(self, txn_id: str, records: Sequence[Sequence[Any]], payloads: Sequence[tuple[Any, Any, Any]],
                 worker: str) -> None:
        """One Kafka transaction with the records and the commit marker, flushed and left open for ``commit``."""
        from confluent_kafka import KafkaException

        tid = transactional_id(self.connector, txn_id)
        if self._producer is None or self._producer_tid != tid:
            self._producer, self._producer_tid = self._init(tid), tid
        p = self._producer
        errors: list[str] = []
        refusals: list[Exception] = []
        group = group_id(self.connector, txn_id)

        def failed(err: Any) -> None:
            errors.append(str(err))
            refused = self._refusal_of(err, tid, group)
            if refused is not None:
                refusals.append(refused)

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed(err)

        try:
            p.begin_transaction()
            self._open, self._open_count = txn_id, len(records)
            for rec, (key, value, headers) in zip(records, payloads):
                p.produce(self.topic, key=key, value=value, headers=self._headers(headers, rec, txn_id, worker),
                          on_delivery=delivered)
            p.send_offsets_to_transaction(self._marker(records, txn_id),
                                          self._group_consumer(txn_id).consumer_group_metadata(), self.timeout_s)
            if p.flush(self.timeout_s) > 0:
                errors.append("flush timed out")
        except KafkaException as exc:
            failed(exc.args[0] if exc.args else exc)
        if errors:
            try:
                p.abort_transaction(self.timeout_s)
                self._open = None
            except Exception:  # noqa: BLE001 - a fenced or broken producer: the next init_transactions() aborts it
                self._drop_producer()
            if refusals:
                raise refusals[0]  # a missing grant: fatal, the cycle aborts and nothing is visible
            raise RetryableError(f"dead-letter write of {txn_id} to {self.topic} failed: {errors[0]}", component=COMPONENT)

    def _redeliver(self, txn_id: str, doc: dict[str, Any]) -> None:
        """Make a decided dead-letter write visible exactly once (see the module doc)."""
        from confluent_kafka import KafkaException

        tid = transactional_id(self.connector, txn_id)
        self._producer, self._producer_tid = self._init(tid), tid  # fences every other holder of the id first
        records = doc["records"]
        try:
            committed = self._group_consumer(txn_id).committed(self._marker(records, txn_id), timeout=self.timeout_s)
        except KafkaException as exc:
            self._drop_producer()
            refused = self._refused(exc.args[0] if exc.args else None, "READ", group_id(self.connector, txn_id))
            if refused is not None:
                raise refused from None
            raise RetryableError(f"reading the dead-letter marker of {txn_id}: {exc}", component=COMPONENT) from exc
        if any(tp.metadata == txn_id for tp in committed):
            log.info("dead_letter_already_committed", connector=self.connector, txn=txn_id)
            self._drop_producer()
            return
        self._produce(txn_id, records, self._reread(txn_id, records), doc.get("worker", ""))
        try:
            self._producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            raise RetryableError(f"dead-letter commit of {txn_id} failed: {exc}", component=COMPONENT) from exc
        finally:
            self._drop_producer()
        metrics.DEAD_LETTERED.labels(self.connector).inc(len(records))
        log.warning("dead_letter_redelivered", connector=self.connector, txn=txn_id, records=len(records), topic=self.topic)

    def _reread(self, txn_id: str, records: Sequence[Sequence[Any]]) -> list[tuple[Any, Any, Any]]:
        """(key, value, headers) of the bad records, read back from the source topic by offset (read_committed)."""
        from confluent_kafka import TopicPartition as KTP

        c = self._group_consumer(txn_id)
        out: list[tuple[Any, Any, Any]] = []
        try:
            for topic, partition, offset, *_ in records:
                c.assign([KTP(topic, int(partition), int(offset))])
                msg = None
                for _ in range(max(1, int(self.timeout_s))):
                    got = c.consume(1, timeout=1.0)
                    for m in got:
                        refused = self._refused(m.error(), "READ", topic, "topic") if m.error() is not None else None
                        if refused is not None:
                            raise refused
                    msgs = [m for m in got if m.error() is None]
                    if msgs:
                        msg = msgs[0]
                        break
                if msg is None:
                    raise RetryableError(f"re-reading {topic}[{partition}]@{offset} for the dead-letter topic timed out",
                                         component=COMPONENT)
                if msg.offset() != int(offset):
                    raise FatalError(f"record {topic}[{partition}]@{offset} of a decided dead-letter write is no longer on "
                                     f"the topic (first readable offset {msg.offset()}: retention?); it cannot be "
                                     "dead-lettered: operator must check", component=COMPONENT)
                out.append((msg.key(), msg.value(), tuple(msg.headers() or ())))
        finally:
            c.unassign()
        return out

    # -- ZooKeeper --------------------------------------------------------------------------------
    def _path(self, txn_id: str) -> str:
        return f"{self.root}/{txn_id}"

    def _write_manifest(self, txn_id: str, data: bytes) -> None:
        from kazoo.exceptions import KazooException, NodeExistsError

        try:
            try:
                self.session.client.create(self._path(txn_id), data, makepath=True)
            except NodeExistsError:
                self.session.client.set(self._path(txn_id), data)
        except KazooException as exc:
            raise RetryableError(f"writing the dead-letter manifest of {txn_id}: {exc!r}", component=COMPONENT) from exc

    def _read_manifest(self, txn_id: str) -> dict[str, Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.session.client.get(self._path(txn_id))
        except NoNodeError:
            return None
        return json.loads(zlib.decompress(data))

    def _delete_manifest(self, txn_id: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            self.session.client.delete(self._path(txn_id))
        except NoNodeError:
            pass
