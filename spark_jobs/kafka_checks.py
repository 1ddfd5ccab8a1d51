"""Driver-side pre-flight checks against the broker, so bad input fails before any task starts.

Everything here runs once per ``publish_outbox`` call on the driver: an unreachable broker, a
missing outbox topic or a ``transaction.timeout.ms`` above the broker's maximum then fails the call
with a clear error and nothing published, instead of N tasks each timing out on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from eosink.spark_jobs.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnreachableError,
    PublishError,
    TlsError,
    TopicMissingError,
    TransactionTimeoutError,
)
from eosink.worker.engine.kafka_errors import ConnectionWatch, authorization_error

COMPONENT = "spark-publisher"

# Client settings that every client of the same cluster needs (the producer's config is the source).
_SHARED_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.dns.lookup", "broker.address.family")

# librdkafka's own default; the Kafka broker default for transaction.max.timeout.ms is 900000.
BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS = 900_000
MIN_TXN_TIMEOUT_MS = 1_000


def client_config(kafka: Mapping[str, Any]) -> dict[str, Any]:
    """The connection part of a producer config, for admin clients and ledger consumers."""
    return {k: v for k, v in kafka.items() if k.startswith(_SHARED_PREFIXES)}


def watch(kafka: Mapping[str, Any]) -> ConnectionWatch:
    """The publisher's ``error_cb``: a refused login or TLS handshake becomes a fatal one-line error."""
    return ConnectionWatch(kafka, COMPONENT, AuthenticationError, TlsError)


def admin_client(kafka: Mapping[str, Any]) -> AdminClient:
    return connect(kafka)[0]


def connect(kafka: Mapping[str, Any]) -> tuple[AdminClient, ConnectionWatch]:
    """An admin client and the watch over its logins (for :func:`cluster_metadata`)."""
    conf = client_config(kafka)
    cb = watch(conf)
    return AdminClient(cb.install(conf)), cb


def cluster_metadata(admin: AdminClient, bootstrap: str, timeout_s: float = 15.0, cb: ConnectionWatch | None = None) -> Any:
    """Metadata of all topics, or :class:`BrokerUnreachableError` naming the bootstrap servers (or, with the
    admin client's ``cb``, the authentication / TLS error that made it unreachable)."""
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        if cb is not None:
            cb.check(admin)
        raise BrokerUnreachableError(bootstrap, f"no metadata within {timeout_s:.0f}s ({e.args[0].str()})") from None


def check_topics_exist(metadata: Any, topics: Iterable[str], bootstrap: str, admin: AdminClient | None = None,
                       kafka: Mapping[str, Any] | None = None) -> None:
    """Every outbox topic exists and may be written. A topic the ACLs hide is absent from the metadata of
    all topics like a missing one: asking for it by name (with ``admin``) tells the two apart."""
    missing = [t for t in topics if t not in metadata.topics or metadata.topics[t].error is not None]
    if missing and admin is not None:
        for topic in missing:
            try:
                tmd = admin.list_topics(topic=topic, timeout=15).topics.get(topic)
            except KafkaException:
                continue
            refused = authorization_error(tmd.error if tmd is not None else None, kafka or {}, "WRITE", topic,
                                          component=COMPONENT, cls=AuthorizationError)
            if refused is not None:
                raise refused
    if missing:
        raise TopicMissingError(missing, bootstrap)


def broker_max_transaction_timeout_ms(admin: AdminClient, metadata: Any, timeout_s: float = 15.0) -> int:
    """``transaction.max.timeout.ms`` as the brokers report it (the smallest, if they differ)."""
    resources = [ConfigResource(ConfigResource.Type.BROKER, str(b)) for b in metadata.brokers]
    values: list[int] = []
    try:
        for fut in admin.describe_configs(resources, request_timeout=timeout_s).values():
            entry = fut.result(timeout_s).get("transaction.max.timeout.ms")
            if entry is not None and entry.value is not None:
                values.append(int(entry.value))
    except KafkaException:
        return BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS  # not allowed to describe configs: assume the default
    return min(values) if values else BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS


def check_transaction_timeout(timeout_ms: int, broker_max_ms: int) -> None:
    """A producer asking for more than the broker's maximum fails in ``init_transactions`` with
    INVALID_TRANSACTION_TIMEOUT on every task; say so once, with both numbers, before starting."""
    if timeout_ms < MIN_TXN_TIMEOUT_MS:
        raise TransactionTimeoutError(f"transaction.timeout.ms={timeout_ms} is below {MIN_TXN_TIMEOUT_MS} ms")
    if timeout_ms > broker_max_ms:
        raise TransactionTimeoutError(
            f"transaction.timeout.ms={timeout_ms} exceeds the broker's transaction.max.timeout.ms={broker_max_ms}; "
            f"lower it (or raise the broker setting); a partition must be published within it"
        )


def ensure_ledger_topic(admin: AdminClient, metadata: Any, topic: str, timeout_s: float = 30.0,
                        kafka: Mapping[str, Any] | None = None) -> None:
    """Create the compacted one-partition ledger topic if it is missing (idempotent, race-safe)."""
    if topic in metadata.topics and metadata.topics[topic].error is None:
        if len(metadata.topics[topic].partitions) != 1:
            raise PublishError(f"ledger topic '{topic}' must have exactly 1 partition")
        return
    new = NewTopic(topic, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"})
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as e:
        refused = authorization_error(e.args[0], kafka or {}, "READ", topic, component=COMPONENT, cls=AuthorizationError,
                                      detail="the ledger topic is invisible to the publisher: grant READ and WRITE on "
                                             "it (it is created by an operator; the publisher is not granted CREATE)")
        if refused is not None:
            raise refused from None
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise PublishError(f"cannot create ledger topic '{topic}': {e.args[0].str()}") from None
