"""The Kafka side of the dead-letter sink: one Kafka transaction per cycle's write, carrying its commit marker.

A write produces the bad records with their context headers and, in the same Kafka transaction,
commits offsets to the consumer group named like the transactional.id with **offset metadata =
the txn id**: the marker, visible atomically with the records. Redelivering a decided write
fences the transactional.id, reads the marker, and writes again only when it is absent (why this
is exactly once: :mod:`.deadletter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eosink.connectors.api.errors import FatalError, RetryableError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import metrics
from eosink.worker.engine.deadletter_manifest import COMPONENT
from eosink.worker.engine.kafka_errors import ConnectionWatch, authorization_error
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.engine.deadletter")
TXN_HEADER = "eosink.dlq.txn"


def transactional_id(connector: str, txn_id: str) -> str:
    """``eosink-dlq.<connector>.<worker>.<generation>``: one producer per task generation, and
    recomputable from any txn id ``connector.worker.generation.counter`` by whoever recovers it."""
    prefix = txn_id.rsplit(".", 1)[0]
    return f"eosink-dlq.{prefix if prefix.startswith(connector + '.') else connector + '.' + prefix}"


def group_id(connector: str, txn_id: str) -> str:
    """The consumer group whose offset metadata is the commit marker of the txn's dead-letter write:
    one per transactional.id (see :mod:`.deadletter`)."""
    return transactional_id(connector, txn_id)


class DeadLetterWriter:
    """The dead-letter topic, a transactional producer per transactional.id, and the marker group's consumer."""

    def __init__(self, connector: str, *, bootstrap: str, topic: str, kafka: Mapping[str, str] | None,
                 context_headers: bool, replication_factor: int, timeout_s: float) -> None:
        self.connector = connector
        self.topic = topic
        self.context_headers = context_headers
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self.kafka: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, **dict(kafka or {})}
        #: txn id of the Kafka transaction open on the producer, and how many records it holds.
        self.open: str | None = None
        self.open_count = 0
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

    def create_topic(self) -> None:
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
        if self.open is not None and self._producer is not None:
            try:
                self._producer.abort_transaction(self.timeout_s)
            except Exception:  # noqa: BLE001 - the next init_transactions() on this id aborts it anyway
                pass
        self.drop_producer()
        self._close_consumer()

    def commit_open(self) -> int:
        """Commit the open Kafka transaction; how many records it made visible."""
        self._producer.commit_transaction(self.timeout_s)
        self.open = None
        return self.open_count

    def abort_open(self, txn_id: str) -> None:
        if self.open == txn_id:
            self.open = None
            try:
                self._producer.abort_transaction(self.timeout_s)
            except Exception:  # noqa: BLE001 - the next init_transactions() on this id aborts it
                self.drop_producer()

    def fence(self, txn_id: str) -> None:
        """Initialise the txn's transactional.id once: its older producer is fenced, its open transaction ended."""
        self._init(transactional_id(self.connector, txn_id))

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
            self.drop_producer()
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

    def drop_producer(self) -> None:
        self._producer, self._producer_tid, self.open = None, None, None

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

    def produce(self, txn_id: str, records: Sequence[Sequence[Any]], payloads: Sequence[tuple[Any, Any, Any]],
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
            self.open, self.open_count = txn_id, len(records)
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
                self.open = None
            except Exception:  # noqa: BLE001 - a fenced or broken producer: the next init_transactions() aborts it
                self.drop_producer()
            if refusals:
                raise refusals[0]  # a missing grant: fatal, the cycle aborts and nothing is visible
            raise RetryableError(f"dead-letter write of {txn_id} to {self.topic} failed: {errors[0]}", component=COMPONENT)

    def redeliver(self, txn_id: str, doc: dict[str, Any]) -> None:
        """Make a decided dead-letter write visible exactly once (see :mod:`.deadletter`)."""
        from confluent_kafka import KafkaException

        tid = transactional_id(self.connector, txn_id)
        self._producer, self._producer_tid = self._init(tid), tid  # fences every other holder of the id first
        records = doc["records"]
        try:
            committed = self._group_consumer(txn_id).committed(self._marker(records, txn_id), timeout=self.timeout_s)
        except KafkaException as exc:
            self.drop_producer()
            refused = self._refused(exc.args[0] if exc.args else None, "READ", group_id(self.connector, txn_id))
            if refused is not None:
                raise refused from None
            raise RetryableError(f"reading the dead-letter marker of {txn_id}: {exc}", component=COMPONENT) from exc
        if any(tp.metadata == txn_id for tp in committed):
            log.info("dead_letter_already_committed", connector=self.connector, txn=txn_id)
            self.drop_producer()
            return
        self.produce(txn_id, records, self._reread(txn_id, records), doc.get("worker", ""))
        try:
            self._producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            raise RetryableError(f"dead-letter commit of {txn_id} failed: {exc}", component=COMPONENT) from exc
        finally:
            self.drop_producer()
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
